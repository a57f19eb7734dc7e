"""Where rooms keep what they hold: rooms, bindings, events, participants, the register and the
memories' own state.

`RoomStore` is the interface; `InMemoryStore` serves one process and tests, `rooms.sqlite.SQLiteStore`
is what `chorus serve` keeps by default, `rooms.postgres.PostgresStore` is shared by several
processes. A store shared by several processes must be paired with a distributed lock (see
`rooms.locks`), because the attribution register is read and written under the room lock (rule
D6). The register is stored as the JSON the attribution engine produces: salted digests only.

Why events are frozen (issue 14.1): a model's context is built on every trigger, so reading must
cost what the window costs, not what the room's history costs. Committed events are immutable
values: a store freezes an event once when it is written (`freeze_event`: a `StoredEvent`, whose
fields cannot be assigned and whose metadata, visibility and parts cannot be changed in place) and
then hands the same object to every reader, never a per-read copy. A caller that wants a changed
event makes one (`event.model_copy(update=...)`) and writes it back through `replace_event`.
Windows are served from an index: `list_window` returns the newest events a channel may see
(`visible_to` it or sent from it), `list_around` a turn's neighbours, each in time proportional to
what it returns, whatever the room's length.
"""

from __future__ import annotations

import bisect
import copy
import json
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict, Field

from models import CompositeContent, Content, Participant, RoomEvent
from models.extras import require
from rooms.locks import InProcessLocks, RoomLockManager
from rooms.voices import InMemoryVoices, VoiceStore


def _immutable(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("stored events are immutable: make a copy with model_copy(update=...)")


class FrozenDict(dict[str, Any]):
    """A dict that cannot be changed in place (a stored event's metadata). Copies are plain."""

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _immutable
    __ior__ = _immutable

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v, memo) for k, v in self.items()}

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


class FrozenList(list[Any]):
    """A list that cannot be changed in place (a stored event's visibility, parts). Copies are plain."""

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = clear = _immutable
    sort = reverse = __iadd__ = __imul__ = _immutable

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return [copy.deepcopy(v, memo) for v in self]

    def __reduce__(self) -> tuple[Any, ...]:
        return (list, (list(self),))


def freeze_value(value: Any) -> Any:
    """JSON-like data with every dict and list made immutable (recursively)."""
    if isinstance(value, dict):
        return value if isinstance(value, FrozenDict) else FrozenDict(
            {k: freeze_value(v) for k, v in value.items()}
        )
    if isinstance(value, list):
        return value if isinstance(value, FrozenList) else FrozenList(freeze_value(v) for v in value)
    return value


class StoredEvent(RoomEvent):
    """A committed event as a store hands it out: shared by every reader, changed by nobody.

    Equal to a `RoomEvent` with the same fields (either way round)."""

    model_config = ConfigDict(frozen=True)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RoomEvent):
            return NotImplemented
        return self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]


def _freeze_content(content: Content) -> Content:
    if isinstance(content, CompositeContent) and not isinstance(content.parts, FrozenList):
        return CompositeContent.model_construct(
            _fields_set=content.model_fields_set, type=content.type, parts=FrozenList(content.parts)
        )
    return content  # text and image content are frozen models of strings already


def freeze_event(event: RoomEvent) -> StoredEvent:
    """The immutable value a store keeps and shares (no validation: `event` is a valid event)."""
    fields = dict(event.__dict__)
    fields["metadata"] = freeze_value(fields["metadata"])
    fields["visibility"] = freeze_value(fields["visibility"])
    fields["content"] = _freeze_content(fields["content"])
    return StoredEvent.model_construct(_fields_set=set(event.model_fields_set), **fields)


def thaw_event(data: str | bytes) -> StoredEvent:
    """A stored event from its JSON (the SQL stores), frozen like any other."""
    return freeze_event(RoomEvent.model_validate_json(data))


