"""Asterisk AudioSocket (`[audiosocket] listen`): a PBX call's framing, in both directions.

Owns the AudioSocket wire as typed values and reading a call into one
`server.framing.StreamDeclaration` plus audio (`AudioSocketFraming`). The wire is a TCP stream of
frames: a kind byte, a 2-byte big-endian payload length, the payload. Asterisk sends the call's
UUID (`0x01`, 16 bytes) first, then signed-linear 16-bit little-endian mono audio (`0x10` at
8 kHz; `0x11`–`0x18` at 12, 16, 24, 32, 44.1, 48, 96 and 192 kHz, Asterisk 20.17/22.7/23.1 and
later, asterisk/asterisk#1492), DTMF digits (`0x03`, one ASCII byte), a hangup (`0x00`) or an
error (`0xff`). We send audio of the call's own kind back, and a hangup to end the call.

AudioSocket carries no room and no credentials: the room comes from the UUID→room map an
operator sets over HTTP (`PUT /v1/audiosocket/{uuid}`, the room's `admin` grant;
`AudioSocketCalls`) before Asterisk dials in, or from `[audiosocket] default_room`. The server
(`server.app`) keeps the TCP socket (`server.sockets.TcpSocket`), the limits and the drain; this
module only parses what it is given.
"""

from __future__ import annotations

import re
import struct
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import ClassVar

from server.framing import (
    Outgoing,
    Refusal,
    StoppedBeforeStart,
    StreamDeclaration,
    StreamKind,
    declared_format,
)
from server.protocol import ROOM_ID, CloseCode
from server.reply_audio import BargeIn, PlayoutClock, ReplyBacklog, convert_reply

# --- frames, as Asterisk's res_audiosocket defines them ----------------------------------------


class Kind(IntEnum):
    HANGUP = 0x00
    UUID = 0x01
    DTMF = 0x03
    AUDIO = 0x10
    """slin, 8 kHz (the `AudioSocket()` dialplan application's only format)."""
    SLIN12 = 0x11
    SLIN16 = 0x12
    SLIN24 = 0x13
    SLIN32 = 0x14
    SLIN44 = 0x15
    SLIN48 = 0x16
    SLIN96 = 0x17
    SLIN192 = 0x18
    ERROR = 0xFF


AUDIO_RATES: dict[int, int] = {
    Kind.AUDIO: 8000,
    Kind.SLIN12: 12000,
    Kind.SLIN16: 16000,
    Kind.SLIN24: 24000,
    Kind.SLIN32: 32000,
    Kind.SLIN44: 44100,
    Kind.SLIN48: 48000,
    Kind.SLIN96: 96000,
    Kind.SLIN192: 192000,
}
"""Each audio kind's sample rate (16-bit signed little-endian mono)."""
_KINDS = frozenset(int(k) for k in Kind)
HEADER = struct.Struct(">BH")
MAX_PAYLOAD = 0xFFFF
FRAME_S = 0.02
"""Reply audio goes out as 20 ms frames (what Asterisk itself sends)."""
FRAMES_PER_MESSAGE = 10
"""…ten to one outgoing message, so a long reply stays within the stream's outbox."""


@dataclass(frozen=True)
class Frame:
    kind: int
    payload: bytes = b""

    def encode(self) -> bytes:
        return HEADER.pack(self.kind, len(self.payload)) + self.payload

    @classmethod
    def decode(cls, data: bytes) -> Frame:
        """One whole frame (as `FrameSplitter` cuts them)."""
        kind, length = HEADER.unpack_from(data)
        if len(data) != HEADER.size + length:
            raise ValueError("frame length does not match its header")
        return cls(kind, bytes(data[HEADER.size :]))


HANGUP = Frame(Kind.HANGUP).encode()


def uuid_frame(call: uuid.UUID) -> bytes:
    return Frame(Kind.UUID, call.bytes).encode()


