"""The embedded diarization recipe as small pure steps (P1), shared by the batch and live paths
and by the tuning script.

speech probabilities (Silero, 32 ms frames) → speech mask → embedding windows over the speech
(GE2E, one batched pass) → clustering (spectral with an eigengap speaker count by default, or
agglomerative with a distance threshold) → refinement (centroid re-estimation) →
frame scores (each frame averages the similarity of the windows that cover it to each centroid)
→ Viterbi smoothing with a speaker-switch penalty → optional second speaker where two centroids
score alike (overlap) → segments.

Each step takes arrays and returns arrays, so it can be cached and tuned alone; `Settings` holds
every number, chosen by leave-one-file-out cross-validation (docs/benchmarks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import sparse
from scipy.cluster.hierarchy import fcluster, linkage

from voice.diarization_stage import SpeakerSegment
from voice.embedding import HOP as MEL_HOP
from voice.embedding import SAMPLE_RATE
from voice.vad import FRAME_SECONDS, speech_regions

FloatArray = npt.NDArray[np.float32]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

MEL_SECONDS = MEL_HOP / SAMPLE_RATE  # 10 ms


@dataclass(frozen=True)
class Settings:
    """Every number of the recipe. Defaults are the cross-validated choice."""

    vad_threshold: float = 0.1
    normalize: bool = False  # level normalisation before the VAD did not help on AMI (measured)
    min_speech: float = 0.1
    max_gap: float = 0.8  # pauses up to this long inside a turn are bridged
    speech_pad: float = 0.0  # seconds added to each side of a speech region
    window: float = 1.5  # seconds of speech per embedding window
    hop: float = 0.5
    compact: bool = True  # windows over the speech only (silence removed) rather than wall time
    method: str = "spectral"  # "spectral" (eigengap) or "ahc" (distance threshold)
    cluster_threshold: float = 0.4  # AHC: cosine distance at which merging stops
    prune: float = 0.8  # spectral: fraction of each affinity row zeroed (keeps the nearest)
    min_cluster_windows: int = 2
    refine_iterations: int = 2
    switch_penalty: float = 0.1
    overlap_margin: float = 0.03  # second speaker where it scores within this of the first
    overlap_min_score: float = 0.5
    change_overlap: float = 0.0  # seconds around a speaker change where both are kept
    max_speakers: int = 8
    max_cluster_points: int = 1500  # beyond this many windows, cluster block means

    def but(self, **changes: Any) -> Settings:
        return replace(self, **changes)


def speech_mask(probs: FloatArray, settings: Settings) -> BoolArray:
    """Per 32 ms frame: is it speech (regions with hysteresis, gaps bridged, blips dropped)."""
    mask = np.zeros(len(probs), bool)
    pad = round(settings.speech_pad / FRAME_SECONDS)
    for r in speech_regions(
        probs,
        threshold=settings.vad_threshold,
        min_speech=settings.min_speech,
        max_gap=settings.max_gap,
    ):
        mask[max(0, round(r.start / FRAME_SECONDS) - pad) : round(r.end / FRAME_SECONDS) + pad] = (
            True
        )
    return mask


@dataclass
class Windows:
    """Embedding windows: `mel_index[i]` are the mel frames of window i (length n each), and
    `cover` (windows × VAD frames, sparse) says which speech frames each window covers."""

    mel_index: IntArray  # (n_windows, frames_per_window)
    cover: sparse.csr_matrix
    centers: FloatArray  # seconds, wall time of each window's middle speech frame


def plan_windows(mask: BoolArray, n_mel: int, settings: Settings) -> Windows:
    """Place windows of `window` seconds every `hop` seconds over the speech."""
    per_window = max(1, round(settings.window / MEL_SECONDS))
    step = max(1, round(settings.hop / MEL_SECONDS))
    mel_times = np.arange(n_mel) * MEL_SECONDS
    vad_of_mel = np.minimum((mel_times / FRAME_SECONDS).astype(np.int64), len(mask) - 1)
    is_speech = mask[vad_of_mel] if len(mask) else np.zeros(n_mel, bool)
    rows: list[IntArray] = []
    if settings.compact:
        speech_idx = np.flatnonzero(is_speech)
        if len(speech_idx) == 0:
            return _empty_windows(len(mask), per_window)
        total = len(speech_idx)
        if total <= per_window:
            starts = [0]
        else:
            starts = list(range(0, total - per_window + 1, step))
            if starts[-1] + per_window < total:
                starts.append(total - per_window)
        for s in starts:
            idx = speech_idx[s : s + per_window]
            if len(idx) < per_window:  # short recording: pad by repeating the speech
                idx = np.resize(idx, per_window)
            rows.append(idx)
    else:
        for a, b in _runs(is_speech):
            length = b - a
            if length <= per_window:
                mid = (a + b) // 2
                s = int(np.clip(mid - per_window // 2, 0, max(0, n_mel - per_window)))
                starts = [s]
            else:
                starts = list(range(a, b - per_window + 1, step))
                if starts[-1] + per_window < b:
                    starts.append(b - per_window)
            for s in starts:
                rows.append(np.clip(np.arange(s, s + per_window), 0, n_mel - 1))
    if not rows:
        return _empty_windows(len(mask), per_window)
    mel_index = np.stack(rows).astype(np.int64)
    # which speech VAD frames each window covers
    r_list: list[IntArray] = []
    c_list: list[IntArray] = []
    centers = np.empty(len(rows), np.float32)
    for i, idx in enumerate(mel_index):
        frames = np.unique(vad_of_mel[idx])
        frames = frames[mask[frames]]
        if len(frames) == 0:
            frames = np.unique(vad_of_mel[idx])
        r_list.append(np.full(len(frames), i, np.int64))
        c_list.append(frames)
        centers[i] = float(np.median(frames)) * FRAME_SECONDS
    rr = np.concatenate(r_list)
    cc = np.concatenate(c_list)
    cover = sparse.csr_matrix(
        (np.ones(len(rr), np.float32), (rr, cc)), shape=(len(rows), len(mask))
    )
    return Windows(mel_index, cover, centers)


def _empty_windows(n_frames: int, per_window: int) -> Windows:
    return Windows(
        np.zeros((0, per_window), np.int64),
        sparse.csr_matrix((0, n_frames), dtype=np.float32),
        np.zeros(0, np.float32),
    )


def _runs(mask: BoolArray) -> list[tuple[int, int]]:
    """[start, end) index runs where mask is true."""
    if len(mask) == 0:
        return []
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def l2(x: FloatArray) -> FloatArray:
    out: FloatArray = (x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)).astype(
        np.float32
    )
    return out


def cluster(
    embeddings: FloatArray,
    settings: Settings,
    *,
    num_speakers: int | None = None,
    max_speakers: int | None = None,
) -> IntArray:
    """Cluster labels 0..K-1 for window embeddings (`settings.method`: spectral or AHC), then
    refined by centroid re-assignment; tiny clusters are folded into their nearest."""
    n = len(embeddings)
    if n == 0:
        return np.zeros(0, np.int64)
    if n == 1:
        return np.zeros(1, np.int64)
    cap = settings.max_speakers if max_speakers is None else max_speakers
    # long recordings: cluster block means of consecutive windows (the affinity matrix and its
    # eigen-decomposition grow as n² and n³), then give each window its nearest centroid
    points, block = embeddings, max(1, -(-n // settings.max_cluster_points))
    if block > 1:
        padded = np.concatenate([embeddings, embeddings[-1:].repeat(-n % block, axis=0)])
        points = l2(padded.reshape(-1, block, embeddings.shape[1]).mean(axis=1))
    if settings.method == "spectral":
        labels = spectral_labels(points, settings.prune, num_speakers, cap)
    else:
        labels = ahc_labels(points, settings.cluster_threshold, num_speakers, cap)
    if block > 1:
        labels = np.argmax(embeddings @ centroids(points, _relabel(labels)).T, axis=1)
    labels = _fold_small(
        embeddings, labels, settings.min_cluster_windows if num_speakers is None else 1
    )
    for _ in range(settings.refine_iterations):
        cents = centroids(embeddings, labels)
        new = np.argmax(embeddings @ cents.T, axis=1)
        if num_speakers is None:
            new = _fold_small(embeddings, new, settings.min_cluster_windows)
        new = _relabel(new)
        if np.array_equal(new, labels):
            break
        labels = new
    return _relabel(labels)


def ahc_labels(
    embeddings: FloatArray, threshold: float, num_speakers: int | None, cap: int
) -> IntArray:
    n = len(embeddings)
    tree = linkage(embeddings.astype(np.float64), method="average", metric="cosine")
    if num_speakers is not None:
        labels = fcluster(tree, t=min(num_speakers, n), criterion="maxclust")
    else:
        labels = fcluster(tree, t=threshold, criterion="distance")
        if labels.max() > cap:
            labels = fcluster(tree, t=cap, criterion="maxclust")
    return np.asarray(labels, np.int64) - 1


def spectral_labels(
    embeddings: FloatArray, prune: float, num_speakers: int | None, cap: int
) -> IntArray:
    """Spectral clustering of d-vectors as in Wang et al. 2018 (the GE2E diarization paper):
    cosine affinity, row-wise pruning, symmetrisation, diffusion, row-max normalisation; the
    number of speakers is the largest eigengap of the normalised Laplacian (at most `cap`)."""
    n = len(embeddings)
    if n <= 2:
        return np.zeros(n, np.int64)
    affinity = (embeddings @ embeddings.T).astype(np.float64)
    keep = max(1, int(np.ceil((1 - prune) * n)))
    nearest = np.argsort(-affinity, axis=1)[:, :keep]
    rows = np.arange(n)[:, None]
    y = np.zeros_like(affinity)
    y[rows, nearest] = affinity[rows, nearest]
    y = np.maximum(y, y.T)
    y = y @ y.T
    y = y / np.maximum(y.max(axis=1, keepdims=True), 1e-9)
    y = (y + y.T) / 2
    d = 1 / np.sqrt(np.maximum(y.sum(axis=1), 1e-9))
    laplacian = np.eye(n) - d[:, None] * y * d[None, :]
    values, vectors = np.linalg.eigh(laplacian)
    if num_speakers is not None:
        k = max(1, min(num_speakers, n))
    else:
        gaps = np.diff(values[: min(cap, n - 1) + 1])
        k = int(np.argmax(gaps)) + 1 if len(gaps) else 1
    if k == 1:
        return np.zeros(n, np.int64)
    u = vectors[:, :k]
    u = u / np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-9)
    return _kmeans(u, k)


def _kmeans(x: npt.NDArray[np.float64], k: int, restarts: int = 5) -> IntArray:
    """Deterministic k-means++ with a few restarts (seeded: same input, same speakers)."""
    best: tuple[float, IntArray] | None = None
    for seed in range(restarts):
        rng = np.random.default_rng(seed)
        centers = [x[rng.integers(len(x))]]
        for _ in range(1, k):
            dist = np.min([((x - c) ** 2).sum(axis=1) for c in centers], axis=0)
            total = dist.sum()
            probs = dist / total if total > 0 else np.full(len(x), 1 / len(x))
            centers.append(x[rng.choice(len(x), p=probs)])
        c = np.stack(centers)
        labels = np.zeros(len(x), np.int64)
        for _ in range(50):
            labels = np.argmin(((x[:, None, :] - c[None]) ** 2).sum(axis=2), axis=1)
            new = np.stack(
                [x[labels == j].mean(axis=0) if np.any(labels == j) else c[j] for j in range(k)]
            )
            if np.allclose(new, c):
                break
            c = new
        inertia = float(((x - c[labels]) ** 2).sum())
        if best is None or inertia < best[0]:
            best = (inertia, labels)
    assert best is not None
    return best[1]


def centroids(embeddings: FloatArray, labels: IntArray) -> FloatArray:
    k = int(labels.max()) + 1 if len(labels) else 0
    cents = np.zeros((k, embeddings.shape[1]), np.float32)
    for j in range(k):
        members = embeddings[labels == j]
        if len(members):
            cents[j] = members.mean(axis=0)
    return l2(cents)


def _fold_small(embeddings: FloatArray, labels: IntArray, min_windows: int) -> IntArray:
    labels = _relabel(labels)
    counts = np.bincount(labels)
    big = np.flatnonzero(counts >= min_windows)
    if len(big) == 0 or len(big) == len(counts):
        return labels
    cents = centroids(embeddings, labels)[big]
    out = labels.copy()
    for j in np.flatnonzero(counts < min_windows):
        members = labels == j
        out[members] = big[np.argmax(embeddings[members] @ cents.T, axis=1)]
    return _relabel(out)


def _relabel(labels: IntArray) -> IntArray:
    """Labels renumbered 0..K-1 in order of first appearance."""
    mapping: dict[int, int] = {}
    out = np.empty(len(labels), np.int64)
    for i, lab in enumerate(labels):
        out[i] = mapping.setdefault(int(lab), len(mapping))
    return out


def frame_scores(windows: Windows, embeddings: FloatArray, cents: FloatArray) -> FloatArray:
    """(frames × speakers): mean cosine similarity to each centroid of the windows covering a
    frame; frames no window covers score NaN."""
    sims = (embeddings @ cents.T).astype(np.float32)  # windows × K
    total = np.asarray(windows.cover.T @ sims, np.float32)
    count = np.asarray(windows.cover.sum(axis=0), np.float32).reshape(-1, 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out: FloatArray = np.where(count > 0, total / np.maximum(count, 1), np.nan).astype(
            np.float32
        )
    return out


def viterbi(scores: FloatArray, penalty: float) -> IntArray:
    """Best speaker path through frames (rows) with `penalty` per speaker switch."""
    n, k = scores.shape
    if n == 0:
        return np.zeros(0, np.int64)
    back = np.zeros((n, k), np.int64)
    acc = scores[0].astype(np.float64)
    for t in range(1, n):
        best_prev = int(np.argmax(acc))
        stay = acc
        switch = acc[best_prev] - penalty
        use_switch = switch > stay
        back[t] = np.where(use_switch, best_prev, np.arange(k))
        acc = np.maximum(stay, switch) + scores[t]
    path = np.empty(n, np.int64)
    path[-1] = int(np.argmax(acc))
    for t in range(n - 1, 0, -1):
        path[t - 1] = back[t, path[t]]
    return path


def decode(mask: BoolArray, scores: FloatArray, settings: Settings) -> tuple[IntArray, IntArray]:
    """Per frame: main speaker (−1 = silence) and second speaker for overlap (−1 = none)."""
    main = np.full(len(mask), -1, np.int64)
    second = np.full(len(mask), -1, np.int64)
    if scores.shape[1] == 0:
        return main, second
    filled = np.where(np.isnan(scores), -1.0, scores).astype(np.float32)
    for a, b in _runs(mask):
        seg = filled[a:b]
        main[a:b] = viterbi(seg, settings.switch_penalty)
        if settings.overlap_margin > 0 and scores.shape[1] > 1:
            order = np.argsort(-seg, axis=1)
            top = seg[np.arange(b - a), main[a:b]]
            alt = np.where(order[:, 0] == main[a:b], order[:, 1], order[:, 0])
            alt_score = seg[np.arange(b - a), alt]
            near = (alt_score >= top - settings.overlap_margin) & (
                alt_score >= settings.overlap_min_score
            )
            second[a:b] = np.where(near, alt, -1)
        if settings.change_overlap > 0:
            reach = max(1, round(settings.change_overlap / FRAME_SECONDS))
            changes = np.flatnonzero(np.diff(main[a:b]) != 0) + a + 1
            for c in (int(x) for x in changes):
                before, after = main[c - 1], main[c]
                lo, hi = max(a, c - reach), min(b, c + reach)
                for t in range(lo, c):
                    if second[t] < 0 and main[t] != after:
                        second[t] = after
                for t in range(c, hi):
                    if second[t] < 0 and main[t] != before:
                        second[t] = before
    return main, second


def to_segments(
    main: IntArray, second: IntArray, names: list[str], *, min_duration: float = 0.0
) -> list[SpeakerSegment]:
    """Frame labels → segments (frame k spans [k, k+1) × 32 ms); a speaker is active where it is
    the main or the second speaker, so an overlap does not cut its runs into pieces."""
    segments: list[SpeakerSegment] = []
    for k, name in enumerate(names):
        for a, b in _runs((main == k) | (second == k)):
            start, end = a * FRAME_SECONDS, b * FRAME_SECONDS
            if end - start >= min_duration:
                segments.append(SpeakerSegment(round(start, 3), round(end, 3), name))
    return segments
