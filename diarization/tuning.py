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

import hashlib
import itertools
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from diarization import batch
from diarization.batch import Analysis, BatchSettings
from diarization.models import SegmentationModel
from diarization.scoring import DerScore, score
from voice.diarization_stage import SpeakerTimeline
from voice.embedding import CAMPPLUS_NAME, SpeakerEmbedding

# The search space (small on purpose: every extra knob is a chance to fit these files).
GRID: dict[str, Sequence[Any]] = {
    "threshold": (0.6, 0.7, 0.8),
    "merge_threshold": (0.0, 0.8, 0.9, 1.0),
    "min_cluster_size": (1, 2, 3),
    "fold_below": (1.2, 1.3, 2.0),
    "open_unmatched": (False, True),
}
# NME-SC's own (it has no threshold: the pruning level and the count come from the eigengap)
NME_GRID: dict[str, Sequence[Any]] = {
    "nme_max_prune": (0.15, 0.25, 0.4),
    "nme_cannot_link": (False, True),
    "nme_connected": (False, True),
    "nme_min_embeddings": (0, 30),
    "merge_threshold": (0.0, 0.9, 1.0),
    "min_cluster_size": (1, 2),
}
GRIDS: dict[str, dict[str, Sequence[Any]]] = {"ahc": GRID, "nme-sc": NME_GRID}
# AHC's grid widened to the distances of other embeddings (issue 30: ECAPA-TDNN's same-speaker
# cosines run lower than CAM++'s, so its cut and merge distances lie further out)
WIDE_GRID: dict[str, Sequence[Any]] = {
    **GRID,
    "threshold": (0.6, 0.7, 0.8, 0.9, 1.0),
    "merge_threshold": (0.0, 0.8, 0.9, 1.0, 1.1, 1.2),
}
# VBx after AHC at AHC's defaults (issue 30, item 2): its own numbers only (each point turns it
# on; `--cv-grid ahc --cv-grid vbx` lets each fold choose it or not)
VBX_GRID: dict[str, Sequence[Any]] = {
    "vbx": (True,),
    "vbx_within": ("lag", "labels"),
    "vbx_weight": (0.3, 0.5, 1.0),
    "vbx_fa": (0.3, 1.0),
    "vbx_fb": (5.0, 17.0),
    "vbx_min_xvectors": (0, 100),
}
NAMED_GRIDS: dict[str, tuple[str, dict[str, Sequence[Any]]]] = {
    "ahc": ("ahc", GRID),
    "nme-sc": ("nme-sc", NME_GRID),
    "ahc-wide": ("ahc", WIDE_GRID),
    "vbx": ("ahc", VBX_GRID),
}
"""`chorus bench diarization --cv-grid NAME`: the clustering method and grid of each name."""


