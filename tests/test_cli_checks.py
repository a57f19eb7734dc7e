"""Issue 10.6: `chorus transcribe` and `chorus diarize` refuse a bad count or an output path they
cannot write with one clear line and exit code 2, before any work (no model loads, nothing read)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cli.commands.checks import UsageError, check_writable
from cli.main import main
from voice.audio import write_wav


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    path = tmp_path / "tone.wav"
    t = np.arange(16000 * 2) / 16000
    write_wav(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return path


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a folder")
    return path


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert captured.out == ""  # nothing ran: no result, no "wrote"
    return lines[0]


@pytest.mark.parametrize("command", ["transcribe", "diarize"])
def test_num_speakers_zero_is_one_line_and_exit_code_2(
    command: str, wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    extra = ["--rttm", str(tmp_path / "o.rttm")] if command == "diarize" else ["--pipeline-speakers"]
    line = refused(capsys, [command, str(wav), "--num-speakers", "0", *extra])
    assert line == f"chorus {command}: error: --num-speakers must be at least 1, got 0"


def test_diarize_refuses_an_rttm_under_a_file_before_the_work(
    wav: Path, a_file: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(capsys, ["diarize", str(wav), "--rttm", str(a_file / "out.rttm")])
    assert line == f"chorus diarize: error: --rttm {a_file / 'out.rttm'}: {a_file} is not a directory"


def test_diarize_refuses_a_plot_path_that_is_a_directory(
    wav: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(capsys, ["diarize", str(wav), "--rttm", str(tmp_path / "o.rttm"),
                            "--plot", str(tmp_path)])
    assert line == f"chorus diarize: error: --plot {tmp_path}: is a directory, not a file"
    assert not (tmp_path / "o.rttm").exists()


def test_transcribe_refuses_an_unwritable_output_before_transcribing(
    wav: Path, a_file: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(capsys, ["transcribe", str(wav), "--output", str(a_file / "x" / "turns.txt")])
    assert line.startswith("chorus transcribe: error: --output ") and "is not a directory" in line


def test_missing_folders_are_fine_and_created_when_written(tmp_path: Path) -> None:
    check_writable(tmp_path / "new" / "deeper" / "out.rttm", "--rttm")  # no error, nothing made
    assert not (tmp_path / "new").exists()
    existing = tmp_path / "kept.txt"
    existing.write_text("keep me")
    check_writable(existing, "--output")
    assert existing.read_text() == "keep me"  # probed without being truncated


def test_a_read_only_place_is_refused() -> None:
    with pytest.raises(UsageError, match="cannot write in /proc"):
        check_writable(Path("/proc/chorus-out.rttm"), "--rttm")
