"""The barge-in rule (`server.reply_audio.BargeIn`), the one every phone leg uses: `BARGE_IN_S`
of consecutive speech (Silero VAD) while a reply plays, whatever the frame size; a room's noise,
a hiss or a tone is not speech; the reply's own echo is not a caller talking over it (the
double-talk check against `ReplyEnvelope`). Through the legs:
`tests/test_server_sip.py`, `tests/test_server_phone_barge_in.py` (Twilio),
`tests/test_server_audiosocket.py`, `tests/test_livekit_worker.py`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from server.audiosocket import AudioSocketFraming, Kind
from server.device import DeviceFraming
from server.framing import Refusal
from server.protocol import ReplyStoppedMessage, dump
from server.reply_audio import (
    BARGE_IN_FLOOR_DBFS,
    BARGE_IN_S,
    DOUBLE_TALK_MARGIN_DB,
    ECHO_CANCELLED_BARGE_IN_S,
    ECHO_WINDOW_S,
    BargeIn,
    ReplyEnvelope,
)
from server.sip import SipFraming
from server.twilio import TwilioFraming
from tests.conftest import Clock, far_room, meeting_speech
from tests.test_sip_leg import a_leg
from voice.audio import float_to_pcm16, level_dbfs, pcm16_to_float, resample


def frame(ms: int, dbfs: float, rate: int = 8000) -> bytes:
    """`ms` of a 440 Hz tone whose RMS reads `dbfs`."""
    t = np.arange(rate * ms // 1000) / rate
    amplitude = 10 ** (dbfs / 20) * np.sqrt(2)
    return (amplitude * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()


def pieces(pcm16: bytes, rate: int, ms: int) -> list[bytes]:
    step = rate * ms // 1000 * 2
    return [pcm16[i : i + step] for i in range(0, len(pcm16) - step + 1, step)]


def fired_at(barge: BargeIn, frames: list[bytes], rate: int, ms: int,
             playing: bool = True) -> list[float]:  # fmt: skip
    """When each barge-in completed: the end of the frame it completed on (seconds)."""
    return [(i + 1) * ms / 1000 for i, f in enumerate(frames) if barge.heard(f, rate, playing)]


ONSET_S = 0.6
"""Alice starts talking in the demo meeting (`meeting.rttm`)."""


@pytest.mark.parametrize(("ms", "rate"), [(20, 8000), (10, 16000), (20, 48000)])
def test_a_barge_in_is_barge_in_s_of_speech_whatever_the_frame_size(ms: int, rate: int) -> None:
    """Speech (the demo meeting's first turn, from its quiet start): the first barge-in completes
    `BARGE_IN_S` of speech after Alice starts, give or take the VAD's frames; while she talks on,
    every further one takes another `BARGE_IN_S`."""
    barge = BargeIn()
    told: list[int] = []
    barge.on_barge_in = lambda: told.append(barge.count)
    times = fired_at(barge, pieces(meeting_speech(0.0, 2.0, rate), rate, ms), rate, ms)
    assert times, "no barge-in over two seconds of speech"
    assert ONSET_S + BARGE_IN_S - 0.05 <= times[0] <= ONSET_S + BARGE_IN_S + 0.25, times
    # each further one another BARGE_IN_S of speech (the resampler hands the VAD its audio in
    # bursts, so single gaps between them vary by a frame or two)
    assert len(times) - 1 <= (times[-1] - times[0] + 0.032) / BARGE_IN_S
    assert barge.count == len(times) and told == list(range(1, len(times) + 1))


def test_a_longer_hold_takes_longer_speech() -> None:
    frames = pieces(meeting_speech(0.0, 2.0, 16000), 16000, 20)
    phone = fired_at(BargeIn(), frames, 16000, 20)[0]
    person = fired_at(BargeIn(ECHO_CANCELLED_BARGE_IN_S), frames, 16000, 20)[0]
    assert person - phone >= ECHO_CANCELLED_BARGE_IN_S - BARGE_IN_S - 0.04
    assert BargeIn(ECHO_CANCELLED_BARGE_IN_S).hold_frames == 8  # 256 ms of 32 ms VAD frames


def test_no_reply_playing_breaks_the_run_and_the_next_reply_starts_afresh() -> None:
    speech = pieces(meeting_speech(0.7, 2.0, 8000), 8000, 20)  # Alice mid-turn
    barge = BargeIn()
    assert fired_at(barge, speech, 8000, 20, playing=False) == []  # talking is just talking
    # two frames of speech under a reply, then it ends, then the next one: the run starts over
    assert fired_at(barge, speech[:2], 8000, 20) == []
    assert not barge.heard(speech[2], 8000, playing=False)
    times = fired_at(barge, speech[3:], 8000, 20)
    assert times and times[0] >= BARGE_IN_S
    assert not BargeIn().heard(b"", 8000, playing=True)
    assert not BargeIn().heard(b"\x01", 8000, playing=True)  # half a sample: nothing to hear


def test_loud_sounds_that_are_not_speech_are_no_barge_in() -> None:
    """A level gate (60 ms at −35 dBFS, the rule before) took each of these for a caller."""
    rng = np.random.default_rng(0)
    hiss = float_to_pcm16((rng.standard_normal(5 * 8000) * 0.1).astype(np.float32))
    tone = b"".join(frame(20, -12) for _ in range(250))
    for sound in (hiss, tone):
        assert fired_at(BargeIn(), pieces(sound, 8000, 20), 8000, 20) == []


def test_the_quiet_of_a_far_field_room_is_no_barge_in(shared_fixtures: Path) -> None:
    """A speakerphone on a meeting table: the room's noise and reverberation between people's
    turns (the far render of a LibriSpeech conversation, every stretch of a second or more that
    nobody talks in, 0.2 s after a turn to 0.1 s before the next) never stops a reply. The level
    gate before fired in this room's quiet 19 times in 15 s."""
    audio, _, quiet = far_room(shared_fixtures)
    assert sum(b - a for a, b in quiet) >= 10.0
    for a, b in quiet:  # each stretch as a reply of its own
        pcm = float_to_pcm16(audio[int(a * 8000) : int(b * 8000)])
        assert fired_at(BargeIn(), pieces(pcm, 8000, 20), 8000, 20) == [], (a, b)


def test_each_framing_stops_the_room_s_reply_it_holds() -> None:
    """`StreamFraming.stop_reply` (someone else in the room talked over the reply): a device is
    told (the room's `reply_stopped`), a Twilio leg playing a reply is sent `clear` once, an
    AudioSocket call sends none of what it queued, a SIP leg is told to drop its queue."""
    stopped = dump(ReplyStoppedMessage(room="r", stream="other"))
    assert DeviceFraming().stop_reply(stopped) == [stopped]

    twilio = TwilioFraming()
    twilio.stream_sid = "MZ1"
    assert twilio.stop_reply(stopped) == []  # nothing playing
    assert twilio.reply_audio(frame(200, -20, 16000), 16000)
    [clear] = twilio.stop_reply(stopped)
    assert json.loads(clear) == {"event": "clear", "streamSid": "MZ1"}
    assert twilio.stop_reply(stopped) == []  # once

    call = AudioSocketFraming()
    call.audio_kind = Kind.AUDIO  # 8 kHz signed linear
    queued = call.reply_audio(frame(200, -20, 16000), 16000)
    assert queued and call.stop_reply(stopped) == []
    assert [call.sending(m) for m in queued] == [False] * len(queued)
    after = call.reply_audio(frame(200, -20, 16000), 16000)  # the next reply goes out
    assert after and [call.sending(m) for m in after] == [True] * len(after)

    sip = SipFraming(8000)
    told: list[str] = []
    sip.on_stop_reply = lambda: told.append("stop")
    assert sip.stop_reply(stopped) == [] and told == ["stop"]


def test_speech_under_the_floor_is_no_barge_in() -> None:
    """A phone's residual echo of the reply is speech, tens of dB under the reply: Silero hears
    speech that quiet, so a frame under `BARGE_IN_FLOOR_DBFS` does not count."""
    speech = pcm16_to_float(meeting_speech(0.6, 4.0, 8000))
    level = level_dbfs(speech)

    def at(dbfs: float) -> list[bytes]:
        scaled = (speech * 10 ** ((dbfs - level) / 20)).astype(np.float32)
        return pieces(float_to_pcm16(scaled), 8000, 20)

    assert fired_at(BargeIn(), at(BARGE_IN_FLOOR_DBFS - 12), 8000, 20) == []
    assert fired_at(BargeIn(floor_dbfs=-160.0), at(BARGE_IN_FLOOR_DBFS - 12), 8000, 20)
    assert fired_at(BargeIn(), at(BARGE_IN_FLOOR_DBFS + 12), 8000, 20)


def test_a_phone_line_heard_at_a_higher_rate_is_heard_at_8_khz() -> None:
    """A LiveKit SIP participant's track arrives at 16 kHz but carries a phone's band: the rule
    hears it at 8 kHz (`narrowband`), as a phone leg's own audio."""
    phone = float_to_pcm16(resample(pcm16_to_float(meeting_speech(0.0, 2.0, 8000)), 8000, 16000))
    frames = pieces(phone, 16000, 20)
    narrow, wide = BargeIn(narrowband=True), BargeIn()
    assert fired_at(narrow, frames, 16000, 20) and fired_at(wide, frames, 16000, 20)
    assert (narrow.vad_rate, wide.vad_rate) == (8000, 16000)


def test_the_reply_envelope_is_what_played_in_the_echo_window() -> None:
    """Pieces handed over back to back play one after the other (a phone's buffer); only what
    has played counts, for `ECHO_WINDOW_S`; a barge-in drops what had not played."""
    clock = Clock()
    reply = ReplyEnvelope(clock=clock)
    assert reply.loudest() is None
    reply.played(frame(200, -30), 8000)
    reply.played(frame(200, -10), 8000)  # plays 0.2 s from now, after the first
    assert reply.loudest() == pytest.approx(-30, abs=0.1)
    clock.now += 0.25
    assert reply.loudest() == pytest.approx(-10, abs=0.1)
    clock.now += 0.2 + ECHO_WINDOW_S  # the loud piece ended a window ago
    assert reply.loudest() is None
    reply.played(frame(100, -20), 8000)  # plays from now: what played long ago is not ahead
    reply.played(frame(400, -5), 8000)
    clock.now += 0.05
    reply.stopped()  # a barge-in: the loud piece never plays
    clock.now += 0.5
    assert reply.loudest() == pytest.approx(-20, abs=0.1)
    reply.played(frame(100, -25), 8000)  # the next reply plays from now
    clock.now += 0.01
    assert reply.loudest() == pytest.approx(-20, abs=0.1)
    for _ in range(100):  # an hour of replies nobody asks about keeps only the last window
        reply.played(frame(1000, -20), 8000)
        clock.now += 36.0
    reply.played(frame(20, -30), 8000)
    assert len(reply._frames) <= ECHO_WINDOW_S / 0.02 + 2


def echoing(reply: np.ndarray, loss_db: float, delay_s: float = 0.1) -> np.ndarray:
    """What a phone sends back of `reply` (8 kHz): `loss_db` under it, `delay_s` late."""
    late = np.concatenate([np.zeros(int(delay_s * 8000), np.float32), reply])[: len(reply)]
    return (late * 10 ** (-loss_db / 20)).astype(np.float32)


def heard_over_a_reply(barge: BargeIn, clock: Clock, reply: np.ndarray | None,
                       caller: np.ndarray) -> list[float]:  # fmt: skip
    """The reply handed over to play now (None: the rule is told nothing of it), the caller's
    audio heard in 20 ms pieces as it plays (the clock moving with them): when each barge-in
    completed."""
    if reply is not None:
        barge.reply_out(float_to_pcm16(reply), 8000)
    times = []
    for i, piece in enumerate(pieces(float_to_pcm16(caller), 8000, 20)):
        clock.now += 0.02
        if barge.heard(piece, 8000, playing=True):
            times.append((i + 1) * 0.02)
    return times


def loud_reply() -> np.ndarray:
    """A reply 4 s of speech at −14 dBFS (the demo meeting's later turns, which Alice never
    says): loud enough that its echo 20 dB down is over the floor."""
    speech = pcm16_to_float(meeting_speech(41.41, 45.41, 8000))
    return (speech * 10 ** ((-14 - level_dbfs(speech)) / 20)).astype(np.float32)


def test_the_reply_s_echo_over_the_floor_is_no_barge_in() -> None:
    """A phone whose echo control is weak sends the reply back 20 dB down: over the floor, and
    speech, so the rule alone took it for the caller; measured against the reply as it played
    (its loudest 20 ms less `DOUBLE_TALK_MARGIN_DB`) it is no louder than an echo can be."""
    reply = loud_reply()
    echo = echoing(reply, 20.0)
    without = BargeIn(reply=ReplyEnvelope(clock=Clock()))
    assert heard_over_a_reply(without, Clock(), None, echo)
    clock = Clock()
    barge = BargeIn(reply=ReplyEnvelope(clock=clock))
    assert heard_over_a_reply(barge, clock, reply, echo) == []
    assert barge.echo_frames > 0 and barge.count == 0


def test_a_caller_talking_over_the_reply_and_its_echo_is_a_barge_in() -> None:
    """Alice talks over the reply at her own level (the reply's less 6 dB) while her phone
    echoes it 20 dB down: her speech is louder than any echo, so she still barges in, at most a
    few frames later than she does with no reply and no echo."""
    reply = loud_reply()
    alice = pcm16_to_float(meeting_speech(0.0, 4.0, 8000))
    alice = (alice * 10 ** ((-20 - level_dbfs(alice)) / 20)).astype(np.float32)
    plain = heard_over_a_reply(BargeIn(), Clock(), None, alice)
    clock = Clock()
    times = heard_over_a_reply(BargeIn(reply=ReplyEnvelope(clock=clock)), clock, reply,
                               alice + echoing(reply, 20.0))  # fmt: skip
    assert plain and times
    assert plain[0] >= ONSET_S and times[0] - plain[0] <= 0.2, (plain[0], times[0])


def test_a_leg_that_says_nothing_of_the_reply_has_no_double_talk_check() -> None:
    """An `echo_cancelled` device tells its rule nothing of the reply it plays: the check
    measures against nothing, and the reply's echo over the floor counts as before."""
    reply = loud_reply()
    barge = BargeIn(reply=ReplyEnvelope(clock=Clock()))
    assert fired_at(barge, pieces(float_to_pcm16(echoing(reply, 20.0)), 8000, 20), 8000, 20)
    assert barge.echo_frames == 0
    assert DOUBLE_TALK_MARGIN_DB > 0


async def test_each_phone_leg_tells_its_rule_the_reply_as_it_plays() -> None:
    """The double-talk check's reference (`BargeIn.reply_out`): a Twilio leg and an AudioSocket
    call when they hand the reply over (it plays from then on), a SIP leg as it sends it; when
    the room's reply stops, what had not played is dropped, so it is never taken for what the
    caller's phone can be echoing."""
    stopped = dump(ReplyStoppedMessage(room="r", stream="other"))
    twilio = TwilioFraming()
    twilio.stream_sid = "MZ1"
    call = AudioSocketFraming()
    call.audio_kind = Kind.AUDIO
    for leg, barge in ((twilio, twilio.barge_in), (call, call.barge_in)):
        clock = Clock()
        barge.reply = ReplyEnvelope(clock=clock)
        assert leg.reply_audio(frame(1000, -20, 16000), 16000)
        assert barge.reply.loudest() == pytest.approx(-20, abs=0.5)
        clock.now += 0.1
        leg.stop_reply(stopped)
        clock.now += ECHO_WINDOW_S + 0.05  # what played of it is a window old; the rest never
        assert barge.reply.loudest() is None, leg

    sip, session = a_leg()
    clock = Clock()
    sip.barge.reply = ReplyEnvelope(clock=clock)
    await sip.send(frame(200, -20))
    assert len(session.sent) == 10 and sip.barge.reply.loudest() == pytest.approx(-20, abs=0.5)
    clock.now += 0.05
    sip.stop_reply()
    clock.now += ECHO_WINDOW_S + 0.05
    assert sip.barge.reply.loudest() is None


def test_a_device_that_leaves_the_barge_in_to_the_server_is_heard_by_its_rule_and_gated() -> None:
    """`server_barge_in`: the server runs its rule on the device's audio (the `echo_cancelled`
    hold and floor) and the device stays silenced while a reply plays (V9); `echo_cancelled`
    implies the rule and lifts the silence; neither: the device decides (`barge_in`)."""
    def started(**fields: object) -> DeviceFraming:
        framing = DeviceFraming()
        framing.start(json.dumps({"type": "start", "participant": "desk", **fields}))
        return framing

    page = started(server_barge_in=True)
    assert page.barge_in is not None and page.barge_in.hold_s == ECHO_CANCELLED_BARGE_IN_S
    assert page.declaration is not None and page.declaration.echo_gate
    cancelling = started(echo_cancelled=True)
    assert cancelling.barge_in is not None and cancelling.declaration is not None
    assert not cancelling.declaration.echo_gate
    plain = started()
    assert plain.barge_in is None and plain.declaration is not None and plain.declaration.echo_gate
    told: list[str] = []
    page.on_barge_in = lambda: told.append("barge-in")
    page.reply_audio(frame(2000, -20, 16000), 16000)  # a reply plays there
    for piece in pieces(meeting_speech(0.0, 2.0, 16000), 16000, 20):
        page.audio(piece)
    assert told == ["barge-in"]


def test_the_barge_in_rule_can_be_switched_mid_stream() -> None:
    """`barge_in_rule` (the page's barge-in switch, turned while it streams): off, the server no
    longer stops the reply on this microphone's speech; on again, it does. Before `start` it is
    refused, as any message but `start` is."""
    framing = DeviceFraming()
    with pytest.raises(Refusal, match="barge_in_rule before start"):
        framing.start(json.dumps({"type": "barge_in_rule", "server_decides": True}))
    framing.start(json.dumps({"type": "start", "participant": "desk", "server_barge_in": True}))
    told: list[str] = []
    framing.on_barge_in = lambda: told.append("barge-in")
    speech = pieces(meeting_speech(0.0, 2.0, 16000), 16000, 20)

    def talk_over_a_reply() -> None:
        framing.reply_audio(frame(2000, -20, 16000), 16000)  # a reply plays there
        for piece in speech:
            framing.audio(piece)

    assert framing.audio(json.dumps({"type": "barge_in_rule", "server_decides": False})) == b""
    assert framing.barge_in is None
    talk_over_a_reply()
    assert told == []
    framing.audio(json.dumps({"type": "barge_in_rule", "server_decides": True}))
    talk_over_a_reply()
    assert told == ["barge-in"]
