"""OpenAI Realtime (GA) wire messages: the subset Chorus sends and reads, as typed values.

Why this module exists: the client session (`realtime.openai_session`) and the local test server
(`realtime.testing.openai_server`) both speak through these models, so a test server cannot drift
from the client. Names and fields follow the `openai` package's own GA types
(`openai.types.realtime`: `session.update`, `conversation.item.create`,
`input_audio_buffer.append/commit/clear`, `response.create/cancel`, `conversation.item.truncate`;
server events `session.created/updated`, `conversation.item.added/done` (and the older
`conversation.item.created`), `conversation.item.truncated`, `input_audio_buffer.committed`, `response.created`,
`response.output_audio.delta`, `response.output_audio_transcript.delta/done`,
`response.output_text.delta/done`, `response.done`, `error`). Each event is a pydantic model with
a `Literal` `type`, gathered in discriminated unions; fields we do not use are kept (`extra="allow"`)
so nothing the other side sent is lost, but what we rely on is validated.
"""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

INPUT_SAMPLE_RATE = 24_000
"""The GA default (and our configured) input format: `audio/pcm`, 16-bit mono at 24 kHz."""
OUTPUT_SAMPLE_RATE = 24_000
"""Reply audio (`response.output_audio.delta`) is 16-bit mono PCM at 24 kHz."""

ACTIVE_RESPONSE_CODE = "conversation_already_has_active_response"


def new_id(prefix: str) -> str:
    """An id shaped like the service's (`event_…`, `item_…`, `resp_…`)."""
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- items and session shapes


class InputTextPart(_Wire):
    type: Literal["input_text"] = "input_text"
    text: str


class OutputTextPart(_Wire):
    type: Literal["output_text"] = "output_text"
    text: str


class OutputAudioPart(_Wire):
    type: Literal["output_audio"] = "output_audio"
    transcript: str | None = None


class InputAudioPart(_Wire):
    type: Literal["input_audio"] = "input_audio"
    transcript: str | None = None


ContentPart = Annotated[
    InputTextPart | OutputTextPart | OutputAudioPart | InputAudioPart,
    Field(discriminator="type"),
]


class MessageItem(_Wire):
    """A conversation item of type `message` (the only kind Chorus sends)."""

    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart]
    id: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None

    @property
    def text(self) -> str:
        """The item's text (input/output text parts, or audio transcripts), joined."""
        out: list[str] = []
        for part in self.content:
            if isinstance(part, InputTextPart | OutputTextPart):
                out.append(part.text)
            elif part.transcript:
                out.append(part.transcript)
        return "".join(out)


def user_text_item(text: str) -> MessageItem:
    return MessageItem(role="user", content=[InputTextPart(text=text)])


def system_text_item(text: str) -> MessageItem:
    return MessageItem(role="system", content=[InputTextPart(text=text)])


def assistant_text_item(text: str) -> MessageItem:
    return MessageItem(role="assistant", content=[OutputTextPart(text=text)])


class AudioFormat(_Wire):
    type: Literal["audio/pcm", "audio/pcmu", "audio/pcma"] = "audio/pcm"
    rate: int | None = INPUT_SAMPLE_RATE


class AudioInputConfig(_Wire):
    format: AudioFormat | None = None
    # `None` is meaningful here: it turns the model's own turn detection off (R3). The field is
    # sent as `null` whenever it is set, so the session config keeps it explicitly.
    turn_detection: dict[str, Any] | None = None


class AudioOutputConfig(_Wire):
    format: AudioFormat | None = None
    voice: str | None = None


class AudioConfig(_Wire):
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


class SessionConfig(_Wire):
    """`session` of `session.update` (GA: `type` is `realtime`)."""

    type: Literal["realtime"] = "realtime"
    model: str | None = None
    instructions: str | None = None
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioConfig | None = None


# ---------------------------------------------------------------- client events


class SessionUpdate(_Wire):
    type: Literal["session.update"] = "session.update"
    session: SessionConfig
    event_id: str | None = None


class ConversationItemCreate(_Wire):
    type: Literal["conversation.item.create"] = "conversation.item.create"
    item: MessageItem
    previous_item_id: str | None = None
    event_id: str | None = None


class InputAudioBufferAppend(_Wire):
    type: Literal["input_audio_buffer.append"] = "input_audio_buffer.append"
    audio: str
    event_id: str | None = None


