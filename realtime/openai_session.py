"""OpenAI Realtime (GA) through the `openai` package's realtime client.

Only the wire loop lives here (the base class owns order, reconnect and one-response-at-a-time).
The connection is `AsyncOpenAI(api_key=…, base_url=…).realtime.connect(model=…)`; the client
derives `wss://…/v1/realtime?model=…` from the base URL (or `websocket_base_url`), so a local
server (`realtime.testing.OpenAIRealtimeServer`) or a proxy is reached by configuration alone.
The SDK's own reconnect is left off: after a drop the service holds an empty conversation, and
only the base class knows what to replay; it also renews a connection ahead of the `expires_at`
the service announces in `session.created` (`RealtimeSession.renew_before_s`). Client events are built from `realtime.openai_wire`
models (by `realtime.openai_events`, shared with the recorder) and sent as the JSON the SDK would
send; server events are parsed with the same models. The `openai` package is the `openai` extra.
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from openai import AsyncOpenAI, OpenAIError
from pydantic import BaseModel
from websockets.exceptions import ConnectionClosed

from realtime import openai_wire as wire
from realtime.openai_events import client_item_event, response_create_event, session_config
from realtime.session import (
    ContextItem,
    RealtimeSession,
    ReplyAudio,
    ReplyDone,
    ReplyStarted,
    ReplyTranscript,
    SessionDropped,
    SessionError,
    SessionEvent,
    SessionOptions,
    connect_error,
)

DEFAULT_MODEL = "gpt-realtime"


class _ReplyAssembler:
    """Turns OpenAI server events into the base class's reply events.

    Each reply event carries the number of the request it answers (the base class's
    `active_request` when its `response.create` was sent): the service answers `response.create`
    events in order, each with `response.created` or an `error` naming its `event_id`, so the
    oldest unanswered request is the one a `response.created` belongs to. That is how a late
    `response.done` of a cancelled response is told from the done of the newer one.
    """

    def __init__(self) -> None:
        self.transcripts: dict[str, list[str]] = {}
        self.finished: dict[str, str] = {}
        self.pending: dict[str, int | None] = {}
        """`event_id` → request number of each `response.create` not yet answered, in order."""
        self.requests: dict[str, int | None] = {}
        """Response id → request number, from `response.created` to `response.done`."""

    def sent_request(self, event_id: str, request: int | None) -> None:
        self.pending[event_id] = request

    def feed(self, event: wire.ServerEvent) -> list[SessionEvent]:
        if isinstance(event, wire.ResponseCreated):
            rid = event.response.id or ""
            request = None
            if self.pending:  # else a response the service started by itself
                request = self.pending.pop(next(iter(self.pending)))
            self.requests[rid] = request
            self.transcripts[rid] = []
            return [ReplyStarted(rid, request)]
        if isinstance(event, wire.ResponseOutputAudioDelta):
            try:
                pcm = base64.b64decode(event.delta, validate=True)
            except ValueError:
                return [SessionError("bad_audio", "reply audio delta is not base64")]
            return [ReplyAudio(event.response_id, pcm, wire.OUTPUT_SAMPLE_RATE, event.item_id)]
        if isinstance(
            event, wire.ResponseOutputAudioTranscriptDelta | wire.ResponseOutputTextDelta
        ):
            self.transcripts.setdefault(event.response_id, []).append(event.delta)
            return [ReplyTranscript(event.response_id, event.delta)]
        if isinstance(event, wire.ResponseOutputAudioTranscriptDone):
            self.finished[event.response_id] = event.transcript
            return []
        if isinstance(event, wire.ResponseOutputTextDone):
            self.finished[event.response_id] = event.text
            return []
        if isinstance(event, wire.ResponseDone):
            rid = event.response.id or ""
            text = self.finished.pop(rid, None)
            if text is None:
                text = "".join(self.transcripts.get(rid, []))
            if not text:
                text = "".join(
                    item.text for item in event.response.output if item.role == "assistant"
                )
            self.transcripts.pop(rid, None)
            request = self.requests.pop(rid, None)
            return [ReplyDone(rid, text, event.response.status or "completed", request)]
        if isinstance(event, wire.ErrorEvent):
            out: list[SessionEvent] = [SessionError(event.error.code, event.error.message)]
            refused = event.error.event_id
            if refused is not None and refused in self.pending:
                request = self.pending.pop(refused)
                if event.error.code != wire.ACTIVE_RESPONSE_CODE:
                    # The request was refused: no response will come for it.
                    out.append(ReplyDone("", "", "failed", request))
            return out
        return []


class OpenAIRealtimeSession(RealtimeSession):
    """`OpenAIRealtimeSession(model=…, api_key=…, base_url=…, options=SessionOptions(...))`.

    `api_key` and `base_url` default to `OPENAI_API_KEY` and `OPENAI_BASE_URL` (the `openai`
    client's own defaults); `websocket_base_url` overrides the websocket address alone.
    """

    provider = "openai"
    input_sample_rate = wire.INPUT_SAMPLE_RATE

    def __init__(
        self,
        options: SessionOptions | None = None,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        base_url: str | None = None,
        websocket_base_url: str | None = None,
        client: AsyncOpenAI | None = None,
        **reconnect: Any,
    ) -> None:
        super().__init__(options, **reconnect)
        self.model = model
        if client is None:
            key = api_key or os.environ.get("OPENAI_API_KEY")
            if not key:
                raise ValueError(
                    "the OpenAI realtime session needs an API key: pass api_key= or set "
                    "OPENAI_API_KEY (use provider='recorder' to run without one)"
                )
            client = AsyncOpenAI(
                api_key=key,
                base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
                websocket_base_url=websocket_base_url,
            )
        self.client = client
        self._conn: Any = None
        self._assembler = _ReplyAssembler()
        self._requests = 0

    async def _connect(self) -> None:
        try:
            self._conn = await self.client.realtime.connect(model=self.model).enter()
        except Exception as exc:  # OSError, OpenAIError, websockets' InvalidStatus, InvalidURI …
            raise connect_error(self.provider, exc) from exc
        self._assembler = _ReplyAssembler()

    async def _disconnect(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                await conn.close()
            except Exception:  # already gone
                pass

    async def _send(self, event: BaseModel) -> None:
        data = wire.client_event_wire(event)
        if self._conn is None:
            raise SessionDropped("not connected")
        try:
            await self._conn.send(data)
        except (ConnectionClosed, OSError, OpenAIError) as exc:
            raise SessionDropped(str(exc)) from exc
        self._record(data)

    async def _send_configure(self) -> None:
        await self._send(wire.SessionUpdate(session=session_config(self.options)))

    async def _send_item(self, item: ContextItem) -> None:
        await self._send(client_item_event(item))

    async def _send_audio(self, pcm16: bytes) -> None:
        chunk = self.input_sample_rate * 2  # one second per append, far below the 15 MiB cap
        for start in range(0, len(pcm16), chunk):
            audio = base64.b64encode(pcm16[start : start + chunk]).decode("ascii")
            await self._send(wire.InputAudioBufferAppend(audio=audio))

    async def _send_commit(self) -> None:
        await self._send(wire.InputAudioBufferCommit())

    async def _send_response_create(self) -> None:
        self._requests += 1
        event = response_create_event(self._requests)
        assert event.event_id is not None
        self._assembler.sent_request(event.event_id, self.active_request)
        await self._send(event)

    async def _send_cancel(self, response_id: str | None = None) -> None:
        """`response.cancel`, naming the response when it started (the service then answers
        with its `response.done`, status `cancelled`, or an error if it already ended)."""
        if response_id:
            await self._send(wire.ResponseCancel(response_id=response_id))
        else:
            await self._send(wire.ResponseCancel())

    async def _send_truncate(self, item_id: str, audio_end_ms: int) -> None:
        await self._send(wire.ConversationItemTruncate(item_id=item_id, audio_end_ms=audio_end_ms))

    def _session_created(self, session: dict[str, Any]) -> None:
        """The service ends a session at its `expires_at` (seconds since the epoch; 60 minutes
        after it opened, as of 2026): it sends an `error` (`session_expired`) and closes the
        connection, cutting off a reply in progress. The base class renews it ahead of that."""
        expires_at = session.get("expires_at")
        if isinstance(expires_at, int | float) and not isinstance(expires_at, bool):
            self._connection_ends_in(expires_at - time.time())

    async def _receive(self) -> AsyncIterator[SessionEvent]:
        conn = self._conn
        if conn is None:
            raise SessionDropped("not connected")
        while True:
            try:
                raw = await conn.recv_bytes()
            except (ConnectionClosed, OSError) as exc:
                if self._closing:
                    return
                raise connect_error(self.provider, exc) from exc
            try:
                event = wire.parse_server_event(raw)
            except ValueError as exc:
                yield SessionError("malformed_server_event", str(exc))
                continue
            if event is None:
                continue
            if isinstance(event, wire.SessionCreated):
                self._session_created(event.session)
            for out in self._assembler.feed(event):
                yield out
