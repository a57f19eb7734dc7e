"""The barge-in rule (`server.reply_audio.BargeIn`), the one every phone leg uses: `BARGE_IN_S`
of consecutive speech (Silero VAD) while a reply plays, whatever the frame size; a room's noise,
a hiss or a tone is not speech. Through the legs:
`tests/test_server_sip.py`, `tests/test_server_phone_barge_in.py` (Twilio),
`tests/test_server_audiosocket.py`, `tests/test_livekit_worker.py`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from server.audiosocket import AudioSocketFraming, Kind
from server.device import DeviceFraming
from server.protocol import ReplyStoppedMessage, dump
from server.reply_audio import (
    BARGE_IN_FLOOR_DBFS,
    BARGE_IN_S,
    ECHO_CANCELLED_BARGE_IN_S,
    BargeIn,
)
from server.sip import SipFraming
from server.twilio import TwilioFraming
from tests.conftest import far_room, meeting_speech
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
