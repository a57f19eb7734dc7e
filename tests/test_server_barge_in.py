"""The barge-in rule (`server.reply_audio.BargeIn`), the one every phone leg uses: `BARGE_IN_S`
of consecutive loud audio while a reply plays, whatever the frame size. Through the legs:
`tests/test_server_sip.py`, `tests/test_server_phone_barge_in.py` (Twilio),
`tests/test_server_audiosocket.py`, `tests/test_livekit_worker.py`."""

from __future__ import annotations

import json

import numpy as np
import pytest

from server.audiosocket import AudioSocketFraming, Kind
from server.device import DeviceFraming
from server.protocol import ReplyStoppedMessage, dump
from server.reply_audio import BARGE_IN_DBFS, BARGE_IN_S, BargeIn
from server.sip import SipFraming
from server.twilio import TwilioFraming


def frame(ms: int, dbfs: float, rate: int = 8000) -> bytes:
    """`ms` of a 440 Hz tone whose RMS reads `dbfs`."""
    t = np.arange(rate * ms // 1000) / rate
    amplitude = 10 ** (dbfs / 20) * np.sqrt(2)
    return (amplitude * 32767 * np.sin(2 * np.pi * 440 * t)).astype("<i2").tobytes()


@pytest.mark.parametrize(("ms", "rate"), [(20, 8000), (10, 16000), (20, 48000)])
def test_a_barge_in_is_loud_audio_for_barge_in_s_whatever_the_frame_size(ms: int, rate: int) -> None:
    barge = BargeIn()
    told: list[int] = []
    barge.on_barge_in = lambda: told.append(barge.count)
    loud = frame(ms, BARGE_IN_DBFS + 6, rate)
    frames = round(BARGE_IN_S * 1000 / ms)
    assert [barge.heard(loud, rate, playing=True) for _ in range(frames)] == [False] * (frames - 1) + [True]
    assert barge.count == 1 and told == [1]
    # it starts again from nothing: another BARGE_IN_S for another one
    assert [barge.heard(loud, rate, playing=True) for _ in range(frames)] == [False] * (frames - 1) + [True]


def test_quiet_audio_or_no_reply_playing_breaks_the_run() -> None:
    loud, quiet = frame(20, BARGE_IN_DBFS + 6), frame(20, BARGE_IN_DBFS - 6)
    for pcm, playing in ((quiet, True), (loud, False)):  # a quiet frame; a frame with no reply
        barge = BargeIn()
        assert not barge.heard(loud, 8000, playing=True)
        assert not barge.heard(loud, 8000, playing=True)
        assert not barge.heard(pcm, 8000, playing=playing)
        assert not barge.heard(loud, 8000, playing=True)  # the run starts over
        assert not barge.heard(loud, 8000, playing=True)
        assert barge.heard(loud, 8000, playing=True)
    assert not BargeIn().heard(b"", 8000, playing=True)


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
