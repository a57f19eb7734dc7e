"""The store contract, on every store: windows from an index, frozen shared events, memory state,
and rooms that outlive the store object (a restart)."""

from __future__ import annotations

import asyncio
import copy
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from models import EventSource, Participant, RoomEvent, TextContent, Visibility
from models.content import CompositeContent, ImageContent
from rooms import ChannelBinding, InMemoryStore, Room, RoomStore
from rooms.sqlite import SQLiteStore
from rooms.store import StoredEvent, window_of
from tests.store_fixtures import StoreFactory


def event(
    n: int, channel: str = "chat", visibility: Visibility = "all", room: str = "r"
) -> RoomEvent:
    return RoomEvent(
        id=f"e{n:05d}",
        room_id=room,
        source=EventSource(channel_id=channel, participant_id=f"u{n % 3}", channel_type="text"),
        content=TextContent(body=f"turn {n}"),
        metadata={"sender_name": f"P{n % 3}", "nested": {"list": [1, 2]}},
        visibility=visibility,
    )


async def filled(new_store: StoreFactory, count: int = 60) -> tuple[RoomStore, list[RoomEvent]]:
    store = await new_store()
    await store.create_room(Room(id="r"))
    events = []
    for n in range(count):
        visibility: Visibility = "all"
        channel = ["chat", "sms", "ai"][n % 3]
        if n % 7 == 0:
            visibility = ["ai"]
        elif n % 11 == 0:
            visibility = "none"
        elif n % 13 == 0:
            visibility = ["sms"]
        e = event(n, channel, visibility)
        await store.add_event(e)
        events.append(e)
    return store, events


@pytest.mark.parametrize("limit", [1, 5, 50, 200])
@pytest.mark.parametrize("channel", ["ai", "sms", "chat", "nobody"])
async def test_list_window_is_the_newest_events_a_channel_may_see(
    new_store: StoreFactory, limit: int, channel: str
) -> None:
    store, events = await filled(new_store)
    got = await store.list_window("r", channel, limit)
    assert [e.id for e in got] == [e.id for e in window_of(events, channel, limit)]
    assert got == window_of(events, channel, limit)


async def test_list_window_pages_back_before_an_event(new_store: StoreFactory) -> None:
    store, events = await filled(new_store)
    newest = await store.list_window("r", "ai", 10)
    older = await store.list_window("r", "ai", 10, before=newest[0].id)
    assert [e.id for e in older + newest] == [e.id for e in window_of(events, "ai", 20)]
    assert await store.list_window("r", "ai", 10, before="no-such-event") == []
    assert await store.list_window("r", "ai", 0) == []


async def test_list_around_gives_a_turns_neighbours(new_store: StoreFactory) -> None:
    store, events = await filled(new_store, 20)
    got = await store.list_around("r", events[10].id, 2, 3)
    assert [e.id for e in got] == [e.id for e in events[8:14]]
    assert [e.id for e in await store.list_around("r", events[0].id, 5, 0)] == [events[0].id]
    assert [e.id for e in await store.list_around("r", events[19].id, 1, 9)] == [
        events[18].id,
        events[19].id,
    ]
    assert await store.list_around("r", "nope", 2, 2) == []


async def test_list_page_walks_the_room_a_page_at_a_time(new_store: StoreFactory) -> None:
    """Issue 25.9: a reader of a long room walks it in pages instead of holding it whole."""
    store, events = await filled(new_store, 23)
    first = await store.list_page("r", None, 10)
    assert [e.id for e in first] == [e.id for e in events[:10]]
    assert [e.id for e in await store.list_page("r", events[9].id, 10)] == [
        e.id for e in events[10:20]
    ]
    assert await store.list_page("r", events[22].id, 10) == []
    assert await store.list_page("r", "no-such-event", 10) == []
    assert await store.list_page("elsewhere", None, 10) == []
    for size in (1, 7, 23, 50):
        pages = [page async for page in store.pages("r", size)]
        assert all(len(p) <= size for p in pages)
        assert [e.id for p in pages for e in p] == [e.id for e in events]


async def test_stored_events_are_shared_values_no_caller_can_change(new_store: StoreFactory) -> None:
    store, events = await filled(new_store, 8)
    composite = RoomEvent(
        id="c1",
        room_id="r",
        source=EventSource(channel_id="chat"),
        content=CompositeContent(parts=[TextContent(body="look"), ImageContent(url="http://x/i.png")]),
        visibility=["chat", "ai"],
    )
    await store.add_event(composite)
    for read in (await store.list_events("r"), await store.list_window("r", "ai", 50)):
        for got in read:
            assert isinstance(got, StoredEvent)
            with pytest.raises(ValueError):
                got.metadata = {}
            with pytest.raises(TypeError):
                got.metadata["author"] = {"name": "Mallory"}
            if "nested" in got.metadata:
                with pytest.raises(TypeError):
                    got.metadata["nested"]["list"].append(3)
            if isinstance(got.visibility, list):
                with pytest.raises(TypeError):
                    got.visibility.append("mallory")
            if isinstance(got.content, CompositeContent):
                with pytest.raises(TypeError):
                    got.content.parts.append(TextContent(body="forged"))
            # A copy is the caller's own to change, and changes nothing stored.
            mine = got.model_copy(deep=True)
            mine.metadata["author"] = {"name": "Mallory"}
            plain = copy.deepcopy(got.metadata)
            plain["x"] = 1
            assert pickle.loads(pickle.dumps(got.metadata)) == got.metadata
    again = await store.get_event("r", events[3].id)
    assert again == events[3] and events[3] == again
    assert "author" not in again.metadata and "x" not in again.metadata
    assert (await store.get_event("r", "c1")) == composite
    # The caller's own object is not frozen by writing it, and changing it changes nothing stored.
    events[4].metadata["late"] = True
    assert "late" not in (await store.get_event("r", events[4].id) or events[0]).metadata


