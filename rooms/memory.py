"""Memory: which past events an agent sees when it is asked to answer.

The attribution engine decides labels per call from exactly this window (rule A1), so the window is
the one thing both must agree on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from models import RoomEvent


class Memory(ABC):
    @abstractmethod
    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        """The events (oldest first) a channel's model sees, from the room's committed events."""


class SlidingWindowMemory(Memory):
    """The last `max_events` message events the channel may see."""

    def __init__(self, max_events: int = 50) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = max_events

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        visible = [e for e in events if e.visible_to(channel_id) or e.source.channel_id == channel_id]
        return visible[-self.max_events :]