class InputAudioBufferCommit(_Wire):
    type: Literal["input_audio_buffer.commit"] = "input_audio_buffer.commit"
    event_id: str | None = None


class InputAudioBufferClear(_Wire):
    type: Literal["input_audio_buffer.clear"] = "input_audio_buffer.clear"
    event_id: str | None = None


class ResponseCreate(_Wire):
    type: Literal["response.create"] = "response.create"
    response: dict[str, Any] | None = None
    event_id: str | None = None


class ResponseCancel(_Wire):
    type: Literal["response.cancel"] = "response.cancel"
    response_id: str | None = None
    event_id: str | None = None


class ConversationItemTruncate(_Wire):
    """Cut an assistant item's audio at `audio_end_ms` (what the listener heard); the service
    drops the transcript past it too, so the context holds only what was heard."""

    type: Literal["conversation.item.truncate"] = "conversation.item.truncate"
    item_id: str
    content_index: int = 0
    audio_end_ms: int = Field(ge=0)
    event_id: str | None = None


ClientEvent = Annotated[
    SessionUpdate
    | ConversationItemCreate
    | InputAudioBufferAppend
    | InputAudioBufferCommit
    | InputAudioBufferClear
    | ResponseCreate
    | ResponseCancel
    | ConversationItemTruncate,
    Field(discriminator="type"),
]
CLIENT_EVENT_TYPES = frozenset(
    {
        "session.update",
        "conversation.item.create",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "response.create",
        "response.cancel",
        "conversation.item.truncate",
    }
)

_client_adapter: TypeAdapter[ClientEvent] = TypeAdapter(ClientEvent)


def client_event_wire(event: BaseModel) -> dict[str, Any]:
    """The JSON object a client event is sent as.

    Fields left at `None` are omitted, except a `None` set on purpose: `turn_detection: null` is
    what turns the model's turn detection off, so it must reach the wire.
    """
    return _wire_dict(event)


def _wire_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return _wire_dict(value)
    if isinstance(value, list):
        return [_wire_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire_value(v) for k, v in value.items()}
    return value


def _wire_dict(model: BaseModel) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in [*type(model).model_fields, *(model.model_extra or {})]:
        value = getattr(model, name)
        if value is None and name not in model.model_fields_set:
            continue
        out[name] = _wire_value(value)
    return out


def parse_client_event(data: str | bytes | dict[str, Any]) -> ClientEvent:
    """Parse one client event; raises `ValueError` with a readable reason when malformed."""
    obj: Any = json.loads(data) if isinstance(data, str | bytes) else data
    if not isinstance(obj, dict):
        raise ValueError("a client event must be a JSON object")
    kind = obj.get("type")
    if kind not in CLIENT_EVENT_TYPES:
        raise ValueError(f"unsupported client event type {kind!r}")
    try:
        return _client_adapter.validate_python(obj)
    except ValidationError as exc:
        raise ValueError(
            f"malformed {kind}: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}"
        ) from exc


# ---------------------------------------------------------------- server events


class ErrorDetail(_Wire):
    type: str
    message: str
    code: str | None = None
    param: str | None = None
    event_id: str | None = None


class ResponseInfo(_Wire):
    """The `response` object of `response.created` / `response.done`."""

    id: str | None = None
    object: Literal["realtime.response"] | None = "realtime.response"
    status: Literal["completed", "cancelled", "failed", "incomplete", "in_progress"] | None = None
    output: list[MessageItem] = Field(default_factory=list)
    output_modalities: list[Literal["text", "audio"]] | None = None
    conversation_id: str | None = None
    status_details: dict[str, Any] | None = None
    """Why it ended, e.g. `{"type": "cancelled", "reason": "client_cancelled"}`."""


class SessionCreated(_Wire):
    type: Literal["session.created"] = "session.created"
    event_id: str
    session: dict[str, Any]


class SessionUpdated(_Wire):
    type: Literal["session.updated"] = "session.updated"
    event_id: str
    session: dict[str, Any]


class ConversationItemAdded(_Wire):
    type: Literal["conversation.item.added"] = "conversation.item.added"
    event_id: str
    item: MessageItem
    previous_item_id: str | None = None


class ConversationItemDone(_Wire):
    type: Literal["conversation.item.done"] = "conversation.item.done"
    event_id: str
    item: MessageItem
    previous_item_id: str | None = None


