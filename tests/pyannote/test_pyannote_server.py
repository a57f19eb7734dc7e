"""The server's pyannote stage shares one loaded pipeline across its pooled streams (issue 10.9b).

`chorus serve` gives every shared-mic stream a voice channel with a live stage of its own; with
`[diarizer] kind = "pyannote"` each of those stages used to load the whole pipeline again (one
copy of the models per concurrent stream). Now the first stage loads it and every later stage
wraps the same pipeline object (PyannoteStage serialises calls into it).
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("CHORUS_PYANNOTE_ENV") != "1":
    pytest.importorskip(
        "pyannote.audio",
        reason="pyannote.audio is not in this environment; `make test-pyannote` runs these tests "
        "in the pyannote env (docs/pyannote.md)",
    )

import asyncio
import threading
from pathlib import Path

from diarization.pyannote_stage import PyannoteStage
from server.config import ServerConfig
from server.pipeline import VoicePipeline, stt_provider


async def test_pooled_pyannote_stages_share_one_pipeline(pyannote_pipeline_dir: Path) -> None:
    config = ServerConfig.model_validate(
        {
            "diarizer": {"kind": "pyannote", "pipeline": str(pyannote_pipeline_dir)},
            "realtime": {"provider": "none"},
        }
    )
    pipeline = VoicePipeline(config, stt_provider(config))
    # Three streams at once (two in one room, so the pool cannot reuse a stage), opened
    # concurrently: exactly one pipeline is loaded, and every stage is a stage of its own.
    stages = await asyncio.gather(
        pipeline._stage_for("r1"),
        pipeline._stage_for("r1"),
        pipeline._stage_for("r2"),
    )
    assert all(isinstance(s, PyannoteStage) for s in stages)
    assert len({id(s) for s in stages}) == 3
    pipelines = {id(s.pipeline) for s in stages if isinstance(s, PyannoteStage)}
    assert len(pipelines) == 1
    shared = stages[0]
    assert isinstance(shared, PyannoteStage)
    assert shared.source.kind == "local"  # the first stage loaded it from the directory
    await pipeline.close()


async def test_the_server_runs_the_stage_on_torch_threads_of_its_config(
    pyannote_pipeline_dir: Path,
) -> None:
    """`[diarizer] torch_threads` (default 1) is what torch runs the stage on (docs/pyannote.md,
    *Threads*); the setting is the process's, so the test puts it back."""
    import torch

    before = torch.get_num_threads()
    try:
        for threads, expected in ((2, 2), (None, 1)):
            diarizer: dict[str, object] = {"kind": "pyannote", "pipeline": str(pyannote_pipeline_dir)}
            if threads is not None:
                diarizer["torch_threads"] = threads
            config = ServerConfig.model_validate(
                {"diarizer": diarizer, "realtime": {"provider": "none"}}
            )
            pipeline = VoicePipeline(config, stt_provider(config))
            stage = await pipeline._stage_for("r1")
            assert isinstance(stage, PyannoteStage) and stage.device == "cpu"
            # torch keeps the number process-wide and each thread takes it up at its first
            # parallel op: a thread that has run none reads what the stage's model calls run on
            seen: list[int] = []
            reader = threading.Thread(target=lambda out=seen: out.append(torch.get_num_threads()))
            reader.start()
            reader.join()
            assert seen == [expected]
            await pipeline.close()
    finally:
        torch.set_num_threads(before)
