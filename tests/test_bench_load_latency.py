"""The load bench's latency bookkeeping (`bench.load`): a corrected turn counts from the first
version the device had right, not from its first, wrong one."""

from __future__ import annotations

import pytest

from bench.load import settled_versions, turn_latencies
from server.protocol import TurnMessage


def turn(event: str, end: float, speaker: str = "Speaker A", corrected: bool = False,
         text: str = "…") -> TurnMessage:
    return TurnMessage(room="r", speaker=speaker, label=speaker, text=text, start=0.0, end=end,
                       participant="p", event_id=event, corrected=corrected)


def test_a_corrected_turn_counts_from_the_version_with_its_final_speaker_and_end() -> None:
    versions = [
        (10.0, turn("a", 2.0, text="what do I")),  # early: ends before the final turn does
        (10.5, turn("b", 4.0)),
        (11.0, turn("a", 3.0, corrected=True, text="what do I here seek?")),
        (12.0, turn("c", 5.0, speaker="Speaker B")),
        (12.5, turn("c", 5.0, speaker="Speaker B", corrected=True, text="fixed word")),  # text only
        (13.0, turn("d", 6.0, speaker="Speaker A")),
        (14.0, turn("d", 6.0, speaker="Speaker B", corrected=True)),  # another voice: settles late
    ]
    settled = [(now, m.end) for now, m in settled_versions(versions)]
    assert settled == [(10.5, 4.0), (11.0, 3.0), (12.0, 5.0), (14.0, 6.0)]


def test_strict_latency_is_from_the_turn_s_own_end() -> None:
    sent_audio = [float(s) for s in range(1, 11)]
    sent_wall = [100.0 + s for s in range(1, 11)]
    completion, strict = turn_latencies([(103.5, 3.0), (105.2, 5.0)], sent_audio, sent_wall)
    assert strict == pytest.approx([0.5, 0.2])
    assert completion == pytest.approx([0.5, 0.2])
