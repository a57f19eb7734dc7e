"""The load bench's latency bookkeeping (`bench.load`): a corrected turn counts from the first
version the device had right, not from its first, wrong one; the largest N under target is
decided on the strict p95 (from each turn's own end); the time the stage kept is read from the
devices' diarization statuses."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.load import (
    LATENCY_TARGET_S,
    ServerRun,
    StepResult,
    StreamResult,
    _print_run,
    off_stage_seconds,
    settled_versions,
    stage_share,
    turn_latencies,
)
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


def test_a_second_pass_correction_leaves_the_first_pass_latency_alone() -> None:
    versions = [
        (10.0, turn("a", 2.0)),
        (15.0, turn("a", 2.2, corrected=True, text="re-decoded").model_copy(
            update={"second_pass": True})),  # seconds later, its end moved: not the first pass's
    ]
    assert [(now, m.end) for now, m in settled_versions(versions)] == [(10.0, 2.0)]


def test_strict_latency_is_from_the_turn_s_own_end() -> None:
    sent_audio = [float(s) for s in range(1, 11)]
    sent_wall = [100.0 + s for s in range(1, 11)]
    completion, strict = turn_latencies([(103.5, 3.0), (105.2, 5.0)], sent_audio, sent_wall)
    assert strict == pytest.approx([0.5, 0.2])
    assert completion == pytest.approx([0.5, 0.2])


def step(streams: int, p95: float, p95_strict: float) -> StepResult:
    """A step of `streams` devices with these completion and strict p95 latencies."""
    return StepResult(
        streams=streams, seconds=60.0, turns=40, p50_latency_s=p95 / 2, p95_latency_s=p95,
        max_latency_s=p95_strict, p95_strict_latency_s=p95_strict, corrected=0, slowest_turns=[],
        cpu_percent_total=10.0 * streams, cpu_percent_per_stream=10.0, rss_before_mib=300.0,
        rss_peak_mib=300.0 + 20 * streams, rss_per_stream_mib=20.0, errors=[],
    )


def test_the_largest_n_under_target_is_decided_on_the_strict_p95(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """N=2 is under target by completion (0.7 s) but not from its turns' own ends (1.3 s): the
    answer is N=1, and the printed line says which p95 it read; both columns stay."""
    assert LATENCY_TARGET_S == 1.0
    run = ServerRun(repo=".", commit="abc1234", steps=[step(1, 0.5, 0.8), step(2, 0.7, 1.3)],
                    soak=None, flood=None)
    assert [s.holds for s in run.steps] == [True, False]
    assert run.largest == 1
    _print_run(run, named=False)
    printed = capsys.readouterr().out
    assert "| 2 | 40 | 0.35 | 0.70 | 1.30 |" in printed
    assert "largest N with strict p95 latency (the p95 by turn end column) < 1 s: 1" in printed


def test_the_time_on_the_stage_is_read_from_each_devices_diarization_statuses() -> None:
    """Issue 31: how much of the streams' time kept the stage's speakers, from the statuses each
    device heard: off from `degraded` to `recovered` (or the stream's end)."""
    assert off_stage_seconds([], 0.0, 30.0) == 0.0
    assert off_stage_seconds([(4.0, "degraded"), (9.0, "recovered")], 0.0, 30.0) == 5.0
    assert off_stage_seconds([(4.0, "degraded"), (9.0, "recovered"), (20.0, "degraded")],
                             0.0, 30.0) == 15.0
    assert off_stage_seconds([(35.0, "degraded")], 0.0, 30.0) == 0.0  # after the stream ended
    on = StreamResult(sent_wall=[100.0, 130.0], ended=130.0)
    shed = StreamResult(sent_wall=[100.0, 130.0], ended=130.0,
                        statuses=[(110.0, "degraded"), (120.0, "recovered")])
    refused = StreamResult()  # never streamed: not counted
    assert stage_share([on, shed, refused]) == pytest.approx(50 / 60)
    assert stage_share([refused]) is None


def test_the_table_says_how_much_time_the_stage_kept(capsys: pytest.CaptureFixture[str]) -> None:
    run = ServerRun(repo=".", commit="abc1234",
                    steps=[replace(step(1, 0.5, 0.8), on_stage=0.734), step(2, 0.7, 1.3)],
                    soak=None, flood=None)
    _print_run(run, named=False)
    printed = capsys.readouterr().out
    assert "| degraded | on the stage |" in printed
    assert "| 0 | 0 | 0 | 73% |" in printed and "| 0 | 0 | 0 | — |" in printed
