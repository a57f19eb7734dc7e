"""The STT interface (rule S3): one base stream owns the hard part; a provider speaks its protocol.

Why shaped so (as LiveKit's `RecognizeStream`): keepalive, reconnect with carried-over audio,
time offsets and speaker-label continuity are the same for every provider, and they are where
streaming STT goes wrong. `SttStream` owns them once:

- **Audio accounting.** Every pushed sample lands in the session's `AudioLog`. The stream tracks
  how far the current connection has been sent and the end of the last final result.
- **Reconnect (S2).** When a connection drops (the provider's event iterator ends or raises while
  the stream is open), the stream opens a new one and resends the audio from just before the last
  final's end (`REPLAY_MARGIN`): the unsent audio and the sent-but-unfinalized audio are carried
  over, so no word is lost. Words the new connection reports that were already final (same word,
  same time within `DUPLICATE_TOLERANCE`) are dropped, so none is duplicated.
- **Outages (issue 10.1).** Reconnect attempts follow a `Backoff` whose budget is per outage, not
  per stream life: by default the stream retries for as long as it lives, so neither a long outage
  nor many short blips end its transcript. The audio carried over an outage is bounded
  (`max_carry` seconds, also bounded by the log); audio that could not be carried is reported
  as an `AudioLost(start, end)` event naming the exact span of session time. `SttDegraded` (the
  connection dropped) and `SttRecovered` (a new one is up) tell the consumer, who tells the device
  and counts it (`VoiceChannel(on_status=…)`).
- **Time offsets.** Provider times are relative to their connection; the stream shifts them to
  session time.
- **Labels (V3, V4).** Raw per-connection speaker ids become `Speaker A`, `Speaker B` … through
  `SpeakerContinuity`, which matches a new connection's voices to the session's by embedding.
- **Keepalive.** When no audio has been sent for `keepalive_interval`, `SttConnection.keepalive`
  is called (Deepgram: a `KeepAlive` text frame).

A provider implements `SttProvider.connect` returning an `SttConnection`: `send_audio` (PCM16 at
16 kHz), `keepalive`, `finalize`, `close`, and `events()` yielding `RawResult`, `RawUtteranceEnd`
and `RawFinalized` in connection time.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rooms.retry import Backoff
from voice.audio import STT_SAMPLE_RATE, AudioLog, float_to_pcm16
from voice.speakers import LabelledSpan, SpeakerContinuity
from voice.turns import Word

log = logging.getLogger(__name__)

REPLAY_MARGIN = 0.5
"""Seconds of audio before the last final's end that are resent after a reconnect."""
DUPLICATE_TOLERANCE = 0.3
"""A replayed word within this many seconds of an already-final identical word is a duplicate."""
SEND_CHUNK = 0.1
"""Seconds of audio per binary frame sent to a provider."""
CONNECT_TIMEOUT = 10.0
"""Seconds a connect (TCP and handshake) may take; one that has not completed is a failed attempt."""
START_TIMEOUT = 15.0
"""Seconds `SttStream.start` may take over all its attempts: the device hears `started` or a
refusal within it."""
SILENCE_TIMEOUT = 10.0
"""Seconds a provider that answers audio (`SttProvider.answers_audio`: Deepgram sends `Results`,
empty ones included, for every few seconds it hears) may stay silent after audio or a `Finalize`
was sent to it; then the connection is treated as dropped (degraded, reconnect)."""
FLUSH_QUIET_TIMEOUT = 30.0
"""Seconds a flush waits for a provider that does not answer audio (a local engine) to say
anything more before it gives up."""
CLOSE_TIMEOUT = 5.0
"""Seconds `SttStream.aclose` waits for the provider to end the connection after `close`."""


@dataclass(frozen=True)
class SttBounds:
    """How long a stream waits on its provider (each a named constant above by default)."""

    connect: float = CONNECT_TIMEOUT
    start: float = START_TIMEOUT
    silence: float = SILENCE_TIMEOUT
    close: float = CLOSE_TIMEOUT

    def __post_init__(self) -> None:
        if min(self.connect, self.start, self.silence, self.close) <= 0:
            raise ValueError(f"every STT bound must be positive: {self}")


