"""The room lock: one writer at a time per room.

Commits (hooks, rank assignment, storing) run under it, so two turns arriving together get their
ranks and their order decided one after the other (rules D3, D6). `InProcessLocks` serves one
process; rooms shared by several processes use `rooms.postgres.PostgresAdvisoryLocks`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from contextlib import AbstractAsyncContextManager
from typing import Any


class RoomLockManager(ABC):
    @abstractmethod
    def lock(self, room_id: str) -> AbstractAsyncContextManager[Any]:
        """An async context manager held while a room is written."""

    def discard(self, room_id: str) -> None:  # noqa: B027 - optional
        """Forget a deleted room's lock, if nobody holds or waits for it."""


def idle(lock: asyncio.Lock) -> bool:
    """Nobody holds the lock and nobody waits for it (a woken waiter may not hold it yet)."""
    return not lock.locked() and not getattr(lock, "_waiters", None)


class InProcessLocks(RoomLockManager):
    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, room_id: str) -> asyncio.Lock:
        lock = self._locks.get(room_id)
        if lock is None:
            lock = self._locks[room_id] = asyncio.Lock()
        return lock

    def discard(self, room_id: str) -> None:
        # A waiter keeps the old lock object: a second lock for the same room must never exist
        # beside it, so an entry someone holds or waits for stays.
        lock = self._locks.get(room_id)
        if lock is not None and idle(lock):
            del self._locks[room_id]
