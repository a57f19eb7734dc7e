"""Choosing the embedded recipe's settings on data, honestly: leave-one-file-out cross-validation.

For each file, the settings that score best (corpus DER at collar 0.25 s) on the *other* files are
applied to it; the cross-validated DER is the sum of those held-out errors over the sum of
reference speech. That figure estimates what the recipe scores on recordings it was not tuned on,
which is how Chorus is judged; the settings that win on all files at once are only reported.

The expensive parts (VAD probabilities, mel spectrograms, window embeddings) are computed once per
file and front-end setting and reused across the grid, so a search over a few hundred settings
costs a few minutes on one core.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diarization import recipe
from diarization.recipe import FloatArray, Settings
from diarization.scoring import DerScore, score
from voice.diarization_stage import SpeakerTimeline
from voice.embedding import default_embedder, mel_spectrogram
from voice.vad import SpeechDetector

FRONT_KEYS = (
    "vad_threshold",
    "normalize",
    "min_speech",
    "max_gap",
    "speech_pad",
    "window",
    "hop",
    "compact",
)

# The search space (kept small on purpose: every extra knob is a chance to fit these files).
GRID: dict[str, Sequence[Any]] = {
    "vad_threshold": (0.1, 0.15),
    "max_gap": (0.5, 0.8),
    "window": (1.5, 2.0),
    "prune": (0.75, 0.8),
    "overlap_margin": (0.0, 0.03),
}


def grid_settings(
    grid: dict[str, Sequence[Any]] | None = None, base: Settings | None = None
) -> list[Settings]:
    """Every combination of the grid (spectral-only and AHC-only knobs not crossed)."""
    grid = GRID if grid is None else grid
    base = base or Settings()
    keys = list(grid)
    out: list[Settings] = []
    seen: set[Settings] = set()
    for values in itertools.product(*(grid[k] for k in keys)):
        changes = dict(zip(keys, values, strict=True))
        if changes.get("method", base.method) == "spectral":
            changes["cluster_threshold"] = base.cluster_threshold
        else:
            changes["prune"] = base.prune
        s = base.but(**changes)
        if s not in seen:
            seen.add(s)
            out.append(s)
    return out


@dataclass
class TuningFile:
    """One recording with its reference, and caches of the front end."""

    file_id: str
    audio: FloatArray
    reference: SpeakerTimeline
    uem: list[tuple[float, float]] | None = None
    _probs: dict[bool, FloatArray] = field(default_factory=dict, repr=False)
    _mel: FloatArray | None = field(default=None, repr=False)
    _front: dict[tuple[Any, ...], Any] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls, path: Path, reference: SpeakerTimeline, uem: list[tuple[float, float]] | None = None
    ) -> TuningFile:
        from voice.audio import read_audio_16k

        return cls(path.stem, read_audio_16k(path), reference, uem)

    @property
    def duration(self) -> float:
        return len(self.audio) / 16000

    def front(self, s: Settings) -> tuple[Any, recipe.Windows, FloatArray]:
        key = tuple(getattr(s, k) for k in FRONT_KEYS)
        if key not in self._front:
            if s.normalize not in self._probs:
                self._probs[s.normalize] = SpeechDetector(normalize=s.normalize).probabilities(
                    self.audio
                )
            if self._mel is None:
                self._mel = mel_spectrogram(self.audio)
            mask = recipe.speech_mask(self._probs[s.normalize], s)
            windows = recipe.plan_windows(mask, len(self._mel), s)
            emb = (
                default_embedder().embed_mels(self._mel[windows.mel_index])
                if len(windows.mel_index)
                else np.zeros((0, 256), np.float32)
            )
            self._front[key] = (mask, windows, emb)
        front: tuple[Any, recipe.Windows, FloatArray] = self._front[key]
        return front

    def run(self, s: Settings) -> SpeakerTimeline:
        mask, windows, emb = self.front(s)
        if len(emb) == 0:
            return SpeakerTimeline()
        labels = recipe.cluster(emb, s)
        cents = recipe.centroids(emb, labels)
        main, second = recipe.decode(mask, recipe.frame_scores(windows, emb, cents), s)
        return SpeakerTimeline(
            recipe.to_segments(main, second, [f"S{k}" for k in range(len(cents))])
        )

    def score(self, s: Settings, collar: float = 0.25) -> DerScore:
        return score(
            self.reference,
            self.run(s),
            uem=self.uem,
            duration=self.duration,
            collar=collar,
            uri=self.file_id,
        )


@dataclass
class CrossValidation:
    held_out: (
        DerScore  # sum of held-out errors (each file scored with settings tuned on the others)
    )
    best_on_all: DerScore  # the settings that win on all files, scored on all (optimistic)
    best_settings: Settings
    chosen: dict[str, Settings]  # per held-out file
    per_file: dict[str, float]  # held-out DER per file
    grid_size: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "loo_cv_der": self.held_out.der,
            "loo_cv": self.held_out.as_dict(),
            "best_on_all_der": self.best_on_all.der,
            "best_settings": asdict(self.best_settings),
            "per_file_held_out_der": self.per_file,
            "chosen_per_fold": {k: asdict(v) for k, v in self.chosen.items()},
            "grid_size": self.grid_size,
        }

    def describe(self) -> str:
        lines = [
            f"leave-one-file-out CV over {self.grid_size} settings: DER {self.held_out.der * 100:.1f} % "
            f"(collar 0.25; best-on-all {self.best_on_all.der * 100:.1f} %)",
            "  held out: " + ", ".join(f"{k} {v * 100:.1f}" for k, v in self.per_file.items()),
        ]
        return "\n".join(lines)


def cross_validate(
    files: Sequence[TuningFile],
    settings: Iterable[Settings] | None = None,
    *,
    collar: float = 0.25,
    progress: bool = False,
) -> CrossValidation:
    candidates = list(settings) if settings is not None else grid_settings()
    table: list[list[DerScore]] = []
    iterator: Iterable[Settings] = candidates
    if progress:
        from tqdm import tqdm

        iterator = tqdm(candidates, desc="cross-validation grid", unit="setting", file=sys.stderr)
    for s in iterator:
        table.append([f.score(s, collar) for f in files])
    errors = np.array([[d.errors for d in row] for row in table])  # settings × files
    totals = np.array([d.total for d in table[0]])
    chosen: dict[str, Settings] = {}
    held: list[DerScore] = []
    per_file: dict[str, float] = {}
    for j, f in enumerate(files):
        others = [i for i in range(len(files)) if i != j]
        rates = errors[:, others].sum(axis=1) / max(totals[others].sum(), 1e-9)
        best = int(np.argmin(rates))
        chosen[f.file_id] = candidates[best]
        held.append(table[best][j])
        per_file[f.file_id] = table[best][j].der
    overall = errors.sum(axis=1) / max(totals.sum(), 1e-9)
    best_all = int(np.argmin(overall))
    return CrossValidation(
        held_out=DerScore.sum(held),
        best_on_all=DerScore.sum(table[best_all]),
        best_settings=candidates[best_all],
        chosen=chosen,
        per_file=per_file,
        grid_size=len(candidates),
    )
