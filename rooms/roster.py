"""Who is in a room, kept in memory: its participants and its attribution register.

Every committed turn is ranked against the room's participants and register (D3/D5), and the
server labels every turn it sends out. Read from the store for each turn, a room of 1,000
participants cost each commit a parse of every participant and of a 214 KB register, and a write
of the whole register back (issue 25.12: 5–15 commits/s). So the kit keeps one `Roster` per room
it serves and reads the store again only when the room's `RoomStore.revision` moved (another
process sharing a Postgres store wrote it, or someone wrote the store directly); a turn costs what
it adds: a participant row when one joins, the register entries it created (entries never change
once given, D3, so they are appended), nothing when it adds nothing.

The roster is written under the room lock only (as the register always was, D6); readers outside
the lock (labelling a turn for the feed) read whatever is complete, and a labeller that runs on a
worker thread gets a snapshot (`Roster.snapshot`), never the live objects.
"""

from __future__ import annotations

from dataclasses import dataclass

from attribution import Register, rebuild_register
from models import Participant
from rooms.store import RoomStore


@dataclass
class Roster:
    """One room's participants (by id, in the store's order) and register, as of `revision`."""

    revision: int
    participants: dict[str, Participant]
    register: Register
    stored: int | None
    """How many of the register's entries the store holds; None when it holds no register (a
    room from before the register, rebuilt from its timeline, D7: written whole when it changes)."""

    def snapshot(self) -> tuple[list[Participant], Register]:
        """The participants and register as they are now, for a reader off the loop (the lists
        are copied; participants and entries are never changed in place)."""
        register = self.register.model_copy(update={"entries": list(self.register.entries)})
        return list(self.participants.values()), register


class Rosters:
    """The rosters of the rooms a kit serves, each read from the store once and kept up."""

    def __init__(self, store: RoomStore) -> None:
        self.store = store
        self._rooms: dict[str, Roster] = {}

    async def get(self, room_id: str) -> Roster:
        """The room's roster; read (again) from the store when the room's revision moved."""
        revision = await self.store.revision(room_id)
        roster = self._rooms.get(room_id)
        if roster is not None and roster.revision == revision:
            return roster
        participants = {p.id: p for p in await self.store.get_participants(room_id)}
        data = await self.store.get_register(room_id)
        if data is not None:
            register = Register.model_validate(data)
            stored: int | None = len(register.entries)
        else:  # D7: rebuilt from the participants and turns the room has now
            timeline = [e for e in await self.store.list_events(room_id) if e.kind == "message"]
            register = rebuild_register(timeline, list(participants.values()))
            stored = None
        roster = Roster(revision, participants, register, stored)
        self._rooms[room_id] = roster
        return roster

    async def put_participant(self, room_id: str, roster: Roster, participant: Participant) -> None:
        """Store a participant (new or changed) and keep it in the roster."""
        try:
            await self.store.upsert_participant(room_id, participant)
        except BaseException:
            self.forget(room_id)  # what the store holds is not known: read it again next time
            raise
        roster.participants[participant.id] = participant
        roster.revision = await self.store.revision(room_id)

    async def put_register(self, room_id: str, roster: Roster) -> None:
        """Store what the register gained since it was stored: the new entries, appended (none:
        no write); a register the store did not hold, whole."""
        entries = roster.register.entries
        if roster.stored is not None and len(entries) == roster.stored:
            return
        try:
            if roster.stored is None:
                await self.store.put_register(room_id, roster.register.model_dump(mode="json"))
            else:
                added = [e.model_dump(mode="json") for e in entries[roster.stored :]]
                data = {**roster.register.model_dump(mode="json", exclude={"entries"}), "entries": added}
                await self.store.put_register(room_id, data, start=roster.stored)
        except BaseException:
            self.forget(room_id)
            raise
        roster.stored = len(entries)
        roster.revision = await self.store.revision(room_id)

    def forget(self, room_id: str) -> None:
        """Drop the room's roster (the room was deleted or released, or a write failed)."""
        self._rooms.pop(room_id, None)