def grid_settings(
    grid: dict[str, Sequence[Any]] | None = None, base: BatchSettings | None = None
) -> list[BatchSettings]:
    """Every combination of the grid over `base` (by default the grid of `base`'s method)."""
    base = base or BatchSettings()
    grid = GRIDS[base.clustering] if grid is None else grid
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
    cache: Path | None = None
    """A folder where the models' analyses are kept between runs (`<file id>-<step>-<audio
    hash>[-<embedding>].npz`, no suffix for CAM++), so a new clustering variant does not re-run the
    models."""
    _analyses: dict[float, Analysis] = field(default_factory=dict, repr=False)
    _xvectors: dict[tuple[float, float, float], batch.XVectors] = field(
        default_factory=dict, repr=False
    )
    _digest: str | None = field(default=None, repr=False)
    """The audio's hash in the cache's file names, computed once."""

    @classmethod
    def load(
        cls,
        path: Path,
        reference: SpeakerTimeline,
        uem: list[tuple[float, float]] | None,
        cache: Path | None = None,
    ) -> TuningFile:
        from voice.audio import read_audio_16k

        return cls(path.stem, read_audio_16k(path), reference, uem, cache)

    @property
    def duration(self) -> float:
        return len(self.audio) / batch.SAMPLE_RATE

    def analysis(
        self, settings: BatchSettings, segmentation: SegmentationModel, embedding: SpeakerEmbedding
    ) -> Analysis:
        key = settings.step
        if key not in self._analyses:
            self._analyses[key] = self._cached(
                settings,
                embedding.name,
                lambda: batch.analyse(self.audio, segmentation, embedding, settings),
            )
        return self._analyses[key]

    def _cache_path(self, settings: BatchSettings, model: str, suffix: str = "") -> Path | None:
        """Where what the models made of this file at `settings.step` is kept (None: no cache):
        `<file id>-<step>-<audio hash>[-<embedding>]<suffix>.npz`."""
        if self.cache is None:
            return None
        if self._digest is None:
            self._digest = hashlib.sha1(np.ascontiguousarray(self.audio).tobytes()).hexdigest()[:12]
        # CAM++'s files keep the name they had before there was a choice of embedding
        named = "" if model == CAMPPLUS_NAME else f"-{model}"
        return self.cache / f"{self.file_id}-{settings.step_samples}-{self._digest}{named}{suffix}.npz"

    def _cached(
        self, settings: BatchSettings, model: str, compute: Callable[[], Analysis]
    ) -> Analysis:
        path = self._cache_path(settings, model)
        if path is None:
            return compute()
        if path.is_file():
            with np.load(path) as data:
                return Analysis(
                    float(data["duration"]),
                    [int(x) for x in data["starts"]],
                    data["decisions"],
                    data["embeddings"],
                    data["clean_frames"],
                )
        analysis = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            duration=analysis.duration,
            starts=np.array(analysis.starts, np.int64),
            decisions=analysis.decisions,
            embeddings=analysis.embeddings,
            clean_frames=analysis.clean_frames,
        )
        return analysis

    def xvectors(
        self, settings: BatchSettings, segmentation: SegmentationModel, embedding: SpeakerEmbedding
    ) -> batch.XVectors:
        """VBx's x-vectors (`batch.xvectors`), kept like the analyses (`<file id>-<step>-<audio
        hash>[-<embedding>]-vbx<window ms>-<step ms>.npz` in the cache)."""
        key = (settings.step, settings.vbx_window, settings.vbx_step)
        if key not in self._xvectors:
            analysis = self.analysis(settings, segmentation, embedding)
            compute = lambda: batch.xvectors(self.audio, analysis, embedding, settings)  # noqa: E731
            self._xvectors[key] = self._cached_xvectors(settings, embedding.name, compute)
        return self._xvectors[key]

    def _cached_xvectors(
        self, settings: BatchSettings, model: str, compute: Callable[[], batch.XVectors]
    ) -> batch.XVectors:
        grid = f"-vbx{round(settings.vbx_window * 1000)}-{round(settings.vbx_step * 1000)}"
        path = self._cache_path(settings, model, grid)
        if path is None:
            return compute()
        if path.is_file():
            with np.load(path) as data:
                return batch.XVectors(
                    data["positions"],
                    data["embeddings"],
                    float(data["step"]),
                    float(data["window"]),
                )
        vectors = compute()
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez(
            path,
            positions=vectors.positions,
            embeddings=vectors.embeddings,
            step=vectors.step,
            window=vectors.window,
        )
        return vectors

    def run(
        self, settings: BatchSettings, segmentation: SegmentationModel, embedding: SpeakerEmbedding
    ) -> SpeakerTimeline:
        analysis = self.analysis(settings, segmentation, embedding)
        clustering = batch.cluster_analysis(analysis, settings)
        if settings.vbx:
            vectors = self.xvectors(settings, segmentation, embedding)
            clustering = batch.vbx_refine(analysis, clustering, vectors, settings)
        names = [f"S{k}" for k in range(len(clustering.centroids))]
        return SpeakerTimeline(batch.reconstruct(analysis, clustering, names))

    def score(
        self,
        settings: BatchSettings,
        segmentation: SegmentationModel,
        embedding: SpeakerEmbedding,
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
    held_out_collar0: DerScore | None = None
    """The same held-out timelines scored at collar 0."""
    held_out_scores_collar0: dict[str, DerScore] = field(default_factory=dict)
    speakers: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per file: speakers found by its held-out settings, and in the reference."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "loo_cv_der": self.held_out.der,
            "loo_cv": self.held_out.as_dict(),
            "loo_cv_collar0": None
            if self.held_out_collar0 is None
            else self.held_out_collar0.as_dict(),
            "per_file_held_out": {
                k: {
                    "collar_0.25": v.as_dict(),
                    "collar_0": self.held_out_scores_collar0[k].as_dict()
                    if k in self.held_out_scores_collar0
                    else None,
                    "speakers_found": self.speakers.get(k, (0, 0))[0],
                    "speakers_ref": self.speakers.get(k, (0, 0))[1],
                }
                for k, v in self.held_out_scores.items()
            },
            "best_on_all_der": self.best_on_all.der,
            "best_settings": asdict(self.best_settings),
            "per_file_held_out_der": self.per_file,
            "chosen_per_fold": {k: asdict(v) for k, v in self.chosen.items()},
            "grid_size": self.grid_size,
        }

    def describe(self) -> str:
        keys = ["clustering", *GRIDS[self.best_settings.clustering]]
        if self.best_settings.vbx:
            keys += [k for k in VBX_GRID if k not in keys]
        best = ", ".join(f"{k}={getattr(self.best_settings, k)}" for k in keys)
        zero = (
            ""
            if self.held_out_collar0 is None
            else f", {self.held_out_collar0.der * 100:.1f} % at collar 0"
        )
        h = self.held_out
        return "\n".join(
            [
                f"leave-one-file-out CV over {self.grid_size} settings and {len(self.per_file)} "
                f"files: DER {h.der * 100:.1f} % (collar 0.25{zero}; missed "
                f"{h.missed / h.total * 100:.1f}, false alarm {h.false_alarm / h.total * 100:.1f}, "
                f"confusion {h.confusion / h.total * 100:.1f}; best-on-all "
                f"{self.best_on_all.der * 100:.1f} % with {best})",
                "  held out (collar 0.25, speakers found/ref): "
                + ", ".join(
                    f"{k} {v * 100:.1f} ({self.speakers[k][0]}/{self.speakers[k][1]})"
                    if k in self.speakers
                    else f"{k} {v * 100:.1f}"
                    for k, v in self.per_file.items()
                ),
            ]
        )


def cross_validate(
    files: Sequence[TuningFile],
    segmentation: SegmentationModel,
    embedding: SpeakerEmbedding,
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
    held_zero: dict[str, DerScore] = {}
    speakers: dict[str, tuple[int, int]] = {}
    for f in files:
        hypothesis = f.run(chosen[f.file_id], segmentation, embedding)
        held_zero[f.file_id] = score(
            f.reference, hypothesis, uem=f.uem, duration=f.duration, collar=0.0, uri=f.file_id
        )
        speakers[f.file_id] = (len(hypothesis.speakers), len(f.reference.speakers))
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
        held_out_collar0=DerScore.sum(held_zero.values()),
        held_out_scores_collar0=held_zero,
        speakers=speakers,
    )