# ------------------------------------------------------------------ provider-side types


@dataclass(frozen=True)
class RawWord:
    """A word as a provider reports it: connection time, the provider's own speaker id."""

    text: str
    start: float
    end: float
    confidence: float = 1.0
    speaker: int | None = None


@dataclass(frozen=True)
class RawResult:
    words: tuple[RawWord, ...]
    is_final: bool
    speech_final: bool = False
    from_finalize: bool = False
    audio_end: float | None = None
    """Connection time up to which a final result covers the audio (words or not)."""


@dataclass(frozen=True)
class RawUtteranceEnd:
    last_word_end: float


@dataclass(frozen=True)
class RawFinalized:
    """The provider has answered a `finalize()`: everything sent so far is final."""


RawEvent = RawResult | RawUtteranceEnd | RawFinalized


class SttRefusedError(ConnectionError):
    """The provider refused this client: bad credentials or no permission (HTTP 401/403).
    Raised by `SttProvider.connect`. Final: retrying cannot help, so the stream never retries
    it. The message names the status and never holds a secret."""


class SttConnection(abc.ABC):
    """One live connection to a provider. Times in its events are relative to its first sample."""

    @abc.abstractmethod
    async def send_audio(self, pcm16: bytes) -> None: ...

    async def keepalive(self) -> None:  # noqa: B027 - optional for providers that never idle out
        """Tell the provider the stream is alive while no audio flows."""

    @abc.abstractmethod
    async def finalize(self) -> None:
        """Ask for everything sent so far to be final; answered by a final `from_finalize` result
        or a `RawFinalized` event."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Close cleanly (after which `events()` ends)."""

    @abc.abstractmethod
    def events(self) -> AsyncIterator[RawEvent]:
        """Results in order. Ends when the connection closes; raises or ends early on a drop."""

    async def abort(self) -> None:
        """Tear down without ceremony (used after a drop)."""
        with contextlib.suppress(Exception):
            await self.close()

    def voice_change(self, at: float) -> None:  # noqa: B027 - optional: only local engines cut
        """A diarization stage decided that one voice gives way to another at `at` (seconds of
        connection time). A provider that cuts its own utterances (Whisper) may end the one in
        progress there, so the words before the change are decoded without waiting for the
        next pause; a streaming provider ignores it."""


class SttProvider(abc.ABC):
    """A speech-to-text engine behind one interface (rule S3)."""

    name: str = "stt"
    diarizes: bool = False
    """True when results carry per-word speaker ids (V3)."""
    keepalive_interval: float | None = None
    sample_rate: int = STT_SAMPLE_RATE
    answers_audio: bool = False
    """True when the provider answers audio within seconds, speech or not (Deepgram); then a
    connection silent for `SttBounds.silence` after audio was sent is treated as dropped."""

    @abc.abstractmethod
    async def connect(self) -> SttConnection: ...

    def describe(self) -> str:
        return self.name

    async def aclose(self) -> None:  # noqa: B027 - optional
        """Release shared resources (models, clients)."""


# ------------------------------------------------------------------ stream events (session time)


@dataclass(frozen=True)
class Transcript:
    words: tuple[Word, ...]
    is_final: bool
    speech_final: bool = False
    generation: int = 0
    hints: tuple[str | None, ...] = ()
    """Interim results only: per word, the session label its provider speaker id is already bound
    to on this connection, or None (a voice not bound yet, or no speaker). A hint, not a label
    (V3: interim words carry no speaker); the channel uses it to see a speaker change before
    the final that confirms it."""


@dataclass(frozen=True)
class UtteranceEnd:
    last_word_end: float


@dataclass(frozen=True)
class StreamError:
    """The stream ended for good: the first connection could not be made, or an outage outlasted
    a finite `Backoff.attempts`."""

    message: str


