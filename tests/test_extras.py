"""Issue 26.6: optional parts come with pip extras; the base install serves the embedded default.

A part used without its extra fails where it is built (the server's start, a command's start),
with one line naming the extra: `… needs the optional extra 'X': pip install 'chorus[X]'`
(`models.extras.require`). A missing package is simulated with `sys.modules[name] = None`, which
makes its import (and its lookup) fail as if it were not installed. `make test` installs `.[dev]`,
which must pull every extra but `pyannote` (its own environment).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from models.extras import EXTRAS, MissingExtra, require
from voice.audio import write_wav

REPO = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
OPTIONAL: dict[str, list[str]] = PROJECT["optional-dependencies"]


def hint(extra: str, what: str) -> str:
    return f"{what} needs the optional extra {extra!r}: pip install 'chorus[{extra}]'"


Block = Callable[[str], None]


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Block:
    """`without(extra)`: every module of `extra` looks uninstalled for the rest of the test."""

    def block(extra: str) -> None:
        for module in EXTRAS[extra]:
            monkeypatch.setitem(sys.modules, module, None)

    return block


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run `chorus ARGV`, which must end with status 2 and exactly one line on stderr."""
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


def config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "chorus.toml"
    path.write_text(text)
    return str(path)


@pytest.fixture
def no_store(monkeypatch: pytest.MonkeyPatch) -> None:
    """`chorus serve` must refuse before it opens a store (and so before any model loads)."""

    async def opened(*_: object) -> None:
        raise AssertionError("the store was opened: the extra was not checked at start")

    monkeypatch.setattr("cli.commands.serve.open_kit", opened)


@pytest.fixture
def wav(tmp_path: Path) -> Path:
    path = tmp_path / "tone.wav"
    t = np.arange(16000) / 16000
    write_wav(path, (0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 16000)
    return path


# ------------------------------------------------------------------ pyproject: extras and dev


def test_every_extra_of_pyproject_is_known_to_the_check() -> None:
    assert set(OPTIONAL) - {"dev"} == set(EXTRAS)


def test_dev_pulls_every_extra_but_pyannote_so_make_test_installs_them() -> None:
    own = [r for r in OPTIONAL["dev"] if r.startswith("chorus[")]
    assert len(own) == 1
    pulled = {e.strip() for e in own[0].removeprefix("chorus[").removesuffix("]").split(",")}
    assert pulled == set(EXTRAS) - {"pyannote"}
    assert not any(r.split("=")[0].startswith("torch") for r in OPTIONAL["dev"])


def test_base_dependencies_hold_no_extra_package() -> None:
    base = {r.split(">")[0].split("=")[0].split("<")[0].split("[")[0].lower()
            for r in PROJECT["dependencies"]}
    for extra, requirements in OPTIONAL.items():
        if extra == "dev":
            continue
        for requirement in requirements:
            name = requirement.split(">")[0].split("=")[0].split("<")[0].split("[")[0].lower()
            if extra == "pyannote" and name == "torch":
                continue  # the base's torch range; the extra pins its own build
            assert name not in base, f"{name} is in the base and in [{extra}]"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_pyannote_env_requirements_expand_dev_into_packages(tmp_path: Path) -> None:
    printer = tmp_path / "print.mk"
    printer.write_text("print-pyannote-reqs:\n\t@$(PYANNOTE_REQS_CMD)\n")
    out = subprocess.run(
        ["make", "-s", "-f", "Makefile", "-f", str(printer), "print-pyannote-reqs",
         f"PYTHON={sys.executable}"],
        cwd=REPO, capture_output=True, text=True, check=True, timeout=60,
    ).stdout.splitlines()
    assert not [r for r in out if r.startswith("chorus")]
    wanted = PROJECT["dependencies"] + OPTIONAL["pyannote"] + [
        r for extra, rs in OPTIONAL.items() if extra != "pyannote" for r in rs
        if not r.startswith("chorus[")
    ]
    assert sorted(out) == sorted(set(wanted))


# ------------------------------------------------------------------ the one check


def test_the_hint_is_one_line_naming_the_extra(without: Block) -> None:
    without("deepgram")
    with pytest.raises(MissingExtra) as caught:
        require("deepgram", "the Deepgram STT provider")
    assert str(caught.value) == hint("deepgram", "the Deepgram STT provider")
    assert caught.value.extra == "deepgram"
    assert isinstance(caught.value, ImportError)


def test_an_installed_extra_passes_the_check() -> None:
    require("postgres", "the Postgres store")  # `make test` installs every extra but pyannote


def test_a_missing_submodule_of_an_extra_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pyannote.metrics", None)  # jiwer is there, this is not
    with pytest.raises(MissingExtra, match="'bench'"):
        require("bench", "DER scoring")


# ------------------------------------------------------------------ one start-up per extra


def test_deepgram_missing_stops_serve_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block, no_store: None
) -> None:
    without("deepgram")
    line = refused(capsys, ["serve", "--config", config(tmp_path, '[stt]\nprovider = "deepgram"\n')])
    assert line == "chorus serve: " + hint("deepgram", "the Deepgram STT provider")


