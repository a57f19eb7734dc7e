"""Delivery to each channel of a room is decoupled (issue 24.1): a chat model that takes seconds,
or never answers, holds only its own queue — never the commit of a turn, the server's output (the
device and the feed) or another channel. Per channel, events (and their updates) arrive in commit
order; a queue that falls behind skips its oldest waiting delivery and counts it; `drain` waits
for every queue. The providers here wait on events, never on the clock.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from bench.slow_chat import chat_completion
from models import AIContext, RoomEvent, TextContent
from rooms import (
    AgentStatus,
    AIChannel,
    AIProvider,
    AIResponse,
    Channel,
    HookTrigger,
    RoomContext,
    RoomKit,
    TextChannel,
)
from rooms.providers.openai_chat import OpenAIChatProvider
from tests.test_openai_chat import ChatServer


class HeldProvider(AIProvider):
    """Answers each turn with its text, once `release` is set (never, if it never is)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.asked: list[str] = []
        self.asked_one = asyncio.Event()

    async def generate(self, context: AIContext) -> AIResponse:
        last = context.messages[-1].content
        self.asked.append(str(last))
        self.asked_one.set()
        await self.release.wait()
        return AIResponse(text=f"re: {self.asked[-1]}")


class VoiceTurns(Channel):
    """Posts turns as the voice channel does: `post_event`, nothing settled."""

    channel_type: ClassVar[str] = "voice"

    async def say(self, room_id: str, text: str) -> RoomEvent:
        event = await self.require_kit().post_event(
            room_id, self.channel_id, TextContent(body=text), metadata={"source": "voice"}
        )
        assert event is not None
        return event


class QueuedRecorder(Channel):
    """A queued channel that keeps what it got (`update` marks a `deliver_update`) and fails on
    a turn reading `fail`."""

    channel_type: ClassVar[str] = "custom"
    inline_delivery: ClassVar[bool] = False

    def __init__(self, channel_id: str) -> None:
        super().__init__(channel_id)
        self.got: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.taking = False
        """A delivery has started (it may be waiting on `gate`)."""

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        self.taking = True
        await self.gate.wait()
        if event.text == "fail":
            raise RuntimeError("this consumer breaks on this turn")
        self.got.append(event.text)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        await self.gate.wait()
        self.got.append(f"update {event.text}")


async def room(*channels: Channel, limit: int = 256) -> tuple[RoomKit, VoiceTurns, TextChannel]:
    kit = RoomKit(delivery_queue_limit=limit)
    voice, device = VoiceTurns("voice"), TextChannel("device")
    await kit.create_room("r")
    for channel in (voice, device, *channels):
        kit.register_channel(channel)
        await kit.attach_channel("r", channel.channel_id)
    return kit, voice, device


