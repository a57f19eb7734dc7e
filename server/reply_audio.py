"""Reply audio on the way out: the assistant's pcm16 turned into what each socket plays.

Owns converting the reply to a socket's rate and encoding (`convert_reply`) and the device's
framing of it: a device gets binary frames in the encoding and sample rate it declared in
`start`. A phone leg's `media` messages are built from the same conversion by `server.twilio`.
Codecs and resampling come from `voice.audio`, the one place audio formats are converted.

Also owns when a reply is playing to a peer that never says (`PlayoutClock`), what a phone leg
still holds of it (`ReplyBacklog`), how loud it is as it plays (`ReplyEnvelope`), and the rule for
a caller talking over it (`BargeIn`, on Silero VAD from `voice.vad`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import numpy as np

from voice.audio import (
    StreamResampler,
    float_to_pcm16,
    mulaw_encode,
    pcm16_to_float,
    resample,
)
from voice.vad import FRAME_SECONDS as VAD_FRAME_SECONDS
from voice.vad import FrameVadStream, SileroFrameModel, frame_levels_db

FRAME_SECONDS = 0.2
"""Reply audio is sent in 200 ms pieces: small enough to start playing at once."""

PHONE_RATE = 8000

BARGE_IN_SPEECH = 0.5
"""Silero VAD's speech probability (its own default threshold) at or above which a 32 ms frame
of a caller's audio is speech for barge-in."""
BARGE_IN_S = 0.064
"""Consecutive speech (two 32 ms VAD frames) that makes a barge-in on a phone."""
BARGE_IN_FLOOR_DBFS = -40.0
"""A speech frame counts for barge-in on a phone only at this RMS level or louder. Silero hears
speech down to about −65 dBFS, so without a floor a phone's residual echo of the reply (speech)
would stop it. With the hold, chosen together on `chorus bench barge_in_rule`: of the holds and
floors that never fire in the quiet of any fixture room (cross-validated by folder) nor on the
reply's own echo 30 dB under it (where the level gate before stopped firing), the pair that hears
a caller soonest. No fixture holds a real echo: the echo there is the reply attenuated."""
ECHO_CANCELLED_BARGE_IN_S = 0.24
"""The hold for a microphone whose own echo cancellation keeps the reply out (a person's
microphone in a browser or app, a LiveKit participant; a device that declares
`echo_cancelled`): the page's hold time, eight VAD frames (256 ms). What a browser's or an app's
echo cancellation leaves of the reply is speech, and no fixture tells how much, so it takes
longer speech than a phone's to count as talking over the reply."""
ECHO_CANCELLED_FLOOR_DBFS = -45.0
"""The floor for an `echo_cancelled` microphone, by the same rule at its hold: the lowest floor
that never fires on the reply's echo 30 dB under it."""

ECHO_WINDOW_S = 1.0
"""How long after a piece of the reply played its echo can still come back in a phone's audio:
the way back over the network, the phone's jitter buffer, and the room's reverberation."""
DOUBLE_TALK_MARGIN_DB = 20.0
"""A phone's speech frame counts for barge-in only within this many dB of the loudest 20 ms of
the reply that played in the `ECHO_WINDOW_S` before it (the Geigel rule of network echo
cancellers): the reply's echo comes back at most as loud as the reply less the phone's echo loss,
a caller talking over it is as loud as they are. So an echo more than about this far under the
reply is never a barge-in, and a caller is heard over the reply down to about this far under its
loud syllables. Chosen on `chorus bench barge_in --speech-replies` over the margins 10, 15 and
20 dB (docs/benchmarks.md, "The reply's own echo is not a caller talking over it"): the
largest of them that kept a caller 15 dB quieter than the reply heard (up to 0.7 s later at
p95; 15 dB lost 44 of their 79 words, the gate silencing what could not barge in); it ends the
loop of an echo 25 dB under the reply and mostly of one 20 dB under, not of louder ones."""


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


ENVELOPE_FRAME_S = 0.02
"""The reply's level is kept per 20 ms of it."""


