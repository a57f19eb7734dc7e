"""Where rooms keep what they hold: rooms, bindings, events, participants, the register
and what memories keep with a room (running summaries).

`RoomStore` is the interface; `InMemoryStore` is the default for one process. A store shared by
several processes must be paired with a distributed lock (see `rooms.locks`), because the
attribution register is read and written under the room lock (rule D6). The register is stored
as the JSON the attribution engine produces: salted digests only.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from models import Participant, RoomEvent


class ChannelBinding(BaseModel):
    room_id: str
    channel_id: str
    group: bool = False
    """A group binding routes every sender on the channel into this room (a bridge, a group chat)."""


class Room(BaseModel):
    id: str
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime = Field(default_factory=lambda: datetime.now(UTC))


class RoomStore(ABC):
    @abstractmethod
    async def create_room(self, room: Room) -> None: ...
    @abstractmethod
    async def get_room(self, room_id: str) -> Room | None: ...
    @abstractmethod
    async def list_rooms(self) -> list[Room]: ...
    @abstractmethod
    async def delete_room(self, room_id: str) -> None:
        """Forget everything kept for the room: the room, its bindings, the senders routed to it,
        its events, participants and register. A room that is not there is no error."""

    @abstractmethod
    async def add_binding(self, binding: ChannelBinding) -> None: ...
    @abstractmethod
    async def get_bindings(self, room_id: str) -> list[ChannelBinding]: ...
    @abstractmethod
    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]: ...

    @abstractmethod
    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None: ...
    @abstractmethod
    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None: ...

    @abstractmethod
    async def add_event(self, event: RoomEvent) -> None: ...
    @abstractmethod
    async def replace_event(self, event: RoomEvent) -> None: ...
    @abstractmethod
    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None: ...
    @abstractmethod
    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        """Committed events, oldest first; with `limit`, the newest `limit` of them."""

    @abstractmethod
    async def upsert_participant(self, room_id: str, participant: Participant) -> None: ...
    @abstractmethod
    async def get_participants(self, room_id: str) -> list[Participant]: ...

    @abstractmethod
    async def get_register(self, room_id: str) -> dict[str, Any] | None: ...
    @abstractmethod
    async def put_register(self, room_id: str, register: dict[str, Any]) -> None: ...

    @abstractmethod
    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        """What a memory kept for the room under `key` (a running summary, G4), or None."""

    @abstractmethod
    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        """Keep `value` (JSON) for the room under `key`, replacing what was there; deleting the
        room forgets it."""


class InMemoryStore(RoomStore):
    """Everything in dictionaries; returns copies so callers cannot change stored state."""

    def __init__(self) -> None:
        self._rooms: dict[str, Room] = {}
        self._bindings: dict[str, dict[str, ChannelBinding]] = {}
        self._senders: dict[tuple[str, str], str] = {}
        self._events: dict[str, list[RoomEvent]] = {}
        self._event_index: dict[tuple[str, str], int] = {}
        self._participants: dict[str, dict[str, Participant]] = {}
        self._registers: dict[str, dict[str, Any]] = {}
        self._memory_states: dict[str, dict[str, dict[str, Any]]] = {}

    async def create_room(self, room: Room) -> None:
        if room.id in self._rooms:
            raise ValueError(f"room {room.id!r} already exists")
        self._rooms[room.id] = room.model_copy(deep=True)
        self._events[room.id] = []

    async def get_room(self, room_id: str) -> Room | None:
        room = self._rooms.get(room_id)
        return room.model_copy(deep=True) if room else None

    async def list_rooms(self) -> list[Room]:
        return [r.model_copy(deep=True) for r in self._rooms.values()]

    async def delete_room(self, room_id: str) -> None:
        self._rooms.pop(room_id, None)
        self._bindings.pop(room_id, None)
        for key in [k for k, room in self._senders.items() if room == room_id]:
            del self._senders[key]
        for event in self._events.pop(room_id, []):
            self._event_index.pop((room_id, event.id), None)
        self._participants.pop(room_id, None)
        self._registers.pop(room_id, None)
        self._memory_states.pop(room_id, None)

    async def add_binding(self, binding: ChannelBinding) -> None:
        self._bindings.setdefault(binding.room_id, {})[binding.channel_id] = binding.model_copy()

    async def get_bindings(self, room_id: str) -> list[ChannelBinding]:
        return [b.model_copy() for b in self._bindings.get(room_id, {}).values()]

    async def bindings_for_channel(self, channel_id: str) -> list[ChannelBinding]:
        return [
            b.model_copy()
            for bindings in self._bindings.values()
            for b in bindings.values()
            if b.channel_id == channel_id
        ]

    async def find_sender_room(self, channel_id: str, sender_id: str) -> str | None:
        return self._senders.get((channel_id, sender_id))

    async def set_sender_room(self, channel_id: str, sender_id: str, room_id: str) -> None:
        self._senders[(channel_id, sender_id)] = room_id

    async def add_event(self, event: RoomEvent) -> None:
        events = self._events.setdefault(event.room_id, [])
        self._event_index[(event.room_id, event.id)] = len(events)
        events.append(event.model_copy(deep=True))

    async def replace_event(self, event: RoomEvent) -> None:
        index = self._event_index.get((event.room_id, event.id))
        if index is None:
            raise KeyError(f"no event {event.id!r} in room {event.room_id!r}")
        self._events[event.room_id][index] = event.model_copy(deep=True)

    async def get_event(self, room_id: str, event_id: str) -> RoomEvent | None:
        index = self._event_index.get((room_id, event_id))
        return None if index is None else self._events[room_id][index].model_copy(deep=True)

    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        events = self._events.get(room_id, [])
        if limit is not None:
            events = events[-limit:] if limit > 0 else []
        return [e.model_copy(deep=True) for e in events]

    async def upsert_participant(self, room_id: str, participant: Participant) -> None:
        self._participants.setdefault(room_id, {})[participant.id] = participant.model_copy(deep=True)

    async def get_participants(self, room_id: str) -> list[Participant]:
        return [p.model_copy(deep=True) for p in self._participants.get(room_id, {}).values()]

    async def get_register(self, room_id: str) -> dict[str, Any] | None:
        data = self._registers.get(room_id)
        return copy.deepcopy(data) if data is not None else None

    async def put_register(self, room_id: str, register: dict[str, Any]) -> None:
        self._registers[room_id] = copy.deepcopy(register)

    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None:
        value = self._memory_states.get(room_id, {}).get(key)
        return copy.deepcopy(value) if value is not None else None

    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None:
        self._memory_states.setdefault(room_id, {})[key] = copy.deepcopy(value)
