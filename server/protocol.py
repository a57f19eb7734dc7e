"""Chorus's own wire messages: the device stream protocol and the live event feed — typed
pydantic values with a `Literal` discriminator.

Owns every JSON shape of the server's own sockets (the device stream and the event feed share
what the server sends: turns, speaker changes, replies, STT status, errors), the close codes of
every socket, and the id grammar of rooms and participants, so the server, the demo, the load
benchmark and the tests build and parse the same values and cannot drift apart. Client → server
messages are parsed through discriminated unions (`parse_device_message`, `parse_feed_request`);
server → client messages are built as models and sent with `dump`. Reading a device's framing
into a stream declaration is `server.device`'s; Twilio's framing, messages included, is
`server.twilio`'s.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

from rooms import AgentStatus


class CloseCode(enum.IntEnum):
    """Close codes the server uses; the close reason repeats the problem in words.

    Auth and protocol problems are refused before any audio is read.
    """

    NORMAL = 1000
    GOING_AWAY = 1001
    FRAME_TOO_LARGE = 1009
    """A message over `limits.max_frame_bytes` (the websockets library closes with 1009)."""
    INTERNAL_ERROR = 1011
    BAD_MESSAGE = 4400
    """Not JSON, an unknown `type`/`event`, or a field out of range."""
    TOKEN_MISSING = 4401
    TOKEN_INVALID = 4403
    """Malformed token or bad signature."""
    TOKEN_WRONG_ROOM = 4404
    """A valid token for another room."""
    AUDIO_BEFORE_START = 4409
    START_TIMEOUT = 4408
    TOKEN_EXPIRED = 4419
    UNSUPPORTED_ENCODING = 4415
    TOO_MANY_STREAMS = 4429
    FEED_TOO_SLOW = 4430
    """An event-feed consumer fell behind and was dropped."""
    UNKNOWN_ROUTE = 4444
    SHUTTING_DOWN = 4503


Encoding = Literal["pcm16", "mulaw"]
SUPPORTED_ENCODINGS: tuple[str, ...] = ("pcm16", "mulaw")

_ID = r"^[A-Za-z0-9_.:@+-]{1,64}$"
ROOM_ID = r"[A-Za-z0-9_.:-]{1,64}"
"""A room id (in a route, or in a phone leg's `customParameters.room`)."""


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


# --- device stream: client → server -------------------------------------------------------


class StartMessage(_Wire):
    """Opens a device stream. Audio frames follow as binary messages."""

    type: Literal["start"] = "start"
    participant: str = Field(pattern=_ID)
    name: str | None = Field(default=None, max_length=80)
    sample_rate: int = Field(default=16000, ge=8000, le=48000)
    encoding: Encoding = "pcm16"
    channels: int = Field(default=1, ge=1, le=8)
    shared_mic: bool = True
    """True: several people at one microphone (diarized). False: one person, turns carry `name`."""
    echo_cancelled: bool = False
    """True: the device cancels the reply's echo itself (a speakerphone with echo cancellation):
    it is not silenced while a reply plays (V9), and someone talking over the reply stops it
    (the server hears the barge-in). False: silenced while a reply plays; the device may say
    it stopped the reply (`barge_in`)."""
    server_barge_in: bool = False
    """True: the server decides when someone talks over the reply on this microphone (its
    barge-in rule, `server.reply_audio.BargeIn`, as for `echo_cancelled`), and the device stops
    playing at `reply_stopped`; the microphone is still silenced while a reply plays (V9) and
    heard again at once, with the half second held back, when the server hears a barge-in. For
    a loudspeaker next to a microphone with echo cancellation that still lets some of the reply
    through (the page in a browser). Implied by `echo_cancelled`."""

    @model_validator(mode="after")
    def _phone_rate(self) -> StartMessage:
        if self.encoding == "mulaw" and self.sample_rate != 8000:
            raise ValueError("mulaw streams are 8000 Hz (G.711)")
        return self


class StopMessage(_Wire):
    type: Literal["stop"] = "stop"


class BargeInMessage(_Wire):
    """The device stopped the reply it was playing because someone in the room talked over it:
    the server stops the model's response and hears this stream again at once."""

    type: Literal["barge_in"] = "barge_in"


class BargeInRuleMessage(_Wire):
    """Mid-stream: whether the server decides when someone talks over the reply on this
    microphone from now on (`server_decides`, as `server_barge_in` at `start`: the page's
    barge-in switch turned on or off while it streams). Off, nothing on the server stops the
    reply for this microphone's audio (the device still may, with `barge_in`)."""

    type: Literal["barge_in_rule"] = "barge_in_rule"
    server_decides: bool


DeviceRequest = StartMessage | StopMessage | BargeInMessage | BargeInRuleMessage
DeviceMessage = Annotated[DeviceRequest, Field(discriminator="type")]
_device_adapter: TypeAdapter[DeviceRequest] = TypeAdapter(DeviceMessage)


def parse_device_message(text: str | bytes) -> DeviceRequest:
    """Raises `pydantic.ValidationError` for bad JSON, an unknown type or a bad field."""
    return _device_adapter.validate_json(text)


# --- server → device and event feed ----------------------------------------------------------


class StartedMessage(_Wire):
    """The server's answer to `start`: the stream is live."""

    type: Literal["started"] = "started"
    room: str
    stream: str
    participant: str


class TurnMessage(_Wire):
    """One speaker turn (V2). `speaker` is the name shown (after renames); `label` the raw label.
    `corrected`: this replaces the turn with the same `event_id` sent before (a turn committed
    early from interim words, corrected by the final result, or re-decoded by the live second
    pass): show this one instead. `second_pass`: these are the second pass's words."""

    type: Literal["turn"] = "turn"
    room: str
    speaker: str
    text: str
    start: float
    end: float
    participant: str | None
    label: str | None = None
    stream: str | None = None
    event_id: str | None = None
    corrected: bool = False
    second_pass: bool = False


class SpeakerChangeMessage(_Wire):
    type: Literal["speaker_change"] = "speaker_change"
    room: str
    speaker: str
    previous: str | None = None
    is_new_speaker: bool = False
    participant: str | None = None
    stream: str | None = None


class ReplyMessage(_Wire):
    """What the room's assistant said (R5); its audio follows as binary frames on device streams.
    `corrected`: it replaces the reply with the same `event_id` sent before, `interrupted`:
    someone talked over it and `text` is what the room heard of it (an estimate)."""

    type: Literal["reply"] = "reply"
    room: str
    text: str
    event_id: str | None = None
    corrected: bool = False
    interrupted: bool = False


class ReplyStoppedMessage(_Wire):
    """Someone in the room talked over the assistant's reply (barge-in): the reply stops for
    the whole room. A device drops the reply audio it still holds (the rest of the response is
    never sent); the feed learns that the assistant was interrupted. `stream`: the stream whose
    speaker talked over it."""

    type: Literal["reply_stopped"] = "reply_stopped"
    room: str
    stream: str | None = None


class RenamedMessage(_Wire):
    """A speaker label now reads as `name` for the rest of its session (feed only)."""

    type: Literal["renamed"] = "renamed"
    room: str
    label: str
    name: str
    stream: str | None = None


class SpeakerSuggestionMessage(_Wire):
    """Who a speaker label may be (feed only; never applied by itself): `source` says what
    suggests it — `voice`, the voice directory (its voice is near a remembered person's, below
    the `auto` threshold; `voice` is that person's id), or `introduction` (what they said).
    Confirming it is a `rename` (or `POST …/speakers/remember`)."""

    type: Literal["speaker_suggestion"] = "speaker_suggestion"
    room: str
    label: str
    name: str
    source: Literal["voice", "introduction"]
    stream: str | None = None
    voice: str | None = None


class StreamEventMessage(_Wire):
    """A device or phone leg joined or left the room (feed only)."""

    type: Literal["stream_started", "stream_stopped"]
    room: str
    stream: str
    participant: str
    name: str | None = None
    kind: Literal["device", "twilio", "audiosocket", "sip"] = "device"


class DtmfMessage(_Wire):
    """A caller pressed a key (a phone leg's DTMF digit: `0`–`9`, `*`, `#`, `A`–`D`; feed only)."""

    type: Literal["dtmf"] = "dtmf"
    room: str
    stream: str
    participant: str
    digit: str


class AssistantStatusMessage(_Wire):
    """A model of the room (the realtime session, the ACP agent, the chat model: `channel`)
    lost its provider or process, or has it back (`rooms.AgentStatus`), sent to the room's feed
    and its devices: `unavailable` (the provider refused the session or cannot be reached, the
    agent process exited, or the chat model's call failed; the room's lines wait for it, in
    order, and it keeps trying; `reason` says who and the HTTP status or exit code, never the
    provider's words), `available` (it answers again)."""

    type: Literal["assistant_status"] = "assistant_status"
    room: str
    channel: str
    status: Literal["unavailable", "available"]
    reason: str | None = None

    @classmethod
    def of(cls, room: str, status: AgentStatus) -> AssistantStatusMessage:
        """The message for an `ON_AGENT_STATUS` in `room` (`chorus serve`, the LiveKit agent)."""
        return cls(room=room, channel=status.channel_id, reason=status.reason,
                   status="available" if status.available else "unavailable")  # fmt: skip


class SttStatusMessage(_Wire):
    """The stream's speech-to-text connection changed state (issue 10.1), sent to that stream's
    device, or, for a phone leg (no message channel to its caller), to the room's feed:
    `degraded` (the STT service dropped; audio is held and resent), `recovered` (a new
    connection took the held audio), `audio_lost` (an outage outlasted what could be held: the
    audio from `start` to `end`, seconds of this stream, was never transcribed), `ended` (the
    stream cannot transcribe any more; `reason` says why), `refused` (the STT service refused the
    server's credentials or permission, HTTP 401/403: final, never retried; `reason` names the
    status, never a secret; the room's feed hears it for every stream)."""

    type: Literal["stt_status"] = "stt_status"
    stream: str
    status: Literal["degraded", "recovered", "audio_lost", "ended", "refused"]
    reason: str | None = None
    start: float | None = None
    end: float | None = None


class DiarizationStatusMessage(_Wire):
    """Where the stream's speakers come from changed (issue 31), sent to that stream's device
    and the room's feed: `degraded` (the diarization stage could not keep up with this stream:
    its turns carry the STT's speaker labels, or the stream's one participant when the STT
    gives none; `reason` says how far behind it was), `recovered` (the stage labels its turns
    again; its voices are labelled afresh, `Speaker A` …). `speakers` names the source now."""

    type: Literal["diarization_status"] = "diarization_status"
    stream: str
    status: Literal["degraded", "recovered"]
    speakers: Literal["stage", "stt"]
    reason: str | None = None


class ChatMessage(_Wire):
    """A message typed into the room's chat (`POST /v1/rooms/{room}/messages` or the feed's
    `message` request, or a chat ingress), in commit order with the turns (feed only).
    `speaker` is the label the room's models read it under."""

    type: Literal["message"] = "message"
    room: str
    speaker: str
    text: str
    participant: str | None = None
    channel: str | None = None
    event_id: str | None = None


class ErrorMessage(_Wire):
    """Sent just before the server closes a socket for a protocol error."""

    type: Literal["error"] = "error"
    code: int
    reason: str


FeedMessage = (
    TurnMessage
    | SpeakerChangeMessage
    | ReplyMessage
    | ReplyStoppedMessage
    | RenamedMessage
    | SpeakerSuggestionMessage
    | StreamEventMessage
    | DtmfMessage
    | ChatMessage
    | StartedMessage
    | SttStatusMessage
    | DiarizationStatusMessage
    | AssistantStatusMessage
    | ErrorMessage
)
_feed_adapter: TypeAdapter[FeedMessage] = TypeAdapter(
    Annotated[FeedMessage, Field(discriminator="type")]
)


def parse_server_message(text: str | bytes) -> FeedMessage:
    """What a client (device, page, demo, benchmark) reads off a server socket."""
    return _feed_adapter.validate_json(text)


# --- event feed: client → server -------------------------------------------------------------


class RenameRequest(_Wire):
    """Rename a speaker label in this room; goes through the ON_TRANSCRIPTION rename path (V6)."""

    type: Literal["rename"] = "rename"
    label: str = Field(min_length=1, max_length=80)
    name: str = Field(min_length=1, max_length=80)
    stream: str | None = Field(default=None, min_length=1, max_length=64)
    """Limit the rename to one stream's session (default: every stream in the room)."""


PARTICIPANT_ID = r"^[A-Za-z0-9_.:@+-]{1,64}$"
ROOM_ID = r"[A-Za-z0-9_.:-]{1,64}"
"""A room id (in a route, or in a phone leg's `customParameters.room`)."""


class MessageRequest(_Wire):
    """Type a message into the room's chat as `participant` (shown as `name`, B2). The same body,
    without `type`, is what `POST /v1/rooms/{room}/messages` takes."""

    type: Literal["message"] = "message"
    participant: str = Field(pattern=PARTICIPANT_ID)
    name: str | None = Field(default=None, min_length=1, max_length=80)
    text: str = Field(min_length=1, max_length=4000)


FeedRequest = RenameRequest | MessageRequest


class _FeedKind(_Wire):
    """Only a feed request's `type`, read by pydantic-core's parser (bounded nesting: a deeply
    nested request is a validation error, never a RecursionError as from `json.loads`)."""

    type: object = None


def parse_feed_request(text: str | bytes) -> FeedRequest:
    """A `message` request, or a rename (whose `type` may be left out, as before)."""
    try:
        kind = _FeedKind.model_validate_json(text).type
    except ValidationError:
        kind = None
    if kind == "message":
        return MessageRequest.model_validate_json(text)
    return RenameRequest.model_validate_json(text)


def dump(message: BaseModel) -> str:
    """A wire message as compact JSON (absent optionals kept as null: clients see every key)."""
    return message.model_dump_json()


def error_location(errors: list[Any]) -> tuple[str, ...]:
    """The field path of the first validation error (to tell an unknown encoding apart)."""
    if not errors:
        return ()
    return tuple(str(p) for p in errors[0].get("loc", ()))
