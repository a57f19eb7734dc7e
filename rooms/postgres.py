"""A store and a room lock shared by several processes, on Postgres.

When two server processes serve the same room, each must see the other's events, participants and
register, and rank assignment must happen one commit at a time across both (rule D6). The store
keeps rooms as rows (events and participants as JSON documents, the register as the engine's
salted-digest JSON); the lock is a Postgres advisory lock per room, taken after the process's own
per-room asyncio lock so one process holds at most one database lock attempt per room.

Advisory locks are polled with `pg_try_advisory_lock` on one dedicated connection per process, so a
waiting room never blocks the connection for other rooms.

The voice directory's changes are announced: each remember and forget moves the directory's
generation and sends `NOTIFY chorus_voices` (its payload the generation) in its transaction, and
`voices_changed` returns when one arrives, heard on a connection of its own (`LISTEN`, opened
on first use, opened again after a failure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import types
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from models import Participant, RoomEvent
from rooms.locks import RoomLockManager, idle
from rooms.store import ChannelBinding, Room, RoomStore, thaw_event
from rooms.voices import (
    MAX_PRINTS_PER_VOICE,
    RememberedVoice,
    VoiceStore,
    checked_name,
    new_print,
    new_voice_id,
    voices_from_rows,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS chorus_rooms (
    id text PRIMARY KEY, metadata jsonb NOT NULL, created_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS chorus_bindings (
    room_id text NOT NULL, channel_id text NOT NULL, is_group boolean NOT NULL,
    PRIMARY KEY (room_id, channel_id));
CREATE TABLE IF NOT EXISTS chorus_senders (
    channel_id text NOT NULL, sender_id text NOT NULL, room_id text NOT NULL,
    PRIMARY KEY (channel_id, sender_id));
CREATE TABLE IF NOT EXISTS chorus_events (
    seq bigserial PRIMARY KEY, room_id text NOT NULL, id text NOT NULL, data jsonb NOT NULL,
    UNIQUE (room_id, id));
CREATE TABLE IF NOT EXISTS chorus_participants (
    room_id text NOT NULL, id text NOT NULL, data jsonb NOT NULL, PRIMARY KEY (room_id, id));
CREATE TABLE IF NOT EXISTS chorus_registers (room_id text PRIMARY KEY, data jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS chorus_register_entries (
    room_id text NOT NULL, seq integer NOT NULL, data jsonb NOT NULL, PRIMARY KEY (room_id, seq));
CREATE SEQUENCE IF NOT EXISTS chorus_revision_seq;
CREATE TABLE IF NOT EXISTS chorus_revisions (room_id text PRIMARY KEY, revision bigint NOT NULL);
CREATE TABLE IF NOT EXISTS chorus_memory_state (
    room_id text NOT NULL, key text NOT NULL, data jsonb NOT NULL, PRIMARY KEY (room_id, key));
CREATE INDEX IF NOT EXISTS chorus_events_room_seq ON chorus_events (room_id, seq);
CREATE TABLE IF NOT EXISTS chorus_voices (
    id text PRIMARY KEY, name text NOT NULL UNIQUE, created double precision NOT NULL,
    last_heard double precision);
CREATE TABLE IF NOT EXISTS chorus_voiceprints (
    id text PRIMARY KEY, voice_id text NOT NULL, model text NOT NULL, vector bytea NOT NULL,
    source text NOT NULL, created double precision NOT NULL);
CREATE INDEX IF NOT EXISTS chorus_voiceprints_voice ON chorus_voiceprints (voice_id);
CREATE TABLE IF NOT EXISTS chorus_voices_generation (
    id integer PRIMARY KEY CHECK (id = 1), generation bigint NOT NULL);
"""

VOICES_CHANNEL = "chorus_voices"
"""The `NOTIFY` channel of the voice directory's changes; the payload is the new generation (a
number: never a print, a name or an id)."""

_VOICES_MOVED = (
    "INSERT INTO chorus_voices_generation (id, generation) VALUES (1, 1) ON CONFLICT (id) DO "
    "UPDATE SET generation = chorus_voices_generation.generation + 1 RETURNING generation"
)
"""Move the voice directory's generation (`VoiceStore.voices_generation`) inside the change's
transaction; the row lock orders concurrent changes."""

_RELISTEN_S = 1.0
"""After the listening connection fails, the next attempt waits this long (meanwhile a
directory polls)."""

log = logging.getLogger(__name__)

_IN_WINDOW = (
    "(data->'visibility' = '\"all\"'::jsonb OR data->'source'->>'channel_id' = %s "
    "OR (jsonb_typeof(data->'visibility') = 'array' AND data->'visibility' ? %s))"
)
"""`rooms.store.in_window` in SQL: visible to the channel, or sent from it."""


