"""Audio mode (rule R3) through `chorus serve`, over real sockets.

Three streams in one room at once — a shared-mic device (pcm16, 16 kHz), a one-person device
(µ-law, 8 kHz) and a Twilio leg (µ-law, 8 kHz) — with STT on the local Deepgram-protocol server
(it returns the demo meeting's words and speaker ids for the audio it receives) and the realtime
channel on the local OpenAI Realtime server, driven by the real `openai` client. With
`realtime.audio = true` the model's log must read: `session.update` with turn detection off, then
per turn `input_audio_buffer.append` (one or more), `input_audio_buffer.commit`, the labelled line
naming the speaker, and `response.create` only where the speak policy answers. Each commit must
hold that turn's span of its own stream (sample count and waveform), never another stream's.
With audio mode off (the default) no audio event is sent at all.
"""

from __future__ import annotations

import asyncio
import base64
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from models import RoomEvent
from realtime import RealtimeChannel
from realtime.testing.openai_server import OpenAIRealtimeServer, events_sent, types_sent
from server.auth import issue_token
from server.client import DeviceStream, EventFeed, TwilioLeg
from server.config import ConfigError, load_config
from server.pipeline import VoiceStreamAudio, realtime_channel
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    local_deepgram_stt,
    running_server,
)
from tests.realtime_rooms import expected_lines
from voice.audio import AudioLog, float_to_pcm16, mulaw_encode, read_audio_16k, resample
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "standup"
MODEL_RATE = 24_000  # OpenAI Realtime input audio


def excerpt(start: float, end: float) -> np.ndarray[Any, Any]:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return audio[int(start * 16000) : int(end * 16000)]


def phone_audio(start: float, end: float, silence: float = 0.4) -> bytes:
    """An excerpt of the meeting as a phone line carries it (8 kHz µ-law), then a pause."""
    narrow = resample(excerpt(start, end), 16000, 8000)
    narrow = np.concatenate([narrow, np.zeros(int(silence * 8000), np.float32)])
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


def servers_config(
    deepgram: DeepgramTestServer, model: OpenAIRealtimeServer, audio: bool
) -> dict[str, Any]:
    return {
        # the shared mic's speakers come from the STT's labels (V3)
        "stt": local_deepgram_stt(deepgram.url, diarize=True),
        "diarizer": {"kind": "none"},
        "realtime": {
            "provider": "openai",
            "base_url": model.base_url,
            "api_key": "test",
            "audio": audio,
        },
        "policy": {"answer_only": ["Dana"]},
    }


@asynccontextmanager
async def servers(audio: bool) -> AsyncIterator[tuple[RunningServer, OpenAIRealtimeServer]]:
    async with (
        DeepgramTestServer(MeetingWords.from_meeting(MEETING)) as deepgram,
        OpenAIRealtimeServer(replies=["Yes, Dana."], reply_audio_seconds=0.1) as model,
        running_server(servers_config(deepgram, model, audio)) as server,
    ):
        yield server, model


@dataclass
class Turn:
    """One `input_audio_buffer.commit` and what came with it, as the model's server logged it."""

    appends: int = 0
    audio: bytearray = field(default_factory=bytearray)
    items: list[str] = field(default_factory=list)
    responses: int = 0


def turns_at_model(events: list[dict[str, Any]]) -> list[Turn]:
    turns: list[Turn] = []
    pending = Turn()
    for event in events:
        kind = event["type"]
        if kind == "input_audio_buffer.append":
            pending.appends += 1
            pending.audio.extend(base64.b64decode(event["audio"]))
        elif kind == "input_audio_buffer.commit":
            turns.append(pending)
            pending = Turn()
        elif kind == "conversation.item.create":
            turns[-1].items.append(event["item"]["content"][0]["text"])
        elif kind == "response.create":
            turns[-1].responses += 1
    assert pending.appends == 0, "audio appended but never committed"
    return turns


