"""Helpers that keep the voice tests three lines long: a room with a voice channel, the demo
meeting, and streaming audio into a session (optionally at a multiple of real time)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soundfile as sf

from rooms import RoomKit
from voice.channel import CommittedTurn, VoiceChannel, VoiceSession, pcm16_frames

MEETING_DIR = Path(__file__).resolve().parents[1] / "examples" / "meeting"


@dataclass
class Meeting:
    audio: npt.NDArray[np.float32]
    sample_rate: int
    turns: list[dict[str, Any]]

    def words(self) -> list[str]:
        return [w["punctuated_word"] for t in self.turns for w in t["words"]]

    def speaker_at(self, start: float, end: float) -> str:
        """The script speaker whose turn overlaps [start, end] most."""
        def overlap(t: dict[str, Any]) -> float:
            return float(min(end, t["end"]) - max(start, t["start"]))
        return str(max(self.turns, key=overlap)["speaker"])


def meeting(seconds: float | None = None) -> Meeting:
    audio, rate = sf.read(MEETING_DIR / "meeting.wav", dtype="float32")
    turns = json.loads((MEETING_DIR / "meeting.json").read_text())["turns"]
    if seconds is not None:
        audio = audio[: int(seconds * rate)]
        turns = [t for t in turns if t["end"] <= seconds]
    return Meeting(np.asarray(audio, np.float32), int(rate), turns)


async def voice_room(channel: VoiceChannel, room_id: str = "room") -> RoomKit:
    kit = RoomKit()
    await kit.create_room(room_id=room_id)
    kit.register_channel(channel)
    await kit.attach_channel(room_id, channel.channel_id)
    return kit


async def stream(session: VoiceSession, audio: npt.NDArray[np.float32], sample_rate: int,
                 *, frame_seconds: float = 0.05, speed: float | None = None) -> None:
    """Push audio as PCM16 frames; `speed` paces it at that multiple of real time."""
    for frame in pcm16_frames(audio, sample_rate, frame_seconds):
        session.push(frame)
        await asyncio.sleep(frame_seconds / speed if speed else 0)


async def turns_of(session: VoiceSession, audio: npt.NDArray[np.float32], sample_rate: int,
                   **kw: Any) -> list[CommittedTurn]:
    await stream(session, audio, sample_rate, **kw)
    return await session.finish()
