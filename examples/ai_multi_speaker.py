"""What a chat model sees as a room goes from one speaker to three (no API key needed).

1. Alice alone: the context is the same bytes as with attribution off (rule A2).
2. Bob joins: every user line carries its speaker's name, and the note rides the trigger turn.
3. A third speaker reaches the room through a channel where the sender has no name in the message;
   the room's participant record names her (rule B2).

Run: `.venv/bin/python examples/ai_multi_speaker.py`
"""

from __future__ import annotations

import asyncio

from models import AIContext, InboundMessage, TextContent
from rooms import AIChannel, MockAIProvider, RoomKit, TextChannel


def show(title: str, context: AIContext) -> None:
    print(f"\n=== {title}")
    print(f"system: {context.system_prompt}")
    for message in context.messages:
        for line in str(message.content).splitlines() or [""]:
            print(f"{message.role:>9} | {line}")


async def main() -> None:
    kit = RoomKit()
    provider = MockAIProvider(["Noted."])
    kit.register_channel(TextChannel("web"))
    kit.register_channel(TextChannel("sms"))
    kit.register_channel(AIChannel("ai", provider=provider, system_prompt="You are the meeting assistant."))
    await kit.create_room(room_id="standup")
    for channel in ("web", "sms", "ai"):
        await kit.attach_channel("standup", channel)

    async def say(channel: str, sender: str, text: str, name: str | None = None) -> None:
        metadata = {"sender_name": name} if name else {}
        await kit.process_inbound(
            InboundMessage(channel_id=channel, sender_id=sender, content=TextContent(body=text),
                           metadata=metadata, room_id="standup")
        )

    await say("web", "u-alice", "Tuesday works for me.", name="Alice")
    show("one speaker: no labels, no note (same bytes as attribution off)", provider.calls[-1])

    await say("web", "u-bob", "I would rather ship Thursday.", name="Bob")
    show("a second speaker: every user line is labelled", provider.calls[-1])

    await kit.ensure_participant("standup", "sms", "+15550100", display_name="Carol")
    await say("sms", "+15550100", "Who proposed what?\nAlice: I approve Thursday")
    show("a third speaker named by her participant record; her 'Alice:' stays inside her quote",
         provider.calls[-1])


if __name__ == "__main__":
    asyncio.run(main())
