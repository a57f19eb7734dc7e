"""The live second pass (issue 23, item 3): stretches of committed turns re-decoded with context,
in the background, and each turn corrected in place.

Why: the live path decodes speech in pieces of at most 4 s with a shortened encoder window, so that
a turn comes back within a second; on far-field speech those cuts cost about 20 points of WER
(issue 23's table). Re-decoding each turn alone does not win that back (a live turn is mostly one
4 s piece: measured, pooled far-field WER 58.4 → 55.1 %); re-decoding the speech around it
together does (58.9 → 39.5 %, the batch decode's figure). So the session's `TurnWriter` gathers
committed turns into stretches (turns less than `gap` apart, spanning at most `max_stretch`,
whoever speaks) and hands each stretch, with its audio from the session's `AudioLog`, to the
`SecondPass` when the next turn falls outside it, after `hold` seconds with no new turn, or at the
stream's end. The stretch is decoded whole (up to `MAX_CHUNK` seconds at once; longer in chunks cut
between first-pass words) with the second-pass recogniser's encoder window, faster-whisper's
temperature fallback and, with `prompt_turns`, the text of the session's previous turns as
Whisper's prompt. `assign_words` gives each re-decoded word to the turn owning the first-pass word
nearest it; where a turn's words differ, the writer replaces it in place exactly as an early commit
the final corrected is replaced (`kit.update_event`, metadata `corrected: true`, plus
`second_pass: true`): the device, the feed, realtime and chat sessions (a correction note), the ACP
agent and LiveKit captions all hear it.

What the second pass never does: change who spoke (a turn keeps its speaker, its name and its
hooks' renames; words are shared out by the first pass's times, never moved between speakers by
what they say), touch a turn a hook edited the text of, remove a turn (a turn the re-decode gives
no words keeps the first pass's), or hold anything back: the first pass goes on while it works, on
a model instance of its own (its own lock, so a 30 s window never delays a live decode).

When it falls behind (one worker per `SecondPass`, one per server: the CPU is the bound): a
stretch waiting longer than `max_age` seconds is skipped, and at most `max_waiting` wait (the
oldest is skipped first). Each turn's outcome is counted in `stats` (the server's `/metrics`:
`chorus_second_pass_total{outcome=…}`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

from voice.audio import STT_SAMPLE_RATE
from voice.stt.base import RawWord
from voice.turns import Word

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

MAX_CHUNK = 28.0
"""Seconds decoded at once (Whisper's window is 30 s; the padding fits beside it)."""
SPAN_TOLERANCE = 0.15
"""Seconds either side of the first pass's span a re-decoded word's middle may fall in."""
STRETCH_GAP = 0.8
"""Seconds of pause between two turns that end a stretch (the next turn starts another)."""
STRETCH_HOLD = 6.0
"""Seconds with no new turn after which a stretch is re-decoded as it is: longer than the first
pass takes to close a turn in continuous speech (pieces of at most 4 s and its decode), so a
speaker who goes on is not cut into stretches of one turn."""


class Redecoder(Protocol):
    """What re-decodes a turn's audio (`voice.stt.whisper.WhisperSTT.redecode`)."""

    def redecode(self, audio: FloatAudio, offset: float,
                 prompt: str | None = None) -> tuple[RawWord, ...]:
        """Words of `audio` (blocking: called from a worker thread), in the times of `offset`."""
        ...

    def describe(self) -> str: ...


@dataclass
class SecondPassStats:
    """What the second pass did with the turns it was given."""

    corrected: int = 0
    """Re-decoded, and the words differed: the turn was corrected in place."""
    same: int = 0
    """Re-decoded, and the words were the same (or it heard none: the first pass's stay)."""
    skipped_behind: int = 0
    """Not re-decoded: it waited longer than `max_age`, or `max_waiting` newer turns came."""
    skipped_edited: int = 0
    """Not re-decoded: a hook had edited the turn's text (the edit stands)."""
    stale: int = 0
    """Re-decoded, but the turn changed meanwhile (the final or a reopening revised it)."""
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"corrected": self.corrected, "same": self.same,
                "skipped_behind": self.skipped_behind, "skipped_edited": self.skipped_edited,
                "stale": self.stale, "failed": self.failed}


