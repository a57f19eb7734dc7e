"""Naming a stream's anonymous voices from the voice directory, in tiers (issue 27.2).

Pure numpy over prints: no store, no loop, no room. A stream's stage shows, per anonymous voice
(its letter), a unit voiceprint and the seconds it has spoken (`StagePrints`); the directory
holds, per person, the prints of that same model (never another model's). A voice's score
against a person is its best cosine similarity with one of the person's prints (one print per
meeting or clip: the nearest recording condition counts).

Tiers, per `IdentifySettings`: a score at or above `auto` names the voice (the person's name on
its turns); from `suggest` up to `auto`, the voice keeps its letter and the feed hears a
suggestion; below, nothing. Only voices heard at least `min_heard_s` are scored (a centroid of
one short stretch is noise). The assignment is one-to-one within a stream (Hungarian, highest
total score): one voice never takes two names and two voices never one name; a name given is
kept for the stream (it never moves to another voice, and the voice never takes another name),
until its person is forgotten (`StreamVoices.forget`).

A name is given to a voice, but a far-field stage's voice is not always one person: at turn
changes segmentation-3.0 can give one local speaker two people, and their mixed speech joins the
named voice. So with `verify` set each turn is checked too (`turn_matches`): the print of the
turn's own audio (`TURN_MIN_S` or more of it) must score at least `verify` against the person
its voice is named after, or the turn reads as its voice's letter (the voice keeps its name for
the next turn). A turn too short to print (under `TURN_MIN_S`: a word or two, most often at a
change of speaker) cannot show it is the person, so it reads the letter too (`turn_person` of no
print). The bench's folds cut wrong names 6.6 -> 2.8 % of the speech for 1.9 points of
named speech (docs/benchmarks.md, "Checking each turn"). A long turn can hold both people, more
of the named one, and still match as a whole; so a turn of twice `TURN_PART_S` or more is also
printed in parts (`print_turn`, `turn_parts`) and must match on every part
(docs/benchmarks.md, "A turn checked in parts").

The stage also splits a person: part of their speech goes to a voice of its own, or to another
person's voice. With `claim` set, a checked turn that reads no name of its own voice takes the
name of the person named for another voice of the stream whose prints it matches best, at or
above `claim` (`turn_person`). With `claim_new` set as well, a turn that claims nobody named in
the stream may read a remembered person named for none of its voices (`claimable`: the stage has
not told their voice apart yet, or gave their speech to another person's voice), at or above
`claim_new`; the turn reads the name, its voice does not take it. A person suggested for a voice
is not claimed this way: the suggest tier keeps its letter until someone confirms. A voice's own
name is never given to another voice: names go to voices one-to-one (`StreamVoices`), claims
only to turns.

A whole recording (`chorus transcribe`, `chorus diarize`) is one stream scored once, after its
diarization: `identify_once` is `StreamVoices.update` on a fresh stream, so batch and live share
the function, the thresholds and the one-to-one rule; its turns are checked and claimed by the
same `turn_person` (`diarization.directory.TurnChecks`). Where there are no words to say where a
turn is (`chorus diarize`, the bench's replay), a label's stretches in a row are one turn
(`stretch_turns`), printed from their own audio (`turn_clip`). `known_voices` turns the directory's people
into `KnownVoice`s of one model (every print of another model is left out, never compared).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

from rooms.voices import RememberedVoice
from voice.audio import split_audio
from voice.centroids import unit_or_none

FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class IdentifySettings:
    auto: float = 0.62
    """Cosine similarity at or above which a voice takes the person's name."""
    suggest: float = 0.44
    """...and from which up to `auto` the name is suggested."""
    min_heard_s: float = 2.0
    """Seconds a voice must have spoken before it is scored."""
    verify: float | None = None
    """A named voice's turn keeps the name only when the turn's own print scores at least this
    against the person (`turn_matches`); None: every turn of a named voice is named."""
    claim: float | None = None
    """A checked turn that reads no name of its own voice (the voice unnamed, or the turn not
    matching its person) takes the name of a person named for another voice of the stream when
    its print scores at least this against them, the best such person (`turn_person`); None:
    never. Only with `verify` set."""
    claim_new: float | None = None
    """A checked turn that reads no name of its own voice and claims nobody named in the stream
    takes the name of a remembered person named for no voice of the stream (`absent`) when its
    print scores at least this against them, the best such person (`turn_person`): a person
    whose voice the stage has not told apart yet, or gave to another person's voice. None:
    never. Only with `verify` set."""

    def __post_init__(self) -> None:
        if not (-1.0 <= self.suggest <= self.auto <= 1.0):
            raise ValueError(f"need -1 <= suggest <= auto <= 1, got {self.suggest}, {self.auto}")
        if self.min_heard_s < 0:
            raise ValueError("min_heard_s must be >= 0")
        if self.verify is not None and not -1.0 <= self.verify <= 1.0:
            raise ValueError(f"need -1 <= verify <= 1, got {self.verify}")
        if self.claim is not None and not -1.0 <= self.claim <= 2.0:
            raise ValueError(f"need -1 <= claim <= 2 (2: never), got {self.claim}")
        if self.claim_new is not None and not -1.0 <= self.claim_new <= 2.0:
            raise ValueError(f"need -1 <= claim_new <= 2 (2: never), got {self.claim_new}")


