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
import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from cli.main import main
from diarization.directory import (
    DirectoryNames,
    TurnChecks,
    checked_timeline,
    lone_speech,
    name_speakers,
    speaker_prints,
)
from diarization.embedded import EmbeddedStage
from rooms.voices import InMemoryVoices, RememberedVoice, pack_vector
from voice.audio import read_audio_16k
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline
from voice.identify import TURN_GAP_S, IdentifySettings, stretch_turns

MEETING = "librispeech-meetings/lsmeet_dev05_vpB_3spk_close"
REMEMBERED = ("LS1688", "LS1998")
NEW = "LS2033"
SURE = IdentifySettings()
"""The `[voices]` defaults: both remembered voices score well above `auto` in the close render."""
UNSURE = IdentifySettings(auto=0.99, suggest=0.3)
"""No score reaches `auto`: every match is a suggestion."""


def renamed(timeline: SpeakerTimeline, names: dict[str, str]) -> SpeakerTimeline:
    """The timeline with each label of `names` read as its name (what `--enroll` gives)."""
    return SpeakerTimeline(
        [SpeakerSegment(s.start, s.end, names.get(s.speaker, s.speaker)) for s in timeline]
    )



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


def test_a_speakers_speech_is_printed_in_pieces_that_keep_every_sample_once() -> None:
    """`speaker_prints`' pieces of at most 10 s: a short last piece joins the one before it
    (not the one before that, and nothing is printed twice)."""
    from diarization.directory import _pieces

    speech = np.arange(round(20.5 * 16000), dtype=np.float32)
    pieces = _pieces(speech)
    assert [len(p) / 16000 for p in pieces] == [10.0, 10.5]
    assert np.array_equal(np.concatenate(pieces), speech)


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


# --- each turn checked ([voices] verify, claim) -----------------------------------------------
# Meeting B's close render, the reference's own utterances as turns (STM): LS1688 0.58-8.58 s,
# LS1998 9.48-16.59 s, LS2033 (nobody remembered) 69.96-72.50 s, LS1998 77.90-79.98 s.
CHECKED = IdentifySettings(verify=0.35, claim=0.40)
"""The `[voices]` defaults (`verify` 0.35, `claim` 0.40)."""


def checks_of(d: Diarized, settings: IdentifySettings = CHECKED) -> TurnChecks:
    """The directory names LS1688's and LS1998's batch voices (as `identify_speakers` would);
    the turns are checked on the meeting's audio."""
    voices = directory(d, *REMEMBERED)
    by_name = {v.name: v.id for v in voices}
    names = DirectoryNames(
        d.stage.live_model,
        named={d.label_of[s]: s for s in REMEMBERED},
        voice_ids={d.label_of[s]: by_name[s] for s in REMEMBERED},
    )
    return TurnChecks(d.stage, d.audio, names, voices, settings,
                      anonymous=list(d.label_of.values()))


def test_a_checked_turn_that_sounds_like_its_person_keeps_the_name(diarized: Diarized) -> None:
    checks = checks_of(diarized)
    assert checks.reads(diarized.label_of["LS1688"], [(0.58, 8.58)]) == "LS1688"
    assert checks.reads(diarized.label_of["LS1998"], [(9.48, 12.0), (12.3, 16.59)]) == "LS1998"
    assert (checks.unmatched, checks.claimed, checks.lines()) == (0, 0, [])


def test_a_turn_of_someone_else_under_a_named_voice_reads_its_letter(diarized: Diarized) -> None:
    """LS2033's words given to LS1688's voice (what a far-field stage does at a change of
    speaker) do not sound like LS1688: the turn reads the voice's letter, and says so."""
    checks = checks_of(diarized, IdentifySettings(verify=0.40))
    label = diarized.label_of["LS1688"]
    assert checks.reads(label, [(69.96, 72.50)]) == label
    assert checks.unmatched == 1 and checks.claimed == 0
    assert "1 turn(s) did not sound like" in checks.lines()[0]


