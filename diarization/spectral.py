"""Spectral clustering that counts its own speakers: NME-SC (Park et al. 2019, "Auto-Tuning
Spectral Clustering for Speaker Diarization Using Normalized Maximum Eigengap").

The batch pipeline's other method, centroid AHC, needs a distance threshold, and one threshold
does not serve close-talk and far-field recordings alike. NME-SC needs none: for each pruning
level p (keep each embedding's p most similar neighbours as 1, the rest 0; symmetrise), the
graph Laplacian's eigenvalues show how many well-separated groups there are (the largest gap
among the smallest eigenvalues), and the p whose graph separates best for the least pruning,
the smallest ratio (p / N) / g_p with g_p the largest gap normalised by the largest eigenvalue,
is the one used. The speaker count is that graph's eigengap position; the labels are k-means on
its first k eigenvectors (rows normalised).

Numpy and scipy only (`numpy.linalg.eigh`, `scipy.cluster.vq.kmeans2` with a fixed seed, so the
labels are deterministic). Google's `spectralcluster` package implements the same method but
brings scikit-learn and no types; the method is this page long.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.cluster.vq import kmeans2
from scipy.sparse.csgraph import connected_components

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

EPS = 1e-10
KMEANS_RESTARTS = 10
SEED = 0
MAX_SIZE = 400
"""Above this many embeddings (a recording of about a quarter of an hour and more), NME-SC runs
on this many of them, spread evenly, and the others join the nearest cluster: a full
eigendecomposition costs O(N³), and the search runs up to 30."""


@dataclass(frozen=True)
class SpectralResult:
    """Labels (0 … k-1), the pruning level chosen, the eigengap count and its normalised gap."""

    labels: IntArray
    p: int
    eigengap_count: int
    normalized_gap: float


def cosine_affinity(embeddings: npt.ArrayLike) -> FloatArray:
    """Cosine similarity between every pair of rows (a zero row is similar to nothing)."""
    x = np.asarray(embeddings, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = x / np.maximum(norms, EPS)
    out: FloatArray = np.clip(unit @ unit.T, -1.0, 1.0)
    return out


def pruned_graph(affinity: FloatArray, p: int) -> FloatArray:
    """Row-wise binarisation keeping each row's `p` largest entries (itself included, as the
    diagonal is the largest), then symmetrised as (A + Aᵀ) / 2."""
    n = len(affinity)
    order = np.argsort(-affinity, axis=1, kind="stable")[:, : max(1, min(p, n))]
    binary = np.zeros_like(affinity)
    np.put_along_axis(binary, order, 1.0, axis=1)
    out: FloatArray = 0.5 * (binary + binary.T)
    return out


def laplacian_spectrum(
    graph: FloatArray, smallest: int | None = None
) -> tuple[FloatArray, FloatArray]:
    """Eigenvalues (ascending) and eigenvectors of the unnormalised Laplacian D − A (self-loops
    dropped: they do not change D − A). With `smallest`, only that many of the smallest
    eigenpairs and, last, the largest eigenvalue (its vector is zero): all NME-SC reads."""
    a = graph.copy()
    np.fill_diagonal(a, 0.0)
    laplacian = np.diag(a.sum(axis=1)) - a
    n = len(laplacian)
    # numpy's eigh (LAPACK syevd): scipy 1.17's subset drivers (evr, evx) fail to converge on
    # these pruned 0/1 graphs, whose eigenvalues come in tight clusters
    values, vectors = np.linalg.eigh(laplacian)
    values, vectors = np.asarray(values, np.float64), np.asarray(vectors, np.float64)
    if smallest is None or smallest + 1 >= n:
        return values, vectors
    return (
        np.concatenate([values[:smallest], values[-1:]]),
        np.concatenate([vectors[:, :smallest], np.zeros((n, 1))], axis=1),
    )


def eigengap(values: FloatArray, max_speakers: int) -> tuple[int, float]:
    """The count k (1 … max_speakers) after which the eigenvalues jump most, and that jump
    over the largest eigenvalue."""
    gaps = np.diff(values)[: max(1, min(max_speakers, len(values) - 1))]
    k = int(np.argmax(gaps)) + 1
    return k, float(gaps[k - 1] / (values[-1] + EPS))


def pruning_levels(n: int, max_prune: float, volume: int, lowest: int = 1) -> list[int]:
    """Candidate p: `lowest` … floor(n · max_prune) (at least `lowest`), at most `volume` of
    them evenly."""
    top = max(lowest, int(np.floor(n * max_prune)))
    if top - lowest + 1 <= volume:
        return list(range(lowest, top + 1))
    return sorted({int(x) for x in np.rint(np.linspace(lowest, top, volume))})


def connecting_level(affinity: FloatArray) -> int:
    """The smallest p whose pruned graph is connected (below it the Laplacian has one zero
    eigenvalue per piece, and the eigengap counts pieces: the right count when each piece is one
    voice, noise when a voice falls apart)."""
    n = len(affinity)
    lo, hi = 1, n  # p = n is the complete graph
    while lo < hi:
        mid = (lo + hi) // 2
        pieces, _ = connected_components(pruned_graph(affinity, mid) > 0, directed=False)
        if pieces == 1:
            hi = mid
        else:
            lo = mid + 1
    return lo


def spectral_labels(vectors: FloatArray, k: int) -> IntArray:
    """k-means (k-means++ seeds, best of `KMEANS_RESTARTS`, fixed seed) on the first k
    eigenvectors, rows normalised to unit length."""
    n = len(vectors)
    if k <= 1 or n <= 1:
        return np.zeros(n, np.int64)
    if k >= n:
        return np.arange(n, dtype=np.int64)
    embedding = vectors[:, :k]
    embedding = embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), EPS)
    rng = np.random.default_rng(SEED)
    best: tuple[float, IntArray] | None = None
    for _ in range(KMEANS_RESTARTS):
        with warnings.catch_warnings():  # an empty cluster: that restart simply scores worse
            warnings.simplefilter("ignore")
            centres, labels = kmeans2(embedding, k, minit="++", seed=rng, missing="warn")
        inertia = float(((embedding - centres[labels]) ** 2).sum())
        if best is None or inertia < best[0] - 1e-12:
            best = (inertia, labels.astype(np.int64))
    assert best is not None
    _, found = np.unique(best[1], return_inverse=True)
    return found.astype(np.int64)


def nme_sc(
    embeddings: npt.ArrayLike,
    *,
    max_prune: float = 0.25,
    volume: int = 30,
    num_speakers: int | None = None,
    min_speakers: int = 1,
    max_speakers: int = 20,
    search: int = 8,
    cannot_link: npt.NDArray[np.bool_] | None = None,
    connected: bool = False,
) -> SpectralResult:
    """NME-SC labels of `embeddings` (N × d). `num_speakers` fixes k (p is still chosen by the
    ratio); otherwise the eigengap count among the `search` smallest eigenvalues (further up the
    spectrum the gaps say nothing of speakers), bounded to [min_speakers, max_speakers]. `cannot_link`
    (N × N, True where two embeddings are known to be different people, e.g. two local speakers
    of one window) zeroes their affinity before pruning. `connected`: only pruning levels whose
    graph is connected are tried (the smallest such when none under `max_prune` is). One
    embedding, or all identical: one speaker."""
    x = np.asarray(embeddings, dtype=np.float64)
    n = len(x)
    if n == 0:
        return SpectralResult(np.zeros(0, np.int64), 0, 0, 0.0)
    if n == 1 or np.allclose(x, x[0], atol=1e-6):
        k = 1 if num_speakers is None else min(num_speakers, n)
        return SpectralResult(spread(n, k), 1, 1, 0.0)
    if n > MAX_SIZE:
        return _reduced(
            x,
            max_prune=max_prune,
            volume=volume,
            num_speakers=num_speakers,
            min_speakers=min_speakers,
            max_speakers=max_speakers,
            search=search,
            connected=connected,
        )
    affinity = cosine_affinity(x)
    if cannot_link is not None:
        affinity = np.where(cannot_link, -1.0, affinity)
        np.fill_diagonal(affinity, 1.0)
    cap = max(1, min(max_speakers, n))
    width = max(1, min(max(search, min_speakers), n))
    best: tuple[float, int, int, float, FloatArray] | None = None
    lowest = connecting_level(affinity) if connected else 1
    for p in pruning_levels(n, max_prune, volume, lowest):
        values, vectors = laplacian_spectrum(
            pruned_graph(affinity, p), smallest=max(width, num_speakers or 0) + 1
        )
        k, gap = eigengap(values, width)
        ratio = (p / n) / (gap + EPS)
        if best is None or ratio < best[0]:
            best = (ratio, p, k, gap, vectors)
    assert best is not None
    _, p, counted, gap, vectors = best
    k = num_speakers if num_speakers is not None else int(np.clip(counted, min_speakers, cap))
    k = max(1, min(k, n))
    return SpectralResult(spectral_labels(vectors, k), p, counted, gap)


def _reduced(
    x: FloatArray,
    *,
    max_prune: float,
    volume: int,
    num_speakers: int | None,
    min_speakers: int,
    max_speakers: int,
    search: int,
    connected: bool,
) -> SpectralResult:
    """NME-SC over `MAX_SIZE` embeddings spread evenly through the recording; every other
    embedding joins the cluster whose centroid is most similar (a cannot-link between
    embeddings has no meaning there)."""
    unit = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), EPS)
    picked = np.unique(np.rint(np.linspace(0, len(x) - 1, MAX_SIZE)).astype(np.int64))
    inner = nme_sc(
        unit[picked],
        max_prune=max_prune,
        volume=volume,
        num_speakers=num_speakers,
        min_speakers=min_speakers,
        max_speakers=max_speakers,
        search=search,
        connected=connected,
    )
    k = int(inner.labels.max()) + 1
    centroids = np.stack([unit[picked][inner.labels == c].mean(axis=0) for c in range(k)])
    labels = np.argmax(unit @ centroids.T, axis=1).astype(np.int64)
    labels[picked] = inner.labels
    _, labels = np.unique(labels, return_inverse=True)
    return SpectralResult(
        labels.astype(np.int64), inner.p, inner.eigengap_count, inner.normalized_gap
    )


def spread(n: int, k: int) -> IntArray:
    """n labels over k clusters (identical embeddings asked to be k speakers: split in order)."""
    return (np.arange(n, dtype=np.int64) * k // max(n, 1)).astype(np.int64)
