"""End to end over real sockets: two phone legs (Twilio framing, µ-law) and one shared-mic
device in one room, with the realtime channel on the local OpenAI Realtime server.

Real pieces throughout: the server's websockets, the `VoiceChannel`, the embedded diarization
stage, the attribution engine, the `RealtimeChannel` with the `openai` client. STT goes through
the local Deepgram-protocol server, which finds the received audio in the demo meeting and
returns the meeting's words (so the words are exact and the test is fast); the speakers of the
device come from the embedded diarizer, not from the STT.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from realtime.testing.openai_server import OpenAIRealtimeServer, lines_sent
from server.auth import issue_token
from server.client import DeviceStream, EventFeed, TwilioLeg
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
)
from voice.audio import float_to_pcm16, mulaw_encode, read_audio_16k, resample

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "standup"
MODEL_DELAY_S = 0.3
"""The model's time to its first audio (the stand-in waits this long before a response)."""
BOUND_S = 180.0
"""Every wait's failure bound: generous, since a loaded machine may run this suite at a fifth of
its speed; a passing run never waits for it."""


def excerpt(start: float, end: float) -> np.ndarray:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return audio[int(start * 16000) : int(end * 16000)]


def phone_audio(start: float, end: float, silence: float = 0.35) -> bytes:
    """An excerpt of the meeting as a phone line carries it (8 kHz µ-law), then a pause."""
    narrow = resample(excerpt(start, end), 16000, 8000)
    narrow = np.concatenate([narrow, np.zeros(int(silence * 8000), np.float32)])
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


@pytest.fixture
async def model() -> AsyncIterator[OpenAIRealtimeServer]:
    async with OpenAIRealtimeServer(replies=["Happy to help, Dana."], reply_audio_seconds=0.2,
                                    response_delay=MODEL_DELAY_S) as m:  # fmt: skip
        yield m


@pytest.fixture
def server_config(model: OpenAIRealtimeServer) -> dict[str, Any]:
    return {
        "stt": {"diarize": False},  # the device's speakers come from the diarization stage
        "diarizer": {"kind": "embedded"},
        "realtime": {"provider": "openai", "base_url": model.base_url, "api_key": "test"},
        "policy": {"answer_only": ["Dana"]},
    }


async def test_two_phone_legs_and_a_shared_mic_device_in_one_room(
    server: RunningServer, model: OpenAIRealtimeServer
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    dana = await TwilioLeg.open(server.base, {"room": ROOM, "token": token, "name": "Dana"})
    eli = await TwilioLeg.open(server.base, {"room": ROOM, "token": token, "name": "Eli"})
    device = await DeviceStream.open(
        server.base,
        ROOM,
        token,
        StartMessage(participant="room-4", name="Room 4", sample_rate=16000, shared_mic=True),
    )
    # Dana's line carries Alice's first turn; the policy answers Dana, so a reply plays.
    await dana.send_mulaw(phone_audio(0.6, 4.3), realtime=False)
    await eventually(lambda: any(m.get("event") == "mark" for m in dana.received), BOUND_S, "a reply")
    await eventually(lambda: any(m.type == "reply" for m in feed.received), BOUND_S, "the whole reply")
    # the room's device is gated while the reply plays (V9); Eli speaks once it has played (so
    # his turn is not a barge-in)
    await server.until_reply_played(ROOM, BOUND_S)
    # Eli's line carries Bob's first turn.
    await eli.send_mulaw(phone_audio(4.7, 8.95), realtime=False)
    await eventually(lambda: len(feed.turns) >= 2, BOUND_S, "Eli's turn")
    # The room's microphone: the first 31 s of the meeting, three voices.
    await device.send_audio(float_to_pcm16(excerpt(0.0, 31.4)), chunk_s=0.5, realtime=False)
    async with asyncio.timeout(BOUND_S):
        await asyncio.gather(dana.stop(), eli.stop(), device.stop())
    await eventually(lambda: sum(m.type == "stream_stopped" for m in feed.received) == 3, BOUND_S)

    turns = feed.turns
    by_stream: dict[str | None, list[str]] = {}
    for turn in turns:
        by_stream.setdefault(turn.stream, []).append(turn.speaker)
    starts = {m.participant: m.stream for m in feed.received if m.type == "stream_started"}
    dana_stream, eli_stream = starts[f"call-{dana.call_sid}"], starts[f"call-{eli.call_sid}"]

    # each leg's turns carry its caller's name
    assert set(by_stream[dana_stream]) == {"Dana"}
    assert set(by_stream[eli_stream]) == {"Eli"}
    dana_text = " ".join(t.text for t in turns if t.stream == dana_stream)
    assert "Good morning everyone" in dana_text
    # the device's voices are diarized: several speakers, none of them a caller
    device_speakers = by_stream[starts["room-4"]]
    assert len(set(device_speakers)) >= 2
    assert all(s.startswith("Speaker ") for s in device_speakers)
    assert len(device_speakers) >= 5
    # the device got its own turns; the feed got speaker changes
    assert [t.text for t in device.turns] == [t.text for t in turns if t.stream == starts["room-4"]]
    assert any(m.type == "speaker_change" for m in feed.received)

    # the realtime server received the labelled lines
    await eventually(lambda: len(lines_sent(model)) >= len(turns), BOUND_S, "every line at the model")
    lines = lines_sent(model)
    # G3: while the room held one speaker the line went as said; then every line is labelled
    assert lines[0] == "Good morning everyone. Let's start the weekly release meeting."
    assert lines[1].startswith('Eli: "Morning. The build is green')
    assert "[Speaker labels from the runtime" in lines[1]
    assert any(line.startswith('Speaker A: "') for line in lines)
    assert any(line.startswith('Speaker B: "') for line in lines)

    # the reply came back: text on the feed and the device, audio on both phone legs
    replies = [m for m in feed.received if m.type == "reply"]
    assert replies and replies[0].text == "Happy to help, Dana."
    assert any(m.type == "reply" for m in device.received)
    for leg in (dana, eli):
        media = [m for m in leg.received if m.get("event") == "media"]
        assert media and all(m["streamSid"] == leg.stream_sid for m in media)
        assert len(base64.b64decode(media[0]["media"]["payload"])) > 0
        assert any(m.get("event") == "mark" for m in leg.received)
    assert len(device.audio_received) > 0

    # participants: each leg is a participant named from its parameters
    participants = await server.server.rooms.kit.get_participants(ROOM)
    names = {p.id: p.display_name for p in participants}
    assert names[f"call-{dana.call_sid}"] == "Dana"
    assert names[f"call-{eli.call_sid}"] == "Eli"

    # metrics saw all of it
    status, metrics = await server.http_get("/metrics")
    assert status == 200
    assert f"chorus_turns_total {len(turns)}" in metrics
    assert 'chorus_streams_total{kind="twilio"} 2' in metrics
    # the reply's latency: Dana's turn's own, then the model's time to its first audio
    (reply,) = [e for e in await server.server.rooms.kit.list_events(ROOM)
                if e.source.channel_type == "realtime"]  # fmt: skip
    (asked,) = [t for t in turns if t.event_id == reply.metadata["asked_by"]]
    assert asked.stream == dana_stream and reply.metadata["first_audio_ms"] >= 1000 * MODEL_DELAY_S
    assert "chorus_reply_latency_seconds_count 1.0" in metrics
    (total,) = [float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("chorus_reply_latency_seconds_sum")]  # fmt: skip
    assert total > reply.metadata["first_audio_ms"] / 1000  # plus Dana's turn's latency
    await feed.close()
    print(json.dumps([t.model_dump() for t in turns], indent=1)[:3000])


async def test_a_mixed_bridge_leg_asks_for_shared_mic_diarization(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, "bridge")
    feed = await EventFeed.open(server.base, "bridge", token)
    leg = await TwilioLeg.open(
        server.base,
        {"room": "bridge", "token": token, "name": "Conference line", "shared_mic": "true"},
    )
    # Alice, Bob and Carol on one phone line
    await leg.send_mulaw(phone_audio(0.0, 12.9), realtime=False)
    async with asyncio.timeout(BOUND_S):
        await leg.stop()
    await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S)
    speakers = [t.speaker for t in feed.turns]
    assert len(speakers) >= 3
    assert len(set(speakers)) >= 2 and all(s.startswith("Speaker ") for s in speakers)
    assert "Conference line" not in speakers
    await feed.close()


