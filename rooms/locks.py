"""The room lock: one writer at a time per room.

Commits (hooks, rank assignment, storing) run under it, so two turns arriving together get their
ranks and their order decided one after the other (rules D3, D6). `InProcessLocks` serves one
process; a store shared across processes needs a distributed lock with the same interface.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class RoomLockManager(ABC):
    @abstractmethod
    def lock(self, room_id: str) -> asyncio.Lock | _AsyncLockLike:
        """An async context manager held while a room is written."""


class _AsyncLockLike(ABC):
    @abstractmethod
    async def __aenter__(self) -> None: ...
    @abstractmethod
    async def __aexit__(self, *exc: object) -> None: ...


class InProcessLocks(RoomLockManager):
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, room_id: str) -> asyncio.Lock:
        lock = self._locks.get(room_id)
        if lock is None:
            lock = self._locks[room_id] = asyncio.Lock()
        return lock


@asynccontextmanager
async def held(manager: RoomLockManager, room_id: str) -> AsyncIterator[None]:
    async with manager.lock(room_id):
        yield
