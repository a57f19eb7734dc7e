"""Building a model's context costs what the window costs, whatever the room's length (issue 14.1).

Not timed: the store counts the events it hands out, and building a context must read the same
bounded number of them in a room of 400 events and in one of 4,000. Runs on every store.
"""

from __future__ import annotations

from typing import Any

import pytest

from models import RoomEvent, TextContent
from rooms import AIChannel, MockAIProvider, RoomContext, RoomKit, RoomStore, TextChannel
from rooms.memory import Memory, SlidingWindowMemory
from tests.store_fixtures import StoreFactory

READS = ("list_events", "list_window", "list_around", "get_event")


class CountingStore:
    """Wraps a store; counts every event its read methods hand out."""

    def __init__(self, inner: RoomStore) -> None:
        self.inner = inner
        self.events_read = 0

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name not in READS:
            return attr

        async def counted(*args: Any, **kwargs: Any) -> Any:
            result = await attr(*args, **kwargs)
            self.events_read += len(result) if isinstance(result, list) else int(result is not None)
            return result

        return counted


async def room_of(new_store: StoreFactory, turns: int) -> tuple[RoomKit, AIChannel, CountingStore]:
    """The bench's room: three speakers and a group text channel; an AI channel that has not
    answered yet (its window is the default 50)."""
    store = await new_store()
    kit = RoomKit(store=store)
    web = TextChannel("web")
    ai = AIChannel("ai", provider=MockAIProvider(["Noted."]))
    kit.register_channel(web)
    kit.register_channel(ai)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    names = ["Alice", "Bob", "Carol"]
    for n, name in enumerate(names):
        await kit.ensure_participant("r", "web", f"u{n}", display_name=name)
    for n in range(turns):
        await kit.post_event("r", "web", TextContent(body=f"turn {n}"), participant_id=f"u{n % 3}")
    counting = CountingStore(store)
    kit.store = counting  # type: ignore[assignment]
    return kit, ai, counting


async def reads_for_one_context(kit: RoomKit, ai: AIChannel, counting: CountingStore) -> int:
    trigger = (await kit.store.list_events("r", 1))[0]
    counting.events_read = 0
    context = await ai.build_context(trigger, RoomContext("r", kit))
    assert len(context.messages) == 50
    return counting.events_read


async def test_building_a_context_reads_a_bounded_number_of_events(new_store: StoreFactory) -> None:
    short = await reads_for_one_context(*await room_of(new_store, 400))
    long = await reads_for_one_context(*await room_of(new_store, 4000 if _fast(new_store) else 1200))
    assert short == long == 50


def _fast(new_store: StoreFactory) -> bool:
    return getattr(new_store, "kind", "") == "memory"


class EverythingMemory(Memory):
    """A memory that needs more than the window (as a summarizing memory does): `window` only."""

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        return [e for e in events if e.visible_to(channel_id)]


async def test_a_memory_that_needs_every_event_still_gets_them(new_store: StoreFactory) -> None:
    kit, ai, _counting = await room_of(new_store, 120)
    ai.memory = EverythingMemory()
    trigger = (await kit.store.list_events("r", 1))[0]
    context = await ai.build_context(trigger, RoomContext("r", kit))
    assert len(context.messages) == 120


async def test_a_memory_pages_back_through_what_fell_out_of_its_window(new_store: StoreFactory) -> None:
    kit, _ai, _counting = await room_of(new_store, 120)
    window = await SlidingWindowMemory(50).retrieve(kit.store, "r", "ai")
    fell_out = await kit.store.list_window("r", "ai", 1000, before=window[0].id)
    assert [e.text for e in fell_out + window] == [f"turn {n}" for n in range(120)]


@pytest.mark.parametrize("max_events", [0, -1])
def test_a_window_must_hold_an_event(max_events: int) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SlidingWindowMemory(max_events)