TURN_MIN_S = 0.5
"""A turn shorter than this is not printed (too little audio for a print; the embedding model's
own floor): a checked turn this short reads its voice's letter (`turn_person` of no print). Such
turns come mostly at changes of speaker, where the stage's voices mix: the folds' cost fell in
every fold when they read the letter rather than the name, and rose with a floor of 1 s
(docs/benchmarks.md, "A turn too short to check")."""
TURN_MAX_S = 10.0
"""A longer turn is printed from its middle this long (`turn_span`): the print's cost grows
with the audio, about 13 ms of CPU per second of it (docs/voices.md)."""


def turn_span(start: float, end: float) -> tuple[float, float]:
    """The part of a turn (`start`…`end`, seconds) its print is made of: all of it, or its
    middle `TURN_MAX_S` seconds."""
    if end - start <= TURN_MAX_S:
        return start, end
    middle = (start + end) / 2
    return middle - TURN_MAX_S / 2, middle + TURN_MAX_S / 2


TURN_PART_S = 3.0
"""A turn at least twice this long is also printed in parts this long (`turn_parts`; a last
part under half this joins the one before) and must match its person on every part as well as
whole (`turn_matches`): a turn that holds two people, more of the named one, matches as a whole
but not on the other person's part. 3 s is what the folds preferred over 2 and 4 s
(docs/benchmarks.md, "A turn checked in parts")."""


@dataclass(frozen=True)
class TurnPrint:
    """A turn's prints (unit vectors): of the whole turn, and of its parts when it is long enough
    (`turn_parts`; none otherwise)."""

    whole: FloatArray
    parts: tuple[FloatArray, ...] = ()


def turn_parts(audio: FloatArray, rate: int) -> list[FloatArray]:
    """A turn's audio (what its print is made of) in parts of `TURN_PART_S` (module docstring);
    none under twice that."""
    size = round(TURN_PART_S * rate)
    return [] if len(audio) < 2 * size else split_audio(audio, size, size / 2)


def print_turn(
    audio: FloatArray, rate: int, voiceprint: Callable[[FloatArray], FloatArray]
) -> TurnPrint | None:
    """`audio` (a turn's, `turn_span` or `turn_clip` applied) printed whole and in parts with
    `voiceprint` (a stage's `turn_voiceprint`); None under `TURN_MIN_S` or when the model finds
    too little in it (ValueError)."""
    if len(audio) < TURN_MIN_S * rate:
        return None
    try:
        whole = np.asarray(voiceprint(audio), dtype=np.float32)
        parts = tuple(np.asarray(voiceprint(p), dtype=np.float32) for p in turn_parts(audio, rate))
    except ValueError:
        return None
    return TurnPrint(whole, parts)


TURN_GAP_S = 0.5
"""Where no words say where turns are (`stretch_turns`): a label's stretches, nobody else's
between them, each starting at most this long after the one before ended, are one turn."""


def stretch_turns(stretches: Sequence[tuple[str, float, float]]) -> list[list[int]]:
    """`stretches` (label, start s, end s) grouped in turns (`TURN_GAP_S`): per turn, the indices
    of its stretches, turns and stretches in time order (start, then end)."""
    order = sorted(range(len(stretches)), key=lambda k: (stretches[k][1], stretches[k][2]))
    turns: list[list[int]] = []
    for k in order:
        label, start, _ = stretches[k]
        last = turns[-1] if turns else None
        if (last is not None and stretches[last[0]][0] == label
                and start - max(stretches[j][2] for j in last) <= TURN_GAP_S):
            last.append(k)
        else:
            turns.append([k])
    return turns


def turn_clip(audio: FloatArray, spans: Sequence[tuple[float, float]], rate: int) -> FloatArray:
    """The audio a turn of several stretches (`spans`, seconds, in time order) is printed from:
    each stretch's audio within `turn_span` of the whole turn, joined."""
    lo, hi = turn_span(spans[0][0], max(b for _, b in spans))
    pieces = [audio[round(max(a, lo) * rate) : round(min(b, hi) * rate)]
              for a, b in spans if min(b, hi) > max(a, lo)]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)


@dataclass(frozen=True)
class KnownVoice:
    """A remembered person's prints of one model (rows: unit vectors)."""

    id: str
    name: str
    prints: FloatArray


