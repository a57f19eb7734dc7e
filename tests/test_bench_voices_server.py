"""`chorus bench voices --path server` (issue 27's measurement through a real `chorus serve`):
the turns that reached the device, scored by the one scoring of the voices bench
(`bench.voices.score_shown`): a turn is named when its speaker is not its label, suggested when
the feed suggested a name for its label before it; a corrected turn counts from its settled
version; the first name's time is the arrival of the first named turn holding that speaker's
speech. The last test runs the whole server path on a cut of the voiceprint pair."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from bench._voices_server import (
    _config,
    _shown_turns,
    in_turns,
    label_of,
    suggestions_by_turn,
    voices_of,
    voices_settings,
)
from bench.load import StreamResult
from bench.voices import GRID_S, Shown, _frames, score_shown
from server.protocol import SpeakerSuggestionMessage, TurnMessage

N = _frames(20.0) + 1


def grid(*spans: tuple[float, float]) -> np.ndarray:
    out = np.zeros(N, dtype=bool)
    for start, end in spans:
        out[_frames(start) : _frames(end)] = True
    return out


REFERENCE = {
    "Ian": grid((0.0, 4.0), (10.0, 12.0)),
    "Peg": grid((4.0, 8.0)),
    "New": grid((14.0, 18.0)),
}


def turn(event: str, label: str, start: float, end: float, speaker: str | None = None,
         corrected: bool = False) -> TurnMessage:
    return TurnMessage(room="meeting-b", speaker=speaker or label, label=label, text="…",
                       start=start, end=end, participant="p", event_id=event, corrected=corrected)


def suggestion(label: str, name: str) -> SpeakerSuggestionMessage:
    return SpeakerSuggestionMessage(room="meeting-b", label=label, name=name, source="voice")


def test_turns_as_they_reached_the_device_are_scored_by_the_benchs_scoring() -> None:
    result = StreamResult()
    result.sent_wall = [100.0, 100.1]
    result.versions = [
        (105.0, turn("1", "Speaker A", 0.0, 4.0)),  # a letter, nothing suggested yet
        (109.0, turn("2", "Speaker B", 4.0, 8.0)),  # suggested Peg (the feed, before it)
        (113.0, turn("3", "Speaker A", 10.0, 12.0, "Ian")),  # named
        (119.0, turn("4", "Speaker C", 14.0, 18.0, "Speaker C")),
        (119.5, turn("4", "Speaker C", 14.0, 18.0, "Peg", corrected=True)),  # wrongly named
    ]
    feed = [
        result.versions[0][1],
        suggestion("Speaker B", "Peg"),
        result.versions[1][1],
        result.versions[2][1],
        result.versions[3][1],
        result.versions[4][1],
    ]
    suggestions = suggestions_by_turn(feed)
    assert suggestions == {"2": "Peg"}
    shown, final, rows = _shown_turns(result, suggestions)
    assert [(s.label, s.at, s.name, s.suggested) for s in shown] == [
        ("Speaker A", 5.0, None, None),
        ("Speaker B", 9.0, None, "Peg"),
        ("Speaker A", 13.0, "Ian", None),
        ("Speaker C", 19.5, "Peg", None),  # the settled version: the corrected one
    ]
    assert final == {"Speaker A": "Ian", "Speaker B": None, "Speaker C": "Peg"}
    assert len(rows) == 4
    named_first = [dataclasses.replace(shown[0], name="Ian"), *shown[1:]]
    again = score_shown(REFERENCE, named_first, ["Ian", "Peg"], final)
    assert again.first_turn["Ian"] == (_frames(4.0), _frames(4.0))
    outcome = score_shown(REFERENCE, shown, ["Ian", "Peg"], final)
    assert outcome.named == {"Ian": _frames(2.0), "Peg": 0}
    assert outcome.named_or_suggested == {"Ian": _frames(2.0), "Peg": _frames(4.0)}
    assert outcome.first_named == {"Ian": 13.0, "Peg": None}  # arrival − their first speech
    assert outcome.first_suggested == {"Ian": None, "Peg": 5.0}
    # their first turns (the target includes one of 3 s or more): Ian's 4 s at 0 s
    # read a letter, Peg's was only suggested
    assert outcome.first_turn == {"Ian": (_frames(4.0), 0), "Peg": (_frames(4.0), 0)}
    assert outcome.wrong == _frames(4.0)  # New's speech under Peg's name
    assert outcome.strangers_named == {"New": _frames(4.0)}
    assert outcome.strangers_voice == {"New": "Peg"}
    assert outcome.speech * GRID_S == pytest.approx(14.0)
    assert in_turns(REFERENCE, shown[1:]) == {"Ian": pytest.approx(2 / 6), "New": 1.0, "Peg": 1.0}
    assert voices_of(REFERENCE, shown, final) == {
        "Speaker A": {"name": "Ian", "speech_s": {"Ian": 6.0}},
        "Speaker B": {"name": None, "speech_s": {"Peg": 4.0}},
        "Speaker C": {"name": "Peg", "speech_s": {"New": 4.0}},
    }


def test_each_speaker_of_meeting_a_is_remembered_from_the_label_holding_most_of_their_speech() -> (
    None
):
    result = StreamResult()
    result.versions = [
        (1.0, turn("1", "Speaker A", 0.0, 3.0)),
        (2.0, turn("2", "Speaker B", 3.0, 4.5)),  # Ian's speech, but less of it
        (3.0, turn("3", "Speaker B", 4.5, 8.0)),
        (4.0, turn("4", "Speaker A", 9.0, 9.5)),
    ]
    assert label_of(result, REFERENCE) == {"Ian": "Speaker A", "Peg": "Speaker B"}  # New: no turn

    # one voice holding most of two speakers' speech is remembered once, for whom it holds most
    result.versions = [
        (1.0, turn("1", "Speaker A", 0.0, 8.0)),  # Ian 4 s, Peg 4 s
        (2.0, turn("2", "Speaker A", 10.0, 12.0)),  # Ian 2 s more
        (3.0, turn("3", "Speaker B", 7.0, 7.5)),  # a little of Peg
    ]
    assert label_of(result, REFERENCE) == {"Ian": "Speaker A", "Peg": "Speaker B"}


@pytest.mark.slow
def test_voices_settings_reach_the_servers_config_and_bad_ones_are_refused(
    tmp_path: Path,
) -> None:
    import tomllib

    from pydantic import ValidationError

    voices = voices_settings(["verify=-1", "auto = 0.5"])
    assert voices == {"verify": -1.0, "auto": 0.5}
    config = tomllib.loads(_config(tmp_path, voices))
    assert config["voices"] == {"enabled": True, "verify": -1.0, "auto": 0.5}
    assert config["stt"] == {"provider": "whisper"}  # the embedded default model
    assert tomllib.loads(_config(tmp_path, voices, "base"))["stt"] == {
        "provider": "whisper", "model": "base"
    }
    with pytest.raises(ValidationError):
        voices_settings(["loudness=2"])
    with pytest.raises(SystemExit):
        voices_settings(["verify"])


def test_the_server_path_runs_end_to_end_on_a_cut_of_the_pair(
    shared_fixtures: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`chorus serve` started by the bench, the first 12 s of each meeting at real-time pace:
    meeting A's speakers remembered (or their refusals reported), meeting B's turns scored."""
    from cli.main import main

    out = tmp_path / "voices.json"
    assert main(["bench", "voices", str(shared_fixtures / "librispeech-meetings"), "--path",
                 "server", "--seconds", "12", "--voices-set", "verify=-1", "--json",
                 str(out)]) == 0
    report = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "meeting B (lsmeet_dev05_vpB_3spk_far)" in printed
    assert report["path"] == "server" and report["seconds"] == 12
    assert report["verify"] == -1.0  # the server ran with `[voices] verify = -1.0`
    # the speakers of A's first 12 s: each remembered or refused with a reason
    attempts = {a["speaker"]: a for a in report["directory_attempts"]}
    assert set(attempts) == {"LS367", "LS1688"}
    for a in attempts.values():
        assert a["status"] == 201 or a["problem"], a
    assert sorted(report["remembered"]) == sorted(
        s for s, a in attempts.items() if a["status"] == 201
    )
    assert report["meeting_a_turns"]["turns"] > 0 and report["meeting_a_turns"]["error"] is None
    b = report["meeting_b_turns"]
    assert b["turns"] > 0 and b["error"] is None
    assert all(t["end"] <= 12.5 for t in report["turns"])
    [row] = report["pair"].values()
    assert set(row["speakers"]) == set(report["remembered"]) & {"LS1688", "LS1998"}
    assert 0.0 <= row["wrong"] <= 1.0


