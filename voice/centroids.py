"""Unit-length speaker embeddings and running speaker centroids: the one home of their numerics.

Every path that compares voices (the batch clustering, the live stage, the pyannote stage,
enrollment, reconnect labels in `voice.speakers`) L2-normalises embeddings and keeps per-speaker
centroids. Before this module each did it itself: six normalisations with three epsilons and two
identical centroid classes. Now `l2_normalize` scales to unit length with one epsilon (`L2_EPS`),
`unit_or_none` is the guarded form for one vector that may be unusable (NaN, or zero), and
`SpeakerCentroid` is the running sum whose direction is the speaker's mean voice.

Numpy only (no torch, unlike `voice.embedding`), so `voice.speakers` and the server import it
without loading a model runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

L2_EPS = 1e-8
"""Norms below this are a zero vector: no real embedding comes near (CAM++'s and WeSpeaker's
embeddings have norms of order 10, and a centroid is a sum of unit vectors of one voice)."""


def l2_normalize(x: npt.ArrayLike, axis: int = -1) -> FloatArray:
    """`x` (float32) scaled to unit L2 norm: one vector, or every vector along `axis` of an
    array (the rows, by default). A vector whose norm is under `L2_EPS` (a zero vector) is
    divided by `L2_EPS` instead, so a zero vector stays zero; a vector holding NaN stays NaN."""
    values = np.asarray(x, dtype=np.float32)
    # one vector: numpy's whole-vector norm (a dot product), as the live and pyannote paths
    # always took it, so their voiceprints and centroids keep every bit
    norm = (
        np.linalg.norm(values)
        if values.ndim == 1
        else np.linalg.norm(values, axis=axis, keepdims=True)
    )
    out: FloatArray = (values / np.maximum(norm, L2_EPS)).astype(np.float32)
    return out


def unit_or_none(vector: npt.ArrayLike) -> FloatArray | None:
    """`vector` (flattened to one dimension, float32) at unit length, or None where it is no
    usable direction: it holds NaN or infinity, or its norm is under `L2_EPS`."""
    values = np.asarray(vector, dtype=np.float32).reshape(-1)
    if not np.all(np.isfinite(values)) or float(np.linalg.norm(values)) < L2_EPS:
        return None
    return l2_normalize(values)


@dataclass
class SpeakerCentroid:
    """A speaker of one session's clustering: its name, whether its voice is enrolled, and the
    running sum of the embeddings assigned to it. The sum's direction is the mean's: `centroid`
    is that mean at unit length (None before any embedding, or when the sum is no direction)."""

    name: str
    total: FloatArray | None = None
    enrolled: bool = False

    @property
    def centroid(self) -> FloatArray | None:
        return None if self.total is None else unit_or_none(self.total)

    def add(self, embedding: npt.NDArray[Any] | None) -> None:
        """Add one embedding to the sum (None, an embedding that was not computed, adds nothing)."""
        if embedding is None:
            return
        vector = np.asarray(embedding, dtype=np.float32)
        self.total = vector.copy() if self.total is None else self.total + vector
