"""The per-room speech pipeline the server runs: voice channel, diarization stage, realtime channel.

Owns turning a `ServerConfig` into the channels of a room and into one audio session per stream,
and nothing else: `server.live` only sees `Pipeline.attach_room`, `Pipeline.open_stream` and the
`StreamAudio` it returns (`push` raw frames, `finish` to flush the last turns). Models are loaded
once per server and shared by every room; model work runs off the event loop inside the voice
channel (V, P rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from rooms import RoomKit


@dataclass(frozen=True)
class StreamInfo:
    room_id: str
    stream_id: str
    participant: str
    name: str | None
    shared_mic: bool
    sample_rate: int
    encoding: str
    channels: int


class StreamAudio(Protocol):
    """One stream's audio session in its room's voice channel."""

    session_id: str
    """The `voice_session_id` the session's turns carry."""

    async def push(self, frame: bytes) -> None:
        """Raw audio as received (pcm16 or µ-law, interleaved channels, any frame size)."""
        ...

    async def finish(self) -> None:
        """End of stream: flush the last turns and close the session."""
        ...


class Pipeline(Protocol):
    async def attach_room(self, kit: RoomKit, room_id: str) -> None: ...

    async def open_stream(self, kit: RoomKit, info: StreamInfo) -> StreamAudio: ...

    async def close(self) -> None: ...
