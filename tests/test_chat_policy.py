"""Issue 24.2: `chorus serve`'s chat model speaks by policy, as the realtime session does.

The chat channel is built exactly as the server builds it (`server.pipeline`'s factory from a
`ServerConfig`), on the real `openai` client against a local Chat Completions server; people type
in a room through a text channel, and the test counts which turns reached the model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from test_openai_chat import ChatServer

from rooms import RoomKit, TextChannel
from server.config import ServerConfig
from server.pipeline import VoicePipeline
from tests.voice_helpers import UtteranceSTT

LINES = [
    ("alice", "Tuesday works for me."),
    ("bob", "I would rather ship Thursday."),
    ("alice", "Chorus, what did we decide?"),
    ("dana", "Let's take it offline."),
]


@pytest.fixture
def chat_model() -> Iterator[ChatServer]:
    with ChatServer(["Noted."] * 10) as server:
        yield server


async def asked(chat_model: ChatServer, chat: dict[str, Any], policy: dict[str, Any]) -> list[str]:
    """The last user line of every request the model got, after the four lines were typed."""
    config = ServerConfig.model_validate({
        "chat": {"provider": "openai", "base_url": chat_model.base_url, "api_key": "t", **chat},
        "policy": policy,
        "realtime": {"provider": "none"},
    })
    ai = VoicePipeline(config, UtteranceSTT([])).chat_ai
    assert ai is not None
    kit = RoomKit()
    await kit.create_room("r1")
    text = TextChannel("chat")
    kit.register_channel(text)
    kit.register_channel(ai)
    await kit.attach_channel("r1", "chat", group=True)
    await kit.attach_channel("r1", ai.channel_id)
    for who in ("alice", "bob", "dana"):
        await kit.ensure_participant("r1", "chat", who, display_name=who.capitalize())
    for who, line in LINES:
        await text.send(who, line, room_id="r1")
    await kit.drain()
    await kit.close()
    return [[m["content"] for m in r["messages"] if m["role"] == "user"][-1].split("\n\n")[0]
            for r in chat_model.requests]


async def test_by_default_the_chat_model_answers_when_addressed_or_alone(
        chat_model: ChatServer) -> None:
    assert await asked(chat_model, {}, {}) == [
        "Tuesday works for me.",  # the only speaker so far (unlabelled: A1)
        'Alice: "Chorus, what did we decide?"',  # addressed by the assistant's name
    ]


async def test_the_assistant_name_is_the_policy_s(chat_model: ChatServer) -> None:
    got = await asked(chat_model, {}, {"assistant_name": "Bob"})
    assert got == ["Tuesday works for me."]  # "Chorus" is nobody's name here


async def test_answer_only_these_people(chat_model: ChatServer) -> None:
    assert await asked(chat_model, {}, {"answer_only": ["Dana"]}) == ['Dana: "Let\'s take it offline."']


async def test_answer_always_answers_every_turn(chat_model: ChatServer) -> None:
    assert len(await asked(chat_model, {"answer": "always"}, {"answer_only": ["Dana"]})) == 4
