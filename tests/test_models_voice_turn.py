"""The typed voice turn (issue 10, seams): written once by the voice channel, read by the realtime
channel; on the wire it stays the V2 metadata keys."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from models import VoiceTurn


@given(label=st.one_of(st.none(), st.text(max_size=20)),
       start=st.floats(0, 1e5), length=st.floats(0, 100), session=st.text(min_size=1, max_size=12))
def test_a_voice_turn_survives_its_metadata(label: str | None, start: float, length: float,
                                            session: str) -> None:
    turn = VoiceTurn(label, start, start + length, session)
    back = VoiceTurn.from_metadata(turn.metadata())
    assert back is not None
    assert back.speaker_label == label and back.voice_session_id == session
    assert abs(back.start - start) <= 5e-4 and abs(back.end - (start + length)) <= 5e-4


def test_metadata_keeps_the_documented_v2_keys() -> None:
    assert VoiceTurn("Speaker A", 1.23456, 2.5, "abc").metadata() == {
        "speaker_label": "Speaker A", "start": 1.235, "end": 2.5,
        "voice_session_id": "abc", "source": "voice",
    }


def test_other_events_and_malformed_times_are_not_voice_turns() -> None:
    assert VoiceTurn.from_metadata({"source": "chat", "start": 1, "end": 2}) is None
    assert VoiceTurn.from_metadata({"source": "voice", "start": "1", "end": 2}) is None
    assert VoiceTurn.from_metadata({"source": "voice", "start": True, "end": 2}) is None
    turn = VoiceTurn.from_metadata({"source": "voice", "start": 1, "end": 2, "speaker_label": 7})
    assert turn == VoiceTurn(None, 1.0, 2.0, "")
