"""Clients of the server's own protocols: a room device, a Twilio phone leg, an event-feed reader.

Owns the client side of `server.protocol`, so the demo, the load benchmark and the tests speak
to the server exactly as a device or a phone bridge would — over real sockets, with the same
typed messages the server parses. Audio can be paced at real time (as a microphone delivers it)
or sent as fast as the socket takes it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.protocol import (
    BargeInMessage,
    FeedMessage,
    MessageRequest,
    RenameRequest,
    StartMessage,
    StopMessage,
    dump,
    parse_server_message,
)
from server.twilio import (
    TwilioConnected,
    TwilioMark,
    TwilioMarkName,
    TwilioMedia,
    TwilioMediaPayload,
    TwilioStart,
    TwilioStartInfo,
    TwilioStop,
)

OnMessage = Callable[[FeedMessage], Awaitable[None] | None]


def latest_turns(received: list[Any]) -> list[Any]:
    """The `turn` messages as a device shows them: in order of first arrival, each in its latest
    version (a `corrected` turn replaces the one with the same `event_id`)."""
    turns: list[Any] = []
    at: dict[str, int] = {}
    for m in received:
        if m.type != "turn":
            continue
        if m.corrected and m.event_id in at:
            turns[at[m.event_id]] = m
            continue
        if m.event_id is not None:
            at[m.event_id] = len(turns)
        turns.append(m)
    return turns


def stream_url(base: str, room: str, token: str | None) -> str:
    query = f"?token={quote(token)}" if token is not None else ""
    return f"{base}/v1/rooms/{quote(room)}/stream{query}"


def events_url(base: str, room: str, token: str | None) -> str:
    query = f"?token={quote(token)}" if token is not None else ""
    return f"{base}/v1/rooms/{quote(room)}/events{query}"


async def send_paced(
    send: Callable[[bytes], Awaitable[None]],
    audio: bytes,
    *,
    bytes_per_second: int,
    chunk_s: float,
    realtime: bool,
) -> None:
    """Send `audio` in `chunk_s` pieces; at real-time pace when `realtime` (no drift)."""
    step = max(1, int(bytes_per_second * chunk_s))
    step -= step % 2 if bytes_per_second % 2 == 0 else 0
    began = time.monotonic()
    for i in range(0, len(audio), step):
        if realtime:
            due = began + i / bytes_per_second
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await send(audio[i : i + step])


@dataclass
class DeviceStream:
    """A conference-room device: `start`, binary audio, `stop`; collects what the server says."""

    ws: ClientConnection
    start: StartMessage
    received: list[FeedMessage] = field(default_factory=list)
    audio_received: bytearray = field(default_factory=bytearray)
    on_message: OnMessage | None = None
    on_audio: Callable[[bytes], None] | None = None
    """Told each binary message (reply audio) as it arrives."""
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        base: str,
        room: str,
        token: str | None,
        start: StartMessage,
        on_message: OnMessage | None = None,
        on_audio: Callable[[bytes], None] | None = None,
        **connect_options: Any,
    ) -> DeviceStream:
        ws = await connect(stream_url(base, room, token), **connect_options)
        stream = cls(ws=ws, start=start, on_message=on_message, on_audio=on_audio)
        # a server that refuses at once (a bad token) may close before `start` is written: its
        # `error` is still read, by the reader, from what arrived before the close
        with contextlib.suppress(ConnectionClosed):
            await ws.send(dump(start))
        stream._reader = asyncio.create_task(stream._read())
        return stream

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.audio_received.extend(message)
                    if self.on_audio is not None:
                        self.on_audio(message)
                    continue
                parsed = parse_server_message(message)
                self.received.append(parsed)
                if self.on_message is not None:
                    result = self.on_message(parsed)
                    if result is not None:
                        await result

    async def send_audio(
        self, audio: bytes, *, chunk_s: float = 0.1, realtime: bool = True
    ) -> None:
        width = 2 if self.start.encoding == "pcm16" else 1
        await send_paced(
            self.ws.send,
            audio,
            bytes_per_second=self.start.sample_rate * width * self.start.channels,
            chunk_s=chunk_s,
            realtime=realtime,
        )

    async def barge_in(self) -> None:
        """Say the device stopped the reply it was playing because someone talked over it."""
        await self.ws.send(dump(BargeInMessage()))

    async def stop(self) -> None:
        """Send `stop` and wait until the server has flushed the last turns and closed
        (bound it with `asyncio.timeout` where needed)."""
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(dump(StopMessage()))
        if self._reader is not None:
            await self._reader
        await self.ws.wait_closed()

    @property
    def turns(self) -> list[Any]:
        return latest_turns(self.received)


@dataclass
class TwilioLeg:
    """One phone leg as Twilio's Media Streams sends it: `connected`, `start`, `media`…, `stop`.

    It plays what it is sent as Twilio does: the outbound `media` at real time, one after the
    other, and each `mark` goes back once the audio before it has played; a `clear` drops what
    was not played and sends every pending mark back at once."""

    ws: ClientConnection
    stream_sid: str
    call_sid: str
    sequence: int = 0
    received: list[dict[str, Any]] = field(default_factory=list)
    marks_sent: list[str] = field(default_factory=list)
    """The names of the marks sent back, in order."""
    _reader: asyncio.Task[None] | None = None
    _plays_until: float = 0.0
    _pending: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    @classmethod
    async def open(
        cls,
        base: str,
        parameters: dict[str, str],
        *,
        auth_token: str | None = None,
        **connect_options: Any,
    ) -> TwilioLeg:
        """With `auth_token`, the upgrade carries `X-Twilio-Signature` as Twilio signs it (the
        Twilio SDK's `RequestValidator` over the stream URL, the `twilio` extra)."""
        url = f"{base}/v1/twilio"
        if auth_token is not None:
            from twilio.request_validator import RequestValidator

            signature = RequestValidator(auth_token).compute_signature(url, {})
            connect_options.setdefault("additional_headers", {})["X-Twilio-Signature"] = signature
        ws = await connect(url, **connect_options)
        leg = cls(ws=ws, stream_sid="MZ" + uuid.uuid4().hex, call_sid="CA" + uuid.uuid4().hex)
        with contextlib.suppress(ConnectionClosed):  # a refusal is read by the reader
            await ws.send(dump(TwilioConnected()))
            await ws.send(
                dump(
                    TwilioStart(
                        sequenceNumber=leg._next(),
                        streamSid=leg.stream_sid,
                        start=TwilioStartInfo(
                            accountSid="AC" + "0" * 32,
                            streamSid=leg.stream_sid,
                            callSid=leg.call_sid,
                            customParameters=parameters,
                        ),
                    )
                )
            )
        leg._reader = asyncio.create_task(leg._read())
        return leg

    def _next(self) -> str:
        self.sequence += 1
        return str(self.sequence)

    async def _read(self) -> None:
        import json

        try:
            with contextlib.suppress(ConnectionClosed):
                async for message in self.ws:
                    parsed = json.loads(message)
                    self.received.append(parsed)
                    self._play(parsed)
        finally:
            for task in self._pending.values():
                task.cancel()

    def _play(self, message: dict[str, Any]) -> None:
        """Twilio's playback of what the server sends: its clock, its marks, a `clear`."""
        now = asyncio.get_running_loop().time()
        event = message.get("event")
        if event == "media":
            payload = base64.b64decode(message.get("media", {}).get("payload", ""))
            self._plays_until = max(self._plays_until, now) + len(payload) / 8000
        elif event == "mark":
            name = str(message.get("mark", {}).get("name", ""))
            self._pending[name] = asyncio.create_task(
                self._mark_back(name, max(0.0, self._plays_until - now))
            )
        elif event == "clear":
            self._plays_until = now
            for name, task in list(self._pending.items()):
                task.cancel()
                self._pending[name] = asyncio.create_task(self._mark_back(name, 0.0))

    async def _mark_back(self, name: str, after_s: float) -> None:
        await asyncio.sleep(after_s)
        self._pending.pop(name, None)
        self.marks_sent.append(name)
        mark = TwilioMark(
            sequenceNumber=self._next(), streamSid=self.stream_sid, mark=TwilioMarkName(name=name)
        )
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(dump(mark))

    async def send_mulaw(
        self, mulaw: bytes, *, chunk_s: float = 0.02, realtime: bool = True
    ) -> None:
        chunk = 0
        timestamp = 0

        async def send(piece: bytes) -> None:
            nonlocal chunk, timestamp
            chunk += 1
            await self.ws.send(
                dump(
                    TwilioMedia(
                        sequenceNumber=self._next(),
                        streamSid=self.stream_sid,
                        media=TwilioMediaPayload(
                            track="inbound",
                            chunk=str(chunk),
                            timestamp=str(timestamp),
                            payload=base64.b64encode(piece).decode("ascii"),
                        ),
                    )
                )
            )
            timestamp += len(piece) // 8

        await send_paced(send, mulaw, bytes_per_second=8000, chunk_s=chunk_s, realtime=realtime)

    async def stop(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            await self.ws.send(
                dump(TwilioStop(sequenceNumber=self._next(), streamSid=self.stream_sid))
            )
        if self._reader is not None:
            await self._reader
        await self.ws.wait_closed()


@dataclass
class EventFeed:
    """A reader of `/v1/rooms/{room}/events`: every turn, speaker change and reply of the room."""

    ws: ClientConnection
    received: list[FeedMessage] = field(default_factory=list)
    on_message: OnMessage | None = None
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, base: str, room: str, token: str | None, on_message: OnMessage | None = None
    ) -> EventFeed:
        ws = await connect(events_url(base, room, token))
        feed = cls(ws=ws, on_message=on_message)
        feed._reader = asyncio.create_task(feed._read())
        return feed

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionClosed):
            async for message in self.ws:
                parsed = parse_server_message(message)
                self.received.append(parsed)
                if self.on_message is not None:
                    result = self.on_message(parsed)
                    if result is not None:
                        await result

    async def rename(self, label: str, name: str, stream: str | None = None) -> None:
        await self.ws.send(dump(RenameRequest(label=label, name=name, stream=stream)))

    async def message(self, participant: str, text: str, name: str | None = None) -> None:
        """Type `text` into the room's chat as `participant` (shown as `name`)."""
        await self.ws.send(dump(MessageRequest(participant=participant, name=name, text=text)))

    async def close(self) -> None:
        await self.ws.close()
        if self._reader is not None:
            with contextlib.suppress(Exception):
                await self._reader

    @property
    def turns(self) -> list[Any]:
        return latest_turns(self.received)
