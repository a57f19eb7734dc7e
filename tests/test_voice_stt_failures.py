"""STT failures other than a clean drop (issue 25.7): a refusal is final and told, a provider that
goes quiet is a drop found in bounded time, a connect that never completes is a failed attempt,
and audio the stream could not transcribe when it ended is counted (rule S2: reconnect with the
unsent audio carried over; V10: never a hang).

Real parts: the deepgram-sdk client against the local Deepgram-protocol server
(`voice.testing.deepgram_server`), told to answer 401, to go quiet, or to hold handshakes."""

from __future__ import annotations

import asyncio
from http import HTTPStatus

import pytest

from rooms.retry import Backoff
from server.testing.harness import eventually
from tests.test_voice_stt_outage import StatusLog
from tests.voice_helpers import voice_room
from voice.channel import VoiceChannel
from voice.stt.base import (
    AudioLost,
    SttBounds,
    SttDegraded,
    SttRecovered,
    SttRefused,
    SttRefusedError,
)
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer

KEY = "dg-secret-key-0123456789"
SILENCE = b"\0\0" * 1600
"""0.1 s of PCM16 at 16 kHz."""


async def test_S2_a_401_on_reconnect_is_final_told_once_and_never_retried() -> None:
    status = StatusLog()
    async with DeepgramTestServer() as server:
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), on_status=status)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        session.stt.backoff = Backoff(first=0.01, longest=0.02)  # a retry would come at once
        session.push(SILENCE)
        await eventually(lambda: server.connections and server.connections[0].audio, 30, "audio")
        server.refuse_handshakes(HTTPStatus.UNAUTHORIZED)  # the key was revoked
        server.drop_now()
        await status.wait_for(SttRefused, 1, within=30.0)
        await eventually(lambda: session.stt.ended, 30, "the stream to stop trying")
        session.push(SILENCE)
        await session.finish()
    assert [type(e) for e in status.events][:2] == [SttDegraded, SttRefused]
    refused = status.of(SttRefused)[0]
    assert isinstance(refused, SttRefused) and "HTTP 401" in refused.reason
    assert KEY not in refused.reason and "Authorization" not in refused.reason
    assert server.refused == 1  # one handshake refused, never tried again
    assert session.error is not None and "HTTP 401" in session.error


async def test_S2_a_403_on_the_first_connect_fails_start_at_once_with_a_refusal() -> None:
    status = StatusLog()
    async with DeepgramTestServer() as server:
        server.refuse_handshakes(HTTPStatus.FORBIDDEN)
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), on_status=status)
        await voice_room(channel)
        with pytest.raises(SttRefusedError, match="HTTP 403") as caught:
            await channel.start_session("room", "mic-1")
    assert KEY not in str(caught.value)
    assert server.refused == 1  # not the five attempts a service that cannot be reached gets
    assert [type(e) for e in status.events] == [SttRefused]


SHORT = SttBounds(connect=0.5, start=1.5, silence=0.5, close=0.5)
"""Short bounds, so a test waits on events, not on the defaults."""


async def test_S2_a_provider_that_accepts_and_never_answers_is_a_drop_found_in_bounded_time() -> None:
    status = StatusLog()
    async with DeepgramTestServer() as server:
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), on_status=status,
                               stt_bounds=SHORT)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        server.go_silent()
        session.push(SILENCE)
        await status.wait_for(SttDegraded, 1, within=30.0)
        server.go_silent(False)
        await status.wait_for(SttRecovered, 1, within=30.0)
        await session.finish()
    degraded = status.of(SttDegraded)[0]
    assert isinstance(degraded, SttDegraded) and "no answer from the provider" in degraded.reason
    assert len(server.connections) >= 2


async def test_S2_stop_ends_in_bounded_time_when_the_provider_never_answers() -> None:
    """Before issue 25.7 the flush waited 30 s for Finalize, `aclose` flushed again (30 s) and
    then waited 10 s more for the connection to end: 70 s."""
    async with DeepgramTestServer() as server:
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), stt_bounds=SHORT)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        server.go_silent()  # takes audio and Finalize and CloseStream, answers nothing
        session.push(SILENCE)
        async with asyncio.timeout(20):  # far above the bounds, far below the old 70 s
            await session.finish()
    assert session.finished


async def test_S2_a_handshake_that_never_completes_fails_start_within_the_start_bound() -> None:
    async with DeepgramTestServer() as server:
        server.hold_handshakes()  # TCP accepted, the websocket upgrade never answered
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), stt_bounds=SHORT)
        await voice_room(channel)
        async with asyncio.timeout(20):  # far above the 1.5 s start bound
            with pytest.raises(ConnectionError, match="did not complete"):
                await channel.start_session("room", "mic-1")
    assert server.held >= 1


async def test_S2_audio_the_stt_never_took_because_it_was_down_at_the_end_is_counted_and_told() -> None:
    """Before issue 25.7 an STT still down when the stream ended lost that audio silently."""
    status = StatusLog()
    async with DeepgramTestServer() as server:
        channel = VoiceChannel(stt=DeepgramSTT(KEY, url=server.url), on_status=status,
                               stt_bounds=SHORT)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        server.outage(600.0)  # down for the rest of the stream
        await status.wait_for(SttDegraded, 1, within=30.0)
        for _ in range(20):
            session.push(SILENCE)  # 2 s the STT never hears
        await session.finish()
    lost = status.of(AudioLost)
    assert len(lost) == 1 and isinstance(lost[0], AudioLost)
    assert lost[0].end == pytest.approx(2.0) and lost[0].seconds >= 2.0 - 1e-6
    assert session.stt.lost_seconds == pytest.approx(lost[0].seconds)