def correlation(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> float:
    n = min(len(a), len(b))
    a, b = a[:n].astype(np.float64), b[:n].astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


async def test_R3_each_stream_commits_its_own_audio_then_the_labelled_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the reference audio is each session's own log, read after the streams end: keep it (a
    # finished session gives its audio back, `AudioLog.release`; nothing else reads it then)
    monkeypatch.setattr(AudioLog, "release", lambda self: None)
    async with servers(audio=True) as (server, model):
        token = issue_token(SECRET, ROOM)
        feed = await EventFeed.open(server.base, ROOM, token)
        room4 = await DeviceStream.open(
            server.base,
            ROOM,
            token,
            StartMessage(participant="room-4", name="Room 4", sample_rate=16000, shared_mic=True),
        )
        desk = await DeviceStream.open(
            server.base,
            ROOM,
            token,
            StartMessage(
                participant="desk-1",
                name="Desk",
                sample_rate=8000,
                encoding="mulaw",
                shared_mic=False,
            ),
        )
        dana = await TwilioLeg.open(server.base, {"room": ROOM, "token": token, "name": "Dana"})
        live = server.server.rooms.rooms[ROOM]
        await eventually(
            lambda: len(live.streams) == 3 and all(s.audio for s in live.streams.values()),
            10,
            "three open streams",
        )
        # keep each stream's voice session: what it accepted is the reference audio
        logs: dict[str, AudioLog] = {
            sid: cast(VoiceStreamAudio, s.audio).session.audio for sid, s in live.streams.items()
        }
        # all three at once: the channel holds three streams' audio side by side
        await asyncio.gather(
            room4.send_audio(float_to_pcm16(excerpt(0.0, 12.9)), chunk_s=0.25, realtime=False),
            desk.send_audio(phone_audio(29.1, 31.5), chunk_s=0.1, realtime=False),
            dana.send_mulaw(phone_audio(13.0, 15.6), chunk_s=0.1, realtime=False),
        )
        async with asyncio.timeout(30):
            await asyncio.gather(room4.stop(), desk.stop(), dana.stop())
        await eventually(lambda: sum(m.type == "stream_stopped" for m in feed.received) == 3, 10)
        kit = server.server.rooms.kit
        rt = server.server.rooms.pipeline.realtime  # type: ignore[attr-defined]
        assert isinstance(rt, RealtimeChannel) and rt.audio_mode
        await rt.wait_idle(ROOM)
        events = events_sent(model)
        lines = rt.lines_for(ROOM)
        assert lines == await expected_lines(kit, ROOM, rt.channel_id)  # G1/G3 reference
        voice_turns: list[RoomEvent] = [
            e for e in await kit.list_events(ROOM) if e.metadata.get("source") == "voice"
        ]
        await feed.close()

    speakers = {t.event_id: t.speaker for t in feed.turns}
    stream_of = {t.event_id: t.stream for t in feed.turns}
    assert len(voice_turns) == 5, [e.text for e in voice_turns]
    assert sorted(set(speakers.values())) == ["Dana", "Desk", "Speaker A", "Speaker B", "Speaker C"]

    # session.update first: the model's own turn detection off (R3)
    assert events[0]["type"] == "session.update"
    audio_in = events[0]["session"]["audio"]["input"]
    assert "turn_detection" in audio_in and audio_in["turn_detection"] is None
    # then per turn: append+, commit, [labelled item], [response.create] — nothing else
    kinds = " ".join(types_sent(model)[1:])
    turn = r"(input_audio_buffer\.append )+input_audio_buffer\.commit( conversation\.item\.create)?( response\.create)?"
    assert re.fullmatch(rf"{turn}( {turn})*", kinds), kinds

    at_model = turns_at_model(events[1:])
    assert len(at_model) == len(voice_turns)
    labelled = False
    for event, sent, line in zip(voice_turns, at_model, lines, strict=True):
        meta = event.metadata
        stream = str(meta["voice_session_id"])
        assert stream_of[event.id] == stream
        start, end = float(meta["start"]), float(meta["end"])
        got = np.frombuffer(bytes(sent.audio), "<i2").astype(np.float32) / 32768.0
        # the turn's span, resampled to the model's rate (tolerance: the streaming resampler)
        assert abs(len(got) - (end - start) * MODEL_RATE) <= 0.02 * MODEL_RATE, (
            len(got),
            start,
            end,
        )
        assert sent.appends == -(-len(got) // MODEL_RATE)  # one append per second of audio
        # and it is that stream's audio: the voice session's own samples over start…end ...
        own = resample(logs[stream].between(start, end), 16000, MODEL_RATE)
        assert correlation(got, own) > 0.9, (speakers[event.id], correlation(got, own))
        # ... not another stream's at the same moment
        for other, log in logs.items():
            if other != stream and log.total > end * 16000:
                theirs = resample(log.between(start, end), 16000, MODEL_RATE)
                assert abs(correlation(got, theirs)) < 0.5
        # the labelled line naming the speaker, once the room holds two speakers (G3)
        labelled = labelled or line.startswith(f'{speakers[event.id]}: "')
        if labelled:
            assert sent.items == [line]
            assert line.startswith(f'{speakers[event.id]}: "{event.text}"')
        else:
            assert sent.items == []  # one speaker so far: the model heard it, nothing to attribute
        # a response only where the policy answers (Dana)
        assert sent.responses == (1 if speakers[event.id] == "Dana" else 0)
    assert labelled
    assert any(m.type == "reply" and m.text == "Yes, Dana." for m in feed.received)


async def test_audio_mode_off_sends_no_audio() -> None:
    async with servers(audio=False) as (server, model):
        token = issue_token(SECRET, ROOM)
        room4 = await DeviceStream.open(
            server.base,
            ROOM,
            token,
            StartMessage(participant="room-4", name="Room 4", sample_rate=16000, shared_mic=True),
        )
        dana = await TwilioLeg.open(server.base, {"room": ROOM, "token": token, "name": "Dana"})
        await asyncio.gather(
            room4.send_audio(float_to_pcm16(excerpt(0.0, 8.95)), chunk_s=0.25, realtime=False),
            dana.send_mulaw(phone_audio(13.0, 15.6), chunk_s=0.1, realtime=False),
        )
        async with asyncio.timeout(30):
            await asyncio.gather(room4.stop(), dana.stop())
        rt = server.server.rooms.pipeline.realtime  # type: ignore[attr-defined]
        assert isinstance(rt, RealtimeChannel) and not rt.audio_mode
        await eventually(lambda: len(rt.lines_for(ROOM)) >= 3, 10, "three lines")
        await rt.wait_idle(ROOM)
        lines = rt.lines_for(ROOM)
        kinds = types_sent(model)
        events = events_sent(model)
    assert not [k for k in kinds if k.startswith("input_audio_buffer")]
    assert events[0]["type"] == "session.update"
    assert "turn_detection" not in (events[0]["session"].get("audio") or {}).get("input", {})
    items = [
        e["item"]["content"][0]["text"] for e in events if e["type"] == "conversation.item.create"
    ]
    assert items == lines and len(items) == 3  # every turn as a text line (R2), no audio
    assert kinds.count("response.create") == 1  # Dana's turn only


# --------------------------------------------------------------------------- configuration


def test_realtime_audio_is_off_by_default_and_set_from_file_or_environment(
    tmp_path: Path,
) -> None:
    assert load_config(None, environ={}).realtime.audio is False
    file = tmp_path / "chorus.toml"
    file.write_text("[realtime]\naudio = true\n")
    assert load_config(file, environ={}).realtime.audio is True
    assert load_config(file, environ={"CHORUS_REALTIME_AUDIO": "false"}).realtime.audio is False
    assert load_config(None, environ={"CHORUS_REALTIME_AUDIO": "true"}).realtime.audio is True
    with pytest.raises(ConfigError, match=r"realtime\.audio"):
        load_config(None, environ={"CHORUS_REALTIME_AUDIO": "loud"})
    on = realtime_channel(load_config(None, environ={"CHORUS_REALTIME_AUDIO": "1"}))
    off = realtime_channel(load_config(None, environ={}))
    assert on is not None and on.audio_mode and on.options.audio_input
    assert off is not None and not off.audio_mode
