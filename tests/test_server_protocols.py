"""Each stream protocol module reads its framing into one `StreamDeclaration` plus audio
(issue 26.4): a table of messages in, declarations, audio and refusals out, no socket."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.device import DeviceFraming
from server.framing import Refusal, StoppedBeforeStart, StreamDeclaration, StreamFraming
from server.protocol import CloseCode, StartMessage, dump, parse_server_message
from server.reply_audio import BARGE_IN_S
from server.sockets import close_reason
from server.twilio import TwilioFraming, TwilioOpening
from tests.conftest import far_room, meeting_speech
from voice.audio import StreamFormat


def _refused(call: Any, *args: Any) -> tuple[int, str, str]:
    with pytest.raises(Refusal) as info:
        call(*args)
    return int(info.value.code), info.value.metric, info.value.reason


# --------------------------------------------------------------------------- device


@pytest.mark.parametrize(
    ("start", "declared"),
    [
        (
            {"type": "start", "participant": "desk"},
            StreamDeclaration("desk", None, True, StreamFormat(16000, "pcm16", 1)),
        ),
        (
            {"type": "start", "participant": "ann", "name": "Ann", "shared_mic": False,
             "sample_rate": 8000, "encoding": "mulaw"},
            StreamDeclaration("ann", "Ann", False, StreamFormat(8000, "mulaw", 1)),
        ),
        (
            {"type": "start", "participant": "array", "sample_rate": 48000, "channels": 4},
            StreamDeclaration("array", None, True, StreamFormat(48000, "pcm16", 4)),
        ),
    ],
)
def test_a_device_start_is_its_declaration(start: dict[str, Any], declared: StreamDeclaration) -> None:
    assert DeviceFraming().start(json.dumps(start)) == declared


@pytest.mark.parametrize(
    ("first", "code", "metric"),
    [
        (b"\x00\x00", CloseCode.AUDIO_BEFORE_START, "audio_before_start"),
        ("]]", CloseCode.BAD_MESSAGE, "bad_json"),
        ('{"type": "hello"}', CloseCode.BAD_MESSAGE, "bad_message"),
        ('{"type": "start"}', CloseCode.BAD_MESSAGE, "bad_message"),
        ('{"type": "start", "participant": "a b"}', CloseCode.BAD_MESSAGE, "bad_message"),
        ('{"type": "start", "participant": "a", "channels": 9}', CloseCode.BAD_MESSAGE,
         "bad_message"),
        ('{"type": "start", "participant": "a", "encoding": "opus"}',
         CloseCode.UNSUPPORTED_ENCODING, "unsupported_encoding"),
        ('{"type": "start", "participant": "a", "encoding": "mulaw"}', CloseCode.BAD_MESSAGE,
         "bad_message"),  # µ-law is 8 kHz
    ],
)
def test_a_bad_device_start_is_refused(first: str | bytes, code: int, metric: str) -> None:
    assert _refused(DeviceFraming().start, first)[:2] == (code, metric)


def test_a_device_stop_before_start_ends_quietly() -> None:
    with pytest.raises(StoppedBeforeStart):
        DeviceFraming().start('{"type": "stop"}')


def test_device_frames_are_realigned_to_whole_samples_until_stop() -> None:
    device = DeviceFraming()
    device.start(dump(StartMessage(participant="array", channels=2)))  # 4-byte sample frames
    assert [device.audio(frame) for frame in (b"\x01\x02\x03", b"\x04\x05", b"\x06\x07\x08")] == [
        b"",
        b"\x01\x02\x03\x04",
        b"\x05\x06\x07\x08",
    ]
    assert device.audio('{"type": "stop"}') is None


def test_a_second_device_start_is_refused() -> None:
    device = DeviceFraming()
    device.start(dump(StartMessage(participant="desk")))
    assert _refused(device.audio, dump(StartMessage(participant="desk"))) == (
        CloseCode.BAD_MESSAGE, "bad_message", "stream already started"
    )


def test_a_device_barge_in_is_told_and_carries_no_audio_and_not_before_start() -> None:
    assert _refused(DeviceFraming().start, '{"type": "barge_in"}') == (
        CloseCode.BAD_MESSAGE, "bad_message", "barge_in before start"
    )
    device = DeviceFraming()
    told: list[str] = []
    device.on_barge_in = lambda: told.append(device.stream_id)
    device.start(dump(StartMessage(participant="desk")))
    device.greeting("r1", "device-1")
    assert device.audio('{"type": "barge_in"}') == b"" and told == ["device-1"]


def test_a_device_that_cancels_echo_is_not_gated_and_the_server_hears_its_barge_in() -> None:
    """`echo_cancelled`: not silenced while a reply plays (V9); 240 ms of speech while the reply
    sent to it still plays is a barge-in (once per reply), as for a person's own microphone;
    with no reply playing, or only the room's quiet, nothing. Stereo is heard as its mean."""
    for channels in (1, 2):
        device = DeviceFraming()
        told: list[str] = []
        device.on_barge_in = lambda told=told: told.append("barge-in")  # type: ignore[misc]
        declaration = device.start(dump(StartMessage(participant="desk", echo_cancelled=True,
                                                     channels=channels)))  # fmt: skip
        device.greeting("r1", "device-1")
        assert declaration.echo_gate is False
        quiet = frames_of(meeting_speech(0.0, 0.6), channels)  # before Alice talks
        speech = frames_of(meeting_speech(0.6, 4.0), channels)
        for f in speech[:30]:
            device.audio(f)  # no reply playing
        assert told == []
        device.reply_audio(b"\x00\x00" * 16000 * 5, 16000)  # 5 s of reply, playing now
        for f in quiet:
            device.audio(f)
        assert told == []
        for f in speech[:12]:  # 240 ms: not yet (the VAD's eighth 32 ms frame is 256 ms)
            device.audio(f)
        assert told == []
        fed = 12
        for f in speech[12:40]:
            device.audio(f)
            fed += 1
            if told:
                break
        assert told == ["barge-in"] and fed * 0.02 <= 0.6, fed
        for f in speech[40:100]:
            device.audio(f)  # still talking: the reply is already stopped
        assert told == ["barge-in"]
        device.reply_audio(b"\x00\x00" * 16000 * 5, 16000)  # the next reply...
        assert device.stop_reply("stopped") == ["stopped"]  # ...stopped by someone else
        for f in speech[100:]:
            device.audio(f)  # nothing plays there any more: no barge-in over it
        assert told == ["barge-in"]
    assert DeviceFraming().start(dump(StartMessage(participant="desk"))).echo_gate is True