class ConversationItemCreated(_Wire):
    """The pre-GA name of `conversation.item.added`; still in the GA union, still accepted."""

    type: Literal["conversation.item.created"] = "conversation.item.created"
    event_id: str
    item: MessageItem
    previous_item_id: str | None = None


class InputAudioBufferCommitted(_Wire):
    type: Literal["input_audio_buffer.committed"] = "input_audio_buffer.committed"
    event_id: str
    item_id: str
    previous_item_id: str | None = None


class InputAudioBufferCleared(_Wire):
    type: Literal["input_audio_buffer.cleared"] = "input_audio_buffer.cleared"
    event_id: str


class ResponseCreated(_Wire):
    type: Literal["response.created"] = "response.created"
    event_id: str
    response: ResponseInfo


class ResponseDone(_Wire):
    type: Literal["response.done"] = "response.done"
    event_id: str
    response: ResponseInfo


class _ResponsePartEvent(_Wire):
    event_id: str
    response_id: str
    item_id: str
    output_index: int = 0
    content_index: int = 0


class ResponseOutputAudioDelta(_ResponsePartEvent):
    type: Literal["response.output_audio.delta"] = "response.output_audio.delta"
    delta: str


class ResponseOutputAudioDone(_ResponsePartEvent):
    type: Literal["response.output_audio.done"] = "response.output_audio.done"


class ResponseOutputAudioTranscriptDelta(_ResponsePartEvent):
    type: Literal["response.output_audio_transcript.delta"] = (
        "response.output_audio_transcript.delta"
    )
    delta: str


class ResponseOutputAudioTranscriptDone(_ResponsePartEvent):
    type: Literal["response.output_audio_transcript.done"] = "response.output_audio_transcript.done"
    transcript: str


class ResponseOutputTextDelta(_ResponsePartEvent):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    delta: str


class ResponseOutputTextDone(_ResponsePartEvent):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    text: str


class ConversationItemTruncated(_Wire):
    type: Literal["conversation.item.truncated"] = "conversation.item.truncated"
    event_id: str
    item_id: str
    content_index: int = 0
    audio_end_ms: int


class ErrorEvent(_Wire):
    type: Literal["error"] = "error"
    event_id: str
    error: ErrorDetail


ServerEvent = Annotated[
    SessionCreated
    | SessionUpdated
    | ConversationItemAdded
    | ConversationItemDone
    | ConversationItemCreated
    | ConversationItemTruncated
    | InputAudioBufferCommitted
    | InputAudioBufferCleared
    | ResponseCreated
    | ResponseDone
    | ResponseOutputAudioDelta
    | ResponseOutputAudioDone
    | ResponseOutputAudioTranscriptDelta
    | ResponseOutputAudioTranscriptDone
    | ResponseOutputTextDelta
    | ResponseOutputTextDone
    | ErrorEvent,
    Field(discriminator="type"),
]
SERVER_EVENT_TYPES = frozenset(
    {
        "session.created",
        "session.updated",
        "conversation.item.added",
        "conversation.item.done",
        "conversation.item.created",
        "conversation.item.truncated",
        "input_audio_buffer.committed",
        "input_audio_buffer.cleared",
        "response.created",
        "response.done",
        "response.output_audio.delta",
        "response.output_audio.done",
        "response.output_audio_transcript.delta",
        "response.output_audio_transcript.done",
        "response.output_text.delta",
        "response.output_text.done",
        "error",
    }
)
_server_adapter: TypeAdapter[ServerEvent] = TypeAdapter(ServerEvent)


def parse_server_event(data: str | bytes) -> ServerEvent | None:
    """Parse one server event; `None` for an event type Chorus does not read (rate limits, …).

    Raises `ValueError` for a message that is not JSON or a known event that is malformed.
    """
    try:
        obj: Any = json.loads(data)
    except json.JSONDecodeError as exc:
        raise ValueError(f"server sent a message that is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise ValueError("server sent a JSON value that is not an object")
    if obj.get("type") not in SERVER_EVENT_TYPES:
        return None
    try:
        return _server_adapter.validate_python(obj)
    except ValidationError as exc:
        raise ValueError(
            f"malformed server event {obj.get('type')!r}: {exc.errors()[0]['msg']}"
        ) from exc


def server_event_wire(event: BaseModel) -> str:
    return event.model_dump_json(exclude_none=True)
