"""`OpenAIChatProvider` (issue item 9): an `AIChannel` driving the OpenAI Chat Completions API
through the real `openai` client, against a small local server speaking that wire format.

The server answers with `openai.types.chat.ChatCompletion` values (the SDK's own typed models), so
what it sends is what the client parses. Rules: attribution H (what a provider sees), A2, F3.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.completion_usage import CompletionUsage

from attribution import NOTE_MARK
from models import AIContext, AIImagePart, AIMessage, AITextPart
from rooms import AIChannel, RoomKit, TextChannel
from rooms.providers.openai_chat import OpenAIChatProvider, chat_messages


class ChatServer:
    """`POST /v1/chat/completions` → a `ChatCompletion`; keeps every request body and header."""

    def __init__(self, replies: list[str], *, status: int = 200) -> None:
        self.replies = list(replies)
        self.status = status
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                server.headers.append({k.lower(): v for k, v in self.headers.items()})
                if self.path != "/v1/chat/completions":
                    self._reply(
                        404, {"error": {"message": f"no route {self.path}", "type": "not_found"}}
                    )
                    return
                request = json.loads(body)
                server.requests.append(request)
                if server.status != 200:
                    self._reply(
                        server.status,
                        {
                            "error": {
                                "message": "the model is overloaded",
                                "type": "server_error",
                                "code": None,
                            }
                        },
                    )
                    return
                completion = ChatCompletion(
                    id=f"chatcmpl-{len(server.requests)}",
                    object="chat.completion",
                    created=int(time.time()),
                    model=request["model"],
                    choices=[
                        Choice(
                            index=0,
                            finish_reason="stop",
                            message=ChatCompletionMessage(
                                role="assistant",
                                content=server.replies.pop(0) if server.replies else "OK.",
                            ),
                        )
                    ],
                    usage=CompletionUsage(prompt_tokens=10, completion_tokens=3, total_tokens=13),
                )
                self._reply(200, completion.model_dump(mode="json", exclude_none=True))

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    with ChatServer(["Noted.", "Noted.", "Alice proposed Tuesday; Bob, Thursday."]) as server:
        yield server


async def room_with_ai(provider: OpenAIChatProvider) -> tuple[RoomKit, TextChannel]:
    kit = RoomKit()
    await kit.create_room("r1")
    chat = TextChannel("chat")
    kit.register_channel(chat)
    kit.register_channel(AIChannel("ai", provider, system_prompt="You help meetings."))
    await kit.attach_channel("r1", "chat", group=True)
    await kit.attach_channel("r1", "ai")
    return kit, chat


async def test_H_chat_model_sees_labelled_turns_and_reply_comes_back(
    chat_server: ChatServer,
) -> None:
    provider = OpenAIChatProvider("gpt-test", api_key="sk-chat", base_url=chat_server.base_url)
    kit, chat = await room_with_ai(provider)
    for who in ("alice", "bob", "carol"):
        await kit.ensure_participant("r1", "chat", who, display_name=who.capitalize())
    await chat.send("alice", "Tuesday works for me.", room_id="r1")
    await chat.send("bob", "I would rather ship Thursday.", room_id="r1")
    await chat.send("carol", "Who proposed what?", room_id="r1")

    last = chat_server.requests[-1]
    assert last["model"] == "gpt-test"
    assert last["messages"][0] == {"role": "system", "content": "You help meetings."}
    users = [m["content"] for m in last["messages"] if m["role"] == "user"]
    assert users[:2] == ['Alice: "Tuesday works for me."', 'Bob: "I would rather ship Thursday."']
    assert users[2].startswith('Carol: "Who proposed what?"\n\n' + NOTE_MARK)
    assert all("name" not in m for m in last["messages"])  # F3: no per-message name fields
    assert chat_server.headers[-1]["authorization"] == "Bearer sk-chat"
    replies = [e for e in await kit.list_events("r1") if e.source.channel_id == "ai"]
    assert [e.text for e in replies] == [
        "Noted.",
        "Noted.",
        "Alice proposed Tuesday; Bob, Thursday.",
    ]
    assert replies[-1].metadata["model"] == "gpt-test"
    assert replies[-1].metadata["finish_reason"] == "stop"
    assert replies[-1].metadata["usage"]["total_tokens"] == 13


async def test_A2_one_speaker_request_has_no_labels(chat_server: ChatServer) -> None:
    provider = OpenAIChatProvider("gpt-test", api_key="k", base_url=chat_server.base_url)
    kit, chat = await room_with_ai(provider)
    await kit.ensure_participant("r1", "chat", "alice", display_name="Alice")
    await chat.send("alice", "Alice: hello", room_id="r1")
    assert chat_server.requests[0]["messages"] == [
        {"role": "system", "content": "You help meetings."},
        {"role": "user", "content": "Alice: hello"},
    ]


def test_chat_messages_maps_parts_and_roles() -> None:
    context = AIContext(
        system_prompt="S",
        messages=[
            AIMessage(
                role="user", content=[AITextPart(text="Alice:"), AIImagePart(url="https://x/y.png")]
            ),
            AIMessage(role="assistant", content="ok"),
        ],
    )
    assert chat_messages(context) == [
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Alice:"},
                {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
            ],
        },
        {"role": "assistant", "content": "ok"},
    ]


async def test_server_error_is_a_clear_api_error() -> None:
    with ChatServer([], status=503) as server:
        provider = OpenAIChatProvider(
            "gpt-test", api_key="k", base_url=server.base_url, max_retries=0
        )
        with pytest.raises(openai.InternalServerError, match="overloaded"):
            await provider.generate(AIContext(messages=[AIMessage(role="user", content="hi")]))


def test_missing_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        OpenAIChatProvider()


async def test_base_url_from_environment(
    chat_server: ChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    monkeypatch.setenv("OPENAI_BASE_URL", chat_server.base_url)
    response = await OpenAIChatProvider("gpt-env").generate(
        AIContext(messages=[AIMessage(role="user", content="hi")])
    )
    assert response.text == "Noted."
    assert chat_server.headers[-1]["authorization"] == "Bearer sk-env"
