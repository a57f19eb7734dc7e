"""Refusals over real sockets: each bad connection gets a clear close code before any audio is
read, and the streams and feeds already running in the server are unharmed."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.auth import issue_token
from server.client import DeviceStream, EventFeed, TwilioLeg, events_url, stream_url
from server.protocol import CloseCode, StartMessage, dump
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    tone,
)

pytestmark = pytest.mark.asyncio


async def _closed_with(ws: ClientConnection | TwilioLeg) -> tuple[int, str]:
    """Read until the server closes; the close code and reason (what a client sees)."""
    async with asyncio.timeout(30):
        if isinstance(ws, TwilioLeg):  # its own reader task is reading
            assert ws._reader is not None
            await ws._reader
            ws = ws.ws
        else:
            with contextlib.suppress(ConnectionClosed):
                async for _ in ws:
                    pass
        await ws.wait_closed()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


@pytest.fixture
def stt_words() -> None:
    """The `server` fixture's STT says nothing: these streams carry tones."""
    return None


@pytest.fixture
async def bystanders(server: RunningServer) -> AsyncIterator[tuple[DeviceStream, EventFeed]]:
    """A healthy device stream and a feed in room `calm`, running through every refusal."""
    token = issue_token(SECRET, "calm")
    feed = await EventFeed.open(server.base, "calm", token)
    device = await DeviceStream.open(
        server.base,
        "calm",
        token,
        StartMessage(participant="steady", name="Steady", shared_mic=False),
    )
    await device.send_audio(tone(0.5), realtime=False)
    await eventually(lambda: server.audio_read() >= 0.5)
    yield device, feed
    # unharmed: still open, still takes audio, and stops cleanly
    assert device.ws.close_code is None and feed.ws.close_code is None
    await device.send_audio(tone(0.5), realtime=False)
    async with asyncio.timeout(60):
        await device.stop()
    assert device.ws.close_code == CloseCode.NORMAL
    assert any(m.type == "started" for m in device.received)
    assert any(m.type == "stream_started" for m in feed.received)
    await feed.close()


async def test_missing_token_is_refused(server: RunningServer, bystanders: object) -> None:
    async with connect(stream_url(server.base, "r1", None)) as ws:
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_MISSING, "no token given")
    assert server.audio_read() == 0.5


async def test_wrong_room_token_is_refused(server: RunningServer, bystanders: object) -> None:
    token = issue_token(SECRET, "other-room")
    async with connect(stream_url(server.base, "r1", token)) as ws:
        with contextlib.suppress(ConnectionClosed):  # the server may already have closed
            await ws.send(dump(StartMessage(participant="p")))
            await ws.send(tone(0.2))
        code, reason = await _closed_with(ws)
    assert code == CloseCode.TOKEN_WRONG_ROOM and "another room" in reason
    async with connect(events_url(server.base, "r1", token)) as ws:
        assert (await _closed_with(ws))[0] == CloseCode.TOKEN_WRONG_ROOM
    assert server.audio_read() == 0.5


async def test_expired_token_is_refused(server: RunningServer, bystanders: object) -> None:
    token = issue_token(SECRET, "r1", ttl_s=1, now=time.time() - 10)
    async with connect(stream_url(server.base, "r1", token)) as ws:
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_EXPIRED, "token expired")


async def test_bad_signature_is_refused(server: RunningServer, bystanders: object) -> None:
    token = issue_token("x" * 32, "r1")
    async with connect(stream_url(server.base, "r1", token)) as ws:
        assert (await _closed_with(ws))[0] == CloseCode.TOKEN_INVALID


async def test_bad_json_is_refused(server: RunningServer, bystanders: object) -> None:
    async with connect(stream_url(server.base, "r1", issue_token(SECRET, "r1"))) as ws:
        await ws.send("{not json")
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.BAD_MESSAGE, "message is not JSON")


async def test_audio_before_start_is_refused(server: RunningServer, bystanders: object) -> None:
    async with connect(stream_url(server.base, "r1", issue_token(SECRET, "r1"))) as ws:
        await ws.send(tone(0.1))
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.AUDIO_BEFORE_START, "audio before start")
    assert server.audio_read() == 0.5


async def test_unknown_encoding_is_refused(server: RunningServer, bystanders: object) -> None:
    async with connect(stream_url(server.base, "r1", issue_token(SECRET, "r1"))) as ws:
        await ws.send(json.dumps({"type": "start", "participant": "p", "encoding": "opus"}))
        code, reason = await _closed_with(ws)
    assert code == CloseCode.UNSUPPORTED_ENCODING and "pcm16 or mulaw" in reason


