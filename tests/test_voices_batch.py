"""Issue 27.2 in batch: a whole recording's voices named from the voice directory in tiers
(`diarization.directory`, `chorus diarize --voices`, `chorus transcribe --voices`).

Real audio: meeting B of the LibriSpeech voiceprint pair (close render: LS1688 and LS1998, who
are remembered from their enrollment clips, and LS2033, who is not), diarized once in batch by
the embedded stage. The directory's prints are made as `chorus voices add` makes them (the live
trunk and pooling); each batch speaker is printed again on that model, never with the batch
pipeline's own embeddings.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from diarization.directory import lone_speech, name_speakers, renamed, speaker_prints
from diarization.embedded import EmbeddedStage
from rooms.voices import InMemoryVoices, RememberedVoice, pack_vector
from voice.audio import read_audio_16k
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline
from voice.identify import IdentifySettings

MEETING = "librispeech-meetings/lsmeet_dev05_vpB_3spk_close"
REMEMBERED = ("LS1688", "LS1998")
NEW = "LS2033"
SURE = IdentifySettings()
"""The `[voices]` defaults: both remembered voices score well above `auto` in the close render."""
UNSURE = IdentifySettings(auto=0.99, suggest=0.3)
"""No score reaches `auto`: every match is a suggestion."""


@dataclass
class Diarized:
    stage: EmbeddedStage
    audio: np.ndarray
    timeline: SpeakerTimeline
    label_of: dict[str, str]
    """Reference speaker → the batch label holding most of their speech."""
    clips: dict[str, Path]


@pytest.fixture(scope="module")
def diarized() -> Diarized:
    from tests.conftest import SHARED_FIXTURES

    folder = SHARED_FIXTURES
    stage = EmbeddedStage()
    audio = read_audio_16k(folder / f"{MEETING}.flac")
    timeline = stage.diarize(audio)
    reference = SpeakerTimeline.read_rttm(folder / f"{MEETING}.rttm")
    label_of = {}
    for speaker in reference.speakers:
        overlap: dict[str, float] = {}
        for ref in (s for s in reference if s.speaker == speaker):
            for seg in timeline:
                shared = min(ref.end, seg.end) - max(ref.start, seg.start)
                if shared > 0:
                    overlap[seg.speaker] = overlap.get(seg.speaker, 0.0) + shared
        label_of[speaker] = max(overlap, key=lambda k: overlap[k])
    assert len(set(label_of.values())) == 3  # the close render's voices are told apart
    clips = {s: folder / f"librispeech-meetings/enroll_{s}_close.flac" for s in (*REMEMBERED, NEW)}
    return Diarized(stage, audio, timeline, label_of, clips)


def directory(d: Diarized, *names: str, model: str | None = None) -> list[RememberedVoice]:
    """The people `names`, each with their clip's print on the live model (as `chorus voices
    add` keeps it), or on the batch pipeline's whole-network model under id `model`."""
    store = InMemoryVoices()

    async def fill() -> list[RememberedVoice]:
        for name in names:
            clip = read_audio_16k(d.clips[name])
            if model is None:
                vector, made_by = d.stage.live_voiceprint(clip), d.stage.live_model
            else:
                vector, made_by = d.stage.voiceprint(clip), model
            await store.remember_print(name, made_by, pack_vector(vector.tolist()), "clip")
        return await store.list_voices()

    return asyncio.run(fill())


def test_a_remembered_voice_sure_enough_takes_its_name(diarized: Diarized) -> None:
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline,
                          directory(diarized, *REMEMBERED), SURE)
    assert names.named == {diarized.label_of[s]: s for s in REMEMBERED}
    assert names.suggested == {} and names.people == 2
    assert renamed(diarized.timeline, names.named).speakers == [
        "LS1688" if label == diarized.label_of["LS1688"] else
        "LS1998" if label == diarized.label_of["LS1998"] else label
        for label in diarized.timeline.speakers
    ]


def test_the_new_voice_never_takes_a_remembered_name(diarized: Diarized) -> None:
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline,
                          directory(diarized, *REMEMBERED), UNSURE)
    new = diarized.label_of[NEW]
    assert new not in names.named and new not in names.suggested


def test_a_likely_voice_keeps_its_letter_and_is_suggested(diarized: Diarized) -> None:
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline,
                          directory(diarized, *REMEMBERED), UNSURE)
    assert names.named == {}
    assert names.suggested == {diarized.label_of[s]: s for s in REMEMBERED}
    assert names.lines() == [
        f"{diarized.label_of[s]} — maybe {s}? (voice directory)"
        for s in sorted(REMEMBERED, key=lambda s: diarized.label_of[s])
    ]


def test_a_forgotten_voice_is_not_named(diarized: Diarized) -> None:
    store = InMemoryVoices()

    async def remember_then_forget() -> list[RememberedVoice]:
        for name in REMEMBERED:
            vector = diarized.stage.live_voiceprint(read_audio_16k(diarized.clips[name]))
            await store.remember_print(name, diarized.stage.live_model,
                                       pack_vector(vector.tolist()), "clip")
        [ls1688] = [v for v in await store.list_voices() if v.name == "LS1688"]
        assert await store.forget_voice(ls1688.id)
        return await store.list_voices()

    voices = asyncio.run(remember_then_forget())
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline, voices, UNSURE)
    assert "LS1688" not in {*names.named.values(), *names.suggested.values()}
    assert names.suggested == {diarized.label_of["LS1998"]: "LS1998"}


def test_prints_of_another_model_are_never_compared(diarized: Diarized) -> None:
    """The batch pipeline's whole-network CAM++ print of the same clip is another model: the
    person is not compared (and said so), however close that print is."""
    voices = directory(diarized, "LS1688", model="campplus-whole-network")
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline, voices,
                          IdentifySettings(auto=-1.0, suggest=-1.0, min_heard_s=0.0))
    assert names.named == {} and names.suggested == {}
    assert names.people == 0 and names.other_model == 1
    assert "another model" in names.lines()[-1]


def test_enrolled_names_are_not_given_to_another_voice(diarized: Diarized) -> None:
    """`--enroll` named LS1998 already: only the anonymous voices are scored, and nobody else
    takes LS1998's name."""
    timeline = renamed(diarized.timeline, {diarized.label_of["LS1998"]: "LS1998"})
    names = name_speakers(diarized.stage, diarized.audio, timeline,
                          directory(diarized, *REMEMBERED), UNSURE,
                          anonymous=[s for s in timeline.speakers if s != "LS1998"])
    assert names.suggested == {diarized.label_of["LS1688"]: "LS1688"}
    assert "LS1998" not in names.named.values()


def test_only_lone_speech_is_printed_and_short_voices_not_at_all(diarized: Diarized) -> None:
    timeline = SpeakerTimeline([SpeakerSegment(0.0, 4.0, "Speaker A"),
                                SpeakerSegment(3.0, 5.0, "Speaker B"),
                                SpeakerSegment(6.0, 7.5, "Speaker B")])
    spans = lone_speech(timeline, 10.0)
    assert spans == {"Speaker A": [(0.0, 3.0)], "Speaker B": [(4.0, 5.0), (6.0, 7.5)]}
    prints = speaker_prints(diarized.stage, diarized.audio[: 10 * 16000], timeline,
                            min_speech_s=2.6)
    assert list(prints.prints) == ["Speaker A"] and prints.speech_s == {"Speaker A": 3.0}
    assert prints.model == diarized.stage.live_model


# --- the commands ---------------------------------------------------------------------------


@pytest.fixture
def remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_fixtures: Path,
               capsys: pytest.CaptureFixture[str]) -> Path:
    """A config file whose SQLite store remembers LS1688 and LS1998 (`chorus voices add`)."""
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)  # the tests' default is memory://
    config = tmp_path / "chorus.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/chorus.db"\n')
    for name in REMEMBERED:
        clip = shared_fixtures / f"librispeech-meetings/enroll_{name}_close.flac"
        assert main(["voices", "--config", str(config), "add", name, str(clip)]) == 0
    capsys.readouterr()
    return config


def with_thresholds(config: Path, auto: float, suggest: float) -> Path:
    config.write_text(config.read_text() + f"[voices]\nauto = {auto}\nsuggest = {suggest}\n")
    return config


def test_diarize_names_remembered_voices_in_the_rttm(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rttm = tmp_path / "b.rttm"
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(rttm), "--voices",
                 "--config", str(remembered)]) == 0
    out = capsys.readouterr().out
    speakers = {line.split()[7] for line in rttm.read_text().splitlines()}
    assert {"LS1688", "LS1998"} < speakers and len(speakers) == 3
    assert "→ LS1688 (voice directory)" in out and "→ LS1998 (voice directory)" in out
    assert "maybe" not in out


def test_diarize_keeps_the_letter_of_a_likely_voice_and_says_the_suggestion(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rttm = tmp_path / "b.rttm"
    config = with_thresholds(remembered, 0.99, 0.3)
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(rttm), "--voices", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    speakers = {line.split()[7] for line in rttm.read_text().splitlines()}
    assert speakers == {"Speaker_A", "Speaker_B", "Speaker_C"}
    assert "— maybe LS1688? (voice directory)" in out and "— maybe LS1998?" in out


def test_diarize_never_names_a_voice_forgotten_with_chorus_voices_forget(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["voices", "--config", str(remembered), "list"]) == 0
    [ls1688] = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()
                if "\tLS1688\t" in line]
    assert main(["voices", "--config", str(remembered), "forget", ls1688]) == 0
    rttm = tmp_path / "b.rttm"
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(rttm), "--voices",
                 "--config", str(remembered)]) == 0
    out = capsys.readouterr().out
    speakers = {line.split()[7] for line in rttm.read_text().splitlines()}
    assert "LS1688" not in speakers and "LS1998" in speakers
    assert "LS1688" not in out


def test_diarize_without_voices_never_reads_the_directory(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rttm = tmp_path / "b.rttm"
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(rttm), "--config", str(remembered)]) == 0
    assert {line.split()[7] for line in rttm.read_text().splitlines()} == {
        "Speaker_A", "Speaker_B", "Speaker_C"}
    assert "voice directory" not in capsys.readouterr().out


def test_transcribe_json_carries_names_and_suggestions_never_a_print(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = with_thresholds(remembered, 0.99, 0.3)
    out = tmp_path / "b.json"
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["transcribe", audio, "--pipeline-speakers", "--voices", "--config", str(config),
                 "--format", "json", "--model", "tiny.en", "--no-progress",
                 "--rename", "Speaker C=Carol", "-o", str(out)]) == 0
    err = capsys.readouterr().err
    turns = json.loads(out.read_text())
    suggested = {t["speaker"]: t["suggestion"] for t in turns if "suggestion" in t}
    assert sorted(suggested.values()) == ["LS1688", "LS1998"]
    assert all(s.startswith("Speaker ") for s in suggested)  # the letter stays
    assert {t["speaker"] for t in turns} >= {"Carol", *suggested}
    assert all(set(t) <= {"speaker", "text", "start", "end", "kind", "suggestion"} for t in turns)
    for label, name in suggested.items():
        assert f"chorus transcribe: {label} — maybe {name}? (voice directory)" in err


def test_transcribe_voices_needs_the_whole_file_diarized(
    remembered: Path, shared_fixtures: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["transcribe", audio, "--voices", "--config", str(remembered)]) == 2
    assert "add --pipeline-speakers" in capsys.readouterr().err
    assert main(["transcribe", audio, "--voices", "--pipeline-speakers", "--live-diarization",
                 "--config", str(remembered)]) == 2
    assert "drop --live-diarization" in capsys.readouterr().err


def test_a_store_that_is_held_or_unreadable_stops_the_command_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_fixtures: Path,
    capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)
    config = tmp_path / "chorus.toml"
    config.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/chorus.toml/rooms.db"\n')
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(tmp_path / "x.rttm"), "--voices",
                 "--config", str(config)]) == 2
    assert "chorus diarize: error:" in capsys.readouterr().err
    assert not (tmp_path / "x.rttm").exists()


def test_the_batch_bench_names_meeting_b_as_the_commands_do(diarized: Diarized) -> None:
    """`chorus bench voices --path batch`: one feed at the end, every stretch under the name
    its label ended with; the remembered voices named, the new one keeping its letter."""
    from bench.voices import batch_meeting, name_meeting
    from tests.conftest import SHARED_FIXTURES
    from voice.identify import known_voices

    meeting = batch_meeting(diarized.stage, diarized.audio, MEETING,
                            SHARED_FIXTURES / f"{MEETING}.rttm")
    [fed] = meeting.fed
    assert fed.prints.model == diarized.stage.live_model
    voices = directory(diarized, *REMEMBERED)
    outcome = name_meeting(meeting, known_voices(voices, fed.prints.model), SURE)
    assert sorted(outcome.own) == sorted(REMEMBERED)
    assert all(outcome.named[s] / outcome.own[s] > 0.7 for s in REMEMBERED)
    assert outcome.strangers_voice == {NEW: None}
    assert outcome.wrong / outcome.speech < 0.02
