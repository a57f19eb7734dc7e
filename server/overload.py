"""When the live diarization stage falls behind: one pure state machine over measured lag.

The stage (segmentation-3.0 + CAM++, shared by every shared-mic stream) costs CPU per stream;
past what the machine holds, every stream's stage output falls further behind its audio and,
with nothing shedding load, latency grew without bound (issue 31: 50 s strict p95 at 16
streams). This module decides, from each stream's measured stage lag (seconds of audio the
stream received whose stage result is not back yet, `voice.stage_driver.StageDriver.lag`),
what the server does about it, and nothing else: no asyncio, no sockets, no clock of its own
(`now` is passed in), so every rule is a table of cases in `tests/test_server_overload.py`.
`server.stage_guard.StageGuard` measures, calls `observe`, and applies the actions it returns
(for `chorus serve`'s pipeline and a `chorus agent` job alike).

The steps, in order (each bound is a `[diarizer]` key, `OverloadBounds`):
1. **Stretch.** A stream whose lag passes `stretch_lag_s` has its step stretched
   (`stretch_factor`: the stage runs fewer windows per second of audio), if its stage declares
   it can (`StageAbilities.stretches_step`). Back to the normal step once its lag stayed under
   `recover_lag_s` for `recover_after_s`.
2. **Fall back.** A stream whose lag passes `fallback_lag_s` (stretched already, or unable to
   stretch) leaves the stage: its words take the STT's labels (one speaker when the STT gives
   none) and the device hears a `diarization` status `degraded`. The stage batches every
   stream's windows, so its lag grows with its load: at most every `fallback_every_s`, the
   share of the stage's streams by which the worst lag is over the bound leaves it (at least
   one; lag 2.5 s over a 2 s bound: a fifth), the last to join the stage first (the older
   streams keep their speakers), so the stage is not emptied when every lag grows together;
   any stream past `max_lag_s` falls back at once, which bounds every admitted stream's lag.
3. **Refuse.** While any stream is in fallback (the stage could not keep up even so), a NEW
   shared-mic stream that would use the stage is refused (`admitting` is False; 4429).
4. **Recover.** Once every stream still on the stage stayed under `recover_lag_s` for
   `recover_after_s`, and the fallback stream's own last stage call has returned, the stream
   that fell back first returns to the stage (`recovered`), one per `recover_after_s`. A stream
   waits `recover_after_s` in fallback before it may return, doubled each time it falls back
   again sooner after returning than it had waited (a stage that keeps up only while the stream
   is off it), up to `MAX_BACKOFF` times; a stream that stayed back as long as it had waited
   starts again from `recover_after_s`. So a stream does not flap between the stage and the
   STT's labels (and its device between `degraded` and `recovered`) every few seconds.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

MAX_BACKOFF = 16
"""The longest a stream waits in fallback before it may return: `recover_after_s` times this."""


class StageOverloadedError(Exception):
    """A new shared-mic stream while the diarization stage cannot keep up (refused: 4429)."""


class StreamMode(enum.Enum):
    """Where a stream's speakers come from now."""

    STAGE = "stage"
    STRETCHED = "stretched"
    """On the stage, with its step stretched."""
    FALLBACK = "fallback"
    """Off the stage: the STT's labels (or one speaker)."""


@dataclass(frozen=True)
class OverloadBounds:
    """The policy's thresholds (`[diarizer]` keys of the same names, docs/server.md
    "Overload")."""

    stretch_lag_s: float = 1.0
    stretch_factor: float = 2.0
    fallback_lag_s: float = 1.5
    max_lag_s: float = 2.5
    fallback_every_s: float = 1.0
    recover_lag_s: float = 0.8
    recover_after_s: float = 5.0

    def __post_init__(self) -> None:
        if not 0 <= self.recover_lag_s <= self.stretch_lag_s <= self.fallback_lag_s <= self.max_lag_s:
            raise ValueError("need recover_lag_s <= stretch_lag_s <= fallback_lag_s <= max_lag_s")
        if self.stretch_factor < 1:
            raise ValueError(f"stretch_factor must be >= 1, got {self.stretch_factor}")
        if self.fallback_every_s < 0 or self.recover_after_s < 0:
            raise ValueError("fallback_every_s and recover_after_s must be >= 0")


@dataclass(frozen=True)
class DiarizationDegraded:
    """Told to the stream's device: its speakers come from the STT now (`reason`: why)."""

    reason: str
    lag_s: float