def test_an_echo_cancelled_device_s_barge_in_starts_afresh_at_each_reply() -> None:
    """Speech that began under one reply and did not last the hold does not count towards a
    barge-in over the next one."""
    device = DeviceFraming()
    told: list[str] = []
    device.on_barge_in = lambda: told.append("barge-in")
    device.start(dump(StartMessage(participant="desk", echo_cancelled=True)))
    device.greeting("r1", "device-1")
    speech = frames_of(meeting_speech(0.6, 4.0))
    device.reply_audio(b"\x00\x00" * 16000 * 5, 16000)
    for f in speech[:11]:  # 220 ms of speech: not yet a barge-in
        device.audio(f)
    assert told == []
    device.stop_reply("stopped")  # that reply stopped (someone else in the room talked)
    device.audio(speech[11])  # heard with no reply playing
    device.reply_audio(b"\x00\x00" * 16000 * 5, 16000)  # the next reply
    for f in speech[12:16]:  # 80 ms more
        device.audio(f)
    assert told == []


def frames_of(pcm16: bytes, channels: int = 1) -> list[bytes]:
    """20 ms binary frames of 16 kHz mono pcm16, each sample repeated on `channels` channels."""
    samples = np.repeat(np.frombuffer(pcm16, "<i2"), channels)
    step = 320 * channels
    return [samples[i : i + step].tobytes() for i in range(0, len(samples) - step + 1, step)]


def test_the_device_hears_started_and_replies_in_its_own_format() -> None:
    device = DeviceFraming()
    device.start(dump(StartMessage(participant="ann", sample_rate=8000, encoding="mulaw")))
    [greeting] = device.greeting("r1", "device-1")
    assert parse_server_message(greeting).model_dump() == {
        "type": "started", "room": "r1", "stream": "device-1", "participant": "ann"
    }
    one_second_at_16k = b"\x00\x00" * 16000
    frames = device.reply_audio(one_second_at_16k, 16000)
    assert all(isinstance(f, bytes) for f in frames)
    assert sum(len(f) for f in frames) == 8000  # 8 kHz µ-law: one byte a sample


# --------------------------------------------------------------------------- Twilio


