"""A turn costs what it adds, not what the room holds (issue 25.12): the kit keeps each room's
participants and register in memory (`rooms.roster`), appends the register entries a turn creates,
and reads the store again only when the room's revision moved — on every store."""

from __future__ import annotations

import json
from typing import Any

from attribution import label_for
from models import RoomEvent
from rooms import InMemoryStore, RoomKit, RoomStore, TextChannel
from rooms.sqlite import SQLiteStore
from tests.store_fixtures import KitFactory


class StoreReads:
    """What a kit asked of its store: whole reads of participants and register, bytes written."""

    def __init__(self, store: RoomStore) -> None:
        self.participant_reads = 0
        self.register_reads = 0
        self.register_bytes: list[int] = []
        reads_participants, reads_register = store.get_participants, store.get_register
        writes_register = store.put_register

        async def get_participants(room_id: str) -> Any:
            self.participant_reads += 1
            return await reads_participants(room_id)

        async def get_register(room_id: str) -> Any:
            self.register_reads += 1
            return await reads_register(room_id)

        async def put_register(room_id: str, register: dict[str, Any], *, start: int = 0) -> None:
            self.register_bytes.append(len(json.dumps(register)))
            await writes_register(room_id, register, **({"start": start} if start else {}))

        store.get_participants = get_participants  # type: ignore[method-assign]
        store.get_register = get_register  # type: ignore[method-assign]
        store.put_register = put_register  # type: ignore[method-assign]


async def test_a_new_participant_per_turn_writes_only_what_the_turn_adds(new_kit: KitFactory) -> None:
    kit = await new_kit()
    store = kit.store
    web = TextChannel("web")
    kit.register_channel(web)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    reads = StoreReads(store)
    people = 300
    for i in range(people):  # the probe's flood: every post from someone new
        await kit.ensure_participant("r", "web", f"u{i}", display_name=f"Person {i}")
        await web.send(f"u{i}", f"hello from {i}", room_id="r")
    # read once (the first turn), never again: the roster is the kit's own
    assert (reads.participant_reads, reads.register_reads) == (1, 1)
    # each write is the one entry a newcomer adds, not a register that grows with the room
    assert len(reads.register_bytes) == people
    assert max(reads.register_bytes) < 600
    # and what the store holds is the whole register, in order, read by a cold kit
    cold = RoomKit(store=store)  # reads only
    events = await cold.list_events("r")
    participants = await cold.get_participants("r")
    register = await cold.get_register("r")
    assert register is not None and len(register.entries) == people
    assert [label_for(e, participants, register) for e in events] == [f"Person {i}" for i in range(people)]


async def test_a_turn_that_adds_nothing_writes_nothing(new_kit: KitFactory) -> None:
    kit = await new_kit()
    store = kit.store
    web = TextChannel("web")
    kit.register_channel(web)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    await kit.ensure_participant("r", "web", "ian", display_name="Ian")
    reads = StoreReads(store)
    for i in range(20):
        await web.send("ian", f"line {i}", room_id="r")
    assert reads.register_bytes == []
    assert {await kit.label_for("r", e) for e in await kit.list_events("r")} == {"Ian"}


async def test_a_write_from_outside_the_kit_is_read_again() -> None:
    """The revision moves with every write to the store, so a participant written around the kit
    (another process on a shared store, a host writing the store) names the next turn."""
    store = InMemoryStore()
    kit = RoomKit(store=store)
    web = TextChannel("web")
    kit.register_channel(web)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    participant = await kit.ensure_participant("r", "web", "ian", display_name="Ian")
    await store.upsert_participant("r", participant.model_copy(update={"display_name": "Ian Smith"}))
    event = (await web.send("ian", "hello", room_id="r")).event
    assert isinstance(event, RoomEvent)
    assert await kit.label_for("r", event) == "Ian Smith"


async def test_a_register_stored_whole_reads_with_the_entries_appended_after_it(tmp_path: Any) -> None:
    """A file written before registers were appended holds every entry in the register's row; the
    entries appended after it follow them, after a restart too."""
    path = tmp_path / "chorus.db"
    first = await SQLiteStore.open(path)
    kit = RoomKit(store=first)
    web = TextChannel("web")
    kit.register_channel(web)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    await kit.ensure_participant("r", "web", "a", display_name="Ann")
    whole = await first.get_register("r")
    assert whole is not None
    await first.put_register("r", whole)  # as an older Chorus wrote it: all in the row
    await kit.ensure_participant("r", "web", "b", display_name="Bob")
    await kit.ensure_participant("r", "web", "c", display_name="Ana")
    await first.close()
    second = await SQLiteStore.open(path)
    try:
        register = await second.get_register("r")
        assert register is not None
        assert [e["rank"] for e in register["entries"]] == [1, 1, 1]
        assert len({e["name"] for e in register["entries"]}) == 3
    finally:
        await second.close()
