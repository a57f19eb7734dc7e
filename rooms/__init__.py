"""The room runtime: the RoomKit hub, rooms, routing, hooks, channels, memory, stores and locks.

Owns how events enter a room, in what order they are committed and delivered, and the AI channel
that answers them: its memories (a sliding window, or older turns folded into a running summary
kept with the room, G4), the speak policies that decide whether an agent answers (G6, shared with
the realtime channel), delegation of a task from one agent channel to another (G5), the stores
(in-memory, SQLite, Postgres), each room's participants and register kept in memory between
commits (`rooms.roster`), and the connect/retry policy (`Backoff`) of channels that hold a
connection, and the voice directory's storage (`rooms.voices`: named voiceprints, issue 27).
Imports `models` and `attribution` only; voice, diarization, realtime and the server build on it.
"""

from rooms.ai import AIChannel, AIProvider, AIResponse, MockAIProvider
from rooms.channel import AudioSink, Channel, RoomContext, TextChannel, TurnAudioSource
from rooms.delegation import Delegation, TaskWorker, delegate_task
from rooms.hooks import AgentStatus, AgentStatusBoard, HookContext, HookResult, HookTrigger
from rooms.kit import ChannelDeliveryStats, InboundResult, RoomKit, RoutingError, open_kit
from rooms.locks import InProcessLocks, RoomLockManager
from rooms.memory import (
    CompactingMemory,
    Memory,
    Recall,
    SlidingWindowMemory,
    Summarizer,
    SummarizingMemory,
)
from rooms.policy import (
    AnswerAlways,
    AnswerNever,
    AnswerOnly,
    AnswerWhenAddressed,
    AnswerWhenAlone,
    SpeakPolicy,
    SpeakTurn,
)
from rooms.retry import Backoff
from rooms.sqlite import SQLiteDirectory, SQLiteInUse, SQLiteLock, SQLiteStore
from rooms.store import (
    ChannelBinding,
    InMemoryStore,
    OpenedDirectory,
    OpenedStore,
    Room,
    RoomStore,
    StoredEvent,
    open_directory,
    open_store,
)
from rooms.voices import InMemoryVoices, RememberedVoice, Voiceprint, VoiceStore

__all__ = [
    "AIChannel",
    "AIProvider",
    "AIResponse",
    "AgentStatus",
    "AgentStatusBoard",
    "AnswerAlways",
    "AnswerNever",
    "AnswerOnly",
    "AnswerWhenAddressed",
    "AnswerWhenAlone",
    "AudioSink",
    "Backoff",
    "Channel",
    "ChannelBinding",
    "ChannelDeliveryStats",
    "CompactingMemory",
    "Delegation",
    "HookContext",
    "HookResult",
    "HookTrigger",
    "InMemoryStore",
    "InMemoryVoices",
    "InProcessLocks",
    "InboundResult",
    "Memory",
    "MockAIProvider",
    "OpenedDirectory",
    "OpenedStore",
    "Recall",
    "RememberedVoice",
    "Room",
    "RoomContext",
    "RoomKit",
    "RoomLockManager",
    "RoomStore",
    "RoutingError",
    "SQLiteDirectory",
    "SQLiteInUse",
    "SQLiteLock",
    "SQLiteStore",
    "SlidingWindowMemory",
    "SpeakPolicy",
    "SpeakTurn",
    "StoredEvent",
    "Summarizer",
    "SummarizingMemory",
    "TaskWorker",
    "TextChannel",
    "TurnAudioSource",
    "VoiceStore",
    "Voiceprint",
    "delegate_task",
    "open_directory",
    "open_kit",
    "open_store",
]
