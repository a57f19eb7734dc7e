"""VB-HMM clustering of an x-vector sequence in the style of VBx (Landini et al. 2022, "Bayesian
HMM clustering of x-vector sequences (VBx) in speaker diarization"), with the speaker model
estimated from the recording itself.

Why: centroid AHC decides once, from one embedding per window and local speaker, and never looks
at where in time a voice was heard. VBx refines an initial clustering with a hidden Markov model
over a regular sequence of x-vectors (here CAM++ embeddings of short windows within speech): each
speaker is a Gaussian whose mean has a prior (the between-speaker covariance), the x-vectors scatter
around it (the within-speaker covariance), the state stays with probability `loop` from one x-vector
to the next, and variational Bayes alternates the speakers' posterior means with the frames'
posteriors (forward-backward) and the speaker priors `pi`, which can empty a speaker that the
initial clustering invented.

VBx needs those two covariances. BUT's recipe takes them from a PLDA trained on thousands of
speakers; no such model exists for CAM++ here, so `estimate_model` takes them from the recording:
the within-speaker covariance from differences of x-vectors a window apart (`lag`) that the initial
clustering gives the same speaker (two x-vectors of one voice differ by twice the within-speaker
covariance; turn changes are left out by the labels), or from the scatter around the initial
clusters' means (`labels`: LDA on the initial clustering); the total covariance from all of them,
the between-speaker covariance as the difference. A generalised eigendecomposition makes the
within-speaker covariance the identity and the between-speaker one diagonal (`phi`), the form
VBx's updates take. The dimension is reduced by PCA first (a 30 s excerpt holds about fifty
x-vectors; 192 dimensions cannot be estimated from them).

What the numbers said (docs/benchmarks.md, 2026-12-06): on recordings of a few dozen x-vectors
the lagged estimate sees slow drift within a voice as between-speaker variance and VBx splits the
voice; the batch pipeline therefore blends the posteriors with the cosine to the centroids and
leaves short recordings alone (`diarization.batch.vbx_refine`), and keeps the step off.

Numpy and scipy only; deterministic (no random initialisation: the initial clustering's labels
seed the posteriors). The forward-backward pass is the scaled linear-domain one: with
transitions `loop · I + (1 − loop) · pi`, each step is O(speakers).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.linalg import eigh

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

EPS = 1e-10
INIT_SMOOTHING = 7.0
"""The initial posteriors: softmax of this times the initial labels' one-hot rows (as pyannote's
VBx clustering seeds them from AHC): confident, not certain."""
MIN_PAIRS_PER_DIM = 4
"""The PCA keeps at most (same-speaker pairs, or x-vectors less clusters) / this dimensions, so
the within-speaker covariance is estimated from several times as many samples as it has
dimensions."""
WITHIN_FROM = ("lag", "labels")


@dataclass(frozen=True)
class SpeakerModel:
    """A two-covariance model in VBx's form: `project(x)` has within-speaker covariance I and
    between-speaker covariance diag(`phi`)."""

    mean: FloatArray  # (input dim,)
    transform: FloatArray  # (input dim, dim)
    phi: FloatArray  # (dim,)

    def project(self, x: npt.ArrayLike) -> FloatArray:
        out: FloatArray = (np.asarray(x, np.float64) - self.mean) @ self.transform
        return out


@dataclass(frozen=True)
class VbxResult:
    """Per x-vector the speakers' posteriors (n, k), the speaker priors (k,) and the evidence
    lower bound after each iteration."""

    posteriors: FloatArray
    pi: FloatArray
    elbo: list[float]

    @property
    def labels(self) -> IntArray:
        out: IntArray = np.argmax(self.posteriors, axis=1).astype(np.int64)
        return out


def same_speaker_pairs(labels: IntArray, positions: IntArray, lag: int) -> IntArray:
    """Pairs (i, j) of x-vectors exactly `lag` steps apart (`positions` on the x-vector grid,
    ascending) with the same label: (pairs, 2)."""
    pos = np.asarray(positions, np.int64)
    j = np.searchsorted(pos, pos + lag)
    inside = j < len(pos)
    i = np.nonzero(inside)[0]
    j = j[inside]
    keep = (pos[j] == pos[i] + lag) & (labels[i] == labels[j])
    return np.stack([i[keep], j[keep]], axis=1).astype(np.int64)


def estimate_model(
    x: npt.ArrayLike,
    labels: IntArray,
    positions: IntArray,
    *,
    lag: int,
    dim: int,
    within_from: str = "lag",
) -> SpeakerModel | None:
    """The recording's own two-covariance model (module docstring), or None when it holds too
    few x-vectors to estimate one. `dim`: at most this many PCA dimensions. `within_from`:
    `lag`, the within-speaker covariance from same-label pairs `lag` apart (the between-speaker
    covariance then has full rank, and VBx may split a voice along what changes slowly in it);
    `labels`, from the scatter around each initial cluster's mean (the between-speaker covariance
    is then the clusters' scatter, of rank k − 1: LDA on the initial clustering, so VBx re-decides
    along the directions that separate the initial clusters)."""
    if within_from not in WITHIN_FROM:
        raise ValueError(f"within_from {within_from!r}: choose one of {', '.join(WITHIN_FROM)}")
    data = np.asarray(x, np.float64)
    n = len(data)
    if within_from == "lag":
        pairs = same_speaker_pairs(labels, positions, lag)
        p = min(dim, len(pairs) // MIN_PAIRS_PER_DIM, n - 1, data.shape[1])
    else:
        pairs = np.zeros((0, 2), np.int64)
        p = min(dim, (n - len(np.unique(labels))) // MIN_PAIRS_PER_DIM, n - 1, data.shape[1])
    if p < 1:
        return None
    mean = data.mean(axis=0)
    centred = data - mean
    _, _, vt = np.linalg.svd(centred, full_matrices=False)
    pca = vt[:p].T  # (input dim, p)
    y = centred @ pca
    total = y.T @ y / n
    if within_from == "lag":
        diff = y[pairs[:, 0]] - y[pairs[:, 1]]
        within = diff.T @ diff / (2 * len(pairs))
    else:
        means = np.zeros((int(labels.max()) + 1, p))
        np.add.at(means, labels, y)
        means /= np.maximum(np.bincount(labels, minlength=len(means)), 1)[:, None]
        residual = y - means[labels]
        within = residual.T @ residual / n
    within += np.eye(p) * (1e-6 * np.trace(within) / p + EPS)
    # generalised eigenproblem: Vᵀ W V = I, Vᵀ (T − W) V = diag(phi)
    phi, vectors = eigh(total - within, within)
    order = np.argsort(-phi, kind="stable")
    phi = np.maximum(np.asarray(phi, np.float64)[order], 1e-6)
    transform = pca @ np.asarray(vectors, np.float64)[:, order]
    return SpeakerModel(mean, transform, phi)


def initial_posteriors(labels: IntArray, k: int) -> FloatArray:
    """Softmax of `INIT_SMOOTHING` times the one-hot labels (n, k)."""
    logits = np.zeros((len(labels), k))
    logits[np.arange(len(labels)), labels] = INIT_SMOOTHING
    logits -= logits.max(axis=1, keepdims=True)
    q = np.exp(logits)
    out: FloatArray = q / q.sum(axis=1, keepdims=True)
    return out


def vbx(
    x: npt.ArrayLike,
    phi: npt.ArrayLike,
    q_init: FloatArray,
    *,
    loop: float = 0.9,
    fa: float = 0.3,
    fb: float = 17.0,
    max_iters: int = 20,
    tol: float = 1e-4,
) -> VbxResult:
    """VB-HMM over `x` (n, d: within-speaker covariance I, between diag(`phi`)) from the initial
    posteriors `q_init` (n, k). `loop`: the probability of staying with the speaker from one
    x-vector to the next (0: no HMM, a Bayesian mixture); `fa` scales the x-vectors' likelihoods
    (below 1: overlapping windows are not independent evidence); `fb` scales the speaker prior
    (larger: fewer, broader speakers). Stops when the lower bound gains less than `tol`."""
    data = np.asarray(x, np.float64)
    between = np.asarray(phi, np.float64)
    d = data.shape[1]
    q = np.asarray(q_init, np.float64).copy()
    k = q.shape[1]
    pi = np.full(k, 1.0 / k)
    constant = -0.5 * (np.sum(data**2, axis=1) + d * np.log(2 * np.pi))  # (n,)
    rho = data * np.sqrt(between)  # (n, d)
    elbo: list[float] = []
    for _ in range(max_iters):
        # the speakers' posterior means (alpha) and variances (inv_l), per dimension
        inv_l = 1.0 / (1.0 + fa / fb * q.sum(axis=0)[:, None] * between[None, :])  # (k, d)
        alpha = fa / fb * inv_l * (q.T @ rho)  # (k, d)
        log_p = fa * (
            rho @ alpha.T - 0.5 * ((inv_l + alpha**2) @ between)[None, :] + constant[:, None]
        )
        q, log_px, jumps = _forward_backward(log_p, pi, loop)
        pi = q[0] + jumps
        pi = pi / max(float(pi.sum()), EPS)
        bound = log_px + fb * 0.5 * float(np.sum(np.log(inv_l) - inv_l - alpha**2 + 1.0))
        elbo.append(bound)
        if len(elbo) > 1 and elbo[-1] - elbo[-2] < tol:
            break
    return VbxResult(q, pi, elbo)


def _forward_backward(
    log_p: FloatArray, pi: FloatArray, loop: float
) -> tuple[FloatArray, float, FloatArray]:
    """Posteriors (n, k), log p(X) and the expected number of jumps into each speaker, for the
    HMM with transitions loop · I + (1 − loop) · pi and initial distribution pi (scaled forward
    and backward passes in the linear domain)."""
    n, k = log_p.shape
    top = log_p.max(axis=1)
    lik = np.exp(log_p - top[:, None])
    fwd = np.empty((n, k))
    scale = np.empty(n)
    a = pi * lik[0]
    scale[0] = max(float(a.sum()), EPS)
    fwd[0] = a / scale[0]
    for t in range(1, n):
        a = (loop * fwd[t - 1] + (1.0 - loop) * pi) * lik[t]
        scale[t] = max(float(a.sum()), EPS)
        fwd[t] = a / scale[t]
    bwd = np.empty((n, k))
    bwd[-1] = 1.0
    for t in range(n - 2, -1, -1):
        b = lik[t + 1] * bwd[t + 1]
        bwd[t] = (loop * b + (1.0 - loop) * float(pi @ b)) / scale[t + 1]
    q = fwd * bwd
    q /= np.maximum(q.sum(axis=1, keepdims=True), EPS)
    if n > 1:
        jumps = (1.0 - loop) * pi * np.sum(lik[1:] * bwd[1:] / scale[1:, None], axis=0)
    else:
        jumps = np.zeros(k)
    log_px = float(np.sum(np.log(scale)) + np.sum(top))
    return q, log_px, jumps


def refine(
    x: npt.ArrayLike,
    labels: IntArray,
    positions: IntArray,
    *,
    k: int,
    lag: int,
    dim: int,
    loop: float,
    fa: float,
    fb: float,
    within_from: str = "lag",
    max_iters: int = 20,
) -> FloatArray | None:
    """VBx from an initial clustering: the posteriors (n, k) of the L2-normalised x-vectors `x`
    at `positions` (ascending, on the x-vector grid) given their initial `labels` (0 … k-1), the
    speaker model estimated from them (`estimate_model`). None when the recording holds too few
    x-vectors for a model."""
    data = np.asarray(x, np.float64)
    if len(data) < 2 or k < 2:
        return None
    model = estimate_model(data, labels, positions, lag=lag, dim=dim, within_from=within_from)
    if model is None:
        return None
    result = vbx(
        model.project(data),
        model.phi,
        initial_posteriors(labels, k),
        loop=loop,
        fa=fa,
        fb=fb,
        max_iters=max_iters,
    )
    return result.posteriors
