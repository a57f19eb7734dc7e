"""Room-side helpers for realtime tests: a voice-like channel, an audio sink, and the reference
rendering of G3, so a rule's test reads in a few lines.

`expected_lines(kit, room_id, channel_id)` computes, from the room's committed events and the
attribution engine alone (`labelling_on`, `render_line`, `NOTE`), what a session that follows G3
must have been sent — independently of how `RealtimeChannel` keeps its state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from attribution import NOTE, Register, labelling_on, render_line
from models import RoomEvent, TextContent, VoiceTurn
from rooms import Channel, RoomKit
from voice.audio import float_to_pcm16, pcm16_to_float, resample

FALLBACK_TURNS: list[dict[str, Any]] = [
    {
        "speaker": "Alice",
        "text": "Good morning everyone. Let's start the weekly release meeting.",
        "start": 0.6,
        "end": 4.2,
    },
    {
        "speaker": "Bob",
        "text": "Morning. The build is green, but the payment tests are flaky.",
        "start": 4.6,
        "end": 8.3,
    },
    {"speaker": "Carol", "text": "I can look at the flaky tests today.", "start": 8.8, "end": 11.0},
    {
        "speaker": "Alice",
        "text": "Assistant, can you summarise the open risks?",
        "start": 11.4,
        "end": 14.0,
    },
    {"speaker": "Bob", "text": "I would rather ship Thursday.", "start": 14.5, "end": 16.4},
]


def meeting_turns(repo: Path, limit: int | None = None) -> list[dict[str, Any]]:
    """Turns of the generated demo meeting (`examples/meeting/meeting.json`) when it exists,
    otherwise a scripted excerpt of the same meeting."""
    path = repo / "examples" / "meeting" / "meeting.json"
    turns: list[dict[str, Any]]
    if path.is_file():
        data = json.loads(path.read_text())
        turns = [
            {k: t[k] for k in ("speaker", "text", "start", "end") if k in t}
            for t in data.get("turns", [])
        ]
    else:
        turns = [dict(t) for t in FALLBACK_TURNS]
    return turns[:limit] if limit is not None else turns


class VoiceLikeChannel(Channel):
    """Posts turns with the voice channel's metadata (V2): `sender_name`, `speaker_label`,
    `start`, `end`, `voice_session_id`, `source="voice"`.

    Audio mode (R3): like the voice channel it is the turns' `rooms.TurnAudioSource`. `hear(…)`
    gives it what a stream heard (16-bit mono PCM from stream time 0, any rate); `turn_audio`
    cuts a turn's span out of it, resampled to the rate asked for, and keeps each request in
    `asked` (a turn, and the rate)."""

    channel_type: ClassVar[str] = "voice"

    def __init__(self, channel_id: str) -> None:
        super().__init__(channel_id)
        self.heard: dict[str, tuple[bytearray, int]] = {}
        self.asked: list[tuple[VoiceTurn, int]] = []

    def hear(self, pcm16: bytes, sample_rate: int, *, stream: str = "test") -> None:
        held, rate = self.heard.setdefault(stream, (bytearray(), sample_rate))
        assert rate == sample_rate, "one stream, one rate"
        held.extend(pcm16)

    def turn_audio(self, turn: VoiceTurn, sample_rate: int) -> bytes | None:
        self.asked.append((turn, sample_rate))
        if turn.voice_session_id not in self.heard:
            return None
        held, rate = self.heard[turn.voice_session_id]
        span = bytes(held[round(turn.start * rate) * 2 : round(turn.end * rate) * 2])
        if not span or rate == sample_rate:
            return span or None
        return float_to_pcm16(resample(pcm16_to_float(span), rate, sample_rate))

    async def say(
        self,
        room_id: str,
        speaker: str,
        text: str,
        *,
        start: float | None = None,
        end: float | None = None,
        participant_id: str | None = None,
        stream: str = "test",
    ) -> RoomEvent:
        metadata: dict[str, Any] = {
            "sender_name": speaker,
            "speaker_label": speaker,
            "voice_session_id": stream,
            "source": "voice",
        }
        if start is not None:
            metadata["start"] = start
        if end is not None:
            metadata["end"] = end
        event = await self.require_kit().post_event(
            room_id,
            self.channel_id,
            TextContent(body=text),
            participant_id=participant_id,
            metadata=metadata,
        )
        assert event is not None, "a hook blocked the turn"
        return event


class RecordingAudioSink(Channel):
    """An `AudioSink` (the room's loudspeaker) that keeps what it was asked to play."""

    channel_type: ClassVar[str] = "speaker"

    def __init__(self, channel_id: str) -> None:
        super().__init__(channel_id)
        self.played: list[tuple[str, bytes, int]] = []

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        self.played.append((room_id, pcm16, sample_rate))


async def open_voice_room(channel: Channel) -> tuple[RoomKit, VoiceLikeChannel]:
    """Room "r1" with a voice-like channel ("voice", its group) and `channel` (a realtime
    channel, "rt") attached."""
    kit = RoomKit()
    await kit.create_room("r1")
    voice = VoiceLikeChannel("voice")
    for c in (voice, channel):
        kit.register_channel(c)
    await kit.attach_channel("r1", "voice", group=True)
    await kit.attach_channel("r1", channel.channel_id)
    return kit, voice


async def expected_lines(kit: RoomKit, room_id: str, channel_id: str) -> list[str]:
    """What a session following G1/G3 was sent for the room's events, in order."""
    events = [
        e
        for e in await kit.list_events(room_id)
        if e.source.channel_id != channel_id and e.visible_to(channel_id)
    ]
    participants = await kit.get_participants(room_id)
    register = await kit.get_register(room_id) or Register.new()
    out: list[str] = []
    on = False
    noted = False
    for i, event in enumerate(events):
        if event.kind == "system":
            continue
        on = on or labelling_on(events[: i + 1], participants, channel_id, register=register)
        if not on:
            out.append(event.text)
            continue
        line = render_line(event, participants, register)
        if not noted:
            line = f"{line}\n\n{NOTE}"
            noted = True
        out.append(line)
    return out