async def test_oversized_frame_is_refused(server: RunningServer, bystanders: object) -> None:
    limit = server.server.config.limits.max_frame_bytes
    async with connect(
        stream_url(server.base, "r1", issue_token(SECRET, "r1")), max_size=None
    ) as ws:
        await ws.send(dump(StartMessage(participant="big")))
        await ws.send(b"\x00" * (limit + 2))
        code, _ = await _closed_with(ws)
    assert code == CloseCode.FRAME_TOO_LARGE


async def test_twilio_leg_refusals(server: RunningServer, bystanders: object) -> None:
    # no token in customParameters
    leg = await TwilioLeg.open(server.base, {"room": "r1", "name": "Eve"})
    assert (await _closed_with(leg))[0] == CloseCode.TOKEN_MISSING
    # a token for another room
    leg = await TwilioLeg.open(
        server.base, {"room": "r1", "name": "Eve", "token": issue_token(SECRET, "calm")}
    )
    assert (await _closed_with(leg))[0] == CloseCode.TOKEN_WRONG_ROOM
    # media before start
    async with connect(f"{server.base}/v1/twilio") as ws:
        await ws.send(json.dumps({"event": "connected", "protocol": "Call", "version": "1.0.0"}))
        await ws.send(
            json.dumps({"event": "media", "streamSid": "MZ1", "media": {"payload": "AAAA"}})
        )
        assert (await _closed_with(ws))[0] == CloseCode.AUDIO_BEFORE_START
    # a media format other than 8 kHz µ-law mono
    async with connect(f"{server.base}/v1/twilio") as ws:
        start = {
            "event": "start",
            "streamSid": "MZ2",
            "start": {
                "streamSid": "MZ2",
                "callSid": "CA2",
                "customParameters": {"room": "r1", "token": issue_token(SECRET, "r1")},
                "mediaFormat": {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1},
            },
        }
        await ws.send(json.dumps(start))
        assert (await _closed_with(ws))[0] == CloseCode.UNSUPPORTED_ENCODING
    # bad JSON
    async with connect(f"{server.base}/v1/twilio") as ws:
        await ws.send("]]")
        assert (await _closed_with(ws))[0] == CloseCode.BAD_MESSAGE


async def test_stream_limit_per_room(server: RunningServer, bystanders: object) -> None:
    server.server.config.limits.max_streams_per_room = 1
    token = issue_token(SECRET, "calm")
    async with connect(stream_url(server.base, "calm", token)) as ws:
        await ws.send(dump(StartMessage(participant="second")))
        code, reason = await _closed_with(ws)
    assert code == CloseCode.TOO_MANY_STREAMS and "calm" in reason


async def test_stream_limit_per_server(server: RunningServer, bystanders: object) -> None:
    server.server.config.limits.max_streams = 1  # the bystander's stream is the one
    async with connect(stream_url(server.base, "r2", issue_token(SECRET, "r2"))) as ws:
        code, reason = await _closed_with(ws)
    assert code == CloseCode.TOO_MANY_STREAMS and "no room for another stream" in reason
    leg = await TwilioLeg.open(server.base, {"room": "r2", "token": issue_token(SECRET, "r2")})
    assert (await _closed_with(leg))[0] == CloseCode.TOO_MANY_STREAMS
    server.server.config.limits.max_streams = 64