@dataclass(frozen=True)
class DiarizationRecovered:
    """Told to the stream's device: its speakers come from the stage again."""


DiarizationStatus = DiarizationDegraded | DiarizationRecovered


@dataclass(frozen=True)
class Stretch:
    """Stretch the stream's step by `factor` (1.0: back to its normal step)."""

    stream: str
    factor: float


@dataclass(frozen=True)
class FallBack:
    """Take the stream off the stage: its speakers come from the STT now."""

    stream: str
    lag_s: float
    reason: str


@dataclass(frozen=True)
class Return:
    """Put the stream back on the stage."""

    stream: str


Action = Stretch | FallBack | Return


@dataclass
class _Stream:
    joined: float
    can_stretch: bool
    order: int
    mode: StreamMode = StreamMode.STAGE
    lag: float = 0.0
    calm_since: float | None = None
    """Since when its lag stayed under `recover_lag_s` (None: it is over it now)."""
    fell_back_at: float = 0.0
    busy: bool = False
    """In fallback: its last stage call has not returned yet (the stage is still working)."""
    returned_at: float | None = None
    """When it last returned to the stage (None: never)."""
    backoff: int = 1
    """Its wait in fallback before it may return, in `recover_after_s` (doubles, see above)."""


@dataclass
class OverloadCounts:
    """What the policy did, for `/metrics`."""

    stretches: int = 0
    fallbacks: int = 0
    recoveries: int = 0
    refusals: int = 0


@dataclass(frozen=True)
class StageLoad:
    """The stage's load now (`/healthz`, `/metrics`, the load figure)."""

    lag_s: float
    """The largest lag of a stream on the stage (0 with none)."""
    on_stage: int
    stretched: int
    fallback: int
    admitting: bool
    load: float
    """0..1: the largest lag over `fallback_lag_s` (1.0 while refusing)."""
    counts: OverloadCounts = field(default_factory=OverloadCounts)