def test_a_turn_that_sounds_like_another_named_person_is_claimed(diarized: Diarized) -> None:
    """LS1998's speech under the new voice's letter (a split person) reads LS1998 with `claim`;
    without it, the letter."""
    new = diarized.label_of[NEW]
    checks = checks_of(diarized)
    assert checks.reads(new, [(77.9, 79.98)]) == "LS1998"
    assert checks.claimed == 1 and checks.unmatched == 0
    assert "read that name" in checks.lines()[0]
    unclaimed = checks_of(diarized, IdentifySettings(verify=0.40))
    assert unclaimed.reads(new, [(77.9, 79.98)]) == new and unclaimed.claimed == 0
    # the new voice's own speech claims nobody
    assert checks.reads(new, [(69.96, 72.50)]) == new


def test_a_turn_of_a_remembered_person_no_voice_is_named_for_is_claimed_with_claim_new(
    diarized: Diarized,
) -> None:
    """LS1998 remembered but named for no voice (as when the stage has not told her voice apart
    yet): her speech under the new voice's letter reads LS1998 with `claim_new`, its letter
    without; the new voice's own speech claims nobody."""
    voices = directory(diarized, *REMEMBERED)
    names = DirectoryNames(
        diarized.stage.live_model,
        named={diarized.label_of["LS1688"]: "LS1688"},
        voice_ids={diarized.label_of["LS1688"]: next(v.id for v in voices if v.name == "LS1688")},
    )
    new = diarized.label_of[NEW]

    def checks(settings: IdentifySettings) -> TurnChecks:
        return TurnChecks(diarized.stage, diarized.audio, names, voices, settings,
                          anonymous=list(diarized.label_of.values()))

    claiming = checks(dataclasses.replace(CHECKED, claim_new=0.55))
    assert claiming.reads(new, [(77.9, 79.98)]) == "LS1998"
    assert claiming.reads(new, [(69.96, 72.50)]) == new
    assert claiming.claimed == 1
    assert checks(CHECKED).reads(new, [(77.9, 79.98)]) == new


def test_unchecked_turns_read_their_voices_names(diarized: Diarized) -> None:
    """`verify` off, or an enrolled name (not anonymous): the turn reads what its voice reads,
    with nothing counted. A checked turn too short to print (under 0.5 s) cannot show it is the
    person: it reads its letter, counted as unmatched."""
    label = diarized.label_of["LS1688"]
    short = checks_of(diarized)
    assert short.reads(label, [(70.0, 70.4)]) == label
    assert short.unmatched == 1
    off = checks_of(diarized, IdentifySettings())
    assert off.reads(label, [(69.96, 72.50)]) == "LS1688"
    enrolled = TurnChecks(diarized.stage, diarized.audio, checks_of(diarized).names,
                          directory(diarized, *REMEMBERED), CHECKED, anonymous=[])
    assert enrolled.reads(label, [(69.96, 72.50)]) == "LS1688"
    assert (off.unmatched, enrolled.unmatched) == (0, 0)


def test_stretches_in_a_row_are_one_turn() -> None:
    stretches = [("A", 0.0, 1.0), ("A", 1.0 + TURN_GAP_S, 3.0), ("B", 2.5, 4.0),
                 ("A", 4.1, 5.0), ("A", 6.0, 7.0)]
    assert stretch_turns(stretches) == [[0, 1], [2], [3], [4]]
    assert stretch_turns(list(reversed(stretches))) == [[4, 3], [2], [1], [0]]
    assert stretch_turns([]) == []


def test_the_timeline_reads_each_turn_as_checked(diarized: Diarized) -> None:
    """`chorus diarize --voices`: a timeline where LS1688's voice also holds LS2033's words
    reads LS1688 on his own turn and the letter on the other; the unnamed voice's stretch of
    LS1998 reads LS1998."""
    a, new = diarized.label_of["LS1688"], diarized.label_of[NEW]
    timeline = SpeakerTimeline([SpeakerSegment(0.58, 8.58, a), SpeakerSegment(69.96, 72.5, a),
                                SpeakerSegment(77.9, 79.98, new)])
    out = checked_timeline(checks_of(diarized), timeline)
    assert [(s.start, s.speaker) for s in out] == [(0.58, "LS1688"), (69.96, a), (77.9, "LS1998")]


