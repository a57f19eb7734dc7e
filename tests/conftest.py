"""Shared test helpers: where the fixtures live, the repo root, and the `server` fixture.

`server` is a real Chorus server on a free loopback port with its STT on the local
Deepgram-protocol server (`server.testing.harness.running_server_with_local_stt`): the server
tests that need nothing else share it. A module that needs a different server says so at its
top by overriding `server_config` (diarizer, realtime, policy, limits, STT options) or
`stt_words` (what the STT says), so every variation is written where it is used.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import httpx

    from server.testing.harness import RunningServer
    from voice.testing.deepgram_server import DeepgramTestServer, WordSource

REPO = Path(__file__).resolve().parents[1]
MEETING = REPO / "examples" / "meeting"
SHARED_FIXTURES = Path(
    os.environ.get("CHORUS_FIXTURES", str(REPO.parent / "shared" / "fixtures"))
)
os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "0")

# `chorus serve` keeps rooms in SQLite under the user's data directory by default; a test server
# (in-process or a subprocess, which inherits this) keeps them in memory unless the test names a
# store, so tests neither write to the user's data nor see rooms an earlier run left there.
os.environ.setdefault("CHORUS_STORE_URL", "memory://")

pytest_plugins = ["tests.store_fixtures"]  # new_store / new_kit: every store the rooms tests run on


class Clock:
    """A clock the test moves, for code that takes one (`clock=`): no sleeps, no wall time."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def meeting_speech(start: float, end: float, rate: int = 16000) -> bytes:
    """The demo meeting from `start` to `end` s, mono pcm16 at `rate`: real speech for the rules
    that listen for it (its first 0.6 s are quiet, then Alice talks until 4.2 s)."""
    from voice.audio import float_to_pcm16, read_audio_16k, resample

    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    return float_to_pcm16(resample(audio, 16000, rate))


def far_room(
    shared_fixtures: Path, rate: int = 8000
) -> tuple[Any, list[tuple[float, float]], list[tuple[float, float]]]:
    """A speakerphone's room: a LibriSpeech conversation's far render at `rate` (float), its
    turns (start, end) and its quiet, every stretch of a second or more nobody talks in, as
    `chorus bench barge_in_rule` scores it (`bench.barge_in_rule.moments`)."""
    import soundfile as sf

    from bench.barge_in_rule import moments
    from voice.audio import read_audio_16k, resample
    from voice.diarization_stage import SpeakerTimeline

    name = shared_fixtures / "librispeech-conversations" / "lsconv_dev04_4spk_far"
    audio = resample(read_audio_16k(name.with_suffix(".flac")), 16000, rate)
    spans = sorted((s.start, s.end) for s in SpeakerTimeline.read_rttm(name.with_suffix(".rttm")))
    _, quiet = moments(spans, float(sf.info(str(name.with_suffix(".flac"))).duration))
    return audio, spans, quiet


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {SHARED_FIXTURES} (set CHORUS_FIXTURES)")
    return SHARED_FIXTURES


@pytest.fixture
def server_config() -> dict[str, Any]:
    """The `server` fixture's configuration besides its STT: nothing, so no diarizer and no
    realtime session. Override it in a module that needs more."""
    return {}


@pytest.fixture
def stt_words() -> WordSource | None:
    """What the `server` fixture's STT says: the demo meeting's words, found in the audio it
    receives (so turns are exact and quick). Override it with `None` for an STT that says
    nothing."""
    from voice.testing.deepgram_server import MeetingWords

    return MeetingWords.from_meeting(MEETING)


@pytest.fixture
async def deepgram(stt_words: WordSource | None) -> AsyncIterator[DeepgramTestServer]:
    """A local Deepgram-protocol server saying `stt_words`, for a test that starts `chorus serve`
    as a process and points it here."""
    from voice.testing.deepgram_server import DeepgramTestServer

    async with DeepgramTestServer(stt_words) as running:
        yield running


@pytest.fixture
async def server(
    server_config: dict[str, Any], stt_words: WordSource | None
) -> AsyncIterator[RunningServer]:
    from server.testing.harness import running_server_with_local_stt

    async with running_server_with_local_stt(server_config, stt_words) as running:
        yield running


@pytest.fixture
async def http(server: RunningServer) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the `server` fixture's REST routes."""
    import httpx

    async with httpx.AsyncClient(base_url=server.http_base, timeout=30) as client:
        yield client
