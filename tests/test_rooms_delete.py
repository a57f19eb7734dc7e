"""Deleting a room: the store forgets every row of it (and nothing of other rooms), the kit drops
its delivery state and lock entry, and the room id can be used again as a new room."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from models import InboundMessage, TextContent
from rooms import RoomKit, TextChannel
from rooms.locks import InProcessLocks
from rooms.postgres import PostgresAdvisoryLocks, PostgresStore
from server.testing.harness import eventually
from tests.store_fixtures import KitFactory


async def _fill(kit: RoomKit, room_id: str) -> None:
    """A room with a binding, a routed sender, participants, events and a register."""
    await kit.create_room(room_id=room_id)
    await kit.attach_channel(room_id, "web", group=False)
    await kit.ensure_participant(room_id, "web", f"{room_id}-alice", display_name="Alice")
    await kit.store.set_sender_room("web", f"{room_id}-sender", room_id)
    web = kit.get_channel("web")
    assert isinstance(web, TextChannel)
    await web.send(f"{room_id}-alice", f"hello from {room_id}", room_id=room_id)
    await web.send(f"{room_id}-guest", f"a guest in {room_id}", room_id=room_id)


async def _check_delete(kit: RoomKit) -> None:
    await _fill(kit, "gone")
    await _fill(kit, "kept")
    kept_events = [e.text for e in await kit.list_events("kept")]
    assert len(await kit.list_events("gone")) == 2

    await kit.delete_room("gone")

    store = kit.store
    assert await kit.get_room("gone") is None
    assert [r.id for r in await store.list_rooms()] == ["kept"]
    assert await store.get_bindings("gone") == []
    assert [b.room_id for b in await store.bindings_for_channel("web")] == ["kept"]
    assert await store.find_sender_room("web", "gone-sender") is None
    assert await store.find_sender_room("web", "kept-sender") == "kept"
    assert await store.list_events("gone") == []
    assert await store.get_participants("gone") == []
    assert await store.get_register("gone") is None
    # the other room is untouched
    assert [e.text for e in await kit.list_events("kept")] == kept_events
    assert [p.id for p in await store.get_participants("kept")] == ["kept-alice"]
    assert await store.get_register("kept") is not None

    # the id may be used again: a new, empty room
    await kit.delete_room("gone")  # deleting what is not there is no error
    await kit.create_room(room_id="gone")
    assert await kit.list_events("gone") == []
    assert await kit.get_participants("gone") == []
    await kit.attach_channel("gone", "web")
    web = kit.get_channel("web")
    assert isinstance(web, TextChannel)
    result = await web.send("newcomer", "fresh start", room_id="gone")
    assert result.event is not None
    assert [e.text for e in await kit.list_events("gone")] == ["fresh start"]


async def test_delete_room_on_every_store(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await _check_delete(kit)


async def test_delete_room_drops_the_kits_delivery_state_and_lock_entry() -> None:
    locks = InProcessLocks()
    kit = RoomKit(locks=locks)
    kit.register_channel(TextChannel("web"))
    await _fill(kit, "r")
    assert "r" in kit._deliveries and "r" in locks._locks
    await kit.delete_room("r")
    assert "r" not in kit._deliveries
    assert "r" not in locks._locks


async def test_delete_room_keeps_a_lock_someone_is_waiting_for() -> None:
    """A commit waiting on the room lock keeps the same lock object: no second lock appears."""
    locks = InProcessLocks()
    kit = RoomKit(locks=locks)
    await kit.create_room(room_id="r")
    lock = locks.lock("r")
    await lock.acquire()
    deleting = asyncio.create_task(kit.delete_room("r"))
    await eventually(lambda: waiting_on(lock) == 1, what="the deletion to wait for the lock")
    waiter = asyncio.create_task(lock.acquire())
    await eventually(lambda: waiting_on(lock) == 2, what="a second waiter")
    lock.release()
    await deleting
    assert locks._locks.get("r") is lock  # the waiter still needs it
    await waiter
    lock.release()


async def test_a_stream_of_inbound_messages_after_delete_routes_to_a_new_room(
    new_kit: KitFactory,
) -> None:
    """A sender routed to a deleted room gets a room of their own again (its sender row is gone)."""
    kit = await new_kit()
    kit.register_channel(TextChannel("sms"))
    first = await kit.process_inbound(
        InboundMessage(channel_id="sms", sender_id="+1", content=TextContent(body="hi"))
    )
    await kit.delete_room(first.room_id)
    again = await kit.process_inbound(
        InboundMessage(channel_id="sms", sender_id="+1", content=TextContent(body="back"))
    )
    assert again.room_id != first.room_id
    assert [e.text for e in await kit.list_events(again.room_id)] == ["back"]


async def test_delete_room_on_postgres_removes_every_table_row(postgres_database: str) -> None:
    store = await PostgresStore.connect(postgres_database)
    locks = await PostgresAdvisoryLocks.connect(postgres_database)
    kit = RoomKit(store=store, locks=locks)
    kit.register_channel(TextChannel("web"))
    try:
        await _check_delete(kit)
        # row by row: nothing of the deleted room is left in any table
        await kit.delete_room("gone")
        async with await psycopg.AsyncConnection.connect(postgres_database, autocommit=True) as conn:
            for table, column in [
                ("chorus_rooms", "id"),
                ("chorus_bindings", "room_id"),
                ("chorus_senders", "room_id"),
                ("chorus_events", "room_id"),
                ("chorus_participants", "room_id"),
                ("chorus_registers", "room_id"),
            ]:
                cur = await conn.execute(
                    f"SELECT count(*) FROM {table} WHERE {column} = %s", ("gone",)
                )
                row = await cur.fetchone()
                assert row is not None and row[0] == 0, table
                cur = await conn.execute(
                    f"SELECT count(*) FROM {table} WHERE {column} = %s", ("kept",)
                )
                row = await cur.fetchone()
                assert row is not None and row[0] > 0, table
    finally:
        await store.close()
        await locks.close()


async def test_deleting_a_room_tells_its_channels_and_closes_a_realtime_session() -> None:
    from realtime import ContextItem, RealtimeChannel
    from rooms import Channel

    class Keeper(Channel):
        def __init__(self) -> None:
            super().__init__("keeper")
            self.detached: list[str] = []

        async def on_detach(self, room_id: str) -> None:
            self.detached.append(room_id)

    kit = RoomKit()
    keeper, rt = Keeper(), RealtimeChannel("rt", "recorder")
    kit.register_channel(keeper)
    kit.register_channel(rt)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "keeper")
    await kit.attach_channel("r", "rt")
    session = rt.session_for("r")
    await kit.delete_room("r")
    assert keeper.detached == ["r"]
    with pytest.raises(KeyError):
        rt.lines_for("r")
    with pytest.raises(RuntimeError, match="session is closed"):
        await session.add_item(ContextItem("user", "late"))
    await kit.create_room(room_id="r")  # the same id again: a new room, a new session
    await kit.attach_channel("r", "rt")
    assert rt.session_for("r") is not session
    await kit.close()


class _Remembering(TextChannel):
    """A channel that keeps per-room state, as the realtime channel keeps a session."""

    def __init__(self, channel_id: str) -> None:
        super().__init__(channel_id)
        self.rooms: set[str] = set()

    async def on_attach(self, room_id: str) -> None:
        self.rooms.add(room_id)

    async def on_detach(self, room_id: str) -> None:
        self.rooms.discard(room_id)


async def test_release_room_frees_live_state_and_keeps_every_stored_thing(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    keeper = _Remembering("keeper")
    kit.register_channel(keeper)
    await _fill(kit, "r")
    await kit.attach_channel("r", "keeper")
    before = (
        await kit.list_events("r"),
        await kit.get_participants("r"),
        await kit.store.get_register("r"),
        await kit.store.get_bindings("r"),
    )
    assert "r" in kit._deliveries and keeper.rooms == {"r"}
    await kit.release_room("r")
    assert "r" not in kit._deliveries and keeper.rooms == set()  # live state gone
    after = (
        await kit.list_events("r"),
        await kit.get_participants("r"),
        await kit.store.get_register("r"),
        await kit.store.get_bindings("r"),
    )
    assert after == before  # nothing stored is lost
    # The room continues: the channel is attached again, new turns come after the old ones.
    await kit.attach_channel("r", "keeper")
    web = kit.get_channel("web")
    assert isinstance(web, TextChannel)
    await web.send("r-alice", "back again", room_id="r")
    events = await kit.list_events("r")
    assert events[: len(before[0])] == before[0] and events[-1].text == "back again"
    assert keeper.rooms == {"r"}


def waiting_on(lock: asyncio.Lock) -> int:
    """How many tasks wait to acquire `lock` (asyncio keeps them in `_waiters`)."""
    return len(getattr(lock, "_waiters", None) or ())
