"""A local server that speaks the OpenAI Realtime GA wire protocol (websockets on 127.0.0.1).

Why: tests drive the real `openai` realtime client (`AsyncOpenAI(base_url=server.base_url)
.realtime.connect(model=…)`) against something that answers like the service, without a key or a
network. It parses every client event with `realtime.openai_wire` (the models the client sends
with), logs each connection's events in order, answers with the real server events
(`session.created`, `session.updated`, `conversation.item.added`/`done`,
`input_audio_buffer.committed`, `response.created`, `response.output_audio.delta`,
`response.output_audio_transcript.delta`/`done`, `response.done`), refuses a second
`response.create` while one is active with the service's `conversation_already_has_active_response`
error, and can be told to drop a connection (now, or right after a given client event) or to hang
a response (`hang_responses(n)`: `response.created`, then never a `response.done`). It honours
`response.cancel` as the service does: the active response ends with a `response.done` whose
status is `cancelled` (`status_details.reason` `client_cancelled`), or an error
`response_cancel_not_active` when nothing (or not the named response) is active;
`cancel_done_delay` makes that `response.done` arrive late, as a slow or misbehaving provider's
would.

Test helpers read like the behaviour: `lines_sent(server)` is the text of every user item the
latest connection received, `types_sent(server)` the event types in order.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import struct
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from realtime.openai_wire import (
    ACTIVE_RESPONSE_CODE,
    OUTPUT_SAMPLE_RATE,
    ConversationItemAdded,
    ConversationItemCreate,
    ConversationItemCreated,
    ConversationItemDone,
    ConversationItemTruncate,
    ConversationItemTruncated,
    ErrorDetail,
    ErrorEvent,
    InputAudioBufferAppend,
    InputAudioBufferClear,
    InputAudioBufferCleared,
    InputAudioBufferCommit,
    InputAudioBufferCommitted,
    InputAudioPart,
    MessageItem,
    OutputAudioPart,
    ResponseCancel,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseInfo,
    ResponseOutputAudioDelta,
    ResponseOutputAudioDone,
    ResponseOutputAudioTranscriptDelta,
    ResponseOutputAudioTranscriptDone,
    SessionCreated,
    SessionUpdate,
    SessionUpdated,
    new_id,
    parse_client_event,
    server_event_wire,
)

ReplyScript = Callable[["RealtimeConnectionLog"], str]


@dataclass
class RealtimeConnectionLog:
    """What one client connection sent, in order, and what the server made of it."""

    index: int
    path: str
    model: str | None
    headers: dict[str, str]
    events: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    session: dict[str, Any] = field(default_factory=dict)
    audio_bytes_committed: list[int] = field(default_factory=list)
    reply_audio_bytes: int = 0
    """Reply audio (pcm16) sent to the client in `response.output_audio.delta` events."""
    opened: float = 0.0
    """When the client connected (`time.monotonic()`)."""
    done_at: list[float] = field(default_factory=list)
    """When each completed response's `response.done` went out (`time.monotonic()`)."""

    @property
    def types(self) -> list[str]:
        return [str(e.get("type")) for e in self.events]

    @property
    def user_lines(self) -> list[str]:
        """The text of every user `input_text` item created on this connection, in order."""
        out: list[str] = []
        for e in self.events:
            if e.get("type") != "conversation.item.create":
                continue
            item = e.get("item") or {}
            if item.get("role") != "user":
                continue
            for part in item.get("content") or []:
                if part.get("type") == "input_text":
                    out.append(part.get("text", ""))
        return out


def _tone(seconds: float, rate: int = OUTPUT_SAMPLE_RATE, hz: float = 440.0) -> bytes:
    n = int(seconds * rate)
    return struct.pack(
        f"<{n}h", *(int(3000 * math.sin(2 * math.pi * hz * i / rate)) for i in range(n))
    )


