"""The device stream protocol (`/v1/rooms/{room}/stream`): a conference-room device's framing.

Owns reading that framing into a `server.framing.StreamDeclaration` plus audio: the first
message is a JSON `start` (`server.protocol.StartMessage`: participant, name, shared mic, rate,
encoding, channels), binary frames of raw audio follow, a JSON `stop` ends the stream. Frames
may split a sample; they are realigned here, so the room only ever gets whole sample frames.
To the device go `started`, then its turns, replies and their audio as binary frames in its own
format (`server.reply_audio`). The room and the token are in the URL, so the server checks the
token before the first message is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import numpy as np
from pydantic import ValidationError

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
from server.protocol import (
    BargeInMessage,
    BargeInRuleMessage,
    CloseCode,
    DeviceRequest,
    StartedMessage,
    StartMessage,
    StopMessage,
    dump,
    error_location,
    parse_device_message,
)
from server.reply_audio import (
    BargeIn,
    PlayoutClock,
    device_reply_frames,
    echo_cancelled_barge_in,
)
from voice.audio import StreamFormat, mulaw_decode

_NAMES = schema_names(StartMessage, StopMessage, BargeInMessage, BargeInRuleMessage)


def parse(text: str) -> DeviceRequest:
    """A device's JSON message, or the refusal for it (an unknown encoding is told apart)."""
    try:
        return parse_device_message(text)
    except ValidationError as exc:
        if error_location(list(exc.errors()))[-1:] == ("encoding",):
            raise Refusal(
                CloseCode.UNSUPPORTED_ENCODING,
                "unsupported encoding (use pcm16 or mulaw)",
                "unsupported_encoding",
            ) from exc
        raise bad_message(exc, _NAMES) from exc


def declaration_of(start: StartMessage) -> StreamDeclaration:
    return StreamDeclaration(
        participant=start.participant,
        name=start.name,
        shared_mic=start.shared_mic,
        format=declared_format(start.sample_rate, start.encoding, start.channels),
        echo_gate=not start.echo_cancelled,  # a device that cancels echo may talk over a reply
    )


class DeviceFraming:
    """One device socket: `start` → declaration, then binary audio until `stop`."""

    kind: ClassVar[StreamKind] = "device"

    def __init__(self) -> None:
        self.declaration: StreamDeclaration | None = None
        self._carry = b""
        self.stream_id = ""
        self.on_barge_in: Callable[[], None] | None = None
        """Told when the device says it stopped the reply because someone talked over it, or,
        for a device that cancels echo itself (`echo_cancelled`) or leaves the decision to the
        server (`server_barge_in`), when the server hears someone talk over the reply it is
        playing (`barge_in`)."""
        self.barge_in: BargeIn | None = None
        """The server's barge-in rule on an `echo_cancelled` or `server_barge_in` device's
        audio."""
        self._clock = PlayoutClock()
        """When the reply audio sent to the device will have played (it plays at real time)."""

    def start(self, message: str | bytes) -> StreamDeclaration:
        """The first message: a `start` declares the stream. Audio first is refused; a `stop`
        raises `StoppedBeforeStart`."""
        if isinstance(message, bytes):
            raise Refusal(CloseCode.AUDIO_BEFORE_START, "audio before start", "audio_before_start")
        parsed = parse(message)
        if isinstance(parsed, StopMessage):
            raise StoppedBeforeStart
        if isinstance(parsed, BargeInMessage | BargeInRuleMessage):
            raise Refusal(CloseCode.BAD_MESSAGE, f"{parsed.type} before start", "bad_message")
        self.declaration = declaration_of(parsed)
        self._server_decides(parsed.echo_cancelled or parsed.server_barge_in)
        return self.declaration

    def _server_decides(self, decides: bool) -> None:
        """Run the server's barge-in rule on this device's audio (or stop running it)."""
        if not decides:
            self.barge_in = None
        elif self.barge_in is None:
            self.barge_in = echo_cancelled_barge_in()
            self.barge_in.on_barge_in = lambda: self.on_barge_in() if self.on_barge_in else None

    def audio(self, message: str | bytes) -> bytes | None:
        """Whole sample frames of a binary message (a split sample waits for the next); None
        at `stop`; `barge_in` is told to `on_barge_in`; a second `start` is refused."""
        if isinstance(message, bytes):
            fmt = self._declared().format
            data = self._carry + message
            cut = len(data) - len(data) % fmt.bytes_per_frame
            self._carry = data[cut:]
            if self.barge_in is not None:
                if self._clock.playing():
                    self._hear(data[:cut], fmt)
                else:  # no reply plays: the rule starts afresh at the next one
                    self.barge_in.heard(b"", fmt.sample_rate, playing=False)
            return data[:cut]
        parsed = parse(message)
        if isinstance(parsed, StopMessage):
            return None
        if isinstance(parsed, BargeInMessage):
            if self.on_barge_in is not None:
                self.on_barge_in()
            return b""
        if isinstance(parsed, BargeInRuleMessage):  # the page's switch, changed mid-stream
            self._server_decides(parsed.server_decides)
            return b""
        raise Refusal(CloseCode.BAD_MESSAGE, "stream already started", "bad_message")

    def answers(self) -> list[Outgoing]:
        return []

    def stop_reply(self, stopped: Outgoing) -> list[Outgoing]:
        self._clock.stop()  # nothing plays there now: no barge-in over it (`echo_cancelled`)
        return [stopped]  # the device drops the reply audio it holds

    def greeting(self, room: str, stream_id: str) -> list[Outgoing]:
        self.stream_id = stream_id
        participant = self._declared().participant
        return [dump(StartedMessage(room=room, stream=stream_id, participant=participant))]

    def reply_audio(self, pcm16: bytes, sample_rate: int) -> list[Outgoing]:
        fmt = self._declared().format
        self._clock.sent(len(pcm16) / 2 / sample_rate)
        return list(device_reply_frames(pcm16, sample_rate, fmt.sample_rate, fmt.encoding))

    def _hear(self, audio: bytes, fmt: StreamFormat) -> None:
        """The barge-in rule on a piece of the device's audio (a reply plays; `echo_cancelled`
        or `server_barge_in`)."""
        assert self.barge_in is not None
        samples = mulaw_decode(audio) if fmt.encoding == "mulaw" else np.frombuffer(audio, "<i2")
        if fmt.channels > 1:  # the rule hears one channel: the channels' mean
            samples = samples.reshape(-1, fmt.channels).mean(axis=1).astype("<i2")
        if self.barge_in.heard(samples.tobytes(), fmt.sample_rate, playing=True):
            self._clock.stop()  # what it held is dropped (`reply_stopped`)

    def _declared(self) -> StreamDeclaration:
        if self.declaration is None:
            raise RuntimeError("the device stream has not started")
        return self.declaration
