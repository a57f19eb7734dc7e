"""`chorus bench voices` (replay): with `verify`, the replay checks each turn of a named voice as
the server's rename hook does (`voice.identify.turn_matches`) — stretches of one label in a row
are one turn, and a turn whose print is not the person's reads its letter throughout."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from bench.voices import Fed, Meeting, _frames, replay_names, replay_turns
from voice.diarization_stage import StagePrints
from voice.identify import IdentifySettings, KnownVoice, TurnPrint

IAN, OTHER = np.eye(8, dtype=np.float32)[0], np.eye(8, dtype=np.float32)[1]
KNOWN = [KnownVoice("v-ian", "Ian", IAN[None, :])]


def meeting(printed: dict[float, np.ndarray]) -> Meeting:
    """Speaker A (named Ian from the first feed) speaks 0-2 s and 2.2-3 s (one turn), then after
    Speaker B 3-4 s, again 4-6 s (a second turn); `printed`: a turn's print by its start."""
    prints = StagePrints("m", {"Speaker A": IAN}, {"Speaker A": 3.0})
    n = _frames(6.0) + 1
    m = Meeting("m", 6.0, {"Ian": np.zeros(n, dtype=bool)})
    m.fed = [
        Fed(2.0, prints, [("Speaker A", 0.0, 2.0)]),
        Fed(4.0, prints, [("Speaker A", 2.2, 3.0), ("Speaker B", 3.0, 4.0)]),
        Fed(6.0, prints, [("Speaker A", 4.0, 6.0)]),
    ]

    def printer(spans: Sequence[tuple[float, float]]) -> TurnPrint | None:
        made = printed.get(spans[0][0])
        return None if made is None else TurnPrint(made)

    m.printer = printer
    return m


def test_stretches_of_one_label_in_a_row_are_one_turn() -> None:
    turns = replay_turns(meeting({}))
    assert [[(p[0], p[1]) for p in t] for t in turns] == [
        [("Speaker A", 0.0), ("Speaker A", 2.2)],
        [("Speaker B", 3.0)],
        [("Speaker A", 4.0)],
    ]


def test_a_turn_that_does_not_sound_like_the_person_reads_its_letter() -> None:
    m = meeting({0.0: IAN, 4.0: OTHER})
    checked = IdentifySettings(auto=0.5, suggest=0.5, verify=0.4)
    shown, _ = replay_names(m, KNOWN, checked)
    names = {(s.label, s.start): s.name for s in shown}
    assert names == {
        ("Speaker A", 0.0): "Ian",
        ("Speaker A", 2.2): "Ian",
        ("Speaker B", 3.0): None,
        ("Speaker A", 4.0): None,  # its print is someone else's
    }
    unchecked, _ = replay_names(m, KNOWN, IdentifySettings(auto=0.5, suggest=0.5))
    assert {(s.label, s.start): s.name for s in unchecked}[("Speaker A", 4.0)] == "Ian"
    # a turn too short to print reads its letter (as the server's and batch's checks)
    short, _ = replay_names(meeting({0.0: IAN}), KNOWN, checked)
    assert {(s.label, s.start): s.name for s in short}[("Speaker A", 4.0)] is None
    assert {(s.label, s.start): s.name for s in short}[("Speaker A", 0.0)] == "Ian"
