"""Limits under the ASGI server (issue 10 items 2, 4, 5): a stream is read no faster than its
rate cap (TCP holds the flooding client back, nobody else), tiny frames are coalesced, a client
that stays over the cap is refused clearly, Twilio legs get one authentication deadline and a cap
on unauthenticated sockets, and shutdown drains: last turns flushed and sent, then 4503."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import CloseCode, StartMessage, dump
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    running_server_with_local_stt,
    tone,
)
from server.twilio import TwilioConnected
from voice.audio import float_to_pcm16, read_audio_16k
from voice.testing.deepgram_server import MeetingWords

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"


def meeting_pcm16(start: float, end: float) -> bytes:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return float_to_pcm16(audio[int(start * 16000) : int(end * 16000)])


@contextlib.asynccontextmanager
async def limited_server(**limits: Any) -> AsyncIterator[RunningServer]:
    async with running_server_with_local_stt(
        {"limits": limits}, MeetingWords.from_meeting(MEETING)
    ) as srv:
        yield srv


async def _closed_with(ws: ClientConnection) -> tuple[int, str]:
    async with asyncio.timeout(20):
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass
        await ws.wait_closed()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


async def test_a_flooding_stream_is_read_at_its_rate_cap_then_refused_others_unharmed() -> None:
    rate, burst = 2.0, 1.0
    async with limited_server(max_stream_rate=rate, stream_burst_s=burst, max_throttled_s=3) as srv:
        calm_token = issue_token(SECRET, "calm")
        calm = await DeviceStream.open(
            srv.base, "calm", calm_token, StartMessage(participant="calm", shared_mic=False)
        )
        flood_token = issue_token(SECRET, "flood")
        began = time.monotonic()
        flood = await DeviceStream.open(
            srv.base, "flood", flood_token, StartMessage(participant="fl", shared_mic=False)
        )
        sender = asyncio.create_task(flood.send_audio(tone(60.0), chunk_s=1.0, realtime=False))
        await eventually(lambda: srv.audio_read() >= 2.0, 120, "the flood to be read")
        # what the server read never runs ahead of the cap (plus one message of 1 s)
        for _ in range(5):
            assert srv.audio_read() <= burst + rate * (time.monotonic() - began) + 1.0 + 1e-6
            # meanwhile the calm room's audio is read at once: the flood waits on its own socket
            before = srv.audio_read()
            await calm.send_audio(tone(0.1), realtime=False)
            await eventually(lambda b=before: srv.audio_read() >= b + 0.1 - 1e-6, 120, "calm read")
        assert flood._reader is not None
        async with asyncio.timeout(120):
            await flood._reader  # the device's own reader sees the close
        code, reason = flood.ws.close_code, flood.ws.close_reason or ""
        assert code == CloseCode.TOO_MANY_STREAMS
        assert "faster than 2x real time" in reason
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
            await sender
        assert srv.server.metrics.refused_total["stream_too_fast"] == 1
        assert calm.ws.close_code is None
        async with asyncio.timeout(120):
            await calm.stop()
        assert calm.ws.close_code == CloseCode.NORMAL


async def test_tiny_frames_are_coalesced_before_the_pipeline() -> None:
    async with limited_server(min_push_ms=20) as srv:
        token = issue_token(SECRET, "tiny")
        device = await DeviceStream.open(
            srv.base, "tiny", token, StartMessage(participant="t", shared_mic=False)
        )
        await eventually(lambda: any(m.type == "started" for m in device.received), 10, "started")
        live = srv.server.rooms.rooms["tiny"]
        stream = next(iter(live.streams.values()))
        assert stream.audio is not None
        pushes: list[int] = []
        real_push = stream.audio.push

        async def counting_push(frame: bytes) -> None:
            pushes.append(len(frame))
            await real_push(frame)

        stream.audio.push = counting_push  # type: ignore[method-assign]
        audio = tone(0.8)
        for i in range(0, len(audio), 64):  # 400 frames of 2 ms
            await device.ws.send(audio[i : i + 64])
        async with asyncio.timeout(30):
            await device.stop()
        assert sum(pushes) == len(audio)  # nothing lost
        assert len(pushes) <= 0.8 / 0.020 + 1  # ≥ 20 ms per push, not one per frame


async def test_twilio_connected_messages_never_extend_the_start_deadline() -> None:
    async with limited_server(start_timeout_s=1.0) as srv:
        async with connect(f"{srv.base}/v1/twilio") as ws:

            async def keep_saying_connected() -> None:  # until the server closes the socket
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await ws.send(dump(TwilioConnected()))
                        await asyncio.sleep(0.2)

            talker = asyncio.create_task(keep_saying_connected())
            # one deadline (1 s), not one per message: were each message to restart it, the
            # socket would stay open as long as the talking goes on, past _closed_with's bound
            code, reason = await _closed_with(ws)
            talker.cancel()
        assert (code, reason) == (CloseCode.START_TIMEOUT, "no start message in time")


async def test_unauthenticated_twilio_sockets_are_capped_per_address_and_server_wide() -> None:
    async with limited_server(max_unauthenticated=3, max_unauthenticated_per_address=2) as srv:
        url = f"{srv.base}/v1/twilio"
        held: list[ClientConnection] = []

        async def hold(local: str) -> ClientConnection:
            ws = await connect(url, local_addr=(local, 0))
            with contextlib.suppress(ConnectionClosed):  # a refused one may be closed already
                await ws.send(dump(TwilioConnected()))
            return ws

        held += [await hold("127.0.0.1"), await hold("127.0.0.1")]
        await eventually(lambda: srv.server._unauthenticated_total == 2, 30, "two waiting")
        third = await hold("127.0.0.1")
        code, reason = await _closed_with(third)
        assert code == CloseCode.TOO_MANY_STREAMS and "from this address" in reason
        held.append(await hold("127.0.0.2"))
        await eventually(lambda: srv.server._unauthenticated_total == 3, 30, "three waiting")
        fourth = await hold("127.0.0.3")
        code, reason = await _closed_with(fourth)
        assert (code, reason) == (
            CloseCode.TOO_MANY_STREAMS,
            "too many connections waiting to authenticate",
        )
        for ws in held:
            await ws.close()
        await eventually(lambda: srv.server._unauthenticated_total == 0, 30, "all released")
        assert not srv.server._unauthenticated_by_address
        assert srv.server.metrics.refused_total["too_many_unauthenticated"] == 2


async def _stream_then_end(
    srv: RunningServer, room: str, audio: bytes, *, drain: bool
) -> tuple[DeviceStream, EventFeed]:
    """Stream `audio` into `room`, then end it by `stop` or by draining the whole server."""
    token = issue_token(SECRET, room)
    feed = await EventFeed.open(srv.base, room, token)
    device = await DeviceStream.open(srv.base, room, token, StartMessage(participant="d"))
    await device.send_audio(audio, chunk_s=0.5, realtime=False)
    seconds = len(audio) / 32000
    await eventually(lambda: srv.audio_read() >= seconds - 1e-6, 30, "all audio read")
    if drain:
        async with asyncio.timeout(60):
            await srv.server.stop()
    else:
        async with asyncio.timeout(60):
            await device.stop()
    assert device._reader is not None
    assert feed._reader is not None
    async with asyncio.timeout(30):
        await device._reader
        if drain:
            await feed._reader  # the server closes the feed too
    await eventually(
        lambda: any(m.type == "stream_stopped" for m in feed.received), 30, "stream_stopped"
    )
    return device, feed


async def test_shutdown_drains_flushes_the_last_turns_then_closes_with_4503() -> None:
    audio = meeting_pcm16(0.0, 8.95)
    async with limited_server() as reference:
        ref_device, ref_feed = await _stream_then_end(reference, "r", audio, drain=False)
        await ref_feed.close()
    expected = [t.text for t in ref_device.turns]
    assert expected  # the flush at `stop` gives the trailing turn too
    async with limited_server(start_timeout_s=3600) as srv:
        # a phone leg still waiting to send `start` does not hold the drain up: the drain ends
        # within its 60 s bound (in `_stream_then_end`), long before the leg's deadline
        waiting = await connect(f"{srv.base}/v1/twilio")
        await waiting.send(dump(TwilioConnected()))
        device, feed = await _stream_then_end(srv, "r", audio, drain=True)
        assert (await _closed_with(waiting))[0] == CloseCode.SHUTTING_DOWN
        assert [t.text for t in device.turns] == expected
        assert [t.text for t in feed.turns] == expected
        assert device.ws.close_code == CloseCode.SHUTTING_DOWN
        assert feed.ws.close_code == CloseCode.SHUTTING_DOWN
        assert any(m.type == "stream_stopped" for m in feed.received)
        # nothing is accepted any more
        with pytest.raises(OSError):
            await asyncio.open_connection(srv.host, srv.port)


async def test_a_flood_of_the_largest_frames_is_refused_with_4429() -> None:
    """Issue 25: the rate cap holds for frames of `max_frame_bytes` too (the probe saw such a
    flooder cut with 1006): the flooder hears 4429 with its reason."""
    async with limited_server(max_stream_rate=2.0, stream_burst_s=1.0, max_throttled_s=2) as srv:
        limit = srv.server.config.limits.max_frame_bytes
        flood = await DeviceStream.open(
            srv.base, "flood", issue_token(SECRET, "flood"),
            StartMessage(participant="fl", shared_mic=False), max_size=None,
        )  # fmt: skip
        frame = tone(limit / 32000 + 1)[:limit]

        async def flood_until_closed() -> None:
            with contextlib.suppress(ConnectionClosed):
                while True:
                    await flood.ws.send(frame)

        sender = asyncio.create_task(flood_until_closed())
        assert flood._reader is not None
        async with asyncio.timeout(120):
            await flood._reader  # the device's own reader sees the close
            await sender
        assert flood.ws.close_code == CloseCode.TOO_MANY_STREAMS
        assert "faster than 2x real time" in (flood.ws.close_reason or "")
        assert srv.server.metrics.refused_total["stream_too_fast"] == 1
