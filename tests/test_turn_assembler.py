"""The turn assembler alone (rules V3, V5): words and the stage's view in, decisions out.

No room, no STT server, no audio: each case is a list of inputs and the decisions they must give.
The end-to-end tests in test_voice_channel.py and test_voice_early_commit.py keep a few of the
same cases through a real `VoiceSession`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from voice.assembler import Commit, Decision, Revise, TurnAssembler, TurnPolicy
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline
from voice.stage_driver import decided_handovers
from voice.turns import Word


def w(text: str, start: float, end: float, speaker: str | None = None) -> Word:
    return Word(text, start, end, speaker=speaker)


def tl(*segments: tuple[float, float, str]) -> SpeakerTimeline:
    return SpeakerTimeline([SpeakerSegment(a, b, s) for a, b, s in segments])


def said(decisions: list[Decision]) -> list[tuple[str, str | None, str]]:
    """Each decision as (kind, speaker or reason, text)."""
    out: list[tuple[str, str | None, str]] = []
    for d in decisions:
        if isinstance(d, Commit):
            out.append(("commit", d.turn.speaker, d.turn.text))
        else:
            out.append(("revise", d.reason, " ".join(x.text for x in d.words)))
    return out


def post_all(assembler: TurnAssembler, decisions: list[Decision]) -> list[Decision]:
    """The session posts every commit (no hook blocks)."""
    for d in decisions:
        if isinstance(d, Commit):
            assembler.posted(d.key)
    return decisions


# --------------------------------------------------------------------- runs from STT labels (V3)

RUNS = [
    # (name, finals [(words, speech_final)], then flush?, expected decisions)
    ("one voice waits for the end of speech",
     [([w("Hello", 0, .4, "A"), w("there", .5, .9, "A")], False)], False, []),
    ("the end of speech closes the run",
     [([w("Hello", 0, .4, "A"), w("there", .5, .9, "A")], True)], False,
     [("commit", "A", "Hello there")]),
    ("a change of voice closes the run before it",
     [([w("Ship", 0, .4, "A"), w("it?", .5, .9, "A"), w("No.", 1.2, 1.5, "B")], False)], False,
     [("commit", "A", "Ship it?")]),
    ("a sentence split over two finals is one turn",
     [([w("Ship", 0, .4, "A")], False), ([w("it?", .5, .9, "A")], True)], False,
     [("commit", "A", "Ship it?")]),
    ("a flush closes whatever waits",
     [([w("Ship", 0, .4, "A"), w("No.", 1.2, 1.5, "B")], False)], True,
     [("commit", "A", "Ship"), ("commit", "B", "No.")]),
]


@pytest.mark.parametrize(("finals", "flush", "expected"), [c[1:] for c in RUNS],
                         ids=[c[0] for c in RUNS])
def test_V3_runs_of_one_voice_are_turns(finals: list[tuple[list[Word], bool]], flush: bool,
                                        expected: list[tuple[str, str | None, str]]) -> None:
    a = TurnAssembler()
    out: list[Decision] = []
    for words, speech_final in finals:
        out += a.final(tuple(words), speech_final=speech_final)
        out += post_all(a, a.advance())
    if flush:
        out += a.advance(force=True)
    assert said(out) == expected


# ------------------------------------------------------------- early commit from interim hints

EARLY = [
    ("a voice change in the hints commits the run it closes",
     [w("Ship", 0, .4), w("it?", .5, .9), w("No", 1.0, 1.3)], ("A", "A", "B"),
     [("commit", "A", "Ship it?")]),
    ("no change, nothing yet",
     [w("Ship", 0, .4), w("it?", .5, .9)], ("A", "A"), []),
    ("a voice not bound yet closes nothing",
     [w("Ship", 0, .4), w("it?", .5, .9), w("No", 1.0, 1.3)], (None, None, "B"), []),
    ("two changes commit two turns",
     [w("Ship", 0, .4), w("No", .5, .9), w("Yes", 1.0, 1.3)], ("A", "B", "A"),
     [("commit", "A", "Ship"), ("commit", "B", "No")]),
]


@pytest.mark.parametrize(("words", "hints", "expected"), [c[1:] for c in EARLY],
                         ids=[c[0] for c in EARLY])
def test_early_commit_from_an_interim_voice_change(words: list[Word], hints: tuple[str | None, ...],
                                                    expected: list[tuple[str, str | None, str]]) -> None:
    a = TurnAssembler()
    assert said(a.interim(tuple(words), hints, final_until=0.0)) == expected


def test_early_commit_off_commits_nothing_from_interims() -> None:
    a = TurnAssembler(TurnPolicy(early_commit=False))
    words = (w("Ship", 0, .4), w("No", .5, .9))
    assert a.interim(words, ("A", "B"), final_until=0.0) == []


SETTLE = [
    ("the final agrees: nothing is sent again",
     [w("Ship", 0, .4, "A"), w("it?", .5, .9, "A"), w("No", 1.0, 1.3, "B")], []),
    ("the final heard other words: the early turn is corrected",
     [w("Shipped", 0, .4, "A"), w("it?", .5, .9, "A"), w("No", 1.0, 1.3, "B")],
     [("revise", "final", "Shipped it?")]),
    ("the final heard none of it: kept, marked unconfirmed",
     [w("No", 1.0, 1.3, "B")], [("revise", "unconfirmed", "Ship it?")]),
]


@pytest.mark.parametrize(("final", "expected"), [c[1:] for c in SETTLE], ids=[c[0] for c in SETTLE])
def test_the_final_settles_early_turns(final: list[Word],
                                       expected: list[tuple[str, str | None, str]]) -> None:
    a = TurnAssembler()
    early = post_all(a, a.interim((w("Ship", 0, .4), w("it?", .5, .9), w("No", 1.0, 1.3)),
                                  ("A", "A", "B"), final_until=0.0))
    assert said(early) == [("commit", "A", "Ship it?")]
    revised = a.final(tuple(final), speech_final=False)
    assert said(revised) == expected
    assert all(isinstance(d, Revise) and d.key == early[0].key for d in revised)  # type: ignore[union-attr]
    # the next voice's words are still a turn of their own
    assert said(a.advance(force=True)) == [("commit", "B", "No")]


# ------------------------------------------------------------------- pipeline speakers (V5)

VOICES = tl((0.0, 1.0, "Alice"), (1.1, 2.0, "Bob"))
ALICE = (w("Ship", 0.1, 0.4), w("it?", 0.5, 0.9))
BOB = (w("No,", 1.2, 1.5), w("wait.", 1.6, 1.9))


def pipeline(policy: TurnPolicy | None = None) -> TurnAssembler:
    return TurnAssembler(policy or TurnPolicy(speaker_wait=30.0), pipeline=True)


def test_V5_words_wait_for_the_stage_then_take_its_speakers() -> None:
    a = pipeline()
    a.final(ALICE + BOB, speech_final=True)
    assert a.advance() == [] and a.unplaced  # the stage has decided nothing yet
    a.stage_heard(VOICES, SpeakerTimeline(), heard=2.0)
    assert said(a.advance()) == [("commit", "Alice", "Ship it?"), ("commit", "Bob", "No, wait.")]
    assert not a.unplaced


def test_V5_a_word_the_stage_never_places_goes_once_it_has_heard_past_the_wait() -> None:
    a = pipeline(TurnPolicy(speaker_wait=2.0))
    a.final((w("Hm", 5.0, 5.3),), speech_final=True)
    a.stage_heard(tl((0.0, 1.0, "Alice")), SpeakerTimeline(), heard=6.0)
    assert a.advance() == []
    a.stage_heard(tl((0.0, 1.0, "Alice")), SpeakerTimeline(), heard=7.4)
    assert said(a.advance()) == [("commit", None, "Hm")]  # nobody near it: the stream's owner


@pytest.mark.parametrize(("provisional", "expected"), [
    (True, [("commit", "Alice", "Ship it?")]),  # the last word continues Alice: no wait
    (False, []),
])
def test_V5_a_provisional_speaker_that_continues_the_voice_goes_on_at_once(
        provisional: bool, expected: list[tuple[str, str | None, str]]) -> None:
    a = pipeline(TurnPolicy(speaker_wait=30.0, provisional_speakers=provisional))
    a.final(ALICE, speech_final=True)
    a.stage_heard(tl((0.0, 0.45, "Alice")), tl((0.45, 1.0, "Alice")), heard=1.0)
    assert said(a.advance()) == expected


def test_V5_a_provisional_voice_change_does_not_place_the_next_voice() -> None:
    a = pipeline()
    a.final(ALICE + BOB, speech_final=False)
    a.stage_heard(tl((0.0, 1.0, "Alice")), tl((1.1, 2.0, "Bob")), heard=2.0)
    out = post_all(a, a.advance())
    # Alice's run closes on the provisional change; Bob's words wait for the decision
    assert said(out) == [("commit", "Alice", "Ship it?")]
    assert a.unplaced


def test_V5_a_turn_closed_on_a_provisional_change_is_reopened_when_the_voice_went_on() -> None:
    a = pipeline()
    more = (w("Yes,", 1.2, 1.5), w("today.", 1.6, 1.9))
    a.final(ALICE + more, speech_final=False)
    a.stage_heard(tl((0.0, 1.0, "Alice")), tl((1.1, 2.0, "Bob")), heard=2.0)  # a wrong guess
    closed = post_all(a, a.advance())
    assert said(closed) == [("commit", "Alice", "Ship it?")]
    a.stage_heard(tl((0.0, 2.0, "Alice")), SpeakerTimeline(), heard=3.0)  # it was Alice
    out = a.advance(force=True)
    assert said(out) == [("revise", "went_on", "Ship it? Yes, today.")]
    assert isinstance(out[0], Revise) and out[0].key == closed[0].key


def test_V5_a_blocked_turn_is_never_reopened() -> None:
    a = pipeline()
    a.final((*ALICE, w("Yes,", 1.2, 1.5)), speech_final=False)
    a.stage_heard(tl((0.0, 1.0, "Alice")), tl((1.1, 2.0, "Bob")), heard=2.0)
    assert said(a.advance()) == [("commit", "Alice", "Ship it?")]  # not posted: a hook blocked it
    a.stage_heard(tl((0.0, 2.0, "Alice")), SpeakerTimeline(), heard=3.0)
    assert said(a.advance(force=True)) == [("commit", "Alice", "Yes,")]


@pytest.mark.parametrize("changes", [True, False])
def test_V5_provisional_changes_off_waits_for_the_decision(changes: bool) -> None:
    a = pipeline(TurnPolicy(speaker_wait=30.0, provisional_changes=changes))
    a.final(ALICE + BOB, speech_final=False)
    a.stage_heard(tl((0.0, 1.0, "Alice")), tl((1.1, 2.0, "Bob")), heard=2.0)
    assert bool(a.advance()) is changes


HANDOVERS = [
    ("a handover right after the run's last word closes it", (1.0, "Alice"), True),
    ("a handover of another voice does not", (1.0, "Bob"), False),
    ("a handover long after the run's end does not", (3.0, "Alice"), False),
]


@pytest.mark.parametrize(("handover", "closes"), [c[1:] for c in HANDOVERS],
                         ids=[c[0] for c in HANDOVERS])
def test_V5_a_decided_handover_closes_the_waiting_run(handover: tuple[float, str],
                                                      closes: bool) -> None:
    a = pipeline()
    a.final(ALICE, speech_final=False)
    a.stage_heard(tl((0.0, 1.0, "Alice")), SpeakerTimeline(), heard=1.5)
    assert a.advance() == []  # placed, waiting for its end
    a.handover(*handover)
    assert a.waiting_on_stage
    assert said(a.advance()) == ([("commit", "Alice", "Ship it?")] if closes else [])


def test_V5_interim_hints_in_pipeline_mode_are_the_stage_decisions_only() -> None:
    a = pipeline()
    interim = ALICE + BOB
    a.stage_heard(tl((0.0, 1.0, "Alice")), tl((1.1, 2.0, "Bob")), heard=2.0)
    assert a.wants_decided_hints
    assert a.interim(interim, (), final_until=0.0) == []  # Bob is only provisional
    a.stage_heard(VOICES, SpeakerTimeline(), heard=2.5)
    assert said(a.interim(interim, (), final_until=0.0)) == [("commit", "Alice", "Ship it?")]


# ------------------------------------------------------------------------ decided handovers

HANDOVER_CASES = [
    ("overlap: at the first voice's end", tl((0.0, 2.0, "A"), (1.8, 3.0, "B")), [(2.0, "A")]),
    ("a short pause", tl((0.0, 2.0, "A"), (2.2, 3.0, "B")), [(2.1, "A")]),
    ("a long pause is no handover", tl((0.0, 2.0, "A"), (2.6, 3.0, "B")), []),
    ("one voice", tl((0.0, 2.0, "A"), (2.1, 3.0, "A")), []),
    ("a short voice inside a longer one", tl((0.0, 3.0, "A"), (1.0, 1.5, "B")), []),
    ("too short to count", tl((0.0, 2.0, "A"), (2.0, 2.2, "B")), []),
]


@pytest.mark.parametrize(("timeline", "expected"), [c[1:] for c in HANDOVER_CASES],
                         ids=[c[0] for c in HANDOVER_CASES])
def test_decided_handovers(timeline: SpeakerTimeline, expected: list[tuple[float, str]]) -> None:
    found = decided_handovers(timeline, 0.0)
    assert [(round(at, 3), who) for at, who in found] == expected
    assert decided_handovers(timeline, 5.0) == []  # told already


# ---------------------------------------------------------------------------- properties


@dataclass
class _Posted:
    words: list[str]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), st.integers(1, 3)), min_size=1,
                max_size=12),
       st.booleans())
def test_every_final_word_is_committed_once_in_order(voices: list[tuple[str, int]],
                                                      early: bool) -> None:
    """Whatever the voices, a flush leaves no word behind and commits none twice (STT labels)."""
    words: list[Word] = []
    t = 0.0
    for voice, count in voices:
        for _ in range(count):
            words.append(w(f"w{len(words)}", t, t + 0.3, voice))
            t += 0.4
    a = TurnAssembler(TurnPolicy(early_commit=early))
    posted = _Posted([])
    half = len(words) // 2
    decisions = a.final(tuple(words[:half]), speech_final=False) + a.advance()
    decisions += a.final(tuple(words[half:]), speech_final=False) + a.advance(force=True)
    for d in decisions:
        assert isinstance(d, Commit)
        posted.words += [x.text for x in d.turn.words]
        assert len({x.speaker for x in d.turn.words}) == 1
    assert posted.words == [x.text for x in words]