def test_deepgram_missing_stops_transcribe_before_any_work(
    wav: Path, capsys: pytest.CaptureFixture[str], without: Block
) -> None:
    without("deepgram")
    line = refused(capsys, ["transcribe", str(wav), "--stt", "deepgram"])
    assert line == "chorus transcribe: error: " + hint("deepgram", "the Deepgram STT provider")


def test_openai_missing_stops_serve_with_an_openai_realtime_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block, no_store: None
) -> None:
    without("openai")
    text = '[realtime]\nprovider = "openai"\napi_key = "k"\n'
    line = refused(capsys, ["serve", "--config", config(tmp_path, text)])
    assert line == "chorus serve: " + hint("openai", "the OpenAI realtime provider")


def test_openai_missing_stops_serve_with_the_openai_chat_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block, no_store: None
) -> None:
    without("openai")
    text = '[realtime]\nprovider = "none"\n[chat]\nprovider = "openai"\n'
    line = refused(capsys, ["serve", "--config", config(tmp_path, text)])
    assert line == "chorus serve: " + hint("openai", "the OpenAI chat provider ([chat] provider)")


def test_gemini_missing_stops_transcribe_realtime_before_transcribing(
    capsys: pytest.CaptureFixture[str], without: Block, tmp_path: Path
) -> None:
    without("gemini")
    # the audio is not even read: the check comes first
    line = refused(capsys, ["transcribe", str(tmp_path / "absent.wav"), "--realtime", "gemini"])
    assert line == "chorus transcribe: error: " + hint(
        "gemini", "the Gemini Live realtime provider"
    )


def test_gemini_missing_stops_the_realtime_channel_at_construction(without: Block) -> None:
    from realtime import RealtimeChannel

    without("gemini")
    with pytest.raises(MissingExtra, match=r"pip install 'chorus\[gemini\]'"):
        RealtimeChannel("realtime", "gemini")
    RealtimeChannel("realtime", "recorder")  # the embedded default needs no extra


def test_livekit_missing_stops_chorus_agent(
    capsys: pytest.CaptureFixture[str], without: Block
) -> None:
    without("livekit")
    line = refused(capsys, ["agent"])
    assert line == "chorus agent: " + hint("livekit", "the LiveKit Agents worker")


def test_postgres_missing_stops_serve_before_the_store_opens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block, no_store: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    without("postgres")
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)  # conftest's memory:// would win
    text = '[store]\nurl = "postgresql://chorus@127.0.0.1:1/chorus"\n'
    line = refused(capsys, ["serve", "--config", config(tmp_path, text)])
    assert line == "chorus serve: " + hint("postgres", "the Postgres store")


async def test_postgres_missing_stops_open_store(without: Block) -> None:
    from rooms import open_store

    without("postgres")
    with pytest.raises(MissingExtra, match=r"pip install 'chorus\[postgres\]'"):
        await open_store("postgresql://chorus@127.0.0.1:1/chorus")


def test_acp_missing_stops_serve_with_an_agent_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block, no_store: None
) -> None:
    without("acp")
    text = '[agent]\ncommand = ["my-agent", "--acp"]\n'
    line = refused(capsys, ["serve", "--config", config(tmp_path, text)])
    assert line == "chorus serve: " + hint("acp", "the ACP agent ([agent] command)")


def test_bench_missing_stops_a_bench_at_its_start(
    capsys: pytest.CaptureFixture[str], without: Block
) -> None:
    without("bench")
    line = refused(capsys, ["bench", "transcription"])
    assert line == "chorus bench: " + hint("bench", "the transcription bench")


def test_bench_missing_stops_diarize_reference_before_diarizing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], without: Block
) -> None:
    without("bench")
    argv = ["diarize", str(tmp_path / "absent.wav"), "--rttm", str(tmp_path / "out.rttm"),
            "--reference", str(tmp_path / "ref.rttm")]
    line = refused(capsys, argv)
    assert line == "chorus diarize: " + hint("bench", "scoring and plotting (--reference, --plot)")


def test_pyannote_missing_names_the_extra_and_its_environment(
    tmp_path: Path, without: Block
) -> None:
    from diarization.pyannote_stage import PyannoteStage

    without("pyannote")
    with pytest.raises(RuntimeError) as caught:
        PyannoteStage(tmp_path)
    message = str(caught.value)
    assert message.startswith(hint("pyannote", "the pyannote stage"))
    assert "make pyannote-env" in message and "\n" not in message


# ------------------------------------------------------------------ the base install


def test_the_embedded_default_runs_with_no_extra_installed() -> None:
    """In a fresh interpreter where every extra's modules fail to import: the command line is
    built (every command and bench module imported), the server and its pipeline import, the
    default configuration passes the start check, and the recorder session records."""
    blocked = sorted({m for modules in EXTRAS.values() for m in modules})
    script = f"""
import importlib.abc, sys
BLOCKED = {blocked!r}
class Uninstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Uninstalled())
import asyncio
from cli.main import build_parser
build_parser()
import server.app, server.pipeline
from server.config import ServerConfig
server.pipeline.require_extras(ServerConfig())
from realtime import RealtimeChannel, RecorderSession, make_session
RealtimeChannel("realtime")
assert isinstance(make_session("recorder"), RecorderSession)
from rooms import open_store
asyncio.run(open_store("memory://"))
assert not [m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED)]
print("ok")
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
