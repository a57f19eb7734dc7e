"""Words with speakers → runs of one speaker: the one rule a turn's words follow (V3, V5).

Why a module of its own: the STT path (Deepgram's per-word speaker labels, rule V3) and the
pipeline path (the diarization stage's timeline, rule V5) must split words the same way: a turn is
a run of consecutive words by one speaker, never a majority vote over an utterance. Both paths
hand this module a list of `Word`s and get `SpeakerTurn`s back. *When* a run is over (the end of
speech, an interim voice change, a decided handover) is the turn assembler's to decide
(`voice.assembler`), which cuts its runs here.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from voice.diarization_stage import SpeakerTimeline


@dataclass(frozen=True)
class Word:
    """One recognised word. Times are seconds from the start of the voice session."""

    text: str
    start: float
    end: float
    confidence: float = 1.0
    speaker: str | None = None
    """The session's speaker label (`Speaker A` …), or None when nobody labelled it."""

    def shifted(self, offset: float) -> Word:
        return replace(self, start=self.start + offset, end=self.end + offset)


@dataclass(frozen=True)
class SpeakerTurn:
    """A run of consecutive words by one speaker (rules V3, V5)."""

    speaker: str | None
    words: tuple[Word, ...]

    @property
    def text(self) -> str:
        return join_words(w.text for w in self.words)

    @property
    def start(self) -> float:
        return self.words[0].start

    @property
    def end(self) -> float:
        return self.words[-1].end


def join_words(words: Iterable[str]) -> str:
    """Join word tokens with single spaces (Whisper tokens may carry their own leading space)."""
    return " ".join(w.strip() for w in words if w.strip())


def speaker_runs(words: Sequence[Word]) -> list[SpeakerTurn]:
    """Split words into runs of consecutive words with the same speaker (rule V3)."""
    return [
        SpeakerTurn(speaker, tuple(group))
        for speaker, group in itertools.groupby(words, key=lambda w: w.speaker)
    ]


MIN_WORD_EVIDENCE = 0.02
"""Seconds: a word shorter than this (Whisper gives some words no duration) carries no evidence
of its own about who spoke it."""


def assign_speakers(words: Sequence[Word], timeline: SpeakerTimeline) -> list[Word]:
    """Each word takes the speaker the stage heard longest over it (rule V5).

    A word with no duration takes the speaker of the word it touches (the next one first: such a
    word is usually the clipped onset of the word after it); a word nobody overlaps takes the
    previous word's speaker (or the next one's, at the start)."""
    out = [
        replace(w, speaker=timeline.speaker_over(w.start, w.end))
        if w.end - w.start >= MIN_WORD_EVIDENCE
        else replace(w, speaker=None)
        for w in words
    ]
    for i, w in enumerate(out):
        if w.end - w.start >= MIN_WORD_EVIDENCE:
            continue
        after = out[i + 1] if i + 1 < len(out) else None
        before = out[i - 1] if i > 0 else None
        if after is not None and after.speaker and after.start - w.end <= 0.1:
            out[i] = replace(w, speaker=after.speaker)
        elif before is not None and before.speaker and w.start - before.end <= 0.1:
            out[i] = replace(w, speaker=before.speaker)
        else:
            out[i] = replace(w, speaker=timeline.speaker_over(w.start, w.end))
    last: str | None = None
    for i, w in enumerate(out):
        if w.speaker is None and last is not None:
            out[i] = replace(w, speaker=last)
        last = out[i].speaker
    following: str | None = None
    for i in range(len(out) - 1, -1, -1):
        if out[i].speaker is None and following is not None:
            out[i] = replace(out[i], speaker=following)
        following = out[i].speaker
    return out


def letter_label(index: int) -> str:
    """0 → `Speaker A`, 25 → `Speaker Z`, 26 → `Speaker AA` … (the one speaker-letter namer:
    STT labels, the embedded, live and pyannote stages all name speakers here)."""
    if index < 0:
        raise ValueError(f"speaker index must be >= 0, got {index}")
    letters = string.ascii_uppercase
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        name = letters[rem] + name
    return f"Speaker {name}"


@dataclass
class SpeakerLetters:
    """Session labels in order of first appearance (rule V3): raw key → `Speaker A`, `Speaker B` …

    A raw key is whatever identifies a voice on one STT connection, e.g. `(generation, 0)`.
    """

    labels: dict[object, str] = field(default_factory=dict)
    count: int = 0

    def get(self, key: object) -> str | None:
        return self.labels.get(key)

    def bind(self, key: object, label: str) -> str:
        self.labels[key] = label
        return label

    def new_label(self) -> str:
        label = letter_label(self.count)
        self.count += 1
        return label

    def label(self, key: object) -> str:
        existing = self.labels.get(key)
        if existing is not None:
            return existing
        return self.bind(key, self.new_label())
