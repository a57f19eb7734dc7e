"""Idle rooms are evicted (`limits.idle_room_seconds`), over real sockets.

A room whose last stream closed and that has no feed consumer is evicted after the idle time:
`/metrics` counts it, and its live state, its pooled voice channels (each with its own
diarization stage) and its realtime session are gone, while its stored turns and participants
stay (issue 14.2). A room with a feed consumer open is kept. A stream into an evicted room works
and continues it: new turns after the old ones. An eviction that races with a new
connection loses: idleness is checked again under the room's lock.

STT goes through the local Deepgram-protocol server (the demo meeting's words), speakers come
from the embedded diarization stage (so shared-mic streams use pooled channels), and the
realtime channel is the recorder.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.config import load_config
from server.live import LiveRooms
from server.pipeline import VoicePipeline
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    running_server_with_local_stt,
)
from voice.audio import float_to_pcm16, read_audio_16k
from voice.testing.deepgram_server import MeetingWords

pytestmark = pytest.mark.asyncio

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
IDLE_S = 0.8


@pytest.fixture(scope="module")
def speech() -> bytes:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return float_to_pcm16(audio[: int(5.0 * 16000)].astype(np.float32))


@pytest.fixture
def server_config() -> dict[str, Any]:
    return {
        "stt": {"diarize": False},  # shared-mic speakers from the stage: pooled channels
        "diarizer": {"kind": "embedded"},
        "realtime": {"provider": "recorder"},
        "limits": {"idle_room_seconds": IDLE_S},
    }


def _parts(server: RunningServer) -> tuple[LiveRooms, VoicePipeline]:
    live = server.server.rooms
    assert isinstance(live.pipeline, VoicePipeline)
    return live, live.pipeline


async def _metric(server: RunningServer, name: str) -> float:
    status, body = await server.http_get("/metrics")
    assert status == 200
    m = re.search(rf"^{name} (\S+)$", body, re.M)
    assert m is not None, name
    return float(m[1])


async def _one_stream(server: RunningServer, room: str, speech: bytes) -> DeviceStream:
    """A shared-mic device streams the start of the meeting, then stops; its turns came back."""
    device = await DeviceStream.open(
        server.base, room, issue_token(SECRET, room), StartMessage(participant="desk")
    )
    await device.send_audio(speech, chunk_s=0.25, realtime=False)
    async with asyncio.timeout(60):
        await device.stop()
    assert device.turns, "the stream produced no turn"
    return device


async def test_an_idle_room_is_evicted_and_a_returning_room_continues(
    server: RunningServer, speech: bytes
) -> None:
    live, pipeline = _parts(server)
    # a feed holds the room while the test looks at it, however slowly the test runs
    watcher = await EventFeed.open(server.base, "idle", issue_token(SECRET, "idle"))
    first = await _one_stream(server, "idle", speech)
    assert "idle" in live.rooms
    old_stages = list(pipeline._pools["idle"])  # the stream's stage, idle again
    assert len(old_stages) == 1
    stored_before = await live.kit.list_events("idle")
    participants_before = await live.kit.get_participants("idle")
    assert stored_before and participants_before
    assert await _metric(server, "chorus_rooms") == 1

    await watcher.close()  # no stream, no feed: idle from here
    await eventually(lambda: "idle" not in live.rooms, within_s=30, what="eviction")
    assert await _metric(server, "chorus_rooms_evicted_total") == 1
    assert await _metric(server, "chorus_rooms") == 0
    # live state is freed: pooled stages, delivery queue, lock entries, the realtime session
    assert "idle" not in pipeline._pools
    assert "idle" not in live.kit._deliveries
    assert live._room_locks == {}
    assert pipeline.realtime is not None
    with pytest.raises(KeyError):  # the realtime channel closed the room's session (on_detach)
        pipeline.realtime.lines_for("idle")
    # ... and nothing stored is lost: eviction never deletes turns (issue 14.2)
    assert await live.kit.get_room("idle") is not None
    assert await live.kit.list_events("idle") == stored_before
    assert await live.kit.get_participants("idle") == participants_before
    status, _ = await server.http_get("/healthz")
    assert status == 200

    # the room comes back: new live state, a new pooled stage, its new turns after the old ones
    watcher = await EventFeed.open(server.base, "idle", issue_token(SECRET, "idle"))
    second = await _one_stream(server, "idle", speech)
    assert "idle" in live.rooms and await _metric(server, "chorus_rooms") == 1
    new_stages = pipeline._pools["idle"]
    assert len(new_stages) == 1 and new_stages[0] is not old_stages[0]
    events = await live.kit.list_events("idle")
    assert events[: len(stored_before)] == stored_before
    voice_ids = [e.id for e in events if e.source.channel_type == "voice"]
    first_ids = [t.event_id for t in first.turns]
    second_ids = [t.event_id for t in second.turns]
    assert voice_ids == first_ids + second_ids
    assert pipeline.realtime is not None
    lines = pipeline.realtime.lines_for("idle")  # a new session, fed the new turns
    assert any(t.text in line for t in second.turns for line in lines)
    await watcher.close()


async def test_a_room_with_a_feed_consumer_is_not_evicted(
    server: RunningServer, speech: bytes
) -> None:
    live, _ = _parts(server)
    feed = await EventFeed.open(server.base, "watched", issue_token(SECRET, "watched"))
    await _one_stream(server, "watched", speech)
    # a room without a feed, idle since after "watched" was: once the sweeper has evicted it,
    # "watched" has been idle long enough too, and only its feed kept it
    await _one_stream(server, "unwatched", speech)
    await eventually(lambda: "unwatched" not in live.rooms, within_s=30, what="eviction")
    assert "watched" in live.rooms
    assert await _metric(server, "chorus_rooms_evicted_total") == 1
    assert feed.ws.close_code is None and feed.turns

    await feed.close()  # now idle: evicted after the idle time
    await eventually(lambda: "watched" not in live.rooms, within_s=30, what="eviction")
    assert await _metric(server, "chorus_rooms_evicted_total") == 2


async def test_an_eviction_racing_with_a_new_connection_loses(server: RunningServer) -> None:
    """The eviction waits for the room's lock (held here); meanwhile a feed connects to the
    still-listed room. Checked again under the lock, the room is no longer idle and stays."""
    live, _ = _parts(server)
    token = issue_token(SECRET, "busy")
    first = await EventFeed.open(server.base, "busy", token)
    await eventually(lambda: "busy" in live.rooms and bool(live.rooms["busy"].feed.consumers))
    await first.close()
    await eventually(lambda: not live.rooms["busy"].feed.consumers)
    room = live.rooms["busy"]
    room.last_active -= 100  # long idle
    async with live._room_lock("busy"):
        evicting = asyncio.create_task(live.evict("busy", IDLE_S))
        await asyncio.sleep(0.05)
        assert not evicting.done()  # waiting for the lock
        late = await EventFeed.open(server.base, "busy", token)
        await eventually(lambda: bool(room.feed.consumers), what="the late feed")
    assert await evicting is False
    assert live.rooms.get("busy") is room
    assert await _metric(server, "chorus_rooms_evicted_total") == 0
    await late.close()


async def test_idle_room_seconds_from_config_and_environment_and_0_disables(speech: bytes) -> None:
    assert load_config(environ={}).limits.idle_room_seconds == 300
    env = {"CHORUS_LIMITS_IDLE_ROOM_SECONDS": "0"}
    assert load_config(environ=env).limits.idle_room_seconds == 0
    async with running_server_with_local_stt(
        {"limits": {"idle_room_seconds": 0}}, MeetingWords.from_meeting(MEETING)
    ) as srv:
        live = srv.server.rooms
        assert live._sweeper is None
        await _one_stream(srv, "kept", speech)
        await asyncio.sleep(0.3)
        assert "kept" in live.rooms
        assert await _metric(srv, "chorus_rooms_evicted_total") == 0
