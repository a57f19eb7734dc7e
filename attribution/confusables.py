"""Look-alike names (rule D1): TR39-style skeletons from Unicode's confusables data.

Owns the answer to "do these two names read alike?". Two names read alike when they are equal
after Unicode case folding, after mapping confusable characters to their prototype (the Unicode
TR39 skeleton: NFD, then each character to its prototype, then NFD again), or after both. Every name
therefore has a few *reading forms* (`reading_keys`); two names that share a reading form read alike,
and the register joins such names transitively (union-find over these keys), so `Lan`, `Ian` and
`ian` form one group.

Why shaped so: the data must come from a maintained Unicode source, never a hand-written table.
It comes from the `confusable-homoglyphs` package, whose `confusables.json` is generated from
Unicode's `confusables.txt`. That file maps each *source* character to a *prototype* string, but
the package stores every line in both directions (`A -> [Ａ, А, ...]` and `А -> [A]`) and wraps
right-to-left characters in U+200E marks. The direction is rebuilt here:

- a key with two or more partners is a prototype (several sources map to it);
- a key whose only partner is a multi-character string, or a prototype with several partners, is a
  source mapping to that partner;
- two single characters that only name each other (about 2,000 such pairs) are one source and one
  prototype, and the data no longer says which: both end up in one class whichever way it is
  read, so the prototype is chosen deterministically (the one that occurs inside a multi-character
  prototype, else the lower code point), and prototypes are mapped again until stable so that the
  choice cannot split a class.

Case folding is Python's `str.casefold` (full Unicode case folding).
"""

from __future__ import annotations

import json
import unicodedata
from functools import cache, lru_cache
from importlib import resources

_BIDI_MARKS = str.maketrans("", "", "\u200e\u200f")


def _clean(text: str) -> str:
    return text.translate(_BIDI_MARKS)


@cache
def _prototypes() -> dict[str, str]:
    """Source character -> prototype string, rebuilt from the package's two-way table."""
    raw = resources.files("confusable_homoglyphs").joinpath("confusables.json").read_text("utf-8")
    table: dict[str, list[dict[str, str]]] = json.loads(raw)
    partners: dict[str, set[str]] = {}
    for key, entries in table.items():
        k = _clean(key)
        for entry in entries:
            partners.setdefault(k, set()).add(_clean(entry["c"]))
    inside_multi = {ch for k in partners if len(k) > 1 for ch in k}
    mapping: dict[str, str] = {}
    for key, others in partners.items():
        if len(key) != 1 or len(others) != 1:
            continue  # multi-character keys are prototypes; so are keys with several sources
        (other,) = others
        if other == key:
            continue
        if len(other) > 1 or len(partners.get(other, ())) > 1:
            mapping[key] = other
            continue
        # An ambiguous pair: pick the prototype deterministically.
        key_is_proto = (key in inside_multi, -ord(key)) > (other in inside_multi, -ord(other))
        if not key_is_proto:
            mapping[key] = other
    return mapping


@cache
def _char_skeleton(ch: str) -> str:
    """The prototype of one character, mapped again until stable (cycle-safe)."""
    mapping = _prototypes()
    seen = {ch}
    out = mapping.get(ch, ch)
    for _ in range(8):
        nxt = "".join(mapping.get(c, c) for c in out)
        if nxt == out or nxt in seen:
            break
        seen.add(out)
        out = nxt
    return out


def confusable_sources() -> frozenset[str]:
    """Every character the confusables data maps to a prototype other than itself."""
    return frozenset(_prototypes())


def skeleton(text: str) -> str:
    """The TR39 skeleton of `text`: NFD, each character to its prototype, NFD again."""
    nfd = unicodedata.normalize("NFD", text)
    return unicodedata.normalize("NFD", "".join(_char_skeleton(c) for c in nfd))


def _fold(text: str) -> str:
    return unicodedata.normalize("NFD", text.casefold())


@lru_cache(maxsize=16384)
def reading_keys(name: str) -> frozenset[str]:
    """The forms `name` reads as: case-folded, skeleton, and both in either order, to a fixpoint.

    Two names read alike (D1) when their reading keys intersect; the register closes that relation
    transitively.
    """
    keys = {_fold(name), skeleton(name)}
    # Alternate folding and skeleton until stable, starting from both sides.
    for start in (_fold(name), skeleton(name)):
        current = start
        for _ in range(6):
            nxt = _fold(skeleton(current))
            keys.add(skeleton(current))
            keys.add(nxt)
            if nxt == current:
                break
            current = nxt
    return frozenset(keys)


def reads_alike(a: str, b: str) -> bool:
    """True when `a` and `b` read alike directly (D1), without transitivity through other names."""
    return not reading_keys(a).isdisjoint(reading_keys(b))
