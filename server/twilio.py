"""Twilio Media Streams (`/v1/twilio`): a phone bridge leg's framing, in both directions.

Owns Twilio's WebSocket messages as typed values (from Twilio: `connected`, `start` with
`start.streamSid`, `callSid`, `customParameters` and `mediaFormat`, `media` with base64 8 kHz
µ-law in `media.payload`, `mark`, `dtmf`, `stop`; to Twilio: `media`, `mark`, `clear` on the
same `streamSid`), and reading a leg into a `server.framing.StreamDeclaration` plus audio
(`TwilioFraming`). Twilio carries the room, the token and the caller's name in the start's
`customParameters`, so the server checks the token only once `start` has come
(`TwilioFraming.opening`), then asks for the declaration (`TwilioFraming.declare`).
The client (`server.client.TwilioLeg`) builds the same values, so it cannot drift from this.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from models.extras import require
from server.framing import (
    Outgoing,
    Refusal,
    StoppedBeforeStart,
    StreamDeclaration,
    StreamKind,
    bad_message,
    declared_format,
    schema_names,
)
from server.protocol import ROOM_ID, CloseCode, dump
from server.reply_audio import FRAME_SECONDS, PHONE_RATE, BargeIn, PlayoutClock, convert_reply
from voice.audio import mulaw_decode

# --- messages, as Twilio documents them -----------------------------------------------------


class _Twilio(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, populate_by_name=True)


class TwilioMediaFormat(_Twilio):
    encoding: str = "audio/x-mulaw"
    sampleRate: int = 8000
    channels: int = 1


class TwilioStartInfo(_Twilio):
    accountSid: str = ""
    streamSid: str
    callSid: str
    tracks: list[str] = Field(default_factory=lambda: ["inbound"])
    customParameters: dict[str, str] = Field(default_factory=dict)
    mediaFormat: TwilioMediaFormat = Field(default_factory=TwilioMediaFormat)


class TwilioConnected(_Twilio):
    event: Literal["connected"] = "connected"
    protocol: str = "Call"
    version: str = "1.0.0"


class TwilioStart(_Twilio):
    event: Literal["start"] = "start"
    sequenceNumber: str = "1"
    start: TwilioStartInfo
    streamSid: str


class TwilioMediaPayload(_Twilio):
    track: str = "inbound"
    chunk: str = "1"
    timestamp: str = "0"
    payload: str


class TwilioMedia(_Twilio):
    event: Literal["media"] = "media"
    sequenceNumber: str = "0"
    media: TwilioMediaPayload
    streamSid: str


class TwilioMarkName(_Twilio):
    name: str


class TwilioMark(_Twilio):
    event: Literal["mark"] = "mark"
    sequenceNumber: str = "0"
    streamSid: str
    mark: TwilioMarkName


class TwilioDtmfDigit(_Twilio):
    track: str = "inbound_track"
    digit: str


class TwilioDtmf(_Twilio):
    event: Literal["dtmf"] = "dtmf"
    sequenceNumber: str = "0"
    streamSid: str
    dtmf: TwilioDtmfDigit


class TwilioStopInfo(_Twilio):
    accountSid: str = ""
    callSid: str = ""


class TwilioStop(_Twilio):
    event: Literal["stop"] = "stop"
    sequenceNumber: str = "0"
    streamSid: str
    stop: TwilioStopInfo = Field(default_factory=TwilioStopInfo)


TwilioInbound = TwilioConnected | TwilioStart | TwilioMedia | TwilioMark | TwilioDtmf | TwilioStop
_twilio_adapter: TypeAdapter[TwilioInbound] = TypeAdapter(
    Annotated[TwilioInbound, Field(discriminator="event")]
)


def parse_twilio_message(text: str | bytes) -> TwilioInbound:
    return _twilio_adapter.validate_json(text)


class TwilioOutboundMediaPayload(_Twilio):
    payload: str


class TwilioOutboundMedia(_Twilio):
    """Audio to play to the caller: base64 8 kHz µ-law on the leg's `streamSid`."""

    event: Literal["media"] = "media"
    streamSid: str
    media: TwilioOutboundMediaPayload


class TwilioOutboundMark(_Twilio):
    event: Literal["mark"] = "mark"
    streamSid: str
    mark: TwilioMarkName


class TwilioClear(_Twilio):
    event: Literal["clear"] = "clear"
    streamSid: str


