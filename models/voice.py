"""`VoiceTurn`: what a voice turn says about itself, typed, in one place.

Why here: the voice channel writes it and the realtime channel and the server read it, and those
packages are peers (`voice`, `realtime`) or above them (`server`); the one package all of them
import is `models`. On the wire (a room event's metadata, rule V2) it stays the documented keys
`speaker_label`, `start`, `end`, `voice_session_id` and `source="voice"`, so stored events,
feeds and applications that read the keys see no change; code reads it with
`VoiceTurn.of(event)` instead of picking string keys out of a dict and checking their types
again at each reader.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from models.events import RoomEvent

VOICE_SOURCE = "voice"
"""`metadata["source"]` of every voice turn."""


@dataclass(frozen=True)
class VoiceTurn:
    """One speaker turn of a voice session (rule V2): who (the raw label), when (seconds from
    the stream's start) and which stream."""

    speaker_label: str | None
    start: float
    end: float
    voice_session_id: str

    def metadata(self) -> dict[str, Any]:
        """The V2 metadata keys of this turn (times rounded to the millisecond)."""
        return {
            "speaker_label": self.speaker_label,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "voice_session_id": self.voice_session_id,
            "source": VOICE_SOURCE,
        }

    @classmethod
    def from_metadata(cls, metadata: dict[str, Any]) -> VoiceTurn | None:
        """The turn a metadata dict describes, or None when it is not a voice turn's (no
        `source="voice"`, or times that are not numbers)."""
        if metadata.get("source") != VOICE_SOURCE:
            return None
        start, end = metadata.get("start"), metadata.get("end")
        if not isinstance(start, int | float) or not isinstance(end, int | float):
            return None
        if isinstance(start, bool) or isinstance(end, bool):
            return None
        label = metadata.get("speaker_label")
        session = metadata.get("voice_session_id")
        return cls(
            speaker_label=label if isinstance(label, str) else None,
            start=float(start),
            end=float(end),
            voice_session_id=session if isinstance(session, str) else "",
        )

    @classmethod
    def of(cls, event: RoomEvent) -> VoiceTurn | None:
        """The voice turn a room event carries, or None for any other event."""
        return cls.from_metadata(event.metadata)
