"""The room's register of sources and ranks (rules D2–D7), and the labels it gives (C4, C6, C7).

Owns `Register`, `register_participant`, `commit_turn`, `label_for` and `rebuild_register`.

The register is one list of entries, one per (source, shown name) pair the room has seen, each with
the salted digests of the name's reading keys (D1) and the rank it took. Names that share a reading
key are in one look-alike group; groups are the connected components over shared keys (union-find
over name keys), so they only ever grow together and a newcomer whose name reads like two groups
joins them without renumbering anyone (D4). A new (source, name) takes the lowest rank not held by
another source in its group (D2); once given, a rank never changes (D3): entries are never removed
or rewritten. Two sources with the same shown name always share every key, so they never share a
rank, and since no shown name contains `(` (C6), no two sources render the same label.

D6: the register holds HMAC-SHA256 digests (keyed by the register's own random salt, truncated to
128 bits) of the source identity, of the shown name and of each reading key: no participant id and
no name in clear. It is plain pydantic data (JSON) so a store can persist it; the caller reads and
writes it under the room lock.

Why the author record (D3): `commit_turn` returns `{"name", "rank", "source", "seal"}`; rooms stores it as
`event.metadata["author"]`, so a turn reads as its speaker was named and ranked when it was committed,
however the window slides. `label_for` trusts a record only when its seal (a salted digest over the
event id and the record) verifies and the register holds the same (source, name, rank): a record
copied from another event or typed into metadata by a transport is ignored, and the turn is ranked
against the register when read, like a turn older than the register or one replaced by
`update_event`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from pydantic import BaseModel, Field

from attribution.confusables import reading_keys
from attribution.names import format_label, shown_name
from attribution.speakers import (
    Participants,
    Speaker,
    participant_list,
    participant_source,
    resolve_speaker,
)
from models import Participant, RoomEvent

AUTHOR_KEY = "author"
"""The event metadata key rooms stores `commit_turn`'s record under (D3)."""

SYSTEM_LABEL = ""
"""`label_for` of a runtime system event (kind == "system"): it has no speaker (A1)."""


class RegisterEntry(BaseModel):
    """One (source, shown name) pair and the rank it took. Digests only (D6)."""

    source: str
    name: str
    keys: list[str]
    rank: int = Field(ge=1)


class Register(BaseModel):
    """A room's register: its random salt and its entries, in the order they were added."""

    version: int = 1
    salt: str = Field(pattern=r"^[0-9a-f]{32,128}$")
    entries: list[RegisterEntry] = Field(default_factory=list)

    @classmethod
    def new(cls) -> Register:
        return cls(salt=secrets.token_hex(16))

    def digest(self, *parts: str) -> str:
        """The salted digest of a tuple of strings (HMAC-SHA256, 128 bits, hex)."""
        return _digest(self.salt, parts)


@lru_cache(maxsize=65536)
def _digest(salt: str, parts: tuple[str, ...]) -> str:
    """`Register.digest`, remembered: labelling a window verifies the seal of every turn in it on
    every call, and the same turns stay in the window call after call (issue 14.1). A pure
    function of the salt and the parts, so remembering it changes no answer."""
    message = json.dumps(list(parts), ensure_ascii=False).encode("utf-8")
    return hmac.new(bytes.fromhex(salt), message, hashlib.sha256).hexdigest()[:32]


@lru_cache(maxsize=16384)
def _shown(name: str) -> str | None:
    """`shown_name`, remembered (a pure function; checked for every turn of every window)."""
    return shown_name(name)


def _source_digest(register: Register, source: tuple[str, ...]) -> str:
    return register.digest("source", *source)


def _name_digest(register: Register, name: str) -> str:
    return register.digest("name", name)


def _key_digests(register: Register, name: str) -> set[str]:
    return {register.digest("key", key) for key in reading_keys(name)}


def _group(register: Register, keys: set[str]) -> list[RegisterEntry]:
    """Every entry connected to `keys` through shared reading keys (the name's look-alike group)."""
    reached = set(keys)
    group: list[RegisterEntry] = []
    remaining = list(register.entries)
    grew = True
    while grew:
        grew = False
        rest: list[RegisterEntry] = []
        for entry in remaining:
            if reached.isdisjoint(entry.keys):
                rest.append(entry)
            else:
                group.append(entry)
                reached.update(entry.keys)
                grew = True
        remaining = rest
    return group


def _find(register: Register, source: str, name: str) -> RegisterEntry | None:
    for entry in register.entries:
        if entry.source == source and entry.name == name:
            return entry
    return None


def _lowest_free_rank(register: Register, source: str, keys: set[str]) -> int:
    taken = {e.rank for e in _group(register, keys) if e.source != source}
    rank = 1
    while rank in taken:
        rank += 1
    return rank


