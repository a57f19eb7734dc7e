"""Scoring a speaker timeline against a reference (rule P4): DER with pyannote.metrics.

DER = (missed speech + false alarm + speaker confusion) / reference speech, with overlapped
speech scored (`skip_overlap=False`) and a forgiveness collar around each reference boundary
(0 and 0.25 s are reported; pyannote's collar is the total width, so 0.25 s forgives ±0.125 s
around each boundary). The scored region comes from a UEM file when given, else the
whole recording (0 to its duration). Errors are kept as seconds so that a corpus figure is the
sum over files (not a mean of per-file rates), as NIST md-eval and pyannote do.

Also here: UEM reading and the conversion between `SpeakerTimeline` and pyannote `Annotation`
(pyannote.core is imported lazily, and with `PYANNOTE_METRICS_ENABLED=0`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from models.extras import require
from voice.diarization_stage import SpeakerTimeline

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "0")

COLLARS = (0.0, 0.25)


@dataclass(frozen=True)
class DerScore:
    """Seconds of each error over the scored reference speech, at one collar."""

    collar: float
    missed: float
    false_alarm: float
    confusion: float
    total: float  # reference speech scored (seconds, overlap counted per speaker)

    @property
    def errors(self) -> float:
        return self.missed + self.false_alarm + self.confusion

    @property
    def der(self) -> float:
        return self.errors / self.total if self.total > 0 else (0.0 if self.errors == 0 else 1.0)

    def as_dict(self) -> dict[str, float]:
        out = asdict(self)
        out["der"] = self.der
        return out

    @staticmethod
    def sum(scores: Iterable[DerScore]) -> DerScore:
        items = list(scores)
        if not items:
            raise ValueError("nothing to sum")
        return DerScore(
            collar=items[0].collar,
            missed=sum(s.missed for s in items),
            false_alarm=sum(s.false_alarm for s in items),
            confusion=sum(s.confusion for s in items),
            total=sum(s.total for s in items),
        )


def read_uem(path: str | Path) -> dict[str, list[tuple[float, float]]]:
    """UEM lines `<file> <channel> <start> <end>` → scored regions per file id."""
    regions: dict[str, list[tuple[float, float]]] = {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        parts = line.split()
        if not parts or parts[0].startswith(";;"):
            continue
        if len(parts) < 4:
            raise ValueError(f"{path}:{number}: a UEM line needs <file> <channel> <start> <end>")
        start, end = float(parts[2]), float(parts[3])
        if end < start:
            raise ValueError(f"{path}:{number}: UEM region ends before it starts")
        regions.setdefault(parts[0], []).append((start, end))
    return regions


def to_annotation(timeline: SpeakerTimeline, uri: str) -> Any:
    from pyannote.core import Annotation, Segment

    annotation = Annotation(uri=uri)
    for track, seg in enumerate(timeline):
        if seg.duration > 0:
            annotation[Segment(seg.start, seg.end), track] = seg.speaker
    return annotation


def score(
    reference: SpeakerTimeline,
    hypothesis: SpeakerTimeline,
    *,
    uem: list[tuple[float, float]] | None = None,
    duration: float | None = None,
    collar: float = 0.25,
    uri: str = "file",
) -> DerScore:
    """DER of `hypothesis` against `reference` over `uem` (or [0, duration], or the extent of
    both timelines), overlap scored."""
    require("bench", "DER scoring")
    from pyannote.core import Segment, Timeline
    from pyannote.metrics.diarization import DiarizationErrorRate

    if uem is None:
        end = duration
        if end is None:
            end = max(
                [s.end for s in reference.segments] + [s.end for s in hypothesis.segments] + [0.0]
            )
        uem = [(0.0, end)]
    metric = DiarizationErrorRate(collar=collar, skip_overlap=False)
    detail = metric(
        to_annotation(reference, uri),
        to_annotation(hypothesis, uri),
        uem=Timeline([Segment(a, b) for a, b in uem], uri=uri),
        detailed=True,
    )
    return DerScore(
        collar=collar,
        missed=float(detail["missed detection"]),
        false_alarm=float(detail["false alarm"]),
        confusion=float(detail["confusion"]),
        total=float(detail["total"]),
    )


def score_collars(
    reference: SpeakerTimeline,
    hypothesis: SpeakerTimeline,
    *,
    uem: list[tuple[float, float]] | None = None,
    duration: float | None = None,
    uri: str = "file",
    collars: Iterable[float] = COLLARS,
) -> dict[float, DerScore]:
    return {
        c: score(reference, hypothesis, uem=uem, duration=duration, collar=c, uri=uri)
        for c in collars
    }
