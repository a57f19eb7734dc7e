"""RTTM in/out, UEM, DER scoring (P4) and the `chorus bench diarization` command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cli.main import main
from diarization.scoring import DerScore, read_uem, score, score_collars
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline


def test_P4_rttm_round_trip_keeps_turns_and_overlap(shared_fixtures: Path) -> None:
    text = (shared_fixtures / "pyannote-sample" / "sample.rttm").read_text()
    timeline = SpeakerTimeline.from_rttm(text, "sample")
    assert len(timeline) == 10
    again = SpeakerTimeline.from_rttm(timeline.to_rttm("sample"), "sample")
    assert [(round(s.start, 3), round(s.end, 3), s.speaker) for s in again] == [
        (round(s.start, 3), round(s.end, 3), s.speaker) for s in timeline
    ]
    assert score(timeline, again, duration=30.0).der == 0.0


def test_P4_rttm_speaker_names_with_spaces_become_one_field() -> None:
    rttm = SpeakerTimeline([SpeakerSegment(0.0, 1.5, "Speaker A")]).to_rttm("meeting")
    assert rttm == "SPEAKER meeting 1 0.000 1.500 <NA> <NA> Speaker_A <NA> <NA>\n"


def test_P4_der_counts_missed_false_alarm_and_confusion() -> None:
    ref = SpeakerTimeline([SpeakerSegment(0, 10, "a"), SpeakerSegment(10, 20, "b")])
    hyp = SpeakerTimeline([SpeakerSegment(0, 10, "X"), SpeakerSegment(10, 15, "X")])
    strict = score(ref, hyp, duration=20.0, collar=0.0)
    assert strict.confusion == pytest.approx(5.0)
    assert strict.missed == pytest.approx(5.0)
    assert strict.false_alarm == pytest.approx(0.0)
    assert strict.der == pytest.approx(0.5)
    late = SpeakerTimeline([SpeakerSegment(0, 10.1, "X"), SpeakerSegment(10.1, 20, "Y")])
    both = score_collars(ref, late, duration=20.0)
    assert set(both) == {0.0, 0.25}
    assert both[0.0].confusion == pytest.approx(0.1)
    # pyannote's collar is the whole width around a reference boundary: 0.25 s forgives ±0.125 s
    assert both[0.25].der == 0.0


def test_P4_overlap_is_scored() -> None:
    ref = SpeakerTimeline([SpeakerSegment(0, 10, "a"), SpeakerSegment(5, 10, "b")])
    hyp = SpeakerTimeline([SpeakerSegment(0, 10, "X")])
    assert score(ref, hyp, duration=10.0, collar=0.0).missed == pytest.approx(5.0)


def test_P4_uem_limits_the_scored_region(shared_fixtures: Path, tmp_path: Path) -> None:
    regions = read_uem(shared_fixtures / "ami" / "train.uem")
    assert regions["trn01"] == [(0.0, 30.0)]
    ref = SpeakerTimeline([SpeakerSegment(0, 10, "a")])
    assert score(ref, SpeakerTimeline(), uem=[(0.0, 5.0)], collar=0.0).missed == pytest.approx(5.0)
    bad = tmp_path / "bad.uem"
    bad.write_text("trn01 NA 3\n")
    with pytest.raises(ValueError, match="UEM"):
        read_uem(bad)


def test_P4_scores_sum_over_files() -> None:
    total = DerScore.sum([DerScore(0.25, 1, 0, 1, 10), DerScore(0.25, 0, 2, 0, 30)])
    assert total.der == pytest.approx(4 / 40)


@pytest.mark.slow
def test_P4_bench_diarization_prints_a_table_and_writes_json(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    folder = shared_fixtures / "pyannote-sample"
    code = main(
        [
            "bench",
            "diarization",
            str(folder),
            "--reference",
            str(folder / "sample.rttm"),
            "--live",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "sample" in printed and "overall" in printed and "live" in printed
    result = json.loads(out.read_text())
    assert result["files"][0]["file"] == "sample"
    assert set(result["overall"]) == {"0.0", "0.25"}
    assert 0.0 <= result["overall"]["0.25"]["der"] < 0.5
    assert result["rtf"] > 0
    assert result["files"][0]["speakers_ref"] == 2
    assert result["live_latency_median"] >= 0


@pytest.mark.slow
def test_P4_leave_one_file_out_scores_each_file_with_settings_tuned_on_the_others(
    shared_fixtures: Path,
) -> None:
    from diarization.batch import BatchSettings
    from diarization.models import default_embedding_model, default_segmentation_model
    from diarization.tuning import TuningFile, cross_validate

    ami = shared_fixtures / "ami"
    files = [
        TuningFile.load(
            ami / f"{fid}.wav", SpeakerTimeline.read_rttm(ami / "train.rttm", fid), None
        )
        for fid in ("trn04", "trn06", "trn08")
    ]
    good = BatchSettings()
    bad = BatchSettings(threshold=3.0)  # everything merges into one speaker
    cv = cross_validate(files, default_segmentation_model(), default_embedding_model(), [bad, good])
    assert set(cv.chosen) == {"trn04", "trn06", "trn08"}
    assert all(s == good for s in cv.chosen.values())
    assert cv.best_settings == good
    assert cv.held_out.der == pytest.approx(cv.best_on_all.der)
    assert cv.grid_size == 2
    assert "leave-one-file-out" in cv.describe()


def test_P4_bench_set_overrides_batch_settings_with_typed_values() -> None:
    from bench.diarization import parse_settings

    settings = parse_settings(["threshold=0.5", "train_overlapped=false", "min_cluster_size=3"])
    assert settings.threshold == 0.5
    assert settings.train_overlapped is False
    assert settings.min_cluster_size == 3
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_settings(["nope=1"])
    with pytest.raises(ValueError, match="not a float"):
        parse_settings(["threshold=high"])


@pytest.mark.slow
def test_P4_bench_reads_references_next_to_the_audio_and_reports_per_set(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bench.json"
    clips = shared_fixtures / "short-clips"
    code = main(
        ["bench", "diarization", str(clips), "--set-name", f"{clips}=clips", "--json", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    assert {f["file"] for f in result["files"]} == {"falcon_test", "fw_stereo_mix"}
    assert set(result["sets"]) == {"clips"}
    assert result["sets"]["clips"]["speakers_ref"] == 5
    printed = capsys.readouterr().out
    assert "= clips" in printed
    # the machine's speed at the time, before and after, so RTFs of two runs compare
    before, after = result["machine_probe_s"]
    assert 0 < before < 30 and 0 < after < 30
    assert result["rtf_per_probe"] == pytest.approx(result["rtf"] / ((before + after) / 2))
    assert "machine probe" in printed


@pytest.mark.slow
def test_P4_bench_reports_like_the_field_and_cross_validates_both_clustering_methods(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Per file and per set: DER at collar 0 and 0.25 with missed / false alarm / confusion and
    confusion's share of the errors; held out: the same, and speakers found against the
    reference per file (issue 30.3). The analyses are cached for the next run."""
    out = tmp_path / "bench.json"
    clips = shared_fixtures / "short-clips"
    args = ["bench", "diarization", str(clips), "--json", str(out), "--cross-validate"]
    args += ["--cv-grid", "ahc", "--cv-grid", "nme-sc", "--cache", str(tmp_path / "cache")]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert "c/err" in printed and "held out by set" in printed
    result = json.loads(out.read_text())
    entry = result["files"][0]
    assert set(entry["batch"]) == {"0.0", "0.25"}
    assert {"missed", "false_alarm", "confusion", "der"} <= set(entry["batch"]["0.0"])
    assert 0.0 <= entry["confusion_share"] <= 1.0
    assert 0.0 <= result["sets"]["short-clips"]["confusion_share"] <= 1.0
    cv = result["cross_validation"]
    assert cv["methods"] == ["ahc", "nme-sc"]
    assert cv["grid_size"] > 216
    held = cv["per_file_held_out"]
    assert held["falcon_test"]["speakers_ref"] == 3
    assert held["falcon_test"]["speakers_found"] >= 1
    assert set(held["fw_stereo_mix"]) >= {"collar_0", "collar_0.25"}
    by_set = cv["held_out_by_set"]["short-clips"]
    assert by_set["speakers_ref"] == 5 and "collar_0" in by_set and "confusion_share" in by_set
    assert len(list((tmp_path / "cache").glob("*.npz"))) == 2