def twilio_reply_messages(
    stream_sid: str, pcm16: bytes, rate: int, mark: str = "reply"
) -> Iterator[str]:
    """Twilio `media` messages (8 kHz µ-law) for one reply, then a `mark` named `mark` (Twilio
    sends it back when the reply has played, or when a `clear` dropped it)."""
    data = convert_reply(pcm16, rate, PHONE_RATE, "mulaw")
    step = int(PHONE_RATE * FRAME_SECONDS)
    for i in range(0, len(data), step):
        payload = base64.b64encode(data[i : i + step]).decode("ascii")
        yield dump(
            TwilioOutboundMedia(
                streamSid=stream_sid, media=TwilioOutboundMediaPayload(payload=payload)
            )
        )
    if data:
        yield dump(TwilioOutboundMark(streamSid=stream_sid, mark=TwilioMarkName(name=mark)))


# --- a leg, read into a declaration plus audio --------------------------------------------------

PARTICIPANT = r"[A-Za-z0-9_.:@+-]{1,64}"
INBOUND_TRACKS = ("inbound", "inbound_track")


_NAMES = schema_names(TwilioInbound)


def parse(text: str | bytes) -> TwilioInbound:
    """One message from Twilio, or the refusal for it (Twilio frames are JSON text)."""
    if isinstance(text, bytes):
        raise Refusal(CloseCode.BAD_MESSAGE, "twilio frames are JSON text", "bad_message")
    try:
        return parse_twilio_message(text)
    except ValidationError as exc:
        raise bad_message(exc, _NAMES) from exc


@dataclass(frozen=True)
class TwilioOpening:
    """A leg's `start`: the room and the token its `customParameters` carry."""

    room: str
    token: str | None
    start: TwilioStart


