"""One interface for every realtime model session, and the hard part written once.

Why this shape (LiveKit's `RecognizeStream` keeps retry and reconnect in the base): a provider
module only speaks its protocol — connect, send one item, append audio, commit, ask for a response,
read replies. `RealtimeSession` owns everything that must be right for every provider:

- **order and exactly-once (R6)**: every operation goes through one writer task, in call order.
  An item joins the session's history only after it was sent; when the connection drops, the
  session reconnects (with backoff), sends the configuration again, replays the history (the note
  and every line the model had, in order), re-asks for a response that was in flight, then carries
  on with what arrived meanwhile. Each line reaches the new connection exactly once.
- **a bounded history (issue 25.8)**: the history kept for that replay is the newest items within
  `history_items` items and `history_chars` characters (`HISTORY_ITEMS`, `HISTORY_CHARS`); older
  ones are dropped, oldest first, so a chat flood cannot grow a room's memory without end. Items
  are kept as they were sent (labelled lines stay labelled); the note (G3) is never lost with the
  line that carried it: it moves to the oldest user line still kept (or, when none is, to the
  next one kept), so a replay after a reconnect still opens its labelled lines with the note.
- **one response at a time (R4)**: a response is requested only when none is in flight; a request
  made while one is in flight is held (coalesced) and sent when the active one is done, so the
  service never answers `conversation_already_has_active_response`.
- **a response that never ends (R4)**: a requested response that has not finished within
  `SessionOptions.response_timeout` seconds is given up: the provider is told to stop it
  (`_abandon_response`: OpenAI `response.cancel`; Gemini, which has no cancel, reopens the
  connection), a warning is logged, listeners get `ReplyDone(status="timed_out")`, and the slot is
  free for the next request. Requests are numbered; whatever arrives later for an abandoned one
  (its `response.done`, audio, transcript) is dropped, so it is never delivered late, twice, or
  taken for the done of a newer response.
- **a bounded record (issue 10.3)**: `sent` keeps the last `record_limit` client events as they
  went on the wire (tests and the recorder demo read it). Audio payloads are never kept unless a
  test opts in (`record_audio=True`): an append is recorded with its size (`audio_bytes`) instead
  of its base64 (about 55 KB per audio second otherwise, for the life of the room).
- **replies (R5)**: providers turn their wire events into `ReplyStarted`, `ReplyAudio`,
  `ReplyTranscript` and `ReplyDone` values handed to listeners (the `RealtimeChannel`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from attribution import NOTE
from rooms.retry import Backoff

log = logging.getLogger(__name__)


class SessionDropped(Exception):
    """The provider connection closed without Chorus asking it to."""


class SessionFailed(Exception):
    """The session could not be (re)opened within its reconnect budget."""


class SessionRefused(SessionFailed):
    """The provider refused the session for good (a bad key, an unknown model): retrying cannot
    help, so it is reported at once instead of after the reconnect budget."""


def connect_error(provider: str, exc: BaseException) -> SessionDropped | SessionRefused:
    """Classify a failed connect: HTTP 4xx (but 408/429) and close code 1008 are refusals."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    if isinstance(exc, InvalidStatus):
        status = exc.response.status_code
        if 400 <= status < 500 and status not in (408, 429):
            body = exc.response.body.decode("utf-8", "replace").strip()[:200]
            return SessionRefused(f"{provider} refused the session: HTTP {status} {body}".rstrip())
    if isinstance(exc, ConnectionClosed) and exc.rcvd is not None and exc.rcvd.code == 1008:
        return SessionRefused(
            f"{provider} refused the session: {exc.rcvd.reason or 'policy violation'}"
        )
    return SessionDropped(f"could not connect: {exc}")


# --------------------------------------------------------------------------- what goes in


ItemRole = Literal["user", "system", "assistant"]


@dataclass(frozen=True)
class ContextItem:
    """One line of context the model holds: a labelled user line, an application instruction
    (`system`), or one of the model's own earlier replies (`assistant`, replayed on reconnect)."""

    role: ItemRole
    text: str
    carries_note: bool = False
    """`text` ends with the attribution note (the session's first labelled line, G3): the session
    keeps the note for its replay when it drops this item (`RealtimeSession.history`)."""
    response_id: str | None = None
    """The reply an `assistant` item is (`reply_heard` cuts it to what the room heard)."""

    def with_note(self) -> ContextItem:
        """This item carrying the note (a line standing in for one that carried it keeps it)."""
        if self.carries_note:
            return self
        return replace(self, text=f"{self.text}\n\n{NOTE}", carries_note=True)


@dataclass(frozen=True)
class SessionOptions:
    """What a session is configured with on every (re)connect."""

    instructions: str | None = None
    audio_input: bool = False
    """Audio mode (R3): the model's own turn detection is off and the channel commits turns."""
    output_audio: bool = True
    voice: str | None = None
    response_timeout: float | None = 60.0
    """Seconds a requested response may take to finish (its `response.done` / `turn_complete`)
    before it is cancelled and the slot freed for the next request (R4); `None` waits forever."""

    def __post_init__(self) -> None:
        if self.response_timeout is not None and not self.response_timeout > 0:
            raise ValueError(
                f"response_timeout must be a positive number of seconds or None, "
                f"not {self.response_timeout!r}"
            )


