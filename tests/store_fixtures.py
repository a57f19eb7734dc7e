"""Every store the rooms and attribution tests run on: in memory, SQLite (a temporary file) and
Postgres (a throwaway server from `tests.postgres_server`, one per test session).

A test asks for `new_kit` / `new_store` (this module is a pytest plugin, see `conftest.py`); each
test that asks for them runs once per store. `postgres_dsn` is the session's server and
`postgres_database` a new, empty database on it. Postgres tests get an empty schema each time, and their kits take
the room lock from Postgres advisory locks, as `chorus serve` does with a `postgresql://` store.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from rooms import InMemoryStore, RoomKit, RoomStore
from rooms.postgres import PostgresAdvisoryLocks, PostgresStore
from rooms.sqlite import SQLiteStore
from tests.postgres_server import postgres_server

STORES = ["memory", "sqlite", "postgres"]

StoreFactory = Callable[[], Awaitable[RoomStore]]
KitFactory = Callable[..., Awaitable[RoomKit]]


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    with postgres_server() as dsn:
        yield dsn


_databases = itertools.count()


async def fresh_postgres_database(dsn: str) -> str:
    """A new, empty database on the test server; its DSN."""
    name = f"chorus_test_{os.getpid()}_{next(_databases)}"
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(f"CREATE DATABASE {name}")
    return dsn.replace("dbname=postgres", f"dbname={name}")


@pytest.fixture
async def postgres_database(postgres_dsn: str) -> str:
    """A new, empty database on the session's test server: its DSN."""
    return await fresh_postgres_database(postgres_dsn)


def postgres_url(dsn: str) -> str:
    """`host=… port=… user=… dbname=…` as the `postgresql://` URL `[store] url` takes."""
    parts = dict(item.split("=", 1) for item in dsn.split())
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"


@pytest.fixture(params=STORES)
async def new_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[StoreFactory]:
    """A factory of fresh, empty stores of one kind (Postgres: a new database each)."""
    kind: str = request.param
    opened: list[Any] = []
    dsns: list[str] = []

    async def make() -> RoomStore:
        store: RoomStore
        if kind == "memory":
            store = InMemoryStore()
        elif kind == "sqlite":
            store = await SQLiteStore.open(tmp_path / f"chorus-{len(opened)}.db")
        else:
            dsn = await fresh_postgres_database(request.getfixturevalue("postgres_dsn"))
            dsns.append(dsn)
            store = await PostgresStore.connect(dsn)
        opened.append(store)
        return store

    make.dsns = dsns  # type: ignore[attr-defined]

    make.kind = kind  # type: ignore[attr-defined]
    yield make
    for store in opened:
        close = getattr(store, "close", None)
        if close is not None:
            await close()


@pytest.fixture
async def new_kit(request: pytest.FixtureRequest, new_store: StoreFactory) -> AsyncIterator[KitFactory]:
    """`await new_kit(**RoomKit options)`: a kit on a fresh store of the test's kind."""
    locks: list[PostgresAdvisoryLocks] = []

    async def make(**options: Any) -> RoomKit:
        store = await new_store()
        if isinstance(store, PostgresStore):
            lock = await PostgresAdvisoryLocks.connect(new_store.dsns[-1])  # type: ignore[attr-defined]
            locks.append(lock)
            options.setdefault("locks", lock)
        return RoomKit(store=store, **options)

    yield make
    for lock in locks:
        await lock.close()
