"""The recorder session: records exactly what a realtime model would be sent, needs no key.

Why: the embedded default for demos (`make demo`, `chorus transcribe --realtime recorder`) and a
way to read, line by line, what a room hands a speech-to-speech model. It goes through the same
base class as the real providers and records the OpenAI Realtime GA client events the OpenAI
session would put on the wire (`session.update`, `conversation.item.create`,
`input_audio_buffer.append/commit`, `response.create`). There is no model behind it: each
`response.create` is answered at once with the next of `replies` (or an empty reply, which posts
nothing into the room), so the one-response-at-a-time rule sees the same lifecycle as with a model.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Sequence
from typing import Any

from pydantic import BaseModel

from realtime import openai_wire as wire
from realtime.openai_events import client_item_event, response_create_event, session_config
from realtime.session import (
    ContextItem,
    RealtimeSession,
    ReplyDone,
    ReplyStarted,
    ReplyTranscript,
    SessionEvent,
    SessionOptions,
)


class RecorderSession(RealtimeSession):
    provider = "recorder"
    input_sample_rate = wire.INPUT_SAMPLE_RATE

    def __init__(
        self,
        options: SessionOptions | None = None,
        *,
        replies: Sequence[str] = (),
        model: str = "recorder",
        **reconnect: Any,
    ) -> None:
        super().__init__(options, **reconnect)
        self.model = model
        self.replies = list(replies)
        self._events: asyncio.Queue[SessionEvent | None] = asyncio.Queue()
        self._open = False
        self._responses = 0

    @property
    def events(self) -> list[dict[str, Any]]:
        """Every client event recorded, in order (the wire JSON objects)."""
        return [sent.event for sent in self.sent]

    async def _connect(self) -> None:
        self._events = asyncio.Queue()
        self._open = True

    async def _disconnect(self) -> None:
        if self._open:
            self._open = False
            self._events.put_nowait(None)

    def _send(self, event: BaseModel) -> None:
        self._record(wire.client_event_wire(event))

    async def _send_configure(self) -> None:
        self._send(wire.SessionUpdate(session=session_config(self.options)))

    async def _send_item(self, item: ContextItem) -> None:
        self._send(client_item_event(item))

    async def _send_audio(self, pcm16: bytes) -> None:
        chunk = self.input_sample_rate * 2
        for start in range(0, len(pcm16), chunk):
            audio = base64.b64encode(pcm16[start : start + chunk]).decode("ascii")
            self._send(wire.InputAudioBufferAppend(audio=audio))

    async def _send_commit(self) -> None:
        self._send(wire.InputAudioBufferCommit())

    async def _send_response_create(self) -> None:
        self._responses += 1
        self._send(response_create_event(self._responses))
        rid = f"resp_recorded_{self._responses}"
        text = self.replies.pop(0) if self.replies else ""
        request = self.active_request
        self._events.put_nowait(ReplyStarted(rid, request))
        if text:
            self._events.put_nowait(ReplyTranscript(rid, text))
        self._events.put_nowait(ReplyDone(rid, text, request=request))

    async def _send_cancel(self, response_id: str | None = None) -> None:
        if response_id:
            self._send(wire.ResponseCancel(response_id=response_id))
        else:
            self._send(wire.ResponseCancel())

    async def _receive(self) -> AsyncIterator[SessionEvent]:
        events = self._events
        while True:
            event = await events.get()
            if event is None:
                return
            yield event
