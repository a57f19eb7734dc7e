"""Chorus inside LiveKit (spec: issue 11, docs/livekit.md).

Owns: the `chorus agent` worker (a livekit-agents 1.x `AgentServer` whose `rtc_session` job makes
one Chorus room per LiveKit room: every subscribed remote audio track a voice session, shared
microphones split into speakers, SIP callers and one-person participants named, each turn
published back on `lk.transcription`, the realtime channel's reply audio published as the agent's
track, the chat model's and ACP agent's answers on `lk.chat`, the room kept in the `[store]`), and the pieces a LiveKit `AgentSession` can use directly: `DiarizingSTT` (a
`livekit.agents.stt.STT` around any Chorus STT and diarization stage, one `SpeechEvent` per speaker
run with `speaker_id` set) and `AttributedAgent` / `attributed_chat_context` (the LLM reads chat
history rendered by the attribution engine).

Sits on top like `server`: imports models, attribution, rooms, voice, diarization, realtime and
`server.config`, `server.pipeline`, `server.load`, `server.voices`, `server.overload`,
`server.stage_guard` and `server.protocol` (the same config file, the same STT, realtime, chat,
agent and enrollment builders, the same voice directory, the same overload policy applied the same
way when a shared mic's stage falls behind, the same status and suggestion messages, and the same
load figure as `chorus serve`: `worker.WorkerLoad` is the worker's `load_fnc`); nothing imports it
but the `chorus agent` command. Named `livekit_worker`, not `livekit`, which would shadow the library.
"""

from livekit_worker.chat_context import AttributedAgent, attributed_chat_context, to_chat_context
from livekit_worker.config import LiveKitConfig, load_agent_config
from livekit_worker.participants import Speaker, display_name, is_shared_mic, speaker_of
from livekit_worker.room_agent import ChorusRoomAgent, PublishedTranscription
from livekit_worker.stt_adapter import DiarizingStream, DiarizingSTT

__all__ = [
    "AttributedAgent",
    "ChorusRoomAgent",
    "DiarizingSTT",
    "DiarizingStream",
    "LiveKitConfig",
    "PublishedTranscription",
    "Speaker",
    "attributed_chat_context",
    "display_name",
    "is_shared_mic",
    "load_agent_config",
    "speaker_of",
    "to_chat_context",
]
