"""What a voice session hands hooks and callers: a turn before it is posted, a change of voice,
a committed turn (rule V6)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from models import RoomEvent
from voice.turns import Word

if TYPE_CHECKING:
    from voice.session import VoiceSession


@dataclass(frozen=True)
class TranscriptionEvent:
    """One speaker turn before it becomes a room event (rule V6). Hooks return a modified copy
    (`dataclasses.replace`) to rename (`sender_name`), edit (`text`) or match a participant."""

    text: str
    speaker: str | None
    """The raw label (`Speaker A` …, or the diarization stage's name); never changed by hooks."""
    sender_name: str | None
    start: float
    end: float
    words: tuple[Word, ...]
    participant_id: str | None
    session: VoiceSession = field(compare=False, repr=False)


@dataclass(frozen=True)
class SpeakerChangeEvent:
    """`ON_SPEAKER_CHANGE` (observer): the turn's voice differs from the previous turn's."""

    speaker: str | None
    sender_name: str | None
    previous_speaker: str | None
    is_new_speaker: bool
    """True the first time this voice is heard in the session."""
    start: float
    participant_id: str | None
    session: VoiceSession = field(compare=False, repr=False)


@dataclass(frozen=True)
class CommittedTurn:
    """What a session committed: the room event, the turn as hooks left it, and when (loop time)."""

    event: RoomEvent
    transcription: TranscriptionEvent
    committed_at: float

    @property
    def sender_name(self) -> str | None:
        return self.transcription.sender_name

    @property
    def text(self) -> str:
        return self.transcription.text

    @property
    def start(self) -> float:
        return self.transcription.start

    @property
    def end(self) -> float:
        return self.transcription.end


__all__ = ["CommittedTurn", "SpeakerChangeEvent", "TranscriptionEvent"]
