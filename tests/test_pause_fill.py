"""`server.sockets.PauseFill`: the one rule for a call whose audio stops between talk spurts."""

from __future__ import annotations

import pytest

from server.audiosocket import AUDIO_RATES, AudioSocketFraming, Frame, Kind
from server.sockets import PAUSE_FRAME_S, SILENCE_FILL_S, PauseFill


def test_nothing_is_owed_before_the_first_audio_or_before_the_pause_is_long_enough() -> None:
    pauses = PauseFill()
    assert pauses.due() is None and pauses.take(100.0) == 0
    pauses.heard(10.0)
    assert pauses.due() == pytest.approx(10.0 + SILENCE_FILL_S)
    assert pauses.take(10.0 + SILENCE_FILL_S / 2) == 0


def test_a_pause_is_fed_in_whole_frames_for_the_time_it_lasted_and_again_as_it_goes_on() -> None:
    pauses = PauseFill()
    pauses.heard(10.0)
    first = pauses.take(10.25)
    assert first == pytest.approx(0.24) and pauses.due() == pytest.approx(10.24 + SILENCE_FILL_S)
    assert pauses.take(10.50) == pytest.approx(0.26)
    assert pauses.filled_s == pytest.approx(0.5)


def test_what_the_wire_shows_was_skipped_is_owed_less_what_the_clock_already_fed() -> None:
    pauses = PauseFill()
    pauses.heard(10.0)
    assert pauses.take(10.3) == pytest.approx(0.3)
    assert pauses.owed(0.5) == pytest.approx(0.2)  # the pause was 0.5 s: 0.2 s more
    assert pauses.owed(0.1) == pytest.approx(0.1)  # a short one, all of it
    pauses.heard(11.0)
    assert pauses.take(11.5) == pytest.approx(0.5)  # a stall, not a pause: fed, then
    assert pauses.owed(0.3) == 0 and pauses.owed(0.4) == pytest.approx(0.2)  # owed that much less


def test_a_resume_feeds_nothing_for_the_time_before_it() -> None:
    pauses = PauseFill()
    pauses.heard(10.0)
    pauses.resume(30.0)
    assert pauses.take(30.1) == 0 and pauses.take(30.3) == pytest.approx(0.3)


@pytest.mark.parametrize("kind", [Kind.AUDIO, Kind.SLIN16, Kind.SLIN192])
def test_an_audiosocket_pause_reads_as_frames_of_the_call_s_own_kind(kind: Kind) -> None:
    framing = AudioSocketFraming()
    assert framing.silence(0.2) == []  # before the call's kind is known
    framing.audio_kind = kind
    frames = [Frame.decode(f) for f in framing.silence(0.24)]
    assert {f.kind for f in frames} == {kind} and not any(any(f.payload) for f in frames)
    assert sum(len(f.payload) for f in frames) == round(0.24 * AUDIO_RATES[kind]) * 2
    assert all(len(f.payload) <= 0xFFFF for f in frames)
    assert sum(len(f.payload) for f in (Frame.decode(x) for x in framing.silence(PAUSE_FRAME_S))) \
        == round(PAUSE_FRAME_S * AUDIO_RATES[kind]) * 2