def in_window(event: RoomEvent, channel_id: str) -> bool:
    """An event a channel's memory may see: visible to it, or sent from it."""
    return event.source.channel_id == channel_id or event.visible_to(channel_id)


class ChannelBinding(BaseModel):
    room_id: str
    channel_id: str
    group: bool = False
    """A group binding routes every sender on the channel into this room (a bridge, a group chat)."""


class Room(BaseModel):
    id: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class RoomStore(ABC):
    @abstractmethod
    async def create_room(self, room: Room) -> None: ...
    @abstractmethod
    async def get_room(self, room_id: str) -> Room | None: ...
    @abstractmethod
    async def list_rooms(self) -> list[Room]: ...
    @abstractmethod
    async def delete_room(self, room_id: str) -> None:
        """Forget everything kept for the room: the room, its bindings, the senders routed to it,
        its events, participants and register. A room that is not there is no error."""

    @abstractmethod
    async def add_binding(self, binding: ChannelBinding) -> None: ...
    @abstractmethod
    async def get_bindings(self, room_id: str) -> list[ChannelBinding]: ...
    @abstractmethod
    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]: ...

    @abstractmethod
    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None: ...
    @abstractmethod
    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None: ...

    @abstractmethod
    async def add_event(self, event: RoomEvent) -> None: ...
    @abstractmethod
    async def replace_event(self, event: RoomEvent) -> None: ...
    @abstractmethod
    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None: ...
    @abstractmethod
    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        """Committed events, oldest first; with `limit`, the newest `limit` of them."""

    @abstractmethod
    async def list_window(
        self, room_id: str, channel_id: str, limit: int, *, before: str | None = None
    ) -> list[RoomEvent]:
        """The newest `limit` events (oldest first) that `channel_id` may see (`in_window`),
        committed before the event `before` when given (a memory pages back through what fell out
        of its window). Served from an index: the cost follows `limit`, not the room's length."""

    @abstractmethod
    async def list_around(
        self, room_id: str, event_id: str, before: int, after: int
    ) -> list[RoomEvent]:
        """A turn's neighbours: up to `before` events committed before `event_id`, the event
        itself and up to `after` events after it, oldest first. Empty when there is no such event."""

    @abstractmethod
    async def list_page(self, room_id: str, after: str | None, limit: int) -> list[RoomEvent]:
        """Up to `limit` events committed after the event `after` (from the first when None;
        none after an event the room does not hold), oldest first: a reader walks a long room a
        page at a time (`pages`) instead of holding it whole. Served from the `(room, seq)` index."""

    async def pages(self, room_id: str, size: int = 2000) -> AsyncIterator[list[RoomEvent]]:
        """The room's committed events, oldest first, `size` at a time."""
        after: str | None = None
        while page := await self.list_page(room_id, after, size):
            yield page
            if len(page) < size:
                return
            after = page[-1].id

    @abstractmethod
    async def upsert_participant(self, room_id: str, participant: Participant) -> None: ...
    @abstractmethod
    async def get_participants(self, room_id: str) -> list[Participant]: ...

    @abstractmethod
    async def get_register(self, room_id: str) -> dict[str, Any] | None: ...
    @abstractmethod
    async def put_register(self, room_id: str, register: dict[str, Any], *, start: int = 0) -> None:
        """Write the room's register (the engine's JSON). With `start`, `register["entries"]` are
        the entries from index `start` on, appended after the `start` entries already stored:
        entries never change once given (D3), so a turn that adds one writes one, not the whole
        register (a room of 1,000 participants rewrote 214 KB on every turn, issue 25.12)."""

    @abstractmethod
    async def revision(self, room_id: str) -> int:
        """A number that moves whenever the room's participants or register are written, by this
        process or any other sharing the store (a deleted room's next number is a new one). The
        kit keeps a room's participants and register in memory and reads them again only when
        this moved (`rooms.kit`), so a turn costs what it adds, not what the room holds."""

    @abstractmethod
    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        """What a memory (a summary, a compaction point) kept for the room under `key`."""

    @abstractmethod
    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        """Keep a JSON object for the room under `key` (replacing what was there)."""


