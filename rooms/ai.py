"""The AI channel: a chat model taking part in a room.

For each event it should answer, the channel asks memory for the window, hands the window to the
attribution engine (which labels turns when several people speak, rules A–E) and sends the
resulting `AIContext` to its provider. The reply is stored as an event of this channel, so the
model's own turns come back to it as `assistant` turns, never labelled (C3).
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from attribution import Register, render_chat_context, render_plain_context
from models import AIContext, RoomEvent, TextContent
from rooms.channel import Channel, RoomContext
from rooms.memory import Memory, SlidingWindowMemory

log = logging.getLogger(__name__)


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


class AIChannel(Channel):
    channel_type: ClassVar[str] = "ai"

    def __init__(
        self,
        channel_id: str,
        provider: AIProvider,
        system_prompt: str | None = None,
        *,
        memory: Memory | None = None,
        attribution: bool = True,
        answer_agents: bool = False,
    ) -> None:
        super().__init__(channel_id)
        self.provider = provider
        self.system_prompt = system_prompt
        self.memory = memory or SlidingWindowMemory()
        self.attribution = attribution
        self.answer_agents = answer_agents
        """Answer events from other agent channels too (off by default: two agents would loop)."""

    def should_answer(self, event: RoomEvent) -> bool:
        if event.kind != "message":
            return False
        return self.answer_agents or event.source.channel_type not in {"ai", "realtime"}

    async def build_context(self, trigger: RoomEvent, ctx: RoomContext) -> AIContext:
        kit = ctx.kit
        window = await self.memory.retrieve(kit.store, ctx.room_id, self.channel_id)
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

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        if not self.should_answer(event):
            return
        context = await self.build_context(event, ctx)
        response = await self.provider.generate(context)
        if not response.text:
            return
        await ctx.kit.post_event(
            ctx.room_id,
            self.channel_id,
            TextContent(body=response.text),
            metadata={"ai_response": True, "in_reply_to": event.id, **response.metadata},
        )
