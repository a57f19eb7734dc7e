"""Enrollment with CAM++ voiceprints, end to end (issue 9, item 4; rule V8): a voice enrolled from
a clip is named on its first committed turn, through a `VoiceChannel` with the embedded stage
live, and `chorus serve` enrolls the clips its config names on every stream's stage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from diarization import enroll_voices, parse_enrollments
from diarization.embedded import EmbeddedStage
from tests.voice_helpers import voice_room
from voice.audio import read_audio_16k
from voice.channel import VoiceChannel
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord

RATE = 16000
# pyannote sample (sample.rttm): speaker90 alone 10.6–14.5 s and 18.6–21.5 s; speaker91 alone
# 14.7–17.9 s and 22–27.8 s. Alice (speaker90) is enrolled from her LATER stretch, so the first
# turn that must carry her name is audio the enrollment never saw.
ALICE_CLIP = (18.7, 21.4)


@pytest.fixture(scope="module")
def sample(shared_fixtures: Path) -> np.ndarray:
    return read_audio_16k(shared_fixtures / "pyannote-sample" / "sample.wav")


def words() -> ScriptedWords:
    return ScriptedWords([
        [SpokenWord("we", 11.2, 11.6, 0, "We"), SpokenWord("start", 11.8, 12.4, 0, "start"),
         SpokenWord("now", 12.6, 13.4, 0, "now.")],
        [SpokenWord("fine", 15.2, 15.8, 0, "Fine"), SpokenWord("by", 16.0, 16.4, 0, "by"),
         SpokenWord("me", 16.6, 17.2, 0, "me.")],
        [SpokenWord("good", 23.0, 23.6, 0, "Good.")],
    ])


async def test_V8_an_enrolled_name_reaches_the_first_committed_turn(sample: np.ndarray) -> None:
    stage = EmbeddedStage()
    async with DeepgramTestServer(words()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage)
        channel.enroll("Alice", sample[int(ALICE_CLIP[0] * RATE) : int(ALICE_CLIP[1] * RATE)])
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        session.push_audio(sample)
        await session.finish()
        await kit.drain()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [
        ("Alice", "We start now."),
        ("Speaker A", "Fine by me."),
        ("Speaker A", "Good."),
    ]


def test_enroll_arguments_are_checked(tmp_path: Path, sample: np.ndarray) -> None:
    clip = tmp_path / "alice.wav"
    sf.write(clip, sample[: 3 * RATE], RATE)
    assert parse_enrollments([f"Alice={clip}"]) == {"Alice": clip}
    with pytest.raises(ValueError, match=r"NAME=clip\.wav"):
        parse_enrollments(["Alice"])
    with pytest.raises(ValueError, match="no such file"):
        parse_enrollments([f"Bob={tmp_path / 'missing.wav'}"])
    with pytest.raises(ValueError, match="twice"):
        parse_enrollments([f"Alice={clip}", f"Alice={clip}"])
    with pytest.raises(ValueError, match="'Quiet'"):
        enroll_voices(EmbeddedStage(), {"Quiet": np.zeros(3 * RATE, np.float32)})


async def test_serve_enrolls_the_configured_voices_on_every_stream(
    tmp_path: Path, sample: np.ndarray
) -> None:
    from server.config import ConfigError, ServerConfig
    from server.pipeline import build_pipeline

    clip = tmp_path / "alice.wav"
    sf.write(clip, sample[int(ALICE_CLIP[0] * RATE) : int(ALICE_CLIP[1] * RATE)], RATE)
    base = {"stt": {"provider": "deepgram", "deepgram_url": "ws://127.0.0.1:9",
                    "deepgram_api_key": "k"}, "realtime": {"provider": "none"}}
    config = ServerConfig.model_validate({**base, "diarizer": {"enroll": {"Alice": str(clip)}}})
    pipeline = await build_pipeline(config)
    try:
        first, second = await pipeline._new_stage(), await pipeline._new_stage()
        for stage in (first, second):
            assert isinstance(stage, EmbeddedStage)
            assert list(stage.enrolled) == ["Alice"]
            assert stage.live_speakers == ["Alice"]
    finally:
        await pipeline.close()
    missing = ServerConfig.model_validate(
        {**base, "diarizer": {"enroll": {"Bob": str(tmp_path / "nope.wav")}}}
    )
    with pytest.raises(ConfigError, match=r"diarizer\.enroll\.Bob"):
        await build_pipeline(missing)
