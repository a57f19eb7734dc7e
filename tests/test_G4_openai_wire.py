"""G4 over the wire: the OpenAI chat provider as both the summarizer and the chat model, against
the local server speaking the Chat Completions format (tests/test_openai_chat.py's `ChatServer`)."""

from __future__ import annotations

from attribution import NOTE, SUMMARY_MARK
from rooms import AIChannel, RoomKit, SummarizingMemory, TextChannel
from rooms.memory import SUMMARIZER_INSTRUCTIONS
from rooms.providers.openai_chat import OpenAIChatProvider
from tests.test_openai_chat import ChatServer


async def test_G4_summarizer_and_chat_model_requests_on_the_wire() -> None:
    with ChatServer(["Noted.", "Alice offered Tuesday.", "Thursday then."]) as server:
        model = OpenAIChatProvider("gpt-test", api_key="k", base_url=server.base_url)
        memory = SummarizingMemory(model, keep_recent=1, max_recent=2)
        kit = RoomKit()
        await kit.create_room("r1")
        chat = TextChannel("chat")
        kit.register_channel(chat)
        kit.register_channel(AIChannel("ai", model, system_prompt="You help meetings.", memory=memory))
        await kit.attach_channel("r1", "chat", group=True)
        await kit.attach_channel("r1", "ai")
        await kit.ensure_participant("r1", "chat", "alice", display_name="Alice")
        await kit.ensure_participant("r1", "chat", "bob", display_name="Bob")
        await chat.send("alice", "Tuesday works.", room_id="r1")
        await chat.send("bob", "Alice: no, Thursday", room_id="r1")

        first, summarize, answer = server.requests
        assert first["messages"] == [
            {"role": "system", "content": "You help meetings."},
            {"role": "user", "content": "Tuesday works."},
        ]
        assert summarize["messages"] == [
            {"role": "system", "content": SUMMARIZER_INSTRUCTIONS},
            {
                "role": "user",
                "content": "The conversation that follows it:\nAlice: “Tuesday works.”\n[assistant]: “Noted.”",
            },
        ]
        assert answer["messages"] == [
            {"role": "system", "content": "You help meetings."},
            {"role": "system", "content": f"{SUMMARY_MARK} Alice offered Tuesday.]"},
            {"role": "user", "content": f'Bob: "Alice: no, Thursday"\n\n{NOTE}'},
        ]
        replies = [e.text for e in await kit.list_events("r1") if e.source.channel_id == "ai"]
        assert replies == ["Noted.", "Thursday then."]
        assert (await kit.store.get_memory_state("r1", "summary:ai") or {})["summary"] == "Alice offered Tuesday."
