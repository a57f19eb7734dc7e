"""The store `chorus serve` keeps by default: one SQLite file (issue 14.2).

Holds rooms, bindings, the senders routed to rooms, participants, events, the attribution register
(salted digests only, D6) and the memories' state, so a restarted server continues every room: its
committed turns, renamed speakers, participants and ranks.

Shaped for the event loop that every room's audio shares: the standard library's `sqlite3` runs on
one worker thread of its own (one connection, calls queued in order), never on the loop. The file
is in WAL mode, so a reader never waits for a writer; each call is one statement or one
transaction, committed before it returns.

Events are stored as JSON with the columns their windows are read by (the source channel and the
visibility), and handed out frozen (`rooms.store.freeze_event`). The store remembers the frozen
events it has read or written (a bounded cache by event id), so a context built on every trigger
parses only the turns it has not seen yet. That cache, and the room locks that live in one
process's memory, are why one SQLite file belongs to one process: two processes on one file lost
register entries and relabelled turns (issue 25.5). So an open store holds an OS lock (`flock`,
released on close and by the kernel when the process dies, even by SIGKILL) on the sidecar file
`<db>.lock`, and a second open of the file (another process, or a second store in this one) is
refused at once with `SQLiteInUse`; several processes share rooms through `rooms.postgres`.
The one sharing allowed is `chorus agent`'s: its job processes each own one room of the file
(`room=`: a shared lock on `<db>.lock` and an exclusive one on that room's file in `<db>.rooms/`),
so the rooms of one machine's jobs live side by side but no room is written by two processes.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import json
import os
import sqlite3
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from models import Participant, RoomEvent
from rooms.store import ChannelBinding, Room, RoomStore, StoredEvent, freeze_event, thaw_event
from rooms.voices import (
    MAX_PRINTS_PER_VOICE,
    RememberedVoice,
    VoiceStore,
    checked_name,
    new_print,
    new_voice_id,
    voices_from_rows,
)

T = TypeVar("T")

SCHEMA = """
CREATE TABLE IF NOT EXISTS rooms (
    id TEXT PRIMARY KEY, metadata TEXT NOT NULL, created_at TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS bindings (
    room_id TEXT NOT NULL, channel_id TEXT NOT NULL, is_group INTEGER NOT NULL,
    PRIMARY KEY (room_id, channel_id));
CREATE INDEX IF NOT EXISTS bindings_channel ON bindings (channel_id);
CREATE TABLE IF NOT EXISTS senders (
    channel_id TEXT NOT NULL, sender_id TEXT NOT NULL, room_id TEXT NOT NULL,
    PRIMARY KEY (channel_id, sender_id));
CREATE INDEX IF NOT EXISTS senders_room ON senders (room_id);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, room_id TEXT NOT NULL, id TEXT NOT NULL,
    source_channel TEXT NOT NULL, visibility TEXT NOT NULL, data TEXT NOT NULL,
    UNIQUE (room_id, id));
CREATE INDEX IF NOT EXISTS events_room_seq ON events (room_id, seq);
CREATE TABLE IF NOT EXISTS participants (
    room_id TEXT NOT NULL, id TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (room_id, id));
