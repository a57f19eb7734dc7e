"""`chorus bench words` scores (issue 23, item 6): MeetEval's WER and cpWER after the Whisper
English normaliser, words in non-speech, and the leave-one-file-out choice among runs."""

from __future__ import annotations

from dataclasses import dataclass

from bench.words import Segment, error_rates, invented_words, leave_one_out
from voice.turns import Word


@dataclass
class Turn:
    speaker: str | None
    label: str | None
    start: float
    end: float
    text: str
    words: tuple[Word, ...] = ()


REFERENCE = [Segment("ann", 0.0, 2.0, "the cat sat"), Segment("bob", 2.5, 4.0, "on the mat")]


def test_cpwer_charges_words_under_the_wrong_speaker_and_wer_does_not() -> None:
    turns = [Turn("Speaker A", "Speaker A", 0.0, 3.5, "The cat sat, on the mat.")]
    rates = error_rates(REFERENCE, turns, "s1")
    assert rates["wer"]["errors"] == 0 and rates["wer"]["length"] == 6  # case and commas normalised
    assert rates["cpwer"]["errors"] == 6  # bob's three words missed, and inserted under ann's


def test_a_word_touching_no_reference_speech_is_invented() -> None:
    words = (Word("late", 1.9, 2.3), Word("made-up", 4.5, 4.8))
    count, minutes = invented_words(
        REFERENCE, [Turn("A", "A", 0, 5, "late made-up", words)], duration=10.0, collar=0.25
    )
    assert count == 1 and abs(minutes - (10.0 - 4.25) / 60) < 1e-9  # speech ± collar: 0-4.25 s


def test_leave_one_file_out_scores_each_file_with_the_run_the_others_chose() -> None:
    def entry(name: str, errors: int) -> dict[str, object]:
        rate = {"errors": errors, "length": 10}
        return {"audio": name, "wer": rate, "cpwer": rate}

    runs = {
        "a": [entry("x", 1), entry("y", 1), entry("z", 9)],
        "b": [entry("x", 5), entry("y", 5), entry("z", 0)],
    }
    result = leave_one_out(runs)
    # x held out: on y and z, b makes 5 errors and a 10; z held out: on x and y, a makes 2
    assert [h["chosen"] for h in result["held_out"]] == ["b", "b", "a"]
    assert result["pooled_held_out"]["cpwer"] == round((5 + 5 + 9) / 30, 4)
