"""The voice directory of a running server (issue 27, docs/voices.md): remember, name, forget.

Owns the server's side of remembered voices: the people and prints read from the store
(`rooms.voices.VoiceStore`, the server's `[store]`) and kept in memory by model, the names they
give to each open shared-mic stream's anonymous voices (`voice.identify.StreamVoices`, one per
stream, read from the stream's stage's `speaker_prints`), the suggestions those names make (through
`RoomRenames.suggest`, the one suggestion path), remembering a speaker of a room, enrolling from a
clip, and forgetting a person everywhere at once.

Other processes on the store (`chorus voices`, another `chorus serve`, a `chorus agent` job)
change the same directory: `watch` (started by `start`) waits for the store's word of a change
(`VoiceStore.voices_changed`: a Postgres `NOTIFY`, or `[voices] refresh_s`) and `refresh`es,
reading the people again only when the directory's generation moved. Every read goes through
`_take`, so a person gone from the store is forgotten by `_drop` whether this process or another
deleted them, and the owner hears each change once (`on_change`: renames to drop, stages to
anchor again).

Named on the turn path: `name_for` is called by the server's ON_TRANSCRIPTION hook
(`server.renames.RoomRenames.apply`) for each turn of a shared-mic stream that no rename names,
so a voice named by the directory reads its name from that turn on, exactly as a rename does. A
rename from the page wins over the directory. Prints never leave this module and the store: not
in the feed, the transcript, a log line or a metric (only names and ids do).

The naming side asks only what a `DirectoryStream` is (an id, a room, a stage's prints), so the
LiveKit worker (`livekit_worker.room_agent`) names its shared-mic tracks with this same class,
each track's session as one stream; remembering from a room's voice stays `chorus serve`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from rooms.voices import RememberedVoice, VoiceStore, pack_vector
from server.config import VoicesConfig
from server.room_state import LiveRoom, LiveStream
from voice.centroids import unit_or_none
from voice.diarization_stage import StagePrints
from voice.identify import (
    KnownVoice,
    StreamVoices,
    claimable,
    known_voices,
    turn_person,
    worth_checking,
)

log = logging.getLogger(__name__)

HEARD_EVERY_S = 60.0
"""A person's `last_heard` is written at most this often."""

Suggest = Callable[[str, str, str, Literal["voice", "introduction"], str | None, str | None], None]
"""(room, label, name, source, stream, voice id): publish a suggestion to the room's feed."""


class PrintsSource(Protocol):
    def speaker_prints(self) -> StagePrints | None: ...

    def turn_printer(self, start: float, end: float) -> Callable[[], Any] | None:
        """The print of the stream's audio over a turn's span, run off the loop
        (`server.pipeline.StreamAudio.turn_printer`)."""
        ...


class DirectoryStream(Protocol):
    """What the directory names voices of: one stream of one room whose stage shows its
    anonymous voices' prints (`server.room_state.LiveStream`; a LiveKit worker's shared-mic
    track). Hashable by identity: the directory keeps its state per stream, weakly."""

    @property
    def id(self) -> str: ...

    @property
    def room_id(self) -> str: ...

    @property
    def audio(self) -> PrintsSource | None: ...


Unnamed = tuple[DirectoryStream, str, str]
"""(stream, label, name): a voice of an open stream that a forgotten person had named."""

OnChange = Callable[[list[Unnamed]], None]
"""Told after the directory changed (here or in another process): the voices a forgotten person
had named (their renames go), and the people are new (stages are anchored again)."""


