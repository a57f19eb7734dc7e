"""The room runtime: routing, participants, hooks, commit and delivery order, memory."""

from __future__ import annotations

import asyncio
import json

import pytest

from models import InboundMessage, Participant, RoomEvent, TextContent
from rooms import (
    AIChannel,
    HookContext,
    HookResult,
    HookTrigger,
    MockAIProvider,
    RoomContext,
    RoutingError,
    SlidingWindowMemory,
    TextChannel,
)
from tests.store_fixtures import KitFactory


def text(channel: str, sender: str, body: str, **kw: object) -> InboundMessage:
    return InboundMessage(channel_id=channel, sender_id=sender, content=TextContent(body=body), **kw)  # type: ignore[arg-type]


async def test_new_sender_gets_a_room_of_their_own(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("sms"))
    a = await kit.process_inbound(text("sms", "+1", "hi"))
    b = await kit.process_inbound(text("sms", "+2", "hello"))
    again = await kit.process_inbound(text("sms", "+1", "me again"))
    assert a.room_id != b.room_id
    assert again.room_id == a.room_id
    assert [e.text for e in await kit.list_events(a.room_id)] == ["hi", "me again"]


async def test_group_binding_takes_every_sender(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("bridge"))
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "bridge", group=True)
    a = await kit.process_inbound(text("bridge", "alice", "one"))
    b = await kit.process_inbound(text("bridge", "bob", "two"))
    assert a.room_id == b.room_id == "r"


async def test_two_group_rooms_need_an_explicit_room(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("bridge"))
    for room in ("r1", "r2"):
        await kit.create_room(room_id=room)
        await kit.attach_channel(room, "bridge", group=True)
    with pytest.raises(RoutingError, match="must name its room_id"):
        await kit.process_inbound(text("bridge", "alice", "one"))
    result = await kit.process_inbound(text("bridge", "alice", "one", room_id="r2"))
    assert result.room_id == "r2"


async def test_unknown_channel_is_refused(new_kit: KitFactory) -> None:
    kit = await new_kit()
    with pytest.raises(KeyError, match="no channel 'nope'"):
        await kit.process_inbound(text("nope", "a", "x"))