async def test_a_one_person_stream_is_its_participant_and_renames_as_one_voice(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, "desk")
    feed = await EventFeed.open(server.base, "desk", token)
    device = await DeviceStream.open(
        server.base,
        "desk",
        token,
        StartMessage(participant="desk-1", name="Desk", shared_mic=False),
    )
    # the STT stand-in labels these words with two voices; the stream is one person
    await device.send_audio(float_to_pcm16(excerpt(0.0, 9.2)), chunk_s=0.5, realtime=False)
    await eventually(lambda: len(feed.turns) >= 1, BOUND_S, "a first turn")
    assert {t.speaker for t in feed.turns} == {"Desk"}
    assert all(t.label is None for t in feed.turns)
    stream = feed.turns[0].stream
    await feed.rename("Desk", "Dana", stream=stream)
    await eventually(lambda: any(m.type == "renamed" for m in feed.received), BOUND_S, "renamed")
    # audio sent from here on is transcribed after the rename took effect
    await device.send_audio(float_to_pcm16(excerpt(9.2, 16.0)), chunk_s=0.5, realtime=False)
    async with asyncio.timeout(BOUND_S):
        await device.stop()
    # the feed carries `stream_stopped` after the stream's last turn: wait for it, not for luck
    await eventually(
        lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S, "stream_stopped"
    )
    # Turns of the first excerpt still in flight when the rename arrived may go either way;
    # the rename holds from one turn on (earlier turns keep their name, D3) and every turn
    # spoken after it reads "Dana".
    speakers = [t.speaker for t in feed.turns]
    assert "Dana" in speakers
    first_renamed = speakers.index("Dana")
    assert set(speakers[:first_renamed]) == {"Desk"} and set(speakers[first_renamed:]) == {"Dana"}
    assert any(t.start >= 9.2 for t in feed.turns)
    assert all(t.speaker == "Dana" for t in feed.turns if t.start >= 9.2)
    # the store agrees turn by turn: renamed turns carry the name, the others none (B2)
    events = await server.server.rooms.kit.list_events("desk")
    stored = {e.id: e.metadata.get("sender_name") for e in events}
    assert [stored[t.event_id] for t in feed.turns] == [
        "Dana" if s == "Dana" else None for s in speakers
    ]
    await feed.close()
