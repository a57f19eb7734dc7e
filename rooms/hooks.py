"""Hooks: application code that sees, changes or stops what passes through a room.

Two kinds, one registry. A *sync chain* (`BEFORE_BROADCAST`, `ON_TRANSCRIPTION`) runs hooks in
priority order before anything is committed; each sees the value the previous hook returned and may
allow, modify or block it. *Observers* (`AFTER_BROADCAST`, `ON_SPEAKER_CHANGE`, …) run after the
fact as tasks; what they return is ignored and they can never stall the stream that fired them.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from rooms.kit import RoomKit

log = logging.getLogger(__name__)

T = TypeVar("T")


class HookTrigger(StrEnum):
    BEFORE_BROADCAST = "before_broadcast"
    """Sync chain over a `RoomEvent` about to be committed: modify or block it."""
    AFTER_BROADCAST = "after_broadcast"
    """Observer of a committed, delivered `RoomEvent`."""
    ON_TRANSCRIPTION = "on_transcription"
    """Sync chain over a voice `TranscriptionEvent` before it becomes a room event (V6)."""
    ON_SPEAKER_CHANGE = "on_speaker_change"
    """Observer: the speaker differs from the previous turn's (V6)."""
    ON_ROOM_CREATED = "on_room_created"
    """Observer of a new `Room`."""
    ON_DTMF = "on_dtmf"
    """Observer: a caller pressed a key on a phone leg (the feed's `dtmf` message as value)."""
    ON_AGENT_STATUS = "on_agent_status"
    """Observer: a model channel of the room (the realtime session, an ACP agent, a chat model)
    lost its provider or process, or has it back (an `AgentStatus` as value)."""


@dataclass(frozen=True)
class AgentStatus:
    """`ON_AGENT_STATUS`: whether the room's model behind `channel_id` can answer now.
    Unavailable: its provider refused the session or cannot be reached, or its process exited,
    and the channel keeps trying (the room's lines wait for it in order); available: it answers
    again."""

    channel_id: str
    available: bool
    reason: str | None = None
    """Why it is unavailable, in words fit for the room (never a secret or a provider's body)."""


SYNC_TRIGGERS = frozenset({HookTrigger.BEFORE_BROADCAST, HookTrigger.ON_TRANSCRIPTION})


@dataclass(frozen=True)
class HookResult(Generic[T]):
    action: Literal["allow", "modify", "block"]
    value: T | None = None
    reason: str | None = None

    @classmethod
    def allow(cls) -> HookResult[Any]:
        return HookResult("allow")

    @classmethod
    def modify(cls, value: T) -> HookResult[T]:
        return HookResult("modify", value=value)

    @classmethod
    def block(cls, reason: str | None = None) -> HookResult[Any]:
        return HookResult("block", reason=reason)

    @property
    def blocked(self) -> bool:
        return self.action == "block"


@dataclass(frozen=True)
class HookContext:
    """Where a hook fires: the room, the channel the value came from, and the hub."""

    room_id: str
    channel_id: str | None
    kit: RoomKit
    participant_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class AgentStatusBoard:
    """Which rooms were told that a model channel (`channel_id`) is away: `tell` emits
    `ON_AGENT_STATUS` only when a room's status changes, so each room hears once per outage and
    once when it is over. The one home of that rule for every model channel (the realtime
    channel, an ACP agent, a chat model)."""

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self.away: set[str] = set()
        """The rooms told the model is away, and not yet that it is back."""

    def tell(
        self, kit: RoomKit, room_id: str, available: bool, reason: str | None = None
    ) -> AgentStatus | None:
        """The room's `ON_AGENT_STATUS` observers hear `available` (with `reason`) when it is
        news for the room; the status told, or None when it was not."""
        if available != (room_id in self.away):
            return None
        if available:
            self.away.discard(room_id)
        else:
            self.away.add(room_id)
        status = AgentStatus(self.channel_id, available, reason)
        kit.emit(HookTrigger.ON_AGENT_STATUS, status,
                 HookContext(room_id=room_id, channel_id=self.channel_id, kit=kit))  # fmt: skip
        return status


HookFn = Callable[[Any, HookContext], "HookResult[Any] | Awaitable[HookResult[Any] | None] | None"]


@dataclass(frozen=True)
class _Hook:
    trigger: HookTrigger
    fn: HookFn
    priority: int
    name: str


class HookRegistry:
    def __init__(self) -> None:
        self._hooks: dict[HookTrigger, list[_Hook]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def add(self, trigger: HookTrigger, fn: HookFn, *, priority: int = 0, name: str | None = None) -> None:
        hooks = self._hooks.setdefault(trigger, [])
        hooks.append(_Hook(trigger, fn, priority, name or str(getattr(fn, "__name__", "hook"))))
        hooks.sort(key=lambda h: h.priority)

    def has(self, trigger: HookTrigger) -> bool:
        return bool(self._hooks.get(trigger))

    async def run_chain(self, trigger: HookTrigger, value: T, ctx: HookContext) -> HookResult[T]:
        """Run a sync chain. Returns `allow` (nothing changed), `modify` (the final value) or
        `block` (the first hook that blocked, with its reason)."""
        current = value
        modified = False
        for hook in self._hooks.get(trigger, []):
            result = hook.fn(current, ctx)
            if inspect.isawaitable(result):
                result = await result
            if result is None or result.action == "allow":
                continue
            if result.action == "block":
                return HookResult("block", reason=result.reason or f"blocked by hook {hook.name}")
            if result.action == "modify":
                if result.value is None:
                    raise ValueError(f"hook {hook.name} returned modify() without a value")
                current = result.value
                modified = True
        return HookResult("modify", value=current) if modified else HookResult("allow", value=current)

    def emit(self, trigger: HookTrigger, value: Any, ctx: HookContext) -> None:
        """Run observers as tasks; exceptions are logged, never raised into the caller."""
        for hook in self._hooks.get(trigger, []):
            task = asyncio.get_running_loop().create_task(self._observe(hook, value, ctx))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _observe(self, hook: _Hook, value: Any, ctx: HookContext) -> None:
        try:
            result = hook.fn(value, ctx)
            if inspect.isawaitable(result):
                await result
        except Exception:
            log.exception("observer hook %s failed on %s", hook.name, hook.trigger)

    async def drain(self) -> None:
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