@dataclass(frozen=True)
class Identified:
    label: str
    voice_id: str
    name: str
    score: float
    tier: Literal["auto", "suggest"]


def scores(voices: Mapping[str, FloatArray], known: Sequence[KnownVoice]) -> FloatArray:
    """(labels × people) best cosine similarity of each voice with each person's prints."""
    out = np.full((len(voices), len(known)), -1.0, dtype=np.float32)
    if not voices or not known:
        return out
    stack = np.stack([np.asarray(v, dtype=np.float32) for v in voices.values()])
    for j, person in enumerate(known):
        if person.prints.size:
            out[:, j] = (stack @ person.prints.T).max(axis=1)
    return out


def known_voices(voices: Sequence[RememberedVoice], model: str) -> list[KnownVoice]:
    """The directory's people with prints of `model`, each as a `KnownVoice` of those prints
    only (unit rows): a person whose prints all come from another model is not in it."""
    out: list[KnownVoice] = []
    for voice in voices:
        rows = [unit_or_none(p.values) for p in voice.prints_of(model)]
        kept = [row for row in rows if row is not None]
        if kept:
            out.append(KnownVoice(voice.id, voice.name, np.stack(kept).astype(np.float32)))
    return out


@dataclass
class StreamVoices:
    """One stream's names from the directory: which voice took which person (kept), which
    suggestions were made (each once)."""

    named: dict[str, Identified] = field(default_factory=dict)
    """label → the person it was named (tier auto)."""
    suggested: dict[str, str] = field(default_factory=dict)
    """label → the person last suggested for it (a suggestion is made once per pair)."""
    forgotten: dict[str, str] = field(default_factory=dict)
    """label → the name it carried before its person was forgotten (read as a letter again)."""
    claimed: dict[str, str] = field(default_factory=dict)
    """label → the name its last turn claimed (`turn_person`), for the server's next turn of it
    to read its own name or letter again."""

    def update(
        self,
        voices: Mapping[str, FloatArray],
        speech_s: Mapping[str, float],
        known: Sequence[KnownVoice],
        settings: IdentifySettings,
    ) -> list[Identified]:
        """Score the voices not named yet against the people not taken yet; what changed: new
        names (tier auto) and new suggestions (tier suggest)."""
        taken = {i.voice_id for i in self.named.values()}
        labels = [
            label
            for label in voices
            if label not in self.named and speech_s.get(label, 0.0) >= settings.min_heard_s
        ]
        people = [p for p in known if p.id not in taken]
        if not labels or not people:
            return []
        table = scores({label: voices[label] for label in labels}, people)
        from scipy.optimize import linear_sum_assignment

        rows, cols = linear_sum_assignment(-table)
        changed: list[Identified] = []
        for r, c in zip(rows, cols, strict=True):
            score = float(table[r, c])
            label, person = labels[r], people[c]
            if score >= settings.auto:
                found = Identified(label, person.id, person.name, score, "auto")
                self.named[label] = found
                self.suggested.pop(label, None)
                self.forgotten.pop(label, None)
                changed.append(found)
            elif score >= settings.suggest and self.suggested.get(label) != person.id:
                self.suggested[label] = person.id
                changed.append(Identified(label, person.id, person.name, score, "suggest"))
        return changed

    def name_of(self, label: str) -> str | None:
        found = self.named.get(label)
        return found.name if found is not None else None

    def take(self, label: str, voice_id: str, name: str) -> None:
        """The voice of `label` is `voice_id` (remembered from this stream): named, and the
        person taken for no other voice of it."""
        for other, found in list(self.named.items()):
            if found.voice_id == voice_id and other != label:
                del self.named[other]
        self.named[label] = Identified(label, voice_id, name, 1.0, "auto")
        self.suggested.pop(label, None)

    def forget(self, voice_id: str) -> list[str]:
        """The person is gone: the labels it named read as letters again (their former names
        kept in `forgotten` so the next turn can be turned back); those labels."""
        gone = [label for label, found in self.named.items() if found.voice_id == voice_id]
        for label in gone:
            self.forgotten[label] = self.named.pop(label).name
        for label in [k for k, v in self.suggested.items() if v == voice_id]:
            del self.suggested[label]
        return gone


def turn_scores(turn: TurnPrint, people: Sequence[KnownVoice]) -> FloatArray:
    """Per person, the turn's score: the lowest of its prints' (whole and each part) scores
    against the person's prints (`scores`; -1 for a person without prints). A turn sounds like
    a person only as much as its least-like part does."""
    prints = {str(k): p for k, p in enumerate((turn.whole, *turn.parts))}
    out: FloatArray = scores(prints, people).min(axis=0)
    return out


