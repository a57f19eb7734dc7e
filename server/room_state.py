"""What the server holds for one live room and one open stream while its sockets are connected.

Owns `LiveStream` (a stream's declaration, its bounded outbox to the socket, its rate cap and its
turn-latency clock) and `LiveRoom` (a room's feed, open streams and renames), the state shared by
the room registry (`server.live`), the server's output (`server.output`) and the renames
(`server.renames`); and `held`, the per-room lock whose entry lives only while it is in use. Nothing here awaits a client: messages go to bounded per-socket queues, so a
slow device never stalls audio handling or another room.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal

from server.excerpts import VoiceExcerpts
from server.feed import RenameBook, RoomFeed
from server.framing import Outgoing, StreamDeclaration, StreamKind
from server.pipeline import StreamAudio, StreamInfo
from server.protocol import StreamEventMessage, dump

OUTBOX_SIZE = 1024


class StreamTooFastError(Exception):
    """A stream kept sending faster than `limits.max_stream_rate` for `limits.max_throttled_s`."""


MIN_MESSAGE_S = 0.005
"""Every message is charged at least this much audio against the rate cap, so a flood of tiny
frames is held back like a flood of audio (per-message work is bounded too)."""


class StreamPacer:
    """The rate cap of one stream: audio is admitted at most `rate` times real time after a
    `burst`; a stream ahead of that waits (and, since its socket is not read meanwhile, its
    client is held back by TCP alone). Waiting longer than `max_throttled_s` in total raises
    `StreamTooFastError` so the client hears why instead of stalling forever."""

    def __init__(self, rate: float, burst_s: float, max_throttled_s: float) -> None:
        self.rate = rate
        self.burst_s = burst_s
        self.max_throttled_s = max_throttled_s
        self.admitted_s = 0.0
        self.throttled_s = 0.0
        self._began = time.monotonic()

    def delay_for(self, seconds: float, now: float | None = None) -> float:
        """How long audio of `seconds` must wait before it may be admitted (0: now)."""
        elapsed = (time.monotonic() if now is None else now) - self._began
        ahead = self.admitted_s + max(seconds, MIN_MESSAGE_S) - self.burst_s - self.rate * elapsed
        return max(0.0, ahead / self.rate)

    async def admit(self, seconds: float) -> None:
        delay = self.delay_for(seconds)
        if delay > 0:
            if self.throttled_s + delay > self.max_throttled_s:
                raise StreamTooFastError(
                    f"stream sends faster than {self.rate:g}x real time "
                    f"(held back {self.throttled_s:.0f} s)"
                )
            self.throttled_s += delay
            await asyncio.sleep(delay)
        self.admitted_s += max(seconds, MIN_MESSAGE_S)


@dataclass(eq=False)
class LiveStream:
    """One open audio stream: a conference-room device or a phone leg."""

    info: StreamInfo
    kind: StreamKind
    reply_audio: Callable[[bytes, int], list[Outgoing]]
    """Turns reply audio (pcm16 at a rate) into what this socket sends (binary or Twilio media)."""
    stop_reply: Callable[[Outgoing], list[Outgoing]] = lambda stopped: []
    """The room's reply was talked over: drops what this socket holds of it, and returns what
    tells its peer to (`StreamFraming.stop_reply`, given the room's `reply_stopped` message)."""
    outbox: asyncio.Queue[Outgoing] = field(default_factory=lambda: asyncio.Queue(OUTBOX_SIZE))
    audio: StreamAudio | None = None
    received_s: float = 0.0
    _clock_audio: list[float] = field(default_factory=list)
    _clock_wall: list[float] = field(default_factory=list)
    dropped_messages: int = 0
    pacer: StreamPacer | None = None
    pending: bytearray = field(default_factory=bytearray)
    """Audio read but not yet pushed (tiny frames are coalesced up to `limits.min_push_ms`)."""

    @property
    def id(self) -> str:
        return self.info.stream_id

    @property
    def declaration(self) -> StreamDeclaration:
        return self.info.declaration

    @property
    def room_id(self) -> str:
        return self.info.room_id

    def event_message(self, type: Literal["stream_started", "stream_stopped"]) -> str:
        """The feed's message that this stream joined or left its room."""
        declared = self.declaration
        return dump(
            StreamEventMessage(
                type=type,
                room=self.room_id,
                stream=self.id,
                participant=declared.participant,
                name=declared.name,
                kind=self.kind,
            )
        )

    async def admit(self, audio: bytes) -> float:
        """Take `audio` (whole sample frames) under the rate cap into `pending`; its seconds.
        Raises `StreamTooFastError` for a stream that stays over the cap."""
        fmt = self.declaration.format
        seconds = len(audio) / (fmt.bytes_per_frame * fmt.sample_rate)
        if self.pacer is not None:
            await self.pacer.admit(seconds)
        self.note_audio(seconds)
        self.pending += audio
        return seconds

    async def push_pending(self) -> None:
        """Hand the audio gathered so far to the stream's session."""
        if not self.pending:
            return
        data = bytes(self.pending)
        self.pending.clear()
        assert self.audio is not None
        await self.audio.push(data)

    def send(self, message: Outgoing) -> bool:
        """Queue a message for the socket; False (and counted) when it stopped reading."""
        try:
            self.outbox.put_nowait(message)
        except asyncio.QueueFull:
            self.dropped_messages += 1
            return False
        return True

    def note_audio(self, seconds: float) -> None:
        """Record when the audio up to `received_s` arrived (for turn latency)."""
        self.received_s += seconds
        self._clock_audio.append(self.received_s)
        self._clock_wall.append(time.monotonic())
        if len(self._clock_audio) > 20_000:  # keep the last ~10 minutes of 30 ms frames
            del self._clock_audio[:10_000]
            del self._clock_wall[:10_000]

    def latency_of(self, turn_end_s: float) -> float | None:
        """Seconds between receiving the audio up to `turn_end_s` and now."""
        i = bisect.bisect_left(self._clock_audio, turn_end_s - 1e-6)
        if i >= len(self._clock_audio):
            i = len(self._clock_audio) - 1
        if i < 0:
            return None
        return max(0.0, time.monotonic() - self._clock_wall[i])


@dataclass(eq=False)
class LiveRoom:
    room_id: str
    feed: RoomFeed
    streams: dict[str, LiveStream] = field(default_factory=dict)
    renames: RenameBook = field(default_factory=RenameBook)
    """(stream id or None for every stream, raw speaker label) → name."""
    participant_names: dict[str, str] = field(default_factory=dict)
    """A one-person stream's participant id → the name it was renamed to (kept in the store)."""
    last_active: float = field(default_factory=time.monotonic)
    """When a stream or a feed consumer last came or went (idle eviction counts from here)."""
    excerpts: VoiceExcerpts = field(default_factory=VoiceExcerpts)
    """The last seconds of each speaker's voice, for the page's speakers panel (in memory)."""
    suggested: set[tuple[str | None, str, str]] = field(default_factory=set)
    """(stream, label, name) already suggested from an introduction (each once)."""
    agents_away: dict[str, str] = field(default_factory=dict)
    """Channel id → its `assistant_status` (unavailable) message, while a model of the room is
    away: a feed consumer that joins meanwhile is told first."""
    turn_latencies: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Event id → turn latency of the room's latest voice turns (`server.output`: a reply's
    latency starts from its asking turn's)."""

    def touch(self) -> None:
        self.last_active = time.monotonic()


@dataclass(eq=False)
class KeyLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


@contextlib.asynccontextmanager
async def held(locks: dict[str, KeyLock], key: str) -> AsyncIterator[None]:
    """Hold the lock of `key` in `locks`. Its entry lives only while someone holds or waits for
    it, so the map does not grow with every room ever seen."""
    entry = locks.get(key)
    if entry is None:
        entry = locks[key] = KeyLock()
    entry.users += 1
    try:
        async with entry.lock:
            yield
    finally:
        entry.users -= 1
        if entry.users == 0 and locks.get(key) is entry:
            del locks[key]
