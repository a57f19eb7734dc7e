"""`bench voices --replay` (bench.window_tape): a recording's model results recorded on its first
run and played back on the later ones give the live stage exactly what the models would, whatever
its anchors; a run that asks for something else is refused. Scripted models, no weights."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pytest

from bench.window_tape import TapeMismatch, WindowTape
from diarization.live import (
    FRAME_SAMPLES,
    Activity,
    LiveDiarizer,
    LiveSettings,
    ModelService,
    WindowJob,
    WindowResult,
)
from voice.diarization_stage import SpeakerTimeline

RATE = 16000


def _unit(k: int) -> np.ndarray:
    v = np.zeros(192, np.float32)
    v[k] = 1.0
    return v


class AmplitudeVoices(ModelService):
    """Scripted models: a frame whose sample is 0.1 is voice X (local 0), 0.2 voice Y (local 1);
    X and Y are orthogonal prints. Counts the windows it answers."""

    def __init__(self) -> None:
        super().__init__(models=None)
        self.windows = 0

    def analyse(self, jobs: Sequence[WindowJob], previous: Activity | None = None,
                since_embedding: int = 0,
                abandoned: threading.Event | None = None) -> list[WindowResult]:
        out = []
        for job in jobs:
            self.windows += 1
            frames = round(job.audio.size / FRAME_SAMPLES)
            level = job.audio[np.arange(frames) * FRAME_SAMPLES]
            activity = np.zeros((frames, 3), np.uint8)
            activity[np.isclose(level, 0.1), 0] = 1
            activity[np.isclose(level, 0.2), 1] = 1
            embeddings = np.full((3, 192), np.nan, np.float32)
            for local, k in ((0, 0), (1, 1)):
                if activity[:, local].any():
                    embeddings[local] = _unit(k)
            out.append(WindowResult(activity, embeddings))
        return out

    @property
    def model_id(self) -> str:
        return "scripted"


def _meeting() -> np.ndarray:
    return np.concatenate([np.full(3 * RATE, 0.1, np.float32), np.full(3 * RATE, 0.2, np.float32),
                           np.full(2 * RATE, 0.1, np.float32)])


def _run(service: ModelService, audio: np.ndarray, anchors: dict[str, np.ndarray],
         tape_key: str | None = None) -> tuple[SpeakerTimeline, dict[str, float]]:
    if tape_key is not None:
        assert isinstance(service, WindowTape)
        service.start(tape_key)
    stage = LiveDiarizer(service, LiveSettings(embed_every=1))
    stage.anchor(anchors)
    stage.reset()
    for k in range(0, len(audio), RATE // 2):
        stage.feed(audio[k : k + RATE // 2])
    timeline = stage.flush()
    return timeline, stage.speaker_prints().speech_s


def test_a_played_back_run_is_the_run_the_models_would_give_whatever_the_anchors() -> None:
    audio = _meeting()
    models = AmplitudeVoices()
    tape = WindowTape(models)
    directories = [{}, {"y": _unit(1)}, {"x": _unit(0), "y": _unit(1), "z": _unit(2)}]
    first = _run(tape, audio, directories[0], "m")
    recorded = models.windows
    assert recorded > 0 and tape.played == 0
    for anchors in directories:
        played = _run(tape, audio, anchors, "m")
        direct = _run(AmplitudeVoices(), audio, anchors)
        assert played[0].segments == direct[0].segments and played[1] == direct[1]
    assert models.windows == recorded  # the models ran for the first run only
    assert tape.played > 0
    assert [s.speaker for s in first[0]] == ["Speaker A", "Speaker B", "Speaker A"]
    # the anchor never heard (z) takes no letter, played back as live
    assert sorted(_run(tape, audio, directories[2], "m")[1]) == ["Speaker A", "Speaker B"]


def test_a_run_that_asks_for_other_audio_is_refused() -> None:
    tape = WindowTape(AmplitudeVoices())
    _run(tape, _meeting(), {}, "m")
    other = _meeting()
    other[4 * RATE :] = 0.1
    with pytest.raises(TapeMismatch):
        _run(tape, other, {}, "m")
    with pytest.raises(TapeMismatch):
        LiveDiarizer(WindowTape(AmplitudeVoices())).feed(np.zeros(RATE, np.float32))