def _twilio_start(params: dict[str, str], media_format: dict[str, Any] | None = None) -> str:
    start: dict[str, Any] = {"streamSid": "MZ1", "callSid": "CA1", "customParameters": params}
    if media_format is not None:
        start["mediaFormat"] = media_format
    return json.dumps({"event": "start", "streamSid": "MZ1", "start": start})


def _opened(params: dict[str, str], media_format: dict[str, Any] | None = None) -> TwilioFraming:
    leg = TwilioFraming()
    opening = leg.opening(_twilio_start(params, media_format))
    assert opening is not None
    leg.declare(opening)
    return leg


@pytest.mark.parametrize(
    ("params", "declared"),
    [
        ({"room": "r1"}, StreamDeclaration("call-CA1", None, False, StreamFormat(8000, "mulaw"))),
        (
            {"room": "r1", "participant": "p-dana", "name": "Dana", "shared_mic": "yes"},
            StreamDeclaration("p-dana", "Dana", True, StreamFormat(8000, "mulaw")),
        ),
        ({"room": "r1", "name": "N" * 100},
         StreamDeclaration("call-CA1", "N" * 80, False, StreamFormat(8000, "mulaw"))),
        ({"room": "r1", "name": "", "shared_mic": " TRUE "},
         StreamDeclaration("call-CA1", None, True, StreamFormat(8000, "mulaw"))),
    ],
)
def test_a_twilio_start_is_its_opening_and_declaration(
    params: dict[str, str], declared: StreamDeclaration
) -> None:
    leg = TwilioFraming()
    opening = leg.opening(_twilio_start({**params, "token": "t0"}))
    assert isinstance(opening, TwilioOpening) and (opening.room, opening.token) == ("r1", "t0")
    assert leg.declare(opening) == declared
    assert leg.stream_sid == "MZ1"


@pytest.mark.parametrize(
    "message",
    [
        {"event": "connected", "protocol": "Call", "version": "1.0.0"},
        {"event": "mark", "streamSid": "MZ1", "mark": {"name": "m"}},
        {"event": "dtmf", "streamSid": "MZ1", "dtmf": {"digit": "5"}},
    ],
)
def test_messages_before_a_twilio_start_are_read_past(message: dict[str, Any]) -> None:
    assert TwilioFraming().opening(json.dumps(message)) is None


@pytest.mark.parametrize(
    ("message", "code", "metric"),
    [
        (b"\x00", CloseCode.BAD_MESSAGE, "bad_message"),
        ("]]", CloseCode.BAD_MESSAGE, "bad_json"),
        ('{"event": "hello"}', CloseCode.BAD_MESSAGE, "bad_message"),
        ('{"event": "media", "streamSid": "MZ1", "media": {"payload": "AAAA"}}',
         CloseCode.AUDIO_BEFORE_START, "audio_before_start"),
        (_twilio_start({}), CloseCode.BAD_MESSAGE, "bad_message"),
        (_twilio_start({"room": "no/slash"}), CloseCode.BAD_MESSAGE, "bad_message"),
    ],
)
def test_a_bad_twilio_opening_is_refused(message: str | bytes, code: int, metric: str) -> None:
    assert _refused(TwilioFraming().opening, message)[:2] == (code, metric)


@pytest.mark.parametrize(
    ("params", "media_format", "code", "metric"),
    [
        ({"room": "r1"}, {"encoding": "audio/l16", "sampleRate": 16000, "channels": 1},
         CloseCode.UNSUPPORTED_ENCODING, "unsupported_encoding"),
        ({"room": "r1"}, {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 2},
         CloseCode.UNSUPPORTED_ENCODING, "unsupported_encoding"),
        ({"room": "r1"}, {"encoding": "audio/x-mulaw", "sampleRate": 16000, "channels": 1},
         CloseCode.BAD_MESSAGE, "bad_format"),  # µ-law is 8 kHz (V10)
        ({"room": "r1", "participant": "has space"}, None, CloseCode.BAD_MESSAGE, "bad_message"),
    ],
)
def test_a_twilio_start_that_cannot_be_declared_is_refused(
    params: dict[str, str], media_format: dict[str, Any] | None, code: int, metric: str
) -> None:
    leg = TwilioFraming()
    opening = leg.opening(_twilio_start(params, media_format))
    assert _refused(leg.declare, opening)[:2] == (code, metric)