class ReplyEnvelope:
    """How loud the reply is as it plays to one phone: each 20 ms of it, at the time it plays
    (pieces handed over back to back play one after the other from when the first is handed
    over, as a phone's buffer plays them; a paced leg hands each over as it plays), kept
    `ECHO_WINDOW_S` after. `loudest` is the most that can be echoing back now: what the
    double-talk check of `BargeIn` measures a caller's frame against."""

    def __init__(
        self, window_s: float = ECHO_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        """Now, in seconds (monotonic)."""
        self._frames: deque[tuple[float, float]] = deque()
        """(when it plays, its RMS level in dBFS), in the order they play."""
        self._until = 0.0
        """When what was handed over so far has played."""

    def played(self, pcm16: bytes, rate: int) -> None:
        """A piece of the reply (pcm16 mono at `rate`) handed over to play after what was."""
        step = max(1, round(rate * ENVELOPE_FRAME_S))
        levels = frame_levels_db(pcm16_to_float(pcm16[: len(pcm16) - len(pcm16) % 2]), step)
        count = len(levels)
        if count == 0:
            return
        now = self.clock()
        self._forget(now)  # (a caller who sends nothing never asks `loudest`)
        start = max(self._until, now)
        self._frames.extend((start + i * step / rate, float(level))
                            for i, level in enumerate(levels))  # fmt: skip
        self._until = start + count * step / rate

    def _forget(self, now: float) -> None:
        while self._frames and self._frames[0][0] < now - self.window_s:
            self._frames.popleft()

    def stopped(self) -> None:
        """What was not played by now is dropped (a barge-in: the phone never plays it)."""
        now = self.clock()
        while self._frames and self._frames[-1][0] > now:
            self._frames.pop()
        self._until = min(self._until, now)

    def loudest(self) -> float | None:
        """The loudest 20 ms of the reply that played in the last `window_s` (dBFS); None when
        none did."""
        now = self.clock()
        self._forget(now)
        loudest: float | None = None
        for at, level in self._frames:
            if at > now:
                break
            loudest = level if loudest is None else max(loudest, level)
        return loudest


class BargeIn:
    """A caller talking over the reply playing to them: `hold_s` of consecutive speech, each
    32 ms frame of their audio at `BARGE_IN_SPEECH` or more by Silero VAD, at
    `BARGE_IN_FLOOR_DBFS` or louder, and, on a leg that tells it the reply as it plays it
    (`reply_out`: the phone legs), no more than `DOUBLE_TALK_MARGIN_DB` under the loudest of the
    reply in the last `ECHO_WINDOW_S` (louder than its echo can be), while it plays. The one
    home of the rule for every leg that hears its own barge-ins (SIP and AudioSocket drop the
    reply audio they still hold, Twilio is sent `clear`, an `echo_cancelled` or
    `server_barge_in` device is told `reply_stopped`, the LiveKit worker clears its reply
    track). A phone's 8 kHz audio is heard at 8 kHz, anything wider at 16 kHz.

    A trained VAD, not a level gate: a phone or speakerphone in a room carries the room's noise.
    In the fixture rooms' quiet (156 s between people's turns, `chorus bench barge_in_rule`) the
    level gate before (60 ms at −35 dBFS) went off 44 times on the phone band, 17 times a minute,
    each one a reply cut off by the room itself. This rule, cross-validated, never did, and hears
    a caller about 20 ms later (p50 171 ms against 151 ms from the reference onset, phone band).
    Still an audio rule: a phone that echoes the reply back less than about 20 dB under it (past
    the double-talk check) cuts it off by itself, which is why it runs on phones and
    `echo_cancelled` devices only.

    The VAD runs only while a reply plays, on the event loop: one ONNX call per 32 ms of a
    caller's audio, about 0.08 ms (0.3 % of a core per leg a reply plays to), on a model of its
    own (`barge_in_vad`) that no other thread holds, loaded at the first reply a caller hears
    (about 30 ms, once per process)."""

    def __init__(self, hold_s: float = BARGE_IN_S, floor_dbfs: float = BARGE_IN_FLOOR_DBFS,
                 *, narrowband: bool = False, reply: ReplyEnvelope | None = None) -> None:  # fmt: skip
        self.narrowband = narrowband
        """The caller is on a phone line, whatever rate their audio arrives at (a LiveKit SIP
        participant's track, resampled to 16 kHz): heard at 8 kHz, where Silero hears a
        phone's band about 80 ms sooner than upsampled (docs/benchmarks.md)."""
        self.hold_s = hold_s
        """How long the caller's speech must last (`BARGE_IN_S` for a phone)."""
        self.floor_dbfs = floor_dbfs
        """A speech frame under this level does not count (`BARGE_IN_FLOOR_DBFS`)."""
        self.hold_frames = max(1, math.ceil(hold_s / VAD_FRAME_SECONDS - 1e-9))
        """The same in 32 ms VAD frames."""
        self._vad: FrameVadStream | None = None
        self._resampler: StreamResampler | None = None
        self._run = 0
        self.reply = reply if reply is not None else ReplyEnvelope()
        """The reply as it plays to this caller (`reply_out`): the double-talk check's
        reference. A leg that never tells it (a device) has no such check."""
        self.echo_frames = 0
        """Speech frames loud enough for the floor that the double-talk check did not count (as
        loud as the reply's echo could be)."""
        self.count = 0
        """Barge-ins so far."""
        self.on_barge_in: Callable[[], None] | None = None
        """Told of each barge-in (the server counts them: `chorus_barge_ins_total{kind}`)."""

    @property
    def vad_rate(self) -> int | None:
        """The rate the VAD hears this caller at (8000 or 16000; None until a reply plays)."""
        return None if self._vad is None else self._vad.rate

    def reply_out(self, pcm16: bytes, rate: int) -> None:
        """A piece of the reply handed over to play to this caller (`ReplyEnvelope.played`)."""
        self.reply.played(pcm16, rate)

    def reply_dropped(self) -> None:
        """What the caller's phone held of the reply is dropped (`ReplyEnvelope.stopped`)."""
        self.reply.stopped()

    def heard(self, pcm16: bytes, rate: int, playing: bool) -> bool:
        """One piece of the caller's mono audio (pcm16 at `rate`, any length); True when it
        completes a barge-in."""
        if not playing:
            if self._vad is not None:  # the next reply starts from fresh: no state, no run
                self._vad = self._resampler = None
                self._run = 0
            return False
        usable = len(pcm16) - len(pcm16) % 2
        if usable == 0:
            return False
        vad_rate = 8000 if rate <= 8000 or self.narrowband else 16000  # a phone's band at 8 kHz
        if self._vad is None or self._resampler is None or self._vad.rate != vad_rate:
            self._vad = FrameVadStream(barge_in_vad(), vad_rate)
            self._resampler = StreamResampler(vad_rate)
        audio = self._resampler.resample(pcm16_to_float(pcm16[:usable]), rate)
        loudest = self.reply.loudest()
        echo_under = -math.inf if loudest is None else loudest - DOUBLE_TALK_MARGIN_DB
        fired = False
        for probability, level in zip(*self._vad.accept_levels(audio), strict=True):
            speech = probability >= BARGE_IN_SPEECH and level >= self.floor_dbfs
            if speech and level < echo_under:  # no louder than the reply's echo could be
                self.echo_frames += 1
                speech = False
            self._run = self._run + 1 if speech else 0
            if self._run >= self.hold_frames and not fired:
                self._run = 0
                fired = True
        if not fired:
            return False
        self.count += 1
        if self.on_barge_in is not None:
            self.on_barge_in()
        return True


def echo_cancelled_barge_in() -> BargeIn:
    """The rule for a microphone that cancels its own echo (an `echo_cancelled` device, a LiveKit
    participant's own microphone): `ECHO_CANCELLED_BARGE_IN_S` at `ECHO_CANCELLED_FLOOR_DBFS`."""
    return BargeIn(ECHO_CANCELLED_BARGE_IN_S, ECHO_CANCELLED_FLOOR_DBFS)


_BARGE_IN_VAD: SileroFrameModel | None = None
_BARGE_IN_VAD_LOCK = threading.Lock()


def barge_in_vad() -> SileroFrameModel:
    """The Silero model every `BargeIn` of this process shares: Silero's per-frame export (8 kHz
    natively for a phone), a session of its own, not the diarization stage's
    (`voice.vad.default_model`), so a call on the event loop never waits for a stage thread's
    long batch to release a model's lock."""
    global _BARGE_IN_VAD
    with _BARGE_IN_VAD_LOCK:
        if _BARGE_IN_VAD is None:
            _BARGE_IN_VAD = SileroFrameModel()
        return _BARGE_IN_VAD


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
