"""`chorus bench barge_in_rule`: the barge-in rule on the fixture rooms, with the level gates it
replaced beside it, and the hold chosen leave-one-set-out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.barge_in_rule import Recording, Score, choose_hold, moments


def test_onsets_follow_half_a_second_of_nobody_and_quiet_is_a_second_or_more() -> None:
    spans = [(1.0, 3.0), (2.5, 4.0), (4.2, 5.0), (7.0, 8.0)]  # an overlap, a short gap, a long
    onsets, quiet = moments(spans, duration=10.0)
    assert onsets == [1.0, 7.0]  # 4.2 follows 0.2 s of quiet: someone answering, not a barge-in
    assert quiet == [(5.2, 6.9), (8.2, 9.9)]  # 0.2 s after a turn to 0.1 s before the next
    assert moments([(0.1, 1.0)], 1.5) == ([], [])  # nothing before the first turn to speak of


def test_the_hold_chosen_is_the_shortest_that_never_fires_in_the_quiet() -> None:
    def rec(fires: dict[str, int]) -> Recording:
        scores = {band: {name: Score(fires=n) for name, n in fires.items()}
                  for band in ("wide", "phone")}  # fmt: skip
        return Recording("x", "set", "", [], [], scores)

    names = ["vad 64 ms", "vad 96 ms", "vad 128 ms"]
    clean = rec({"vad 64 ms": 1, "vad 96 ms": 0, "vad 128 ms": 0})
    noisy = rec({"vad 64 ms": 3, "vad 96 ms": 2, "vad 128 ms": 1})
    assert choose_hold([clean], names) == "vad 96 ms"
    assert choose_hold([noisy], names) == "vad 128 ms"  # none clean: the fewest fires


def test_the_bench_scores_a_far_room_where_the_level_gate_fires_in_the_quiet(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    room = tmp_path / "far-room"
    room.mkdir()
    for suffix in (".flac", ".rttm"):
        name = f"lsconv_dev04_4spk_far{suffix}"
        (room / name).symlink_to(shared_fixtures / "librispeech-conversations" / name)
    out = tmp_path / "rule.json"
    assert main(["bench", "barge_in_rule", str(room), "--holds", "0.064", "0.128", "--floors",
                 "-50", "-20", "--echo-losses", "20", "46", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| far-room-far | vad 64 ms | phone |" in printed
    report = json.loads(out.read_text())
    rows = report["sets"]["far-room-far"]
    for band in ("wide", "phone"):
        assert rows[band]["level −35 dBFS 60 ms (phones before)"]["fires"] >= 10
        vad = rows[band]["vad 64 ms"]
        assert vad["fires"] == 0 and vad["onsets"] >= 10 and vad["missed"] < 0.1
        assert vad["delay_p50_ms"] is not None and 64 <= vad["delay_p50_ms"] < 1000
    [fold] = [f for f in report["cross_validation"]["hold"] if f["band"] == "phone"]
    assert fold["set"] == "far-room" and fold["rule"] == "vad 64 ms"  # the shortest, clean
    # what a floor costs: one over the talkers' level misses them
    low, high = rows["phone"]["vad 64 ms ≥ −50 dBFS"], rows["phone"]["vad 64 ms ≥ −20 dBFS"]
    assert low["missed"] < 0.1 and high["missed"] > low["missed"] + 0.2
    # the reply's own echo: 20 dB under it stops it, 46 dB under (3GPP's phone) never
    echo = report["echo"]["fires_per_min"]["phone"]["vad 64 ms ≥ −40 dBFS (phones now)"]
    assert echo["20"] > 10 and echo["46"] == 0
    # of these floors, the lowest that never fires on the echo 30 dB under the reply
    assert report["echo"]["floors"]["phones"]["chosen"] == -20.0


def test_the_page_s_echo_cancellation_takes_out_most_of_the_reply_played_into_the_room() -> None:
    """`--aec-echo-losses`: the reply through a small room at the loss asked (its level that far
    under the reply's), then WebRTC's echo cancellation with the reply as what the loudspeaker
    plays leaves a small part of it (a converged AEC3: tens of dB); with a silent loudspeaker it
    has nothing to take out."""
    import numpy as np

    from bench.barge_in_rule import echo_cancelled, reply_speech, room_echo
    from voice.audio import level_dbfs, pcm16_to_float

    reply = reply_speech(None)[: 20 * 16000]
    echo = room_echo(reply, 6.0)
    assert level_dbfs(echo) == pytest.approx(level_dbfs(reply) - 6.0, abs=1.0)
    left = pcm16_to_float(echo_cancelled(echo, reply))
    assert level_dbfs(left[5 * 16000 :]) < level_dbfs(echo[5 * 16000 :]) - 20.0
    kept = pcm16_to_float(echo_cancelled(echo, np.zeros_like(reply)))  # no reference: an echo it
    assert level_dbfs(kept[5 * 16000 :]) > level_dbfs(echo[5 * 16000 :]) - 12.0  # cannot know