class VoicesError(Exception):
    """A directory request refused: an HTTP status, a problem name and a sentence."""

    def __init__(self, status: int, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.problem = problem
        self.detail = detail


@dataclass(frozen=True)
class Naming:
    """What the directory says of one turn's voice: its name, or the letter again (`revert`:
    its person was forgotten since the last turn; `unmatched`: this turn's own print did not
    match the person)."""

    name: str
    revert: bool = False
    unmatched: bool = False
    """The voice is named, but this turn did not sound like the person, or was too short to tell
    (`name_turn`): it reads as the voice's letter (`name`), and the next turn is checked again."""
    claimed: bool = False
    """This turn sounded like a person named for another voice of the stream (`name_turn`,
    `[voices] claim`): it reads that person's name, and the next turn is checked again."""


class VoiceDirectory:
    """The remembered voices and what they name in the open streams (module docstring)."""

    def __init__(
        self,
        store: VoiceStore,
        config: VoicesConfig,
        suggest: Suggest,
        on_change: OnChange | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.settings = config.identify_settings()
        self._suggest = suggest
        self._voices: dict[str, RememberedVoice] = {}
        self._known: dict[str, list[KnownVoice]] = {}
        """Per model id: the people with prints of that model (unit rows)."""
        self.turns_unmatched = 0
        """Turns of named voices that read their letter: their print did not match (`verify`)."""
        self.turns_claimed = 0
        """Turns that read the name of another voice's person: their print matched (`claim`)."""
        self._streams: weakref.WeakKeyDictionary[DirectoryStream, StreamVoices] = (
            weakref.WeakKeyDictionary()
        )
        self._heard_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.on_change = on_change
        """Told after each change is read (`OnChange`): the owner drops renames, re-anchors."""
        self._generation: int | None = None
        """The store's directory generation when it was last read."""
        self._sync_lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ the people

    async def load(self) -> list[Unnamed]:
        """Read every person and print from the store (at start, after each change made here,
        and when another process's change is seen); what it unnamed (`_sync`)."""
        return await self._sync(force=True)

    async def refresh(self) -> list[Unnamed]:
        """Read the store again when the directory's generation moved since the last read (a
        change of any process on the store); nothing is read otherwise. What it unnamed."""
        return await self._sync(force=False)

    async def _sync(self, *, force: bool) -> list[Unnamed]:
        async with self._sync_lock:
            unnamed, changed = await self._read(force=force)
        if changed and self.on_change is not None:
            self.on_change(unnamed)
        return unnamed

    async def _read(self, *, force: bool) -> tuple[list[Unnamed], bool]:
        """(Under `_sync_lock`.) The store's people as they are now, and what that changes
        here; (the voices unnamed, whether anything was read)."""
        generation = await self.store.voices_generation()  # first: the list is at least as new
        if not force and generation == self._generation:
            return [], False
        voices = await self.store.list_voices()
        self._generation = generation
        return self._take(voices), True

    def _take(self, voices: list[RememberedVoice]) -> list[Unnamed]:
        """The directory is `voices` from now on: every person not among them (forgotten here
        or by another process) is dropped from every open stream (`_drop`)."""
        kept = {v.id for v in voices}
        held = set(self._voices)
        for state in self._streams.values():
            held.update(found.voice_id for found in state.named.values())
            held.update(state.suggested.values())
        unnamed = [entry for voice_id in sorted(held - kept) for entry in self._drop(voice_id)]
        self._voices = {v.id: v for v in voices}
        models = dict.fromkeys(p.model for v in voices for p in v.prints)
        self._known = {model: known_voices(voices, model) for model in models}
        return unnamed

    def _drop(self, voice_id: str) -> list[Unnamed]:
        """The one forget path, for a forget made here or seen from another process: the person
        goes from every open stream's state (`StreamVoices.forget`: the voices it named read as
        their letters from their next turn, its suggestions go); the (stream, label, name) it
        named."""
        unnamed: list[Unnamed] = []
        for stream, state in list(self._streams.items()):
            for label in state.forget(voice_id):
                unnamed.append((stream, label, state.forgotten[label]))
        self._heard_at.pop(voice_id, None)
        return unnamed

    @property
    def people(self) -> list[RememberedVoice]:
        """The people as last read from the store (what names voices here now)."""
        return list(self._voices.values())

    def anchors_for(
        self, model: str, stream: DirectoryStream | None = None
    ) -> dict[str, np.ndarray]:
        """Each person with prints of `model` (but those a voice of `stream` is named already):
        the unit mean of them, by person id (what a stream's stage starts its clustering from,
        `Anchors`)."""
        out: dict[str, np.ndarray] = {}
        state = self._streams.get(stream) if stream is not None else None
        named = {found.voice_id for found in state.named.values()} if state is not None else set()
        for person in self._known.get(model, []):
            if person.id in named:
                continue
            mean = unit_or_none(person.prints.sum(axis=0))
            if mean is not None:
                out[person.id] = mean
        return out

    async def voices(self) -> list[RememberedVoice]:
        return await self.store.list_voices()

    async def add_print(
        self, name: str, model: str, vector: np.ndarray, source: str
    ) -> RememberedVoice:
        unit = unit_or_none(vector)
        if unit is None:
            raise VoicesError(422, "no_voiceprint", "the audio gave no usable voiceprint")
        try:
            voice = await self.store.remember_print(name, model, pack_vector(unit.tolist()), source)
        except ValueError as exc:
            raise VoicesError(422, "bad_request", str(exc)) from exc
        await self.load()
        return voice

    async def forget(self, voice_id: str) -> tuple[bool, list[Unnamed]]:
        """Delete the person and every print from the store, and from every open stream now
        (`_drop`, through the reload that follows): the voices it named read as letters again
        from their next turn. Whether there was such a person, and the (stream, label, name) it
        named (`on_change` hears them too: their renames go)."""
        async with self._sync_lock:  # no refresh reads the store between the delete and this
            gone = await self.store.forget_voice(voice_id)
            unnamed, _ = await self._read(force=True)
        if self.on_change is not None:
            self.on_change(unnamed)
        return gone, unnamed

    # ------------------------------------------------------------------ other processes

    def start(self) -> None:
        """Follow the store's changes (`watch`) until `close`. Needs the loop."""
        if self._watcher is None:
            self._watcher = asyncio.get_running_loop().create_task(
                self.watch(), name="chorus-voices-watch"
            )

    async def watch(self) -> None:
        """Reload whenever another process changes the directory: wait for the store's word of
        a change (`VoiceStore.voices_changed`: Postgres `NOTIFY` at once) or `refresh_s` at the
        latest, then `refresh` (one small read of the generation; the people only when it
        moved). A failed read is logged and tried again at the next turn of the loop."""
        every = self.config.refresh_s
        while True:
            try:
                await self.store.voices_changed(every)
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("reading the voice directory's changes failed")
                await asyncio.sleep(every)

    async def close(self) -> None:
        """Stop following the store's changes, and finish the "last heard" writes in flight."""
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        await self.flush()

    # ------------------------------------------------------------------ naming turns

    def state_of(self, stream: DirectoryStream) -> StreamVoices:
        state = self._streams.get(stream)
        if state is None:
            state = self._streams[stream] = StreamVoices()
        return state

    def name_for(
        self, stream: DirectoryStream, label: str, sender_name: str | None
    ) -> Naming | None:
        """The name the directory gives `label`'s voice in `stream` now (scoring the stream's
        voices not named yet, and publishing new suggestions), or None."""
        state = self.state_of(stream)
        prints = stream.audio.speaker_prints() if stream.audio is not None else None
        if prints is not None and prints.model:
            known = self._known.get(prints.model, [])
            for found in state.update(prints.prints, prints.speech_s, known, self.settings):
                if found.tier == "suggest":
                    self._suggest(
                        stream.room_id, found.label, found.name, "voice", stream.id, found.voice_id
                    )
        named = state.named.get(label)
        if named is not None:
            self._heard(named.voice_id)
            return Naming(named.name)
        former = state.forgotten.pop(label, None)
        if former is not None and sender_name == former:
            return Naming(label, revert=True)
        return None

    async def name_turn(
        self, stream: DirectoryStream, label: str, sender_name: str | None, start: float,
        end: float,
    ) -> Naming | None:
        """`name_for`, and with `[voices] verify` set, the turn checked (`voice.identify`'s
        `turn_person`) on its own print (the stream's audio over `start`…`end`, printed off the
        loop): a turn of a named voice that does not sound like the person (counted in
        `turns_unmatched`) reads as its letter (`unmatched`), unless, with `claim` set, it
        sounds like a person named for another voice of the stream (or, with `claim_new`, a
        remembered person named for none of its voices), whose name it then reads (`claimed`,
        counted in `turns_claimed`), as a turn of an unnamed voice may. A turn too short to
        print (`voice.identify.TURN_MIN_S`) reads its letter (and counts in `turns_unmatched`
        when its voice is named); one the stream's audio no longer holds is not checked."""
        naming = self.name_for(stream, label, sender_name)
        if (naming is not None and naming.revert) or self.settings.verify is None:
            return naming
        state = self.state_of(stream)
        claimed_before = state.claimed.pop(label, None)
        plain = naming
        if plain is None and claimed_before is not None and sender_name == claimed_before:
            plain = Naming(label, unmatched=True)  # the last turn's claimed name is not kept
        prints = stream.audio.speaker_prints() if stream.audio is not None else None
        people = {p.id: p for p in self._known.get(prints.model, [])} if prints is not None else {}
        named = state.named.get(label)
        own = people.get(named.voice_id) if named is not None else None
        present, absent = claimable(
            label, {other: found.voice_id for other, found in state.named.items()},
            set(state.suggested.values()), people,
        )
        if not worth_checking(own, present, self.settings, absent):
            return plain
        printer = stream.audio.turn_printer(start, end) if stream.audio is not None else None
        if printer is None:
            return plain
        turn_print = await asyncio.to_thread(printer)  # None: too short to print, reads no name
        person = turn_person(turn_print, own, present, self.settings, absent)
        if person is not None and person is own:
            return naming
        if own is not None:
            self.turns_unmatched += 1
        if person is not None:
            state.claimed[label] = person.name
            self.turns_claimed += 1
            self._heard(person.id)
            return Naming(person.name, claimed=True)
        return Naming(label, unmatched=True) if own is not None else plain

    def _heard(self, voice_id: str) -> None:
        now = time.time()
        if now - self._heard_at.get(voice_id, 0.0) < HEARD_EVERY_S:
            return
        self._heard_at[voice_id] = now

        async def write() -> None:
            try:
                await self.store.voice_heard(voice_id, now)
            except Exception:
                log.exception("keeping when voice %s was last heard failed", voice_id)

        task = asyncio.get_running_loop().create_task(write(), name=f"chorus-heard-{voice_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ remember

    async def remember(
        self, live: LiveRoom, label: str, name: str, stream_id: str | None
    ) -> tuple[RememberedVoice, LiveStream]:
        """Keep a print of `label`'s voice (from its stream's stage, this room's audio) under
        `name`, and name that voice so in its stream. Refused (`VoicesError`) when no open
        stream of the room hears `label`, when two do and no `stream_id` says which, and below
        `min_speech_s` of its speech."""
        heard: list[tuple[LiveStream, float]] = []
        for stream in live.streams.values():
            if stream_id is not None and stream.id != stream_id:
                continue
            prints = stream.audio.speaker_prints() if stream.audio is not None else None
            if prints is not None and label in prints.prints:
                heard.append((stream, prints.speech_s.get(label, 0.0)))
        if not heard:
            where = f"stream {stream_id!r}" if stream_id else "no open shared-mic stream"
            raise VoicesError(
                404,
                "unknown_speaker",
                f"{where} of room {live.room_id!r} has a voice labelled {label!r}",
            )
        if len(heard) > 1:
            raise VoicesError(
                409,
                "ambiguous_speaker",
                f"{len(heard)} streams have a voice labelled {label!r}: say which with `stream`",
            )
        stream, speech = heard[0]
        if speech < self.config.min_speech_s:
            raise VoicesError(
                422,
                "not_enough_speech",
                f"{label} has spoken {speech:.1f} s; remembering a voice needs at least "
                f"{self.config.min_speech_s:g} s of its speech",
            )
        assert stream.audio is not None
        prints = stream.audio.speaker_prints()
        assert prints is not None
        voice = await self.add_print(
            name, prints.model, prints.prints[label], f"room:{live.room_id}"
        )
        self.state_of(stream).take(label, voice.id, voice.name)
        return voice, stream

    async def flush(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


__all__ = [
    "DirectoryStream",
    "Naming",
    "OnChange",
    "PrintsSource",
    "Unnamed",
    "VoiceDirectory",
    "VoicesError",
]