def test_the_name_a_voice_ended_with_skips_turns_too_short_to_check() -> None:
    """A turn under `TURN_MIN_S` reads its letter whatever its voice is named (the check cannot
    print it), so the name a voice ended with is its last turn's long enough to be checked."""
    result = StreamResult()
    result.sent_wall = [100.0]
    result.versions = [
        (105.0, turn("1", "Speaker A", 0.0, 4.0, "Ian")),
        (106.0, turn("2", "Speaker A", 4.1, 4.4)),  # "Yes.": too short to check, its letter
    ]
    _, final, _ = _shown_turns(result, {})
    assert final == {"Speaker A": "Ian"}


def test_a_speakers_first_turn_runs_until_someone_else_speaks_alone() -> None:
    """A turn is a whole utterance (its pauses inside, an overlap by the next speaker too): it
    ends where someone else speaks while its speaker does not."""
    ref = {"Ian": grid((0.0, 2.0), (2.5, 4.0), (4.5, 5.0), (9.0, 10.0)), "Peg": grid((4.8, 8.0))}
    shown = [Shown("Speaker A", 0.0, 2.0, 3.0, "Ian"), Shown("Speaker A", 2.5, 5.0, 6.0)]
    outcome = score_shown(ref, shown, ["Ian"], {})
    assert outcome.first_turn == {"Ian": (_frames(4.0), _frames(2.0))}  # 0-5 s: 4 s of speech
