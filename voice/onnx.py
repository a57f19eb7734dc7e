"""The one place an onnxruntime CPU session is made (`onnx_session`), for every model of the
voice and diarization stages: the VAD, the embeddings, segmentation. No torch here, so the
barge-in rule's VAD (`voice.vad`) loads without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def onnx_session(model: str | Path | bytes, threads: int = 1, *, cpu_arena: bool = False) -> Any:
    """An onnxruntime CPU session with explicit threads (intra-op `threads`, inter-op 1, no
    spinning: the machine is shared with the event loop and other streams).

    `cpu_arena` (default False): onnxruntime's CPU memory arena. The arena never gives memory
    back: it keeps, for the life of the session, the largest working set any one call needed
    (about 25 MB per 10 s window of a segmentation batch), so a server whose batches grow under
    load (a stream that fell behind sends many windows at once) held ever more of it; the
    10-minute soak grew 33 MiB a minute. Without the arena each call's tensors come from malloc
    and are freed when the call returns; the CPU cost is within noise (docs/benchmarks.md,
    "Soak")."""
    import onnxruntime as ort  # type: ignore[import-untyped]

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    options.enable_cpu_mem_arena = cpu_arena
    source = model if isinstance(model, bytes) else str(model)
    return ort.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])