def turn_matches(turn: TurnPrint, person: KnownVoice, settings: IdentifySettings) -> bool:
    """Whether a named voice's turn sounds like the person the voice is named after (module
    docstring): the turn's score against the person (`turn_scores`: whole and every part) at
    least `settings.verify` (always, with `verify` None)."""
    if settings.verify is None:
        return True
    if not person.prints.size:
        return False
    return float(turn_scores(turn, [person])[0]) >= settings.verify


def best_of(turn: TurnPrint, people: Sequence[KnownVoice]) -> tuple[float, KnownVoice | None]:
    """The person a turn matches best (`turn_scores`), and the score (-1, None: nobody with
    prints)."""
    printed = [person for person in people if person.prints.size]
    if not printed:
        return -1.0, None
    row = turn_scores(turn, printed)
    best = int(row.argmax())
    if row[best] <= -1.0:
        return -1.0, None
    return float(row[best]), printed[best]


def claimable(
    label: str,
    named: Mapping[str, str],
    suggested: Collection[str],
    people: Mapping[str, KnownVoice],
) -> tuple[list[KnownVoice], list[KnownVoice]]:
    """Whom a turn of `label` may claim (`turn_person`'s `present` and `absent`), from whom the
    stream's voices are named after (`named`: label → person id) and suggested as (`suggested`:
    person ids), among `people` (person id → person, one model's prints): the people named for
    its other voices, and the people named for no voice and suggested for none (a voice in the
    suggest tier keeps its letter until someone confirms, and no turn reads the name it is only
    suggested). The one home of this rule for the server, batch and the bench."""
    present = [people[v] for other, v in named.items() if other != label and v in people]
    taken = set(named.values()) | set(suggested)
    return present, [p for v, p in people.items() if v not in taken]


def worth_checking(
    own: KnownVoice | None,
    present: Sequence[KnownVoice],
    settings: IdentifySettings,
    absent: Sequence[KnownVoice] = (),
) -> bool:
    """Whether a turn is printed and checked at all (module docstring): `verify` is set, and its
    voice is named after a person (`own`), or someone could be claimed: with `claim` set, a
    person named for another voice of the stream (`present`), with `claim_new` set, a
    remembered person named for none (`absent`). Otherwise it reads its voice's name or letter
    as it is. The one guard of the server's, batch's and the bench's checks."""
    if settings.verify is None:
        return False
    return (
        own is not None
        or (settings.claim is not None and bool(present))
        or (settings.claim_new is not None and bool(absent))
    )


def turn_person(
    turn: TurnPrint | None,
    own: KnownVoice | None,
    present: Sequence[KnownVoice],
    settings: IdentifySettings,
    absent: Sequence[KnownVoice] = (),
) -> KnownVoice | None:
    """Whom a checked turn reads as (module docstring): the person its voice is named after
    (`own`) when the turn matches them (`turn_matches`); otherwise, with `claim` set, the person
    named for another voice of the stream (`present`) it matches best, at or above `claim`,
    or, with `claim_new` set, the remembered person named for no voice of the stream (`absent`)
    it matches best, at or above `claim_new` (of the two, the higher score); otherwise nobody
    (the voice's letter). A turn with no print (`print_turn`: too short) matches nobody."""
    if turn is None:
        return None
    if own is not None and turn_matches(turn, own, settings):
        return own
    others = [p for p in present if own is None or p.id != own.id]
    taken = {p.id for p in others} | ({own.id} if own is not None else set())
    claims: list[tuple[float, KnownVoice]] = []
    for threshold, people in (
        (settings.claim, others),
        (settings.claim_new, [p for p in absent if p.id not in taken]),
    ):
        if threshold is not None:
            score, person = best_of(turn, people)
            if person is not None and score >= threshold:
                claims.append((score, person))
    return max(claims, key=lambda c: c[0])[1] if claims else None


def identify_once(
    voices: Mapping[str, FloatArray],
    speech_s: Mapping[str, float],
    known: Sequence[KnownVoice],
    settings: IdentifySettings,
) -> list[Identified]:
    """A whole recording's voices named at once (module docstring): the names (tier auto) and
    the suggestions (tier suggest), each voice at most once, each person at most once."""
    return StreamVoices().update(voices, speech_s, known, settings)


__all__ = [
    "TURN_GAP_S",
    "TURN_MAX_S",
    "TURN_MIN_S",
    "TURN_PART_S",
    "Identified",
    "IdentifySettings",
    "KnownVoice",
    "StreamVoices",
    "TurnPrint",
    "best_of",
    "claimable",
    "identify_once",
    "known_voices",
    "print_turn",
    "scores",
    "stretch_turns",
    "turn_clip",
    "turn_matches",
    "turn_parts",
    "turn_person",
    "turn_scores",
    "turn_span",
    "worth_checking",
]