class _Timeline:
    """One room's events and the index its windows are read from.

    `events` holds frozen events in commit order; `public` the positions of events every channel
    sees; `by_channel[c]` the positions of events sent from `c` or shown to `c` by an explicit
    visibility list. The newest events a channel may see are the newest of `public` and
    `by_channel[c]` merged: `limit` positions from each list, found by bisection.
    """

    def __init__(self) -> None:
        self.events: list[StoredEvent] = []
        self.positions: dict[str, int] = {}
        self.public: list[int] = []
        self.by_channel: dict[str, list[int]] = {}

    def _lists(self, event: RoomEvent) -> list[list[int]]:
        lists = [self.by_channel.setdefault(event.source.channel_id, [])]
        if event.visibility == "all":
            lists.append(self.public)
        elif isinstance(event.visibility, list):
            lists.extend(
                self.by_channel.setdefault(c, [])
                for c in dict.fromkeys(event.visibility)
                if c != event.source.channel_id
            )
        return lists

    def append(self, event: StoredEvent) -> None:
        if event.id in self.positions:
            raise ValueError(f"event {event.id!r} is already in room {event.room_id!r}")
        position = len(self.events)
        self.positions[event.id] = position
        self.events.append(event)
        for positions in self._lists(event):
            positions.append(position)

    def replace(self, event: StoredEvent) -> None:
        position = self.positions[event.id]
        old = self.events[position]
        for positions in self._lists(old):
            del positions[bisect.bisect_left(positions, position)]
        self.events[position] = event
        for positions in self._lists(event):
            bisect.insort(positions, position)

    def window(self, channel_id: str, limit: int, before: str | None) -> list[StoredEvent]:
        if limit <= 0:
            return []
        cutoff = len(self.events) if before is None else self.positions.get(before)
        if cutoff is None:
            return []
        chosen: set[int] = set()
        for positions in (self.public, self.by_channel.get(channel_id, [])):
            end = bisect.bisect_left(positions, cutoff)
            chosen.update(positions[max(0, end - limit) : end])
        return [self.events[p] for p in sorted(chosen)[-limit:]]

    def around(self, event_id: str, before: int, after: int) -> list[StoredEvent]:
        position = self.positions.get(event_id)
        if position is None:
            return []
        return self.events[max(0, position - max(before, 0)) : position + max(after, 0) + 1]