# --------------------------------------------------------------------------- what comes out


@dataclass(frozen=True)
class ReplyStarted:
    response_id: str
    request: int | None = None
    """The number of the request (`RealtimeSession.active_request` when it was sent) this
    response answers, when the provider can tell; `None`: the request in flight."""


@dataclass(frozen=True)
class ReplyAudio:
    response_id: str
    pcm16: bytes
    sample_rate: int
    item_id: str | None = None
    """The provider's id of the conversation item the audio belongs to, where it has one (OpenAI:
    what `truncate_reply` names)."""


@dataclass(frozen=True)
class ReplyTranscript:
    """A transcript delta of the reply in progress."""

    response_id: str
    delta: str


@dataclass(frozen=True)
class ReplyDone:
    response_id: str
    transcript: str
    status: str = "completed"
    """The provider's status (`completed`, `cancelled`, `failed`, `incomplete`), or `timed_out`
    when Chorus gave the response up after `response_timeout`."""
    request: int | None = None
    """As in `ReplyStarted`."""


@dataclass(frozen=True)
class SessionError:
    code: str | None
    message: str


@dataclass(frozen=True)
class SessionReconnected:
    connection: int


SessionEvent = (
    ReplyStarted | ReplyAudio | ReplyTranscript | ReplyDone | SessionError | SessionReconnected
)
Listener = Callable[[SessionEvent], Awaitable[None] | None]


@dataclass(frozen=True)
class SessionCounts:
    """What a session (or a channel's sessions together) went through: connections opened after
    the first (`reconnects`: drops and renewals), `renewals` ahead of a provider's announced end,
    `refusals` after it had worked, failed responses asked for again (`retried`), and turn
    audio that waited too long and went as its line alone (`audio_dropped_s`)."""

    reconnects: int = 0
    renewals: int = 0
    refusals: int = 0
    retried: int = 0
    audio_dropped_s: float = 0.0

    def __add__(self, other: SessionCounts) -> SessionCounts:
        return SessionCounts(
            self.reconnects + other.reconnects, self.renewals + other.renewals,
            self.refusals + other.refusals, self.retried + other.retried,
            self.audio_dropped_s + other.audio_dropped_s,
        )  # fmt: skip


@dataclass(frozen=True)
class SentEvent:
    """One client event as it went on the wire, and on which connection (0, 1, … after drops)."""

    connection: int
    event: dict[str, Any]

    @property
    def type(self) -> str:
        return str(self.event.get("type"))


RECORD_LIMIT = 1000
"""Client events a session keeps in `sent` by default (the newest)."""

HISTORY_ITEMS = 1000
"""Items a session keeps in `history` (what a reconnect replays) by default: the newest."""

REFUSED_RETRY = Backoff(first=5.0, factor=2.0, longest=300.0)
"""How a session that has worked retries a provider that refuses it (`SessionRefused`: a revoked
key, a model withdrawn, a policy close): 5 s, doubling, then every 5 minutes, as long as the room
lives. Each refusal is logged at WARNING with the provider's words; lines wait in order."""

WAITING_AUDIO_S = 120.0
"""Seconds of turn audio (audio mode, R3) a session holds while it cannot send it (the provider
away, a reconnect under way): past that, the oldest waiting turns go as their lines alone, as a
reconnect replays them anyway (R6), so a long outage never holds a meeting's audio in memory."""

FAILED_RETRY_S = 1.0
"""A response that failed with nothing said (the provider's `server_error`, a refused
`response.create`) is asked for again once, this long after; a line asked meanwhile answers it
instead."""

UNREACHABLE_AFTER_S = 2.0
"""A session that has worked and cannot reach its provider for this long says so (a
`SessionError` `session_unreachable`: the room's model is unavailable until it reconnects); a
drop it recovers from sooner says nothing."""

RENEW_BEFORE_S = 120.0
"""How long before the end a provider announces for a connection (OpenAI's `expires_at`, Gemini's
`goAway`) a session renews it (`RealtimeSession.renew_before_s`). The renewal waits for a moment
with no response in flight, so the margin covers a long reply; a notice shorter than the margin
renews at the next such moment."""

HISTORY_CHARS = 100_000
"""Characters (the items' texts together) a session keeps in `history` by default: about 25,000
tokens at the usual four characters a token. A single item longer than this is not kept."""

_PAYLOAD_KEYS = ("audio", "data")


def without_payloads(event: dict[str, Any]) -> dict[str, Any]:
    """`event` with every base64 payload (`audio`, `data` strings, at any depth) replaced by its
    size in bytes (`audio_bytes`, `data_bytes`): what a record keeps of an audio append."""
    out: dict[str, Any] = {}
    for key, value in event.items():
        if key in _PAYLOAD_KEYS and isinstance(value, str):
            out[f"{key}_bytes"] = len(value) * 3 // 4 - value[-2:].count("=")
        elif isinstance(value, dict):
            out[key] = without_payloads(value)
        else:
            out[key] = value
    return out


# --------------------------------------------------------------------------- operations