_MOVED = (
    "INSERT INTO chorus_revisions (room_id, revision) VALUES (%s, nextval('chorus_revision_seq')) "
    "ON CONFLICT (room_id) DO UPDATE SET revision = EXCLUDED.revision"
)
"""Move a room's revision (`RoomStore.revision`): one sequence for every room, so a room deleted
and made again never reads a number a process kept from before."""

_PARSE_INLINE = 64
"""Up to this many events are parsed on the loop: a thread costs more than the parse."""


async def _thawed(rows: list[tuple[Any, ...]]) -> list[RoomEvent]:
    """Rows of (data::text,) as frozen events, parsed off the event loop when there are many (a
    room of 200,000 turns would otherwise hold every room for seconds)."""
    if len(rows) <= _PARSE_INLINE:
        return [thaw_event(r[0]) for r in rows]
    return await asyncio.to_thread(lambda: [thaw_event(r[0]) for r in rows])


class PostgresStore(RoomStore, VoiceStore):
    """`RoomStore` (and the voice directory, `rooms.voices`) on one Postgres connection (queries serialised per process)."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], dsn: str | None = None) -> None:
        self._conn = conn
        self._query_lock = asyncio.Lock()
        self._dsn = dsn
        """Where the listening connection goes (None: no listening, `voices_changed` polls)."""
        self._listener: asyncio.Task[None] | None = None
        self._waiters: set[asyncio.Future[None]] = set()

    @classmethod
    async def connect(cls, dsn: str) -> PostgresStore:
        conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
        # Several processes starting at once would race on `CREATE TABLE IF NOT EXISTS` (it is not
        # atomic in Postgres): the schema is created under a transaction-scoped advisory lock.
        async with conn.transaction(), conn.cursor() as cur:
            await cur.execute("SELECT pg_advisory_xact_lock(hashtextextended('chorus-schema', 0))")
            await cur.execute(SCHEMA)
        return cls(conn, dsn)

    async def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener
        await self._conn.close()

    async def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        async with self._query_lock, self._conn.cursor() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall() if cur.description else []

    async def create_room(self, room: Room) -> None:
        try:
            await self._rows(
                "INSERT INTO chorus_rooms (id, metadata, created_at) VALUES (%s, %s, %s)",
                (room.id, Jsonb(room.metadata), room.created_at),
            )
        except psycopg.errors.UniqueViolation:
            raise ValueError(f"room {room.id!r} already exists") from None

    async def get_room(self, room_id: str) -> Room | None:
        rows = await self._rows("SELECT id, metadata, created_at FROM chorus_rooms WHERE id = %s", (room_id,))
        return Room(id=rows[0][0], metadata=rows[0][1], created_at=rows[0][2]) if rows else None

    async def list_rooms(self) -> list[Room]:
        rows = await self._rows("SELECT id, metadata, created_at FROM chorus_rooms ORDER BY created_at")
        return [Room(id=r[0], metadata=r[1], created_at=r[2]) for r in rows]

    async def delete_room(self, room_id: str) -> None:
        # One transaction: another process never sees half a room.
        async with self._query_lock, self._conn.transaction(), self._conn.cursor() as cur:
            for table in (
                "chorus_bindings",
                "chorus_senders",
                "chorus_events",
                "chorus_participants",
                "chorus_registers",
                "chorus_register_entries",
                "chorus_revisions",
                "chorus_memory_state",
            ):
                await cur.execute(f"DELETE FROM {table} WHERE room_id = %s", (room_id,))
            await cur.execute("DELETE FROM chorus_rooms WHERE id = %s", (room_id,))

    async def add_binding(self, binding: ChannelBinding) -> None:
        await self._rows(
            "INSERT INTO chorus_bindings (room_id, channel_id, is_group) VALUES (%s, %s, %s) "
            "ON CONFLICT (room_id, channel_id) DO UPDATE SET is_group = EXCLUDED.is_group",
            (binding.room_id, binding.channel_id, binding.group),
        )

    async def get_bindings(self, room_id: str) -> list[ChannelBinding]:
        rows = await self._rows(
            "SELECT room_id, channel_id, is_group FROM chorus_bindings WHERE room_id = %s ORDER BY channel_id",
            (room_id,),
        )
        return [ChannelBinding(room_id=r[0], channel_id=r[1], group=r[2]) for r in rows]

    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]:
        rows = await self._rows(
            "SELECT room_id, channel_id, is_group FROM chorus_bindings WHERE channel_id = %s ORDER BY room_id",
            (channel_id,),
        )
        return [ChannelBinding(room_id=r[0], channel_id=r[1], group=r[2]) for r in rows]

    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None:
        rows = await self._rows(
            "SELECT room_id FROM chorus_senders WHERE channel_id = %s AND sender_id = %s",
            (channel_id, sender_id),
        )
        return str(rows[0][0]) if rows else None

    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None:
        await self._rows(
            "INSERT INTO chorus_senders (channel_id, sender_id, room_id) VALUES (%s, %s, %s) "
            "ON CONFLICT (channel_id, sender_id) DO UPDATE SET room_id = EXCLUDED.room_id",
            (channel_id, sender_id, room_id),
        )

    async def add_event(self, event: RoomEvent) -> None:
        try:
            await self._rows(
                "INSERT INTO chorus_events (room_id, id, data) VALUES (%s, %s, %s)",
                (event.room_id, event.id, Jsonb(json.loads(event.model_dump_json()))),
            )
        except psycopg.errors.UniqueViolation:
            raise ValueError(f"event {event.id!r} is already in room {event.room_id!r}") from None

    async def replace_event(self, event: RoomEvent) -> None:
        rows = await self._rows(
            "UPDATE chorus_events SET data = %s WHERE room_id = %s AND id = %s RETURNING seq",
            (Jsonb(json.loads(event.model_dump_json())), event.room_id, event.id),
        )
        if not rows:
            raise KeyError(f"no event {event.id!r} in room {event.room_id!r}")

    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None:
        rows = await self._rows(
            "SELECT data::text FROM chorus_events WHERE room_id = %s AND id = %s", (room_id, event_id)
        )
        return thaw_event(rows[0][0]) if rows else None

    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        if limit is None:
            rows = await self._rows(
                "SELECT data::text FROM chorus_events WHERE room_id = %s ORDER BY seq", (room_id,)
            )
        else:
            rows = await self._rows(
                "SELECT data::text FROM (SELECT seq, data FROM chorus_events WHERE room_id = %s "
                "ORDER BY seq DESC LIMIT %s) newest ORDER BY seq",
                (room_id, max(limit, 0)),
            )
        return await _thawed(rows)

    async def list_page(self, room_id: str, after: str | None, limit: int) -> list[RoomEvent]:
        if after is None:
            rows = await self._rows(
                "SELECT data::text FROM chorus_events WHERE room_id = %s ORDER BY seq LIMIT %s",
                (room_id, max(limit, 0)),
            )
        else:
            rows = await self._rows(
                "SELECT data::text FROM chorus_events WHERE room_id = %s AND seq > "
                "(SELECT seq FROM chorus_events WHERE room_id = %s AND id = %s) "
                "ORDER BY seq LIMIT %s",
                (room_id, room_id, after, max(limit, 0)),
            )
        return await _thawed(rows)

    async def list_window(
        self, room_id: str, channel_id: str, limit: int, *, before: str | None = None
    ) -> list[RoomEvent]:
        if limit <= 0:
            return []
        cutoff = "" if before is None else (
            "AND seq < (SELECT seq FROM chorus_events WHERE room_id = %s AND id = %s) "
        )
        params: tuple[Any, ...] = (room_id,)
        if before is not None:
            params += (room_id, before)
        rows = await self._rows(
            "SELECT data::text FROM (SELECT seq, data FROM chorus_events WHERE room_id = %s "
            f"{cutoff}AND {_IN_WINDOW} ORDER BY seq DESC LIMIT %s) newest ORDER BY seq",
            (*params, channel_id, channel_id, limit),
        )
        return await _thawed(rows)

    async def list_around(
        self, room_id: str, event_id: str, before: int, after: int
    ) -> list[RoomEvent]:
        rows = await self._rows(
            "WITH turn AS (SELECT seq FROM chorus_events WHERE room_id = %s AND id = %s) "
            "SELECT data::text FROM ("
            "(SELECT seq, data FROM chorus_events WHERE room_id = %s AND seq < (SELECT seq FROM turn) "
            "ORDER BY seq DESC LIMIT %s) UNION ALL "
            "(SELECT seq, data FROM chorus_events WHERE room_id = %s AND seq >= (SELECT seq FROM turn) "
            "ORDER BY seq LIMIT %s)) near ORDER BY seq",
            (room_id, event_id, room_id, max(before, 0), room_id, max(after, 0) + 1),
        )
        return await _thawed(rows)

    async def upsert_participant(self, room_id: str, participant: Participant) -> None:
        await self._rows(
            f"WITH written AS (INSERT INTO chorus_participants (room_id, id, data) VALUES (%s, %s, %s) "
            f"ON CONFLICT (room_id, id) DO UPDATE SET data = EXCLUDED.data RETURNING room_id) {_MOVED}",
            (room_id, participant.id, Jsonb(participant.model_dump(mode="json")), room_id),
        )

    async def get_participants(self, room_id: str) -> list[Participant]:
        rows = await self._rows(
            "SELECT data FROM chorus_participants WHERE room_id = %s ORDER BY id", (room_id,)
        )
        return [Participant.model_validate(r[0]) for r in rows]

    async def get_register(self, room_id: str) -> dict[str, Any] | None:
        """The register row (a database written before issue 25.12 holds every entry there) and
        the entries appended after it, in order; read in one statement, so never half a write."""
        rows = await self._rows(
            "SELECT r.data, coalesce((SELECT jsonb_agg(e.data ORDER BY e.seq) "
            "FROM chorus_register_entries e WHERE e.room_id = r.room_id), '[]'::jsonb) "
            "FROM chorus_registers r WHERE r.room_id = %s",
            (room_id,),
        )
        if not rows:
            return None
        register = dict(rows[0][0])
        register["entries"] = list(register.get("entries", [])) + list(rows[0][1])
        return register

    async def put_register(self, room_id: str, register: dict[str, Any], *, start: int = 0) -> None:
        entries = list(register.get("entries", []))
        async with self._query_lock, self._conn.transaction(), self._conn.cursor() as cur:
            if start:  # append: one row per new entry, numbered by its place in the register
                await cur.executemany(
                    "INSERT INTO chorus_register_entries (room_id, seq, data) VALUES (%s, %s, %s) "
                    "ON CONFLICT (room_id, seq) DO UPDATE SET data = EXCLUDED.data",
                    [(room_id, start + i, Jsonb(entry)) for i, entry in enumerate(entries)],
                )
            else:  # the whole register in its row, nothing appended after it
                await cur.execute(
                    "INSERT INTO chorus_registers (room_id, data) VALUES (%s, %s) "
                    "ON CONFLICT (room_id) DO UPDATE SET data = EXCLUDED.data",
                    (room_id, Jsonb(register)),
                )
                await cur.execute("DELETE FROM chorus_register_entries WHERE room_id = %s", (room_id,))
            await cur.execute(_MOVED, (room_id,))

    async def revision(self, room_id: str) -> int:
        rows = await self._rows("SELECT revision FROM chorus_revisions WHERE room_id = %s", (room_id,))
        return int(rows[0][0]) if rows else 0

    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        rows = await self._rows(
            "SELECT data FROM chorus_memory_state WHERE room_id = %s AND key = %s", (room_id, key)
        )
        return dict(rows[0][0]) if rows else None

    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        await self._rows(
            "INSERT INTO chorus_memory_state (room_id, key, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (room_id, key) DO UPDATE SET data = EXCLUDED.data",
            (room_id, key, Jsonb(value)),
        )


    # ----------------------------------------------------------------- the voice directory

    async def remember_print(self, name: str, model: str, vector: bytes, source: str
                             ) -> RememberedVoice:
        name = checked_name(name)
        async with self._query_lock, self._conn.transaction(), self._conn.cursor() as cur:
            await cur.execute(
                "INSERT INTO chorus_voices (id, name, created) VALUES (%s, %s, %s) "
                "ON CONFLICT (name) DO NOTHING", (new_voice_id(), name, time.time()))
            await cur.execute("SELECT id FROM chorus_voices WHERE name = %s", (name,))
            row = await cur.fetchone()
            assert row is not None
            voice_id = str(row[0])
            made = new_print(voice_id, model, vector, source)
            await cur.execute(
                "INSERT INTO chorus_voiceprints (id, voice_id, model, vector, source, created) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (made.id, voice_id, made.model, made.vector, made.source, made.created))
            await cur.execute(
                "DELETE FROM chorus_voiceprints WHERE voice_id = %s AND id NOT IN (SELECT id "
                "FROM chorus_voiceprints WHERE voice_id = %s ORDER BY created DESC, id DESC "
                "LIMIT %s)", (voice_id, voice_id, MAX_PRINTS_PER_VOICE))
            await self._moved_voices(cur)
        voice = next((v for v in await self.list_voices() if v.name == name), None)
        assert voice is not None
        return voice

    async def list_voices(self) -> list[RememberedVoice]:
        people = await self._rows("SELECT id, name, created, last_heard FROM chorus_voices")
        prints = await self._rows(
            "SELECT id, voice_id, model, vector, source, created FROM chorus_voiceprints")
        return voices_from_rows(people, prints)

    async def forget_voice(self, voice_id: str) -> bool:
        async with self._query_lock, self._conn.transaction(), self._conn.cursor() as cur:
            await cur.execute("DELETE FROM chorus_voiceprints WHERE voice_id = %s", (voice_id,))
            await cur.execute("DELETE FROM chorus_voices WHERE id = %s", (voice_id,))
            gone = bool(cur.rowcount)
            if gone:
                await self._moved_voices(cur)
            return gone

    @staticmethod
    async def _moved_voices(cur: psycopg.AsyncCursor[Any]) -> None:
        """Inside a change's transaction: the generation moves, and the listeners are told when
        it commits."""
        await cur.execute(_VOICES_MOVED)
        row = await cur.fetchone()
        assert row is not None
        await cur.execute("SELECT pg_notify(%s, %s)", (VOICES_CHANNEL, str(row[0])))

    async def voice_heard(self, voice_id: str, at: float) -> None:
        await self._rows("UPDATE chorus_voices SET last_heard = %s WHERE id = %s", (at, voice_id))

    async def voices_generation(self) -> int:
        rows = await self._rows("SELECT generation FROM chorus_voices_generation WHERE id = 1")
        return int(rows[0][0]) if rows else 0

    async def voices_changed(self, within_s: float) -> None:
        """Return when a `NOTIFY chorus_voices` arrives (any process's change, this one's too),
        or after `within_s` (the listening connection down, or nothing changed)."""
        if self._dsn is not None and self._listener is None:
            self._listener = asyncio.get_running_loop().create_task(
                self._listen(self._dsn), name="chorus-voices-listen"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.add(waiter)
        try:
            await asyncio.wait([waiter], timeout=within_s)
        finally:
            self._waiters.discard(waiter)
            waiter.cancel()

    def _wake(self) -> None:
        for waiter in list(self._waiters):
            if not waiter.done():
                waiter.set_result(None)

    async def _listen(self, dsn: str) -> None:
        """`LISTEN chorus_voices` on a connection of its own, until the store closes; each
        notification (and each new connection: a change may have passed meanwhile) wakes the
        waiters."""
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
                async with conn:
                    await conn.execute(f"LISTEN {VOICES_CHANNEL}")
                    self._wake()
                    async for _ in conn.notifies():
                        self._wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("listening for voice directory changes failed (%s); polling", exc)
            await asyncio.sleep(_RELISTEN_S)


class _AdvisoryLock(AbstractAsyncContextManager[None]):
    def __init__(self, manager: PostgresAdvisoryLocks, room_id: str) -> None:
        self._manager = manager
        self._room_id = room_id
        self._local = manager.local_lock(room_id)

    async def __aenter__(self) -> None:
        await self._local.acquire()
        try:
            await self._manager.acquire(self._room_id)
        except BaseException:
            self._local.release()
            raise

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            await self._manager.release(self._room_id)
        finally:
            self._local.release()


class PostgresAdvisoryLocks(RoomLockManager):
    """Room locks that hold across processes: `pg_try_advisory_lock(hashtextextended(room, 0))`."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], *, poll_interval: float = 0.005) -> None:
        self._conn = conn
        self._poll = poll_interval
        self._query_lock = asyncio.Lock()
        self._local: dict[str, asyncio.Lock] = {}

    @classmethod
    async def connect(cls, dsn: str) -> PostgresAdvisoryLocks:
        return cls(await psycopg.AsyncConnection.connect(dsn, autocommit=True))

    async def close(self) -> None:
        await self._conn.close()

    def local_lock(self, room_id: str) -> asyncio.Lock:
        return self._local.setdefault(room_id, asyncio.Lock())

    def discard(self, room_id: str) -> None:
        lock = self._local.get(room_id)
        if lock is not None and idle(lock):
            del self._local[room_id]

    def lock(self, room_id: str) -> _AdvisoryLock:
        return _AdvisoryLock(self, room_id)

    async def _scalar(self, sql: str, room_id: str) -> bool:
        async with self._query_lock, self._conn.cursor() as cur:
            await cur.execute(sql, (room_id,))
            row = await cur.fetchone()
            return bool(row and row[0])

    async def acquire(self, room_id: str) -> None:
        # Polled, not awaited on the server: another process's release cannot set a local Event.
        while not await self._scalar("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", room_id):  # noqa: ASYNC110
            await asyncio.sleep(self._poll)

    async def release(self, room_id: str) -> None:
        await self._scalar("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", room_id)
