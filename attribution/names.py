"""How a name is shown (rules C6, C7): one line, at most 64 characters, unable to forge a label.

Owns `shown_name` (the only form of a name the engine ranks, stores and prints) and the role-word
check. A name comes from whoever set it (a chat nickname, an STT label, a hook), so everything that
could end or fake a label becomes a space: colons and their look-alikes, double-quote marks,
brackets and parentheses (and their look-alikes), line breaks and other control characters, and a
leading `@` (and its look-alikes); apostrophes stay (`O'Brien`: a single quote cannot end a label
or open its JSON string); format characters (zero-width joiners, bidi overrides) are dropped so they
cannot make two names look different while reading the same. Runs of spaces collapse.

Hence no shown name starts with `@` (the nameless-sender form, C4), contains `(` (so it cannot
end in a rank `(2)`, D2), or contains `[` and `:` (so it cannot carry the note's mark, E2). Look-alike
sets come from Unicode data: character categories (`Ps`/`Pe`/`Pi`/`Pf`), NFKC, and the TR39
prototypes in `attribution.confusables`.
"""

from __future__ import annotations

import re
import unicodedata
from functools import cache

from attribution.confusables import reading_keys, skeleton

MAX_NAME_CHARS = 64
"""C6: a shown name has at most this many characters."""

ROLE_WORDS = ("Assistant", "User", "You", "System", "Developer")
"""C7: names that read like one of these (D1) are shown with ` (a participant)`.

`Assistant`, `User` and `You` are the spec's; `System` and `Developer` are the other role names
chat APIs use.
"""

PARTICIPANT_SUFFIX = " (a participant)"

# Characters that end or fake a label, by their prototype or compatibility form.
_FORGING_PROTOTYPES = frozenset(':"()[]{}<>')
_LINE_BREAKS = frozenset("\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029")
_SPACES = re.compile(r"\s+")


@cache
def _is_forging(ch: str) -> bool:
    """True for a character that could end or fake a label.

    Apostrophes (`'`, `’`, and whatever else reads as one) stay: a label is `Name: "line"`, and a
    single quote can neither end it nor open the JSON string, while names like `O'Brien` are
    common. Double-quote marks, colons, brackets and parentheses (and their look-alikes) go.
    """
    if ch in _LINE_BREAKS:
        return True
    category = unicodedata.category(ch)
    if category in ("Cc", "Zl", "Zp"):
        return True
    prototype = skeleton(ch)
    if prototype == "'":
        return False
    if category in ("Ps", "Pe", "Pi", "Pf"):
        return True
    forms = (unicodedata.normalize("NFKC", ch), prototype)
    return any("''" in form or not _FORGING_PROTOTYPES.isdisjoint(form) for form in forms)


@cache
def _is_at_sign(ch: str) -> bool:
    return "@" in unicodedata.normalize("NFKC", ch) or "@" in skeleton(ch)


def _is_dropped(ch: str) -> bool:
    """Format characters (Cf) and non-characters: invisible, so they are removed outright."""
    return unicodedata.category(ch) in ("Cf", "Cs", "Cn", "Co")


def shown_name(raw: str | None) -> str | None:
    """The name as the engine shows it (C6), or None when nothing readable is left.

    Characters that could end or fake a label become spaces, invisible format characters are
    dropped, whitespace runs collapse to one space, and the result is at most 64 characters.
    A leading `@` (or a look-alike: `＠`, `﹫`) is removed, repeatedly, so that no name reads as a
    channel address; an `@` inside a name (an e-mail address) stays.
    """
    if raw is None:
        return None
    out: list[str] = []
    for ch in unicodedata.normalize("NFC", raw):
        if _is_dropped(ch):
            continue
        out.append(" " if _is_forging(ch) else ch)
    text = _SPACES.sub(" ", "".join(out)).strip()
    while text and _is_at_sign(text[0]):
        text = text[1:].lstrip()
    if len(text) > MAX_NAME_CHARS:
        text = text[:MAX_NAME_CHARS].rstrip()
    return text or None


@cache
def _role_keys() -> frozenset[str]:
    keys: set[str] = set()
    for word in ROLE_WORDS:
        keys |= reading_keys(word)
    return frozenset(keys)


def is_role_word(name: str) -> bool:
    """C7: the name reads like a role word (`Assistant`, `User`, `You`, ...)."""
    return not reading_keys(name).isdisjoint(_role_keys())


def format_label(name: str, rank: int) -> str:
    """`Name` at rank 1, `Name (N)` at rank N >= 2; role words read `Name (a participant)`."""
    label = name if rank <= 1 else f"{name} ({rank})"
    if is_role_word(name):
        label += PARTICIPANT_SUFFIX
    return label
