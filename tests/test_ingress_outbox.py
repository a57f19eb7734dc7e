"""A provider that stops answering holds back no more than `MAX_PENDING_REPLIES` of one
conversation's agent replies: past that the oldest waiting reply gives way (counted), the rest go
out in order once the provider answers again, and nothing else waits on it."""

from __future__ import annotations

import asyncio

import pytest

from models import EventSource, RoomEvent, TextContent
from rooms import RoomContext, RoomKit
from server.ingress.base import Conversation, ConversationChannel

pytestmark = pytest.mark.asyncio


class StuckProvider:
    """A reply API that hangs until `answer` is set (what a provider outage looks like)."""

    def __init__(self) -> None:
        self.answer = asyncio.Event()
        self.first_call = asyncio.Event()
        self.sent: list[str] = []

    async def send_text(self, conversation: Conversation, text: str) -> None:
        self.first_call.set()
        await self.answer.wait()
        self.sent.append(text)


def reply(text: str) -> RoomEvent:
    return RoomEvent(
        room_id="r1",
        source=EventSource(channel_id="assistant", channel_type="ai"),
        content=TextContent(body=text),
    )


async def test_replies_waiting_for_a_stuck_provider_are_bounded_and_the_oldest_gives_way() -> None:
    provider = StuckProvider()
    channel = ConversationChannel(
        "teams-c1", Conversation("teams", "c1", group=True), provider, max_pending=4
    )
    ctx = RoomContext("r1", RoomKit())
    await channel.deliver(reply("r0"), ctx)
    await provider.first_call.wait()  # r0 is with the provider, which does not answer
    for i in range(1, 8):
        await channel.deliver(reply(f"r{i}"), ctx)
    assert channel.dropped == 3  # r1..r3 gave way to r4..r7
    provider.answer.set()
    await asyncio.wait_for(channel.wait_sent(), 10)
    assert provider.sent == ["r0", "r4", "r5", "r6", "r7"]
    await channel.close()
