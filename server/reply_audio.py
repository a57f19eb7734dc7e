"""Reply audio on the way out: the assistant's pcm16 turned into what each socket plays.

Owns converting the reply to a socket's rate and encoding (`convert_reply`) and the device's
framing of it: a device gets binary frames in the encoding and sample rate it declared in
`start`. A phone leg's `media` messages are built from the same conversion by `server.twilio`.
Codecs and resampling come from `voice.audio`, the one place audio formats are converted.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np

from voice.audio import float_to_pcm16, level_dbfs, mulaw_encode, pcm16_to_float, resample

FRAME_SECONDS = 0.2
"""Reply audio is sent in 200 ms pieces: small enough to start playing at once."""

PHONE_RATE = 8000

BARGE_IN_DBFS = -35.0
"""A caller's 20 ms frame at least this loud (RMS) is speech for barge-in."""
BARGE_IN_S = 0.06
"""Consecutive loud audio (three 20 ms frames, six 10 ms ones) that makes a barge-in."""
ECHO_CANCELLED_BARGE_IN_S = 0.24
"""The same for a microphone whose own echo cancellation keeps the reply out (a person's
microphone in a browser or app, a LiveKit participant; a device that declares
`echo_cancelled`): the page's hold time. Echo cancellation leaves more of the reply and the
room in it than a phone line carries, so it takes longer loud audio to count as talking over
the reply."""


PLAYOUT_SLACK_S = 1.0
"""How long past the time its audio would have played out a reply still counts as playing (the
network and the peer's own buffer)."""


class PlayoutClock:
    """When the reply audio sent to a peer that plays it at real time will have played out,
    reckoned from what was sent: a bound on "still playing" that holds where the peer never says
    so (a Twilio mark that does not come back, a message dropped on the way)."""

    def __init__(self) -> None:
        self.until = 0.0

    def sent(self, seconds: float) -> None:
        self.until = max(self.until, time.monotonic()) + seconds

    def playing(self) -> bool:
        return time.monotonic() < self.until + PLAYOUT_SLACK_S

    def stop(self) -> None:
        """The peer dropped what it held of the reply (a barge-in): nothing plays now."""
        self.until = 0.0


class ReplyBacklog:
    """The reply pieces a phone leg has queued for its caller and not sent yet: the leg paces
    them at real time, so a piece not sent has not played, and a barge-in (`cut`) drops every
    piece queued by then. The one count for the SIP leg and the AudioSocket call."""

    def __init__(self) -> None:
        self._queued = 0
        self._drop = 0

    def queued(self, pieces: int) -> None:
        self._queued += pieces

    @property
    def waiting(self) -> bool:
        """Whether reply pieces are queued that no barge-in dropped (the reply is playing)."""
        return self._queued > self._drop

    def cut(self) -> int:
        """Drop every piece queued so far (the caller barged in); how many that is."""
        self._drop = self._queued
        return self._drop

    def sending(self) -> bool:
        """One queued piece is about to go out: False when a barge-in dropped it."""
        self._queued = max(0, self._queued - 1)
        if self._drop == 0:
            return True
        self._drop -= 1
        return False

    def clear(self) -> None:
        """Forget the counts (what was queued has long played, or never went out)."""
        self._queued = self._drop = 0


class BargeIn:
    """A phone's caller talking over the reply playing to them: `BARGE_IN_S` of consecutive
    frames of theirs, each at `BARGE_IN_DBFS` or louder, while it plays. The one home of the rule
    for every phone leg (SIP and AudioSocket drop the reply audio they still hold, Twilio is sent
    `clear`, the LiveKit worker clears its reply track).

    An energy gate on the caller's decoded audio, not a VAD: a phone that echoed the reply back
    loudly would cut it off. Phones cancel their own echo, which is why a phone leg is not
    silenced while a reply plays (`StreamDeclaration.echo_gate`)."""

    def __init__(self, hold_s: float = BARGE_IN_S) -> None:
        self.hold_s = hold_s
        """How long the caller's audio must stay loud (`BARGE_IN_S` for a phone)."""
        self._loud = 0.0
        self.count = 0
        """Barge-ins so far."""
        self.on_barge_in: Callable[[], None] | None = None
        """Told of each barge-in (the server counts them: `chorus_barge_ins_total{kind}`)."""

    def heard(self, pcm16: bytes, rate: int, playing: bool) -> bool:
        """One frame of the caller's audio (pcm16 at `rate`); True when it completes a barge-in."""
        if not playing:
            self._loud = 0.0
            return False
        usable = len(pcm16) - len(pcm16) % 2
        loud = usable > 0 and level_dbfs(pcm16_to_float(pcm16[:usable])) >= BARGE_IN_DBFS
        self._loud = self._loud + usable / 2 / rate if loud else 0.0
        if self._loud < self.hold_s - 1e-9:
            return False
        self._loud = 0.0
        self.count += 1
        if self.on_barge_in is not None:
            self.on_barge_in()
        return True


def convert_reply(pcm16: bytes, from_rate: int, to_rate: int, encoding: str) -> bytes:
    usable = len(pcm16) - len(pcm16) % 2
    audio = pcm16_to_float(pcm16[:usable])
    audio = resample(audio, from_rate, to_rate)
    out = float_to_pcm16(audio)
    if encoding == "mulaw":
        return mulaw_encode(np.frombuffer(out, dtype="<i2"))
    return out


def device_reply_frames(
    pcm16: bytes, rate: int, device_rate: int, encoding: str
) -> Iterator[bytes]:
    """Binary frames for a device: its own rate and encoding, mono."""
    data = convert_reply(pcm16, rate, device_rate, encoding)
    step = int(device_rate * FRAME_SECONDS) * (2 if encoding == "pcm16" else 1)
    for i in range(0, len(data), step):
        yield data[i : i + step]