class InMemoryStore(RoomStore, InMemoryVoices):
    """Everything in dictionaries (the voice directory too, `rooms.voices`). Events are frozen once and shared; rooms, bindings,
    participants, registers and memory state are copied in and out, so no caller can change
    stored state."""

    def __init__(self) -> None:
        InMemoryVoices.__init__(self)
        self._rooms: dict[str, Room] = {}
        self._bindings: dict[str, dict[str, ChannelBinding]] = {}
        self._senders: dict[tuple[str, str], str] = {}
        self._timelines: dict[str, _Timeline] = {}
        self._participants: dict[str, dict[str, Participant]] = {}
        self._registers: dict[str, tuple[str, list[str]]] = {}
        """Per room: the register without its entries, and each entry, as JSON (reads are copies)."""
        self._memory_state: dict[tuple[str, str], dict[str, Any]] = {}
        self._revisions: dict[str, int] = {}
        self._last_revision = 0

    def _moved(self, room_id: str) -> None:
        self._last_revision += 1
        self._revisions[room_id] = self._last_revision

    async def create_room(self, room: Room) -> None:
        if room.id in self._rooms:
            raise ValueError(f"room {room.id!r} already exists")
        self._rooms[room.id] = room.model_copy(deep=True)
        self._timelines[room.id] = _Timeline()

    async def get_room(self, room_id: str) -> Room | None:
        room = self._rooms.get(room_id)
        return room.model_copy(deep=True) if room else None

    async def list_rooms(self) -> list[Room]:
        return [r.model_copy(deep=True) for r in self._rooms.values()]

    async def delete_room(self, room_id: str) -> None:
        self._rooms.pop(room_id, None)
        self._bindings.pop(room_id, None)
        for key in [k for k, room in self._senders.items() if room == room_id]:
            del self._senders[key]
        self._timelines.pop(room_id, None)
        self._participants.pop(room_id, None)
        self._registers.pop(room_id, None)
        for key in [k for k in self._memory_state if k[0] == room_id]:
            del self._memory_state[key]
        self._moved(room_id)

    async def add_binding(self, binding: ChannelBinding) -> None:
        self._bindings.setdefault(binding.room_id, {})[binding.channel_id] = binding.model_copy()

    async def get_bindings(self, room_id: str) -> list[ChannelBinding]:
        return [b.model_copy() for b in self._bindings.get(room_id, {}).values()]

    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]:
        return [
            b.model_copy()
            for bindings in self._bindings.values()
            for b in bindings.values()
            if b.channel_id == channel_id
        ]

    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None:
        return self._senders.get((channel_id, sender_id))

    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None:
        self._senders[(channel_id, sender_id)] = room_id

    async def add_event(self, event: RoomEvent) -> None:
        self._timelines.setdefault(event.room_id, _Timeline()).append(freeze_event(event))

    async def replace_event(self, event: RoomEvent) -> None:
        timeline = self._timelines.get(event.room_id)
        if timeline is None or event.id not in timeline.positions:
            raise KeyError(f"no event {event.id!r} in room {event.room_id!r}")
        timeline.replace(freeze_event(event))

    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None:
        timeline = self._timelines.get(room_id)
        position = timeline.positions.get(event_id) if timeline else None
        return None if timeline is None or position is None else timeline.events[position]

    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        timeline = self._timelines.get(room_id)
        events: list[RoomEvent] = list(timeline.events) if timeline else []
        if limit is not None:
            events = events[-limit:] if limit > 0 else []
        return events

    async def list_page(self, room_id: str, after: str | None, limit: int) -> list[RoomEvent]:
        timeline = self._timelines.get(room_id)
        if timeline is None:
            return []
        start = 0 if after is None else timeline.positions.get(after, len(timeline.events) - 1) + 1
        return list(timeline.events[start : start + max(limit, 0)])

    async def list_window(
        self, room_id: str, channel_id: str, limit: int, *, before: str | None = None
    ) -> list[RoomEvent]:
        timeline = self._timelines.get(room_id)
        return list(timeline.window(channel_id, limit, before)) if timeline else []

    async def list_around(
        self, room_id: str, event_id: str, before: int, after: int
    ) -> list[RoomEvent]:
        timeline = self._timelines.get(room_id)
        return list(timeline.around(event_id, before, after)) if timeline else []

    async def upsert_participant(self, room_id: str, participant: Participant) -> None:
        self._participants.setdefault(room_id, {})[participant.id] = participant.model_copy(deep=True)
        self._moved(room_id)

    async def get_participants(self, room_id: str) -> list[Participant]:
        return [p.model_copy(deep=True) for p in self._participants.get(room_id, {}).values()]

    async def get_register(self, room_id: str) -> dict[str, Any] | None:
        stored = self._registers.get(room_id)
        if stored is None:
            return None
        header, entries = stored
        return {**json.loads(header), "entries": [json.loads(e) for e in entries]}

    async def put_register(self, room_id: str, register: dict[str, Any], *, start: int = 0) -> None:
        header = json.dumps({k: v for k, v in register.items() if k != "entries"})
        added = [json.dumps(e) for e in register.get("entries", [])]
        entries = self._registers[room_id][1] if start else []
        del entries[start:]
        entries.extend(added)
        self._registers[room_id] = (header, entries)
        self._moved(room_id)

    async def revision(self, room_id: str) -> int:
        return self._revisions.get(room_id, 0)

    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        data = self._memory_state.get((room_id, key))
        return copy.deepcopy(data) if data is not None else None

    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        self._memory_state[(room_id, key)] = copy.deepcopy(value)


