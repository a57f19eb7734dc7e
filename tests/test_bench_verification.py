"""`chorus bench verification`'s pieces: who talks alone, the windows cut there, and the EER."""

from __future__ import annotations

import numpy as np

from bench.verification import alone_stretches, cut_windows, equal_error_rate


def test_windows_come_only_from_where_one_speaker_talks_alone() -> None:
    segments = [(0.0, 4.0, "A"), (3.0, 6.0, "B"), (6.5, 7.0, "A")]
    stretches = alone_stretches(segments, 7.0)
    assert stretches["A"] == [(0.0, 3.0), (6.5, 7.0)]
    assert stretches["B"] == [(4.0, 6.0)]
    assert cut_windows(stretches["A"], 1.5, 30) == [0.0, 1.5]
    assert cut_windows([(0.0, 10.0)], 1.0, 3) == [0.0, 4.0, 9.0]  # spread evenly


def test_equal_error_rate_where_misses_meet_false_alarms() -> None:
    targets = np.array([True] * 4 + [False] * 4)
    separated = np.array([0.9, 0.8, 0.7, 0.6, 0.1, 0.2, 0.3, 0.4])
    assert equal_error_rate(separated, targets)[0] == 0.0
    one_swap = np.array([0.9, 0.8, 0.7, 0.3, 0.1, 0.2, 0.6, 0.4])
    eer, threshold = equal_error_rate(one_swap, targets)
    assert eer == 0.25
    assert 0.3 <= threshold <= 0.7
