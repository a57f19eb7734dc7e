"""No invented words (issue 23, item 5): 60 s of room noise with clicks and coughs (made here,
seed fixed) gives zero words from Whisper itself, from the live path and from `chorus
transcribe`; nor do pieces too short or too quiet to hold a word."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from tests.voice_helpers import turns_of, voice_room
from voice.audio import write_wav
from voice.channel import VoiceChannel
from voice.stt.whisper import WhisperSTT
from voice.testing.noise import room_noise

pytestmark = pytest.mark.slow

RATE = 16000


@pytest.fixture(scope="module")
def whisper() -> WhisperSTT:
    stt = WhisperSTT()
    stt.model()
    return stt


@pytest.fixture(scope="module")
def noise() -> np.ndarray:
    return room_noise(60.0, RATE, seed=23)


def test_whisper_hears_no_words_in_any_4_s_piece_of_room_noise(
    whisper: WhisperSTT, noise: np.ndarray
) -> None:
    """Past the VAD (a louder cough can open an utterance): Whisper alone made up "Thank you so
    much for watching" on five of these fifteen pieces before the checks."""
    pieces = [noise[i : i + 4 * RATE] for i in range(0, len(noise), 4 * RATE)]
    said = [w.text for i, piece in enumerate(pieces) for w in whisper.transcribe(piece, 4.0 * i)]
    assert said == []


async def test_the_live_path_commits_no_turn_for_room_noise(
    whisper: WhisperSTT, noise: np.ndarray
) -> None:
    channel = VoiceChannel(stt=whisper)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic-1", sample_rate=RATE)
    assert await turns_of(session, noise, RATE) == []
    await kit.close()


@pytest.mark.parametrize("decoding", ["batch", "pieces"])
def test_chorus_transcribe_prints_no_turn_for_room_noise(
    decoding: str, noise: np.ndarray, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wav = tmp_path / "room.wav"
    write_wav(wav, noise, RATE)
    argv = ["transcribe", str(wav), "--no-progress", "--format", "json", "--decoding", decoding]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == "[]"


def test_a_piece_too_short_or_too_quiet_is_not_decoded(whisper: WhisperSTT) -> None:
    rng = np.random.default_rng(5)
    short = (0.05 * rng.standard_normal(int(0.22 * RATE))).astype(np.float32)
    quiet = (1e-4 * rng.standard_normal(2 * RATE)).astype(np.float32)
    assert whisper.transcribe(short, 0.0) == () and whisper.transcribe(quiet, 0.0) == ()


def test_no_thank_you_for_the_short_pieces_of_an_ami_meeting(
    shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 23 as a new user saw it: trn03 printed `Speaker B: "Thank you very much"` twice,
    for 0.18 s pieces cut at voice changes where nobody said it."""
    wav = shared_fixtures / "ami" / "trn03.wav"
    assert main(["transcribe", str(wav), "--pipeline-speakers", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "thank you" not in out.lower() and "crashes at the moment" in out
