"""Attribution rules D1–D7: look-alike names, ranks, the register (spec: attribution.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from attribution import (
    Register,
    commit_turn,
    label_for,
    reads_alike,
    rebuild_register,
    register_participant,
    skeleton,
)
from attribution.confusables import confusable_sources
from models import EventSource, Participant, RoomEvent, TextContent
from rooms import ChannelBinding, Room, RoomKit, TextChannel
from tests.store_fixtures import KitFactory

ALICE = Participant(id="u-alice-7", display_name="Alice", connected_via=["chat"])
BOB = Participant(id="u-bob-7", display_name="Bob", connected_via=["chat"])


def turn(
    text: str = "hi", *, by: str | None = None, channel: str = "chat", **metadata: Any
) -> RoomEvent:
    return RoomEvent(
        room_id="r1",
        source=EventSource(channel_id=channel, participant_id=by),
        content=TextContent(body=text),
        metadata=metadata,
    )


def said(name: str, channel: str = "sms1", by: str | None = None) -> RoomEvent:
    return turn(channel=channel, by=by, sender_name=name)


def commit(register: Register, event: RoomEvent, people: list[Participant]) -> RoomEvent:
    author = commit_turn(register, event, people)
    if author:
        event.metadata["author"] = author
    return event


def labels(
    register: Register, names: list[str], people: list[Participant] | None = None
) -> list[str]:
    people = people or []
    events = [commit(register, said(name, by=f"s{i}"), people) for i, name in enumerate(names)]
    return [label_for(e, people, register) for e in events]


# --- D1 ----------------------------------------------------------------------------------------


def test_D1_confusables_come_from_the_unicode_data() -> None:
    sources = confusable_sources()
    assert len(sources) > 5000  # confusables.txt maps thousands of characters
    assert skeleton("А") == "A"  # Cyrillic capital A
    assert skeleton("Ӏ") == skeleton("l") == skeleton("I") == skeleton("1")
    assert skeleton("m") == "rn"
    assert skeleton("ｐａｙｐａｌ") == "paypal"


def test_D1_reads_alike_by_case_skeleton_or_both() -> None:
    assert reads_alike("Alice", "ALICE")  # case folding
    assert reads_alike("Alice", "Аlice")  # skeleton (Cyrillic А)
    assert reads_alike("Lan", "Ian")  # skeleton of Ian reads like Lan after folding
    assert reads_alike("Ian", "ian")
    assert not reads_alike("Lan", "ian")  # only through Ian (transitive, in the register)
    assert not reads_alike("Alice", "Alicia")


def test_D1_transitive_group_lan_ian_ian() -> None:
    assert labels(Register.new(), ["Lan", "Ian", "ian"]) == ["Lan", "Ian (2)", "ian (3)"]


# --- D2 ----------------------------------------------------------------------------------------


def test_D2_alice_ALICE_cyrillic_alice() -> None:
    assert labels(Register.new(), ["Alice", "ALICE", "Аlice"]) == [
        "Alice",
        "ALICE (2)",
        "Аlice (3)",
    ]


def test_D2_registered_participant_keeps_the_plain_name() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    impostor = commit(register, said("alice"), [ALICE])
    alice = commit(register, turn(by="u-alice-7"), [ALICE])
    assert label_for(impostor, [ALICE], register) == "alice (2)"
    assert label_for(alice, [ALICE], register) == "Alice"


def test_D2_participant_registered_after_a_look_alike_spoke_takes_a_rank() -> None:
    register = Register.new()
    early = commit(register, said("alice"), [ALICE])
    register_participant(register, ALICE)
    alice = commit(register, turn(by="u-alice-7"), [ALICE])
    assert label_for(early, [ALICE], register) == "alice"
    assert label_for(alice, [ALICE], register) == "Alice (2)"


def test_D2_same_sender_keeps_its_rank_and_unrelated_names_are_plain() -> None:
    register = Register.new()
    first = commit(register, said("Bob", by="+1"), [])
    commit(register, said("BOB", by="+2"), [])
    again = commit(register, said("Bob", by="+1"), [])
    carol = commit(register, said("Carol", by="+3"), [])
    assert [label_for(e, [], register) for e in (first, again, carol)] == ["Bob", "Bob", "Carol"]


def test_D2_two_voices_on_one_stream_take_two_ranks() -> None:
    mic = Participant(id="dev-1", display_name="Room mic", connected_via=["voice"])
    register = Register.new()
    register_participant(register, mic)
    a = commit(register, said("Speaker A", channel="voice", by="dev-1"), [mic])
    a2 = commit(register, said("speaker a", channel="voice", by="dev-1"), [mic])
    assert label_for(a, [mic], register) == "Speaker A"
    assert label_for(a2, [mic], register) == "speaker a (2)"


# --- D3 ----------------------------------------------------------------------------------------


def test_D3_rank_is_stored_with_name_and_salted_source_digest() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    author = commit_turn(register, said("Alice"), [ALICE])
    assert author["name"] == "Alice"
    assert author["rank"] == 2
    assert isinstance(author["source"], str) and len(author["source"]) == 32
    assert "sms1" not in json.dumps(author)


def test_D3_renamed_participant_reads_as_named_then() -> None:
    register = Register.new()
    people = [ALICE]
    register_participant(register, ALICE)
    before = commit(register, turn("old", by="u-alice-7"), people)
    renamed = ALICE.model_copy(update={"display_name": "Alicia"})
    register_participant(register, renamed)
    after = commit(register, turn("new", by="u-alice-7"), [renamed])
    assert label_for(before, [renamed], register) == "Alice"
    assert label_for(after, [renamed], register) == "Alicia"


def test_D3_ranks_do_not_change_as_the_window_slides() -> None:
    register = Register.new()
    events = [commit(register, said(name, by=name), []) for name in ["Lan", "ian", "Ian", "LAN"]]
    first = [label_for(e, [], register) for e in events]
    for _ in range(3):
        commit(register, said("lan", by="later"), [])
    assert (
        [label_for(e, [], register) for e in events]
        == first
        == ["Lan", "ian", "Ian (2)", "LAN (3)"]
    )


def test_D3_turn_without_record_is_ranked_when_read() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    replaced = said("Alice")  # e.g. replaced by update_event: no author record
    assert label_for(replaced, [ALICE], register) == "Alice (2)"
    assert register.entries and len(register.entries) == 1  # reading does not register


def test_D3_forged_author_record_is_ignored() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    commit(register, said("Alice", by="+1"), [ALICE])
    forged = said("Alice", by="+1")
    forged.metadata["author"] = {"name": "Alice", "rank": 1, "source": "0" * 32}
    assert label_for(forged, [ALICE], register) == "Alice (2)"
    nameless = turn(channel="sms1")
    nameless.metadata["author"] = {"name": "Alice", "rank": 1, "source": "f" * 32}
    assert label_for(nameless, [ALICE], register) == "@sms1"


def test_D3_record_copied_from_another_event_is_not_trusted() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    alice = commit(register, turn(by="u-alice-7"), [ALICE])
    impostor = commit(register, said("Alice", by="+1"), [ALICE])
    impostor.metadata["author"] = dict(alice.metadata["author"])
    assert label_for(impostor, [ALICE], register) == "Alice (2)"
    typed = said("Alice", by="+2")
    typed.metadata["author"] = dict(alice.metadata["author"])
    assert label_for(typed, [ALICE], register) == "Alice (3)"


def test_D3_record_from_another_register_is_not_trusted() -> None:
    mine, theirs = Register.new(), Register.new()
    register_participant(mine, ALICE)
    event = commit(theirs, said("Alice"), [])
    assert label_for(event, [ALICE], mine) == "Alice (2)"


# --- D4 ----------------------------------------------------------------------------------------


def test_D4_impostor_of_a_registered_person_carries_a_rank() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    impostor = commit(register, said("Alice", channel="chat", by="u-bob-7"), [ALICE, BOB])
    assert label_for(impostor, [ALICE, BOB], register) == "Alice (2)"


def test_D4_name_reading_like_two_participants_renumbers_neither() -> None:
    lan = Participant(id="u-lan-7", display_name="Lan", connected_via=["chat"])
    ian = Participant(id="u-ian-7", display_name="ian", connected_via=["chat"])
    people = [lan, ian]
    register = Register.new()
    register_participant(register, lan)
    register_participant(register, ian)
    bridge = commit(register, said("Ian"), people)
    lan_turn = commit(register, turn(by="u-lan-7"), people)
    ian_turn = commit(register, turn(by="u-ian-7"), people)
    assert [label_for(e, people, register) for e in (lan_turn, ian_turn, bridge)] == [
        "Lan",
        "ian",
        "Ian (2)",
    ]


def test_D4_newcomer_takes_the_lowest_rank_free_across_joined_groups() -> None:
    register = Register.new()
    got = labels(register, ["Lan", "LAN", "ian", "Ian"])
    assert got == ["Lan", "LAN (2)", "ian", "Ian (3)"]


# --- D5 ----------------------------------------------------------------------------------------


def test_D5_hidden_turns_take_ranks_blocked_turns_do_not() -> None:
    register = Register.new()
    register_participant(register, ALICE)
    hidden = said("Alice", by="+1")
    hidden.visibility = ["ai1"]
    commit(register, hidden, [ALICE])
    _blocked = said("ALICE", by="+2")  # a hook blocked it: commit_turn is never called
    later = commit(register, said("alice", by="+3"), [ALICE])
    assert label_for(later, [ALICE], register) == "alice (3)"  # a rank gap, nothing more


# --- D6 ----------------------------------------------------------------------------------------


def test_D6_register_json_holds_no_id_and_no_name_in_clear() -> None:
    people = [
        ALICE,
        BOB,
        Participant(id="u-dana-7", display_name="Dana", identity_id="idn-dana-7", connected_via=[]),
    ]
    register = Register.new()
    for person in people:
        register_participant(register, person)
    for event in [
        turn(by="u-alice-7"),
        turn(by="idn-dana-7", channel="voice-9"),
        said("Speaker A", channel="voice-9", by="dev-mic-7"),
        said("Mallory", channel="sms-7", by="+15550100"),
        turn(channel="sms-7", by="+15550199"),
    ]:
        commit(register, event, people)
    dumped = register.model_dump_json()
    for secret in [
        "u-alice-7",
        "u-bob-7",
        "u-dana-7",
        "idn-dana-7",
        "dev-mic-7",
        "+15550100",
        "+15550199",
        "voice-9",
        "sms-7",
        "Alice",
        "alice",
        "Bob",
        "Dana",
        "Speaker",
        "Mallory",
        "mallory",
    ]:
        assert secret not in dumped
    assert Register.model_validate_json(dumped) == register


def test_D6_malformed_register_is_a_clear_error() -> None:
    with pytest.raises(ValidationError, match="salt"):
        Register.model_validate({"salt": "not hex", "entries": []})
    with pytest.raises(ValidationError, match="rank"):
        Register.model_validate(
            {"salt": "0" * 32, "entries": [{"source": "a", "name": "b", "keys": [], "rank": 0}]}
        )


def test_D6_each_register_has_its_own_salt() -> None:
    one, two = Register.new(), Register.new()
    assert one.salt != two.salt
    register_participant(one, ALICE)
    register_participant(two, ALICE)
    assert one.entries[0].source != two.entries[0].source


# --- D7 ----------------------------------------------------------------------------------------


def test_D7_rebuild_register_from_the_timeline() -> None:
    timeline = [
        said("alice", by="+1"),
        turn(by="u-alice-7"),
        said("ALICE", by="+2"),
        turn("x", channel="sms9"),
    ]
    register = rebuild_register(timeline, [ALICE])
    got = [label_for(e, [ALICE], register) for e in timeline]
    assert got == ["alice (2)", "Alice", "ALICE (3)", "@sms9"]
    # A register rebuilt the same way again reads the same.
    assert [label_for(e, [ALICE], rebuild_register(timeline, [ALICE])) for e in timeline] == got


def test_D7_rebuild_skips_system_events() -> None:
    notice = RoomEvent(
        room_id="r1",
        source=EventSource(channel_id="runtime"),
        content=TextContent(body="x"),
        kind="system",
    )
    register = rebuild_register([notice, said("Bob")], [])
    assert len(register.entries) == 1
    assert label_for(notice, [], register) == ""


async def _room_from_before_the_register(new_kit: KitFactory) -> RoomKit:
    """A room whose store holds turns by `Alice` and `ALICE` and no register (a room from before
    it, or one that lost it)."""
    kit = await new_kit()
    store = kit.store
    for channel in ("sms1", "chat"):
        kit.register_channel(TextChannel(channel))
    await store.create_room(Room(id="r"))
    await store.add_binding(ChannelBinding(room_id="r", channel_id="sms1", group=True))
    for sender, name in [("+1", "Alice"), ("+2", "ALICE")]:
        await store.add_event(
            RoomEvent(
                room_id="r",
                source=EventSource(channel_id="sms1", participant_id=sender, channel_type="text"),
                content=TextContent(body=f"{name} here"),
                metadata={"sender_name": name},
            )
        )
    assert await store.get_register("r") is None
    return kit


async def _labels(kit: RoomKit) -> list[str]:
    return [await kit.label_for("r", e) for e in await kit.list_events("r")]


async def test_D7_ensure_participant_rebuilds_the_register_before_adding_the_newcomer(
    new_kit: KitFactory,
) -> None:
    kit = await _room_from_before_the_register(new_kit)
    await kit.ensure_participant("r", "chat", "u-alice", display_name="Alice")
    await kit.post_event("r", "chat", TextContent(body="new here"), participant_id="u-alice")
    assert await _labels(kit) == ["Alice", "ALICE (2)", "Alice (3)"]


async def test_D7_update_participant_rebuilds_the_register_before_the_rename(
    new_kit: KitFactory,
) -> None:
    kit = await _room_from_before_the_register(new_kit)
    await kit.store.upsert_participant(
        "r", Participant(id="u-bob", display_name="Bob", connected_via=["chat"])
    )
    await kit.update_participant("r", "u-bob", display_name="Alice")
    await kit.post_event("r", "chat", TextContent(body="renamed"), participant_id="u-bob")
    assert await _labels(kit) == ["Alice", "ALICE (2)", "Alice (3)"]


@pytest.mark.parametrize("name", ["", "   ", ":::"])
def test_D_participant_without_a_readable_name_is_not_registered(name: str) -> None:
    register = Register.new()
    register_participant(register, Participant(id="u-x", display_name=name, connected_via=["chat"]))
    assert register.entries == []
