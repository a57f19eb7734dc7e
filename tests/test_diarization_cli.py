"""`chorus diarize`: writes RTTM (file id = audio name), a timeline plot, scores a reference,
names enrolled voices, refuses bad input clearly."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main
from voice.audio import read_audio_16k, write_wav
from voice.diarization_stage import SpeakerTimeline


@pytest.mark.slow
def test_P4_diarize_writes_rttm_and_plot(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = shared_fixtures / "pyannote-sample"
    rttm, png = tmp_path / "out.rttm", tmp_path / "timeline.png"
    code = main(
        [
            "diarize",
            str(folder / "sample.wav"),
            "--rttm",
            str(rttm),
            "--plot",
            str(png),
            "--reference",
            str(folder / "sample.rttm"),
        ]
    )
    assert code == 0
    lines = rttm.read_text().splitlines()
    assert lines and all(line.split()[1] == "sample" for line in lines)
    assert {line.split()[7] for line in lines} == {"Speaker_A", "Speaker_B"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert png.stat().st_size > 10_000
    assert "DER:" in capsys.readouterr().out


@pytest.mark.slow
def test_V8_diarize_enroll_names_a_voice(shared_fixtures: Path, tmp_path: Path) -> None:
    audio = read_audio_16k(shared_fixtures / "pyannote-sample" / "sample.wav")
    clip = tmp_path / "alice.wav"
    write_wav(clip, audio[int(10.7 * 16000) : int(14.4 * 16000)], 16000)
    rttm = tmp_path / "named.rttm"
    code = main(
        [
            "diarize",
            str(shared_fixtures / "pyannote-sample" / "sample.wav"),
            "--rttm",
            str(rttm),
            "--enroll",
            f"Alice={clip}",
        ]
    )
    assert code == 0
    timeline = SpeakerTimeline.read_rttm(rttm, "sample")
    assert timeline.speaker_over(11.0, 14.0) == "Alice"


def test_diarize_refuses_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    not_audio = tmp_path / "notes.wav"
    not_audio.write_text("this is not audio")
    assert main(["diarize", str(not_audio), "--rttm", str(tmp_path / "x.rttm")]) == 2
    assert "not audio" in capsys.readouterr().err
    assert main(["diarize", str(tmp_path / "missing.wav"), "--rttm", str(tmp_path / "x.rttm")]) == 2
    assert main(["diarize", str(not_audio), "--rttm", "x.rttm", "--enroll", "nobody"]) == 2
    assert not (tmp_path / "x.rttm").exists()


@pytest.mark.slow
def test_diarize_speaker_count_options(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = shared_fixtures / "pyannote-sample" / "sample.wav"
    rttm = tmp_path / "out.rttm"
    assert main(["diarize", str(sample), "--rttm", str(rttm), "--min-speakers", "3"]) == 0
    assert len(SpeakerTimeline.read_rttm(rttm, "sample").speakers) == 3
    assert main(["diarize", str(sample), "--rttm", str(rttm), "--max-speakers", "1"]) == 0
    assert len(SpeakerTimeline.read_rttm(rttm, "sample").speakers) == 1
    capsys.readouterr()
    bad = ["--min-speakers", "3", "--max-speakers", "2"]
    assert main(["diarize", str(sample), "--rttm", str(tmp_path / "bad.rttm"), *bad]) == 2
    assert "min_speakers (3) is more than max_speakers (2)" in capsys.readouterr().err
    assert not (tmp_path / "bad.rttm").exists()


@pytest.mark.slow
def test_P1_diarize_clusters_with_nme_sc_when_asked(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sample = shared_fixtures / "pyannote-sample" / "sample.wav"
    rttm = tmp_path / "out.rttm"
    assert main(["diarize", str(sample), "--rttm", str(rttm), "--clustering", "nme-sc"]) == 0
    assert len(SpeakerTimeline.read_rttm(rttm, "sample").speakers) == 2
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["diarize", str(sample), "--rttm", str(rttm), "--clustering", "kmeans"])
