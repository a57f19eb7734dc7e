"""The AI channel: a chat model taking part in a room.

For each event it should answer, the channel asks memory for the window, hands the window to the
attribution engine (which labels turns when several people speak, rules A–E) and sends the
resulting `AIContext` to its provider. The reply is stored as an event of this channel, so the
model's own turns come back to it as `assistant` turns, never labelled (C3).

Whether the channel answers at all is decided before any of that: `should_answer` (message events,
not other agents unless `answer_agents`), then, when one is given, the speak policy (G6) — the same
`SpeakPolicy` objects the realtime channel uses, reading the turn under its attribution label, so
`AnswerOnly(people=["Alice"])` never answers a look-alike ranked `Alice (2)`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from attribution import (
    Register,
    render_chat_context,
    render_plain_context,
    render_summarized_context,
)
from models import AIContext, AIMessage, RoomEvent, TextContent
from rooms.channel import Channel, RoomContext
from rooms.delegation import Delegation, TaskWorker, delegate_task
from rooms.hooks import AgentStatusBoard
from rooms.memory import Memory, SlidingWindowMemory, SummarizingMemory
from rooms.policy import SpeakPolicy, SpeakTurn

log = logging.getLogger(__name__)


def up_to(events: list[RoomEvent], trigger: RoomEvent, own: str | None = None) -> list[RoomEvent]:
    """`events` (oldest first) up to and including `trigger`: what the room held when it came. The
    channel's queue may come to a turn after later ones were committed (`rooms.kit`); the model
    answers the turn, not the room's latest line. Unchanged when `trigger` is not among them.

    The replies of channel `own` to earlier turns stay in the window even when they were committed
    after `trigger` (the model was still answering turn N when turn N+1 came): each is placed right
    after the turn it answers (`in_reply_to`), so the model always reads what it said, in the order
    it said it, and `trigger` stays the last line."""
    for index in range(len(events) - 1, -1, -1):
        if events[index].id == trigger.id:
            break
    else:
        return events
    window = events[: index + 1]
    if own is None:
        return window
    late: dict[str, list[RoomEvent]] = {}
    kept = {event.id for event in window[:-1]}
    for event in events[index + 1 :]:
        answers = event.metadata.get("in_reply_to")
        if event.source.channel_id == own and isinstance(answers, str) and answers in kept:
            late.setdefault(answers, []).append(event)
    if not late:
        return window
    placed: list[RoomEvent] = []
    for event in window:
        placed.append(event)
        placed.extend(late.get(event.id, ()))
    return placed  # `trigger` answers nothing kept: it stays last


class AIResponse(BaseModel):
    text: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class AIProvider(ABC):
    @abstractmethod
    async def generate(self, context: AIContext) -> AIResponse: ...


class MockAIProvider(AIProvider):
    """Answers from a list (cycling) and records every context it was asked to generate from."""

    def __init__(self, responses: list[str] | None = None) -> None:
        self.responses = list(responses or ["OK."])
        self.calls: list[AIContext] = []

    async def generate(self, context: AIContext) -> AIResponse:
        self.calls.append(context.model_copy(deep=True))
        text = self.responses[(len(self.calls) - 1) % len(self.responses)]
        return AIResponse(text=text)


def failure_reason(exc: BaseException) -> str:
    """Why a chat model's call failed, fit for the room: the HTTP status an API error carries,
    else the error's kind; never its message (an API error can quote part of a key)."""
    status = getattr(exc, "status_code", None)
    if isinstance(status, int):
        return f"the chat model failed, HTTP {status}"
    return f"the chat model failed ({type(exc).__name__})"


