"""Issue 27.3: `chorus voices list|add NAME CLIP|forget ID` against the configured store (a SQLite
file here), with the live stage's real model printing the clip; never a vector on the screen."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import main

CLIP = "librispeech-meetings/enroll_LS1688_close.flac"


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)  # the tests' default is memory://
    path = tmp_path / "chorus.toml"
    path.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/chorus.db"\n')
    return path


def test_add_list_forget(
    config: Path, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clip = str(shared_fixtures / CLIP)
    assert main(["voices", "--config", str(config), "list"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["voices", "--config", str(config), "add", "Ian", clip]) == 0
    voice_id = capsys.readouterr().out.split("\t")[0]
    assert main(["voices", "--config", str(config), "list"]) == 0
    listed = capsys.readouterr().out
    assert listed.startswith(f"{voice_id}\tIan\t1 prints\tcreated ") and "heard never" in listed
    assert main(["voices", "--config", str(config), "forget", voice_id]) == 0
    assert main(["voices", "--config", str(config), "forget", voice_id]) == 1
    assert "no voice" in capsys.readouterr().err
    assert main(["voices", "--config", str(config), "list"]) == 0
    assert capsys.readouterr().out == ""


def test_a_missing_clip_is_a_clear_error(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["voices", "--config", str(config), "add", "Ian", str(tmp_path / "no.wav")]) == 2
    assert "no such file" in capsys.readouterr().err
