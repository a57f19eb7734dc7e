"""Live rooms: what the server holds per room while devices, phone legs and feeds are connected.

Owns the wiring between sockets and the room runtime: one `RoomKit` for the whole server, a room
per room id (created on first use, with the pipeline's channels attached), the streams open in
each room, the live event feed, speaker renames, stream limits and turn latency.

Turns and replies come back through one `ServerOutput` channel attached to every room: the kit
delivers every committed event to it in commit order, and as an `AudioSink` it receives the
assistant's reply audio (R5). Nothing here awaits a client: messages go to bounded per-socket
queues, so a slow device or page never stalls audio handling or another room.

The kit's store is the server's `[store]` (SQLite by default, see `server.config.StoreConfig`),
so rooms outlive the process: a room id the store knows is taken up where it was (its turns,
participants, register and renames), whether the server restarted or the room was evicted.

A room with no open stream and no feed consumer for `limits.idle_room_seconds` is evicted (a
sweeper task): its live state, the pipeline's per-room state (`Pipeline.release_room`) and what
the kit and its channels hold in memory for it (`RoomKit.release_room`: realtime session, delivery
queue, lock entry) go, so memory follows the rooms in use, not every room ever seen. Its stored
turns stay: deleting a room is an explicit call (`RoomKit.delete_room`). Idleness is checked
again under the room's lock, and the room leaves `rooms` before anything is awaited, so a
connection arriving meanwhile either keeps the room or takes it up afresh.

Typed messages (`post_message`, from `POST /v1/rooms/{room}/messages` or the feed) enter through
the `ChatInput` channel attached to every room and are published to the feed as `message`s in
commit order with the turns (server.chat).

Renames from the page go through `ON_TRANSCRIPTION` (V6) exactly as an application hook's
rename would: the server's own hook rewrites `sender_name` of the matching voice's turns. Renames
that outlive a stream (a label in every stream, a one-person stream's participant) are kept in
the store as the room's memory state `server.renames`; a rename of one voice of one shared-mic
stream lives as long as that stream.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from models import InboundMessage, RoomEvent, TextContent
from rooms import Channel, HookContext, HookResult, HookTrigger, RoomContext, RoomKit
from server.chat import ChatInput
from server.config import ServerConfig
from server.feed import FeedConsumer, RenameBook, RoomFeed
from server.metrics import ServerMetrics
from server.pipeline import Pipeline, StreamAudio, StreamInfo
from server.protocol import (
    ChatMessage,
    RenamedMessage,
    ReplyMessage,
    SpeakerChangeMessage,
    StreamEventMessage,
    SttStatusMessage,
    TurnMessage,
    dump,
)
from voice.channel import VoiceSession
from voice.stt.base import AudioLost, SttDegraded, SttRecovered, SttStatus

log = logging.getLogger(__name__)

StreamKind = Literal["device", "twilio"]
Outgoing = str | bytes
OUTBOX_SIZE = 1024
ONE_PERSON = "\x00one-person"
"""Rename key for a one-person stream: its one voice, whatever label an STT gave it."""


class StreamLimitError(Exception):
    """No room for another stream (server-wide or in this room)."""


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
    def room_id(self) -> str:
        return self.info.room_id

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

    def touch(self) -> None:
        self.last_active = time.monotonic()


@dataclass(eq=False)
class _RoomLock:
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    users: int = 0


class ServerOutput(Channel):
    """The server's own channel in every room: sees every committed event, plays reply audio."""

    channel_type: ClassVar[str] = "server"

    def __init__(self, hub: LiveRooms) -> None:
        super().__init__("chorus-server")
        self.hub = hub

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        await self.hub.committed(event)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        await self.hub.committed(event, corrected=True)

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        self.hub.play_reply(room_id, pcm16, sample_rate)