def window_of(events: Iterable[RoomEvent], channel_id: str, limit: int) -> list[RoomEvent]:
    """`list_window` over a list already read (oldest first): the newest `limit` in the window."""
    visible = [e for e in events if in_window(e, channel_id)]
    return visible[-limit:] if limit > 0 else []


@dataclass
class OpenedStore:
    """A store opened from a URL, the room locks that go with it, and how to close both."""

    url: str
    store: RoomStore
    locks: RoomLockManager
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            await close()


def sqlite_path(url: str) -> str:
    """The file of a SQLite URL: `sqlite:///var/lib/chorus/chorus.db` is the absolute path
    `/var/lib/chorus/chorus.db` (extra leading slashes are one), `sqlite://data/chorus.db` a path
    relative to the working directory, `sqlite://:memory:` an in-memory database."""
    rest = url[len("sqlite://") :] if url.lower().startswith("sqlite://") else ""
    if not rest or rest in (":memory:", "/:memory:"):
        if not rest:
            raise ValueError(f"a SQLite store URL names a file: sqlite:///path/to/chorus.db, not {url!r}")
        return ":memory:"
    if rest.startswith("/"):
        return "/" + rest.lstrip("/")
    return rest


@dataclass
class OpenedDirectory:
    """The voice directory of a store opened from a URL (`open_directory`), and how to close it."""

    url: str
    store: VoiceStore
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            await close()


async def open_directory(url: str) -> OpenedDirectory:
    """The voice directory (`rooms.voices`) of the store a URL names, for `chorus voices` and
    `--voices`: a SQLite file's directory alone (`rooms.sqlite.SQLiteDirectory`, beside a
    `chorus serve` or `chorus agent` that holds the file), the whole store otherwise. ValueError
    for a store that keeps no voices."""
    if url.split(":", 1)[0].lower() == "sqlite":
        from rooms.sqlite import SQLiteDirectory

        directory = await SQLiteDirectory.open(sqlite_path(url))
        return OpenedDirectory(url, directory, [directory.close])
    opened = await open_store(url)
    if not isinstance(opened.store, VoiceStore):
        await opened.close()
        raise ValueError(f"the store at {url} cannot keep voices")
    return OpenedDirectory(url, opened.store, [opened.close])


async def open_store(url: str, *, shared: bool = False, room: str | None = None) -> OpenedStore:
    """The store a URL names, with its locks: `memory://` (one process, gone at exit),
    `sqlite:///path/to/chorus.db` (one process, kept on disk; a file another process holds is
    refused, `rooms.sqlite.SQLiteInUse`), `postgresql://…` or `postgres://…` (shared by several
    processes: Postgres advisory room locks, rule D6). `shared` and `room` matter to SQLite only:
    `chorus agent`'s processes share the file, each job owning its `room` (`rooms.sqlite`)."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "memory":
        return OpenedStore(url, InMemoryStore(), InProcessLocks())
    if scheme == "sqlite":
        from rooms.sqlite import SQLiteStore

        sqlite = await SQLiteStore.open(sqlite_path(url), shared=shared, room=room)
        return OpenedStore(url, sqlite, InProcessLocks(), [sqlite.close])
    if scheme in ("postgresql", "postgres"):
        require("postgres", "the Postgres store")
        from rooms.postgres import PostgresAdvisoryLocks, PostgresStore

        postgres = await PostgresStore.connect(url)
        try:
            locks = await PostgresAdvisoryLocks.connect(url)
        except BaseException:
            await postgres.close()
            raise
        return OpenedStore(url, postgres, locks, [locks.close, postgres.close])
    raise ValueError(
        f"unknown store URL {url!r}: use memory://, sqlite:///path/to/chorus.db or postgresql://…"
    )
