"""Rooms shared by several processes: the Postgres store and advisory room locks (rule D6)."""

from __future__ import annotations

import asyncio
import json

import psycopg

from attribution import label_for
from models import RoomEvent
from rooms import HookContext, HookTrigger, RoomKit, TextChannel
from rooms.postgres import PostgresAdvisoryLocks, PostgresStore
from server.testing.harness import eventually


async def process_kit(dsn: str) -> tuple[RoomKit, TextChannel]:
    """One 'process': its own store connection, its own lock connection, its own channels."""
    kit = RoomKit(store=await PostgresStore.connect(dsn), locks=await PostgresAdvisoryLocks.connect(dsn))
    web = TextChannel("web")
    kit.register_channel(web)

    @kit.hook(HookTrigger.BEFORE_BROADCAST)
    async def slow_moderation(event: RoomEvent, ctx: HookContext) -> None:
        await asyncio.sleep(0.02)  # work under the room lock widens the window for a lost update

    return kit, web


async def test_D6_two_processes_share_one_room_and_one_register(postgres_database: str) -> None:
    kit_a, web_a = await process_kit(postgres_database)
    kit_b, web_b = await process_kit(postgres_database)
    await kit_a.create_room(room_id="r")
    await kit_a.attach_channel("r", "web", group=True)
    await kit_a.ensure_participant("r", "web", "u-alice", display_name="Alice")
    # Look-alike senders arrive through both processes at once: ranks must be decided one commit at
    # a time across processes, so every source gets its own rank and no two share a label.
    names = ["ALICE", "Аlice", "alice", "aLiCe", "Alice"]
    sends = [
        (web_a if i % 2 else web_b).send(f"guest-{i}", f"hello {i}", room_id="r", metadata={"sender_name": n})
        for i, n in enumerate(names)
    ]
    await asyncio.gather(*sends)
    await web_a.send("u-alice", "I am the registered one", room_id="r")
    events = await kit_b.list_events("r")
    assert len(events) == len(names) + 1
    participants = await kit_b.get_participants("r")
    register = await kit_b.get_register("r")
    assert register is not None
    labels = {e.source.participant_id: label_for(e, participants, register) for e in events}
    assert labels["u-alice"] == "Alice"
    assert len(set(labels.values())) == len(labels)
    ranks = sorted(int(labels[f"guest-{i}"].rsplit("(", 1)[1].rstrip(")")) for i in range(len(names)))
    assert ranks == list(range(2, len(names) + 2))


async def test_D6_stored_register_holds_digests_only(postgres_database: str) -> None:
    kit, web = await process_kit(postgres_database)
    await kit.create_room(room_id="r")
    await kit.ensure_participant("r", "web", "user-4711", display_name="Marguerite")
    await web.send("user-4711", "hi", room_id="r")
    await web.send("guest-0815", "yo", room_id="r", metadata={"sender_name": "Bartholomew"})
    async with await psycopg.AsyncConnection.connect(postgres_database) as conn:
        cur = await conn.execute("SELECT data::text FROM chorus_registers WHERE room_id = 'r'")
        row = await cur.fetchone()
    assert row is not None
    stored = row[0]
    json.loads(stored)
    for secret in ("user-4711", "guest-0815", "Marguerite", "marguerite", "Bartholomew", "bartholomew"):
        assert secret not in stored


async def test_advisory_lock_excludes_another_process(postgres_database: str) -> None:
    a = await PostgresAdvisoryLocks.connect(postgres_database)
    b = await PostgresAdvisoryLocks.connect(postgres_database)
    order: list[str] = []
    refused = refusals_of(b)
    async with a.lock("r"):
        waiter = asyncio.create_task(_hold(b, "r", order))
        # b has asked Postgres for the room and been refused (it polls): no sleep, the refusal
        await eventually(lambda: refused[0] >= 1 or waiter.done(), 30, "b to be refused")
        assert order == []  # b cannot enter while a holds the room
        order.append("a-leaves")
    await asyncio.wait_for(waiter, 30)
    assert order == ["a-leaves", "b-entered"]
    async with a.lock("other-room"), b.lock("r"):  # different rooms never wait on each other
        pass


def refusals_of(locks: PostgresAdvisoryLocks) -> list[int]:
    """Count the times Postgres refused `locks` a room (`pg_try_advisory_lock` gave false)."""
    refused = [0]
    ask = locks._scalar

    async def counting(sql: str, room_id: str) -> bool:
        granted = await ask(sql, room_id)
        if "pg_try_advisory_lock" in sql and not granted:
            refused[0] += 1
        return granted

    locks._scalar = counting  # type: ignore[method-assign]
    return refused


async def _hold(locks: PostgresAdvisoryLocks, room: str, order: list[str]) -> None:
    async with locks.lock(room):
        order.append("b-entered")


async def test_store_round_trips_events_and_replacement(postgres_database: str) -> None:
    kit, web = await process_kit(postgres_database)
    await kit.create_room(room_id="r")
    result = await web.send("u", "draft", room_id="r", metadata={"sender_name": "Alice"})
    assert result.event is not None
    from models import TextContent

    await kit.update_event("r", result.event.id, content=TextContent(body="final"))
    other, _ = await process_kit(postgres_database)
    assert [e.text for e in await other.list_events("r")] == ["final"]
    assert [e.text for e in await other.list_events("r", limit=0)] == []
