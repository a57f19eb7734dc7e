"""Speaker renames from the page: one rename path for a live room, kept across streams and restarts.

Owns turning a feed's `rename` request into names on the room's turns. Renames go through
`ON_TRANSCRIPTION` (V6) exactly as an application hook's rename would: the server's own hook
(`RoomRenames.apply`, a typed `voice.channel.TranscriptionEvent`) rewrites `sender_name` of the
matching voice's turns. A shared-mic label names a voice only within its stream ("Speaker A"
of the next stream, or of the same device after a reconnect or a restart, may be anyone), so a
label rename lives as long as its stream: with `stream` it names that stream's voice, without it
the voice of that label in every shared-mic stream open now, never one that starts later. The
renames that outlive a stream are a one-person stream's participant's (the participant is who the
token says): kept in the store as the room's memory state `server.renames` and read back when
the room is taken up again. The same hook asks the voice directory (`server.voices`, when on)
for the name of a shared-mic voice no rename names, and `suggest` is the one path of every
`speaker_suggestion` the feed hears (the directory's, and what introductions suggest). Saves of
one room run in order under a lock whose entry lives only while
a save of that room is pending, so the locks do not grow with every room ever renamed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from rooms import HookContext, HookResult, RoomKit
from server.protocol import RenamedMessage, SpeakerSuggestionMessage, dump
from server.room_state import KeyLock, LiveRoom, LiveStream, held
from voice.channel import TranscriptionEvent

if TYPE_CHECKING:
    from server.voices import VoiceDirectory

log = logging.getLogger(__name__)

ONE_PERSON = "\x00one-person"
"""Rename key for a one-person stream: its one voice, whatever label an STT gave it."""


class RoomRenames:
    """The renames of every live room: made from the feed, applied by the ON_TRANSCRIPTION hook."""

    RENAMES_KEY: ClassVar[str] = "server.renames"

    def __init__(
        self, kit: RoomKit, rooms: Mapping[str, LiveRoom], streams: Mapping[str, LiveStream]
    ) -> None:
        self.kit = kit
        self.rooms = rooms
        """The registry's live rooms, by room id."""
        self.streams = streams
        """The registry's open streams, by the `voice_session_id` their turns carry."""
        self._saves: set[asyncio.Task[None]] = set()
        self._save_locks: dict[str, KeyLock] = {}
        self.voices: VoiceDirectory | None = None
        """The voice directory (`[voices] enabled`): names a shared-mic voice no rename names."""

    def rename(self, room_id: str, label: str, name: str, stream_id: str | None = None) -> None:
        """From now on turns of `label` (in `stream_id`, or any stream) read `name` (V6 path)."""
        live = self.rooms.get(room_id)
        if live is None:
            return
        stream = live.streams.get(stream_id) if stream_id is not None else None
        if stream is not None and not stream.declaration.shared_mic:
            live.renames[(stream.id, ONE_PERSON)] = name  # one voice, whatever its label
            live.participant_names[stream.declaration.participant] = name
            self._save(live)
        elif stream_id is not None:
            live.renames[(stream_id, label)] = name
        else:  # the label's voice in each shared-mic stream open now (issue 25.4)
            for open_stream in live.streams.values():
                if open_stream.declaration.shared_mic:
                    live.renames[(open_stream.id, label)] = name
        live.feed.publish(
            dump(RenamedMessage(room=room_id, label=label, name=name, stream=stream_id))
        )

    def suggest(
        self,
        room_id: str,
        label: str,
        name: str,
        source: Literal["voice", "introduction"],
        stream_id: str | None = None,
        voice_id: str | None = None,
    ) -> None:
        """Tell the room's feed that `label` (of `stream_id`, or any stream) may be `name`
        (`speaker_suggestion`); nothing is renamed: a client confirms with a rename. The one
        path every suggestion takes (the voice directory's, and what introductions suggest).
        A voice already renamed (in its stream, or in every stream) gets none: a person named it."""
        live = self.rooms.get(room_id)
        if live is None or (stream_id, label) in live.renames or (None, label) in live.renames:
            return
        live.feed.publish(dump(SpeakerSuggestionMessage(
            room=room_id, label=label, name=name, source=source, stream=stream_id,
            voice=voice_id)))

    def unname(self, room_id: str, stream_id: str, label: str, name: str) -> None:
        """Drop the rename of `label` in `stream_id` when it still reads `name` (its remembered
        voice was forgotten)."""
        live = self.rooms.get(room_id)
        if live is not None and live.renames.get((stream_id, label)) == name:
            del live.renames[(stream_id, label)]

    def current_names(self, room_id: str) -> Callable[[Mapping[str, Any]], str | None]:
        """What a committed voice turn of the room reads now (its metadata in, a name or None
        for the name it was committed with): a voice renamed after its earlier turns were
        committed is named the new way in them too, as the page shows them. A snapshot of the
        room's renames, safe to read off the loop."""
        live = self.rooms.get(room_id)
        renames = dict(live.renames) if live is not None else {}

        def name_of(meta: Mapping[str, Any]) -> str | None:
            session = meta.get("voice_session_id")
            if session is None:
                return None
            one_person = renames.get((str(session), ONE_PERSON))
            if one_person is not None:
                return one_person
            label = meta.get("speaker_label")
            return renames.get((str(session), str(label))) if label is not None else None

        return name_of

    async def apply(
        self, value: object, ctx: HookContext
    ) -> HookResult[TranscriptionEvent] | None:
        """ON_TRANSCRIPTION: page renames, one-person streams named by their participant, and
        (with `[voices]` on) shared-mic voices the voice directory names (`server.voices`)."""
        live = self.rooms.get(ctx.room_id)
        if live is None or not isinstance(value, TranscriptionEvent):
            return None
        stream = self.streams.get(value.session.id)
        label = str(value.speaker)
        name: str | None = None
        if stream is not None:
            name = live.renames.get((stream.id, label))
        if stream is not None and not stream.declaration.shared_mic:
            # One person per stream (a phone leg): whatever labels the STT put on the voice,
            # the turn is the participant's. Unless renamed, no stamped name: the participant
            # record names it (B2).
            name = live.renames.get((stream.id, ONE_PERSON))
            if name is None:  # renamed in an earlier stream (or before a restart)
                name = live.participant_names.get(stream.declaration.participant)
            if name == value.sender_name:
                return None
            return HookResult.modify(dataclasses.replace(value, sender_name=name))
        if name is None and stream is not None and self.voices is not None:
            naming = await self.voices.name_turn(
                stream, label, value.sender_name, value.start, value.end
            )
            if naming is not None:
                name = naming.name
        if name is None or name == value.sender_name:
            return None
        return HookResult.modify(dataclasses.replace(value, sender_name=name))

    async def load(self, live: LiveRoom) -> None:
        """The room's lasting renames, as the store kept them (a room taken up again). Label
        renames an earlier version kept (`labels`) are not read: they named voices of streams
        that are gone."""
        saved = await self.kit.store.get_memory_state(live.room_id, self.RENAMES_KEY) or {}
        people = saved.get("participants", {})
        if isinstance(people, dict):
            live.participant_names.update({str(k): str(v) for k, v in people.items()})

    def _save(self, live: LiveRoom) -> None:
        """Keep the room's lasting renames in the store (in order: the last rename wins)."""

        async def save() -> None:
            async with held(self._save_locks, live.room_id):
                value = {"participants": dict(live.participant_names)}
                try:
                    await self.kit.store.put_memory_state(live.room_id, self.RENAMES_KEY, value)
                except Exception:
                    log.exception("keeping the renames of room %s failed", live.room_id)

        task = asyncio.get_running_loop().create_task(save(), name=f"chorus-renames-{live.room_id}")
        self._saves.add(task)
        task.add_done_callback(self._saves.discard)

    async def flush(self) -> None:
        """Wait for the saves still running (shutdown)."""
        if self._saves:
            await asyncio.gather(*list(self._saves), return_exceptions=True)
