"""G4: what a memory keeps with a room (a running summary) lives in the room's store: it survives
what the store survives and is forgotten with the room (in memory and in Postgres)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from rooms import InMemoryStore, Room, RoomStore
from rooms.postgres import PostgresStore
from tests.store_fixtures import fresh_postgres_database


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[RoomStore]:
    if request.param == "memory":
        yield InMemoryStore()
        return
    dsn = await fresh_postgres_database(request.getfixturevalue("postgres_dsn"))
    pg = await PostgresStore.connect(dsn)
    try:
        yield pg
    finally:
        await pg.close()


async def test_G4_memory_state_round_trips_per_room_and_key(store: RoomStore) -> None:
    await store.create_room(Room(id="r1"))
    await store.create_room(Room(id="r2"))
    assert await store.get_memory_state("r1", "summary:ai") is None
    value = {"summary": "Alice proposed Tuesday.", "through": "e7", "names": ["Alice"]}
    await store.put_memory_state("r1", "summary:ai", value)
    value["summary"] = "changed by the caller"  # the store kept its own copy
    assert (await store.get_memory_state("r1", "summary:ai")) == {
        "summary": "Alice proposed Tuesday.",
        "through": "e7",
        "names": ["Alice"],
    }
    assert await store.get_memory_state("r1", "summary:other") is None
    assert await store.get_memory_state("r2", "summary:ai") is None
    await store.put_memory_state("r1", "summary:ai", {"summary": "v2"})
    assert await store.get_memory_state("r1", "summary:ai") == {"summary": "v2"}


async def test_G4_memory_state_is_forgotten_with_the_room(store: RoomStore) -> None:
    await store.create_room(Room(id="r1"))
    await store.put_memory_state("r1", "summary:ai", {"summary": "s"})
    await store.delete_room("r1")
    assert await store.get_memory_state("r1", "summary:ai") is None


async def test_G4_memory_state_survives_a_new_store_on_the_same_database(
    postgres_database: str,
) -> None:
    first = await PostgresStore.connect(postgres_database)
    await first.create_room(Room(id="r"))
    await first.put_memory_state("r", "summary:ai", {"summary": "kept"})
    await first.close()
    second = await PostgresStore.connect(postgres_database)
    try:
        assert await second.get_memory_state("r", "summary:ai") == {"summary": "kept"}
    finally:
        await second.close()
