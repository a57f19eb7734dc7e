"""Names suggested from introductions: "Hi, I'm Ian", "this is Peggy from finance", "Ian here".

A pure rule over one turn's words, no network and no model. What it finds is only ever a
*suggestion* for the speaker's label ("Speaker B — maybe Ian?"): a spoken name never renames
anyone by itself (nobody may speak their way into a name, spec attribution D4); a person confirms it.

The rules, each anchored where an introduction starts (the turn's opening, after a greeting, or
a clause's start) and each taking a capitalised name that is not a common word:

- ``I'm NAME`` / ``I am NAME`` (``Hi everyone, I'm Ian``, ``and I'm Ian Smith``);
- ``my name is NAME`` / ``my name's NAME`` / ``call me NAME``;
- ``this is NAME`` at the turn's opening (``Hello, this is Peggy from finance``), not when the
  next words speak of that person (``this is Peggy, she runs finance``: someone else introduced);
- ``NAME here`` / ``it's NAME here`` at the turn's opening (``Ian here.``, ``Peggy here from finance``).

False friends (``I'm sure``, ``I'm happy to``, ``this is Monday``, ``nobody here``) are refused
because the word is lower-case mid-sentence, or is a common word in `_NOT_NAMES` (which also
holds the words an STT capitalises at a sentence's start or by habit: days, months, nationalities).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["name_from_introduction"]

# Words that read like a name at a sentence's start, or that an STT capitalises, but are not one.
_NOT_NAMES: Final = frozenset(
    """
    a about actually afraid after again ahead all almost alone already also always am an and
    another any anyone anybody anything are around as at available away back bad be because been
    before behind being best better between both busy but by calling can cannot certain checking
    click come coming confused could curious definitely did do does doing done down each easy
    either else even ever every everybody everyone everything excited exactly fine finally first
    for free from full getting give glad going gone good great guessing had happy hard has have
    having he her here hers him his hoping how i if in interested into is it its joining just
    kind kidding late leaving let like listening literally look looking lost mainly maybe me might
    mine more most much must my myself need new next nice no nobody none not nothing now of off
    ok okay on one only or other our out over pretty probably quite ready real really right
    same saying see she should sign so some somebody someone something sorry speaking standing
    start still stop sure surprised taking talking thankful thanks that the their them then there
    these they thinking this those though through to today told tomorrow too totally trying two
    um uh under up us very waiting want was we well were what when where which while who why will
    with working worried would yeah yes yet you your yours
    monday tuesday wednesday thursday friday saturday sunday
    january february march april june july august september october november december
    american australian british canadian chinese dutch english european french german indian
    irish italian japanese korean mexican polish russian scottish spanish swedish welsh
    hi hello hey morning afternoon evening folks guys team
    """.split()
)

# Words that may open a turn before an introduction: greetings, fillers, the audience.
_OPENERS: Final = (
    r"(?:hi|hello|hey|hiya|good\s+(?:morning|afternoon|evening)|morning|afternoon|evening|"
    r"yeah|yes|okay|ok|so|um|uh|oh|well|and|everyone|everybody|all|folks|guys|team|there)"
)
_APOSTROPHE: Final = r"['’]"
# One word of a name: a letter, then letters, apostrophes or hyphens (O'Brien, Jean-Luc).
_WORD: Final = r"[^\W\d_][^\W\d_'’\-]*(?:['’\-][^\W\d_]+)*"
# A name of one or two words, never cut inside a word.
_NAME: Final = rf"(?P<name>{_WORD}(?:\s+{_WORD})?)(?![^\W\d_'’\-])"
# Where an introduction may begin: the turn's start, or after an opener or a punctuation mark.
_ANYWHERE: Final = rf"(?:^|[.,!?;:—–-]\s*|\b{_OPENERS}[,!]?\s+)"
_OPENING: Final = rf"^\s*(?:{_OPENERS}[,!.]?\s+)*"

_RULES: Final = (
    re.compile(rf"{_ANYWHERE}(?:i{_APOSTROPHE}m|i\s+am)\s+{_NAME}", re.IGNORECASE),
    re.compile(rf"\b(?:my\s+name\s+is|my\s+name{_APOSTROPHE}s|call\s+me)\s+{_NAME}", re.IGNORECASE),
    re.compile(
        rf"{_OPENING}this\s+is\s+{_NAME}(?![^.!?]*\b(?:she|he|her|his|who|whom|whose)\b)",
        re.IGNORECASE,
    ),
    re.compile(
        rf"{_OPENING}(?:it{_APOSTROPHE}s\s+)?{_NAME}\s+here\b(?=\s*(?:$|[.,!?;:—–-]|from\b|with\b|"
        rf"in\b|at\b|on\b|and\b))",
        re.IGNORECASE,
    ),
)


# Contractions and possessives ("We're", "It's", "Everyone's", "Don't") are never a name.
_CLITIC: Final = re.compile(r"['’](?:s|re|ll|ve|d|m|t)$", re.IGNORECASE)


def _is_name_word(word: str) -> bool:
    """A capitalised word with a lower-case letter (not an acronym) that is not a common word."""
    return (
        word[0].isupper()
        and any(ch.islower() for ch in word)
        and _CLITIC.search(word) is None
        and word.casefold() not in _NOT_NAMES
    )


def _name(candidate: str) -> str | None:
    words = candidate.split()
    if not words or not _is_name_word(words[0]):
        return None
    if len(words) > 1 and _is_name_word(words[1]):
        return f"{words[0]} {words[1]}"
    return words[0]


def name_from_introduction(text: str) -> str | None:
    """The name a speaker gives for themselves in `text`, or None (then no suggestion is made).

    The first rule that matches with a real name wins; a rule whose word is a false friend
    ("I'm sure") lets the next rule try.
    """
    for rule in _RULES:
        for match in rule.finditer(text):
            name = _name(match.group("name"))
            if name is not None:
                return name
    return None