def _rank(register: Register, source: tuple[str, ...], name: str, *, add: bool) -> int:
    """The rank of (source, name): its entry's, or the lowest free one (added when `add`)."""
    source_d = _source_digest(register, source)
    name_d = _name_digest(register, name)
    entry = _find(register, source_d, name_d)
    if entry is not None:
        return entry.rank
    keys = _key_digests(register, name)
    rank = _lowest_free_rank(register, source_d, keys)
    if add:
        register.entries.append(
            RegisterEntry(source=source_d, name=name_d, keys=sorted(keys), rank=rank)
        )
    return rank


def register_participant(register: Register, participant: Participant) -> None:
    """D2: enter a participant (by id) under their shown name; no-op without a readable name.

    `ensure_participant` calls this: a participant registered before any look-alike spoke keeps
    the plain name. Calling it again (same name) changes nothing; a new display name is a new
    entry in its own group (earlier turns keep the name they were committed with, D3).
    """
    name = shown_name(participant.display_name)
    if name is not None:
        _rank(register, participant_source(participant), name, add=True)


def commit_turn(register: Register, event: RoomEvent, participants: Participants) -> dict[str, Any]:
    """D3/D5: rank the turn's source (adding it to the register) and return its author record.

    Called under the room lock for every committed turn, whatever its visibility (D5), and never
    for a blocked turn. Returns `{}` for runtime system events (kind == "system"), which have no
    speaker. Every other turn, agents' turns included, gets a record:
    `{"name": shown name or None, "rank": int or None, "source": salted digest}`
    (name and rank are None for a nameless sender, labelled `@channel_id`, which takes no rank).
    An agent's own turns are recorded like any other; they render as `assistant` for that agent
    (C3) and, when nameless, as `@channel_id` for others (C4), so they never take a rank.
    """
    if event.kind == "system":
        return {}
    speaker = resolve_speaker(event, participants)
    source_d = _source_digest(register, speaker.source)
    if speaker.name is None:
        rank: int | None = None
    else:
        rank = _rank(register, speaker.source, speaker.name, add=True)
    return {
        "name": speaker.name,
        "rank": rank,
        "source": source_d,
        "seal": _seal(register, event, source_d, speaker.name, rank),
    }


def _seal(
    register: Register, event: RoomEvent, source: str, name: str | None, rank: int | None
) -> str:
    return register.digest("seal", event.id, source, name or "", str(rank))


def _trusted_record(event: RoomEvent, register: Register) -> tuple[str | None, int] | None:
    """The (name, rank) of the event's author record when the register vouches for it."""
    record = event.metadata.get(AUTHOR_KEY)
    if not isinstance(record, dict):
        return None
    source = record.get("source")
    name = record.get("name")
    rank = record.get("rank")
    if not isinstance(source, str) or not (name is None or isinstance(name, str)):
        return None
    if not (rank is None or isinstance(rank, int)):
        return None
    if record.get("seal") != _seal(register, event, source, name, rank):
        return None
    if name is None:
        return (None, 0)
    if rank is None or _shown(name) != name:
        return None
    entry = _find(register, source, _name_digest(register, name))
    if entry is None or entry.rank != rank:
        return None
    return (name, rank)


def nameless_label(channel_id: str) -> str:
    """C4: a sender with no name reads as its channel, `@channel_id`."""
    return f"@{channel_id}"


def speaker_label(speaker: Speaker, register: Register) -> str:
    """The label of a resolved speaker, ranked against the register as it is now (read only)."""
    if speaker.name is None:
        return nameless_label(speaker.channel_id)
    return format_label(speaker.name, _rank(register, speaker.source, speaker.name, add=False))


def label_for(event: RoomEvent, participants: Participants, register: Register) -> str:
    """The label of a turn: `Alice`, `Alice (2)`, `@sms1`, `Assistant (a participant)`.

    Uses the turn's author record when the register vouches for it (D3); otherwise resolves the
    speaker (B1–B3) and ranks them against the register without changing it. Runtime system events
    have no label (`""`).
    """
    if event.kind == "system":
        return SYSTEM_LABEL
    record = _trusted_record(event, register)
    if record is not None:
        name, rank = record
        if name is None:
            return nameless_label(event.source.channel_id)
        return format_label(name, rank)
    return speaker_label(resolve_speaker(event, participants), register)


def rebuild_register(
    timeline: Iterable[RoomEvent],
    participants: Participants,
    register: Register | None = None,
) -> Register:
    """D7: rebuild a register for a room from before the register, from its timeline.

    Registered participants enter first (in the order given: the room registered them before the
    register existed, and an impostor must not win the plain name by having spoken first), then
    every committed turn in timeline order, exactly as `commit_turn` would have entered it. The
    events are not changed (F1); turns without an author record are ranked on read against the
    rebuilt register. Rooms calls this under the room lock when a room's register is missing and
    its timeline is not empty, before committing its next named turn.
    """
    register = register if register is not None else Register.new()
    people = participant_list(participants)
    for participant in people:
        register_participant(register, participant)
    for event in timeline:
        commit_turn(register, event, people)
    return register
