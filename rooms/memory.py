"""Memory: which past events an agent sees when it is asked to answer.

The attribution engine decides labels per call from exactly this window (rule A1), so the window is
the one thing both must agree on.

A memory is asked in two ways. `retrieve(store, room_id, channel_id)` is what the AI channel calls
on every trigger: it reads what it needs from the store, and `SlidingWindowMemory` reads only its
window (`RoomStore.list_window`, served from an index), so building a context costs the same in a
room of 400 events and in one of 40,000 (issue 14.1). `window(events, channel_id)` is the pure
rule over a list already read. The default `retrieve` reads the whole timeline and applies
`window`, so a memory that needs more than the last N events (a summarizing memory reads the
events that fall out of its window) only has to implement `window`, or can override `retrieve` and
page back with `list_window(..., before=event_id)`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from models import RoomEvent
from rooms.store import RoomStore, window_of


class Memory(ABC):
    @abstractmethod
    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        """The events (oldest first) a channel's model sees, from the room's committed events."""

    async def retrieve(self, store: RoomStore, room_id: str, channel_id: str) -> list[RoomEvent]:
        """The events (oldest first) a channel's model sees for one call, read from the store.

        The default reads the room's whole timeline and applies `window`."""
        return self.window(await store.list_events(room_id), channel_id)


class SlidingWindowMemory(Memory):
    """The last `max_events` events the channel may see (visible to it, or its own)."""

    def __init__(self, max_events: int = 50) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = max_events

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        return window_of(events, channel_id, self.max_events)

    async def retrieve(self, store: RoomStore, room_id: str, channel_id: str) -> list[RoomEvent]:
        return await store.list_window(room_id, channel_id, self.max_events)
