"""Issue 25.4: a room-wide rename ("Speaker A = Alice") was kept by label and came back after a
reconnect or a restart, where the reconnected stream's first voice — Bob — was stored and sent
to the model as Alice. A shared-mic label names a voice only within its stream: a label rename
ends with its stream(s); what lasts is a one-person stream's participant's rename (the token says
who the participant is). Checked with the real `RoomRenames` hook on a SQLite store."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rooms import HookContext, RoomKit, open_store
from server.feed import RoomFeed
from server.framing import StreamDeclaration
from server.pipeline import StreamInfo
from server.renames import RoomRenames
from server.room_state import LiveRoom, LiveStream
from voice.audio import StreamFormat
from voice.events import TranscriptionEvent

ROOM = "standup"


def stream(stream_id: str, participant: str, *, shared_mic: bool) -> LiveStream:
    declaration = StreamDeclaration(participant, None, shared_mic, StreamFormat(16000, "pcm16", 1))
    return LiveStream(StreamInfo(ROOM, stream_id, declaration), "device", lambda pcm, rate: [])


def turn(of: LiveStream, label: str) -> TranscriptionEvent:
    session: Any = SimpleNamespace(id=of.id)
    return TranscriptionEvent(
        text="I approve the release.", speaker=label, sender_name=None, start=0.0, end=1.0,
        words=(), participant_id=of.declaration.participant, session=session,
    )


class Room:
    """One live room on `kit` with its rename hook, as `LiveRooms` wires them."""

    def __init__(self, kit: RoomKit) -> None:
        self.kit = kit
        self.live = LiveRoom(ROOM, RoomFeed(queue_size=64, history=64))
        self.sessions: dict[str, LiveStream] = {}
        self.renames = RoomRenames(kit, {ROOM: self.live}, self.sessions)

    def open(self, s: LiveStream) -> LiveStream:
        self.live.streams[s.id] = s
        self.sessions[s.id] = s
        return s

    def close(self, s: LiveStream) -> None:
        self.live.streams.pop(s.id)
        self.sessions.pop(s.id)

    async def name_of(self, value: TranscriptionEvent) -> str | None:
        result = await self.renames.apply(value, HookContext(ROOM, "voice", self.kit))
        if result is None or result.value is None:
            return value.sender_name
        assert isinstance(result.value, TranscriptionEvent)
        return result.value.sender_name


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Room]:
    """The room on a SQLite file in `tmp_path`, taken up as a restarted server takes it up (its
    lasting renames loaded); its saves flushed and the store closed at the end."""
    opened = await open_store(f"sqlite:///{tmp_path}/chorus.db")
    kit = RoomKit(store=opened.store, locks=opened.locks)
    if await kit.get_room(ROOM) is None:
        await kit.create_room(room_id=ROOM)
    room = Room(kit)
    await room.renames.load(room.live)
    try:
        yield room
    finally:
        await room.renames.flush()
        await opened.close()


async def test_a_room_wide_rename_names_the_open_streams_voice_and_not_the_next_streams(
    tmp_path: Path,
) -> None:
    async with served(tmp_path) as room:
        desk = room.open(stream("device-1", "desk", shared_mic=True))
        other = room.open(stream("device-2", "table", shared_mic=True))
        room.renames.rename(ROOM, "Speaker A", "Alice")  # no stream: every open shared-mic one
        assert await room.name_of(turn(desk, "Speaker A")) == "Alice"
        assert await room.name_of(turn(other, "Speaker A")) == "Alice"
        assert await room.name_of(turn(desk, "Speaker B")) is None
        # the desk reconnects: a new stream, whose first voice (Bob) is its Speaker A
        room.close(desk)
        again = room.open(stream("device-3", "desk", shared_mic=True))
        assert await room.name_of(turn(again, "Speaker A")) is None

    async with served(tmp_path) as restarted:  # the label rename did not come back
        after = restarted.open(stream("device-4", "desk", shared_mic=True))
        assert await restarted.name_of(turn(after, "Speaker A")) is None


async def test_a_one_person_streams_rename_lasts_for_its_participant(tmp_path: Path) -> None:
    async with served(tmp_path) as room:
        leg = room.open(stream("call-1", "caller-dana", shared_mic=False))
        room.renames.rename(ROOM, "Speaker 0", "Dana", stream_id=leg.id)
        assert await room.name_of(turn(leg, "Speaker 0")) == "Dana"

    async with served(tmp_path) as restarted:
        back = restarted.open(stream("call-2", "caller-dana", shared_mic=False))
        assert await restarted.name_of(turn(back, "Speaker 1")) == "Dana"  # the participant, any label
        stranger = restarted.open(stream("call-3", "caller-erin", shared_mic=False))
        assert await restarted.name_of(turn(stranger, "Speaker 0")) is None


async def test_label_renames_an_earlier_version_kept_are_not_read_back() -> None:
    kit = RoomKit()
    await kit.create_room(room_id=ROOM)
    await kit.store.put_memory_state(
        ROOM, RoomRenames.RENAMES_KEY, {"labels": {"Speaker A": "Alice"}, "participants": {}}
    )
    room = Room(kit)
    await room.renames.load(room.live)
    s = room.open(stream("device-1", "desk", shared_mic=True))
    assert await room.name_of(turn(s, "Speaker A")) is None


def test_a_suggestion_for_a_voice_already_renamed_is_not_sent() -> None:
    room = Room(RoomKit())
    consumer = room.live.feed.subscribe()
    room.live.renames[("device-1", "Speaker A")] = "Alice"  # renamed in its stream
    room.live.renames[(None, "Speaker B")] = "Bob"  # renamed in every stream
    for label in ("Speaker A", "Speaker B", "Speaker C"):
        room.renames.suggest(ROOM, label, "Ian", "voice", "device-1", "voice-1")
    sent = [json.loads(consumer.queue.get_nowait()) for _ in range(consumer.queue.qsize())]
    assert [(m["type"], m["label"]) for m in sent] == [("speaker_suggestion", "Speaker C")]