@dataclass(frozen=True)
class SttRefused:
    """The provider refused the stream's credentials or permission (`SttRefusedError`: HTTP
    401/403), on the first connection or on a reconnect. Final: the stream stops for good and
    never retries; `reason` names the status (no secret in it)."""

    reason: str


@dataclass(frozen=True)
class SttDegraded:
    """The connection dropped; audio is being buffered while the stream reconnects."""

    reason: str
    at: float
    """Session time (seconds of audio received) when the drop was noticed."""


@dataclass(frozen=True)
class SttRecovered:
    """A new connection is up after an outage; the carried audio is being resent."""

    outage_seconds: float
    """Wall time the stream was without a connection."""
    attempts: int
    """Connection attempts this outage took (1: the first retry worked)."""
    resumed_from: float
    """Session time the new connection's audio starts at."""


@dataclass(frozen=True)
class AudioLost:
    """Audio of session time [start, end) was never transcribed: an outage outlasted the bounded
    carry-over buffer, or the STT was down (refused, silent) when the stream ended. Turns on
    either side are unaffected."""

    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


SttStatus = SttDegraded | SttRecovered | AudioLost | StreamError | SttRefused
"""Events about the stream itself (not its words): what a device and the metrics are told."""

SttEvent = (Transcript | UtteranceEnd | StreamError | SttDegraded | SttRecovered | AudioLost
            | SttRefused)


def _brief(exc: BaseException) -> str:
    """A one-line reason for a failed connect (the SDK's messages carry every request header)."""
    text = str(exc) or type(exc).__name__
    status = re.search(r"status_code: (\d+)", text)
    if status:
        return f"HTTP {status.group(1)} from the provider"
    line = text.splitlines()[0] if text.splitlines() else text
    return line if len(line) <= 200 else line[:197] + "..."


def _norm(text: str) -> str:
    return re.sub(r"[^\w']", "", text.lower())


@dataclass
class _Connection:
    conn: SttConnection
    generation: int
    offset_samples: int
    sent: int
    """Session sample index up to which this connection has been sent audio."""
    last_send: float = 0.0
    dropped: bool = False
    unanswered_since: float | None = None
    """Loop time of the first audio or `Finalize` sent after the provider's last event."""


async def _watch(receiver: asyncio.Task[None], *helpers: asyncio.Task[None]) -> None:
    """Until the receive loop ends; a send or keepalive that fails ends the connection too
    (its error is raised), so a socket that refuses audio is never waited on forever."""
    running = {receiver, *helpers}
    while True:
        done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        if receiver in done:
            receiver.result()
            return
        for task in done:
            running.discard(task)
            if not task.cancelled() and task.exception() is not None:
                task.result()  # raises: the connection is dead


