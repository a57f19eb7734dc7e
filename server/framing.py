"""The one shape every stream protocol has: a socket's framing in, a typed declaration and audio out.

Owns `StreamDeclaration` (who streams, under what name, on a shared microphone or not, in what
`voice.audio.StreamFormat`): the one value a protocol module makes of its start message, which
then flows unchanged through `server.live` into the pipeline. Also owns what a protocol module
may say back to the server: `Refusal` (end this socket with a close code, a reason and a metric
name; `check_participant` for a participant its token does not allow,
`check_stream_participant` also for a stream in the chat-only id space) and
`StoppedBeforeStart`, and the `StreamFraming` shape a module's per-socket object has
once its stream is open (audio out of each message, the greeting, reply audio in its framing).

Each wire protocol is one module of this shape (`server.device`, `server.twilio`); a new
ingress (SIP, Asterisk AudioSocket) is one more. The server (`server.app`) keeps the sockets,
the tokens, the limits and the drain: a module never reads a socket, it parses what it is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal, Protocol

from pydantic import ValidationError

from server.auth import RoomGrant, TokenProblem
from server.chat import CHAT_ONLY_PREFIX
from server.protocol import CloseCode, error_location
from voice.audio import AudioError, Encoding, StreamFormat

StreamKind = Literal["device", "twilio"]
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


def declared_format(sample_rate: int, encoding: Encoding, channels: int) -> StreamFormat:
    """The declared audio format, or the refusal naming why the voice channel cannot take it (V10)."""
    try:
        return StreamFormat(sample_rate=sample_rate, encoding=encoding, channels=channels)
    except AudioError as exc:
        raise Refusal(CloseCode.BAD_MESSAGE, str(exc)[:120], "bad_format") from exc


def bad_message(exc: ValidationError) -> Refusal:
    """The refusal for a protocol message that does not parse: not JSON, or a field that is wrong."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        return Refusal(CloseCode.BAD_MESSAGE, "message is not JSON", "bad_json")
    where = ".".join(error_location(list(errors))) or "message"
    return Refusal(
        CloseCode.BAD_MESSAGE, f"bad message at {where}: {errors[0]['msg']}"[:120], "bad_message"
    )


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
