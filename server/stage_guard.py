"""The overload policy applied to live voice sessions: what `chorus serve` and `chorus agent` share.

`server.overload.OverloadPolicy` decides, from measured lags, what to do when the diarization
stage falls behind (issue 31), and is pure. Doing it needs the event loop and the sessions, and
is the same wherever shared-mic streams run on stages: a `chorus serve` process
(`server.pipeline.VoicePipeline`, one guard for every room) and a `chorus agent` job
(`livekit_worker.room_agent.ChorusRoomAgent`, one guard for its LiveKit room). So it lives here
once: `StageGuard` keeps the sessions on a stage, measures their stage lag
(`voice.stage_driver.StageDriver.lag`) at most every `check_s` when its owner calls `check` (on
the streams' audio), hands the lags to the policy, and applies what it returns: stretch a step;
take a session off its stage (`VoiceSession.fall_back`: its words take the STT's speakers) after
telling its owner `DiarizationDegraded`; put it back (`VoiceSession.return_to_stage`) and tell
`DiarizationRecovered`. Who hears a status is the owner's business (`tell`): the server sends it
to the stream's device and the room's feed, the LiveKit job publishes it to the room.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable

from server.overload import (
    Action,
    DiarizationDegraded,
    DiarizationRecovered,
    DiarizationStatus,
    FallBack,
    OverloadPolicy,
    Return,
    Stretch,
)
from server.protocol import DiarizationStatusMessage
from voice.channel import VoiceSession

log = logging.getLogger(__name__)

StatusTeller = Callable[[str, DiarizationStatus], Awaitable[None]]
"""Hears that a session (by id) left its stage or came back."""


def status_message(stream: str, status: DiarizationStatus) -> DiarizationStatusMessage:
    """The `diarization_status` message saying `status` of `stream`: what a device and the
    room's feed hear (`server.output`) and a LiveKit job publishes (`livekit_worker`)."""
    if isinstance(status, DiarizationDegraded):
        return DiarizationStatusMessage(stream=stream, status="degraded", speakers="stt",
                                        reason=status.reason)
    return DiarizationStatusMessage(stream=stream, status="recovered", speakers="stage")


class StageGuard:
    """`StageGuard(policy, check_s=…, tell=…)`: `admit` before a new session takes a stage,
    `join` once it has one, `leave` when it ends; `check` on its audio; `wait_idle` for the
    fallbacks and statuses under way."""

    def __init__(self, policy: OverloadPolicy, *, check_s: float, tell: StatusTeller) -> None:
        self.policy = policy
        self.check_s = check_s
        """Lags are measured at most this often (`diarizer.overload_check_s`; 0: every call)."""
        self._tell = tell
        self._sessions: dict[str, VoiceSession] = {}
        """Sessions with a stage (on it or fallen back), by id."""
        self._last_check = -math.inf
        self._tasks: set[asyncio.Task[None]] = set()

    def admit(self) -> bool:
        """Whether a new session may take a stage now; a refusal is counted (`refused`)."""
        if self.policy.admitting:
            return True
        self.policy.refused()
        return False

    def join(self, session: VoiceSession) -> None:
        """A session with a stage (`session.stage`) is watched from now on."""
        self._sessions[session.id] = session
        driver = session.stage
        self.policy.joined(session.id, asyncio.get_running_loop().time(),
                           can_stretch=driver is not None and driver.abilities.stretches_step)

    def leave(self, session: VoiceSession) -> bool:
        """The session ended: it is watched no more. True when its stage may serve another
        session now; False while a stage call of a session that fell back still runs in its
        thread (a `reset` would wait for it), so the stage must not be pooled."""
        self._sessions.pop(session.id, None)
        self.policy.left(session.id)
        driver = session.stage
        return driver is None or not driver.in_flight

    def check(self) -> None:
        """Measure every session's lag and do what the policy says (at most every `check_s`)."""
        now = asyncio.get_running_loop().time()
        if now - self._last_check < self.check_s:
            return
        self._last_check = now
        lags: dict[str, float | None] = {}
        for sid, session in self._sessions.items():
            driver = session.stage
            if driver is None:
                continue
            if driver.suspended:  # fallen back: is its last stage call still out?
                lags[sid] = None if driver.in_flight else 0.0
            else:
                lags[sid] = driver.lag
        for action in self.policy.observe(now, lags):
            self._apply(action)

    def _apply(self, action: Action) -> None:
        session = self._sessions.get(action.stream)
        if session is None or session.stage is None:
            return
        if isinstance(action, Stretch):
            log.info("stream %s: diarization step x%g", action.stream, action.factor)
            session.stage.stretch(action.factor)
        elif isinstance(action, FallBack):
            log.warning("stream %s: off the diarization stage: %s", action.stream, action.reason)
            self._spawn(self._fall_back(session, action))
        elif isinstance(action, Return):
            log.info("stream %s: back on the diarization stage", action.stream)
            session.return_to_stage()
            self._spawn(self._told(session.id, DiarizationRecovered()))

    async def _fall_back(self, session: VoiceSession, action: FallBack) -> None:
        """Told first, so the status comes before the turns that take the STT's speakers."""
        await self._told(session.id, DiarizationDegraded(action.reason, action.lag_s))
        await session.fall_back()

    async def _told(self, session_id: str, status: DiarizationStatus) -> None:
        try:
            await self._tell(session_id, status)
        except Exception:
            log.exception("stream %s: telling its diarization status failed", session_id)

    def _spawn(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("applying the overload policy failed")

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def wait_idle(self) -> None:
        """Wait until every fallback and status started so far is done."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)


__all__ = ["StageGuard", "StatusTeller", "status_message"]
