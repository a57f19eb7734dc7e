"""Gemini Live (`BidiGenerateContent`) wire messages: the subset Chorus sends and reads.

Why: the local Gemini Live server (`realtime.testing.gemini_server`) parses what the real
`google-genai` client sends with these models, and builds its answers from them, so the test
server cannot drift from what the SDK reads. The SDK mixes key styles on the wire
(`client_content` with `turnComplete`, `realtime_input` with `mime_type`), so every model takes
both the camelCase and the snake_case spelling and writes camelCase.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Wire(BaseModel):
    model_config = ConfigDict(
        extra="allow", alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True
    )


class Blob(_Wire):
    data: str
    mime_type: str | None = None


class Part(_Wire):
    text: str | None = None
    inline_data: Blob | None = None


class Content(_Wire):
    role: str | None = None
    parts: list[Part] = Field(default_factory=list)


class ClientContent(_Wire):
    turns: list[Content] = Field(default_factory=list)
    turn_complete: bool = False


class RealtimeInput(_Wire):
    audio: Blob | None = None
    media_chunks: list[Blob] | None = None
    text: str | None = None
    activity_start: dict[str, Any] | None = None
    activity_end: dict[str, Any] | None = None
    audio_stream_end: bool | None = None


class Setup(_Wire):
    model: str
    generation_config: dict[str, Any] | None = None
    system_instruction: Content | None = None
    realtime_input_config: dict[str, Any] | None = None
    output_audio_transcription: dict[str, Any] | None = None


class ClientMessage(_Wire):
    """One client message: exactly one of its fields is set."""

    setup: Setup | None = None
    client_content: ClientContent | None = Field(
        default=None, validation_alias=AliasChoices("clientContent", "client_content")
    )
    realtime_input: RealtimeInput | None = Field(
        default=None, validation_alias=AliasChoices("realtimeInput", "realtime_input")
    )

    @property
    def kind(self) -> str:
        for name in ("setup", "client_content", "realtime_input"):
            if getattr(self, name) is not None:
                return name
        return "unknown"


def parse_client_message(raw: str | bytes) -> ClientMessage:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from exc
    if not isinstance(obj, dict) or len(obj) != 1:
        raise ValueError("a client message is a JSON object with exactly one field")
    message = ClientMessage.model_validate(obj)
    if message.kind == "unknown":
        raise ValueError(f"unsupported client message {next(iter(obj))!r}")
    return message


class Transcription(_Wire):
    text: str


class ServerContent(_Wire):
    model_turn: Content | None = None
    output_transcription: Transcription | None = None
    generation_complete: bool | None = None
    turn_complete: bool | None = None
    interrupted: bool | None = None


class GoAway(_Wire):
    time_left: str
    """A protobuf `Duration` as JSON: `"10s"`."""


class ServerMessage(_Wire):
    setup_complete: dict[str, Any] | None = None
    server_content: ServerContent | None = None
    go_away: GoAway | None = None

    def wire(self) -> str:
        return self.model_dump_json(exclude_none=True)