class FrameSplitter:
    """Bytes off the TCP stream in, whole encoded frames out (a frame may arrive in pieces).
    Holds at most one partial frame (a payload is at most 65535 bytes)."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        frames: list[bytes] = []
        while len(self._buffer) >= HEADER.size:
            _, length = HEADER.unpack_from(self._buffer)
            end = HEADER.size + length
            if len(self._buffer) < end:
                break
            frames.append(bytes(self._buffer[:end]))
            del self._buffer[:end]
        return frames


def audio_seconds(message: bytes) -> float:
    """Seconds of audio in an outgoing message (encoded frames back to back): how long the
    socket waits before the next one, so replies go out at real time."""
    seconds = 0.0
    offset = 0
    while offset + HEADER.size <= len(message):
        kind, length = HEADER.unpack_from(message, offset)
        rate = AUDIO_RATES.get(kind)
        if rate is not None:
            seconds += length / (2 * rate)
        offset += HEADER.size + length
    return seconds


def reply_messages(pcm16: bytes, from_rate: int, kind: int) -> list[bytes]:
    """A reply as this call's audio frames (its own kind and rate), 20 ms each, grouped."""
    rate = AUDIO_RATES[kind]
    data = convert_reply(pcm16, from_rate, rate, "pcm16")
    step = int(rate * FRAME_S) * 2
    frames = [Frame(kind, data[i : i + step]).encode() for i in range(0, len(data), step)]
    return [
        b"".join(frames[i : i + FRAMES_PER_MESSAGE])
        for i in range(0, len(frames), FRAMES_PER_MESSAGE)
    ]


# --- the UUID → room map ------------------------------------------------------------------------

PARTICIPANT = r"[A-Za-z0-9_.:@+-]{1,64}"


@dataclass(frozen=True)
class AudioSocketCall:
    """Where a call goes and who it is, as an operator (or the default) said."""

    room: str
    participant: str | None = None
    name: str | None = None
    shared_mic: bool = False


class AudioSocketCalls:
    """The UUID→room map (`PUT /v1/audiosocket/{uuid}`): each entry is taken once, by the call
    that connects with its UUID, and expires after `ttl_s`; at most `max_entries` are held (the
    oldest goes first), so a client setting entries that no call uses cannot grow memory."""

    def __init__(self, ttl_s: float, max_entries: int) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._calls: OrderedDict[uuid.UUID, tuple[float, AudioSocketCall]] = OrderedDict()

    def put(self, call_id: uuid.UUID, call: AudioSocketCall) -> None:
        self._expire()
        self._calls.pop(call_id, None)
        self._calls[call_id] = (time.monotonic() + self.ttl_s, call)
        while len(self._calls) > self.max_entries:
            self._calls.popitem(last=False)

    def take(self, call_id: uuid.UUID) -> AudioSocketCall | None:
        self._expire()
        entry = self._calls.pop(call_id, None)
        return entry[1] if entry is not None else None

    def __len__(self) -> int:
        self._expire()
        return len(self._calls)

    def _expire(self) -> None:
        now = time.monotonic()
        while self._calls:
            first = next(iter(self._calls))
            if self._calls[first][0] > now:
                break
            del self._calls[first]


# --- a call, read into a declaration plus audio -------------------------------------------------


@dataclass(frozen=True)
class AudioSocketOpening:
    """A call up to its first audio: its UUID, and that audio's kind (the call's rate)."""

    call_id: uuid.UUID
    kind: int
    first_audio: bytes
    """The first audio frame, encoded: the stream's first message once it is open."""


def _parse(message: str | bytes) -> Frame:
    if isinstance(message, str):
        raise Refusal(CloseCode.BAD_MESSAGE, "audiosocket frames are binary", "bad_message")
    try:
        frame = Frame.decode(message)
    except (struct.error, ValueError) as exc:
        raise Refusal(CloseCode.BAD_MESSAGE, "malformed audiosocket frame", "bad_message") from exc
    if frame.kind not in _KINDS:
        raise Refusal(CloseCode.BAD_MESSAGE, "unknown audiosocket frame kind", "bad_message")
    return frame


