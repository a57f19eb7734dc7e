"""Where the pyannote stage loads from, and its names: pure parts that run in every environment.

In the main venv (no pyannote.audio) building a stage must fail with an error that names the
pyannote environment; in the pyannote env that test is skipped and the others run again.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from diarization.pyannote_stage import (
    DEFAULT_PIPELINE,
    PipelineSource,
    PyannoteStage,
    resolve_source,
)
from voice.turns import letter_label


def test_P2_local_directory_is_local(tmp_path: Path) -> None:
    (tmp_path / "config.yaml").write_text("pipeline: {}\n")
    source = resolve_source(tmp_path)
    assert source == PipelineSource("local", str(tmp_path.resolve()))
    assert str(source) == f"local directory {tmp_path.resolve()}"
    assert resolve_source(str(tmp_path / "config.yaml")).kind == "local"


def test_P2_hub_id_is_hub() -> None:
    source = resolve_source(DEFAULT_PIPELINE)
    assert source.kind == "hub"
    assert source.location == "pyannote/speaker-diarization-community-1"
    assert str(source).startswith("Hugging Face hub id pyannote/speaker-diarization-community-1")


def test_P2_missing_or_incomplete_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no config\.yaml"):
        resolve_source(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_source(tmp_path / "nope")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_source("./no/such/pipeline")
    with pytest.raises(ValueError, match="owner/name"):
        resolve_source("not-a-hub-id")
    with pytest.raises(ValueError):
        resolve_source("  ")


def test_P2_speaker_names_in_order() -> None:
    assert [letter_label(i) for i in (0, 1, 25, 26, 27, 701, 702)] == [
        "Speaker A",
        "Speaker B",
        "Speaker Z",
        "Speaker AA",
        "Speaker AB",
        "Speaker ZZ",
        "Speaker AAA",
    ]
    with pytest.raises(ValueError):
        letter_label(-1)


@pytest.mark.skipif(
    importlib.util.find_spec("pyannote.audio") is not None,
    reason="pyannote.audio is installed here: this checks the main venv's error",
)
def test_P2_without_pyannote_the_error_names_the_environment(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="make pyannote-env"):
        PyannoteStage(tmp_path)
