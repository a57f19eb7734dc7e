"""Choosing the batch pipeline's settings on data, honestly: leave-one-file-out cross-validation.

For each file, the settings that score best (corpus DER at collar 0.25 s) on the *other* files are
applied to it; the cross-validated DER is the sum of those held-out errors over the sum of
reference speech. That figure estimates what the pipeline scores on recordings it was not tuned
on; the settings that win on all files at once are only reported. Settings are global: no knob is
chosen per file or per set.

The models run once per file and window step (`diarization.batch.analyse`); every other setting
only re-clusters those arrays, so a grid of a hundred settings costs seconds per file.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diarization import batch
from diarization.batch import Analysis, BatchSettings
from diarization.models import EmbeddingModel, SegmentationModel
from diarization.scoring import DerScore, score
from voice.diarization_stage import SpeakerTimeline

# The search space (small on purpose: every extra knob is a chance to fit these files).
GRID: dict[str, Sequence[Any]] = {
    "threshold": (0.6, 0.7, 0.8),
    "merge_threshold": (0.0, 0.8, 0.9, 1.0),
    "min_cluster_size": (1, 2, 3),
    "fold_below": (1.2, 1.3, 2.0),
    "open_unmatched": (False, True),
}


def grid_settings(
    grid: dict[str, Sequence[Any]] | None = None, base: BatchSettings | None = None
) -> list[BatchSettings]:
    """Every combination of the grid over `base`."""
    grid = GRID if grid is None else grid
    base = base or BatchSettings()
    keys = list(grid)
    return [
        base.but(**dict(zip(keys, values, strict=True)))
        for values in itertools.product(*(grid[k] for k in keys))
    ]


@dataclass
class TuningFile:
    """One scored recording: audio, reference, scored regions, and the models' analyses by step."""

    file_id: str
    audio: Any
    reference: SpeakerTimeline
    uem: list[tuple[float, float]] | None
    _analyses: dict[float, Analysis] = field(default_factory=dict, repr=False)

    @classmethod
    def load(
        cls, path: Path, reference: SpeakerTimeline, uem: list[tuple[float, float]] | None
    ) -> TuningFile:
        from voice.audio import read_audio_16k

        return cls(path.stem, read_audio_16k(path), reference, uem)

    @property
    def duration(self) -> float:
        return len(self.audio) / batch.SAMPLE_RATE

    def analysis(
        self, settings: BatchSettings, segmentation: SegmentationModel, embedding: EmbeddingModel
    ) -> Analysis:
        key = settings.step
        if key not in self._analyses:
            self._analyses[key] = batch.analyse(self.audio, segmentation, embedding, settings)
        return self._analyses[key]

    def run(
        self, settings: BatchSettings, segmentation: SegmentationModel, embedding: EmbeddingModel
    ) -> SpeakerTimeline:
        analysis = self.analysis(settings, segmentation, embedding)
        clustering = batch.cluster_analysis(analysis, settings)
        names = [f"S{k}" for k in range(len(clustering.centroids))]
        return SpeakerTimeline(batch.reconstruct(analysis, clustering, names))

    def score(
        self,
        settings: BatchSettings,
        segmentation: SegmentationModel,
        embedding: EmbeddingModel,
        collar: float = 0.25,
    ) -> DerScore:
        hypothesis = self.run(settings, segmentation, embedding)
        return score(
            self.reference,
            hypothesis,
            uem=self.uem,
            duration=self.duration,
            collar=collar,
            uri=self.file_id,
        )


@dataclass
class CrossValidation:
    held_out: DerScore
    """Sum of held-out errors (each file scored with the settings tuned on the others)."""
    best_on_all: DerScore
    """The settings that win on all files, scored on all (optimistic)."""
    best_settings: BatchSettings
    chosen: dict[str, BatchSettings]
    per_file: dict[str, float]
    grid_size: int
    held_out_scores: dict[str, DerScore] = field(default_factory=dict)

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
        best = ", ".join(
            f"{k}={getattr(self.best_settings, k)}" for k in GRID if hasattr(self.best_settings, k)
        )
        return "\n".join(
            [
                f"leave-one-file-out CV over {self.grid_size} settings and {len(self.per_file)} "
                f"files: DER {self.held_out.der * 100:.1f} % (collar 0.25; best-on-all "
                f"{self.best_on_all.der * 100:.1f} % with {best})",
                "  held out: " + ", ".join(f"{k} {v * 100:.1f}" for k, v in self.per_file.items()),
            ]
        )


def cross_validate(
    files: Sequence[TuningFile],
    segmentation: SegmentationModel,
    embedding: EmbeddingModel,
    settings: Iterable[BatchSettings] | None = None,
    *,
    collar: float = 0.25,
    progress: bool = False,
) -> CrossValidation:
    if len(files) < 2:
        raise ValueError("leave-one-file-out cross-validation needs at least two files")
    candidates = list(settings) if settings is not None else grid_settings()
    iterator: Iterable[BatchSettings] = candidates
    if progress:
        from tqdm import tqdm

        iterator = tqdm(candidates, desc="cross-validation grid", unit="setting", file=sys.stderr)
    table = [[f.score(s, segmentation, embedding, collar) for f in files] for s in iterator]
    errors = np.array([[d.errors for d in row] for row in table])  # settings × files
    totals = np.array([d.total for d in table[0]])
    chosen: dict[str, BatchSettings] = {}
    held: list[DerScore] = []
    per_file: dict[str, float] = {}
    held_scores: dict[str, DerScore] = {}
    for j, f in enumerate(files):
        others = [i for i in range(len(files)) if i != j]
        rates = errors[:, others].sum(axis=1) / max(totals[others].sum(), 1e-9)
        best = int(np.argmin(rates))
        chosen[f.file_id] = candidates[best]
        held.append(table[best][j])
        held_scores[f.file_id] = table[best][j]
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
        held_out_scores=held_scores,
    )