class OverloadPolicy:
    """Per stream: `joined`, `left`; then `observe(now, lags)` returns the actions to take, in
    order; `admitting` says whether a new shared-mic stream may join the stage."""

    def __init__(self, bounds: OverloadBounds | None = None) -> None:
        self.bounds = bounds or OverloadBounds()
        self.counts = OverloadCounts()
        self._streams: dict[str, _Stream] = {}
        self._joins = 0
        self._last_fallback = -math.inf
        self._last_return = -math.inf
        self._stage_calm_since: float | None = None

    # -- streams ---------------------------------------------------------------------------

    def joined(self, stream: str, now: float, *, can_stretch: bool) -> None:
        self._joins += 1
        self._streams[stream] = _Stream(joined=now, can_stretch=can_stretch, order=self._joins)

    def left(self, stream: str) -> None:
        self._streams.pop(stream, None)

    def mode(self, stream: str) -> StreamMode | None:
        state = self._streams.get(stream)
        return state.mode if state is not None else None

    @property
    def admitting(self) -> bool:
        """Whether a new shared-mic stream may join the stage: no stream is in fallback."""
        return not any(s.mode is StreamMode.FALLBACK for s in self._streams.values())

    def refused(self) -> None:
        """A new stream was refused (counted)."""
        self.counts.refusals += 1

    def load(self) -> StageLoad:
        on = [s for s in self._streams.values() if s.mode is not StreamMode.FALLBACK]
        lag = max((s.lag for s in on), default=0.0)
        admitting = self.admitting
        return StageLoad(
            lag_s=lag,
            on_stage=len(on),
            stretched=sum(s.mode is StreamMode.STRETCHED for s in on),
            fallback=len(self._streams) - len(on),
            admitting=admitting,
            load=1.0 if not admitting else min(1.0, lag / self.bounds.fallback_lag_s),
            counts=OverloadCounts(**vars(self.counts)),
        )

    # -- the rules -------------------------------------------------------------------------

    def observe(self, now: float, lags: Mapping[str, float | None]) -> list[Action]:
        """The streams' lags now: seconds, for a stream on the stage; for a stream in fallback,
        None while its last stage call is still out (else any number). Streams not named keep
        their last lag."""
        b = self.bounds
        actions: list[Action] = []
        for name, lag in lags.items():
            state = self._streams.get(name)
            if state is None:
                continue
            if state.mode is StreamMode.FALLBACK:
                state.busy = lag is None
                continue
            state.lag = 0.0 if lag is None else lag
            if state.lag <= b.recover_lag_s:
                state.calm_since = now if state.calm_since is None else state.calm_since
            else:
                state.calm_since = None
        on = sorted((s for s in self._streams.items() if s[1].mode is not StreamMode.FALLBACK),
                    key=lambda item: item[1].order)
        for name, state in on:  # 1. stretch, and back
            if (state.mode is StreamMode.STAGE and state.can_stretch
                    and state.lag > b.stretch_lag_s and b.stretch_factor > 1):
                state.mode = StreamMode.STRETCHED
                self.counts.stretches += 1
                actions.append(Stretch(name, b.stretch_factor))
            elif (state.mode is StreamMode.STRETCHED and state.calm_since is not None
                    and now - state.calm_since >= b.recover_after_s):
                state.mode = StreamMode.STAGE
                actions.append(Stretch(name, 1.0))
        actions += self._fall_back(now, on)
        actions += self._recover(now)
        return actions

    def _fall_back(self, now: float, on: list[tuple[str, _Stream]]) -> list[Action]:
        b = self.bounds
        out: list[Action] = []
        ready = [(n, s) for n, s in on if s.mode is StreamMode.STRETCHED or not s.can_stretch
                 or b.stretch_factor <= 1]
        for name, state in ready:  # past the hard bound: at once
            if state.lag > b.max_lag_s:
                out.append(self._leave(name, state, now, f"stage {state.lag:.1f} s behind "
                                                         f"(over {b.max_lag_s:g} s)"))
        if out or now - self._last_fallback < b.fallback_every_s:
            return out
        over = sorted(((n, s) for n, s in ready if s.mode is not StreamMode.FALLBACK
                       and s.lag > b.fallback_lag_s), key=lambda item: -item[1].order)
        if over:
            # the stage batches every stream's windows, so its lag grows with its load: shed the
            # share of its streams by which the worst lag is over the bound, the last to join
            # the stage first
            worst = max(s.lag for _, s in over)
            shed = max(1, math.ceil(len(on) * (1 - b.fallback_lag_s / worst)))
            for name, state in over[:shed]:
                out.append(self._leave(name, state, now, f"stage {state.lag:.1f} s behind "
                                                         f"(over {b.fallback_lag_s:g} s)"))
        return out

    def _leave(self, name: str, state: _Stream, now: float, reason: str) -> FallBack:
        if state.returned_at is not None:  # it was back: for less time than it had waited?
            waited = state.backoff * self.bounds.recover_after_s
            soon = now - state.returned_at < waited
            state.backoff = min(MAX_BACKOFF, state.backoff * 2) if soon else 1
        state.mode = StreamMode.FALLBACK
        state.fell_back_at = now
        state.busy = True
        state.calm_since = None
        self._last_fallback = now
        self._stage_calm_since = None
        self.counts.fallbacks += 1
        return FallBack(name, state.lag, reason)

    def _recover(self, now: float) -> list[Action]:
        b = self.bounds
        on = [s for s in self._streams.values() if s.mode is not StreamMode.FALLBACK]
        if all(s.calm_since is not None for s in on):
            if self._stage_calm_since is None:
                self._stage_calm_since = now
        else:
            self._stage_calm_since = None
        waiting = sorted(((n, s) for n, s in self._streams.items()
                          if s.mode is StreamMode.FALLBACK and not s.busy),
                         key=lambda item: item[1].fell_back_at)
        calm_since = self._stage_calm_since
        if (not waiting or calm_since is None or now - calm_since < b.recover_after_s
                or now - self._last_return < b.recover_after_s):
            return []
        due = [(n, s) for n, s in waiting if now - s.fell_back_at >= s.backoff * b.recover_after_s]
        if not due:
            return []
        name, state = due[0]
        state.mode = StreamMode.STRETCHED if state.can_stretch and b.stretch_factor > 1 \
            else StreamMode.STAGE
        state.lag = 0.0
        state.calm_since = now
        state.returned_at = now
        self._last_return = now
        self.counts.recoveries += 1
        out: list[Action] = [Return(name)]
        if state.mode is StreamMode.STRETCHED:
            out.append(Stretch(name, b.stretch_factor))  # it comes back gently
        return out


__all__ = [
    "MAX_BACKOFF",
    "Action",
    "DiarizationDegraded",
    "DiarizationRecovered",
    "DiarizationStatus",
    "FallBack",
    "OverloadBounds",
    "OverloadCounts",
    "OverloadPolicy",
    "Return",
    "StageLoad",
    "StageOverloadedError",
    "StreamMode",
    "Stretch",
]