class AudioSocketFraming:
    """One AudioSocket call: the UUID, audio until a hangup; DTMF digits go to `on_dtmf`."""

    kind: ClassVar[StreamKind] = "audiosocket"

    def __init__(self) -> None:
        self.call_id: uuid.UUID | None = None
        self.audio_kind: int | None = None
        self.stream_id: str | None = None
        self.on_dtmf: Callable[[str], None] | None = None
        """Told each digit the caller pressed once the stream is open (the feed's `dtmf`)."""
        self._carry = b""
        self.barge_in = BargeIn()
        """The caller talking over reply audio still queued for them drops it (`sending`)."""
        self.cleared_s = 0.0
        """Seconds of reply audio dropped by barge-in."""
        self._backlog = ReplyBacklog()
        self._clock = PlayoutClock()

    def opening(self, message: str | bytes) -> AudioSocketOpening | None:
        """A frame before the call's first audio: None for the UUID and DTMF (read on), the
        opening at the first audio. Audio before the UUID, a second UUID or a bad UUID is
        refused; a hangup or an error raises `StoppedBeforeStart`."""
        frame = _parse(message)
        if frame.kind in (Kind.HANGUP, Kind.ERROR):
            raise StoppedBeforeStart
        if frame.kind == Kind.UUID:
            if self.call_id is not None:
                raise Refusal(CloseCode.BAD_MESSAGE, "a second uuid frame", "bad_message")
            if len(frame.payload) != 16:
                raise Refusal(CloseCode.BAD_MESSAGE, "uuid frame is not 16 bytes", "bad_message")
            self.call_id = uuid.UUID(bytes=frame.payload)
            return None
        if frame.kind == Kind.DTMF:
            return None
        if self.call_id is None:
            raise Refusal(CloseCode.AUDIO_BEFORE_START, "audio before uuid", "audio_before_start")
        assert isinstance(message, bytes)
        return AudioSocketOpening(self.call_id, frame.kind, message)

    def declare(self, opening: AudioSocketOpening, call: AudioSocketCall) -> StreamDeclaration:
        """The call's declaration: pcm16 mono at its audio kind's rate; the participant is the
        map's, else `call-<uuid>` (never the caller's number)."""
        participant = call.participant or f"call-{opening.call_id}"
        if not re.fullmatch(PARTICIPANT, participant):
            raise Refusal(CloseCode.BAD_MESSAGE, "participant invalid", "bad_message")
        if not re.fullmatch(ROOM_ID, call.room):
            raise Refusal(CloseCode.BAD_MESSAGE, "room invalid", "bad_message")
        self.audio_kind = opening.kind
        return StreamDeclaration(
            participant=participant,
            name=call.name[:80] if call.name else None,
            shared_mic=call.shared_mic,
            format=declared_format(AUDIO_RATES[opening.kind], "pcm16", 1),
        )

    def audio(self, message: str | bytes) -> bytes | None:
        """Whole samples of an audio frame of the call's kind; None at a hangup or an error;
        a digit is told to `on_dtmf`; audio of another rate or a second UUID is refused."""
        frame = _parse(message)
        if frame.kind in (Kind.HANGUP, Kind.ERROR):
            return None
        if frame.kind == Kind.DTMF:
            digit = frame.payload[:1].decode("ascii", "replace")
            if digit and digit in "0123456789*#ABCDabcd" and self.on_dtmf is not None:
                self.on_dtmf(digit.upper())
            return b""
        if frame.kind == Kind.UUID:
            raise Refusal(CloseCode.BAD_MESSAGE, "a second uuid frame", "bad_message")
        if frame.kind != self.audio_kind:
            raise Refusal(CloseCode.BAD_MESSAGE, "audio rate changed mid-call", "bad_format")
        data = self._carry + frame.payload
        cut = len(data) - len(data) % 2
        self._carry = data[cut:]
        playing = self._backlog.waiting and self._clock.playing()
        if self.barge_in.heard(data[:cut], AUDIO_RATES[frame.kind], playing=playing):
            self._cut()
        return data[:cut]

    def silence(self, seconds: float) -> list[bytes]:
        """`seconds` of silence as audio frames of the call's kind (none before it is known):
        what a pause in the caller's audio reads as (`server.sockets.PauseFill`)."""
        if self.audio_kind is None or seconds <= 0:
            return []
        data = bytes(round(seconds * AUDIO_RATES[self.audio_kind]) * 2)
        step = MAX_PAYLOAD - MAX_PAYLOAD % 2
        return [Frame(self.audio_kind, data[i : i + step]).encode() for i in range(0, len(data), step)]

    def answers(self) -> list[Outgoing]:
        return []

    def stop_reply(self, stopped: Outgoing) -> list[Outgoing]:
        self._cut()
        return []

    def _cut(self) -> None:
        """The caller's barge-in, or the room's: every reply message not written yet is dropped
        (`sending`), and the barge-in rule forgets what of it never played."""
        self._backlog.cut()
        self.barge_in.reply_dropped()

    def greeting(self, room: str, stream_id: str) -> list[Outgoing]:
        self.stream_id = stream_id
        return []  # AudioSocket has no message for it

    def reply_audio(self, pcm16: bytes, sample_rate: int) -> list[Outgoing]:
        if self.audio_kind is None:
            return []
        messages = reply_messages(pcm16, sample_rate, self.audio_kind)
        if not self._clock.playing():  # what was queued before has long played (or was lost)
            self._backlog.clear()
        self._backlog.queued(len(messages))
        self._clock.sent(len(pcm16) / 2 / sample_rate)
        self.barge_in.reply_out(pcm16, sample_rate)
        return list(messages)

    def sending(self, message: bytes) -> bool:
        """Whether a reply message the socket is about to send goes out (the socket paces them
        at real time, so what is not sent yet has not played): not when the caller barged in
        after it was queued."""
        if self._backlog.sending():
            return True
        self.cleared_s += audio_seconds(message)
        return False
