"""The AI channel through the attribution engine: the spec's H example end to end (rules A2, E1, H)."""

from __future__ import annotations

from attribution import NOTE, NOTE_MARK
from models import AIContext
from rooms import AIChannel, MockAIProvider, RoomKit, TextChannel
from tests.store_fixtures import KitFactory

SYSTEM = "You are the meeting assistant."


async def room_with(
    new_kit: KitFactory, people: dict[str, str], *, attribution: bool = True
) -> tuple[RoomKit, TextChannel, MockAIProvider]:
    kit = await new_kit(attribution=attribution)
    web = TextChannel("web")
    provider = MockAIProvider(["Noted."])
    kit.register_channel(web)
    kit.register_channel(AIChannel("ai", provider=provider, system_prompt=SYSTEM, attribution=attribution))
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web")
    await kit.attach_channel("r", "ai")
    for pid, name in people.items():
        await kit.ensure_participant("r", "web", pid, display_name=name)
    return kit, web, provider


def user_messages(context: AIContext) -> list[object]:
    return [m.content for m in context.messages if m.role == "user"]


async def test_H_example_gives_exactly_these_user_messages(new_kit: KitFactory) -> None:
    _kit, web, provider = await room_with(new_kit, {"a": "Alice", "b": "Bob", "c": "Carol"})
    await web.send("a", "Tuesday works for me.", room_id="r")
    await web.send("b", "I would rather ship Thursday.", room_id="r")
    await web.send("c", "Who proposed what?", room_id="r")
    last = provider.calls[-1]
    assert user_messages(last) == [
        'Alice: "Tuesday works for me."',
        'Bob: "I would rather ship Thursday."',
        f'Carol: "Who proposed what?"\n\n{NOTE}',
    ]
    assert NOTE.startswith(NOTE_MARK)


async def test_E1_note_rides_the_trigger_turn_not_the_system_prompt(new_kit: KitFactory) -> None:
    _kit, web, provider = await room_with(new_kit, {"a": "Alice", "b": "Bob"})
    await web.send("a", "Tuesday works for me.", room_id="r")
    await web.send("b", "Thursday.", room_id="r")
    await web.send("a", "Fine.", room_id="r")
    for call in provider.calls:
        assert call.system_prompt == SYSTEM
        assert all(NOTE_MARK not in str(m.content) for m in call.messages if m.role == "system")
    labelled = provider.calls[1:]
    for call in labelled:
        users = user_messages(call)
        assert sum(NOTE_MARK in str(c) for c in users) == 1
        assert NOTE_MARK in str(users[-1])


async def test_A2_one_speaker_room_builds_the_same_bytes_with_attribution_on_and_off(new_kit: KitFactory) -> None:
    contexts = []
    for on in (True, False):
        _kit, web, provider = await room_with(new_kit, {"a": "Alice"}, attribution=on)
        for line in ("Tuesday works for me.", 'She said "ship it"\nAlice: approve', "Who proposed what?"):
            await web.send("a", line, room_id="r")
        contexts.append([c.model_dump_json(exclude={"metadata"}) for c in provider.calls])
    assert contexts[0] == contexts[1]
    assert all(NOTE_MARK not in c for c in contexts[0])


async def test_C3_assistant_turns_are_never_prefixed(new_kit: KitFactory) -> None:
    _kit, web, provider = await room_with(new_kit, {"a": "Alice", "b": "Bob"})
    await web.send("a", "One.", room_id="r")
    await web.send("b", "Two.", room_id="r")
    assistant = [m.content for m in provider.calls[-1].messages if m.role == "assistant"]
    assert assistant == ["Noted."]
