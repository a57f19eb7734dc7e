"""Issue 10.3: renames through the feed are client input, so what they fill is bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from rooms import RoomKit
from server.feed import MAX_RENAMES_PER_ROOM, RenameBook, RoomFeed
from server.framing import StreamDeclaration
from server.live import LiveRoom
from server.pipeline import StreamInfo
from server.protocol import RenameRequest, parse_feed_request
from server.renames import RoomRenames
from server.room_state import LiveStream
from voice.audio import StreamFormat


def test_a_flood_of_renames_keeps_a_bounded_book_per_room() -> None:
    room = LiveRoom("r", RoomFeed(queue_size=8, history=8))
    for i in range(3000):
        room.renames[(None, f"Speaker {i}")] = f"Name {i}"
    assert len(room.renames) == MAX_RENAMES_PER_ROOM
    assert isinstance(room.renames, RenameBook) and room.renames.evicted == 3000 - MAX_RENAMES_PER_ROOM
    assert room.renames.get((None, "Speaker 2999")) == "Name 2999"  # the newest are kept
    assert room.renames.get((None, "Speaker 0")) is None


def test_renaming_again_keeps_a_rename_from_being_the_one_forgotten() -> None:
    book = RenameBook(limit=2)
    book[(None, "Speaker A")] = "Alice"
    book[("s1", "Speaker B")] = "Bob"
    book[(None, "Speaker A")] = "Alice"  # set again: now the most recent
    book[(None, "Speaker C")] = "Carol"
    assert dict(book) == {(None, "Speaker A"): "Alice", (None, "Speaker C"): "Carol"}


@given(st.lists(st.tuples(st.sampled_from([None, "s1", "s2"]), st.text(max_size=3)), max_size=60),
       st.integers(1, 10))
def test_a_book_never_exceeds_its_limit_and_keeps_the_latest_name(
    keys: list[tuple[str | None, str]], limit: int,
) -> None:
    book = RenameBook(limit=limit)
    for n, key in enumerate(keys):
        book[key] = str(n)
        assert len(book) <= limit and book[key] == str(n)


def test_a_rename_naming_an_absurdly_long_stream_is_refused() -> None:
    ok = parse_feed_request('{"type": "rename", "label": "Speaker A", "name": "Alice", "stream": "device-1-ab12cd"}')
    assert ok == RenameRequest(label="Speaker A", name="Alice", stream="device-1-ab12cd")
    with pytest.raises(ValidationError, match="stream"):
        parse_feed_request('{"type": "rename", "label": "A", "name": "B", "stream": "' + "x" * 100_000 + '"}')
    with pytest.raises(ValidationError, match="stream"):
        parse_feed_request('{"type": "rename", "label": "A", "name": "B", "stream": ""}')


async def test_saving_renames_keeps_no_lock_for_a_room_once_its_saves_are_done() -> None:
    """Issue 26.7: one save lock per room ever renamed would grow without bound; a lock lives
    only while a save of its room is pending, and saves of one room still land in order."""
    kit = RoomKit()
    rooms = {f"r{i}": LiveRoom(f"r{i}", RoomFeed(queue_size=8, history=8)) for i in range(50)}
    for room_id in rooms:
        await kit.create_room(room_id=room_id)
    for room_id, live in rooms.items():  # a one-person stream in each: its renames last
        declaration = StreamDeclaration("desk", None, False, StreamFormat(16000, "pcm16", 1))
        live.streams["s1"] = LiveStream(StreamInfo(room_id, "s1", declaration), "device",
                                        lambda pcm, rate: [])
    renames = RoomRenames(kit, rooms, {})
    for room_id in rooms:
        renames.rename(room_id, "Desk", "Alice", stream_id="s1")
        renames.rename(room_id, "Desk", "Ann", stream_id="s1")  # the last rename wins
    await renames.flush()
    assert renames._save_locks == {}
    for room_id in rooms:
        saved = await kit.store.get_memory_state(room_id, RoomRenames.RENAMES_KEY)
        assert saved == {"participants": {"desk": "Ann"}}