def test_a_twilio_stop_before_start_ends_quietly() -> None:
    with pytest.raises(StoppedBeforeStart):
        TwilioFraming().opening('{"event": "stop", "streamSid": "MZ1"}')


def _media(payload: str, track: str = "inbound") -> str:
    return json.dumps(
        {"event": "media", "streamSid": "MZ1", "media": {"track": track, "payload": payload}}
    )


def test_twilio_media_is_the_callers_audio_until_stop() -> None:
    leg = _opened({"room": "r1"})
    audio = bytes(range(160))
    payload = base64.b64encode(audio).decode()
    assert leg.audio(_media(payload)) == audio
    assert leg.audio(_media(payload, track="inbound_track")) == audio
    assert leg.audio(_media(payload, track="outbound")) == b""  # not the caller
    assert leg.audio('{"event": "mark", "streamSid": "MZ1", "mark": {"name": "reply"}}') == b""
    assert leg.audio('{"event": "stop", "streamSid": "MZ1"}') is None


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (_media("not base64!"), "media payload is not base64"),
        (_twilio_start({"room": "r1"}), "stream already started"),
        (b"\x00", "twilio frames are JSON text"),
    ],
)
def test_a_bad_twilio_media_message_is_refused(message: str | bytes, reason: str) -> None:
    assert _refused(_opened({"room": "r1"}).audio, message) == (
        CloseCode.BAD_MESSAGE, "bad_message", reason
    )


def _mulaw_frames(pcm16: bytes) -> list[str]:
    """20 ms `media` messages of 8 kHz pcm16."""
    from voice.audio import mulaw_encode

    samples = np.frombuffer(pcm16, "<i2")
    return [_media(base64.b64encode(mulaw_encode(samples[i : i + 160])).decode())
            for i in range(0, len(samples) - 159, 160)]  # fmt: skip


def test_a_twilio_caller_talking_over_a_reply_gets_it_cleared_once() -> None:
    """While a reply's mark has not come back, the caller talking (`BargeIn`: `BARGE_IN_S` of
    speech) makes the leg owe Twilio one `clear`; the line's quiet, or talking once every reply
    has played, owe nothing. A mark of a cleared reply coming back changes nothing."""
    leg = _opened({"room": "r1"})
    quiet = _mulaw_frames(meeting_speech(0.0, 0.6, 8000))  # before Alice talks
    speech = _mulaw_frames(meeting_speech(0.6, 4.0, 8000))
    for f in speech[:20]:  # no reply playing: talking is just talking
        leg.audio(f)
    assert leg.answers() == []
    first = [json.loads(m) for m in leg.reply_audio(b"\x10\x00" * 16000, 16000)]
    assert first[-1]["mark"]["name"] == "reply-1"
    for f in quiet:
        leg.audio(f)
    assert leg.answers() == []
    fed = 0
    for f in speech[:25]:
        leg.audio(f)
        fed += 1
        if leg.barge_in.count:
            break
    assert BARGE_IN_S <= fed * 0.02 <= BARGE_IN_S + 0.3, fed  # four 32 ms VAD frames, its onset
    assert [json.loads(m) for m in leg.answers()] == [{"event": "clear", "streamSid": "MZ1"}]
    assert leg.answers() == []  # once
    for f in speech[25:60]:  # still talking: the reply is already cleared
        leg.audio(f)
    assert leg.answers() == [] and leg.barge_in.count == 1
    leg.audio('{"event": "mark", "streamSid": "MZ1", "mark": {"name": "reply-1"}}')  # sent back
    second = [json.loads(m) for m in leg.reply_audio(b"\x10\x00" * 1600, 16000)]
    assert second[-1]["mark"]["name"] == "reply-2"
    leg.audio('{"event": "mark", "streamSid": "MZ1", "mark": {"name": "reply-2"}}')  # played
    for f in speech[60:100]:
        leg.audio(f)
    assert leg.answers() == [] and leg.barge_in.count == 1