async def test_ensure_participant_is_bookkeeping_only(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")
    seen: list[RoomEvent] = []

    @kit.hook(HookTrigger.BEFORE_BROADCAST)
    def watch(event: RoomEvent, ctx: HookContext) -> None:
        seen.append(event)

    first = await kit.ensure_participant("r", "web", "u1", display_name="Alice")
    second = await kit.ensure_participant("r", "web", "u1", display_name="Someone else")
    assert first == second == Participant(id="u1", display_name="Alice", connected_via=["web"])
    assert await kit.list_events("r") == []
    assert seen == []


async def test_before_broadcast_hook_modifies_and_blocks(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")

    @kit.hook(HookTrigger.BEFORE_BROADCAST)
    def censor(event: RoomEvent, ctx: HookContext) -> HookResult[RoomEvent]:
        if "secret" in event.text:
            return HookResult.block("no secrets")
        return HookResult.modify(event.model_copy(update={"content": TextContent(body=event.text.upper())}))

    ok = await kit.process_inbound(text("web", "u", "hello", room_id="r"))
    blocked = await kit.process_inbound(text("web", "u", "the secret", room_id="r"))
    assert ok.event is not None and ok.event.text == "HELLO"
    assert blocked.blocked and blocked.event is None and blocked.reason == "no secrets"
    assert [e.text for e in await kit.list_events("r")] == ["HELLO"]


async def test_after_broadcast_observer_sees_committed_events(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")
    seen: list[str] = []

    @kit.hook(HookTrigger.AFTER_BROADCAST)
    async def observe(event: RoomEvent, ctx: HookContext) -> None:
        seen.append(event.text)

    await kit.process_inbound(text("web", "u", "one", room_id="r"))
    await kit.drain()
    assert seen == ["one"]


async def test_failing_observer_does_not_break_the_room(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")

    @kit.hook(HookTrigger.AFTER_BROADCAST)
    def explode(event: RoomEvent, ctx: HookContext) -> None:
        raise RuntimeError("boom")

    result = await kit.process_inbound(text("web", "u", "one", room_id="r"))
    await kit.drain()
    assert result.event is not None


async def test_ai_reply_is_stored_and_delivered_after_the_trigger(new_kit: KitFactory) -> None:
    kit = await new_kit()
    web = TextChannel("web")
    kit.register_channel(web)
    kit.register_channel(AIChannel("ai", provider=MockAIProvider(["Hi there."])))
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web")
    await kit.attach_channel("r", "ai")
    await kit.process_inbound(text("web", "u", "hello", room_id="r"))
    events = await kit.list_events("r")
    assert [(e.source.channel_id, e.text) for e in events] == [("web", "hello"), ("ai", "Hi there.")]
    assert [e.text for e in web.delivered] == ["Hi there."]


async def test_concurrent_messages_are_delivered_in_commit_order(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    sink = TextChannel("sink")
    kit.register_channel(sink)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web")
    await kit.attach_channel("r", "sink")
    await asyncio.gather(*(kit.process_inbound(text("web", f"u{i}", str(i), room_id="r")) for i in range(20)))
    committed = [e.text for e in await kit.list_events("r")]
    assert [e.text for e in sink.delivered] == committed
    assert sorted(committed, key=int) == [str(i) for i in range(20)]


async def test_an_inbound_event_id_the_room_holds_is_not_committed_again(new_kit: KitFactory) -> None:
    """Issue 25.10: a transport's retried message (same `event_id`) commits once, copies posted
    at the same time included; the check runs under the room lock before any hook, so a
    duplicate reaches no channel, no hook and no model."""
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    kit.register_channel(AIChannel("ai", provider=MockAIProvider(["Hi there."])))
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "ai")
    hooked: list[str] = []

    @kit.hook(HookTrigger.BEFORE_BROADCAST)
    def count(event: RoomEvent, ctx: HookContext) -> HookResult[RoomEvent]:
        hooked.append(event.id)
        return HookResult.allow()

    results = await asyncio.gather(
        *(kit.process_inbound(text("web", "u", "hello", room_id="r", event_id="m1")) for _ in range(5))
    )
    assert [r.duplicate for r in results].count(False) == 1
    [first] = [r for r in results if not r.duplicate]
    assert first.event is not None and first.event.id == "m1"
    assert all(r.event is None and not r.blocked and r.room_id == "r" for r in results if r.duplicate)
    other = await kit.process_inbound(text("web", "u", "hello", room_id="r", event_id="m2"))
    assert other.event is not None and not other.duplicate
    events = await kit.list_events("r")
    assert [(e.source.channel_id, e.text) for e in events] == [
        ("web", "hello"), ("ai", "Hi there."), ("web", "hello"), ("ai", "Hi there.")
    ]
    assert hooked.count("m1") == 1


async def test_visibility_limits_delivery(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    a, b = TextChannel("a"), TextChannel("b")
    kit.register_channel(a)
    kit.register_channel(b)
    await kit.create_room(room_id="r")
    for ch in ("web", "a", "b"):
        await kit.attach_channel("r", ch)
    await kit.post_event("r", "web", TextContent(body="for a"), visibility=["a"])
    await kit.post_event("r", "web", TextContent(body="stored only"), visibility="none")
    assert [e.text for e in a.delivered] == ["for a"]
    assert b.delivered == []
    assert len(await kit.list_events("r")) == 2


async def test_update_event_replaces_content_and_drops_the_author_record(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")
    result = await kit.process_inbound(text("web", "u", "draft", room_id="r", metadata={"sender_name": "Alice"}))
    assert result.event is not None and "author" in result.event.metadata
    updated = await kit.update_event("r", result.event.id, content=TextContent(body="final"))
    assert updated.text == "final" and "author" not in updated.metadata
    assert [e.text for e in await kit.list_events("r")] == ["final"]


async def test_update_event_tells_the_other_channels_in_delivery_order(new_kit: KitFactory) -> None:
    """A replaced event reaches the channels that were delivered it (`deliver_update`), after
    the events committed before the update and before those committed after; not its own
    channel, and not as a second `deliver`."""
    kit = await new_kit()
    source, seen = TextChannel("voice"), TextChannel("device")
    order: list[tuple[str, str]] = []

    class Watching(TextChannel):
        async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
            order.append(("deliver", event.text))
            await super().deliver(event, ctx)

        async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
            order.append(("update", event.text))
            await super().deliver_update(event, ctx)

    watching = Watching("watching")
    for channel in (source, seen, watching):
        kit.register_channel(channel)
    await kit.create_room(room_id="r")
    for channel in (source, seen, watching):
        await kit.attach_channel("r", channel.channel_id)
    early = await source.send("mic", "what do I", room_id="r")
    assert early.event is not None
    await source.send("mic", "next", room_id="r")
    await kit.update_event("r", early.event.id, content=TextContent(body="what do I here seek?"))
    await source.send("mic", "after", room_id="r")
    assert order == [("deliver", "what do I"), ("deliver", "next"),
                     ("update", "what do I here seek?"), ("deliver", "after")]
    assert [e.text for e in seen.delivered] == ["what do I here seek?", "next", "after"]
    assert source.delivered == []


def test_sliding_window_keeps_the_newest_visible_events() -> None:
    from models import EventSource

    events = [
        RoomEvent(room_id="r", source=EventSource(channel_id="web"), content=TextContent(body=str(i)))
        for i in range(10)
    ]
    events[8] = events[8].model_copy(update={"visibility": ["other"]})
    window = SlidingWindowMemory(max_events=3).window(events, "ai")
    assert [e.text for e in window] == ["6", "7", "9"]


async def test_stored_register_holds_no_id_and_no_name_in_clear(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="room-1")
    await kit.ensure_participant("room-1", "web", "user-4711", display_name="Marguerite")
    await kit.process_inbound(text("web", "user-4711", "hi", room_id="room-1"))
    await kit.process_inbound(text("web", "guest-0815", "yo", room_id="room-1", metadata={"sender_name": "Bartholomew"}))
    stored = json.dumps(await kit.store.get_register("room-1"))
    for secret in ("user-4711", "guest-0815", "Marguerite", "marguerite", "Bartholomew", "bartholomew", "web"):
        assert secret not in stored


async def test_D5_a_name_given_by_update_event_keeps_its_rank_from_later_senders(new_kit: KitFactory) -> None:
    kit = await new_kit()
    kit.register_channel(TextChannel("web"))
    await kit.create_room(room_id="r")
    await kit.process_inbound(text("web", "a", "hi", room_id="r", metadata={"sender_name": "Alice"}))
    first = await kit.process_inbound(text("web", "b", "hello", room_id="r", metadata={"sender_name": "Bob"}))
    assert first.event is not None
    await kit.update_event("r", first.event.id, metadata={"sender_name": "ALICE"})
    later = await kit.process_inbound(text("web", "c", "me too", room_id="r", metadata={"sender_name": "alice"}))
    assert later.event is not None
    events = await kit.list_events("r")
    labels = [await kit.label_for("r", e) for e in events]
    assert labels == ["Alice", "ALICE (2)", "alice (3)"]