def _voice(pcm16: bytes, seconds: float, rate: int = OUTPUT_SAMPLE_RATE) -> bytes:
    """`seconds` of `pcm16` from its start, repeated as often as needed."""
    n = int(seconds * rate) * 2
    return (pcm16 * (n // max(len(pcm16), 1) + 1))[:n]


class OpenAIRealtimeServer:
    """`async with OpenAIRealtimeServer() as server:` then point `AsyncOpenAI(base_url=server.base_url)`.

    - `replies`: transcripts for successive responses (then `reply_script`, then `"Reply N"`).
    - `response_delay`: seconds a response stays active before `response.done` (so a second
      `response.create` can be seen colliding with it).
    - `item_events`: `("added", "done")` (GA, default) or `("created",)` (the pre-GA name).
    - `api_key`: when set, a connection without `Authorization: Bearer <api_key>` is refused.
    - `cancel_done_delay`: seconds between a `response.cancel` and the cancelled response's
      `response.done` (the service answers at once; the response stops being active at once).
    - `conversation.item.truncate` of an assistant item is taken up to the audio sent for it
      (`truncated` lists them) and answered `conversation.item.truncated`; past it, or for an
      item it does not know, an `invalid_request_error` ("Audio content of … is already shorter
      than …", as the service words it).
    - `session_seconds`: each session ends that long after it opened, as the service ends one
      at its maximum duration: `session.created` carries `expires_at` (whole seconds since the
      epoch, rounded up), and then an `error` `session_expired` is sent and the connection
      closed (1001, "going away"); `expired` lists the connections it ended.
    - `audio_pace`: 0 sends a response's audio at once; otherwise its 50 ms deltas come at
      `audio_pace` times real time (1.0: as fast as it plays), as the service makes audio as it
      goes, so the response is still active (and can be cancelled) while its audio plays.
    """

    def __init__(
        self,
        *,
        replies: Sequence[str] = (),
        reply_script: ReplyScript | None = None,
        response_delay: float = 0.0,
        reply_audio_seconds: float = 0.1,
        item_events: tuple[str, ...] = ("added", "done"),
        api_key: str | None = None,
        cancel_done_delay: float = 0.0,
        audio_pace: float = 0.0,
        reply_voice: bytes | None = None,
        session_seconds: float | None = None,
    ) -> None:
        self.replies = list(replies)
        self.session_seconds = session_seconds
        self.expired: list[int] = []
        """Indexes of the connections the server ended at their `expires_at`."""
        self.reply_voice = reply_voice
        """pcm16 at 24 kHz each reply's audio is taken from (from its start, repeated to
        `reply_audio_seconds`) instead of a tone: a voice, for an echo of the reply."""
        self.cancel_done_delay = cancel_done_delay
        self.audio_pace = audio_pace
        self._hang = 0
        self.hung: list[str] = []
        """Ids of the responses left hanging, in order."""
        self.cancelled: list[str] = []
        """Ids of the responses ended by `response.cancel`, in order."""
        self.truncated: list[tuple[str, int]] = []
        """(item id, `audio_end_ms`) of each `conversation.item.truncate` taken, in order."""
        self.reply_script = reply_script
        self.response_delay = response_delay
        self.reply_audio_seconds = reply_audio_seconds
        self.item_events = item_events
        self.api_key = api_key
        self.connections: list[RealtimeConnectionLog] = []
        self.refused: list[str] = []
        self._server: Server | None = None
        self._live: dict[int, ServerConnection] = {}
        self._drop_rules: list[tuple[int, str | None]] = []
        self._responses = 0
        self._refuse = 0
        self._refuse_responses: list[str] = []
        self.port = 0

    # ------------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> OpenAIRealtimeServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        self._server = await serve(
            self._handle,
            "127.0.0.1",
            0,
            max_size=16 * 1024 * 1024,
            process_request=self._process_request,
        )
        sock = next(iter(self._server.sockets))
        self.port = int(sock.getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
            self._server = None

    @property
    def base_url(self) -> str:
        """What `AsyncOpenAI(base_url=…)` takes: the client derives `ws://…/v1/realtime` from it."""
        return f"http://127.0.0.1:{self.port}/v1"

    # ------------------------------------------------------------------ drops

    def drop(self) -> None:
        """Drop every open connection now, as a network failure would (no close frame)."""
        for ws in list(self._live.values()):
            ws.transport.abort()

    async def close_connections(self, code: int = 1008, reason: str = "policy violation") -> None:
        """Close every open connection with a close frame (1008: the service refuses to go on
        with the session, as it does on a policy violation)."""
        for ws in list(self._live.values()):
            await ws.close(code, reason)

    def refuse_connections(self, count: int) -> None:
        """Answer the next `count` connection attempts with HTTP 503 (the service is away)."""
        self._refuse += count

    def accept_connections(self) -> None:
        """The service is back: connection attempts are accepted again from now on."""
        self._refuse = 0

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        if (
            self.api_key is not None
            and request.headers.get("Authorization") != f"Bearer {self.api_key}"
        ):
            self.refused.append("authorization")
            return connection.respond(
                HTTPStatus.UNAUTHORIZED,
                json.dumps(
                    {
                        "error": {
                            "type": "invalid_request_error",
                            "code": "invalid_api_key",
                            "message": "Incorrect API key provided.",
                        }
                    }
                ),
            )
        if self._refuse > 0:
            self._refuse -= 1
            self.refused.append("unavailable")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "Service Unavailable\n")
        return None

    def hang_responses(self, count: int) -> None:
        """The next `count` responses start (`response.created`) and then never finish: no
        output, no `response.done`, until the client cancels them."""
        self._hang += count

    def refuse_responses(self, count: int, code: str = "rate_limit_exceeded") -> None:
        """Refuse the next `count` `response.create` events with an `error` naming them."""
        self._refuse_responses += [code] * count

    async def send_raw(self, data: str | bytes) -> None:
        """Send a raw message (malformed on purpose, say) to every open connection."""
        for ws in list(self._live.values()):
            await ws.send(data)

    def drop_after(self, count: int, event_type: str | None = None) -> None:
        """Drop a connection right after it receives its `count`-th event (of `event_type`)."""
        self._drop_rules.append((count, event_type))

    async def wait_for(
        self, predicate: Callable[[OpenAIRealtimeServer], bool], limit: float = 5.0
    ) -> None:
        """Wait until `predicate(self)` holds (the client runs on the same loop)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while not predicate(self):
            if loop.time() > deadline:
                raise TimeoutError("the realtime server did not reach the expected state")
            await asyncio.sleep(0.01)

    @property
    def latest(self) -> RealtimeConnectionLog:
        if not self.connections:
            raise LookupError("no client has connected")
        return self.connections[-1]

    # ------------------------------------------------------------------ protocol

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        parts = urlsplit(request.path)
        query = parse_qs(parts.query)
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        if not parts.path.rstrip("/").endswith("/realtime"):
            self.refused.append(f"path {parts.path}")
            await ws.close(1008, "unknown path")
            return
        models = query.get("model") or []
        model = models[0] if models else None
        log = RealtimeConnectionLog(
            index=len(self.connections), path=parts.path, model=model, headers=headers,
            opened=time.monotonic(),
        )  # fmt: skip
        log.session = {
            "type": "realtime",
            "object": "realtime.session",
            "id": new_id("sess"),
            "model": model,
            "output_modalities": ["audio"],
            "instructions": "",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "turn_detection": {"type": "server_vad"},
                },
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "marin"},
            },
        }
        expiry: asyncio.Task[None] | None = None
        if self.session_seconds is not None:
            expires_at = math.ceil(time.time() + self.session_seconds)
            log.session["expires_at"] = expires_at
            expiry = asyncio.create_task(self._expire_at(ws, log, expires_at))
        self.connections.append(log)
        self._live[log.index] = ws
        state = _ConnectionState()
        try:
            await self._send(ws, SessionCreated(event_id=new_id("event"), session=log.session))
            async for raw in ws:
                if not await self._on_message(ws, log, state, raw):
                    break  # dropped: what the client sent after this never arrived
        except ConnectionClosed:
            pass
        finally:
            self._live.pop(log.index, None)
            if expiry is not None:
                expiry.cancel()
            if state.response_task is not None:
                state.response_task.cancel()
            for task in state.late:
                task.cancel()

    async def _expire_at(
        self, ws: ServerConnection, log: RealtimeConnectionLog, expires_at: int
    ) -> None:
        """The session's maximum duration: what the service sends at `expires_at`."""
        await asyncio.sleep(max(0.0, expires_at - time.time()))
        message = (f"Your session hit the maximum duration of "
                   f"{(self.session_seconds or 0) / 60:g} minutes.")  # fmt: skip
        with contextlib.suppress(ConnectionClosed):
            await self._error(ws, log, message, code="session_expired")
            self.expired.append(log.index)
            await ws.close(1001, message[:120])

    async def _send(self, ws: ServerConnection, event: Any) -> None:
        await ws.send(server_event_wire(event))

    async def _error(
        self,
        ws: ServerConnection,
        log: RealtimeConnectionLog,
        message: str,
        *,
        code: str | None = None,
        client_event_id: str | None = None,
        param: str | None = None,
    ) -> None:
        detail = ErrorDetail(
            type="invalid_request_error",
            code=code,
            message=message,
            param=param,
            event_id=client_event_id,
        )
        log.errors.append(detail.model_dump())
        await self._send(ws, ErrorEvent(event_id=new_id("event"), error=detail))

    def _should_drop(self, log: RealtimeConnectionLog, kind: str) -> bool:
        for count, event_type in self._drop_rules:
            seen = sum(1 for t in log.types if event_type is None or t == event_type)
            if (event_type is None or kind == event_type) and seen == count:
                self._drop_rules.remove((count, event_type))
                return True
        return False

    async def _on_message(
        self,
        ws: ServerConnection,
        log: RealtimeConnectionLog,
        state: _ConnectionState,
        raw: str | bytes,
    ) -> bool:
        """Handle one client message; False when the connection was dropped."""
        await self._handle_message(ws, log, state, raw)
        return not state.dropped

    async def _handle_message(
        self,
        ws: ServerConnection,
        log: RealtimeConnectionLog,
        state: _ConnectionState,
        raw: str | bytes,
    ) -> None:
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            await self._error(ws, log, "The message is not valid JSON.")
            return
        if isinstance(obj, dict):
            log.events.append(obj)
        try:
            event = parse_client_event(obj)
        except ValueError as exc:
            client_id = obj.get("event_id") if isinstance(obj, dict) else None
            await self._error(ws, log, f"Invalid client event: {exc}", client_event_id=client_id)
            return
        if self._should_drop(log, event.type):
            state.dropped = True
            ws.transport.abort()
            return
        if isinstance(event, SessionUpdate):
            update = event.session.model_dump(mode="json", exclude_unset=True)
            _merge(log.session, update)
            await self._send(ws, SessionUpdated(event_id=new_id("event"), session=log.session))
        elif isinstance(event, ConversationItemCreate):
            item = event.item.model_copy(
                update={
                    "id": event.item.id or new_id("item"),
                    "object": "realtime.item",
                    "status": "completed",
                }
            )
            await self._announce_item(ws, state, item)
        elif isinstance(event, InputAudioBufferAppend):
            try:
                state.audio.extend(base64.b64decode(event.audio, validate=True))
            except ValueError:
                await self._error(
                    ws, log, "Invalid base64 audio.", client_event_id=event.event_id, param="audio"
                )
        elif isinstance(event, InputAudioBufferCommit):
            if not state.audio:
                await self._error(
                    ws,
                    log,
                    "Error committing input audio buffer: buffer too small. Expected at least "
                    "100ms of audio, but buffer only has 0.00ms of audio.",
                    code="input_audio_buffer_commit_empty",
                    client_event_id=event.event_id,
                )
                return
            log.audio_bytes_committed.append(len(state.audio))
            state.audio.clear()
            item_id = new_id("item")
            await self._send(
                ws,
                InputAudioBufferCommitted(
                    event_id=new_id("event"), item_id=item_id, previous_item_id=state.last_item
                ),
            )
            item = MessageItem(
                id=item_id,
                object="realtime.item",
                status="completed",
                role="user",
                content=[InputAudioPart(transcript=None)],
            )
            await self._announce_item(ws, state, item)
        elif isinstance(event, InputAudioBufferClear):
            state.audio.clear()
            await self._send(ws, InputAudioBufferCleared(event_id=new_id("event")))
        elif isinstance(event, ResponseCreate):
            if self._refuse_responses:
                await self._error(
                    ws,
                    log,
                    "The response could not be created.",
                    code=self._refuse_responses.pop(0),
                    client_event_id=event.event_id,
                )
                return
            if state.active_response is not None:
                await self._error(
                    ws,
                    log,
                    f"Conversation already has an active response in progress: "
                    f"{state.active_response}. Wait until the response is finished before "
                    f"creating a new one.",
                    code=ACTIVE_RESPONSE_CODE,
                    client_event_id=event.event_id,
                )
                return
            response_id = new_id("resp")
            state.active_response = response_id
            await self._send(
                ws,
                ResponseCreated(
                    event_id=new_id("event"),
                    response=ResponseInfo(
                        id=response_id, status="in_progress", output_modalities=["audio"]
                    ),
                ),
            )
            if self._hang > 0:
                self._hang -= 1
                self.hung.append(response_id)
                return  # active until cancelled: never a response.done
            state.response_task = asyncio.create_task(self._respond(ws, log, state, response_id))
        elif isinstance(event, ConversationItemTruncate):
            heard = state.item_audio_ms.get(event.item_id)
            if heard is None:
                await self._error(ws, log, f"Item with item_id not found: {event.item_id}",
                                  client_event_id=event.event_id)  # fmt: skip
                return
            if event.audio_end_ms > heard:  # the service's words for it
                await self._error(ws, log, f"Audio content of {heard:.0f}ms is already shorter "
                                  f"than {event.audio_end_ms}ms", client_event_id=event.event_id)  # fmt: skip
                return
            self.truncated.append((event.item_id, event.audio_end_ms))
            state.item_audio_ms[event.item_id] = float(event.audio_end_ms)
            await self._send(ws, ConversationItemTruncated(
                event_id=new_id("event"), item_id=event.item_id,
                content_index=event.content_index, audio_end_ms=event.audio_end_ms))  # fmt: skip
        elif isinstance(event, ResponseCancel):
            active = state.active_response
            if active is None or event.response_id not in (None, active):
                await self._error(
                    ws,
                    log,
                    "Cancellation failed: no active response found",
                    code="response_cancel_not_active",
                    client_event_id=event.event_id,
                )
                return
            if state.response_task is not None:
                state.response_task.cancel()
                state.response_task = None
            state.active_response = None
            self.cancelled.append(active)
            done = ResponseDone(
                event_id=new_id("event"),
                response=ResponseInfo(
                    id=active,
                    status="cancelled",
                    status_details={"type": "cancelled", "reason": "client_cancelled"},
                    output_modalities=["audio"],
                ),
            )
            if self.cancel_done_delay:
                state.late.append(
                    asyncio.create_task(self._send_late(ws, done, self.cancel_done_delay))
                )
            else:
                await self._send(ws, done)

    async def _announce_item(
        self, ws: ServerConnection, state: _ConnectionState, item: MessageItem
    ) -> None:
        previous = state.last_item
        state.last_item = item.id
        for kind in self.item_events:
            cls = {
                "added": ConversationItemAdded,
                "done": ConversationItemDone,
                "created": ConversationItemCreated,
            }[kind]
            await self._send(
                ws, cls(event_id=new_id("event"), item=item, previous_item_id=previous)
            )

    async def _send_late(self, ws: ServerConnection, event: Any, delay: float) -> None:
        await asyncio.sleep(delay)
        with contextlib.suppress(ConnectionClosed):
            await self._send(ws, event)

    def _next_reply(self, log: RealtimeConnectionLog) -> str:
        self._responses += 1
        if self.replies:
            return self.replies.pop(0)
        if self.reply_script is not None:
            return self.reply_script(log)
        return f"Reply {self._responses}"

    async def _transcript_delta(
        self, ws: ServerConnection, words: list[str], i: int, ids: dict[str, Any]
    ) -> None:
        piece = words[i] if i == 0 else " " + words[i]
        await self._send(
            ws, ResponseOutputAudioTranscriptDelta(event_id=new_id("event"), delta=piece, **ids)
        )

    async def _respond(
        self,
        ws: ServerConnection,
        log: RealtimeConnectionLog,
        state: _ConnectionState,
        response_id: str,
    ) -> None:
        try:
            if self.response_delay:
                await asyncio.sleep(self.response_delay)
            text = self._next_reply(log)
            item_id = new_id("item")
            ids = {
                "response_id": response_id,
                "item_id": item_id,
                "output_index": 0,
                "content_index": 0,
            }
            in_progress = MessageItem(
                id=item_id,
                object="realtime.item",
                status="in_progress",
                role="assistant",
                content=[],
            )
            await self._announce_item(ws, state, in_progress)
            audio = _voice(self.reply_voice, self.reply_audio_seconds) if self.reply_voice \
                else _tone(self.reply_audio_seconds)  # fmt: skip
            chunk = OUTPUT_SAMPLE_RATE // 20 * 2  # 50 ms
            starts = range(0, len(audio), chunk)
            words = text.split(" ")
            said = 0
            for n, start in enumerate(starts):
                if self.audio_pace and start:
                    await asyncio.sleep(0.05 / self.audio_pace)
                # the transcript runs a little ahead of the audio, as the service's does: the
                # words due by the end of this chunk go first (so a cancelled response has
                # the transcript of what it said by then)
                due = -(-len(words) * (n + 1) // len(starts))
                for i in range(said, due):
                    await self._transcript_delta(ws, words, i, ids)
                said = max(said, due)
                pcm = audio[start : start + chunk]
                delta = base64.b64encode(pcm).decode()
                await self._send(
                    ws, ResponseOutputAudioDelta(event_id=new_id("event"), delta=delta, **ids)
                )
                log.reply_audio_bytes += len(pcm)
                state.item_audio_ms[item_id] = (
                    state.item_audio_ms.get(item_id, 0.0) + len(pcm) / 2 / OUTPUT_SAMPLE_RATE * 1000
                )
            for i in range(said, len(words)):
                await self._transcript_delta(ws, words, i, ids)
            await self._send(ws, ResponseOutputAudioDone(event_id=new_id("event"), **ids))
            await self._send(
                ws,
                ResponseOutputAudioTranscriptDone(event_id=new_id("event"), transcript=text, **ids),
            )
            done_item = MessageItem(
                id=item_id,
                object="realtime.item",
                status="completed",
                role="assistant",
                content=[OutputAudioPart(transcript=text)],
            )
            state.active_response = None
            await self._send(
                ws,
                ResponseDone(
                    event_id=new_id("event"),
                    response=ResponseInfo(
                        id=response_id,
                        status="completed",
                        output=[done_item],
                        output_modalities=["audio"],
                    ),
                ),
            )
            log.done_at.append(time.monotonic())
        except ConnectionClosed:
            state.active_response = None


@dataclass
class _ConnectionState:
    audio: bytearray = field(default_factory=bytearray)
    active_response: str | None = None
    response_task: asyncio.Task[None] | None = None
    last_item: str | None = None
    item_audio_ms: dict[str, float] = field(default_factory=dict)
    """Each assistant item's audio sent so far, in ms (what a truncate may cut)."""
    dropped: bool = False
    late: list[asyncio.Task[None]] = field(default_factory=list)


def _merge(into: dict[str, Any], update: dict[str, Any]) -> None:
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


# ---------------------------------------------------------------------- test helpers


def lines_sent(server: OpenAIRealtimeServer, connection: int = -1) -> list[str]:
    """The text of every user item a connection (default: the latest) received, in order."""
    return server.connections[connection].user_lines


def types_sent(server: OpenAIRealtimeServer, connection: int = -1) -> list[str]:
    """The client event types a connection (default: the latest) received, in order."""
    return server.connections[connection].types


def events_sent(server: OpenAIRealtimeServer, connection: int = -1) -> list[dict[str, Any]]:
    return server.connections[connection].events