async def test_replace_event_moves_it_between_windows(new_store: StoreFactory) -> None:
    store, events = await filled(new_store, 10)
    hidden = events[9].model_copy(update={"visibility": ["sms"], "content": TextContent(body="x")})
    await store.replace_event(hidden)
    assert hidden.source.channel_id == "chat"  # its own channel still sees it
    assert hidden.id in [e.id for e in await store.list_window("r", "chat", 50)]
    assert hidden.id not in [e.id for e in await store.list_window("r", "ai", 50)]
    assert hidden.id in [e.id for e in await store.list_window("r", "sms", 50)]
    assert (await store.get_event("r", hidden.id)) == hidden
    with pytest.raises(KeyError):
        await store.replace_event(event(999))


async def test_memory_state_is_kept_per_room_and_key(new_store: StoreFactory) -> None:
    store = await new_store()
    await store.create_room(Room(id="r"))
    assert await store.get_memory_state("r", "summary") is None
    value = {"text": "Alice proposed Tuesday.", "through": "e00042", "people": ["Alice"]}
    await store.put_memory_state("r", "summary", value)
    value["people"].append("Mallory")  # the caller's object is not the stored one
    assert await store.get_memory_state("r", "summary") == {
        "text": "Alice proposed Tuesday.",
        "through": "e00042",
        "people": ["Alice"],
    }
    await store.put_memory_state("r", "summary", {"text": "new"})
    assert await store.get_memory_state("r", "summary") == {"text": "new"}
    assert await store.get_memory_state("r", "other") is None
    await store.delete_room("r")
    assert await store.get_memory_state("r", "summary") is None


async def test_an_sqlite_room_outlives_its_store_object(tmp_path: object) -> None:
    from pathlib import Path

    path = Path(str(tmp_path)) / "data" / "chorus.db"
    first = await SQLiteStore.open(path)
    await first.create_room(Room(id="r", metadata={"topic": "launch"}))
    await first.add_binding(ChannelBinding(room_id="r", channel_id="voice", group=True))
    await first.set_sender_room("sms", "+1", "r")
    await first.upsert_participant("r", Participant(id="dev-1", display_name="Alice", connected_via=["voice"]))
    for n in range(5):
        await first.add_event(event(n))
    await first.put_register("r", {"version": 1, "salt": "0" * 32, "entries": []})
    await first.put_memory_state("r", "summary", {"text": "s"})
    await first.close()
    second = await SQLiteStore.open(path)
    try:
        room = await second.get_room("r")
        assert room is not None and room.metadata == {"topic": "launch"}
        assert [b.channel_id for b in await second.get_bindings("r")] == ["voice"]
        assert await second.find_sender_room("sms", "+1") == "r"
        assert [p.display_name for p in await second.get_participants("r")] == ["Alice"]
        assert [e.id for e in await second.list_events("r")] == [f"e{n:05d}" for n in range(5)]
        assert (await second.get_register("r") or {})["salt"] == "0" * 32
        assert await second.get_memory_state("r", "summary") == {"text": "s"}
    finally:
        await second.close()


async def test_a_duplicate_event_or_room_is_a_clear_error(new_store: StoreFactory) -> None:
    store, events = await filled(new_store, 2)
    with pytest.raises(ValueError, match="already"):
        await store.create_room(Room(id="r"))
    with pytest.raises(ValueError, match="already"):
        await store.add_event(events[0])
    assert len(await store.list_events("r")) == 2


@st.composite
def timelines(draw: st.DrawFn) -> list[tuple[str, Visibility]]:
    channels = ["ai", "sms", "chat", "voice"]
    visibility = st.one_of(
        st.just("all"), st.just("none"), st.lists(st.sampled_from(channels), max_size=3)
    )
    return draw(st.lists(st.tuples(st.sampled_from(channels), visibility), max_size=60))


@settings(max_examples=150, deadline=None)
@given(
    timeline=timelines(),
    channel=st.sampled_from(["ai", "sms", "chat", "voice", "other"]),
    limit=st.integers(min_value=0, max_value=70),
    cut=st.integers(min_value=0, max_value=60),
    replaced=st.lists(st.tuples(st.integers(0, 59), st.sampled_from(["all", "none", "ai"])), max_size=5),
)
def test_the_in_memory_index_serves_the_same_windows_as_a_scan(
    timeline: list[tuple[str, Visibility]],
    channel: str,
    limit: int,
    cut: int,
    replaced: list[tuple[int, str]],
) -> None:
    async def check() -> None:
        store = InMemoryStore()
        await store.create_room(Room(id="r"))
        events = [event(n, source, vis) for n, (source, vis) in enumerate(timeline)]
        for e in events:
            await store.add_event(e)
        for index, vis in replaced:  # a replaced event moves between windows
            if index < len(events):
                new_vis: Visibility = ["ai"] if vis == "ai" else vis  # type: ignore[assignment]
                events[index] = events[index].model_copy(update={"visibility": new_vis})
                await store.replace_event(events[index])
        got = await store.list_window("r", channel, limit)
        assert [e.id for e in got] == [e.id for e in window_of(events, channel, limit)]
        if cut < len(events):
            before = await store.list_window("r", channel, limit, before=events[cut].id)
            assert [e.id for e in before] == [e.id for e in window_of(events[:cut], channel, limit)]

    asyncio.run(check())
