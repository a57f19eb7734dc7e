"""Feeding one stream's diarization stage off the event loop (rule V5, P3).

A `StageDriver` belongs to one voice session and owns its stage's side of the stream: it hears
the session's accepted audio once, in order (`AudioLog` → `stage.feed` in a worker thread, every
`step` seconds of new audio), keeps what the stage decided near the words still to place, reads
the stage's provisional view where the stage declares one (`StageAbilities`, never probed), and
finds the handovers the stage decided (one voice ended while another goes on). What it learns it
hands on through callbacks: the view to the session's `TurnAssembler`, each handover to the
assembler and to the STT stream (a local engine cuts its utterance there).

One stage per session: the stage holds one stream's state (`reset()` before it serves another),
so a server pools stages, not channels.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

import numpy as np
import numpy.typing as npt

from voice.assembler import CHANGE_MAX_GAP
from voice.audio import STT_SAMPLE_RATE, AudioLog, resample
from voice.diarization_stage import (
    DecidesLate,
    DiarizationStage,
    ProvisionalView,
    RecentView,
    SpeakerTimeline,
    abilities_of,
)

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

TIMELINE_KEPT = 10.0
"""Seconds of the stage's decided timeline kept before the earliest word still to be placed."""
CHANGE_MIN_VOICE = 0.3
"""Seconds: a decided voice change counts only when the stage heard each voice at least this
long."""

ViewCallback = Callable[[SpeakerTimeline, SpeakerTimeline, float], None]
"""(decided timeline near the words still to place, provisional view, seconds heard)."""
HandoverCallback = Callable[[float, str], None]
"""(where the voice ended, whose voice it was)."""


def decided_handovers(timeline: SpeakerTimeline, after: float) -> list[tuple[float, str]]:
    """Where the stage has *decided* that one voice ended and another goes on (they overlap, or
    the pause between them is at most `CHANGE_MAX_GAP`), later than `after`, in time order, as
    (where the first voice ended, whose voice it was). Only decided segments count (the
    provisional view flickers: cutting at it split sentences of one voice, docs/benchmarks.md
    "Turn latency, third pass"), only voices heard `CHANGE_MIN_VOICE` each, and only where the
    first voice's segment ended before the second's (a short voice inside a longer one is no
    handover)."""
    heard = sorted((s for s in timeline.segments
                    if s.end > after and s.duration >= CHANGE_MIN_VOICE),
                   key=lambda s: (s.start, s.end))
    found: list[tuple[float, str]] = []
    told = after
    for before, following in itertools.pairwise(heard):
        if following.speaker == before.speaker or following.start - before.end > CHANGE_MAX_GAP:
            continue
        if following.end <= before.end:
            continue  # the second voice ended first: the first one goes on
        at = max(before.end, (before.end + following.start) / 2)
        if at > told:
            found.append((at, before.speaker))
            told = at
    return found


class StageDriver:
    """One session's stage, fed off the loop. `since()` says from when the decided timeline is
    still needed (the earliest word still to place, less a margin for a reconnect's replay)."""

    def __init__(
        self,
        stage: DiarizationStage,
        audio: AudioLog,
        *,
        step: float,
        since: Callable[[], float],
        on_view: ViewCallback,
        on_handover: HandoverCallback,
    ) -> None:
        self.stage = stage
        self.abilities = abilities_of(stage)
        self.audio = audio
        self.step = step
        self._since = since
        self._on_view = on_view
        self._on_handover = on_handover
        self.fed = 0
        """Samples (at 16 kHz) the stage has been handed."""
        self.decided = SpeakerTimeline()
        self._undecided = SpeakerTimeline()
        self._told = 0.0
        self._lock = asyncio.Lock()  # the stage hears its audio once, in order
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def heard(self) -> float:
        """Seconds of the stream the stage has been handed."""
        return self.fed / STT_SAMPLE_RATE

    def start(self, on_step: Callable[[], Awaitable[None]]) -> None:
        """Feed the stage in the background every `step` seconds of new audio; `on_step` runs
        after each feed (the session moves its words on)."""
        self._task = asyncio.create_task(self._loop(on_step))

    def wake(self) -> None:
        """New audio was accepted."""
        self._wake.set()

    def cancel(self) -> None:
        """Stop feeding the stage now (a caller's deadline passed); `stop` waits for it."""
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except BaseException:
                pass
            self._task = None

    async def _loop(self, on_step: Callable[[], Awaitable[None]]) -> None:
        step = int(self.step * STT_SAMPLE_RATE)
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self.audio.total - self.fed >= step:
                await self.feed()
                await on_step()

    async def feed(self) -> None:
        """Hand the stage everything accepted so far (in a worker thread) and pass its view on."""
        async with self._lock:
            upto = self.audio.total
            if upto <= self.fed:
                return
            chunk = self.audio.samples(self.fed, upto)
            self.fed = upto
            if len(chunk) == 0:
                return
            if self.stage.sample_rate != STT_SAMPLE_RATE:
                chunk = resample(chunk, STT_SAMPLE_RATE, self.stage.sample_rate)
            since = self._since() - TIMELINE_KEPT
            decided, undecided = await asyncio.to_thread(self._feed, chunk, since)
            self._heard_now(decided, undecided)

    async def feed_quietly(self, session_id: str) -> None:
        """`feed`, logging a failing stage instead of raising (the stream goes on without it)."""
        try:
            await self.feed()
        except Exception:
            log.exception("voice session %s: the diarization stage failed", session_id)

    async def flush(self, session_id: str) -> None:
        """End of stream: the stage hears the rest, and a stage that decides late decides what
        it still holds back."""
        try:
            await self.feed()
            stage = self.stage
            if self.abilities.decides_late and isinstance(stage, DecidesLate):
                async with self._lock:
                    self.decided = await asyncio.to_thread(stage.flush)
                    self._on_view(self.decided, self._undecided, self.heard)
        except Exception:
            log.exception("voice session %s: the diarization stage failed", session_id)

    def _feed(self, chunk: FloatAudio, since: float) -> tuple[SpeakerTimeline, SpeakerTimeline]:
        """In a worker thread: feed, then read the recent part of the decided timeline (a stage
        with a recent view hands over only that: a long stream's whole timeline grows with it,
        and every waiting word searched it) and the provisional view."""
        stage = self.stage
        decided = stage.feed(chunk)
        if self.abilities.recent_view and isinstance(stage, RecentView):
            decided = stage.recent(since)
        undecided = SpeakerTimeline()
        if self.abilities.provisional_view and isinstance(stage, ProvisionalView):
            undecided = stage.provisional()
        return decided, undecided

    def _heard_now(self, decided: SpeakerTimeline, undecided: SpeakerTimeline) -> None:
        self.decided, self._undecided = decided, undecided
        self._on_view(decided, undecided, self.heard)
        for at, speaker in decided_handovers(decided, self._told):
            self._on_handover(at, speaker)
            self._told = at


__all__ = ["StageDriver", "decided_handovers"]
