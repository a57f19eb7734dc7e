"""The room runtime: the RoomKit hub, rooms, routing, hooks, channels, memory, stores and locks.

Owns how events enter a room, in what order they are committed and delivered, the AI channel
that answers them, and the connect/retry policy (`Backoff`) of channels that hold a connection. Imports `models` and `attribution` only; voice, diarization, realtime and the
server build on it.
"""

from rooms.ai import AIChannel, AIProvider, AIResponse, MockAIProvider
from rooms.channel import AudioSink, Channel, RoomContext, TextChannel
from rooms.hooks import HookContext, HookResult, HookTrigger
from rooms.kit import InboundResult, RoomKit, RoutingError
from rooms.locks import InProcessLocks, RoomLockManager
from rooms.memory import Memory, SlidingWindowMemory
from rooms.retry import Backoff
from rooms.store import ChannelBinding, InMemoryStore, Room, RoomStore

__all__ = [
    "AIChannel",
    "AIProvider",
    "AIResponse",
    "AudioSink",
    "Backoff",
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
    "Room",
    "RoomContext",
    "RoomKit",
    "RoomLockManager",
    "RoomStore",
    "RoutingError",
    "SlidingWindowMemory",
    "TextChannel",
]
