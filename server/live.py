"""Live rooms: the registry of what the server holds per room while its sockets are connected.

Owns one `RoomKit` for the whole server, a room per room id (created on first use, with the
pipeline's channels, the server's output and the chat input attached), the streams open in each
room and their limits, each room's feed consumers, and idle eviction. What the rooms say goes out
through `server.output` (turns, replies, speaker changes, STT status), and renames through
`server.renames`; both read the registry's `rooms` and its open streams and never change them.

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
commit order with the turns (server.chat). Both routes take the typist's id from the token
(`server.chat.typist_id`) and a token from `chat_limit` first.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable

from models import InboundMessage, RoomEvent, TextContent
from rooms import HookContext, HookTrigger, RoomKit, VoiceStore
from server.chat import ChatInput, ChatRateLimit
from server.config import ConfigError, ServerConfig
from server.feed import FeedConsumer, RoomFeed
from server.framing import Outgoing, StreamDeclaration, StreamKind
from server.metrics import ServerMetrics
from server.output import ServerOutput
from server.overload import DiarizationDegraded, DiarizationRecovered
from server.pipeline import Pipeline, StreamInfo, StreamStatus
from server.protocol import DtmfMessage, ReplyStoppedMessage, dump
from server.renames import RoomRenames
from server.room_state import KeyLock, LiveRoom, LiveStream, StreamPacer, held
from server.voices import Unnamed, VoiceDirectory

log = logging.getLogger(__name__)


class StreamLimitError(Exception):
    """No room for another stream (server-wide or in this room)."""


class LiveRooms:
    """The server's rooms and their open streams: `room(id)`, `open_stream`, `push_audio`,
    `close_stream`, `subscribe`, `evict`, `delete`, `post_message`."""

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
        self._sessions: dict[str, LiveStream] = {}
        """Open streams by the `voice_session_id` their turns carry."""
        self.output = ServerOutput(self.rooms, self._sessions, metrics)
        """What the rooms say, to their feeds and streams (turns, replies, STT status)."""
        self.kit.register_channel(self.output)
        self.chat = ChatInput()
        """Typed messages (`post_message`) enter every room through this channel."""
        self.kit.register_channel(self.chat)
        self.chat_limit = ChatRateLimit(config.limits.chat_burst, config.limits.chat_rate)
        """Typed messages per room and client (`limits.chat_burst`, `limits.chat_rate`)."""
        self.renames = RoomRenames(self.kit, self.rooms, self._sessions)
        """Renames from the feed (`rename`), applied to turns by an ON_TRANSCRIPTION hook."""
        self.output.suggest = self.renames.suggest  # what introductions suggest
        self.voices: VoiceDirectory | None = None
        """The voice directory (`[voices] enabled`), naming voices through the rename hook."""
        if config.voices.enabled:
            store = self.kit.store
            if not isinstance(store, VoiceStore):
                raise ConfigError(
                    f"voices.enabled: the {type(store).__name__} store cannot keep voices")
            self.voices = VoiceDirectory(
                store, config.voices, self.renames.suggest, on_change=self._voices_changed
            )
            self.renames.voices = self.voices
            voices = self.voices
            metrics.voice_turns = lambda: (voices.turns_unmatched, voices.turns_claimed)
        self._room_locks: dict[str, KeyLock] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._stream_count = 0
        self._serial = itertools.count(1)
        self.kit.hooks.add(
            HookTrigger.ON_TRANSCRIPTION, self.renames.apply, priority=1000, name="server-rename"
        )
        self.kit.hooks.add(
            HookTrigger.ON_SPEAKER_CHANGE, self.output.speaker_changed, name="server-speaker-change"
        )
        self.kit.hooks.add(
            HookTrigger.ON_AGENT_STATUS, self.output.agent_status, name="server-agent-status"
        )

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
            await self.renames.load(live)
            self.rooms[room_id] = live
            return live

    @contextlib.asynccontextmanager
    async def _room_lock(self, room_id: str) -> AsyncIterator[None]:
        """The server's lock for creating and evicting one room. Its entry lives only while
        someone holds or waits for it, so the map does not grow with every room ever seen."""
        async with held(self._room_locks, room_id):
            yield

    # ------------------------------------------------------------------ idle rooms

    async def load_voices(self) -> None:
        """Read the voice directory from the store (`[voices] enabled`; before streams open)."""
        if self.voices is not None:
            await self.voices.load()

    async def forget_voice(self, voice_id: str) -> bool:
        """Delete a remembered person from the store and from every open stream at once: what
        its voice named (and the renames `remember` made) read as letters from the next turn
        (`_voices_changed`, as for a forget another process made)."""
        assert self.voices is not None
        gone, _ = await self.voices.forget(voice_id)
        return gone

    def _voices_changed(self, unnamed: list[Unnamed]) -> None:
        """The directory changed (here, or in another process on the store): the renames of the
        voices a forgotten person named go, and every open stream's stage hears the people as
        they are now."""
        for stream, label, name in unnamed:
            self.renames.unname(stream.room_id, stream.id, label, name)
        self.reanchor()

    def reanchor(self) -> None:
        """Every open stream's stage hears the directory's people as they are now."""
        if self.voices is None:
            return
        voices = self.voices
        for stream in list(self._sessions.values()):
            if stream.audio is not None:
                stream.audio.anchor(functools.partial(voices.anchors_for, stream=stream))

    def start(self) -> None:
        """Start evicting idle rooms (`limits.idle_room_seconds`; 0: never) and following the
        voice directory's changes made by other processes (`[voices] refresh_s`). Needs the
        loop."""
        idle = self.config.limits.idle_room_seconds
        if self.voices is not None:  # another process's changes to the directory
            self.voices.start()
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
        consumer = live.feed.subscribe()
        replayed = set(list(live.feed.history)[-live.feed.queue_size :])  # (what it was sent)
        for text in live.agents_away.values():  # a model away since before the recent history
            if text not in replayed:
                with contextlib.suppress(asyncio.QueueFull):
                    consumer.queue.put_nowait(text)
        return consumer

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
        declaration: StreamDeclaration,
        reply_audio: Callable[[bytes, int], list[Outgoing]],
        stop_reply: Callable[[Outgoing], list[Outgoing]] = lambda stopped: [],
    ) -> LiveStream:
        """Open a declared stream in the room (created if need be), within the stream limits
        (`StreamLimitError`); its STT status reaches `server.output` through its own callback."""
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
            declaration=declaration,
        )
        stream = LiveStream(
            info=info,
            kind=kind,
            reply_audio=reply_audio,
            stop_reply=stop_reply,
            pacer=StreamPacer(
                limits.max_stream_rate, limits.stream_burst_s, limits.max_throttled_s
            ),
        )
        live.streams[stream.id] = stream
        live.touch()

        async def on_status(status: StreamStatus) -> None:
            if isinstance(status, DiarizationDegraded | DiarizationRecovered):
                await self.output.diarization_status(stream, status)
            else:
                await self.output.stt_status(stream, status)

        try:
            stream.audio = await self.pipeline.open_stream(self.kit, info, on_status)
        except BaseException:
            live.streams.pop(stream.id, None)
            live.touch()
            self._stream_count -= 1
            raise
        self._sessions[stream.audio.session_id] = stream
        if self.voices is not None:  # the directory's people, kept apart from the first window
            voices = self.voices
            stream.audio.anchor(voices.anchors_for)
        self.metrics.streams_active[kind] += 1
        self.metrics.streams_total[kind] += 1
        live.feed.publish(stream.event_message("stream_started"))
        return stream

    async def push_audio(self, stream: LiveStream, pcm_or_mulaw: bytes) -> None:
        """Admit a piece of the stream's audio (whole samples) under its rate cap; it reaches
        the pipeline once `limits.min_push_ms` of audio has gathered. Raises
        `StreamTooFastError` for a stream that stays over the cap."""
        self.metrics.audio_seconds_total += await stream.admit(pcm_or_mulaw)
        fmt = stream.declaration.format
        min_bytes = int(self.config.limits.min_push_ms / 1000 * fmt.sample_rate)
        if len(stream.pending) >= min_bytes * fmt.bytes_per_frame:
            await stream.push_pending()

    async def close_stream(self, stream: LiveStream) -> None:
        """Flush the stream's last turns, then forget it. Safe to call once per stream."""
        live = self.rooms.get(stream.room_id)
        try:
            if stream.audio is not None:
                await stream.push_pending()
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
                live.feed.publish(stream.event_message("stream_stopped"))

    def stop_reply(self, room_id: str, by: str | None) -> None:
        """Someone in the room talked over the assistant's reply (stream `by`: a phone
        caller's barge-in, or a device that stopped it): the reply stops for the whole room,
        not only for whoever talked. The rest of the response is not played and the room's
        microphones are no longer silenced for it (`Pipeline.stop_reply`); every stream drops
        what it holds of it and tells its peer to (`LiveStream.stop_reply`: a device and the
        feed hear `reply_stopped`, another Twilio leg `clear`); the stream that talked over it
        (a device that stopped it itself, a phone leg whose barge-in rule heard its caller) is
        heard again at once, its held-back half second included (`StreamAudio.reply_stopped`)."""
        self.pipeline.stop_reply(room_id)
        live = self.rooms.get(room_id)
        if live is None:
            return
        stopped = dump(ReplyStoppedMessage(room=room_id, stream=by))
        live.feed.publish(stopped)
        for stream in list(live.streams.values()):
            for message in stream.stop_reply(stopped):
                stream.send(message)
            if stream.id == by and stream.audio is not None:  # a device, or a phone leg
                stream.audio.reply_stopped()

    def answer_barge_in(self, room_id: str, stream_id: str) -> None:
        """A device's `barge_in` that stopped nothing (no reply was playing any more) is
        answered `reply_stopped` all the same, on that stream only."""
        live = self.rooms.get(room_id)
        stream = live.streams.get(stream_id) if live is not None else None
        if stream is not None:
            stream.send(dump(ReplyStoppedMessage(room=room_id, stream=stream_id)))

    def _stream(self, stream_id: str) -> LiveStream | None:
        return next(
            (s for live in self.rooms.values() for s in live.streams.values() if s.id == stream_id),
            None,
        )

    def publish_dtmf(self, stream: LiveStream | str, digit: str) -> None:
        """A caller's DTMF digit on a phone leg, to its room's feed (`dtmf`) and its hooks
        (`HookTrigger.ON_DTMF` observers, the `DtmfMessage` as value)."""
        if isinstance(stream, str):
            found = self._stream(stream)
            if found is None:
                return
            stream = found
        live = self.rooms.get(stream.room_id)
        if live is None:
            return
        self.metrics.dtmf_total += 1
        message = DtmfMessage(
            room=stream.room_id,
            stream=stream.id,
            participant=stream.declaration.participant,
            digit=digit,
        )
        live.feed.publish(dump(message))
        context = HookContext(
            room_id=stream.room_id,
            channel_id=None,
            kit=self.kit,
            participant_id=stream.declaration.participant,
        )
        self.kit.hooks.emit(HookTrigger.ON_DTMF, message, context)

    # ------------------------------------------------------------------ chat

    async def post_message(
        self, room_id: str, participant: str, name: str | None, text: str
    ) -> RoomEvent | None:
        """A message typed into the room (server.chat) as `participant`, the id the token
        allows (`server.chat.typist_id`: its `sub`, or a `chat:` id): the participant is recorded
        on the chat channel (its first name stays; B2 names the turn), then the text is committed
        as a turn of the chat channel. None when a hook blocked it."""
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

    def rename(self, room_id: str, label: str, name: str, stream_id: str | None = None) -> None:
        """From now on turns of `label` (in `stream_id`, or any stream) read `name` (V6 path)."""
        self.renames.rename(room_id, label, name, stream_id)

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
        await self.renames.flush()
        if self.voices is not None:  # its "last heard" writes in flight, before the store closes
            await self.voices.close()
        await self.kit.close()
        await self.pipeline.close()