@dataclass
class _Op:
    kind: Literal[
        "item", "audio_turn", "response", "cancel", "abandon", "reconnect", "truncate", "renew",
        "nothing",
    ]
    item: ContextItem | None = None
    audio: bytes = b""
    send_item: bool = True
    response_id: str | None = None
    item_id: str = ""
    audio_end_ms: int = 0
    connection: int = -1  # "renew": the connection due one
    done: asyncio.Future[None] | None = None


class RealtimeSession(ABC):
    """Base of every provider session: `await s.start()`, then `s.post_item(item)`,
    `s.post_audio_turn(pcm, item)`, `s.post_response()` (enqueue and return at once, for a
    channel's `deliver`) or their awaited forms `add_item`, `audio_turn`, `request_response`;
    `await s.wait_idle()`, `await s.close()`. Operations go on the wire in call order, never
    interleaved.
    """

    provider: ClassVar[str]
    input_sample_rate: ClassVar[int] = 24_000
    """The sample rate `audio_turn` expects (16-bit mono PCM)."""

    def __init__(
        self,
        options: SessionOptions | None = None,
        *,
        max_reconnect_attempts: int | None = 8,
        reconnect_delay: float = 0.05,
        max_reconnect_delay: float = 2.0,
        reconnect_forever: bool = True,
        backoff: Backoff | None = None,
        record_limit: int = RECORD_LIMIT,
        record_audio: bool = False,
        history_items: int = HISTORY_ITEMS,
        history_chars: int = HISTORY_CHARS,
        renew_before_s: float | None = RENEW_BEFORE_S,
        refused_retry: Backoff = REFUSED_RETRY,
        waiting_audio_s: float = WAITING_AUDIO_S,
        failed_retry_s: float | None = FAILED_RETRY_S,
    ) -> None:
        if record_limit < 0:
            raise ValueError("record_limit must be 0 (record nothing) or more")
        if history_items < 1 or history_chars < 1:
            raise ValueError("history_items and history_chars must be at least 1")
        if waiting_audio_s < 0:
            raise ValueError("waiting_audio_s must be 0 or more")
        if renew_before_s is not None and renew_before_s < 0:
            raise ValueError("renew_before_s must be 0 or more (None: never renew ahead)")
        self.options = options or SessionOptions()
        self.renew_before_s = renew_before_s
        """Renew a connection this long before the end its provider announced for it, at a
        moment with no response in flight (`RENEW_BEFORE_S`); None leaves it to the provider
        to end it, and the session reconnects as after a drop."""
        self.renewals = 0
        """Connections renewed before their announced end so far."""
        self.connections_opened = 0
        """Connections opened so far (the first, then every reconnect and renewal)."""
        self.playing_until = 0.0
        """Loop time until which the room is still playing the model's last reply (the realtime
        channel sets it as reply audio reaches the room's sinks). A renewal waits for it: a
        reply talked over is cut in the context of the connection that made it
        (`truncate_reply`), which a fresh connection, replaying the reply whole, could not be."""
        self.refused_retry = refused_retry
        """How a refusal is retried once the session has worked (`REFUSED_RETRY`; its
        `attempts`, when set, bound it). The first connection is never retried on a refusal:
        a wrong key or model fails `start` at once."""
        self.refusals = 0
        """Refused connects of the session so far (after it had worked)."""
        self.waiting_audio_s = waiting_audio_s
        """Turn audio the session holds while it cannot send it (`WAITING_AUDIO_S`)."""
        self.audio_dropped_s = 0.0
        """Turn audio that waited past `waiting_audio_s` and went as its line alone."""
        self.failed_retry_s = failed_retry_s
        """When a response that failed with nothing said is asked for again (`FAILED_RETRY_S`;
        None: never)."""
        self.retried = 0
        """Failed responses asked for again so far."""
        self._retry: int | None = None  # the request that is a failed one's retry
        self._output_of: int | None = None  # the request in flight that has said something
        self._waiting_audio: deque[_Op] = deque()  # audio turns not yet sent, oldest first
        self._waiting_audio_bytes = 0
        self.reconnect_forever = reconnect_forever
        """After one successful connection, keep reconnecting (capped backoff) instead of giving
        up after `max_reconnect_attempts`: lines wait in order until the provider is back."""
        self.max_reconnect_attempts = max_reconnect_attempts
        self.backoff = backoff or Backoff(
            first=reconnect_delay,
            factor=2.0,
            longest=max(reconnect_delay, max_reconnect_delay),
            attempts=None if reconnect_forever else max_reconnect_attempts,
        )
        """Reconnects of a session that worked (the policy the STT streams use too); the first
        connection is bounded by `max_reconnect_attempts` whatever it says."""
        self.sent: deque[SentEvent] = deque(maxlen=record_limit)
        """The last `record_limit` client events, as sent (payloads only with `record_audio`)."""
        self.record_audio = record_audio
        self.history: deque[ContextItem] = deque()
        """What a reconnect replays: the newest items sent (and the model's replies), oldest
        first, within `history_items` items and `history_chars` characters."""
        self.history_items = history_items
        self.history_chars = history_chars
        self.history_dropped = 0
        """Items dropped from `history` so far (the oldest), to keep it within its bounds."""
        self._history_size = 0  # characters in `history`
        self._note_owed = False  # the note's line was dropped and no later user line is kept
        self.connection_index = -1
        self.failed: BaseException | None = None
        self._listeners: list[Listener] = []
        self._queue: asyncio.Queue[_Op | None] = asyncio.Queue()
        self._writer: asyncio.Task[None] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._connected = False
        self._ever_connected = False
        self._closing = False
        self._in_flight = False  # requested and not done
        self._response_written = False  # response.create went on the wire, no reply yet
        self._pending_response = False
        self._request_count = 0  # requests numbered 1, 2, … (the one in flight: _active)
        self._active: int | None = None
        self._active_rid: str | None = None  # the provider's id for it, once it started
        self._abandoned: set[int] = set()  # timed-out requests whose late events are dropped
        self._abandoned_rids: set[str] = set()
        self._watchdog: asyncio.Task[None] | None = None
        self._closed_refusals = 0  # connections closed as refused since the last reply
        self._reconnect_at = 0.0  # (loop time) not before: after refused closes
        self._renewal: asyncio.TimerHandle | None = None  # when the connection is due a renewal
        self._renew_due: int | None = None  # the connection due one, once its time came

    # ------------------------------------------------------------------ provider hooks

    @abstractmethod
    async def _connect(self) -> None:
        """Open a fresh connection (the service holds no conversation yet)."""

    @abstractmethod
    async def _disconnect(self) -> None:
        """Close the current connection, ignoring errors."""

    @abstractmethod
    async def _send_configure(self) -> None: ...

    @abstractmethod
    async def _send_item(self, item: ContextItem) -> None: ...

    @abstractmethod
    async def _send_audio(self, pcm16: bytes) -> None:
        """Append audio (16-bit mono PCM at `input_sample_rate`) to the model's input buffer."""

    @abstractmethod
    async def _send_commit(self) -> None: ...

    @abstractmethod
    async def _send_response_create(self) -> None: ...

    async def _send_cancel(self, response_id: str | None = None) -> None:
        """Cancel the active response (`response_id` when known; providers without cancel do
        nothing)."""
        return None

    async def _send_truncate(self, item_id: str, audio_end_ms: int) -> None:
        """Cut a reply item's audio at `audio_end_ms` in the provider's context (providers
        without it do nothing)."""
        return None

    async def _abandon_response(self, response_id: str | None) -> None:
        """Stop a response that timed out. Default: `_send_cancel`. A protocol without a cancel
        can call `self._reopen()`: a fresh connection (history replayed, R6) cannot answer late."""
        await self._send_cancel(response_id)

    async def _reopen(self) -> None:
        """Drop the current connection and open a fresh one now (history replayed)."""
        self._connected = False
        await self._ensure_connected()

    @abstractmethod
    def _receive(self) -> AsyncIterator[SessionEvent]:
        """Yield reply events from the current connection until it closes.

        Ends normally when Chorus closed the session; raises `SessionDropped` when it dropped.
        """

    # ------------------------------------------------------------------ recording

    def _record(self, event: dict[str, Any]) -> None:
        if self.sent.maxlen == 0:
            return
        kept = event if self.record_audio else without_payloads(event)
        self.sent.append(SentEvent(self.connection_index, kept))

    # ------------------------------------------------------------------ public API

    def add_listener(self, listener: Listener) -> None:
        self._listeners.append(listener)

    @property
    def response_in_flight(self) -> bool:
        return self._in_flight

    @property
    def active_request(self) -> int | None:
        """The number of the request in flight (providers tag their reply events with it)."""
        return self._active

    async def start(self) -> None:
        """Open the first connection (errors such as a refused key surface here), then write."""
        if self._writer is not None:
            return
        await self._ensure_connected()
        self._writer = asyncio.create_task(self._write_loop(), name=f"{self.provider}-writer")

    def post_item(self, item: ContextItem) -> asyncio.Future[None]:
        """Enqueue one context item without waiting (order is the order of calls)."""
        return self._enqueue(_Op("item", item=item))

    def post_audio_turn(
        self, pcm16: bytes, item: ContextItem | None, *, send_item: bool = True
    ) -> asyncio.Future[None]:
        """Enqueue one diarized turn in audio mode (R3): append its audio, commit, then `item`.

        `item` is what the model keeps as text: the labelled line naming the speaker
        (`send_item=True`), or, in a one-speaker room, the plain transcript that is not sent now
        (the model heard the audio) but is replayed as text after a reconnect, when the audio is
        gone (`send_item=False`).
        """
        op = _Op("audio_turn", item=item, audio=pcm16, send_item=send_item)
        done = self._enqueue(op)
        if pcm16:
            self._waiting_audio.append(op)
            self._waiting_audio_bytes += len(pcm16)
            self._bound_waiting_audio()
        return done

    def _bound_waiting_audio(self) -> None:
        """The oldest audio turns waiting past `waiting_audio_s` go as their lines alone."""
        limit = int(self.waiting_audio_s * self.input_sample_rate) * 2
        dropped = 0
        while self._waiting_audio_bytes > limit and self._waiting_audio:
            op = self._waiting_audio.popleft()
            self._waiting_audio_bytes -= len(op.audio)
            dropped += len(op.audio)
            op.audio = b""
            op.kind, op.send_item = ("item", True) if op.item is not None else ("nothing", False)
        if dropped:
            if self.audio_dropped_s == 0:
                log.warning("%s: more than %.0f s of turn audio waiting to be sent; the oldest "
                            "turns go as their lines alone", self.provider,
                            self.waiting_audio_s)  # fmt: skip
            self.audio_dropped_s += dropped / 2 / self.input_sample_rate

    def post_response(self) -> bool:
        """Ask the model to answer. True if requested now; False if held until the active
        response is done (R4: never two at once, never `conversation_already_has_active_response`)."""
        if self._in_flight:
            self._pending_response = True
            return False
        self._enqueue(_Op("response"))
        self._pending_response = False  # (a failed one held for its retry: this answers too)
        self._begin_request()
        return True

    def _begin_request(self) -> None:
        self._request_count += 1
        self._in_flight = True
        self._active = self._request_count
        self._active_rid = None

    async def add_item(self, item: ContextItem) -> None:
        await self.post_item(item)

    async def audio_turn(
        self, pcm16: bytes, item: ContextItem | None, *, send_item: bool = True
    ) -> None:
        await self.post_audio_turn(pcm16, item, send_item=send_item)

    async def request_response(self) -> bool:
        sent = self.post_response()
        await self.drain()
        return sent

    async def cancel_response(self) -> None:
        """Cancel the response in flight, and a response held for later lines."""
        self._pending_response = False
        await self.interrupt_response()

    async def interrupt_response(self) -> bool:
        """Someone talked over the reply: cancel the response in flight, if any (providers
        without a cancel do nothing), keeping a response already held for later lines (unlike
        `cancel_response`). True when one was in flight."""
        if not self._in_flight:
            return False
        await self._enqueue(_Op("cancel", response_id=self._active_rid))
        return True

    async def truncate_reply(self, item_id: str, audio_end_ms: int) -> None:
        """The listener heard only the first `audio_end_ms` of the reply item `item_id` (they
        talked over it): the provider's context keeps only that much of it (OpenAI
        `conversation.item.truncate`; providers without it do nothing)."""
        await self._enqueue(_Op("truncate", item_id=item_id, audio_end_ms=max(0, audio_end_ms)))

    def counts(self) -> SessionCounts:
        """What this session went through so far (`SessionCounts`)."""
        return SessionCounts(max(0, self.connections_opened - 1), self.renewals, self.refusals,
                             self.retried, self.audio_dropped_s)  # fmt: skip

    def reply_heard(self, response_id: str, text: str) -> bool:
        """The room heard only `text` of the reply `response_id` (someone talked over it): the
        history a reconnect replays (R6) keeps that much of it, as `truncate_reply` cuts the
        provider's context, so a fresh connection never takes the rest as said. True when the
        reply was in the history."""
        for index, kept in enumerate(self.history):
            if kept.role == "assistant" and kept.response_id == response_id:
                self.history[index] = replace(kept, text=text)
                self._history_size += len(text) - len(kept.text)
                return True
        return False

    async def drain(self) -> None:
        """Wait until every operation enqueued so far was written."""
        await self._queue.join()

    async def wait_idle(self, limit: float = 10.0) -> None:
        """Wait until everything was written and no response is in flight or held."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            await self.drain()
            if not self._in_flight and not self._pending_response and self._queue.empty():
                return
            if self.failed is not None:
                raise SessionFailed(str(self.failed)) from self.failed
            if loop.time() > deadline:
                raise TimeoutError(f"{self.provider} session did not finish its response")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        """Write what is queued (while connected), then close the connection."""
        if self._closing:
            return
        if self._writer is not None and self._connected:
            await self._queue.put(None)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(self._writer), 5)
        self._closing = True  # a writer still reconnecting gives up
        self._disarm()
        self._cancel_renewal()
        if self._writer is not None and not self._writer.done():
            self._writer.cancel()
            with contextlib.suppress(BaseException):
                await self._writer
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(BaseException):
                await self._reader
        await self._disconnect()
        self._connected = False

    async def __aenter__(self) -> RealtimeSession:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ internals

    def _enqueue(self, op: _Op) -> asyncio.Future[None]:
        if self._closing:
            raise RuntimeError(f"{self.provider} session is closed")
        if self.failed is not None:
            raise SessionFailed(str(self.failed)) from self.failed
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Callers may not await it (the channel posts and moves on): a failure is reported as a
        # SessionError event, so mark it retrieved here.
        done.add_done_callback(lambda f: f.cancelled() or f.exception())
        op.done = done
        self._queue.put_nowait(op)
        return done

    async def _write_loop(self) -> None:
        while True:
            op = await self._queue.get()
            try:
                if op is None:
                    return
                try:
                    await self._perform_with_reconnect(op)
                except SessionFailed as exc:  # the session is unusable: fail every waiter
                    self.failed = exc
                    await self._emit(SessionError("session_failed", str(exc)))
                    if op.done is not None and not op.done.done():
                        op.done.set_exception(SessionFailed(str(exc)))
                    self._fail_pending()
                    return
                except Exception as exc:  # this operation alone could not be sent
                    await self._operation_failed(op, exc)
                    continue
                if op.done is not None and not op.done.done():
                    op.done.set_result(None)
            finally:
                self._queue.task_done()

    async def _operation_failed(self, op: _Op, exc: Exception) -> None:
        """One operation could not be sent, the connection still being good (a value the
        provider's SDK would not take, a bug): it alone fails, logged, and the session goes on
        with the next; a response it asked for is done (`failed`), so the next can be asked."""
        log.error("%s: could not send an operation (%s; %s: %s); the session goes on",
                  self.provider, op.kind, type(exc).__name__, exc, exc_info=exc)  # fmt: skip
        if op.done is not None and not op.done.done():
            op.done.set_exception(exc)
        await self._emit(SessionError("operation_failed", f"{op.kind}: {exc}"))
        if op.kind == "response" and self._in_flight and not self._response_written:
            request = self._active
            self._finish_request()
            await self._emit(ReplyDone("", "", "failed", request))
            self._send_held_request()

    def _fail_pending(self) -> None:
        while not self._queue.empty():
            op = self._queue.get_nowait()
            if op is not None and op.done is not None and not op.done.done():
                op.done.set_exception(SessionFailed(str(self.failed)))
            self._queue.task_done()

    async def _perform_with_reconnect(self, op: _Op) -> None:
        while True:
            await self._ensure_connected()
            try:
                await self._perform(op)
                return
            except SessionDropped:
                log.info("%s session dropped while sending; reconnecting", self.provider)
                self._connected = False

    async def _perform(self, op: _Op) -> None:
        if op.kind == "item":
            assert op.item is not None
            await self._send_item(op.item)
            self._keep(op.item)
        elif op.kind == "audio_turn":
            if self._waiting_audio and self._waiting_audio[0] is op:  # sent now: no longer waiting
                self._waiting_audio.popleft()
                self._waiting_audio_bytes -= len(op.audio)
            if op.audio:
                await self._send_audio(op.audio)
            await self._send_commit()
            if op.item is not None:
                if op.send_item:
                    await self._send_item(op.item)
                self._keep(op.item)
        elif op.kind == "response":
            if self._in_flight and not self._response_written:  # a reconnect may have re-sent it
                await self._send_response_create()
                self._response_written = True
                self._arm()
        elif op.kind == "cancel":
            await self._send_cancel(op.response_id)
        elif op.kind == "truncate":
            await self._send_truncate(op.item_id, op.audio_end_ms)
        elif op.kind == "abandon":
            await self._abandon_response(op.response_id)
        elif op.kind == "renew":
            await self._renew(op.connection)
        # "reconnect": _ensure_connected already did the work

    def _keep(self, item: ContextItem) -> None:
        """Add `item` to the history, then drop the oldest items until it is within its bounds.

        When the line that carried the note goes, the oldest user line kept takes the note (every
        user line after it is labelled, G3); with none kept, the next user line kept takes it."""
        if self._note_owed and item.role == "user":
            item = item.with_note()
            self._note_owed = False
        self.history.append(item)
        self._history_size += len(item.text)
        while self.history and (
            len(self.history) > self.history_items or self._history_size > self.history_chars
        ):
            dropped = self.history.popleft()
            self._history_size -= len(dropped.text)
            if self.history_dropped == 0:
                log.info(
                    "%s: session history passed its bound (%d items, %d characters); the oldest "
                    "items are no longer replayed after a reconnect",
                    self.provider,
                    self.history_items,
                    self.history_chars,
                )
            self.history_dropped += 1
            if dropped.carries_note:
                self._pass_note()

    def _pass_note(self) -> None:
        for index, kept in enumerate(self.history):
            if kept.role == "user":
                self.history[index] = kept.with_note()
                self._history_size += len(self.history[index].text) - len(kept.text)
                return
        self._note_owed = True

    async def _ensure_connected(self) -> None:
        if self._connected:
            return
        attempt = refused = 0
        began = asyncio.get_running_loop().time()
        told = False  # that it cannot reach the provider
        while True:
            if self._closing:
                raise SessionFailed(f"{self.provider} session was closed while reconnecting")
            attempt += 1
            wait = self._reconnect_at - asyncio.get_running_loop().time()
            if wait > 0:
                await asyncio.sleep(wait)
            if self._reader is not None and not self._reader.done():
                self._reader.cancel()
                with contextlib.suppress(BaseException):
                    await self._reader
            await self._disconnect()
            self.connection_index += 1
            try:
                await self._connect()
                await self._send_configure()
                for item in list(self.history):
                    await self._send_item(item)
                if self._response_written:  # the reply it asked for was lost with the line
                    await self._send_response_create()
                    self._arm()  # a fresh connection: the request gets its full time again
            except SessionRefused as exc:
                # Refused after it worked: the provider's word may change (a key re-enabled, a
                # model back), so the room keeps its model's lines and tries again, slowly.
                refused += 1
                if not self._ever_connected or self.refused_retry.exhausted(refused):
                    raise
                self.refusals += 1
                if refused == 1:
                    await self._emit(SessionError("session_refused", str(exc)))
                delay = self.refused_retry.delay(refused)
                log.warning("%s; it worked before, so it is tried again in %.3g s (lines wait in "
                            "order)", exc, delay)  # fmt: skip
                await asyncio.sleep(delay)
                continue
            except (SessionDropped, OSError) as exc:
                # The first connection has a budget (a wrong key or URL is a clear error); a
                # session that worked keeps trying, so nothing is lost while the provider is away.
                if self._ever_connected:
                    gave_up = self.backoff.exhausted(attempt)
                else:
                    budget = self.max_reconnect_attempts
                    gave_up = budget is not None and attempt >= budget
                if gave_up:
                    raise SessionFailed(
                        f"{self.provider}: could not open the session after {attempt} attempts: {exc}"
                    ) from exc
                log.warning(
                    "%s: connect attempt %d failed (%s); retrying", self.provider, attempt, exc
                )
                lasted = asyncio.get_running_loop().time() - began
                if self._ever_connected and not told and lasted >= UNREACHABLE_AFTER_S:
                    told = True
                    await self._emit(SessionError(
                        "session_unreachable", f"{self.provider} cannot be reached: {exc}"))  # fmt: skip
                await asyncio.sleep(self.backoff.delay(attempt))
                continue
            self._connected = True
            self._ever_connected = True
            self.connections_opened += 1
            self._reader = asyncio.create_task(self._read_loop(self.connection_index))
            if self.connection_index > 0:
                await self._emit(SessionReconnected(self.connection_index))
            return

    async def _read_loop(self, connection: int) -> None:
        try:
            async for event in self._receive():
                await self._on_event(event)
        except SessionRefused as exc:  # closed as a refusal (1008): reconnect, as after a drop
            if self._closing or connection != self.connection_index:
                return
            # at once the first time; again and again without a reply between: ever more slowly
            self._closed_refusals += 1
            self.refusals += 1
            delay = 0.0 if self._closed_refusals == 1 else self.refused_retry.delay(
                self._closed_refusals - 1)  # fmt: skip
            self._reconnect_at = asyncio.get_running_loop().time() + delay
            log.warning("%s; reconnecting in %.3g s", exc, delay)
            self._connected = False
            await self._emit(SessionError("session_refused", str(exc)))
            with contextlib.suppress(RuntimeError):
                self._queue.put_nowait(_Op("reconnect"))
        except SessionDropped:
            if self._closing or connection != self.connection_index:
                return
            log.info("%s connection %d dropped; reconnecting", self.provider, connection)
            self._connected = False
            # Reconnect now (not at the next line) so a held reply still comes back.
            with contextlib.suppress(RuntimeError):
                self._queue.put_nowait(_Op("reconnect"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("%s reader failed", self.provider)
            await self._emit(SessionError("reader_failed", str(exc)))

    async def _on_event(self, event: SessionEvent) -> None:
        if isinstance(event, ReplyStarted):
            if event.request is not None and event.request in self._abandoned:
                self._abandoned_rids.add(event.response_id)
                log.info(
                    "%s: dropping response %s of an abandoned request",
                    self.provider,
                    event.response_id,
                )
                return
            if (
                self._in_flight
                and self._active_rid is None
                and event.request in (None, self._active)
            ):
                self._active_rid = event.response_id
            await self._emit(event)
            return
        if isinstance(event, ReplyAudio | ReplyTranscript):
            if event.response_id in self._abandoned_rids:
                return  # a late piece of a response that timed out: never delivered
            if self._in_flight and event.response_id in ("", self._active_rid):
                self._output_of = self._active
            await self._emit(event)
            return
        if isinstance(event, ReplyDone):
            if self._is_abandoned(event):
                self._abandoned_rids.discard(event.response_id)
                if event.request is not None:
                    self._abandoned.discard(event.request)
                log.info(
                    "%s: late %s done for abandoned response %s dropped",
                    self.provider,
                    event.status,
                    event.response_id or f"request {event.request}",
                )
                return
            if not self._is_active(event):
                # The done of a response nobody asked for (or one we no longer track): deliver
                # it, but it must not free the request in flight.
                await self._emit(event)
                return
            request, said = self._active, self._output_of == self._active
            self._finish_request()
            self._closed_refusals = 0  # the connection answers
            if event.transcript:
                self._keep(ContextItem("assistant", event.transcript,
                                       response_id=event.response_id))  # fmt: skip
            await self._emit(event)
            self._renew_if_due()
            held = self._pending_response  # (a held request answers the same lines)
            self._send_held_request()
            if event.status == "failed" and not event.transcript and not said and not held:
                self._retry_failed(request)
            return
        await self._emit(event)

    def _is_abandoned(self, event: ReplyDone) -> bool:
        if event.request is not None:
            return event.request in self._abandoned
        return bool(event.response_id) and event.response_id in self._abandoned_rids

    def _is_active(self, event: ReplyDone) -> bool:
        if not self._in_flight:
            return False
        if event.request is not None:
            return event.request == self._active
        # Providers that cannot number their events: the done of the started response, or of a
        # request that never started (a refusal carries no response id).
        return self._active_rid is None or event.response_id in ("", self._active_rid)

    def _finish_request(self) -> None:
        self._disarm()
        self._in_flight = False
        self._response_written = False
        self._active = None
        self._active_rid = None

    def _retry_failed(self, request: int | None) -> None:
        """A response failed with nothing said (and no request was held behind it): unless it
        was a retry itself, it is asked for again after `failed_retry_s`, held meanwhile
        (`wait_idle` waits for it; a line asked meanwhile answers it instead)."""
        if (self.failed_retry_s is None or request is None or request == self._retry
                or self._closing):  # fmt: skip
            return
        log.warning("%s: response to request %d failed with nothing said; asking again in %.3g s",
                    self.provider, request, self.failed_retry_s)  # fmt: skip
        self._pending_response = True
        asyncio.get_running_loop().call_later(self.failed_retry_s, self._send_retry)

    def _send_retry(self) -> None:
        if self._in_flight or not self._pending_response or self._closing or self.failed:
            return  # a request went meanwhile, or holds this one; or the session is done
        self._send_held_request()
        self._retry = self._active
        self.retried += 1

    def _send_held_request(self) -> None:
        if self._pending_response and not self._closing and self.failed is None:
            self._pending_response = False
            self._queue.put_nowait(_Op("response"))
            self._begin_request()

    # ------------------------------------------------------------------ response timeout (R4)

    def _arm(self) -> None:
        """Start the clock of the request just written (`options.response_timeout`)."""
        self._disarm()
        timeout = self.options.response_timeout
        request = self._active
        if timeout is None or request is None:
            return
        self._watchdog = asyncio.create_task(
            self._expire(request, timeout), name=f"{self.provider}-response-timeout"
        )

    def _disarm(self) -> None:
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None and watchdog is not asyncio.current_task():
            watchdog.cancel()

    async def _expire(self, request: int, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if self._active != request or not self._in_flight or self._closing:
            return
        rid = self._active_rid
        log.warning(
            "%s: response %s (request %d) did not finish within %.3g s; cancelling it",
            self.provider,
            rid or "(not started)",
            request,
            seconds,
        )
        self._abandoned.add(request)
        if rid is not None:
            self._abandoned_rids.add(rid)
        self._watchdog = None
        self._finish_request()
        # Through the writer, so the cancel goes out before the next response.create.
        with contextlib.suppress(RuntimeError, SessionFailed):
            self._enqueue(_Op("abandon", response_id=rid))
        await self._emit(ReplyDone(rid or "", "", "timed_out", request))
        self._renew_if_due()
        self._send_held_request()

    # ------------------------------------------------------------------ renewal

    def _connection_ends_in(self, seconds: float) -> None:
        """Provider hook: the service says the current connection ends in `seconds` (OpenAI's
        `expires_at` in `session.created`, Gemini's `goAway`). The session opens a fresh one
        `renew_before_s` ahead of that (at once for a shorter notice), at a moment with no
        response in flight: a reply is never cut off by the provider's end of the connection,
        and the fresh connection holds the history, replayed as after a drop (R6)."""
        if self.renew_before_s is None or self._closing:
            return
        if self._renewal is not None:
            self._renewal.cancel()
        connection = self.connection_index
        delay = max(0.0, seconds - self.renew_before_s)
        log.info("%s: connection %d ends in %.0f s; renewing it in %.0f s, when no reply is "
                 "in flight", self.provider, connection, seconds, delay)  # fmt: skip
        self._renewal = asyncio.get_running_loop().call_later(delay, self._renewal_due, connection)

    def _renewal_due(self, connection: int) -> None:
        self._renewal = None
        if connection == self.connection_index and not self._closing and self.failed is None:
            self._renew_due = connection
            self._renew_if_due()

    def _renew_if_due(self) -> None:
        """Renew now when a renewal is due, no response is in flight (else at its done) and the
        room has heard the last reply (else when it will have: `playing_until`)."""
        if self._renew_due is None or self._in_flight:
            return
        loop = asyncio.get_running_loop()
        playing = self.playing_until - loop.time()
        if playing > 0:
            if self._renewal is None:
                self._renewal = loop.call_later(playing, self._renewal_played)
            return
        connection, self._renew_due = self._renew_due, None
        if connection != self.connection_index:
            return  # a drop has opened a fresh connection since
        with contextlib.suppress(RuntimeError, SessionFailed):
            self._enqueue(_Op("renew", connection=connection))

    def _renewal_played(self) -> None:
        self._renewal = None
        self._renew_if_due()

    async def _renew(self, connection: int) -> None:
        if connection != self.connection_index:
            return  # it dropped meanwhile: the reconnect opened a fresh one
        if self._response_written:  # (a reply asked for on it is awaited first)
            self._renew_due = connection
            return
        self.renewals += 1
        log.info("%s: renewing connection %d before the provider ends it",
                 self.provider, self.connection_index)  # fmt: skip
        await self._reopen()

    def _cancel_renewal(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.cancel()
        self._renew_due = None

    async def _emit(self, event: SessionEvent) -> None:
        for listener in list(self._listeners):
            try:
                result = listener(event)
                if result is not None:
                    await result
            except Exception:
                log.exception("realtime session listener failed on %s", type(event).__name__)