async def _silent_feed_reader(server: RunningServer, room: str, token: str) -> socket.socket:
    """A feed consumer that completes the websocket handshake and then never reads a byte
    (a tiny receive buffer, so the server's sends back up quickly)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, (server.host, server.port))
    key = base64.b64encode(os.urandom(16)).decode()
    request = (
        f"GET /v1/rooms/{room}/events?token={token} HTTP/1.1\r\nHost: {server.host}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await loop.sock_sendall(sock, request.encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += await loop.sock_recv(sock, 1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


async def test_slow_feed_consumer_is_dropped_without_stalling(
    server: RunningServer, bystanders: tuple[DeviceStream, EventFeed]
) -> None:
    _, reader = bystanders
    live = await server.server.rooms.room("calm")
    live.feed.queue_size = 4  # the next consumer may fall 4 messages behind
    silent = await _silent_feed_reader(server, "calm", issue_token(SECRET, "calm"))
    try:
        await eventually(lambda: len(live.feed.consumers) == 2)
        live.feed.queue_size = 256
        slowest = 0.0
        for _ in range(300):  # 15 MB: more than the kernel buffers hold for a silent reader
            # CPU time, not wall time: a loaded machine may pause this process at any moment
            began = time.thread_time()
            live.feed.publish(json.dumps({"type": "reply", "room": "calm", "text": "x" * 50_000}))
            slowest = max(slowest, time.thread_time() - began)
            await asyncio.sleep(0)
        # publishing never waited on the silent reader: it returned at once every time (had it
        # copied a growing backlog per call, its cost would grow with the backlog)
        assert slowest < 0.05
        assert server.server.metrics.feed_dropped_total == 1
        assert server.server.metrics.refused_total["feed_too_slow"] <= 1
        # the reading consumer got everything, the device stream is untouched (fixture)
        await eventually(lambda: sum(m.type == "reply" for m in reader.received) == 300, 20)
        await eventually(
            lambda: server.server.open_sockets == 2, 20, "the server to let go of the silent socket"
        )
    finally:
        silent.close()


async def test_http_routes(server: RunningServer) -> None:
    status, body = await server.http_get("/healthz")
    assert status == 200 and json.loads(body)["status"] == "ok"
    status, body = await server.http_get("/metrics")
    assert status == 200 and "chorus_turn_latency_seconds_bucket" in body
    status, body = await server.http_get("/")
    assert status == 200 and "Live transcript" in body
    status, _ = await server.http_get("/nope")
    assert status == 404


async def test_a_dropped_device_is_closed_and_forgotten(
    server: RunningServer, bystanders: tuple[DeviceStream, EventFeed]
) -> None:
    _, feed = bystanders
    token = issue_token(SECRET, "calm")
    gone = await DeviceStream.open(server.base, "calm", token, StartMessage(participant="flaky"))
    await gone.send_audio(tone(0.3), realtime=False)
    await eventually(lambda: any(m.type == "started" for m in gone.received), 10, "started")
    gone.ws.transport.abort()  # the network drops: no stop, no close frame
    await eventually(
        lambda: any(m.type == "stream_stopped" and m.participant == "flaky" for m in feed.received),
        20,
        "the server to close the dropped stream",
    )
    assert server.server.metrics.streams_active["device"] == 1  # the bystander's
    live = await server.server.rooms.room("calm")
    assert [s.info.declaration.participant for s in live.streams.values()] == ["steady"]


def _no_client_text_logged(caplog: pytest.LogCaptureFixture, *texts: str) -> None:
    """One bounded line per refused connection: no traceback, nothing the client sent."""
    for record in caplog.records:
        line = record.getMessage()
        assert record.exc_info is None, f"traceback logged: {line}"
        assert len(line) < 300 and not any(t in line for t in texts), line


async def test_a_reason_never_echoes_the_client_and_fits_a_close_frame(
    server: RunningServer, bystanders: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25.2: reasons built from client text, cut at 120 characters, overflowed the close
    frame (123 bytes) with non-ASCII input: 1006 and a traceback per 60-byte message."""
    caplog.set_level(logging.INFO)
    token = issue_token(SECRET, "r1")
    sent = [
        (f"{server.base}/v1/twilio", {"event": "ł" * 60}),
        (f"{server.base}/v1/twilio", {"event": "start", "streamSid": "MZ1", "start": {
            "streamSid": "MZ1", "callSid": "CA1", "customParameters": {"ł" * 60: 5}}}),
        (stream_url(server.base, "r1", token), {"type": "start", "participant": "ł" * 60}),
        (stream_url(server.base, "r1", token), {"type": "ł" * 60}),
    ]  # fmt: skip
    for url, message in sent:
        async with connect(url) as ws:
            await ws.send(json.dumps(message, ensure_ascii=False))
            code, reason = await _closed_with(ws)
        assert code == CloseCode.BAD_MESSAGE, (message, code)
        assert reason.startswith("bad message at ") and "ł" not in reason
        assert len(reason.encode()) <= 123
    _no_client_text_logged(caplog, "ł")


def _upgrade(port: int, path: bytes, header: bytes) -> bytes:
    """A raw websocket upgrade with one extra header line; the status line of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        raw.sendall(
            b"GET " + path + b" HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\n" + header + b"\r\n\r\n"
        )
        answer = b""
        while b"\r\n" not in answer:
            chunk = raw.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


async def test_a_non_ascii_header_on_an_upgrade_is_a_400(
    server: RunningServer, bystanders: object, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25.2: a header byte outside ASCII made uvicorn's handshake fail (500, traceback)."""
    caplog.set_level(logging.INFO)
    token = issue_token(SECRET, "r1").encode()
    for path, header in [
        (b"/v1/twilio", "X-Caller: Łukasz".encode()),
        (b"/v1/rooms/r1/stream?token=" + token, "User-Agent: ł".encode()),
        (b"/v1/rooms/r1/stream", "Authorization: Bearer ł".encode()),
        (b"/v1/rooms/r1/events", b"X-Name: \xff\xfe"),
    ]:
        status = await asyncio.to_thread(_upgrade, server.server.port, path, header)
        assert status == b"HTTP/1.1 400 Bad Request", (path, header, status)
    _no_client_text_logged(caplog, "ł", "Łukasz")
