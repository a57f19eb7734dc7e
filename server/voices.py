"""The voice directory of a running server (issue 27, docs/voices.md): remember, name, forget.

Owns the server's side of remembered voices: the people and prints read from the store
(`rooms.voices.VoiceStore`, the server's `[store]`) and kept in memory by model, the names they
give to each open shared-mic stream's anonymous voices (`voice.identify.StreamVoices`, one per
stream, read from the stream's stage's `speaker_prints`), the suggestions those names make (through
`RoomRenames.suggest`, the one suggestion path), remembering a speaker of a room, enrolling from a
clip, and forgetting a person everywhere at once.

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
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from rooms.voices import RememberedVoice, VoiceStore, pack_vector
from server.config import VoicesConfig
from server.room_state import LiveRoom, LiveStream
from voice.centroids import unit_or_none
from voice.diarization_stage import StagePrints
from voice.identify import KnownVoice, StreamVoices, known_voices

log = logging.getLogger(__name__)

HEARD_EVERY_S = 60.0
"""A person's `last_heard` is written at most this often."""

Suggest = Callable[[str, str, str, Literal["voice", "introduction"], str | None, str | None], None]
"""(room, label, name, source, stream, voice id): publish a suggestion to the room's feed."""


class PrintsSource(Protocol):
    def speaker_prints(self) -> StagePrints | None: ...


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
    its person was forgotten since the last turn)."""

    name: str
    revert: bool = False


class VoiceDirectory:
    """The remembered voices and what they name in the open streams (module docstring)."""

    def __init__(self, store: VoiceStore, config: VoicesConfig, suggest: Suggest) -> None:
        self.store = store
        self.config = config
        self.settings = config.identify_settings()
        self._suggest = suggest
        self._voices: dict[str, RememberedVoice] = {}
        self._known: dict[str, list[KnownVoice]] = {}
        """Per model id: the people with prints of that model (unit rows)."""
        self._streams: weakref.WeakKeyDictionary[DirectoryStream, StreamVoices] = (
            weakref.WeakKeyDictionary()
        )
        self._heard_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ the people

    async def load(self) -> None:
        """Read every person and print from the store (start, and after each change)."""
        self._take(await self.store.list_voices())

    def _take(self, voices: list[RememberedVoice]) -> None:
        self._voices = {v.id: v for v in voices}
        models = dict.fromkeys(p.model for v in voices for p in v.prints)
        self._known = {model: known_voices(voices, model) for model in models}

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

    async def forget(self, voice_id: str) -> tuple[bool, list[tuple[DirectoryStream, str, str]]]:
        """Delete the person and every print from the store, and from every open stream now:
        the voices it named read as letters again from their next turn. Whether there was such
        a person, and the (stream, label, name) it named (their renames go too)."""
        gone = await self.store.forget_voice(voice_id)
        self._voices.pop(voice_id, None)
        for model in list(self._known):
            self._known[model] = [k for k in self._known[model] if k.id != voice_id]
        unnamed: list[tuple[DirectoryStream, str, str]] = []
        for stream, state in list(self._streams.items()):
            for label in state.forget(voice_id):
                unnamed.append((stream, label, state.forgotten[label]))
        self._heard_at.pop(voice_id, None)
        await self.load()
        return gone, unnamed

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


__all__ = ["DirectoryStream", "Naming", "PrintsSource", "VoiceDirectory", "VoicesError"]
