"""Helpers that keep the voice tests three lines long: a room with a voice channel, the demo
meeting, streaming audio into a session (optionally at a multiple of real time), and scripted
diarization stages."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soundfile as sf

from rooms import RoomKit
from voice.channel import CommittedTurn, VoiceChannel, VoiceSession, pcm16_frames
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline, StageAbilities
from voice.stt.base import RawEvent, RawFinalized, RawResult, RawWord, SttConnection, SttProvider

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


class ScriptedStage:
    """A diarization stage with a fixed timeline (rule P3 shape)."""

    sample_rate = 16000

    def __init__(self, timeline: SpeakerTimeline, lag: float = 0.0) -> None:
        self.timeline = timeline
        self.lag = lag  # a segment is decided `lag` seconds after it ends
        self.fed = 0

    def feed(self, audio: np.ndarray) -> SpeakerTimeline:
        self.fed += len(audio)
        heard = self.fed / 16000
        return SpeakerTimeline([s for s in self.timeline.segments
                                if s.start < heard and (not self.lag or s.end + self.lag <= heard)])

    def diarize(self, audio: np.ndarray, *, num_speakers: int | None = None,
                max_speakers: int | None = None) -> SpeakerTimeline:
        return self.timeline

    def enroll(self, name: str, audio: np.ndarray) -> None: ...
    def forget(self, name: str) -> None: ...
    def reset(self) -> None:
        self.fed = 0


class DecidingStage(ScriptedStage):
    """Decides each frame `lag` seconds after hearing it (as the embedded live stage does, about
    a second late), instead of a whole segment once it has ended."""

    def _clipped(self, lo: float, hi: float,
                 timeline: SpeakerTimeline | None = None) -> SpeakerTimeline:
        """`timeline` (default: the stage's own) between `lo` and `hi` seconds."""
        return SpeakerTimeline([SpeakerSegment(max(s.start, lo), min(s.end, hi), s.speaker)
                                for s in (timeline or self.timeline).segments
                                if s.start < hi and s.end > lo])

    def feed(self, audio: np.ndarray) -> SpeakerTimeline:
        self.fed += len(audio)
        return self._clipped(0.0, self.fed / 16000 - self.lag)


class ProvisionalStage(DecidingStage):
    """Decides each frame `lag` seconds after hearing it, and says meanwhile who it thinks speaks
    on the frames it heard but has not decided (the embedded live stage's `provisional()`): by
    default what it will decide, or `guess`, a timeline of its own (a provisional view that the
    decision will contradict)."""

    abilities = StageAbilities(provisional_view=True)

    def __init__(self, timeline: SpeakerTimeline, lag: float = 0.0,
                 guess: SpeakerTimeline | None = None) -> None:
        super().__init__(timeline, lag)
        self.guess = guess

    def provisional(self) -> SpeakerTimeline:
        heard = self.fed / 16000
        return self._clipped(max(0.0, heard - self.lag), heard, self.guess)


class UtteranceSTT(SttProvider):
    """A local engine like Whisper, scripted: each final result (words in seconds, one speaker
    id for all: it labels nobody apart) comes once the connection has heard audio up to its
    time, as a closed utterance would."""

    name = "scripted-utterances"
    diarizes = False
    keepalive_interval = None

    def __init__(self, finals: list[tuple[float, list[tuple[str, float, float]], bool]]) -> None:
        """`finals`: (audio time it is sent at, [(word, start, end)], speech_final)."""
        self.finals = finals
        self.voice_changes: list[float] = []
        """Where the channel said the stage decided a voice change (connection seconds)."""

    async def connect(self) -> SttConnection:
        return _UtteranceConnection(self.finals, self.voice_changes)


class _UtteranceConnection(SttConnection):
    def __init__(self, finals: list[tuple[float, list[tuple[str, float, float]], bool]],
                 voice_changes: list[float]) -> None:
        self.waiting = list(finals)
        self.heard = 0.0
        self.voice_changes = voice_changes
        self.out: asyncio.Queue[RawEvent | None] = asyncio.Queue()

    def voice_change(self, at: float) -> None:
        self.voice_changes.append(at)

    async def send_audio(self, pcm16: bytes) -> None:
        self.heard += len(pcm16) / 2 / 16000
        while self.waiting and self.waiting[0][0] <= self.heard + 1e-9:
            _, words, speech_final = self.waiting.pop(0)
            self.out.put_nowait(RawResult(tuple(RawWord(w, a, b) for w, a, b in words),
                                          is_final=True, speech_final=speech_final,
                                          audio_end=self.heard))

    async def finalize(self) -> None:
        self.out.put_nowait(RawFinalized())

    async def close(self) -> None:
        self.out.put_nowait(None)

    async def events(self) -> AsyncIterator[RawEvent]:
        while (event := await self.out.get()) is not None:
            yield event
