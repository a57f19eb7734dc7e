"""The one shape every stream protocol has: a socket's framing in, a typed declaration and audio out.

Owns `StreamDeclaration` (who streams, under what name, on a shared microphone or not, in what
`voice.audio.StreamFormat`): the one value a protocol module makes of its start message, which
then flows unchanged through `server.live` into the pipeline. Also owns what a protocol module
may say back to the server: `Refusal` (end this socket with a close code, a reason and a metric
name; `check_participant` for a participant its token does not allow,
`check_stream_participant` also for a stream in the chat-only id space) and
`StoppedBeforeStart`, and the `StreamFraming` shape a module's per-socket object has
once its stream is open (audio out of each message, the greeting, reply audio in its framing).

Each wire protocol is one module of this shape (`server.device`, `server.twilio`,
`server.audiosocket`, `server.sip`); a new ingress is one more. The server (`server.app`) keeps the sockets,
the tokens, the limits and the drain: a module never reads a socket, it parses what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol, get_args, get_origin

from pydantic import BaseModel, ValidationError

from server.auth import RoomGrant, TokenProblem
from server.chat import CHAT_ONLY_PREFIX
from server.protocol import CloseCode
from voice.audio import (
    MAX_SAMPLE_RATE,
    MIN_SAMPLE_RATE,
    AudioError,
    Encoding,
    FrameSizeError,
    SampleRateError,
    StreamFormat,
    UnsupportedEncodingError,
)

StreamKind = Literal["device", "twilio", "audiosocket", "sip"]
"""Which protocol a stream came in by (its metrics label and its feed `kind`)."""
Outgoing = str | bytes
"""One websocket message to a stream's socket (JSON text or binary audio)."""


@dataclass(frozen=True)
class StreamDeclaration:
    """What a stream says it is, as its protocol declared it (rule V1)."""

    participant: str
    name: str | None
    """The name its turns carry when it is one person (`shared_mic` false)."""
    shared_mic: bool
    """True: several people at one microphone (diarized). False: one person."""
    format: StreamFormat
    echo_gate: bool = True
    """Whether the room's replies may play into this stream's own microphone, so its audio is
    held back and, unless someone talks over the reply, replaced by silence while one plays
    (V9). True for a speakerphone device and for a phone leg (a phone whose echo control is weak
    sends the reply back, which would be transcribed as the caller's words): a barge-in on the
    stream (the device's `barge_in`, the server's rule on a device that declares
    `server_barge_in`, or a phone leg's own rule) lifts it at once and hands on the half second
    it held (`VoiceSession.reply_stopped`). False for a device that declares `echo_cancelled`:
    the server hears it over the reply and decides the barge-in itself."""