class AIChannel(Channel):
    """A chat model in a room: `AIChannel("ai", provider, system_prompt, memory=..., policy=...)`.

    - `memory`: which past events the model reads (default: the last 50, `SlidingWindowMemory`).
    - `attribution`: label turns when several people speak (A–E); off sends plain roles.
    - `answer_agents`: also answer other agent channels' turns (off: two agents would loop).
    - `policy`: a `SpeakPolicy` (G6) deciding, per turn, whether the model is asked at all; None
      (the default) answers every message. `assistant_name` is the name `AnswerWhenAddressed`
      listens for.
    """

    channel_type: ClassVar[str] = "ai"
    inline_delivery: ClassVar[bool] = False
    """A model call takes seconds: the channel gets its events through its own queue per room
    (`rooms.kit`), so it never holds a voice turn's commit, the device, the feed or another
    channel. A model that fell behind still reads each turn's room as it stood at that turn: the
    window ends at the turn it answers, with its own replies to earlier turns (`up_to`)."""

    def __init__(
        self,
        channel_id: str,
        provider: AIProvider,
        system_prompt: str | None = None,
        *,
        memory: Memory | None = None,
        attribution: bool = True,
        answer_agents: bool = False,
        policy: SpeakPolicy | None = None,
        assistant_name: str = "Assistant",
    ) -> None:
        super().__init__(channel_id)
        self.provider = provider
        self.system_prompt = system_prompt
        self.memory = memory or SlidingWindowMemory()
        self.attribution = attribution
        self.answer_agents = answer_agents
        """Answer events from other agent channels too (off by default: two agents would loop)."""
        self.policy = policy
        self.assistant_name = assistant_name
        self._speakers: dict[str, set[str]] = {}
        """Per room: the labels of the turns it heard, once `speak_turn` asked (G6 counts them;
        reading the whole room for every turn made each turn cost as much as the room)."""
        self._status = AgentStatusBoard(channel_id)
        """Rooms told their model is unavailable (its last call failed), until one succeeds."""

    def should_answer(self, event: RoomEvent) -> bool:
        if event.kind != "message":
            return False
        return self.answer_agents or event.source.channel_type not in {"ai", "realtime"}

    async def _build_summarized_context(
        self, memory: SummarizingMemory, trigger: RoomEvent, ctx: RoomContext
    ) -> AIContext:
        """G4: the running summary (kept with the room) and the turns kept verbatim after it."""
        kit = ctx.kit
        participants = await kit.get_participants(ctx.room_id)
        register = await kit.get_register(ctx.room_id) or Register.new()
        recall = await memory.recall(
            up_to(await kit.list_events(ctx.room_id), trigger, self.channel_id),
            self.channel_id,
            room_id=ctx.room_id,
            store=kit.store,
            participants=participants,
            register=register,
            attribution=self.attribution,
        )
        return render_summarized_context(
            recall.summary,
            recall.summary_names,
            recall.window,
            trigger,
            participants,
            register,
            ai_channel_id=self.channel_id,
            system_prompt=self.system_prompt,
            attribution=self.attribution,
        )

    async def speak_turn(self, event: RoomEvent, ctx: RoomContext) -> SpeakTurn:
        """The turn as the speak policy reads it (G6): its attribution label, the text as sent,
        and how many distinct speakers (by label) the room's turns this channel can see hold."""
        label = await ctx.kit.label_for(ctx.room_id, event)
        speakers = self._speakers.get(ctx.room_id)
        if speakers is None:  # the room's past, labelled once (off the loop), then kept up
            speakers = set(await ctx.kit.past_labels(ctx.room_id, self._heard))
            self._speakers[ctx.room_id] = speakers
        if self._heard(event):
            speakers.add(label)
        return SpeakTurn(
            speakers=(label,),
            text=event.text,
            assistant_name=self.assistant_name,
            room_speakers=len(speakers | {label}),
            event=event,
        )

    def _heard(self, event: RoomEvent) -> bool:
        """A turn counted among the room's speakers: not a notice, not its own, visible to it."""
        return (
            event.kind != "system"
            and event.source.channel_id != self.channel_id
            and event.visible_to(self.channel_id)
        )

    async def on_detach(self, room_id: str) -> None:
        self._speakers.pop(room_id, None)

    async def build_context(self, trigger: RoomEvent, ctx: RoomContext) -> AIContext:
        if isinstance(self.memory, SummarizingMemory):
            return await self._build_summarized_context(self.memory, trigger, ctx)
        kit = ctx.kit
        window = up_to(
            await self.memory.retrieve(kit.store, ctx.room_id, self.channel_id), trigger, self.channel_id
        )
        if self.attribution:
            participants = await kit.get_participants(ctx.room_id)
            register = await kit.get_register(ctx.room_id) or Register.new()
            return render_chat_context(
                window,
                trigger,
                participants,
                register,
                ai_channel_id=self.channel_id,
                system_prompt=self.system_prompt,
            )
        return render_plain_context(
            window, trigger, ai_channel_id=self.channel_id, system_prompt=self.system_prompt
        )

    async def perform_task(self, block: str, *, room_id: str) -> str:
        """G5, as a worker: answer a task block another agent handed over. The model reads the
        block alone (its system prompt, then the block as the one user turn), not the room."""
        context = AIContext(
            messages=[AIMessage(role="user", content=block)], system_prompt=self.system_prompt
        )
        return (await self.provider.generate(context)).text

    async def delegate(
        self,
        room_id: str,
        worker: TaskWorker,
        *,
        request: RoomEvent | None = None,
        task: str | None = None,
    ) -> Delegation:
        """G5, as the delegating agent: hand `worker` a task and post its result into the room
        (see `rooms.delegation.delegate_task`: `request` alone forwards a person's words, `task`
        with `request` is this agent's wording on their behalf, `task` alone names no one)."""
        kit = self.require_kit()
        return await delegate_task(
            kit, room_id, worker, request=request, task=task, delegated_by=self.channel_id
        )

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        answering = self.should_answer(event)
        if answering and self.policy is not None:
            # `speak_turn` labels the turn and counts it among the room's speakers
            if not self.policy.should_answer(await self.speak_turn(event, ctx)):
                return
        elif (speakers := self._speakers.get(ctx.room_id)) is not None and self._heard(event):
            speakers.add(await ctx.kit.label_for(ctx.room_id, event))
        if not answering:
            return
        context = await self.build_context(event, ctx)
        try:
            response = await self.provider.generate(context)
        except Exception as exc:  # the room hears the first of a run of failed calls
            self._status.tell(ctx.kit, ctx.room_id, False, failure_reason(exc))
            raise
        self._status.tell(ctx.kit, ctx.room_id, True)  # and the call that succeeds after it
        if not response.text:
            return
        await ctx.kit.post_event(
            ctx.room_id,
            self.channel_id,
            TextContent(body=response.text),
            metadata={"ai_response": True, "in_reply_to": event.id, **response.metadata},
        )
