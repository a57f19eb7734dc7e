"""How fast this machine is at the moment: a fixed piece of the batch pipeline's model work, timed.

The shared 2-core machine's speed drifts by a third from hour to hour (docs/benchmarks.md,
"Cheaper batch embeddings": the same code at 0.062 and at 0.089 CPU-s per audio second on one
day), so a real-time factor alone says little about a change made between two sessions. A bench
that times model work also times this probe, before and after its run: figures from two runs
compare in units of their probes, and side-by-side runs need none.
"""

from __future__ import annotations

import time

import numpy as np

from diarization.models import CHUNK_SAMPLES, default_segmentation_model
from voice.embedding import default_embedding_model

PROBE_SEED = 20261207
PROBE_WINDOWS = 4
"""One segmentation batch of 10 s windows (the batch pipeline's block) …"""
PROBE_EMBEDDINGS = 4
"""… and as many embeddings of 2.5 s slices of their features: the pipeline's mix, about."""


def speed_probe(repeats: int = 3) -> float:
    """CPU seconds (`time.process_time`) of the fixed work (seeded noise, so the same numbers
    every time) on the default segmentation-3.0 and CAM++ models, one thread each, whatever the
    bench itself runs: the fastest of `repeats` runs after one untimed warm-up."""
    segmentation, embedding = default_segmentation_model(), default_embedding_model()
    rng = np.random.default_rng(PROBE_SEED)
    windows = (0.05 * rng.standard_normal((PROBE_WINDOWS, CHUNK_SAMPLES))).astype(np.float32)
    features = embedding.features(windows[0])
    step = len(features) // PROBE_EMBEDDINGS
    slices = [features[k * step : (k + 1) * step] for k in range(PROBE_EMBEDDINGS)]

    def work() -> None:
        segmentation.segment(windows)
        embedding.embed_features(slices)

    work()
    best = float("inf")
    for _ in range(max(1, repeats)):
        began = time.process_time()
        work()
        best = min(best, time.process_time() - began)
    return best


__all__ = ["speed_probe"]