Apply = Callable[[tuple[tuple[Word, ...], ...]], Awaitable[list[str]]]
"""Hears a job's re-decoded words, one tuple per turn of its stretch (`assign_words`), and says
what became of each turn: `SecondPassStats`' outcome names (`corrected`, `same`, `stale`,
`skipped_edited`)."""


@dataclass(eq=False)
class SecondPassJob:
    """One stretch of committed turns to re-decode (one turn or several close together)."""

    session_id: str
    audio: FloatAudio
    offset: float
    """Session time of `audio[0]`."""
    turns: tuple[tuple[Word, ...], ...]
    """The first pass's words of each turn of the stretch, in order (which re-decoded word is
    whose, and the gaps where a long stretch is cut)."""
    prompt: str | None
    apply: Apply
    submitted: float = 0.0
    done: asyncio.Future[list[str]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())


def _distance(middle: float, word: Word) -> float:
    if word.start <= middle <= word.end:
        return 0.0
    return min(abs(middle - word.start), abs(middle - word.end))


def assign_words(redecoded: Sequence[RawWord], turns: Sequence[Sequence[Word]],
                 tolerance: float = SPAN_TOLERANCE) -> tuple[tuple[Word, ...], ...]:
    """The re-decoded words of a stretch split among its turns (first-pass words of each): a word
    whose middle falls within the stretch's span widened by `tolerance` goes to the turn owning
    the first-pass word nearest it (a neighbour outside the stretch, heard in the padding, goes
    nowhere), with that turn's speaker. One tuple per turn, in order; a turn may get none."""
    owned = [(w, i) for i, words in enumerate(turns) for w in words]
    out: list[list[Word]] = [[] for _ in turns]
    if not owned:
        return tuple(tuple(x) for x in out)
    lo = min(w.start for w, _ in owned) - tolerance
    hi = max(w.end for w, _ in owned) + tolerance
    for raw in redecoded:
        middle = (raw.start + raw.end) / 2
        if not lo <= middle <= hi:
            continue
        _, i = min(owned, key=lambda o: _distance(middle, o[0]))
        out[i].append(Word(raw.text, raw.start, raw.end, raw.confidence, turns[i][0].speaker))
    return tuple(tuple(x) for x in out)


def chunk_bounds(words: Sequence[Word], offset: float, duration: float,
                 max_chunk: float = MAX_CHUNK) -> list[tuple[float, float]]:
    """Where to decode a stretch's audio (session times from `offset` over `duration`): in one
    piece when it fits `max_chunk`, else in pieces of at most `max_chunk` cut in the middle of the
    widest gap between first-pass words in each piece's last third (at `max_chunk` when no gap)."""
    start, end = offset, offset + duration
    bounds: list[tuple[float, float]] = []
    while end - start > max_chunk:
        limit = start + max_chunk
        gaps = [(b.start - a.end, (a.end + b.start) / 2) for a, b in itertools.pairwise(words)
                if start + max_chunk * 2 / 3 <= (a.end + b.start) / 2 < limit]
        cut = max(gaps)[1] if gaps else limit
        bounds.append((start, cut))
        start = cut
    bounds.append((start, end))
    return bounds