class Refusal(Exception):
    """Ends one socket with a close code; nothing else is affected."""

    def __init__(self, code: CloseCode, reason: str, metric: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.metric = metric


class StoppedBeforeStart(Exception):
    """The peer ended its stream before starting it (closed normally, nothing is refused)."""


class StreamFraming(Protocol):
    """One socket's protocol once its stream is declared."""

    kind: ClassVar[StreamKind]

    def audio(self, message: str | bytes) -> bytes | None:
        """The audio one message carries (`b""` for none); None when it ends the stream.
        Raises `Refusal` for a message the protocol does not allow here."""
        ...

    def greeting(self, room: str, stream_id: str) -> list[Outgoing]:
        """What the socket hears first once its stream is open."""
        ...

    def reply_audio(self, pcm16: bytes, sample_rate: int) -> list[Outgoing]:
        """The room's reply audio (pcm16 at `sample_rate`) as this socket's messages."""
        ...

    def answers(self) -> list[Outgoing]:
        """What the socket owes its peer after the messages read so far (a Twilio `clear` when
        the caller talks over a reply), once each; usually nothing."""
        ...

    def stop_reply(self, stopped: Outgoing) -> list[Outgoing]:
        """Someone in the room talked over the reply (barge-in, on this stream or another):
        drop what of it this socket still holds and has not sent, and return what tells the
        peer to drop what it has buffered (a device: `stopped`, the room's `reply_stopped`;
        Twilio: `clear`, when a reply is still playing there; nothing for a leg whose
        reply is paced out by the server)."""
        ...


def declared_format(sample_rate: int, encoding: Encoding, channels: int) -> StreamFormat:
    """The declared audio format, or the refusal naming why the voice channel cannot take it (V10)."""
    try:
        return StreamFormat(sample_rate=sample_rate, encoding=encoding, channels=channels)
    except AudioError as exc:
        raise format_refusal(exc) from exc


def format_refusal(exc: AudioError) -> Refusal:
    """The refusal for a declared format the voice channel cannot take: a fixed text per kind of
    problem, never the declared values (a reason never echoes what the client sent)."""
    if isinstance(exc, UnsupportedEncodingError):
        reason = "unsupported encoding (use pcm16 or mulaw)"
    elif isinstance(exc, SampleRateError):
        reason = f"unsupported sample rate ({MIN_SAMPLE_RATE}–{MAX_SAMPLE_RATE} Hz; mulaw: 8000 Hz)"
    elif isinstance(exc, FrameSizeError):
        reason = "unsupported channel count"
    else:
        reason = "unsupported audio format"
    return Refusal(CloseCode.BAD_MESSAGE, reason, "bad_format")


_PROBLEMS = {
    "missing": "field required",
    "string_type": "not a string",
    "string_pattern_mismatch": "string does not match pattern",
    "string_too_short": "string too short",
    "string_too_long": "string too long",
    "int_type": "not an integer",
    "int_parsing": "not an integer",
    "int_from_float": "not an integer",
    "float_type": "not a number",
    "float_parsing": "not a number",
    "bool_type": "not a boolean",
    "bool_parsing": "not a boolean",
    "greater_than": "number too small",
    "greater_than_equal": "number too small",
    "less_than": "number too large",
    "less_than_equal": "number too large",
    "literal_error": "not one of the allowed values",
    "enum": "not one of the allowed values",
    "union_tag_invalid": "unknown message type",
    "union_tag_not_found": "no message type",
    "dict_type": "not an object",
    "model_type": "not an object",
    "model_attributes_type": "not an object",
    "list_type": "not a list",
    "extra_forbidden": "unknown field",
}
"""What a bad field is, by pydantic's error type: pydantic's own message may quote the input."""


def schema_names(*types: Any) -> frozenset[str]:
    """Every field name, alias and literal tag of these pydantic models (and of the models and
    unions inside them): the parts of an error location that are not client text (a dict key
    or a list index in a location is)."""
    names: set[str] = set()
    seen: set[type[BaseModel]] = set()

    def walk(tp: Any) -> None:
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            if tp not in seen:
                seen.add(tp)
                for name, field in tp.model_fields.items():
                    names.update(n for n in (name, field.alias) if n)
                    walk(field.annotation)
        elif get_origin(tp) is Literal:
            names.update(a for a in get_args(tp) if isinstance(a, str))
        else:
            for arg in get_args(tp):
                walk(arg)

    for tp in types:
        walk(tp)
    return frozenset(names)


def bad_message(exc: ValidationError, names: frozenset[str]) -> Refusal:
    """The refusal for a protocol message that does not parse: not JSON, or a field that is wrong.

    Built from the error's type and location only (`names`: the protocol's `schema_names`; any
    other part of the location, a dict key, is `*`): a reason never echoes what the client
    sent, so it stays short and fixed whatever the message held."""
    errors = exc.errors(include_url=False, include_input=False)
    if errors and errors[0].get("type") == "json_invalid":
        return Refusal(CloseCode.BAD_MESSAGE, "message is not JSON", "bad_json")
    first = errors[0] if errors else None
    where = ".".join(
        part if part in names else str(part) if isinstance(part, int) else "*"
        for part in (first["loc"] if first else ())
    )
    kind = first["type"] if first else "invalid"
    if kind == "value_error" and first is not None and "error" in first.get("ctx", {}):
        problem = str(first["ctx"]["error"])  # our own validators' text (server.protocol)
    else:
        problem = _PROBLEMS.get(kind, f"invalid ({kind})")
    reason = f"bad message at {where or 'message'}: {problem}"
    return Refusal(CloseCode.BAD_MESSAGE, reason, "bad_message")


def check_stream_participant(grant: RoomGrant, participant: str) -> None:
    """`check_participant`, and no stream in the chat-only id space (`chat:…`, server.chat):
    a typed-only participant's record is never a voice participant's."""
    check_participant(grant, participant)
    if participant.startswith(CHAT_ONLY_PREFIX):
        raise Refusal(
            CloseCode.BAD_MESSAGE,
            f"participant ids starting with {CHAT_ONLY_PREFIX!r} are the chat's own",
            "bad_message",
        )


def check_participant(grant: RoomGrant, participant: str) -> None:
    """A token naming a participant (`sub`) opens streams and types messages as that one only."""
    if grant.participant is not None and grant.participant != participant:
        raise Refusal(
            CloseCode.TOKEN_INVALID,
            "token is for another participant",
            f"token_{TokenProblem.WRONG_PARTICIPANT.value}",
        )