class TwilioFraming:
    """One phone leg: messages up to `start`, the declaration, then `media` until `stop`."""

    kind: ClassVar[StreamKind] = "twilio"

    def __init__(self) -> None:
        self.stream_sid = ""
        self.stream_id: str | None = None
        self.barge_in = BargeIn()
        """The caller talking over a reply still playing: Twilio is sent `clear`."""
        self._replies = 0
        self._clock = PlayoutClock()
        self._playing: set[str] = set()
        """The marks of the replies sent and not yet played (Twilio has not sent them back)."""
        self._owed: list[Outgoing] = []

    def opening(self, message: str | bytes) -> TwilioOpening | None:
        """A message before `start`: None for `connected`, `mark` and `dtmf` (read on), the
        opening at `start`; `media` first is refused, a `stop` raises `StoppedBeforeStart`."""
        parsed = parse(message)
        if isinstance(parsed, TwilioConnected | TwilioMark | TwilioDtmf):
            return None
        if isinstance(parsed, TwilioMedia):
            raise Refusal(CloseCode.AUDIO_BEFORE_START, "media before start", "audio_before_start")
        if isinstance(parsed, TwilioStop):
            raise StoppedBeforeStart
        room = parsed.start.customParameters.get("room", "")
        if not re.fullmatch(ROOM_ID, room):
            raise Refusal(
                CloseCode.BAD_MESSAGE, "customParameters.room missing or invalid", "bad_message"
            )
        return TwilioOpening(room, parsed.start.customParameters.get("token"), parsed)

    def declare(self, opening: TwilioOpening) -> StreamDeclaration:
        """The leg's declaration: 8 kHz µ-law mono only; the participant is the parameter or
        `call-<callSid>`; `shared_mic` is false unless the parameters say otherwise."""
        start = opening.start
        params = start.start.customParameters
        fmt = start.start.mediaFormat
        if fmt.encoding.lower() != "audio/x-mulaw" or fmt.channels != 1:
            raise Refusal(
                CloseCode.UNSUPPORTED_ENCODING,
                "unsupported media format (need audio/x-mulaw mono)",
                "unsupported_encoding",
            )
        participant = params.get("participant") or f"call-{start.start.callSid}"
        if not re.fullmatch(PARTICIPANT, participant):
            raise Refusal(
                CloseCode.BAD_MESSAGE, "customParameters.participant invalid", "bad_message"
            )
        name = params.get("name") or None
        self.stream_sid = start.streamSid or start.start.streamSid
        return StreamDeclaration(
            participant=participant,
            name=name[:80] if name else None,
            shared_mic=params.get("shared_mic", "false").strip().lower() in ("1", "true", "yes"),
            format=declared_format(fmt.sampleRate, "mulaw", 1),
        )

    def audio(self, message: str | bytes) -> bytes | None:
        """The caller's audio of a `media` message (other tracks: none); None at `stop`; a
        second `start` is refused; `connected`, `mark` and `dtmf` carry none."""
        parsed = parse(message)
        if isinstance(parsed, TwilioMedia):
            if parsed.media.track not in INBOUND_TRACKS:
                return b""
            try:
                mulaw = base64.b64decode(parsed.media.payload, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise Refusal(
                    CloseCode.BAD_MESSAGE, "media payload is not base64", "bad_message"
                ) from exc
            playing = self._reply_playing()
            pcm = mulaw_decode(mulaw).tobytes() if playing else b""  # the rule hears it: only then
            if self.barge_in.heard(pcm, PHONE_RATE, playing=playing):
                # (the room's stop, told of the barge-in, may have sent the `clear` already)
                self._owed.extend(self._clear())
            return mulaw
        if isinstance(parsed, TwilioMark):
            self._playing.discard(parsed.mark.name)
            return b""
        if isinstance(parsed, TwilioStop):
            return None
        if isinstance(parsed, TwilioStart):
            raise Refusal(CloseCode.BAD_MESSAGE, "stream already started", "bad_message")
        return b""

    def greeting(self, room: str, stream_id: str) -> list[Outgoing]:
        self.stream_id = stream_id
        return []  # Twilio has no message for it

    def reply_audio(self, pcm16: bytes, sample_rate: int) -> list[Outgoing]:
        """The reply's `media` messages and a mark of its own: until Twilio sends the mark back,
        the reply is playing, and the caller talking over it (`BargeIn`) sends `clear`."""
        self._replies += 1
        mark = f"reply-{self._replies}"
        messages: list[Outgoing] = list(
            twilio_reply_messages(self.stream_sid, pcm16, sample_rate, mark)
        )
        if messages:
            self._playing.add(mark)
            self._clock.sent(len(pcm16) / 2 / sample_rate)
            self.barge_in.reply_out(pcm16, sample_rate)
        return messages

    def answers(self) -> list[Outgoing]:
        owed, self._owed = self._owed, []
        return owed

    def stop_reply(self, stopped: Outgoing) -> list[Outgoing]:
        """`clear` when a reply is still playing at Twilio (someone else in the room talked
        over it; the leg's own barge-in has sent its `clear` already)."""
        self._reply_playing()  # (forgets a reply long played out)
        return self._clear()

    def _reply_playing(self) -> bool:
        """Whether a reply plays at Twilio: a mark of it not back yet, and at most until it
        would have played out (`PlayoutClock`): a mark that never comes back is forgotten."""
        if self._playing and not self._clock.playing():
            self._playing.clear()
        return bool(self._playing)

    def _clear(self) -> list[Outgoing]:
        """`clear` while a reply plays at Twilio (once: its marks are then forgotten)."""
        if not self._playing:
            return []
        self._playing.clear()  # what Twilio holds is dropped; its marks come back
        self.barge_in.reply_dropped()
        return [dump(TwilioClear(streamSid=self.stream_sid))]


# --- the upgrade's signature ------------------------------------------------------------------

SIGNATURE_HEADER = "x-twilio-signature"


class TwilioSignatures:
    """Whether a leg's upgrade comes from Twilio: Twilio signs each Media Streams websocket
    request with `X-Twilio-Signature`, the base64 HMAC-SHA1 of the stream URL keyed with the
    account's auth token. Checked by the Twilio SDK's `RequestValidator` (the `twilio` extra),
    which also tries the URL with and without its port, as Twilio's own signing varies."""

    def __init__(self, auth_token: str, stream_url: str | None = None) -> None:
        require("twilio", "checking Twilio signatures (twilio.auth_token)")
        from twilio.request_validator import RequestValidator

        self._validator = RequestValidator(auth_token)
        self.stream_url = stream_url

    def signed(self, signature: str | None, url: str) -> bool:
        """True when `signature` signs the configured stream URL, or else `url` (the URL the
        request reached) as `wss://` or `ws://` (a TLS proxy in front changes the scheme)."""
        if not signature:
            return False
        if self.stream_url is not None:
            candidates = [self.stream_url]
        else:
            rest = url.split("://", 1)[-1]
            candidates = [f"wss://{rest}", f"ws://{rest}"]
        return any(bool(self._validator.validate(u, {}, signature)) for u in candidates)