class SecondPass:
    """Re-decodes stretches of committed turns in the background, one at a time, newest kept
    when behind."""

    def __init__(self, recogniser: Redecoder, *, max_waiting: int = 8, max_age: float = 20.0,
                 prompt_turns: int = 0, pad: float = 0.2, gap: float = STRETCH_GAP,
                 max_stretch: float = MAX_CHUNK, hold: float = STRETCH_HOLD) -> None:
        if max_waiting < 1:
            raise ValueError(f"max_waiting must be at least 1, got {max_waiting}")
        if max_age <= 0:
            raise ValueError(f"max_age must be positive, got {max_age}")
        if gap < 0 or max_stretch <= 0 or hold <= 0:
            raise ValueError(f"gap, max_stretch and hold must be positive, got {gap}, "
                             f"{max_stretch}, {hold}")
        self.recogniser = recogniser
        self.max_waiting = max_waiting
        self.max_age = max_age
        """Seconds a turn may wait to be re-decoded; older ones are skipped (the worker is behind)."""
        self.prompt_turns = prompt_turns
        """The text of this many previous turns of the session is the prompt (0: none)."""
        self.pad = pad
        """Seconds of audio either side of the stretch the recogniser hears."""
        self.gap = gap
        """A turn starting more than this many seconds after the stretch's end starts another."""
        self.max_stretch = max_stretch
        """Seconds a stretch may span (from its first turn's start to its last turn's end)."""
        self.hold = hold
        """Seconds without a new turn after which the stretch is re-decoded as it is (a room that
        went quiet); the session's end re-decodes it at once."""
        self.stats = SecondPassStats()
        self._waiting: deque[SecondPassJob] = deque()
        self._wake = asyncio.Event()
        self._worker: asyncio.Task[None] | None = None
        self._running: SecondPassJob | None = None
        self._closed = False

    def describe(self) -> str:
        return f"second pass: {self.recogniser.describe()}"

    async def load(self) -> None:
        """Load the recogniser's model now (a worker thread), if it has a `load`."""
        load = getattr(self.recogniser, "load", None)
        if load is not None:
            await load()

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def submit(self, job: SecondPassJob) -> None:
        """Queue a stretch (from the event loop). The worker starts with the first job."""
        if self._closed:
            self._finish(job, "skipped_behind")
            return
        job.submitted = asyncio.get_running_loop().time()
        self._waiting.append(job)
        while len(self._waiting) > self.max_waiting:
            self._finish(self._waiting.popleft(), "skipped_behind")
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())
        self._wake.set()

    async def settled(self, session_id: str) -> None:
        """Wait until every job of `session_id` queued so far is done (applied or skipped)."""
        pending = [j.done for j in self._waiting if j.session_id == session_id]
        if self._running is not None and self._running.session_id == session_id:
            pending.append(self._running.done)
        if pending:
            await asyncio.gather(*(asyncio.shield(f) for f in pending))

    async def aclose(self) -> None:
        """Stop: the waiting jobs are skipped, the one in progress is left to finish."""
        self._closed = True
        while self._waiting:
            self._finish(self._waiting.popleft(), "skipped_behind")
        if self._worker is not None:
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass

    def record(self, outcome: str) -> None:
        """Count one turn's outcome (a `SecondPassStats` field name)."""
        setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)

    def _finish(self, job: SecondPassJob, outcome: str | list[str]) -> None:
        """Count the job's turns' outcomes (one for all of them, or one each) and say so."""
        outcomes = [outcome] * len(job.turns) if isinstance(outcome, str) else outcome
        for each in outcomes:
            self.record(each)
        if not job.done.done():
            job.done.set_result(outcomes)

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            job = self._waiting.popleft()
            if loop.time() - job.submitted > self.max_age:
                self._finish(job, "skipped_behind")
                continue
            self._running = job
            try:
                words = await asyncio.to_thread(self._decode, job)
            except asyncio.CancelledError:
                self._running = None
                self._finish(job, "skipped_behind")
                raise
            except Exception:
                log.exception("second pass: re-decoding %.1f s of session %s failed",
                              len(job.audio) / STT_SAMPLE_RATE, job.session_id)
                self._running = None
                self._finish(job, "failed")
                continue
            outcome: str | list[str]
            try:
                outcome = await job.apply(words)
            except Exception:
                log.exception("second pass: correcting turns of session %s failed", job.session_id)
                outcome = "failed"
            self._running = None
            self._finish(job, outcome)

    def _decode(self, job: SecondPassJob) -> tuple[tuple[Word, ...], ...]:
        """The stretch's words as the second pass hears them, split among its turns (worker
        thread)."""
        duration = len(job.audio) / STT_SAMPLE_RATE
        heard: list[RawWord] = []
        prompt = job.prompt
        everyone = sorted((w for words in job.turns for w in words), key=lambda w: w.start)
        for a, b in chunk_bounds(everyone, job.offset, duration):
            lo = max(0, round((a - job.offset) * STT_SAMPLE_RATE))
            hi = min(len(job.audio), round((b - job.offset) * STT_SAMPLE_RATE))
            words = self.recogniser.redecode(job.audio[lo:hi], job.offset + lo / STT_SAMPLE_RATE,
                                             prompt)
            heard.extend(words)
            if words and self.prompt_turns:
                prompt = " ".join(w.text for w in words)
        return assign_words(heard, job.turns)


__all__ = ["MAX_CHUNK", "SPAN_TOLERANCE", "STRETCH_GAP", "STRETCH_HOLD", "Redecoder", "SecondPass",
           "SecondPassJob", "SecondPassStats", "assign_words", "chunk_bounds"]