async def until(condition: Callable[[], bool]) -> None:
    """Let the other tasks run until `condition` holds (no clock: a bounded number of turns)."""
    for _ in range(10_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


def texts(channel: TextChannel) -> list[str]:
    return [e.text for e in channel.delivered]


async def test_a_slow_chat_model_does_not_hold_a_turn_or_the_device() -> None:
    provider = HeldProvider()
    kit, voice, device = await room(AIChannel("ai", provider))
    await voice.say("r", "first")
    await provider.asked_one.wait()  # the model is working on "first" and will not return yet
    async with asyncio.timeout(10):  # a commit held by the model would never return
        await voice.say("r", "second")
        await voice.say("r", "third")
    assert texts(device) == ["first", "second", "third"]  # each had it when its commit returned
    provider.release.set()
    await kit.drain()
    assert provider.asked == ["first", "second", "third"]
    assert texts(device) == ["first", "second", "third", "re: first", "re: second", "re: third"]
    assert kit.delivery_stats()["ai"].delivered == 3


class RecordingHeldProvider(HeldProvider):
    """A `HeldProvider` that keeps each context it was asked with."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[AIContext] = []

    async def generate(self, context: AIContext) -> AIResponse:
        self.contexts.append(context.model_copy(deep=True))
        return await super().generate(context)


async def test_a_model_that_fell_behind_still_reads_its_own_earlier_replies() -> None:
    # the reply to "first" is committed after "second" and "third" (the model was still working):
    # answering "second", the model reads first, its reply, second — not a room with its own
    # words cut out because they came after the turn it now answers
    provider = RecordingHeldProvider()
    kit, voice, _ = await room(AIChannel("ai", provider, attribution=False))
    await voice.say("r", "first")
    await provider.asked_one.wait()
    await voice.say("r", "second")
    await voice.say("r", "third")
    provider.release.set()
    await kit.drain()
    committed = [e.text for e in await kit.list_events("r")]
    assert committed == ["first", "second", "third", "re: first", "re: second", "re: third"]
    windows = [[(m.role, m.content) for m in c.messages] for c in provider.contexts]
    assert windows == [
        [("user", "first")],
        [("user", "first"), ("assistant", "re: first"), ("user", "second")],
        [
            ("user", "first"), ("assistant", "re: first"),
            ("user", "second"), ("assistant", "re: second"),
            ("user", "third"),
        ],
    ]


async def test_a_chat_model_that_never_answers_holds_nothing_but_itself() -> None:
    provider = HeldProvider()  # never released
    other = QueuedRecorder("other")
    kit, voice, device = await room(AIChannel("ai", provider), other)
    async with asyncio.timeout(10):
        for n in range(5):
            await voice.say("r", f"turn {n}")
    await provider.asked_one.wait()
    await until(lambda: len(other.got) == 5)  # the other queued channel keeps up
    assert other.got == texts(device) == [f"turn {n}" for n in range(5)]
    stats = kit.delivery_stats()
    assert stats["ai"].waiting == 4 and stats["ai"].delivered == 0
    await kit.close()  # a shutdown is not held either: what waited is dropped, counted
    assert kit.delivery_stats()["ai"].dropped == 4


async def test_each_queued_channel_gets_events_and_their_updates_in_commit_order() -> None:
    slow = QueuedRecorder("slow")
    slow.gate.clear()
    kit, voice, device = await room(slow)
    first = await voice.say("r", "one")
    await voice.say("r", "two")
    await kit.update_event("r", first.id, content=TextContent(body="one, corrected"))
    await voice.say("r", "three")
    assert texts(device) == ["one, corrected", "two", "three"] and slow.got == []
    slow.gate.set()
    await kit.drain()
    assert slow.got == ["one", "two", "update one, corrected", "three"]


async def test_a_full_queue_skips_its_oldest_waiting_delivery_and_counts_it() -> None:
    slow = QueuedRecorder("slow")
    slow.gate.clear()
    kit, voice, device = await room(slow, limit=2)
    await voice.say("r", "one")
    await until(lambda: slow.taking)  # "one" is in progress: never skipped
    for text in ("two", "three", "four"):  # the queue holds two: "four" pushes "two" out
        await voice.say("r", text)
    assert texts(device) == ["one", "two", "three", "four"]  # the device missed nothing
    slow.gate.set()
    await kit.drain()
    assert slow.got == ["one", "three", "four"]
    assert kit.delivery_stats()["slow"].dropped == 1


async def test_skipping_an_event_takes_its_waiting_updates_with_it() -> None:
    slow = QueuedRecorder("slow")
    slow.gate.clear()
    kit, voice, _ = await room(slow, limit=2)
    await voice.say("r", "one")
    await until(lambda: slow.taking)  # "one" is in progress
    two = await voice.say("r", "two")
    await kit.update_event("r", two.id, content=TextContent(body="two, corrected"))
    await voice.say("r", "three")  # full: "two" goes, and its update with it
    slow.gate.set()
    await kit.drain()
    assert slow.got == ["one", "three"]
    assert kit.delivery_stats()["slow"].dropped == 2


async def test_a_failing_delivery_does_not_stop_the_channels_queue() -> None:
    flaky = QueuedRecorder("flaky")
    kit, voice, _ = await room(flaky)
    for text in ("before", "fail", "after"):
        await voice.say("r", text)
    await kit.drain()
    assert flaky.got == ["before", "after"]
    stats = kit.delivery_stats()["flaky"]
    assert (stats.delivered, stats.failed, stats.dropped) == (2, 1, 0)


async def test_drain_waits_for_every_queue_and_what_it_set_off() -> None:
    provider = HeldProvider()
    slow = QueuedRecorder("slow")
    slow.gate.clear()
    kit, voice, device = await room(AIChannel("ai", provider), slow)
    await voice.say("r", "hello")
    drained = asyncio.create_task(kit.drain())
    await provider.asked_one.wait()
    assert not drained.done()
    provider.release.set()
    await until(lambda: "re: hello" in texts(device))
    assert not drained.done()  # "slow" still holds "hello" and the reply
    slow.gate.set()
    await drained
    assert slow.got == ["hello", "re: hello"]


async def test_a_text_channel_still_settles_so_the_reply_is_there_when_send_returns() -> None:
    provider = HeldProvider()
    provider.release.set()
    kit, _, device = await room(AIChannel("ai", provider))
    chat = TextChannel("chat")
    kit.register_channel(chat)
    await kit.attach_channel("r", "chat")
    await chat.send("alice", "hi", room_id="r")
    assert texts(chat) == ["re: hi"] and texts(device) == ["hi", "re: hi"]


# -------------------------------------------------------------- through the real `openai` client


class StallingChatServer:
    """`POST /v1/chat/completions`, answered (a `ChatCompletion` echoing the last user turn) only
    once `release` is set: a chat model that takes as long as the test says."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.received = threading.Event()
        self.requests: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                request = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))))
                server.requests.append(request)
                server.received.set()
                server.release.wait()
                last = request["messages"][-1]["content"]
                text = last if isinstance(last, str) else last[0]["text"]
                body = chat_completion(request["model"], f"re: {text}", len(server.requests))
                data = json.dumps(body).encode()
                try:
                    self.send_response(200)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:
                    pass  # the client gave up (the kit closed)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> StallingChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def stalling_server() -> Iterator[StallingChatServer]:
    with StallingChatServer() as server:
        yield server