class LiveRooms:
    def __init__(
        self,
        config: ServerConfig,
        metrics: ServerMetrics,
        pipeline: Pipeline,
        kit: RoomKit | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.pipeline = pipeline
        self.kit = kit or RoomKit()
        """The server's one kit; its store and locks come from `[store]` (`chorus serve`)."""
        self.rooms: dict[str, LiveRoom] = {}
        self.output = ServerOutput(self)
        self.kit.register_channel(self.output)
        self.chat = ChatInput()
        """Typed messages (`post_message`) enter every room through this channel."""
        self.kit.register_channel(self.chat)
        self._sessions: dict[str, LiveStream] = {}
        self._room_locks: dict[str, _RoomLock] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._stream_count = 0
        self._serial = itertools.count(1)
        self._saves: set[asyncio.Task[None]] = set()
        self._save_locks: dict[str, asyncio.Lock] = {}
        self.kit.hooks.add(
            HookTrigger.ON_TRANSCRIPTION, self._apply_rename, priority=1000, name="server-rename"
        )
        self.kit.hooks.add(
            HookTrigger.ON_SPEAKER_CHANGE, self._speaker_changed, name="server-speaker-change"
        )
        listeners = getattr(pipeline, "status_listeners", None)
        if listeners is not None:
            listeners.append(self._stt_status)

    # ------------------------------------------------------------------ rooms

    async def room(self, room_id: str) -> LiveRoom:
        live = self.rooms.get(room_id)
        if live is not None:
            return live
        async with self._room_lock(room_id):
            live = self.rooms.get(room_id)
            if live is not None:
                return live
            if await self.kit.get_room(room_id) is None:
                # Another server process on the same store may create it at the same moment.
                with contextlib.suppress(ValueError):
                    await self.kit.create_room(room_id=room_id)
            # A stored room (from before a restart, or evicted while idle) is taken up where it
            # was: its channels attach again and hear `on_attach`, its renames come back.
            await self.kit.attach_channel(room_id, self.output.channel_id)
            await self.kit.attach_channel(room_id, self.chat.channel_id)
            await self.pipeline.attach_room(self.kit, room_id)
            live = LiveRoom(
                room_id=room_id,
                feed=RoomFeed(
                    self.config.limits.feed_queue,
                    self.config.limits.history,
                    on_drop=self._feed_dropped,
                ),
            )
            await self._load_renames(live)
            self.rooms[room_id] = live
            return live

    @contextlib.asynccontextmanager
    async def _room_lock(self, room_id: str) -> AsyncIterator[None]:
        """The server's lock for creating and evicting one room. Its entry lives only while
        someone holds or waits for it, so the map does not grow with every room ever seen."""
        entry = self._room_locks.get(room_id)
        if entry is None:
            entry = self._room_locks[room_id] = _RoomLock()
        entry.users += 1
        try:
            async with entry.lock:
                yield
        finally:
            entry.users -= 1
            if entry.users == 0 and self._room_locks.get(room_id) is entry:
                del self._room_locks[room_id]

    # ------------------------------------------------------------------ idle rooms

    def start(self) -> None:
        """Start evicting idle rooms (`limits.idle_room_seconds`; 0: never). Needs the loop."""
        idle = self.config.limits.idle_room_seconds
        if idle > 0 and self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(
                self._sweep(idle), name="chorus-idle-rooms"
            )

    @staticmethod
    def _idle_since(live: LiveRoom) -> float | None:
        """When the room last had a stream or a feed consumer; None while it has one."""
        if live.streams or live.feed.consumers:
            return None
        return live.last_active

    async def _sweep(self, idle: float) -> None:
        interval = min(max(idle / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for room_id, live in list(self.rooms.items()):
                since = self._idle_since(live)
                if since is not None and now - since >= idle:
                    try:
                        await self.evict(room_id, idle)
                    except Exception:
                        log.exception("evicting room %s failed", room_id)

    async def evict(self, room_id: str, idle_s: float = 0.0) -> bool:
        """Evict the room if it has been idle for `idle_s` seconds; True when it was.

        Idleness is checked again under the room's lock and the room leaves `self.rooms` before
        anything is awaited, so a stream or feed that arrives meanwhile either found the room
        first (then it is not idle and stays) or waits for the lock and gets a fresh room."""
        async with self._room_lock(room_id):
            live = self.rooms.get(room_id)
            if live is None:
                return False
            since = self._idle_since(live)
            if since is None or time.monotonic() - since < idle_s:
                return False
            await self._forget(room_id, delete=False)
            self.metrics.rooms_evicted_total += 1
        log.info("room %s evicted after %.0f s idle", room_id, idle_s)
        return True

    async def delete(self, room_id: str) -> bool | None:
        """Delete a room on request (`DELETE /v1/rooms/{room}`): its live state, the pipeline's
        state and the room in the kit. True: deleted; False: no such room; None: the room has
        an open stream or feed consumer and was left alone."""
        async with self._room_lock(room_id):
            live = self.rooms.get(room_id)
            if live is not None:
                if self._idle_since(live) is None:
                    return None
                await self._forget(room_id, delete=True)
            elif await self.kit.get_room(room_id) is not None:
                await self.kit.delete_room(room_id)
            else:
                return False
        log.info("room %s deleted", room_id)
        return True

    async def _forget(self, room_id: str, *, delete: bool) -> None:
        """Under the room's lock: the room leaves `rooms` first, then the pipeline's state, then
        the kit's: live state only on eviction (stored turns stay), everything on a deletion."""
        del self.rooms[room_id]
        try:
            await self.pipeline.release_room(self.kit, room_id)
        finally:
            if delete:
                await self.kit.delete_room(room_id)
            else:
                await self.kit.release_room(room_id)

    def subscribe(self, live: LiveRoom) -> FeedConsumer:
        if len(live.feed.consumers) >= self.config.limits.max_feed_consumers_per_room:
            raise StreamLimitError(
                f"room {live.room_id!r} already has "
                f"{self.config.limits.max_feed_consumers_per_room} feed consumers"
            )
        self.metrics.feed_consumers += 1
        live.touch()
        return live.feed.subscribe()

    def unsubscribe(self, live: LiveRoom, consumer: FeedConsumer) -> None:
        self.metrics.feed_consumers -= 1
        live.feed.unsubscribe(consumer)
        live.touch()

    def _feed_dropped(self, consumer: FeedConsumer) -> None:
        self.metrics.feed_dropped_total += 1

    # ------------------------------------------------------------------ streams

    def has_capacity(self) -> bool:
        return self._stream_count < self.config.limits.max_streams

    async def open_stream(
        self,
        room_id: str,
        *,
        kind: StreamKind,
        participant: str,
        name: str | None,
        shared_mic: bool,
        sample_rate: int,
        encoding: str,
        channels: int,
        reply_audio: Callable[[bytes, int], list[Outgoing]],
    ) -> LiveStream:
        limits = self.config.limits
        if self._stream_count >= limits.max_streams:
            raise StreamLimitError(f"the server already has {limits.max_streams} streams")
        live = await self.room(room_id)
        if len(live.streams) >= limits.max_streams_per_room:
            raise StreamLimitError(
                f"room {room_id!r} already has {limits.max_streams_per_room} streams"
            )
        self._stream_count += 1
        info = StreamInfo(
            room_id=room_id,
            stream_id=f"{kind}-{next(self._serial)}-{uuid.uuid4().hex[:6]}",
            participant=participant,
            name=name,
            shared_mic=shared_mic,
            sample_rate=sample_rate,
            encoding=encoding,
            channels=channels,
        )
        stream = LiveStream(
            info=info,
            kind=kind,
            reply_audio=reply_audio,
            pacer=StreamPacer(
                limits.max_stream_rate, limits.stream_burst_s, limits.max_throttled_s
            ),
        )
        live.streams[stream.id] = stream
        live.touch()
        try:
            stream.audio = await self.pipeline.open_stream(self.kit, info)
        except BaseException:
            live.streams.pop(stream.id, None)
            live.touch()
            self._stream_count -= 1
            raise
        self._sessions[stream.audio.session_id] = stream
        self.metrics.streams_active[kind] += 1
        self.metrics.streams_total[kind] += 1
        live.feed.publish(
            dump(
                StreamEventMessage(
                    type="stream_started",
                    room=room_id,
                    stream=stream.id,
                    participant=participant,
                    name=name,
                    kind=kind,
                )
            )
        )
        return stream

    async def push_audio(self, stream: LiveStream, pcm_or_mulaw: bytes) -> None:
        """Admit a piece of the stream's audio (whole samples) under its rate cap; it reaches
        the pipeline once `limits.min_push_ms` of audio has gathered. Raises
        `StreamTooFastError` for a stream that stays over the cap."""
        info = stream.info
        width = (2 if info.encoding == "pcm16" else 1) * info.channels
        seconds = len(pcm_or_mulaw) / (width * info.sample_rate)
        if stream.pacer is not None:
            await stream.pacer.admit(seconds)
        stream.note_audio(seconds)
        self.metrics.audio_seconds_total += seconds
        stream.pending += pcm_or_mulaw
        min_bytes = int(self.config.limits.min_push_ms / 1000 * info.sample_rate) * width
        if len(stream.pending) >= min_bytes:
            await self._push_pending(stream)

    async def _push_pending(self, stream: LiveStream) -> None:
        if not stream.pending:
            return
        data = bytes(stream.pending)
        stream.pending.clear()
        assert stream.audio is not None
        await stream.audio.push(data)

    async def close_stream(self, stream: LiveStream) -> None:
        """Flush the stream's last turns, then forget it. Safe to call once per stream."""
        live = self.rooms.get(stream.room_id)
        try:
            if stream.audio is not None:
                await self._push_pending(stream)
                await stream.audio.finish()
        except Exception:
            log.exception("closing stream %s failed", stream.id)
        finally:
            if stream.audio is not None:
                self._sessions.pop(stream.audio.session_id, None)
            if live is not None and live.streams.pop(stream.id, None) is not None:
                live.touch()
                self._stream_count -= 1
                self.metrics.streams_active[stream.kind] -= 1
                live.feed.publish(
                    dump(
                        StreamEventMessage(
                            type="stream_stopped",
                            room=stream.room_id,
                            stream=stream.id,
                            participant=stream.info.participant,
                            name=stream.info.name,
                            kind=stream.kind,
                        )
                    )
                )

    # ------------------------------------------------------------------ chat

    async def post_message(
        self, room_id: str, participant: str, name: str | None, text: str
    ) -> RoomEvent | None:
        """A message typed into the room (server.chat): the participant is recorded on the chat
        channel (its first name stays; B2 names the turn), then the text is committed as a turn
        of the chat channel. None when a hook blocked it."""
        live = await self.room(room_id)
        live.touch()
        await self.kit.ensure_participant(
            room_id, self.chat.channel_id, participant, display_name=name
        )
        result = await self.kit.process_inbound(
            InboundMessage(
                channel_id=self.chat.channel_id,
                sender_id=participant,
                content=TextContent(body=text),
                metadata={"source": "chat"},
                room_id=room_id,
            )
        )
        return result.event

    # ------------------------------------------------------------------ what the room says

    def _stream_of(self, metadata: dict[str, Any]) -> LiveStream | None:
        session = metadata.get("voice_session_id")
        return self._sessions.get(str(session)) if session is not None else None

    async def committed(self, event: RoomEvent, *, corrected: bool = False) -> None:
        """Every committed event of every room, in commit order (from `ServerOutput.deliver`).
        `corrected`: a voice turn replaced in place (an early turn the final result corrected):
        it goes out again as a `turn` with the same `event_id` and `corrected: true`, for the
        device and the feed to show instead of the first version; it is not counted again."""
        live = self.rooms.get(event.room_id)
        if live is None or event.kind != "message":
            return
        meta = event.metadata
        voice = meta.get("source") == "voice" or event.source.channel_type == "voice"
        if corrected and not voice:
            return  # only voice turns are corrected in place; nothing else is re-sent
        if voice:
            stream = self._stream_of(meta)
            end = float(meta.get("end", 0.0))
            speaker = meta.get("sender_name")
            if not speaker:  # no stamped name: the participant record names the turn (B2)
                speaker = await self.kit.label_for(event.room_id, event)
            turn = TurnMessage(
                room=event.room_id,
                speaker=str(speaker),
                text=event.text,
                start=float(meta.get("start", 0.0)),
                end=end,
                participant=event.source.participant_id,
                label=meta.get("speaker_label")
                if stream is None or stream.info.shared_mic
                else None,
                stream=stream.id if stream else None,
                event_id=event.id,
                corrected=corrected,
            )
            if corrected:
                self.metrics.turn_corrections_total += 1
            else:
                self.metrics.turns_total += 1
                latency = stream.latency_of(end) if stream is not None else None
                if latency is not None:
                    self.metrics.turn_latency.observe(latency)
            text = dump(turn)
            live.feed.publish(text)
            if stream is not None:
                self._send(stream, text)
        elif event.source.channel_type == "chat":
            speaker = await self.kit.label_for(event.room_id, event)
            live.feed.publish(
                dump(
                    ChatMessage(
                        room=event.room_id,
                        speaker=speaker,
                        text=event.text,
                        participant=event.source.participant_id,
                        channel=event.source.channel_id,
                        event_id=event.id,
                    )
                )
            )
        elif event.source.channel_type in ("realtime", "ai"):
            self.metrics.replies_total += 1
            text = dump(ReplyMessage(room=event.room_id, text=event.text, event_id=event.id))
            live.feed.publish(text)
            for stream in list(live.streams.values()):
                self._send(stream, text)

    def _send(self, stream: LiveStream, message: Outgoing) -> None:
        if not stream.send(message):
            self.metrics.stream_messages_dropped_total += 1

    def play_reply(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        live = self.rooms.get(room_id)
        if live is None:
            return
        for stream in list(live.streams.values()):
            for message in stream.reply_audio(pcm16, sample_rate):
                self._send(stream, message)

    def _stream_of_value(self, value: Any, ctx: HookContext) -> LiveStream | None:
        """The stream a voice hook value (`TranscriptionEvent`, `SpeakerChangeEvent`) came from."""
        session = getattr(getattr(value, "session", None), "id", None)
        if session is None:
            session = ctx.extra.get("voice_session_id")
        return self._sessions.get(str(session)) if session is not None else None

    async def _stt_status(self, session: VoiceSession, status: SttStatus) -> None:
        """A stream's STT connection changed state (issue 10.1): count it, and tell the stream's
        device (a phone leg has no message for it; its count still shows in `/metrics`)."""
        if isinstance(status, SttDegraded):
            self.metrics.stt_outages_total += 1
            message = SttStatusMessage(stream="", status="degraded", reason=status.reason)
        elif isinstance(status, SttRecovered):
            self.metrics.stt_recoveries_total += 1
            message = SttStatusMessage(stream="", status="recovered")
        elif isinstance(status, AudioLost):
            self.metrics.stt_audio_lost_seconds_total += status.seconds
            message = SttStatusMessage(
                stream="", status="audio_lost", start=status.start, end=status.end
            )
        else:
            self.metrics.stt_stream_errors_total += 1
            message = SttStatusMessage(stream="", status="ended", reason=status.message)
        stream = self._sessions.get(session.id)
        if stream is None:
            return
        log.warning("stream %s: STT %s %s", stream.id, message.status, message.reason or "")
        if stream.kind == "device":
            self._send(stream, dump(message.model_copy(update={"stream": stream.id})))

    def _speaker_changed(self, value: Any, ctx: HookContext) -> None:
        live = self.rooms.get(ctx.room_id)
        if live is None:
            return
        stream = self._stream_of_value(value, ctx)
        previous = getattr(value, "previous_speaker", None)
        if stream is not None and not stream.info.shared_mic:
            if previous is not None:
                return  # one person per stream: only its first turn is a change
            speaker = stream.info.name or stream.info.participant
        else:
            speaker = getattr(value, "sender_name", None) or getattr(value, "speaker", None) or "?"
        message = SpeakerChangeMessage(
            room=ctx.room_id,
            speaker=str(speaker),
            previous=str(previous) if previous is not None else None,
            is_new_speaker=bool(getattr(value, "is_new_speaker", False)),
            participant=getattr(value, "participant_id", None) or ctx.participant_id,
            stream=stream.id if stream else None,
        )
        self.metrics.speaker_changes_total += 1
        text = dump(message)
        live.feed.publish(text)
        if stream is not None:
            self._send(stream, text)

    # ------------------------------------------------------------------ renames

    def rename(self, room_id: str, label: str, name: str, stream_id: str | None = None) -> None:
        """From now on turns of `label` (in `stream_id`, or any stream) read `name` (V6 path)."""
        live = self.rooms.get(room_id)
        if live is None:
            return
        stream = live.streams.get(stream_id) if stream_id is not None else None
        if stream is not None and not stream.info.shared_mic:
            live.renames[(stream.id, ONE_PERSON)] = name  # one voice, whatever its label
            live.participant_names[stream.info.participant] = name
        else:
            live.renames[(stream_id, label)] = name
        if stream_id is None or (stream is not None and not stream.info.shared_mic):
            self._save_renames(live)
        live.feed.publish(
            dump(RenamedMessage(room=room_id, label=label, name=name, stream=stream_id))
        )

    def _apply_rename(self, value: Any, ctx: HookContext) -> HookResult[Any] | None:
        """ON_TRANSCRIPTION: page renames, and one-person streams named by their participant."""
        live = self.rooms.get(ctx.room_id)
        if live is None:
            return None
        stream = self._stream_of_value(value, ctx)
        label = str(getattr(value, "speaker", None))
        name: str | None = None
        if stream is not None:
            name = live.renames.get((stream.id, label))
        if name is None:
            name = live.renames.get((None, label))
        if stream is not None and not stream.info.shared_mic:
            # One person per stream (a phone leg): whatever labels the STT put on the voice,
            # the turn is the participant's. Unless renamed, no stamped name: the participant
            # record names it (B2).
            name = live.renames.get((stream.id, ONE_PERSON))
            if name is None:  # renamed in an earlier stream (or before a restart)
                name = live.participant_names.get(stream.info.participant)
            if name == getattr(value, "sender_name", None):
                return None
            return HookResult.modify(dataclasses.replace(value, sender_name=name))
        if name is None or name == getattr(value, "sender_name", None):
            return None
        return HookResult.modify(dataclasses.replace(value, sender_name=name))

    RENAMES_KEY: ClassVar[str] = "server.renames"

    async def _load_renames(self, live: LiveRoom) -> None:
        saved = await self.kit.store.get_memory_state(live.room_id, self.RENAMES_KEY) or {}
        labels = saved.get("labels", {})
        people = saved.get("participants", {})
        if isinstance(labels, dict):
            for label, name in labels.items():
                live.renames[(None, str(label))] = str(name)
        if isinstance(people, dict):
            live.participant_names.update({str(k): str(v) for k, v in people.items()})

    def _save_renames(self, live: LiveRoom) -> None:
        """Keep the room's lasting renames in the store (in order: the last rename wins)."""
        lock = self._save_locks.setdefault(live.room_id, asyncio.Lock())

        async def save() -> None:
            async with lock:
                value = {
                    "labels": {label: n for (sid, label), n in live.renames.items() if sid is None},
                    "participants": dict(live.participant_names),
                }
                try:
                    await self.kit.store.put_memory_state(live.room_id, self.RENAMES_KEY, value)
                except Exception:
                    log.exception("keeping the renames of room %s failed", live.room_id)

        task = asyncio.get_running_loop().create_task(save(), name=f"chorus-renames-{live.room_id}")
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    # ------------------------------------------------------------------ shutdown

    async def close(self) -> None:
        sweeper, self._sweeper = self._sweeper, None
        if sweeper is not None:
            sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sweeper
        for live in list(self.rooms.values()):
            for stream in list(live.streams.values()):
                await self.close_stream(stream)
        if self._saves:
            await asyncio.gather(*list(self._saves), return_exceptions=True)
        await self.kit.close()
        await self.pipeline.close()