CREATE TABLE IF NOT EXISTS registers (room_id TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS register_entries (
    room_id TEXT NOT NULL, seq INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (room_id, seq));
CREATE TABLE IF NOT EXISTS memory_state (
    room_id TEXT NOT NULL, key TEXT NOT NULL, data TEXT NOT NULL, PRIMARY KEY (room_id, key));
CREATE TABLE IF NOT EXISTS voices (
    id TEXT PRIMARY KEY, name TEXT NOT NULL UNIQUE, created REAL NOT NULL, last_heard REAL);
CREATE TABLE IF NOT EXISTS voiceprints (
    id TEXT PRIMARY KEY, voice_id TEXT NOT NULL, model TEXT NOT NULL, vector BLOB NOT NULL,
    source TEXT NOT NULL, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS voiceprints_voice ON voiceprints (voice_id);
CREATE TABLE IF NOT EXISTS voices_generation (
    id INTEGER PRIMARY KEY CHECK (id = 1), generation INTEGER NOT NULL);
"""

_VOICES_MOVED = (
    "INSERT INTO voices_generation (id, generation) VALUES (1, 1) "
    "ON CONFLICT (id) DO UPDATE SET generation = generation + 1"
)
"""Move the voice directory's generation (`VoiceStore.voices_generation`), inside the change's
transaction."""

_IN_WINDOW = (
    "(visibility = '\"all\"' OR source_channel = ? "
    "OR (visibility LIKE '[%' AND EXISTS (SELECT 1 FROM json_each(events.visibility) WHERE value = ?)))"
)
"""`rooms.store.in_window` in SQL: visible to the channel, or sent from it."""

_ROOM_TABLES = (
    "bindings", "senders", "events", "participants", "registers", "register_entries", "memory_state"
)


class SQLiteInUse(RuntimeError):
    """The SQLite file (or, for a job, its room) is held by another open store."""


class SQLiteLock:
    """The OS locks that keep one SQLite file to one process: an exclusive `flock` on `<db>.lock`,
    or with `shared` / `room` a shared one (several processes, each on rooms of its own) plus, with
    `room`, an exclusive one on `<db>.rooms/<digest of the room>.lock`. Taken at once or refused
    (`SQLiteInUse`); held on open descriptors until `release`, and by the kernel no longer than the
    process lives."""

    def __init__(self, db: str, *, shared: bool = False, room: str | None = None) -> None:
        self.db = db
        self._fds: list[int] = []
        try:
            self._take(f"{db}.lock", shared=shared or room is not None, room=None)
            if room is not None:
                folder = Path(f"{db}.rooms")
                folder.mkdir(parents=True, exist_ok=True)
                digest = hashlib.sha256(room.encode()).hexdigest()[:32]
                self._take(str(folder / f"{digest}.lock"), shared=False, room=room)
        except BaseException:
            self.release()
            raise

    def _take(self, path: str, *, shared: bool, room: str | None) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            what = f"room {room!r} of the SQLite file {self.db}" if room else f"the SQLite file {self.db}"
            raise SQLiteInUse(
                f"{what} is in use by another process (or another open store): one process per "
                "SQLite file; use a Postgres store ([store] url = \"postgresql://…\") for several "
                "processes"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        self._fds.append(fd)

    def release(self) -> None:
        while self._fds:
            os.close(self._fds.pop())  # closing the descriptor drops its flock


class SQLiteStore(RoomStore, VoiceStore):
    """`RoomStore` (and the voice directory, `rooms.voices`) in one SQLite file, its queries on a worker thread of its own."""

    def __init__(self, path: str | Path, *, cache_events: int = 20_000) -> None:
        self.path = str(path)
        self._lock: SQLiteLock | None = None
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="chorus-sqlite")
        self._conn: sqlite3.Connection | None = None
        self._cache: OrderedDict[tuple[str, str], StoredEvent] = OrderedDict()
        self._cache_size = cache_events
        self._closed = False
        self._revisions: dict[str, int] = {}
        self._last_revision = 0

    @classmethod
    async def open(
        cls, path: str | Path, *, shared: bool = False, room: str | None = None
    ) -> SQLiteStore:
        """Open (creating when missing) the database file and its tables, holding the file's lock
        (`SQLiteLock`: this store alone, or with `room` one job's room of a shared file); a file
        another store holds is refused with `SQLiteInUse`. `:memory:` takes no lock."""
        store = cls(path)
        try:
            if store.path != ":memory:":
                store._lock = SQLiteLock(store.path, shared=shared, room=room)
            await store._call(store._connect)
        except BaseException:
            await store.close()
            raise
        return store

    def _connect(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA busy_timeout=5000")
        conn.executescript(SCHEMA)
        self._conn = conn

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True

        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        try:
            await asyncio.get_running_loop().run_in_executor(self._executor, shut)
            self._executor.shutdown(wait=True)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    async def _call(self, fn: Callable[[], T]) -> T:
        if self._closed:
            raise RuntimeError(f"the SQLite store {self.path} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise RuntimeError(f"the SQLite store {self.path} is not open (use SQLiteStore.open)")
        return self._conn

    async def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return await self._call(lambda: self._db().execute(sql, params).fetchall())

    async def _transaction(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        def run() -> None:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    db.execute(sql, params)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        await self._call(run)

    # ----------------------------------------------------------------- frozen events

    def _remember(self, event: StoredEvent) -> StoredEvent:
        key = (event.room_id, event.id)
        self._cache[key] = event
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return event

    async def _events(
        self, room_id: str, sql: str, params: tuple[Any, ...] = ()
    ) -> list[RoomEvent]:
        """The (id, data) rows `sql` selects as frozen events. The rows are read and parsed on
        the store's thread (parsing only those not remembered): a room of 200,000 turns costs
        the event loop a list, not 200,000 parses. Of those parsed, the latest are remembered."""
        cache = self._cache

        def read() -> tuple[list[RoomEvent], list[StoredEvent]]:
            out: list[RoomEvent] = []
            parsed: list[StoredEvent] = []
            for event_id, data in self._db().execute(sql, params).fetchall():
                event = cache.get((room_id, event_id))  # one atomic lookup: the loop may write
                if event is None:
                    event = thaw_event(data)
                    parsed.append(event)
                out.append(event)
            return out, parsed

        out, parsed = await self._call(read)
        for event in parsed[-self._cache_size :]:
            self._remember(event)
        return out

    # ----------------------------------------------------------------- rooms

    async def create_room(self, room: Room) -> None:
        try:
            await self._rows(
                "INSERT INTO rooms (id, metadata, created_at) VALUES (?, ?, ?)",
                (room.id, json.dumps(room.metadata), room.created_at.isoformat()),
            )
        except sqlite3.IntegrityError:
            raise ValueError(f"room {room.id!r} already exists") from None

    @staticmethod
    def _room(row: tuple[Any, ...]) -> Room:
        return Room(id=row[0], metadata=json.loads(row[1]), created_at=datetime.fromisoformat(row[2]))

    async def get_room(self, room_id: str) -> Room | None:
        rows = await self._rows("SELECT id, metadata, created_at FROM rooms WHERE id = ?", (room_id,))
        return self._room(rows[0]) if rows else None

    async def list_rooms(self) -> list[Room]:
        rows = await self._rows("SELECT id, metadata, created_at FROM rooms ORDER BY created_at")
        return [self._room(r) for r in rows]

    async def delete_room(self, room_id: str) -> None:
        await self._transaction(
            [(f"DELETE FROM {table} WHERE room_id = ?", (room_id,)) for table in _ROOM_TABLES]
            + [("DELETE FROM rooms WHERE id = ?", (room_id,))]
        )
        for key in [k for k in self._cache if k[0] == room_id]:
            del self._cache[key]
        self._moved(room_id)

    # ----------------------------------------------------------------- bindings and senders

    async def add_binding(self, binding: ChannelBinding) -> None:
        await self._rows(
            "INSERT INTO bindings (room_id, channel_id, is_group) VALUES (?, ?, ?) "
            "ON CONFLICT (room_id, channel_id) DO UPDATE SET is_group = excluded.is_group",
            (binding.room_id, binding.channel_id, int(binding.group)),
        )

    async def get_bindings(self, room_id: str) -> list[ChannelBinding]:
        rows = await self._rows(
            "SELECT room_id, channel_id, is_group FROM bindings WHERE room_id = ? ORDER BY channel_id",
            (room_id,),
        )
        return [ChannelBinding(room_id=r[0], channel_id=r[1], group=bool(r[2])) for r in rows]

    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]:
        rows = await self._rows(
            "SELECT room_id, channel_id, is_group FROM bindings WHERE channel_id = ? ORDER BY room_id",
            (channel_id,),
        )
        return [ChannelBinding(room_id=r[0], channel_id=r[1], group=bool(r[2])) for r in rows]

    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None:
        rows = await self._rows(
            "SELECT room_id FROM senders WHERE channel_id = ? AND sender_id = ?",
            (channel_id, sender_id),
        )
        return str(rows[0][0]) if rows else None

    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None:
        await self._rows(
            "INSERT INTO senders (channel_id, sender_id, room_id) VALUES (?, ?, ?) "
            "ON CONFLICT (channel_id, sender_id) DO UPDATE SET room_id = excluded.room_id",
            (channel_id, sender_id, room_id),
        )

    # ----------------------------------------------------------------- events

    async def add_event(self, event: RoomEvent) -> None:
        frozen = freeze_event(event)
        try:
            await self._rows(
                "INSERT INTO events (room_id, id, source_channel, visibility, data) "
                "VALUES (?, ?, ?, ?, ?)",
                (
                    event.room_id,
                    event.id,
                    event.source.channel_id,
                    json.dumps(event.visibility),
                    event.model_dump_json(),
                ),
            )
        except sqlite3.IntegrityError:
            raise ValueError(f"event {event.id!r} is already in room {event.room_id!r}") from None
        self._remember(frozen)

    async def replace_event(self, event: RoomEvent) -> None:
        frozen = freeze_event(event)
        rows = await self._rows(
            "UPDATE events SET source_channel = ?, visibility = ?, data = ? "
            "WHERE room_id = ? AND id = ? RETURNING seq",
            (
                event.source.channel_id,
                json.dumps(event.visibility),
                event.model_dump_json(),
                event.room_id,
                event.id,
            ),
        )
        if not rows:
            raise KeyError(f"no event {event.id!r} in room {event.room_id!r}")
        self._remember(frozen)

    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None:
        cached = self._cache.get((room_id, event_id))
        if cached is not None:
            return cached
        found = await self._events(
            room_id, "SELECT id, data FROM events WHERE room_id = ? AND id = ?", (room_id, event_id)
        )
        return found[0] if found else None

    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        if limit is None:
            return await self._events(
                room_id, "SELECT id, data FROM events WHERE room_id = ? ORDER BY seq", (room_id,)
            )
        return await self._events(
            room_id,
            "SELECT id, data FROM (SELECT seq, id, data FROM events WHERE room_id = ? "
            "ORDER BY seq DESC LIMIT ?) ORDER BY seq",
            (room_id, max(limit, 0)),
        )

    async def list_page(self, room_id: str, after: str | None, limit: int) -> list[RoomEvent]:
        if after is None:
            return await self._events(
                room_id,
                "SELECT id, data FROM events WHERE room_id = ? ORDER BY seq LIMIT ?",
                (room_id, max(limit, 0)),
            )
        return await self._events(
            room_id,
            "SELECT id, data FROM events WHERE room_id = ? AND seq > "
            "(SELECT seq FROM events WHERE room_id = ? AND id = ?) ORDER BY seq LIMIT ?",
            (room_id, room_id, after, max(limit, 0)),
        )

    async def list_window(
        self, room_id: str, channel_id: str, limit: int, *, before: str | None = None
    ) -> list[RoomEvent]:
        if limit <= 0:
            return []
        cutoff = ""
        params: tuple[Any, ...] = (room_id,)
        if before is not None:
            cutoff = "AND seq < (SELECT seq FROM events WHERE room_id = ? AND id = ?) "
            params += (room_id, before)
        return await self._events(
            room_id,
            "SELECT id, data FROM (SELECT seq, id, data FROM events WHERE room_id = ? "
            f"{cutoff}AND {_IN_WINDOW} ORDER BY seq DESC LIMIT ?) ORDER BY seq",
            (*params, channel_id, channel_id, limit),
        )

    async def list_around(
        self, room_id: str, event_id: str, before: int, after: int
    ) -> list[RoomEvent]:
        return await self._events(
            room_id,
            "SELECT id, data FROM ("
            "SELECT * FROM (SELECT seq, id, data FROM events WHERE room_id = ? AND seq < "
            "(SELECT seq FROM events WHERE room_id = ? AND id = ?) ORDER BY seq DESC LIMIT ?) "
            "UNION ALL "
            "SELECT * FROM (SELECT seq, id, data FROM events WHERE room_id = ? AND seq >= "
            "(SELECT seq FROM events WHERE room_id = ? AND id = ?) ORDER BY seq LIMIT ?)"
            ") ORDER BY seq",
            (room_id, room_id, event_id, max(before, 0), room_id, room_id, event_id, max(after, 0) + 1),
        )

    # ----------------------------------------------------------------- participants, register, memory

    async def upsert_participant(self, room_id: str, participant: Participant) -> None:
        await self._rows(
            "INSERT INTO participants (room_id, id, data) VALUES (?, ?, ?) "
            "ON CONFLICT (room_id, id) DO UPDATE SET data = excluded.data",
            (room_id, participant.id, participant.model_dump_json()),
        )
        self._moved(room_id)

    async def get_participants(self, room_id: str) -> list[Participant]:
        rows = await self._rows(
            "SELECT data FROM participants WHERE room_id = ? ORDER BY rowid", (room_id,)
        )
        return [Participant.model_validate_json(r[0]) for r in rows]

    async def get_register(self, room_id: str) -> dict[str, Any] | None:
        """The register row (a file written before issue 25.12 holds every entry there) and the
        entries appended after it, in order."""

        def read() -> dict[str, Any] | None:
            db = self._db()
            row = db.execute("SELECT data FROM registers WHERE room_id = ?", (room_id,)).fetchone()
            if row is None:
                return None
            register = dict(json.loads(row[0]))
            appended = db.execute(
                "SELECT data FROM register_entries WHERE room_id = ? ORDER BY seq", (room_id,)
            ).fetchall()
            register["entries"] = list(register.get("entries", [])) + [json.loads(r[0]) for r in appended]
            return register

        return await self._call(read)

    async def put_register(self, room_id: str, register: dict[str, Any], *, start: int = 0) -> None:
        entries = list(register.get("entries", []))
        statements: list[tuple[str, tuple[Any, ...]]]
        if start:  # append: one row per new entry, numbered by its place in the register
            statements = [
                (
                    "INSERT OR REPLACE INTO register_entries (room_id, seq, data) VALUES (?, ?, ?)",
                    (room_id, start + i, json.dumps(entry)),
                )
                for i, entry in enumerate(entries)
            ]
        else:  # the whole register in its row, nothing appended after it
            statements = [
                (
                    "INSERT INTO registers (room_id, data) VALUES (?, ?) "
                    "ON CONFLICT (room_id) DO UPDATE SET data = excluded.data",
                    (room_id, json.dumps(register)),
                ),
                ("DELETE FROM register_entries WHERE room_id = ?", (room_id,)),
            ]
        await self._transaction(statements)
        self._moved(room_id)

    async def revision(self, room_id: str) -> int:
        """Counted in this process: a room of the file is written by one process only (the
        file's lock, or one job's room lock), so nothing else can move it."""
        return self._revisions.get(room_id, 0)

    def _moved(self, room_id: str) -> None:
        self._last_revision += 1
        self._revisions[room_id] = self._last_revision

    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        rows = await self._rows(
            "SELECT data FROM memory_state WHERE room_id = ? AND key = ?", (room_id, key)
        )
        return dict(json.loads(rows[0][0])) if rows else None

    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        await self._rows(
            "INSERT INTO memory_state (room_id, key, data) VALUES (?, ?, ?) "
            "ON CONFLICT (room_id, key) DO UPDATE SET data = excluded.data",
            (room_id, key, json.dumps(value)),
        )

    # ----------------------------------------------------------------- the voice directory

    async def remember_print(self, name: str, model: str, vector: bytes, source: str
                             ) -> RememberedVoice:
        name = checked_name(name)

        def run() -> None:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                row = db.execute("SELECT id FROM voices WHERE name = ?", (name,)).fetchone()
                voice_id = row[0] if row else new_voice_id()
                if row is None:
                    db.execute("INSERT INTO voices (id, name, created) VALUES (?, ?, ?)",
                               (voice_id, name, time.time()))
                made = new_print(voice_id, model, vector, source)
                db.execute(
                    "INSERT INTO voiceprints (id, voice_id, model, vector, source, created) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    (made.id, voice_id, made.model, made.vector, made.source, made.created))
                db.execute(
                    "DELETE FROM voiceprints WHERE voice_id = ? AND id NOT IN (SELECT id FROM "
                    "voiceprints WHERE voice_id = ? ORDER BY created DESC, id DESC LIMIT ?)",
                    (voice_id, voice_id, MAX_PRINTS_PER_VOICE))
                db.execute(_VOICES_MOVED)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

        await self._call(run)
        voice = next((v for v in await self.list_voices() if v.name == name), None)
        assert voice is not None
        return voice

    async def list_voices(self) -> list[RememberedVoice]:
        people = await self._rows("SELECT id, name, created, last_heard FROM voices")
        prints = await self._rows(
            "SELECT id, voice_id, model, vector, source, created FROM voiceprints")
        return voices_from_rows(people, prints)

    async def forget_voice(self, voice_id: str) -> bool:
        def run() -> bool:
            db = self._db()
            db.execute("BEGIN IMMEDIATE")
            try:
                db.execute("DELETE FROM voiceprints WHERE voice_id = ?", (voice_id,))
                gone = db.execute("DELETE FROM voices WHERE id = ?", (voice_id,)).rowcount
                if gone:
                    db.execute(_VOICES_MOVED)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
            return bool(gone)

        return await self._call(run)

    async def voice_heard(self, voice_id: str, at: float) -> None:
        await self._rows("UPDATE voices SET last_heard = ? WHERE id = ?", (at, voice_id))

    async def voices_generation(self) -> int:
        rows = await self._rows("SELECT generation FROM voices_generation WHERE id = 1")
        return int(rows[0][0]) if rows else 0


class SQLiteDirectory(VoiceStore):
    """The voice directory of a SQLite file alone (its `voices` and `voiceprints` tables), beside
    the process that holds the file (`chorus voices`, `--voices`, while `chorus serve` or
    `chorus agent` runs on it). It takes none of the file's locks: those keep the rooms to one
    process because a process caches their events and locks them in its memory, while nothing of
    the directory is cached by a store (every read is a query) and each change is one
    transaction, which SQLite orders across processes (WAL, `busy_timeout`). A process that
    names voices sees a change made here through the directory's generation."""

    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    @classmethod
    async def open(cls, path: str | Path) -> SQLiteDirectory:
        store = SQLiteStore(path)
        try:
            await store._call(store._connect)
        except BaseException:
            await store.close()
            raise
        return cls(store)

    async def close(self) -> None:
        await self._store.close()

    async def remember_print(
        self, name: str, model: str, vector: bytes, source: str
    ) -> RememberedVoice:
        return await self._store.remember_print(name, model, vector, source)

    async def list_voices(self) -> list[RememberedVoice]:
        return await self._store.list_voices()

    async def forget_voice(self, voice_id: str) -> bool:
        return await self._store.forget_voice(voice_id)

    async def voice_heard(self, voice_id: str, at: float) -> None:
        await self._store.voice_heard(voice_id, at)

    async def voices_generation(self) -> int:
        return await self._store.voices_generation()
