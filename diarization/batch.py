"""The batch diarization pipeline (rule P1, issue 9): pyannote 3.1's recipe on segmentation-3.0
and CAM++.

whole recording → sliding 10 s windows (every `step` s) → segmentation (hard powerset decisions:
up to 3 local speakers per window, 2 at once) → one CAM++ embedding per (window, local speaker)
on the frames where that speaker talks alone → centroid-linkage agglomerative clustering of the
embeddings with enough clean speech (small clusters folded into the nearest large one unless far
from all; then close clusters merged unless they were ever two voices of one window; the speaker
count fixed or bounded when asked) → every local speaker assigned to a cluster (one to one inside
each window; a window with more voices than clusters opens one) → reconstruction: per frame, the number of speakers
the windows agree on (their mean count, rounded), and that many clusters with the most activation,
so overlapped speech gets two speakers.

Shaped in two halves so settings can be tuned without recomputing the models: `analyse` runs the
models once (it depends only on `step`) and keeps small arrays (decisions as uint8, one embedding
per window and local speaker); `cluster_analysis` and `reconstruct` do the rest. Memory is bounded by those
arrays, not by the audio: windows are processed in blocks of `BLOCK` (features computed once per
block), and a window that is digital silence skips the models (an hour of silence costs no model
calls). All numbers live in `BatchSettings`, chosen by leave-one-file-out cross-validation
(docs/benchmarks.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
from scipy.cluster.hierarchy import fcluster, linkage
from scipy.optimize import linear_sum_assignment

from diarization import spectral, vbx
from diarization.models import (
    CHUNK_SAMPLES,
    FRAME_DURATION,
    FRAME_STEP,
    MAX_LOCAL_SPEAKERS,
    SegmentationModel,
)
from voice.centroids import l2_normalize
from voice.diarization_stage import SpeakerSegment
from voice.embedding import FBANK_LENGTH, FBANK_SHIFT, MIN_EMBED_FRAMES, SpeakerEmbedding

SAMPLE_RATE = 16000
BLOCK = 4
"""Windows per block: one segmentation call and one fbank pass each (onnxruntime holds about
25 MB per window of a batch, and larger batches cost no less CPU per window)."""
CLUSTERING_METHODS = ("ahc", "nme-sc")
SILENCE_PEAK = 1e-5
"""A window whose samples all stay under this is digital silence: no model runs on it."""

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]


@runtime_checkable
class SpanEmbedding(Protocol):
    """An embedding that `analyse` runs once over each block's span, pooling every local
    speaker's slice out of its frames (`diarization.live_models.SpanTrunkEmbedding`, tried for
    speed, not the default)."""

    def span_frames(self, features: FloatArray) -> FloatArray: ...

    def pool(self, frames: FloatArray, masks: npt.NDArray[np.bool_]) -> FloatArray: ...


@dataclass(frozen=True)
class BatchSettings:
    """Every number of the batch pipeline (defaults: the cross-validated choice)."""

    step: float = 2.0
    """Seconds between 10 s windows (rounded to 10 ms). Smaller: more evidence, more CPU."""
    threshold: float = 0.7
    """Centroid-linkage merge distance (Euclidean between L2-normalised embeddings)."""
    min_cluster_size: int = 2
    """Clusters with fewer training embeddings are folded into the nearest large one …"""
    fold_below: float = 1.2
    """… unless it is this far (Euclidean, between L2-normalised centroids) from every large
    cluster: a short recording holds a distinct voice in only one or two windows."""
    merge_threshold: float = 1.0
    """After the cut, clusters whose centroids are closer than this merge, closest first, unless
    they were ever heard as two different voices in one window (then they are two people).
    0: off."""
    min_clean_ratio: float = 0.2
    """An embedding trains the clustering when its speaker talks alone this fraction of the window."""
    train_overlapped: bool = False
    """A local speaker heard only in overlap (too little alone for an embedding of its own) trains
    the clustering too when it is active that fraction of the window (tried; off: LOO chose off,
    and `open_unmatched` covers the voice that only ever talks over others)."""
    open_unmatched: bool = True
    """A window with more voices than there are clusters opens a cluster for the extra voice
    (otherwise it joins its nearest cluster, and overlapped speech there gets one speaker)."""
    min_embed_seconds: float = 0.2
    """A local speaker heard less than this (alone, else at all) gets no embedding."""
    max_speakers: int = 20
    clustering: str = "ahc"
    """`ahc` (centroid linkage cut at `threshold`, then the folding and merging above) or
    `nme-sc` (spectral clustering that prunes its own affinity graph and counts speakers by the
    eigengap, `diarization.spectral`; `threshold` unused, the folding and merging still apply)."""
    nme_max_prune: float = 0.25
    """NME-SC: the largest pruning level tried, as a fraction of the embeddings (p ≤ N · this)."""
    nme_max_speakers: int = 8
    """NME-SC: the eigengap is searched among this many smallest eigenvalues (NeMo's default; a
    larger `max_speakers` asked for widens it): further up the spectrum the gaps say nothing of
    speakers."""
    nme_connected: bool = False
    """NME-SC: only pruning levels whose graph is connected are tried (tried; see
    docs/benchmarks.md)."""
    nme_min_embeddings: int = 0
    """NME-SC: with fewer training embeddings than this, AHC clusters instead (the eigengap of a
    graph of a dozen points says little; as `spectralcluster`'s fallback clusterer)."""
    nme_cannot_link: bool = False
    """NME-SC: two local speakers of one window are never neighbours in the affinity graph."""
    count_bound: bool = False
    """AHC: the NME-SC eigengap count (plus one) bounds the number of speakers found."""
    vbx: bool = False
    """After the clustering, a VB-HMM over CAM++ x-vectors of short windows within speech
    (`diarization.vbx`, VBx with the speaker model estimated from the recording) re-decides
    which cluster each window's local speaker is (`vbx_refine`). Costs one more embedding per
    `vbx_step` of speech (about +0.04 CPU-s per audio second). Off: held out it gains only on
    the far-field LibriSpeech renders (11.0 against 11.2 % over the 28 tuning files, AMI level,
    where the recordings are under `vbx_min_xvectors`) and breaks the RTF budget
    (docs/benchmarks.md, 2026-12-06). The `vbx_*` defaults are the cross-validated choice."""
    vbx_window: float = 1.5
    """VBx: seconds of audio per x-vector."""
    vbx_step: float = 0.5
    """VBx: seconds between x-vectors (rounded to 10 ms)."""
    vbx_dim: int = 16
    """VBx: at most this many dimensions of the recording's speaker model (PCA)."""
    vbx_loop: float = 0.9
    """VBx: the probability that the next x-vector has the same speaker."""
    vbx_fa: float = 1.0
    """VBx: scale of the x-vectors' likelihoods (overlapping windows are not independent)."""
    vbx_fb: float = 5.0
    """VBx: scale of the speaker prior (larger: fewer speakers survive)."""
    vbx_min_xvectors: int = 100
    """VBx: with fewer x-vectors than this, the clustering stays as it is (a recording with a
    few dozen seconds of speech gives the speaker model too little to stand on)."""
    vbx_weight: float = 0.5
    """VBx: a local speaker goes to the cluster with the best (1 − this) · (cosine to the
    centroid + 1) / 2 + this · (VBx posterior over its frames); 1: the posterior alone."""
    vbx_within: str = "lag"
    """VBx: where the within-speaker covariance comes from (`diarization.vbx.estimate_model`):
    `lag` (x-vectors of one initial cluster a window apart) or `labels` (the scatter around the
    initial clusters' means: LDA on the initial clustering)."""

    def __post_init__(self) -> None:
        if self.clustering not in CLUSTERING_METHODS:
            raise ValueError(
                f"clustering {self.clustering!r}: choose one of {', '.join(CLUSTERING_METHODS)}"
            )
        if self.vbx_within not in vbx.WITHIN_FROM:
            raise ValueError(
                f"vbx_within {self.vbx_within!r}: choose one of {', '.join(vbx.WITHIN_FROM)}"
            )

    def but(self, **changes: Any) -> BatchSettings:
        return replace(self, **changes)

    @property
    def step_samples(self) -> int:
        return max(FBANK_SHIFT, round(self.step * SAMPLE_RATE / FBANK_SHIFT) * FBANK_SHIFT)


@dataclass
class Analysis:
    """What the models said about one recording: per window its start (samples), hard decisions
    (frames, 3) and one embedding per local speaker (NaN where none; its size is the embedding
    model's)."""

    duration: float
    starts: list[int]
    decisions: npt.NDArray[np.uint8]  # (windows, frames, 3)
    embeddings: FloatArray  # (windows, 3, dim)
    clean_frames: IntArray  # (windows, 3): frames where each local speaker talks alone


def window_starts(n_samples: int, step_samples: int) -> list[int]:
    """Starts of the 10 s windows covering `n_samples` (the last one may run past the end)."""
    starts = [0]
    while starts[-1] + CHUNK_SAMPLES < n_samples:
        starts.append(starts[-1] + step_samples)
    return starts


def _fbank_to_frame(frames: int) -> IntArray:
    """For each fbank frame of a 10 s window, the segmentation frame its centre falls in."""
    n_fbank = 1 + (CHUNK_SAMPLES - FBANK_LENGTH) // FBANK_SHIFT
    centres = (np.arange(n_fbank) * FBANK_SHIFT + FBANK_LENGTH / 2) / SAMPLE_RATE
    index = np.rint((centres - FRAME_DURATION / 2) / FRAME_STEP).astype(np.int64)
    out: IntArray = np.clip(index, 0, frames - 1)
    return out


def analyse(
    audio: FloatArray,
    segmentation: SegmentationModel,
    embedding: SpeakerEmbedding,
    settings: BatchSettings,
) -> Analysis:
    """Run the models over a recording (mono float32, 16 kHz). `embedding`: CAM++ (the default
    stage's), or any `voice.embedding.SpeakerEmbedding` (ECAPA-TDNN, the two fused:
    `voice.ecapa`); its features are computed once per block and sliced per local speaker (a
    `SpanEmbedding` instead runs once over the block and pools each local speaker out of it)."""
    wav = np.asarray(audio, dtype=np.float32)
    spans = embedding if isinstance(embedding, SpanEmbedding) else None
    starts = window_starts(len(wav), settings.step_samples)
    frames = segmentation.frames
    to_frame = _fbank_to_frame(frames)
    min_fbank = max(2, round(settings.min_embed_seconds * SAMPLE_RATE / FBANK_SHIFT))
    decisions = np.zeros((len(starts), frames, MAX_LOCAL_SPEAKERS), np.uint8)
    embeddings = np.full((len(starts), MAX_LOCAL_SPEAKERS, embedding.dim), np.nan, np.float32)
    clean_frames = np.zeros((len(starts), MAX_LOCAL_SPEAKERS), np.int64)
    for block_first in range(0, len(starts), BLOCK):
        block = starts[block_first : block_first + BLOCK]
        lo, hi = block[0], block[-1] + CHUNK_SAMPLES
        span = wav[lo:hi]
        if len(span) < hi - lo:
            span = np.concatenate([span, np.zeros(hi - lo - len(span), np.float32)])
        chunks = np.stack([span[s - lo : s - lo + CHUNK_SAMPLES] for s in block])
        loud = np.abs(chunks).max(axis=1) >= SILENCE_PEAK
        if not loud.any():
            continue
        decided = segmentation.segment(chunks[loud])
        block_decisions = np.zeros((len(block), frames, MAX_LOCAL_SPEAKERS), np.uint8)
        block_decisions[loud] = decided
        decisions[block_first : block_first + len(block)] = block_decisions
        feats = embedding.features(span)
        slices: list[FloatArray] = []
        owners: list[tuple[int, int]] = []
        masks: list[npt.NDArray[np.bool_]] = []
        for i, start in enumerate(block):
            if not loud[i]:
                continue
            window = block_decisions[i]
            alone = window.sum(axis=1) == 1
            first = (start - lo) // FBANK_SHIFT
            window_feats = feats[first : first + len(to_frame)]
            for speaker in range(MAX_LOCAL_SPEAKERS):
                active = window[:, speaker] == 1
                clean = active & alone
                clean_frames[block_first + i, speaker] = int(clean.sum())
                keep = clean[to_frame][: len(window_feats)]
                if keep.sum() < min_fbank:
                    keep = active[to_frame][: len(window_feats)]
                if keep.sum() < min_fbank:
                    continue
                if spans is not None:
                    mask = np.zeros(len(feats), np.bool_)
                    mask[first : first + len(keep)] = keep
                    masks.append(mask)
                else:
                    slices.append(window_feats[keep])
                owners.append((block_first + i, speaker))
        if spans is not None and masks:
            vectors = spans.pool(spans.span_frames(feats), np.stack(masks))
            for (w, s), vector in zip(owners, vectors, strict=True):
                embeddings[w, s] = vector
        if slices:
            vectors = embedding.embed_features(slices, min_frames=min_fbank)
            for (w, s), vector in zip(owners, vectors, strict=True):
                embeddings[w, s] = vector
    return Analysis(len(wav) / SAMPLE_RATE, starts, decisions, embeddings, clean_frames)


def cluster_embeddings(
    train: FloatArray,
    settings: BatchSettings,
    *,
    windows: IntArray | None = None,
    num_speakers: int | None = None,
    min_speakers: int | None = None,
    max_speakers: int | None = None,
) -> IntArray:
    """Cluster labels (0 … k-1) of L2-normalised training embeddings: centroid-linkage AHC cut at
    `settings.threshold`, small clusters folded into the nearest large one, then the count forced
    into [min_speakers, max_speakers] (or to num_speakers) by cutting the dendrogram elsewhere.
    With `settings.clustering == "nme-sc"`, NME-SC instead (`diarization.spectral`)."""
    n = len(train)
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    if settings.clustering == "nme-sc" and n >= settings.nme_min_embeddings:
        return _cluster_nme_sc(
            train,
            settings,
            windows=windows,
            num_speakers=num_speakers,
            min_speakers=min_speakers,
            max_speakers=max_speakers,
        )
    if settings.count_bound and num_speakers is None:
        counted = spectral.nme_sc(
            train,
            max_prune=settings.nme_max_prune,
            search=settings.nme_max_speakers,
            connected=settings.nme_connected,
        ).eigengap_count
        max_speakers = min(max_speakers or settings.max_speakers, counted + 1)
    tree = linkage(train.astype(np.float64), method="centroid", metric="euclidean")
    labels = fcluster(tree, settings.threshold, criterion="distance") - 1
    min_size = settings.min_cluster_size
    labels = _fold_small(train, labels.astype(np.int64), min_size, fold_below=settings.fold_below)
    if windows is not None and settings.merge_threshold > 0:
        labels = _merge_apart(train, _relabel(labels), windows, settings.merge_threshold)
    k = int(labels.max()) + 1
    cap = min(max_speakers or settings.max_speakers, settings.max_speakers, n)
    target: int | None = None
    if num_speakers is not None:
        target = min(num_speakers, n)
    elif min_speakers is not None and k < min_speakers:
        target = min(min_speakers, n)
    elif k > cap:
        target = cap
    if target is not None and target != k:
        labels = _cut(tree, n, target)
        labels = _fold_small(train, labels, min_size, keep=target, fold_below=settings.fold_below)
    return _relabel(labels)


def _cluster_nme_sc(
    train: FloatArray,
    settings: BatchSettings,
    *,
    windows: IntArray | None,
    num_speakers: int | None,
    min_speakers: int | None,
    max_speakers: int | None,
) -> IntArray:
    """NME-SC labels, then the same folding of small clusters and merging of clusters never heard
    together as after AHC (the count asked for is kept)."""
    n = len(train)
    cap = min(max_speakers or settings.max_speakers, settings.max_speakers, n)
    cannot_link = None
    if settings.nme_cannot_link and windows is not None:
        cannot_link = windows[:, None] == windows[None, :]
    result = spectral.nme_sc(
        train,
        max_prune=settings.nme_max_prune,
        num_speakers=None if num_speakers is None else min(num_speakers, n),
        min_speakers=min(min_speakers or 1, cap),
        max_speakers=cap,
        search=max(settings.nme_max_speakers, max_speakers or 0),
        cannot_link=cannot_link,
        connected=settings.nme_connected,
    )
    labels = result.labels
    keep = int(labels.max()) + 1 if num_speakers is not None or min_speakers else None
    labels = _fold_small(
        train, labels, settings.min_cluster_size, keep=keep, fold_below=settings.fold_below
    )
    if windows is not None and settings.merge_threshold > 0 and keep is None:
        labels = _merge_apart(train, _relabel(labels), windows, settings.merge_threshold)
    return _relabel(labels)


def _merge_apart(
    train: FloatArray, labels: IntArray, windows: IntArray, threshold: float
) -> IntArray:
    """Merge clusters closer than `threshold` (centroid distance, closest pair first) unless the
    two were ever distinct local speakers of one window."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) < 2:
            return labels
        cents = l2_normalize(np.stack([train[labels == c].mean(axis=0) for c in ids]))
        heard = [set(windows[labels == c].tolist()) for c in ids]
        best: tuple[float, int, int] | None = None
        for i in range(len(ids)):
            for j in range(i + 1, len(ids)):
                distance = float(np.linalg.norm(cents[i] - cents[j]))
                if distance < threshold and not heard[i] & heard[j]:
                    if best is None or distance < best[0]:
                        best = (distance, i, j)
        if best is None:
            return labels
        labels[labels == ids[best[2]]] = ids[best[1]]


def _cut(tree: npt.NDArray[np.float64], n: int, target: int) -> IntArray:
    """Labels with exactly `target` clusters: the first n - target merges of the tree, in merge
    order. (Centroid linkage is not monotonic, and scipy's fcluster/cut_tree then give fewer.)"""
    parent = list(range(2 * n - 1))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for step, (a, b, _, _) in enumerate(tree[: n - target]):
        parent[root(int(a))] = n + step
        parent[root(int(b))] = n + step
    return _relabel(np.array([root(i) for i in range(n)], np.int64))


def _fold_small(
    train: FloatArray,
    labels: IntArray,
    min_size: int,
    *,
    keep: int | None = None,
    fold_below: float = 2.0,
) -> IntArray:
    """Clusters smaller than `min_size` join the nearest large cluster (by centroid) unless their
    centroid is at least `fold_below` from every large one; when `keep` is given, the `keep`
    largest clusters always count as large. With no large cluster at all, everything is one
    speaker."""
    ids, sizes = np.unique(labels, return_counts=True)
    order = ids[np.argsort(-sizes, kind="stable")]
    large = [int(c) for c, s in zip(ids, sizes, strict=True) if s >= min_size]
    if keep is not None:
        large = sorted(set(large) | {int(c) for c in order[:keep]})
    if large and fold_below < 2.0:
        big = l2_normalize(np.stack([train[labels == c].mean(axis=0) for c in large]))
        for c in ids:
            if int(c) in large:
                continue
            centroid = l2_normalize(train[labels == c].mean(axis=0))
            if float(np.min(np.linalg.norm(big - centroid, axis=1))) >= fold_below:
                large.append(int(c))
        large.sort()
    if not large:
        return np.zeros(len(labels), np.int64)
    if len(large) == len(ids):
        return labels
    cents = l2_normalize(np.stack([train[labels == c].mean(axis=0) for c in large]))
    out = labels.copy()
    for i in np.where(~np.isin(labels, large))[0]:
        out[i] = large[int(np.argmax(cents @ train[i]))]
    return out


def _relabel(labels: IntArray) -> IntArray:
    mapping = {int(old): new for new, old in enumerate(dict.fromkeys(labels.tolist()))}
    return np.array([mapping[int(x)] for x in labels], np.int64)


@dataclass
class Clustering:
    """Global speakers: their centroids (k, dim) and, per window and local speaker, the global
    speaker it was assigned (-1: silent there)."""

    centroids: FloatArray
    assignment: IntArray  # (windows, 3)


def cluster_analysis(
    analysis: Analysis,
    settings: BatchSettings,
    *,
    num_speakers: int | None = None,
    min_speakers: int | None = None,
    max_speakers: int | None = None,
) -> Clustering:
    windows, frames, _ = analysis.decisions.shape
    valid: npt.NDArray[np.bool_] = np.logical_not(np.isnan(analysis.embeddings).any(axis=2))
    enough = settings.min_clean_ratio * frames
    trains = valid & (analysis.clean_frames >= enough)
    if settings.train_overlapped:
        active_frames = analysis.decisions.sum(axis=1)
        overlapped_only = analysis.clean_frames < settings.min_embed_seconds / FRAME_STEP
        trains |= valid & overlapped_only & (active_frames >= enough)
    if not trains.any():
        trains = valid  # short recordings: every embedding counts
    assignment = np.full((windows, MAX_LOCAL_SPEAKERS), -1, np.int64)
    if not valid.any():
        return Clustering(np.zeros((0, analysis.embeddings.shape[2]), np.float32), assignment)
    train = l2_normalize(analysis.embeddings[trains])
    labels = cluster_embeddings(
        train,
        settings,
        windows=np.nonzero(trains)[0].astype(np.int64),
        num_speakers=num_speakers,
        min_speakers=min_speakers,
        max_speakers=max_speakers,
    )
    k = int(labels.max()) + 1
    cents = l2_normalize(np.stack([train[labels == c].mean(axis=0) for c in range(k)]))
    limit = num_speakers or min(max_speakers or settings.max_speakers, settings.max_speakers)
    active: npt.NDArray[np.bool_] = analysis.decisions.sum(axis=1) > 0  # (windows, 3)
    for w in range(windows):
        speakers = [s for s in range(MAX_LOCAL_SPEAKERS) if active[w, s] and valid[w, s]]
        if not speakers:
            continue
        vectors = l2_normalize(analysis.embeddings[w, speakers])
        scores = vectors @ cents.T  # (speakers, k)
        rows, cols = linear_sum_assignment(-scores)
        for r, c in zip(rows, cols, strict=True):
            assignment[w, speakers[r]] = c
        for r in sorted(set(range(len(speakers))) - set(rows.tolist())):
            # more voices in this window than clusters: the segmentation hears them as different
            # people, so (with open_unmatched) the extra one is a speaker of its own, within the
            # speaker count asked for
            if settings.open_unmatched and len(cents) < limit:
                cents = np.concatenate([cents, vectors[r : r + 1]])
                assignment[w, speakers[r]] = len(cents) - 1
            else:
                assignment[w, speakers[r]] = int(np.argmax(scores[r]))
    return Clustering(cents, assignment)


def _frame_activity(
    analysis: Analysis, assignment: IntArray, k: int
) -> tuple[IntArray, FloatArray]:
    """Per frame of the whole recording: the rounded mean speaker count over the windows
    covering it, and each global speaker's summed activation there."""
    frames = analysis.decisions.shape[1]
    offsets = _offsets(analysis)
    total = offsets[-1] + frames if offsets else 0
    count_sum = np.zeros(total, np.float32)
    count_n = np.zeros(total, np.float32)
    activation = np.zeros((total, k), np.float32)
    for w, offset in enumerate(offsets):
        window = analysis.decisions[w]
        count_sum[offset : offset + frames] += window.sum(axis=1)
        count_n[offset : offset + frames] += 1
        local = np.zeros((frames, k), np.float32)
        for s in range(MAX_LOCAL_SPEAKERS):
            c = int(assignment[w, s])
            if c >= 0:
                local[:, c] = np.maximum(local[:, c], window[:, s])
        activation[offset : offset + frames] += local
    count: IntArray = np.rint(count_sum / np.maximum(count_n, 1)).astype(np.int64)
    return count, activation


def _offsets(analysis: Analysis) -> list[int]:
    """Each window's first frame on the recording's frame grid."""
    return [round(s / SAMPLE_RATE / FRAME_STEP) for s in analysis.starts]


def reconstruct(
    analysis: Analysis, clustering: Clustering, names: Sequence[str]
) -> list[SpeakerSegment]:
    """Frame-level timeline: per frame, the rounded mean speaker count over the windows covering
    it, and that many global speakers with the most activation there (overlap: two)."""
    windows = analysis.decisions.shape[0]
    k = len(clustering.centroids)
    if k == 0 or windows == 0:
        return []
    count, activation = _frame_activity(analysis, clustering.assignment, k)
    total = len(count)
    count = np.minimum(count, (activation > 0).sum(axis=1))
    ranked = np.argsort(-activation, axis=1, kind="stable")
    on = np.zeros((total, k), bool)
    for n in range(1, int(count.max(initial=0)) + 1):
        rows = np.where(count >= n)[0]
        on[rows, ranked[rows, n - 1]] = True
    segments: list[SpeakerSegment] = []
    for c in range(k):
        column = np.concatenate([[False], on[:, c], [False]])
        edges = np.flatnonzero(column[1:] != column[:-1])
        for first, stop in zip(edges[::2], edges[1::2], strict=True):
            start = first * FRAME_STEP + FRAME_DURATION / 2
            end = min(stop * FRAME_STEP + FRAME_DURATION / 2, analysis.duration)
            if end > start:
                segments.append(SpeakerSegment(round(start, 3), round(end, 3), names[c]))
    return segments


# -- VBx (optional, `BatchSettings.vbx`) ----------------------------------------------------------

VBX_MIN_SPEECH = 0.5
"""A VBx window is embedded when at least this fraction of its frames is speech (all of its
audio is: windows of one length share one batched network call)."""
VBX_BATCH = 256
"""VBx windows embedded per call (bounds the fbank slices held at once)."""


@dataclass
class XVectors:
    """VBx's x-vector sequence: per short window its index on the `vbx_step` grid (window j
    spans [j · step, j · step + window] seconds) and its L2-normalised embedding."""

    positions: IntArray  # (n,), ascending
    embeddings: FloatArray  # (n, dim)
    step: float
    window: float


def _vbx_grid(settings: BatchSettings) -> tuple[float, float]:
    step = max(FBANK_SHIFT, round(settings.vbx_step * SAMPLE_RATE / FBANK_SHIFT) * FBANK_SHIFT)
    return step / SAMPLE_RATE, settings.vbx_window


def _frame_span(t0: float, t1: float, total: int) -> tuple[int, int]:
    """The recording's frames whose centres fall in [t0, t1)."""
    first = int(np.ceil((t0 - FRAME_DURATION / 2) / FRAME_STEP))
    stop = int(np.ceil((t1 - FRAME_DURATION / 2) / FRAME_STEP))
    return min(max(first, 0), total), min(max(stop, 0), total)


def xvectors(
    audio: FloatArray,
    analysis: Analysis,
    embedding: SpeakerEmbedding,
    settings: BatchSettings,
) -> XVectors:
    """Embeddings of `vbx_window` s windows every `vbx_step` s where the segmentation hears
    speech (its mean speaker count over the 10 s windows, rounded, at least one, on at least
    `VBX_MIN_SPEECH` of the window)."""
    wav = np.asarray(audio, dtype=np.float32)
    step, window = _vbx_grid(settings)
    empty = XVectors(np.zeros(0, np.int64), np.zeros((0, embedding.dim), np.float32), step, window)
    if analysis.decisions.shape[0] == 0:
        return empty
    count, _ = _frame_activity(analysis, np.full((len(analysis.starts), 3), -1, np.int64), 1)
    speech = count >= 1
    n_grid = max(1, int(np.ceil(max(analysis.duration - window, 0.0) / step)) + 1)
    kept: list[int] = []
    for j in range(n_grid):
        first, stop = _frame_span(j * step, j * step + window, len(speech))
        if stop > first and speech[first:stop].mean() >= VBX_MIN_SPEECH:
            kept.append(j)
    hop = round(step * SAMPLE_RATE) // FBANK_SHIFT  # fbank frames between x-vectors
    length = 1 + (round(window * SAMPLE_RATE) - FBANK_LENGTH) // FBANK_SHIFT
    positions: list[int] = []
    vectors: list[FloatArray] = []
    for lo in range(0, len(kept), VBX_BATCH):
        chunk = kept[lo : lo + VBX_BATCH]
        s0 = chunk[0] * hop * FBANK_SHIFT
        s1 = chunk[-1] * hop * FBANK_SHIFT + round(window * SAMPLE_RATE)
        feats = embedding.features(wav[s0:s1])  # one fbank pass per chunk, sliced per window
        slices = [feats[(j - chunk[0]) * hop : (j - chunk[0]) * hop + length] for j in chunk]
        found = embedding.embed_features(slices, min_frames=MIN_EMBED_FRAMES)
        for j, vector in zip(chunk, found, strict=True):
            if not np.isnan(vector).any():
                positions.append(j)
                vectors.append(vector)
    if not vectors:
        return empty
    return XVectors(
        np.array(positions, np.int64),
        l2_normalize(np.stack(vectors).astype(np.float32)),
        step,
        window,
    )


def vbx_refine(
    analysis: Analysis, clustering: Clustering, vectors: XVectors, settings: BatchSettings
) -> Clustering:
    """VBx (`diarization.vbx`) from the clustering: each x-vector starts as the cluster most
    active over its window, the VB-HMM re-decides them with the recording's own speaker model,
    and every assigned local speaker of every window then goes to the clusters by the VBx
    posteriors over the frames where it talks alone (one to one inside the window; a local
    speaker with no x-vector under it keeps cosine to the centroids). Centroids are recomputed
    from the local speakers' embeddings."""
    k = len(clustering.centroids)
    n = len(vectors.positions)
    if k < 2 or n < max(2, settings.vbx_min_xvectors):
        return clustering
    count, activation = _frame_activity(analysis, clustering.assignment, k)
    total = len(count)
    spans = [
        _frame_span(j * vectors.step, j * vectors.step + vectors.window, total)
        for j in vectors.positions.tolist()
    ]
    cents = clustering.centroids
    labels = np.zeros(n, np.int64)
    for i, (first, stop) in enumerate(spans):
        act = activation[first:stop].sum(axis=0)
        near = act if act.max() > 0 else cents @ vectors.embeddings[i]
        labels[i] = int(np.argmax(near))
    posteriors = vbx.refine(
        vectors.embeddings,
        labels,
        vectors.positions,
        k=k,
        lag=max(1, round(vectors.window / vectors.step)),
        dim=settings.vbx_dim,
        loop=settings.vbx_loop,
        fa=settings.vbx_fa,
        fb=settings.vbx_fb,
        within_from=settings.vbx_within,
    )
    if posteriors is None:
        return clustering
    # every frame takes the posteriors of the x-vector whose window is centred nearest to it
    lookup = np.full(int(vectors.positions.max()) + 1, -1, np.int64)
    lookup[vectors.positions] = np.arange(n)
    centres = np.arange(total) * FRAME_STEP + FRAME_DURATION / 2
    nearest = np.rint((centres - vectors.window / 2) / vectors.step).astype(np.int64)
    inside = (nearest >= 0) & (nearest < len(lookup))
    rows = np.full(total, -1, np.int64)
    rows[inside] = lookup[nearest[inside]]
    frame_post = np.zeros((total, k), np.float64)
    covered = rows >= 0
    frame_post[covered] = posteriors[rows[covered]]
    assignment = clustering.assignment.copy()
    for w, offset in enumerate(_offsets(analysis)):
        speakers = [s for s in range(MAX_LOCAL_SPEAKERS) if assignment[w, s] >= 0]
        if not speakers:
            continue
        window = analysis.decisions[w]
        alone = window.sum(axis=1) == 1
        vectors_w = l2_normalize(analysis.embeddings[w, speakers])
        scores = (vectors_w @ cents.T + 1.0) / 2.0  # (speakers, k), in [0, 1] like a posterior
        for r, s in enumerate(speakers):
            active = window[:, s] == 1
            chosen = active & alone if (active & alone).any() else active
            index = offset + np.nonzero(chosen)[0]
            index = index[index < total]
            index = index[covered[index]]
            if len(index):
                weight = settings.vbx_weight
                scores[r] = (1 - weight) * scores[r] + weight * frame_post[index].mean(axis=0)
        picked, cols = linear_sum_assignment(-scores)
        for r, c in zip(picked, cols, strict=True):
            assignment[w, speakers[r]] = c
        for r in sorted(set(range(len(speakers))) - set(picked.tolist())):
            assignment[w, speakers[r]] = int(np.argmax(scores[r]))
    new_cents = cents.copy()
    for c in range(k):
        mine = assignment == c
        if mine.any():
            new_cents[c] = l2_normalize(l2_normalize(analysis.embeddings[mine]).mean(axis=0))
    return Clustering(new_cents, assignment)