async def stalled_room(server: StallingChatServer) -> tuple[RoomKit, VoiceTurns, TextChannel]:
    """A room with a chat model on `server`, which holds the room's first turn ("first")."""
    provider = OpenAIChatProvider("gpt-test", api_key="sk-test", base_url=server.base_url)
    kit, voice, device = await room(AIChannel("ai", provider, attribution=False))
    await voice.say("r", "first")
    assert await asyncio.to_thread(server.received.wait, 10)
    return kit, voice, device


async def test_voice_turns_are_not_held_by_a_stalled_chat_completions_server(
    stalling_server: StallingChatServer,
) -> None:
    kit, voice, device = await stalled_room(stalling_server)
    async with asyncio.timeout(10):  # the server holds "first": the turns still commit
        for text in ("second", "third"):
            await voice.say("r", text)
    assert texts(device) == ["first", "second", "third"]
    assert len(stalling_server.requests) == 1
    stalling_server.release.set()  # the model answers now, every turn in order
    await kit.drain()
    assert texts(device)[3:] == ["re: first", "re: second", "re: third"]
    await kit.close()


async def test_a_chat_completions_server_that_never_answers_holds_no_turn(
    stalling_server: StallingChatServer,
) -> None:
    kit, voice, device = await stalled_room(stalling_server)
    async with asyncio.timeout(10):
        for n in range(20):
            await voice.say("r", f"turn {n}")
    assert len(texts(device)) == 21
    assert kit.delivery_stats()["ai"].waiting == 20
    await kit.close()


async def test_the_room_hears_when_its_chat_model_fails_and_when_it_answers_again() -> None:
    """The chat model's service answers HTTP 503 (after the client's own retries): the room's
    `ON_AGENT_STATUS` observers hear once that the model is unavailable, with the status and
    never the service's words, however many calls fail; the next call that succeeds says it is
    back. The turns themselves were never held."""
    with ChatServer(["Back."], status=503) as server:
        provider = OpenAIChatProvider("gpt-test", api_key="sk-test", base_url=server.base_url,
                                      max_retries=0)  # fmt: skip
        kit, voice, device = await room(AIChannel("ai", provider, attribution=False))
        told: list[AgentStatus] = []
        kit.hooks.add(HookTrigger.ON_AGENT_STATUS, lambda status, ctx: told.append(status),
                      name="test-agent-status")  # fmt: skip
        for text in ("one", "two"):
            await voice.say("r", text)
            await kit.drain()
        assert told == [AgentStatus("ai", False, "the chat model failed, HTTP 503")]
        server.status = 200
        await voice.say("r", "three")
        await kit.drain()
        assert told[1:] == [AgentStatus("ai", True)]
        assert texts(device) == ["one", "two", "three", "Back."]
        await kit.close()
