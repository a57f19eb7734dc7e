"""The voice directory's storage (issue 27): named voiceprints the server remembers across rooms.

Owns what is kept about a remembered voice and the interface every store implements for it. A
voiceprint is biometric data, so what is kept is the least that identification needs: a person's
id and name, when they were remembered and last heard, and each print's vector (float32 bytes)
with the id of the embedding model that made it (prints of two models are never compared: a
reader asks for one model's prints), where it came from (`clip` or `room:<id>`) and when. No
audio is kept. Forgetting a voice deletes the person and every print in one statement or
transaction; nothing of it stays in the store.

Every process reading the directory learns of another's changes through the directory's
generation (`VoiceStore.voices_generation`): a number every remember and forget moves, in the
same transaction as the change, so a reader checks one small row instead of reading every print
(`server.voices.VoiceDirectory` reloads when it moved). `voices_changed` waits for a change: a
store that is told of one (Postgres `LISTEN`) returns at once, the others when the interval is
up (a poll).

Here, not in `voice` or `server`, because the directory lives in the server's store beside the
rooms (SQLite by default, Postgres when several processes share rooms, memory for tests):
`InMemoryStore`, `SQLiteStore` and `PostgresStore` implement `VoiceStore` too. A name is one
person: adding a print under a name already known adds it to that person.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

MAX_PRINTS_PER_VOICE = 20
"""Prints a person keeps (one per meeting or clip); adding one more drops the oldest."""
MAX_NAME_LENGTH = 80


def pack_vector(values: Sequence[float]) -> bytes:
    """A voiceprint as little-endian float32 bytes (what the stores keep)."""
    if not values:
        raise ValueError("a voiceprint has at least one dimension")
    return struct.pack(f"<{len(values)}f", *values)


def unpack_vector(data: bytes) -> tuple[float, ...]:
    if not data or len(data) % 4:
        raise ValueError(f"a voiceprint is float32 bytes, got {len(data)} bytes")
    return struct.unpack(f"<{len(data) // 4}f", data)


def checked_name(name: str) -> str:
    """A person's name as kept (trimmed); empty or over `MAX_NAME_LENGTH` is a ValueError."""
    cleaned = " ".join(name.split())
    if not cleaned:
        raise ValueError("a remembered voice needs a name")
    if len(cleaned) > MAX_NAME_LENGTH:
        raise ValueError(f"a name is at most {MAX_NAME_LENGTH} characters")
    return cleaned


@dataclass(frozen=True)
class Voiceprint:
    """One print of a person: `vector` (float32 bytes) from embedding model `model`."""

    id: str
    voice_id: str
    model: str
    vector: bytes = field(repr=False)
    source: str
    created: float

    @property
    def values(self) -> tuple[float, ...]:
        return unpack_vector(self.vector)


@dataclass(frozen=True)
class RememberedVoice:
    """A person of the directory and their prints (oldest first)."""

    id: str
    name: str
    created: float
    last_heard: float | None = None
    prints: tuple[Voiceprint, ...] = ()

    def prints_of(self, model: str) -> tuple[Voiceprint, ...]:
        """Only the prints model `model` made (the only ones its embeddings may be compared to)."""
        return tuple(p for p in self.prints if p.model == model)


def new_voice_id() -> str:
    return f"voice-{uuid.uuid4().hex[:16]}"


def new_print(voice_id: str, model: str, vector: bytes, source: str) -> Voiceprint:
    if not model:
        raise ValueError("a voiceprint names the embedding model that made it")
    unpack_vector(vector)
    return Voiceprint(
        f"print-{uuid.uuid4().hex[:16]}", voice_id, model, vector, source, time.time()
    )


class VoiceStore(ABC):
    """Where remembered voices are kept (module docstring). Times are unix seconds."""

    @abstractmethod
    async def remember_print(
        self, name: str, model: str, vector: bytes, source: str
    ) -> RememberedVoice:
        """Add a print under `name` (the person is created when the name is new; past
        `MAX_PRINTS_PER_VOICE` the oldest print goes); the person as now kept."""

    @abstractmethod
    async def list_voices(self) -> list[RememberedVoice]:
        """Every remembered person with their prints, oldest first."""

    async def get_voice(self, voice_id: str) -> RememberedVoice | None:
        for voice in await self.list_voices():
            if voice.id == voice_id:
                return voice
        return None

    @abstractmethod
    async def forget_voice(self, voice_id: str) -> bool:
        """Delete the person and every print of theirs; False when there was none."""

    @abstractmethod
    async def voice_heard(self, voice_id: str, at: float) -> None:
        """The person was named in a room at `at` (the directory's `last_heard`)."""

    @abstractmethod
    async def voices_generation(self) -> int:
        """The directory's generation: moved by every remember and forget (by any process on
        the store), in the same transaction; not by `voice_heard`."""

    async def voices_changed(self, within_s: float) -> None:
        """Return when the directory may have changed, and after `within_s` at the latest. Here
        a poll (after `within_s`); a store told of changes returns as soon as it is told."""
        await asyncio.sleep(within_s)


class InMemoryVoices(VoiceStore):
    """`VoiceStore` in a dictionary (one process; gone at exit). Values are frozen dataclasses,
    so nothing handed out can change what is kept."""

    def __init__(self) -> None:
        self._voices: dict[str, RememberedVoice] = {}
        self._generation = 0

    async def remember_print(
        self, name: str, model: str, vector: bytes, source: str
    ) -> RememberedVoice:
        name = checked_name(name)
        voice = next((v for v in self._voices.values() if v.name == name), None)
        if voice is None:
            voice = RememberedVoice(new_voice_id(), name, time.time())
        prints = (*voice.prints, new_print(voice.id, model, vector, source))
        voice = replace(voice, prints=prints[-MAX_PRINTS_PER_VOICE:])
        self._voices[voice.id] = voice
        self._generation += 1
        return voice

    async def list_voices(self) -> list[RememberedVoice]:
        return sorted(self._voices.values(), key=lambda v: (v.created, v.id))

    async def forget_voice(self, voice_id: str) -> bool:
        gone = self._voices.pop(voice_id, None) is not None
        self._generation += gone
        return gone

    async def voices_generation(self) -> int:
        return self._generation

    async def voice_heard(self, voice_id: str, at: float) -> None:
        voice = self._voices.get(voice_id)
        if voice is not None:
            self._voices[voice_id] = replace(voice, last_heard=at)


def voices_from_rows(
    people: Sequence[tuple[str, str, float, float | None]],
    prints: Sequence[tuple[str, str, str, bytes, str, float]],
) -> list[RememberedVoice]:
    """People rows (id, name, created, last_heard) and print rows (id, voice_id, model, vector,
    source, created), as the SQL stores read them, into voices (oldest first)."""
    by_voice: dict[str, list[Voiceprint]] = {}
    for pid, vid, model, vector, source, created in prints:
        by_voice.setdefault(vid, []).append(
            Voiceprint(pid, vid, model, bytes(vector), source, float(created))
        )
    return [
        RememberedVoice(
            vid,
            name,
            float(created),
            None if heard is None else float(heard),
            tuple(sorted(by_voice.get(vid, []), key=lambda p: (p.created, p.id))),
        )
        for vid, name, created, heard in sorted(people, key=lambda r: (r[2], r[0]))
    ]


__all__ = [
    "MAX_PRINTS_PER_VOICE",
    "InMemoryVoices",
    "RememberedVoice",
    "VoiceStore",
    "Voiceprint",
    "checked_name",
    "new_print",
    "new_voice_id",
    "pack_vector",
    "unpack_vector",
    "voices_from_rows",
]
