"""Deepgram's streaming wire format (`/v1/listen`), as typed pydantic messages.

Why our own models next to the SDK's: the local test server (`voice.testing.deepgram_server`)
must speak exactly what the client reads, so both import these models; the client validates every
server message the SDK hands it against them (a drifted test server fails loudly, not silently).
Field names and shapes follow Deepgram's documented messages and deepgram-sdk v7's `ListenV1*`
types: `Results` (channel.alternatives[0].words[] with `speaker` when diarizing), `UtteranceEnd`,
`Metadata`, `SpeechStarted`; client control frames `KeepAlive`, `Finalize`, `CloseStream` are
JSON text frames, audio is binary frames.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class DeepgramWord(_Wire):
    word: str
    start: float
    end: float
    confidence: float
    speaker: int | None = None
    speaker_confidence: float | None = None
    punctuated_word: str | None = None


class DeepgramAlternative(_Wire):
    transcript: str
    confidence: float
    words: list[DeepgramWord]


class DeepgramChannel(_Wire):
    alternatives: list[DeepgramAlternative]


class DeepgramModelInfo(_Wire):
    name: str
    version: str
    arch: str


class DeepgramResultsMetadata(_Wire):
    request_id: str
    model_info: DeepgramModelInfo
    model_uuid: str


class DeepgramResults(_Wire):
    type: Literal["Results"] = "Results"
    channel_index: list[int]
    duration: float
    start: float
    is_final: bool | None = None
    speech_final: bool | None = None
    from_finalize: bool | None = None
    channel: DeepgramChannel
    metadata: DeepgramResultsMetadata


class DeepgramUtteranceEnd(_Wire):
    type: Literal["UtteranceEnd"] = "UtteranceEnd"
    channel: list[int]
    last_word_end: float


class DeepgramSpeechStarted(_Wire):
    type: Literal["SpeechStarted"] = "SpeechStarted"
    channel: list[int]
    timestamp: float


class DeepgramMetadata(_Wire):
    type: Literal["Metadata"] = "Metadata"
    transaction_key: str
    request_id: str
    sha256: str
    created: str
    duration: float
    channels: int


DeepgramServerMessage = Annotated[
    DeepgramResults | DeepgramUtteranceEnd | DeepgramSpeechStarted | DeepgramMetadata,
    Field(discriminator="type"),
]
SERVER_MESSAGE: TypeAdapter[DeepgramServerMessage] = TypeAdapter(DeepgramServerMessage)


class KeepAlive(_Wire):
    type: Literal["KeepAlive"] = "KeepAlive"


class Finalize(_Wire):
    type: Literal["Finalize"] = "Finalize"


class CloseStream(_Wire):
    type: Literal["CloseStream"] = "CloseStream"


DeepgramClientMessage = Annotated[KeepAlive | Finalize | CloseStream, Field(discriminator="type")]
CLIENT_MESSAGE: TypeAdapter[DeepgramClientMessage] = TypeAdapter(DeepgramClientMessage)
