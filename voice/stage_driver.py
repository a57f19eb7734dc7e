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

Under overload (issue 31; the policy is `server.overload`'s) the driver measures and obeys: `lag`
is how far the stage's answers are behind the audio accepted, `catch_up=True` (a live server)
has a stage that declares `catches_up` skip the windows of a backlog instead of running each
one, `stretch(factor)` spaces its feeds (and the stage's windows, where it declares
`stretches_step`), `suspend()` stops feeding it (the
session's words take the STT's speakers), and `resume()` starts it afresh on the stream's audio
from then on (`reset()`; its timeline is shifted to stream time, so its voices are new letters).
A change the stage must hear is handed to it in the worker thread, with its next feed, never on
the event loop (its lock may be held by a feed still running).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np
import numpy.typing as npt

from voice.assembler import CHANGE_MAX_GAP
from voice.audio import STT_SAMPLE_RATE, AudioLog, resample
from voice.diarization_stage import (
    Abandons,
    CatchesUp,
    DecidesLate,
    DiarizationStage,
    ProvisionalView,
    RecentView,
    SpeakerSegment,
    SpeakerTimeline,
    StretchesStep,
    abilities_of,
)

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

TIMELINE_KEPT = 10.0
"""Seconds of the stage's decided timeline kept before the earliest word still to be placed."""
CHANGE_MIN_VOICE = 0.3
"""Seconds: a decided voice change counts only when the stage heard each voice at least this
long."""

STAGE_THREADS = 1024
"""Threads the stages' feeds may hold at once: one per stream whose feed is in flight (the
driver's lock allows one), most of them waiting for the shared model service to answer."""
_STAGE_CALLS = ThreadPoolExecutor(max_workers=STAGE_THREADS, thread_name_prefix="chorus-stage")
"""The stage calls' own threads (made as needed, up to `STAGE_THREADS`). Not the loop's default
executor: its min(32, cores + 4) threads (6 on 2 cores) were all held by feeds waiting for the
model service, so at most 6 streams' windows could be batched in one round, and every other
`asyncio.to_thread` call (a new stream's stage, Whisper's VAD and decodes, the transcript
routes) queued behind them: at 48 streams a stream starting late waited up to 9 s for its
stage, and its first turn as long (issue 31, docs/benchmarks.md)."""

_T = TypeVar("_T")


async def in_stage_thread(call: Callable[..., _T], *args: Any) -> _T:
    """`call(*args)` in one of the stage calls' threads (`_STAGE_CALLS`), awaited."""
    return await asyncio.get_running_loop().run_in_executor(_STAGE_CALLS, call, *args)


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
        catch_up: bool = False,
    ) -> None:
        self.stage = stage
        self.abilities = abilities_of(stage)
        self.audio = audio
        self.base_step = step
        self.stretch_factor = 1.0
        """The step is `base_step` times this (`stretch`)."""
        self._stage_factor: float | None = None
        """A stretch the stage has yet to hear (with its next feed, in the worker thread)."""
        self.suspended = False
        """Not fed (`suspend`): the session's words take the STT's speakers."""
        self._suspending = asyncio.Event()
        self._restart = False
        """`resume` was called: the stage is reset with its next feed."""
        self._catch_up = catch_up and self.abilities.catches_up
        """The stage has yet to hear that it catches up (`catch_up`, where the stage declares
        `CatchesUp`): with its first feed, in the worker thread."""
        self.origin = 0
        """Stream sample (16 kHz) where the stage's own time starts (moved by `resume`)."""
        self.answered = 0
        """Samples (at 16 kHz) whose stage answer is back."""
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

    @property
    def step(self) -> float:
        """Seconds of new audio between feeds now."""
        return self.base_step * self.stretch_factor

    @property
    def lag(self) -> float:
        """Seconds of accepted audio whose stage answer is not back yet: how far the stage's
        output is behind the audio received (0 while suspended)."""
        if self.suspended:
            return 0.0
        return max(0, self.audio.total - self.answered) / STT_SAMPLE_RATE

    @property
    def in_flight(self) -> bool:
        """A feed is running (in a worker thread, or waiting for the stage)."""
        return self._lock.locked()

    def stretch(self, factor: float) -> None:
        """Feed every `factor` (>= 1) steps instead of every step, and stretch the stage's own
        step too where it declares `stretches_step`; 1.0: the normal step again."""
        if not factor >= 1.0:
            raise ValueError(f"stretch factor must be >= 1, got {factor}")
        self.stretch_factor = factor
        if self.abilities.stretches_step:
            self._stage_factor = factor

    def suspend(self) -> None:
        """Stop feeding the stage (a feed already running finishes on its own); the decided
        timeline handed on stays what it was."""
        self.suspended = True
        self._suspending.set()
        if self.abilities.abandons and isinstance(self.stage, Abandons):
            self.stage.abandon()  # its queued work would keep the other streams waiting

    def resume(self) -> None:
        """Feed the stage again, afresh from the audio accepted from now on (the audio missed
        while suspended is never fed: catching up is what it could not do)."""
        if not self.suspended:
            return
        self.suspended = False
        self._suspending.clear()
        self._restart = True
        self.fed = self.answered = self.audio.total
        self.origin = self.fed
        self.wake()

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
        while True:
            await self._wake.wait()
            self._wake.clear()
            while (not self.suspended
                   and self.audio.total - self.fed >= int(self.step * STT_SAMPLE_RATE)):
                await self.feed()
                await on_step()

    async def feed(self) -> None:
        """Hand the stage everything accepted so far (in a worker thread) and pass its view on.
        A `suspend` lets a caller waiting here go at once: a feed still running in its thread
        keeps the driver's lock until it returns, so the stage never runs two feeds at once."""
        if self.suspended or not await self._take_lock():
            return
        released = False
        try:
            upto = self.audio.total
            if self.suspended or upto <= self.fed:
                return
            chunk = self.audio.samples(self.fed, upto)
            self.fed = upto
            if len(chunk) == 0:
                self.answered = max(self.answered, upto)
                return
            if self.stage.sample_rate != STT_SAMPLE_RATE:
                chunk = resample(chunk, STT_SAMPLE_RATE, self.stage.sample_rate)
            since = self._since() - TIMELINE_KEPT
            restart, self._restart = self._restart, False
            factor, self._stage_factor = self._stage_factor, None
            call = asyncio.ensure_future(
                in_stage_thread(self._feed, chunk, since, restart, factor))
            suspending = asyncio.ensure_future(self._suspending.wait())
            try:
                await asyncio.wait({call, suspending}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                suspending.cancel()
                if not call.done():  # suspended or cancelled: the thread finishes on its own
                    def answered(done: asyncio.Future[Any]) -> None:
                        self.answered = max(self.answered, upto)
                        self._lock.release()
                        if not done.cancelled() and done.exception() is not None:
                            log.debug("a stage call left behind ended: %s", done.exception())

                    call.add_done_callback(answered)
                    released = True
            if released:
                return
            self.answered = max(self.answered, upto)
            decided, undecided = call.result()
            if not self.suspended:
                self._heard_now(decided, undecided)
        finally:
            if not released:
                self._lock.release()

    async def _take_lock(self) -> bool:
        """The driver's lock, unless the stage is suspended first (then False, not held)."""
        if not self._lock.locked():
            await self._lock.acquire()
            return True
        acquiring = asyncio.ensure_future(self._lock.acquire())
        suspending = asyncio.ensure_future(self._suspending.wait())
        try:
            await asyncio.wait({acquiring, suspending}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            suspending.cancel()
        if not acquiring.done():
            acquiring.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await acquiring
        if acquiring.cancelled():
            return False
        if self.suspended:
            self._lock.release()
            return False
        return True

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
            if (self.abilities.decides_late and isinstance(stage, DecidesLate)
                    and not self.suspended):
                if not await self._take_lock():
                    return
                try:
                    self.decided = self._shifted(await in_stage_thread(stage.flush))
                    self._on_view(self.decided, self._undecided, self.heard)
                finally:
                    self._lock.release()
        except Exception:
            log.exception("voice session %s: the diarization stage failed", session_id)

    def _feed(self, chunk: FloatAudio, since: float, restart: bool = False,
              factor: float | None = None) -> tuple[SpeakerTimeline, SpeakerTimeline]:
        """In a worker thread: start afresh (`resume`) and stretch where asked, feed, then read
        the recent part of the decided timeline (a stage with a recent view hands over only
        that: a long stream's whole timeline grows with it, and every waiting word searched it)
        and the provisional view, in stream time."""
        stage = self.stage
        if restart:
            stage.reset()
        if self._catch_up and isinstance(stage, CatchesUp):
            stage.catch_up(True)  # a live stream behind its stage skips its backlog's windows
            self._catch_up = False
        if factor is not None and isinstance(stage, StretchesStep):
            stage.stretch(factor)
        decided = stage.feed(chunk)
        offset = self.origin / STT_SAMPLE_RATE
        if self.abilities.recent_view and isinstance(stage, RecentView):
            decided = stage.recent(since - offset)
        undecided = SpeakerTimeline()
        if self.abilities.provisional_view and isinstance(stage, ProvisionalView):
            undecided = stage.provisional()
        return self._shifted(decided), self._shifted(undecided)

    def _shifted(self, timeline: SpeakerTimeline) -> SpeakerTimeline:
        """A timeline of the stage's own time in stream time (`origin`: after a `resume`)."""
        if self.origin == 0:
            return timeline
        offset = self.origin / STT_SAMPLE_RATE
        return SpeakerTimeline([SpeakerSegment(s.start + offset, s.end + offset, s.speaker)
                                for s in timeline.segments])

    def _heard_now(self, decided: SpeakerTimeline, undecided: SpeakerTimeline) -> None:
        self.decided, self._undecided = decided, undecided
        self._on_view(decided, undecided, self.heard)
        for at, speaker in decided_handovers(decided, self._told):
            self._on_handover(at, speaker)
            self._told = at


__all__ = ["StageDriver", "decided_handovers"]