def test_a_speakerphone_in_a_far_room_does_not_clear_the_reply_by_itself(
    shared_fixtures: Path,
) -> None:
    """A Twilio caller on a speakerphone in a reverberant room, nobody talking: the room's noise
    and reverberation between turns (a LibriSpeech conversation's far render, 0.2 s after a
    turn to 0.1 s before the next) never clears the reply; the caller talking then does. The
    level gate before fired 19 times in this room's 15 s of quiet."""
    from voice.audio import float_to_pcm16

    audio, spans, quiet = far_room(shared_fixtures)
    assert sum(b - a for a, b in quiet) >= 10.0
    leg = _opened({"room": "r1"})
    leg.reply_audio(b"\x10\x00" * 16000 * 60, 16000)  # a minute of reply, playing
    for a, b in quiet:
        for f in _mulaw_frames(float_to_pcm16(audio[int(a * 8000) : int(b * 8000)])):
            leg.audio(f)
    assert leg.answers() == [] and leg.barge_in.count == 0
    start, end = spans[1]  # then someone in that room talks over it
    for f in _mulaw_frames(float_to_pcm16(audio[int(start * 8000) : int(end * 8000)])):
        leg.audio(f)
    assert leg.barge_in.count >= 1
    assert {"event": "clear", "streamSid": "MZ1"} in [json.loads(m) for m in leg.answers()]


def test_a_reply_whose_mark_never_comes_back_stops_counting_once_it_has_played_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A peer that never sends a reply's mark back (or loses it): once the reply has played out
    (its duration, plus `PLAYOUT_SLACK_S`, after it was sent), the caller talking is no barge-in."""
    import time

    from server import reply_audio

    monkeypatch.setattr(reply_audio, "PLAYOUT_SLACK_S", 0.01)
    leg = _opened({"room": "r1"})
    leg.reply_audio(b"\x10\x00" * 320, 16000)  # 20 ms
    time.sleep(0.1)  # time only makes "played out" truer
    for f in _mulaw_frames(meeting_speech(0.6, 1.6, 8000)):  # a second of speech
        leg.audio(f)
    assert leg.answers() == [] and leg.barge_in.count == 0


def test_the_caller_hears_nothing_on_start_and_replies_as_media_on_its_stream() -> None:
    leg = _opened({"room": "r1"})
    assert leg.greeting("r1", "twilio-1") == []
    *media, mark = (json.loads(m) for m in leg.reply_audio(b"\x00\x00" * 16000, 16000))
    assert {m["event"] for m in media} == {"media"} and mark["event"] == "mark"
    assert {m["streamSid"] for m in (*media, mark)} == {"MZ1"}
    assert sum(len(base64.b64decode(m["media"]["payload"])) for m in media) == 8000


# --------------------------------------------------------------------------- one shape


def test_both_protocols_have_the_shape_the_server_runs() -> None:
    framings: list[StreamFraming] = [DeviceFraming(), TwilioFraming()]
    assert [f.kind for f in framings] == ["device", "twilio"]


# --------------------------------------------------------------------------- reasons


MARK = "zz-client-text"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (TwilioFraming().opening, json.dumps({"event": MARK})),
        (TwilioFraming().opening, _twilio_start({MARK: 5})),  # type: ignore[dict-item]
        (TwilioFraming().opening, json.dumps({"event": "start", "streamSid": MARK})),
        (DeviceFraming().start, json.dumps({"type": MARK})),
        (DeviceFraming().start, json.dumps({"type": "start", "participant": MARK + " !"})),
        (DeviceFraming().start, json.dumps({"type": "start", "participant": "a",
                                            "sample_rate": MARK})),
    ],
)  # fmt: skip
def test_a_refusal_reason_never_echoes_the_message(call: Any, message: str) -> None:
    """Issue 25.2: a reason is a fixed text per kind of problem (pydantic's own message quotes
    the input for some errors, a dict key is client text)."""
    code, _, reason = _refused(call, message)
    assert code == CloseCode.BAD_MESSAGE and reason.startswith("bad message at ")
    assert MARK not in reason


def test_a_declared_format_refusal_names_no_declared_value() -> None:
    leg = TwilioFraming()
    opening = leg.opening(_twilio_start({"room": "r1"}, {"sampleRate": 12345}))
    assert opening is not None
    code, metric, reason = _refused(leg.declare, opening)
    assert (code, metric) == (CloseCode.BAD_MESSAGE, "bad_format") and "12345" not in reason


@pytest.mark.parametrize("text", ["ł" * 100, "a" * 122 + "ł", "a" * 200, "ok", "\ud800" * 5])
def test_a_close_reason_is_at_most_123_bytes_of_whole_characters(text: str) -> None:
    cut = close_reason(text)
    assert len(cut.encode()) <= 123
    assert text.startswith(cut) or "\ud800" in text  # a cut, never a split character
    if len(text.encode("utf-8", "replace")) <= 123:
        assert cut == text or "\ud800" in text
