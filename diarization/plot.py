"""Speaker timeline plots (matplotlib, Agg backend): the hypothesis, and the reference above it
when one is given, one row per speaker, so a listener can see at a glance who was found when."""

from __future__ import annotations

from pathlib import Path

from models.extras import require
from voice.diarization_stage import SpeakerTimeline


def plot_timelines(
    hypothesis: SpeakerTimeline,
    path: str | Path,
    *,
    reference: SpeakerTimeline | None = None,
    duration: float | None = None,
    title: str = "",
) -> Path:
    """Draw the timeline(s) into a PNG at `path` and return the path."""
    require("bench", "the timeline plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("reference", reference)] if reference is not None else []
    panels.append(("hypothesis", hypothesis))
    end = duration or max([s.end for _, t in panels if t is not None for s in t.segments] + [1.0])
    rows = [max(1, len(t.speakers)) for _, t in panels if t is not None]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(12, 1.0 + 0.45 * sum(rows) + 0.6 * len(panels)),
        squeeze=False,
        gridspec_kw={"height_ratios": rows},
        sharex=True,
    )
    for ax, (label, timeline) in zip(axes[:, 0], panels, strict=True):
        assert timeline is not None
        # different palettes: a colour shared by the two panels would suggest a mapping
        cmap = plt.get_cmap("tab10" if label == "hypothesis" else "Pastel1")
        speakers = timeline.speakers
        for row, speaker in enumerate(speakers):
            bars = [(s.start, s.duration) for s in timeline if s.speaker == speaker]
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=cmap(row % 10), edgecolor="none")
        ax.set_yticks(range(len(speakers)))
        ax.set_yticklabels(speakers)
        ax.set_ylim(-0.6, max(len(speakers), 1) - 0.4)
        ax.invert_yaxis()
        ax.set_ylabel(label)
        ax.grid(axis="x", alpha=0.3)
        ax.set_xlim(0, end)
    axes[-1, 0].set_xlabel("time (s)")
    if title:
        axes[0, 0].set_title(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
