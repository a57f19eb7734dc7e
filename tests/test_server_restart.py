"""A restart of `chorus serve` keeps every room (issue 14.2), over real sockets.

`chorus serve` runs as a subprocess, twice, on one store: the SQLite default (a file in a temporary
directory) and Postgres (a throwaway server). In the first run a one-person device speaks and the
page renames it while it speaks; the server stops. In the second run the same device reconnects and a look-alike
joins. The room continues: the new turns come after the old ones, the renamed person keeps the
new name, and the look-alike takes the next rank, decided against the register the first run
stored. A store in memory loses all of it, which the last test shows.

STT goes through the local Deepgram-protocol server (the demo meeting's words for the audio it
receives); no diarizer, no realtime session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from attribution import Register, label_for
from rooms import RoomKit, open_store
from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import StartMessage
from server.testing.harness import SECRET, eventually
from tests.serve_process import ServeProcess
from tests.store_fixtures import postgres_url
from voice.audio import float_to_pcm16, read_audio_16k
from voice.testing.deepgram_server import DeepgramTestServer

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[1]
MEETING = REPO / "examples" / "meeting"
ROOM = "standup"


def speech(start: float, end: float) -> bytes:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return float_to_pcm16(audio[int(start * 16000) : int(end * 16000)])


def config_file(tmp_path: Path, deepgram: DeepgramTestServer, store_url: str) -> Path:
    path = tmp_path / "chorus.toml"
    path.write_text(
        f'[stt]\nprovider = "deepgram"\ndeepgram_url = "{deepgram.url}"\ndeepgram_api_key = "k"\n'
        '[diarizer]\nkind = "none"\n[realtime]\nprovider = "none"\n'
        f'[store]\nurl = "{store_url}"\n'
    )
    return path


async def speak(
    server: ServeProcess,
    participant: str,
    name: str,
    audio: list[bytes],
    feed: EventFeed,
    rename_to: str | None = None,
) -> list[str]:
    """One one-person device says each piece of `audio` in turn (renamed on the page after the
    first when `rename_to` is given); the event ids of its turns, once the feed has them."""
    before = len(feed.turns)
    device = await DeviceStream.open(
        server.base,
        ROOM,
        issue_token(SECRET, ROOM),
        StartMessage(participant=participant, name=name, shared_mic=False),
    )
    for n, piece in enumerate(audio):
        await device.send_audio(piece, chunk_s=0.5, realtime=False)
        if n == 0 and rename_to is not None:
            await eventually(lambda: len(feed.turns) > before, 30, "a first turn")
            await feed.rename(name, rename_to, stream=feed.turns[-1].stream)
            await eventually(lambda: any(m.type == "renamed" for m in feed.received), 10, "renamed")
    async with asyncio.timeout(60):
        await device.stop()
    ids = {t.event_id for t in device.turns}
    assert ids, f"{participant} produced no turn"
    await eventually(
        lambda: ids <= {t.event_id for t in feed.turns[before:]}, 30, "the turns on the feed"
    )
    return [t.event_id for t in device.turns]


async def two_runs(tmp_path: Path, deepgram: DeepgramTestServer, store_url: str) -> None:
    config = config_file(tmp_path, deepgram, store_url)

    first = await ServeProcess.start(config)
    try:
        feed = await EventFeed.open(first.base, ROOM, issue_token(SECRET, ROOM))
        first_run = await speak(
            first, "desk-1", "Desk", [speech(0.0, 9.2), speech(9.2, 12.6)], feed, rename_to="Dana"
        )
        assert feed.turns[0].speaker == "Desk" and feed.turns[-1].speaker == "Dana"
        await feed.close()
    finally:
        await first.stop()

    second = await ServeProcess.start(config)
    try:
        feed = await EventFeed.open(second.base, ROOM, issue_token(SECRET, ROOM))
        after_restart = await speak(second, "desk-1", "Desk", [speech(12.6, 16.0)], feed)
        speakers = {t.speaker for t in feed.turns if t.event_id in after_restart}
        assert speakers == {"Dana"}, f"after the restart the renamed device reads {speakers}"
        look_alike = await speak(second, "desk-2", "DANA", [speech(16.0, 22.0)], feed)
        ranked = [t for t in feed.turns if t.event_id in look_alike]
        assert ranked and {t.speaker for t in ranked} == {"DANA (2)"}
        await feed.close()
    finally:
        await second.stop()

    # What the store holds: one timeline, the old turns first, one register for all of it.
    opened = await open_store(store_url)
    try:
        kit = RoomKit(store=opened.store, locks=opened.locks)
        events = await kit.list_events(ROOM)
        voice_ids = [e.id for e in events if e.source.channel_type == "voice"]
        assert voice_ids == first_run + after_restart + look_alike
        participants = await kit.get_participants(ROOM)
        assert {p.id: p.display_name for p in participants} == {"desk-1": "Desk", "desk-2": "DANA"}
        register = await kit.get_register(ROOM)
        assert isinstance(register, Register)
        labels = {label_for(e, participants, register) for e in events if e.id in after_restart}
        assert labels == {"Dana"}
        assert {label_for(e, participants, register) for e in events if e.id in look_alike} == {
            "DANA (2)"
        }
    finally:
        await opened.close()


async def test_a_restart_keeps_the_room_on_the_sqlite_default(
    tmp_path: Path, deepgram: DeepgramTestServer
) -> None:
    await two_runs(tmp_path, deepgram, f"sqlite:///{tmp_path}/data/chorus.db")


async def test_a_restart_keeps_the_room_on_postgres(
    tmp_path: Path, deepgram: DeepgramTestServer, postgres_database: str
) -> None:
    await two_runs(tmp_path, deepgram, postgres_url(postgres_database))


async def test_a_store_in_memory_forgets_the_room_at_restart(
    tmp_path: Path, deepgram: DeepgramTestServer
) -> None:
    """The control: the same two runs on `memory://` lose the rename and the rank."""
    with pytest.raises(AssertionError, match="after the restart the renamed device reads"):
        await two_runs(tmp_path, deepgram, "memory://")
