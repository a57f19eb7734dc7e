"""`chorus transcribe`: formats, renames and the Deepgram URL, through the VoiceChannel path."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import soundfile as sf

from cli.main import main
from tests.voice_helpers import MEETING_DIR, Meeting, meeting
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords, ThreadedServer
from voice.transcribe import Turn, clock, format_turns, parse_renames

TURNS = [Turn("Alice", 'She said "hi"', 1.2, 3.9), Turn("Speaker B", "Yes.", 4.0, 65.25)]


def test_text_format_is_one_turn_per_line() -> None:
    assert format_turns(TURNS, "text") == (
        '[00:01.20–00:03.90] Alice: "She said \\"hi\\""\n'
        '[00:04.00–01:05.25] Speaker B: "Yes."\n'
    )


def test_json_srt_vtt_rttm_formats() -> None:
    assert json.loads(format_turns(TURNS, "json"))[0] == {
        "speaker": "Alice", "text": 'She said "hi"', "start": 1.2, "end": 3.9, "kind": "spoken"}
    assert "2\n00:00:04,000 --> 00:01:05,250\nSpeaker B: Yes.\n" in format_turns(TURNS, "srt")
    vtt = format_turns(TURNS, "vtt")
    assert vtt.startswith("WEBVTT\n") and "00:00:01.200 --> 00:00:03.900\n<v Alice>She said" in vtt
    assert format_turns(TURNS, "rttm", file_id="m").splitlines()[1] == (
        "SPEAKER m 1 4.000 61.250 <NA> <NA> Speaker_B <NA> <NA>")
    assert clock(3725.5) == "01:02:05.50"


def test_rename_pairs_are_parsed_or_refused() -> None:
    assert parse_renames(["Speaker A=Alice", " Speaker B = Bob "]) == {
        "Speaker A": "Alice", "Speaker B": "Bob"}
    with pytest.raises(ValueError, match="--rename expects LABEL=NAME"):
        parse_renames(["Speaker A"])


@pytest.fixture
def deepgram_url() -> Iterator[str]:
    """The local Deepgram-protocol server on its own loop, for a CLI that runs its own."""
    running = ThreadedServer(DeepgramTestServer(MeetingWords.from_meeting(MEETING_DIR)))
    yield running.url
    running.stop()


def demo_start(deepgram_url: str, tmp_path: Path,
               monkeypatch: pytest.MonkeyPatch) -> tuple[Meeting, Path]:
    """The demo meeting's first 13 s as a WAV, and the CLI's Deepgram pointed at the stand-in."""
    demo = meeting(seconds=13.0)
    wav = tmp_path / "start.wav"
    sf.write(wav, demo.audio, demo.sample_rate, subtype="PCM_16")
    monkeypatch.setenv("DEEPGRAM_API_KEY", "test")
    monkeypatch.setenv("DEEPGRAM_URL", deepgram_url)
    return demo, wav


def test_cli_deepgram_json_with_rename(deepgram_url: str, tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    demo, wav = demo_start(deepgram_url, tmp_path, monkeypatch)
    code = main(["transcribe", str(wav), "--stt", "deepgram", "--format", "json",
                 "--rename", "Speaker A=Alice", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0
    turns = json.loads(out)
    assert [(t["speaker"], t["text"]) for t in turns] == [
        ("Alice", demo.turns[0]["text"]), ("Speaker B", demo.turns[1]["text"]),
        ("Speaker C", demo.turns[2]["text"])]


def test_cli_refuses_bad_audio_with_the_problem_named(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "notes.wav"
    bad.write_text("not a recording")
    assert main(["transcribe", str(bad), "--no-progress"]) == 2
    assert "not audio" in capsys.readouterr().err


def test_cli_front_end_cleans_the_recording_first_and_refuses_an_unknown_one(
        deepgram_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    demo, wav = demo_start(deepgram_url, tmp_path, monkeypatch)
    assert main(["transcribe", str(wav), "--front-end", "reverb", "--no-progress"]) == 2
    assert "unknown front end 'reverb'" in capsys.readouterr().err
    code = main(["transcribe", str(wav), "--stt", "deepgram", "--format", "json",
                 "--front-end", "wpe", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "front end wpe" in captured.err
    assert [t["text"] for t in json.loads(captured.out)] == [t["text"] for t in demo.turns[:3]]
