"""Realtime LLM sessions in rooms (spec voice.md R1–R6, attribution.md G1, G3, G6).

Owns: realtime model sessions behind one interface (`RealtimeSession`: OpenAI Realtime through the
`openai` package, Gemini Live through `google-genai` (the `openai` and `gemini` extras), and the
key-less `RecorderSession`, which needs neither), the
`RealtimeChannel` that feeds them labelled lines and diarized audio turns from a room and posts
their replies back, speak policies, `replay_turns` (used by `chorus transcribe --realtime` and the
demo), and local servers speaking the providers' wire formats for tests (`realtime.testing`).

Imports `models`, `attribution`, `rooms` (and `voice` only for audio codecs) — never the server.
"""

from realtime.channel import RealtimeChannel
from realtime.policy import (
    AllOf,
    AnswerAlways,
    AnswerNever,
    AnswerOnly,
    AnswerWhenAddressed,
    AnswerWhenAlone,
    AnyOf,
    SpeakPolicy,
    SpeakTurn,
    default_policy,
)
from realtime.providers import (
    PROVIDERS,
    GeminiLiveSessionFactory,
    OpenAIRealtimeSessionFactory,
    RecorderSessionFactory,
    SessionFactory,
    make_session,
)
from realtime.recorder import RecorderSession
from realtime.replay import ReplayResult, replay_turns
from realtime.session import (
    ContextItem,
    RealtimeSession,
    ReplyAudio,
    ReplyDone,
    ReplyStarted,
    ReplyTranscript,
    SentEvent,
    SessionCounts,
    SessionError,
    SessionFailed,
    SessionOptions,
    SessionReconnected,
)

__all__ = [
    "PROVIDERS",
    "AllOf",
    "AnswerAlways",
    "AnswerNever",
    "AnswerOnly",
    "AnswerWhenAddressed",
    "AnswerWhenAlone",
    "AnyOf",
    "ContextItem",
    "GeminiLiveSessionFactory",
    "OpenAIRealtimeSessionFactory",
    "RealtimeChannel",
    "RealtimeSession",
    "RecorderSession",
    "RecorderSessionFactory",
    "ReplayResult",
    "ReplyAudio",
    "ReplyDone",
    "ReplyStarted",
    "ReplyTranscript",
    "SentEvent",
    "SessionCounts",
    "SessionError",
    "SessionFactory",
    "SessionFailed",
    "SessionOptions",
    "SessionReconnected",
    "SpeakPolicy",
    "SpeakTurn",
    "default_policy",
    "make_session",
    "replay_turns",
]
