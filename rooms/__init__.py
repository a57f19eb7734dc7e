"""The room runtime: the RoomKit hub, rooms, routing, hooks, channels, memory, stores and locks.

Owns how events enter a room, in what order they are committed and delivered, and the AI channel
that answers them. Imports `models` and `attribution` only; voice, diarization, realtime and the
server build on it.
"""

from rooms.ai import AIChannel, AIProvider, AIResponse, MockAIProvider
from rooms.channel import AudioSink, Channel, RoomContext, TextChannel
from rooms.hooks import HookContext, HookResult, HookTrigger
from rooms.kit import InboundResult, RoomKit, RoutingError
from rooms.locks import InProcessLocks, RoomLockManager
from rooms.memory import Memory, SlidingWindowMemory
from rooms.sqlite import SQLiteStore
from rooms.store import (
    ChannelBinding,
    InMemoryStore,
    OpenedStore,
    Room,
    RoomStore,
    StoredEvent,
    open_store,
)

__all__ = [
    "AIChannel",
    "AIProvider",
    "AIResponse",
    "AudioSink",
    "Channel",
    "ChannelBinding",
    "HookContext",
    "HookResult",
    "HookTrigger",
    "InMemoryStore",
    "InProcessLocks",
    "InboundResult",
    "Memory",
    "MockAIProvider",
    "OpenedStore",
    "Room",
    "RoomContext",
    "RoomKit",
    "RoomLockManager",
    "RoomStore",
    "RoutingError",
    "SQLiteStore",
    "SlidingWindowMemory",
    "StoredEvent",
    "TextChannel",
    "open_store",
]