@dataclass
class SttStream:
    """One voice session's STT stream: the base that owns keepalive, reconnect and labels."""

    provider: SttProvider
    on_event: Callable[[SttEvent], Awaitable[None]]
    audio: AudioLog = field(default_factory=AudioLog)
    speakers: SpeakerContinuity = field(default_factory=SpeakerContinuity)
    start_attempts: int = 5
    """Attempts at the very first connection: a provider that cannot be reached at all is an
    error the caller sees at `start()`, not an outage."""
    backoff: Backoff = field(default_factory=Backoff)
    """Reconnects after a drop (per outage; by default for as long as the stream lives)."""
    max_carry: float = 60.0
    """Seconds of audio, at most, carried over an outage and resent; older audio is reported lost."""
    stable_after: float = 1.0
    """A connection that lives less than this counts as a failed attempt of the same outage (a
    provider that accepts and at once drops does not reset the backoff)."""
    bounds: SttBounds = field(default_factory=SttBounds)
    """Connect, start, silence and close bounds (`SttBounds`)."""

    generation: int = field(default=-1, init=False)
    reconnects: int = field(default=0, init=False)
    outages: int = field(default=0, init=False)
    """Drops seen (each one an outage, however short)."""
    lost_seconds: float = field(default=0.0, init=False)
    """Audio never transcribed because an outage outlasted the carry-over buffer."""

    def __post_init__(self) -> None:
        if self.start_attempts < 1:
            raise ValueError("start_attempts must be at least 1")
        if self.max_carry <= 0:
            raise ValueError("max_carry must be positive")
        self._current: _Connection | None = None
        self._audio_ready = asyncio.Event()
        self._finalized = asyncio.Event()
        self.heard_at = 0.0
        """Loop time of the provider's last event."""
        self._closing = False
        self._start_by = float("inf")
        """Loop time by which the first connection must be up (`bounds.start`)."""
        self._closing_event = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self.results = ResultReader(self.provider, self.speakers, self.audio)
        """Provider results → session words: times, labels, duplicates, what is final."""
        self._connected = asyncio.Event()
        self._flushed_through = -1
        self._answered_through = 0
        """`audio.total` when the latest answered flush began: all audio before it is final."""
        """`audio.total` when the last flush began (`aclose` flushes again only past it)."""
        self.error: str | None = None
        self.refused: str | None = None
        """Why the provider refused the stream (`SttRefused`), once it has: final."""

    # -- public API ------------------------------------------------------------------------

    @property
    def final_until(self) -> float:
        """Session time of the end of the last final word."""
        return self.results.final_until

    @property
    def covered_until(self) -> float:
        """Session time up to which the provider has answered with final results (words or not)."""
        return self.results.covered_until

    async def start(self) -> None:
        """Open the first connection (raises if the provider cannot be reached at all)."""
        self._start_by = asyncio.get_running_loop().time() + self.bounds.start
        self._runner = asyncio.create_task(self._run(), name=f"stt-{self.provider.name}")
        waiter = asyncio.ensure_future(self._connected.wait())
        await asyncio.wait([waiter, self._runner], return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self.refused is not None and self.error is not None:
            raise SttRefusedError(self.error)
        if self.error is not None:
            raise ConnectionError(self.error)

    @property
    def ended(self) -> bool:
        """The stream stopped for good (refused, or it gave up): nothing more will be sent."""
        return self._runner is not None and self._runner.done()

    @property
    def connected(self) -> bool:
        """A live connection is up (False during an outage)."""
        current = self._current
        return current is not None and not current.dropped

    def push(self, samples: npt.NDArray[np.float32]) -> None:
        """Queue 16 kHz mono float32 audio (it is logged in `audio` and sent in order)."""
        self.audio.append(samples)
        self._audio_ready.set()

    def voice_change(self, at: float) -> None:
        """Pass a decided voice change at `at` (session seconds) on to the live connection, in
        its own time (`SttConnection.voice_change`)."""
        current = self._current
        if current is None or current.dropped:
            return
        local = at - current.offset_samples / STT_SAMPLE_RATE
        if local > 0:
            current.conn.voice_change(local)

    async def flush(self, wait_seconds: float | None = None) -> None:
        """Send what is queued, ask for everything to be final, and wait for the answer. A
        connection that drops meanwhile is replaced and the flush repeated on the new one.

        `wait_seconds` (default: `bounds.silence` for a provider that answers audio, else
        `FLUSH_QUIET_TIMEOUT`) bounds the wait for a provider that has gone quiet, not the
        flush: while results keep coming (a local engine working through a backlog: a long file
        pushed faster than it decodes) the flush waits on, so no queued audio is dropped at the
        end of a stream. Only the provider's answers extend it, never our own `Finalize`.
        """
        quiet = wait_seconds if wait_seconds is not None else (
            self.bounds.silence if self.provider.answers_audio else FLUSH_QUIET_TIMEOUT)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + quiet
        self._flushed_through = self.audio.total
        while self.error is None and loop.time() < deadline:
            await self._wait_sent(deadline - loop.time())
            current = self._current
            if current is None or current.dropped:
                return
            self._finalized.clear()
            with contextlib.suppress(Exception):
                await current.conn.finalize()
            asked = loop.time()
            if current.unanswered_since is None:
                current.unanswered_since = asked
            if not await self._wait_finalized(quiet, asked):
                log.warning("%s: no answer to Finalize, and no result for %.0f s",
                            self.provider.name, quiet)
                return
            if not current.dropped:
                self._answered_through = max(self._answered_through, self._flushed_through)
                return
            deadline = max(deadline, self.heard_at + quiet)  # still answering: wait on

    async def _wait_finalized(self, quiet_seconds: float, asked: float) -> bool:
        """Wait for the Finalize answer (asked at loop time `asked`) while the provider keeps
        answering; False once it has been silent for `quiet_seconds`."""
        loop = asyncio.get_running_loop()
        while True:
            left = max(self.heard_at, asked) + quiet_seconds - loop.time()
            if left <= 0:
                return False
            try:
                await asyncio.wait_for(self._finalized.wait(), left)
                return True
            except TimeoutError:
                continue  # the provider answered meanwhile: wait again from its last answer

    async def aclose(self) -> None:
        """Flush, close the connection cleanly, stop the tasks."""
        if self._runner is None:
            return
        if self.audio.total > self._flushed_through:
            with contextlib.suppress(Exception):
                await self.flush()  # not after a flush that covered it all (or gave up)
        self._closing = True
        self._closing_event.set()
        self._audio_ready.set()
        current = self._current
        if current is not None:
            with contextlib.suppress(Exception):
                await current.conn.close()
        try:
            await asyncio.wait_for(asyncio.shield(self._runner), self.bounds.close)
        except (TimeoutError, Exception):
            self._runner.cancel()
            with contextlib.suppress(BaseException):
                await self._runner
        self._runner = None
        end = self.audio.total
        covered = max(round(self.covered_until * STT_SAMPLE_RATE), self._answered_through)
        if end > covered:
            # the STT was down (or silent, or had refused) when the stream ended: what it had
            # not answered is never transcribed; say so, with its span
            await self._lose(covered, end, "the STT was not answering when the stream ended")

    def abort(self) -> None:
        """Stop now, without a flush (a caller's deadline passed): the runner is cancelled, and
        the live connection with it (its tasks tear it down)."""
        self._closing = True
        self._closing_event.set()
        self._audio_ready.set()
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()

    # -- internals -------------------------------------------------------------------------

    async def _wait_sent(self, wait_seconds: float) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_seconds
        while loop.time() < deadline:
            current = self._current
            if current is not None and not current.dropped and current.sent >= self.audio.total:
                return
            if self._runner is None or self._runner.done():
                return
            await asyncio.sleep(0.01)

    async def _pause(self, seconds: float) -> None:
        """Wait before a retry; `aclose` cuts the wait short."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._closing_event.wait(), seconds)

    async def _open(self, conn: SttConnection) -> _Connection:
        """Bind a fresh connection to the session clock; after a drop, choose the audio to resend
        (bounded by `max_carry`) and report what could not be carried."""
        self.generation += 1
        start = self.audio.first
        if self.generation:
            wanted = int(max(0.0, self.final_until - REPLAY_MARGIN) * STT_SAMPLE_RATE)
            carry_from = max(self.audio.first,
                             self.audio.total - int(self.max_carry * STT_SAMPLE_RATE))
            covered = round(self.covered_until * STT_SAMPLE_RATE)
            if covered < carry_from:
                await self._lose(covered, carry_from)
            start = max(wanted, carry_from)
        loop = asyncio.get_running_loop()
        return _Connection(conn, self.generation, start, start, loop.time())

    async def _lose(self, start: int, end: int, why: str = "") -> None:
        lost = AudioLost(start / STT_SAMPLE_RATE, end / STT_SAMPLE_RATE)
        self.lost_seconds += lost.seconds
        self.results.covered_until = max(self.results.covered_until, lost.end)
        why = why or f"an outage outlasted the {self.max_carry:.0f} s carry-over buffer"
        log.warning("%s: audio from %.2f s to %.2f s was lost (%s)", self.provider.name,
                    lost.start, lost.end, why)
        await self._emit(lost)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        name = self.provider.name
        attempts = 0
        outage_began: float | None = None
        while not self._closing:
            within = self.bounds.connect
            if self.generation < 0:
                within = max(0.01, min(within, self._start_by - loop.time()))
            try:
                try:
                    conn = await asyncio.wait_for(self.provider.connect(), within)
                except TimeoutError:
                    raise TimeoutError(f"the connect did not complete within {within:.1f} s") \
                        from None
            except SttRefusedError as exc:  # final: bad credentials are never retried
                self.refused = str(exc) or "refused by the provider"
                self.error = f"{name}: refused ({self.refused})"
                log.error("%s: the provider refused the stream, not retrying: %s", name,
                          self.refused)
                self._connected.set()
                await self._emit(SttRefused(self.refused))
                return
            except Exception as exc:
                attempts += 1
                if self.generation < 0 and (attempts >= self.start_attempts
                                            or loop.time() >= self._start_by):
                    self.error = f"{name}: cannot connect ({_brief(exc)})"
                    self._connected.set()
                    await self._emit(StreamError(self.error))
                    return
                if self.generation >= 0 and self.backoff.exhausted(attempts):
                    began = outage_began if outage_began is not None else loop.time()
                    self.error = (f"{name}: gave up after {attempts} attempts in an outage of "
                                  f"{loop.time() - began:.1f} s ({_brief(exc)})")
                    await self._emit(StreamError(self.error))
                    return
                log.warning("%s: connect failed (%s), retry %d", name, _brief(exc), attempts)
                await self._pause(self.backoff.delay(attempts))
                continue
            current = await self._open(conn)
            self._current = current
            self._connected.set()
            if outage_began is not None:
                resumed = current.offset_samples / STT_SAMPLE_RATE
                log.info("%s: reconnected (connection %d) after %.2f s, replaying from %.2f s",
                         name, current.generation, loop.time() - outage_began, resumed)
                await self._emit(SttRecovered(loop.time() - outage_began, attempts + 1, resumed))
                outage_began = None
            began_at = loop.time()
            reason = "the provider closed the connection"
            sender = asyncio.create_task(self._send_loop(current))
            keeper = asyncio.create_task(self._keepalive_loop(current))
            receiver = asyncio.create_task(self._receive_loop(current))
            listener = asyncio.create_task(self._silence_loop(current))
            try:
                await _watch(receiver, sender, keeper, listener)
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                log.warning("%s: connection %d dropped: %s", name, current.generation, exc)
            finally:
                for task in (receiver, sender, keeper, listener):
                    task.cancel()
                for task in (receiver, sender, keeper, listener):
                    with contextlib.suppress(BaseException):
                        await task
            if self._closing:
                break
            current.dropped = True
            self.reconnects += 1
            self._finalized.set()  # wake a flush waiting on the dead connection; it retries
            with contextlib.suppress(Exception):
                await current.conn.abort()
            lived = loop.time() - began_at
            attempts = attempts + 1 if lived < self.stable_after else 0
            outage_began = loop.time()
            self.outages += 1
            await self._emit(SttDegraded(reason, self.audio.seconds))
            if self.backoff.exhausted(attempts):
                self.error = f"{name}: gave up after {attempts} short-lived connections"
                await self._emit(StreamError(self.error))
                break
            await self._pause(self.backoff.delay(max(1, attempts)))

    async def _send_loop(self, current: _Connection) -> None:
        chunk = int(SEND_CHUNK * STT_SAMPLE_RATE)
        loop = asyncio.get_running_loop()
        while not self._closing:
            if current.sent >= self.audio.total:
                self._audio_ready.clear()
                if current.sent >= self.audio.total:
                    await self._audio_ready.wait()
                continue
            end = min(current.sent + chunk, self.audio.total)
            if current.sent < self.audio.first:  # fell out of the log: say what was lost
                await self._lose(current.sent, self.audio.first)
                current.sent = self.audio.first
                continue
            samples = self.audio.samples(current.sent, end)
            await current.conn.send_audio(float_to_pcm16(samples))
            current.sent = end
            current.last_send = loop.time()
            if current.unanswered_since is None:
                current.unanswered_since = current.last_send

    async def _silence_loop(self, current: _Connection) -> None:
        """A provider that answers audio (`answers_audio`) and has said nothing for
        `bounds.silence` since audio or a `Finalize` went to it is treated as dropped: raises."""
        if not self.provider.answers_audio:
            return
        silence = self.bounds.silence
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(silence / 4)
            since = current.unanswered_since
            if since is not None and loop.time() - since >= silence:
                raise ConnectionError(f"no answer from the provider for {silence:.1f} s")

    async def _keepalive_loop(self, current: _Connection) -> None:
        interval = self.provider.keepalive_interval
        if not interval:
            return
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(interval / 4)
            if loop.time() - current.last_send >= interval:
                await current.conn.keepalive()
                current.last_send = loop.time()

    async def _receive_loop(self, current: _Connection) -> None:
        offset = current.offset_samples / STT_SAMPLE_RATE
        async for event in current.conn.events():
            self.heard_at = asyncio.get_running_loop().time()
            current.unanswered_since = None
            if isinstance(event, RawFinalized):
                self._finalized.set()
            elif isinstance(event, RawUtteranceEnd):
                await self._emit(UtteranceEnd(event.last_word_end + offset))
            elif isinstance(event, RawResult):
                await self._emit(await self.results.read(current.generation, event, offset))
                if event.from_finalize:
                    self._finalized.set()
        if not self._closing:
            raise ConnectionError("the provider closed the connection")

    async def _emit(self, event: SttEvent) -> None:
        """Hand an event to the consumer. A consumer failure (a hook, a diarization stage) is
        logged and never mistaken for a dropped connection: the stream goes on."""
        try:
            await self.on_event(event)
        except Exception:
            log.exception("%s: the consumer of an STT event failed", self.provider.name)


class ResultReader:
    """A stream's provider results in session terms: connection times shifted to session time,
    raw speaker ids turned into the session's labels (V3, V4: `SpeakerContinuity`, embedding a
    reconnected stream's new voices off the loop), words an earlier connection already made final
    dropped (replayed audio), and how far the provider has answered."""

    def __init__(self, provider: SttProvider, speakers: SpeakerContinuity, audio: AudioLog) -> None:
        self.provider = provider
        self.speakers = speakers
        self.audio = audio
        self.final_until = 0.0
        """Session time of the end of the last final word."""
        self.covered_until = 0.0
        """Session time up to which the provider has answered with final results (words or not)."""
        self._recent_finals: list[tuple[int, Word]] = []
        """Final words of the last 30 s with the connection that reported them (for dedup)."""
        self._interims: dict[int, list[LabelledSpan]] = {}
        self._matching: asyncio.Future[dict[object, str]] | None = None
        """The voice match running in a worker thread, if any (it changes `speakers`)."""
        """Per connection, the labelled words of its latest interim result (what an early turn
        was committed from; a dropped connection's last words that never became final)."""

    def _heard_before(self, generation: int) -> list[LabelledSpan]:
        """Words earlier connections labelled: their final words and their last interim words."""
        heard = [(w.start, w.end, w.speaker) for g, w in self._recent_finals
                 if g < generation and w.speaker is not None]
        for g, spans in self._interims.items():
            if g < generation:
                heard.extend(spans)
        return heard

    async def read(self, generation: int, result: RawResult, offset: float) -> Transcript:
        """One provider result of connection `generation` (whose time 0 is session time
        `offset`) as session words."""
        if self._matching is not None and not self._matching.done():
            # the speakers are being matched in a worker thread (for a connection that may have
            # dropped since): nothing reads or binds labels until it has finished (issue 25.11:
            # a result read meanwhile raised "dictionary changed size during iteration" there,
            # and its voices took phantom letters)
            with contextlib.suppress(Exception):
                await asyncio.shield(self._matching)
        raw = [(w, w.start + offset, w.end + offset) for w in result.words]
        if self.provider.diarizes and generation > 0:
            # replayed audio: a label whose words fall on words an earlier connection labelled
            # is that speaker (before duplicates are dropped: they are the evidence)
            # (only for labels not bound yet: once a connection's voices are bound, nothing)
            unbound: dict[object, list[tuple[float, float]]] = {}
            for w, s, e in raw:
                if w.speaker is not None and self.speakers.letters.get((generation, w.speaker)) is None:
                    unbound.setdefault(w.speaker, []).append((s, e))
            if unbound:
                self.speakers.bind_by_time(generation, unbound, self._heard_before(generation))
        if not result.is_final:
            words = tuple(Word(w.text, s, e, w.confidence, None) for w, s, e in raw)
            hints: tuple[str | None, ...] = ()
            if self.provider.diarizes:
                hints = tuple(None if w.speaker is None
                              else self.speakers.letters.get((generation, w.speaker))
                              for w, _, _ in raw)
                self._interims = {g: ws for g, ws in self._interims.items() if g >= generation - 1}
                self._interims[generation] = [
                    (s, e, hint) for (_, s, e), hint in zip(raw, hints, strict=True) if hint
                ]
            return Transcript(words, False, False, generation, hints)
        self._interims.pop(generation, None)
        kept = [(w, s, e) for w, s, e in raw
                if not self._is_duplicate(w.text, s, generation)]
        labels: dict[object, str] = {}
        if self.provider.diarizes and any(w.speaker is not None for w, _, _ in kept):
            spans: dict[object, list[tuple[float, float]]] = {}
            for w, s, e in kept:
                if w.speaker is not None:
                    spans.setdefault(w.speaker, []).append((s, e))
            try:
                labels = await self._resolve_speakers(generation, spans)
            except Exception:
                log.exception("%s: matching voices failed; labels follow this connection's ids",
                              self.provider.name)
                labels = {k: self.speakers.letters.label((generation, k)) for k in spans}
        words = tuple(
            Word(w.text, s, e, w.confidence,
                 labels.get(w.speaker) if w.speaker is not None else None)
            for w, s, e in kept
        )
        if result.audio_end is not None:
            self.covered_until = max(self.covered_until, result.audio_end + offset)
        if words:
            self.final_until = max(self.final_until, max(w.end for w in words))
            self.covered_until = max(self.covered_until, self.final_until)
            self._recent_finals.extend((generation, w) for w in words)
            horizon = self.final_until - 30.0
            self._recent_finals = [(g, w) for g, w in self._recent_finals if w.end >= horizon]
        return Transcript(words, True, result.speech_final, generation)

    async def _resolve_speakers(self, generation: int,
                                spans: dict[object, list[tuple[float, float]]]) -> dict[object, str]:
        """V3/V4 labels. Cheap bookkeeping unless a reconnected stream brings a label the session
        has not bound: then the voices are embedded in a worker thread, from audio copied here
        (the log is only touched on the event loop)."""
        if not self.speakers.needs_voices(generation, spans):
            return self.speakers.resolve(generation, spans, self.audio.between)
        wanted = [sp for runs in (spans, self.speakers.history) for v in runs.values() for sp in v]
        clips = {sp: self.audio.between(*sp) for sp in wanted}
        empty = np.zeros(0, np.float32)

        def read(start: float, end: float) -> npt.NDArray[np.float32]:
            return clips.get((start, end), empty)

        loop = asyncio.get_running_loop()
        self._matching = loop.run_in_executor(None, self.speakers.resolve, generation, spans, read)
        # shielded: a dropped connection's receiver is cancelled here, but the thread goes on
        # changing the speakers, so the next result waits for it (`read`), never races it
        return await asyncio.shield(self._matching)

    def _is_duplicate(self, text: str, start: float, generation: int) -> bool:
        """A word an earlier connection already made final (replayed audio). Words of the same
        connection are never duplicates: "no, no" stays two words."""
        if generation == 0 or start > self.final_until + DUPLICATE_TOLERANCE:
            return False
        key = _norm(text)
        return any(
            g < generation and _norm(w.text) == key and abs(w.start - start) <= DUPLICATE_TOLERANCE
            for g, w in reversed(self._recent_finals)
        )
