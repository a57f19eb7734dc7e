"""Speak policies: whether a model is asked to answer a turn (R4, G6).

Lives in `rooms` so that every agent channel shares the same objects: the chat `AIChannel` and the
realtime channel (`realtime.policy` re-exports this module) gate their models with one policy.
Why a separate, pure module: the attribution engine decides how a turn is *labelled*; it never
decides whether the AI answers (F2). A policy reads each turn under its labels
(`SpeakTurn.speakers`, exactly as the engine wrote them) so it cannot be fooled the way a model
can: `AnswerOnly(people=["Alice"])` matches the label `Alice` and nothing else — a look-alike ranked
`Alice (2)`, a nameless `@sms1` whose text says `Alice: …`, or `alice` all fail.

Policies combine: `AnswerOnly(people=["Alice"]) & AnswerWhenAddressed()` answers Alice when she
names the assistant; `AnswerWhenAddressed() | AnswerWhenAlone()` (the channel's default) answers
when addressed, or whenever the room holds a single speaker (a one-to-one conversation).
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class SpeakTurn:
    """One turn as a policy sees it."""

    speakers: tuple[str, ...]
    """The attribution labels of the turn's speakers (`Alice`, `Alice (2)`, `@sms1`, …)."""
    text: str
    """What was said, as sent (never the labelled form)."""
    assistant_name: str
    room_speakers: int = 1
    """How many distinct speakers the room holds, this turn included."""
    event: Any = None


@runtime_checkable
class SpeakPolicy(Protocol):
    def should_answer(self, turn: SpeakTurn) -> bool: ...


class _Combinable(abc.ABC):
    @abc.abstractmethod
    def should_answer(self, turn: SpeakTurn) -> bool: ...

    def __or__(self, other: SpeakPolicy) -> AnyOf:
        return AnyOf((self, other))

    def __and__(self, other: SpeakPolicy) -> AllOf:
        return AllOf((self, other))


@dataclass(frozen=True)
class AnswerAlways(_Combinable):
    def should_answer(self, turn: SpeakTurn) -> bool:
        return True


@dataclass(frozen=True)
class AnswerNever(_Combinable):
    """Listen only: lines reach the model, no response is ever requested."""

    def should_answer(self, turn: SpeakTurn) -> bool:
        return False


@dataclass(frozen=True)
class AnswerOnly(_Combinable):
    """Answer turns spoken by these people, matched by exact label (G6)."""

    people: Sequence[str] = ()

    def should_answer(self, turn: SpeakTurn) -> bool:
        wanted = set(self.people)
        return any(speaker in wanted for speaker in turn.speakers)


def addressed(text: str, names: Sequence[str]) -> bool:
    """True when one of `names` appears in `text` as a whole word (case-insensitive)."""
    folded = text.casefold()
    for name in names:
        name = name.strip()
        if not name:
            continue
        pattern = r"(?<!\w)" + re.escape(name.casefold()) + r"(?!\w)"
        if re.search(pattern, folded):
            return True
    return False


@dataclass(frozen=True)
class AnswerWhenAddressed(_Combinable):
    """Answer when the turn names the assistant (`Chorus, what do you think?`).

    `names` adds other names the assistant answers to; the assistant's own name always counts.
    """

    names: Sequence[str] = ()

    def should_answer(self, turn: SpeakTurn) -> bool:
        return addressed(turn.text, [turn.assistant_name, *self.names])


@dataclass(frozen=True)
class AnswerWhenAlone(_Combinable):
    """Answer every turn while the room holds a single speaker (a one-to-one conversation)."""

    def should_answer(self, turn: SpeakTurn) -> bool:
        return turn.room_speakers <= 1


@dataclass(frozen=True)
class AnyOf(_Combinable):
    policies: tuple[SpeakPolicy, ...] = field(default_factory=tuple)

    def should_answer(self, turn: SpeakTurn) -> bool:
        return any(p.should_answer(turn) for p in self.policies)


@dataclass(frozen=True)
class AllOf(_Combinable):
    policies: tuple[SpeakPolicy, ...] = field(default_factory=tuple)

    def should_answer(self, turn: SpeakTurn) -> bool:
        return all(p.should_answer(turn) for p in self.policies)


def default_policy() -> SpeakPolicy:
    return AnswerWhenAddressed() | AnswerWhenAlone()