def test_the_batch_bench_checks_turns_as_diarize_does(diarized: Diarized) -> None:
    """`chorus bench voices --path batch` at verify and claim shows every stretch under what
    `checked_timeline` (what `chorus diarize --voices` writes) gives it."""
    from bench.voices import TurnPrints, batch_meeting, replay_names
    from tests.conftest import SHARED_FIXTURES
    from voice.identify import known_voices

    meeting = batch_meeting(diarized.stage, diarized.audio, MEETING,
                            SHARED_FIXTURES / f"{MEETING}.rttm")
    meeting.printer = TurnPrints(diarized.stage).of(MEETING, diarized.audio)
    voices = directory(diarized, *REMEMBERED)
    strict = IdentifySettings(verify=0.7, claim=0.46)  # some turns fail, so both paths decide
    shown, _ = replay_names(meeting, known_voices(voices, diarized.stage.live_model), strict)
    names = name_speakers(diarized.stage, diarized.audio, diarized.timeline, voices, strict)
    checks = TurnChecks(diarized.stage, diarized.audio, names, voices, strict,
                        anonymous=diarized.timeline.speakers)
    written = checked_timeline(checks, diarized.timeline)
    assert checks.unmatched > 0
    assert sorted((round(s.start, 3), s.name or s.label) for s in shown) == sorted(
        (round(s.start, 3), s.speaker) for s in written)


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
    seconds: dict[str, float] = {}
    for row in (line.split() for line in rttm.read_text().splitlines()):
        seconds[row[7]] = seconds.get(row[7], 0.0) + float(row[4])
    assert seconds["LS1688"] > 20 and seconds["LS1998"] > 20
    letters = sorted(v for k, v in seconds.items() if not k.startswith("LS"))
    assert letters[-1] > 20  # the new voice, and a named voice's turns too short to check:
    assert sum(letters[:-1]) < 1.0  # their letter
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


def test_diarize_and_transcribe_check_each_turn(
    remembered: Path, shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`[voices] verify` reaches both commands: at 0.99 no turn sounds enough like its person, so
    the voices are named (said on the output) but every checked turn reads its letter, and the
    commands say how many; at the defaults their turns keep their names."""
    config = tmp_path / "strict.toml"
    config.write_text(remembered.read_text() + "[voices]\nverify = 0.99\nclaim = 2\n")
    rttm = tmp_path / "b.rttm"
    audio = str(shared_fixtures / f"{MEETING}.flac")
    assert main(["diarize", audio, "--rttm", str(rttm), "--voices", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert "→ LS1688 (voice directory)" in out and "did not sound like" in out
    rows = [line.split() for line in rttm.read_text().splitlines()]
    assert {r[7] for r in rows} == {  # turns too short to print read their letter too
        "Speaker_A", "Speaker_B", "Speaker_C"}
    words = tmp_path / "b.json"
    assert main(["transcribe", audio, "--pipeline-speakers", "--voices", "--config", str(config),
                 "--format", "json", "--model", "tiny.en", "--no-progress",
                 "-o", str(words)]) == 0
    err = capsys.readouterr().err
    assert "→ LS1688 (voice directory)" in err and "did not sound like their speaker" in err
    checked = json.loads(words.read_text())  # every turn, those too short to print too
    assert checked and {t["speaker"] for t in checked} <= {"Speaker A", "Speaker B", "Speaker C"}
    assert main(["transcribe", audio, "--pipeline-speakers", "--voices", "--config",
                 str(remembered), "--format", "json", "--model", "tiny.en", "--no-progress",
                 "-o", str(words)]) == 0
    capsys.readouterr()
    kept = [t["speaker"] for t in json.loads(words.read_text()) if t["speaker"].startswith("LS")]
    assert set(kept) == {"LS1688", "LS1998"} and len(kept) >= 8


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
