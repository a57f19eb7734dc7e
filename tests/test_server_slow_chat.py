"""A slow chat model never holds back speech in `chorus serve` (issue 24.1).

Real pieces: the server's sockets, the shared-mic voice channel with STT speaker labels from the
local Deepgram-protocol server (the demo meeting's words), and the chat model's `AIChannel` on the
`openai` client against a local Chat Completions server that answers only when the test says.
While it holds its first request, every spoken turn still reaches the device and the feed, and
`/metrics` shows what waits for the model; once it answers, it answers every turn, in order.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_rooms_delivery import StallingChatServer

from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import ReplyMessage, StartMessage, TurnMessage
from server.testing.harness import SECRET, RunningServer, eventually
from voice.audio import float_to_pcm16, read_audio_16k

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "standup"
SPOKEN_TURNS = 4
"""The turns of the demo meeting's first 15.9 s with the STT's speaker labels (A, B, C, A)."""


@pytest.fixture
def chat_model() -> Iterator[StallingChatServer]:
    with StallingChatServer() as server:
        yield server


@pytest.fixture
def server_config(chat_model: StallingChatServer) -> dict[str, Any]:
    return {
        "stt": {"diarize": True},
        "chat": {"provider": "openai", "base_url": chat_model.base_url, "api_key": "t",
                 "answer": "always"},
    }


def metric(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    raise AssertionError(f"no sample {name} {labels} in /metrics")


async def test_spoken_turns_reach_the_device_while_the_chat_model_holds_its_first_answer(
    server: RunningServer, chat_model: StallingChatServer, http: httpx.AsyncClient
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    device = await DeviceStream.open(
        server.base,
        ROOM,
        token,
        StartMessage(participant="room-4", name="Room 4", sample_rate=16000, shared_mic=True),
    )

    def turns(received: list[Any]) -> list[TurnMessage]:
        return [m for m in received if isinstance(m, TurnMessage)]

    audio = read_audio_16k(MEETING / "meeting.wav")[: int(15.9 * 16000)]
    await device.send_audio(float_to_pcm16(audio), chunk_s=0.5, realtime=False)
    # The model holds its first request and answers nothing; before issue 24.1 the voice
    # session's commit of the next turn waited for it, so only one turn ever arrived.
    await eventually(lambda: len(turns(device.received)) >= SPOKEN_TURNS, 60, "every spoken turn")
    await eventually(lambda: len(turns(feed.received)) >= SPOKEN_TURNS, 30, "the feed's turns")
    assert chat_model.received.is_set() and len(chat_model.requests) == 1
    assert not [m for m in device.received if isinstance(m, ReplyMessage)]

    scraped = (await http.get("/metrics")).text
    assert metric(scraped, "chorus_channel_deliveries_waiting", channel="chat-ai") == SPOKEN_TURNS - 1
    assert metric(scraped, "chorus_channel_deliveries_total", channel="chat-ai",
                  outcome="delivered") == 0

    chat_model.release.set()  # the model answers now: every turn, in the order spoken
    await eventually(
        lambda: len([m for m in device.received if isinstance(m, ReplyMessage)]) >= SPOKEN_TURNS,
        60,
        "the model's answers",
    )
    spoken = [m.text for m in turns(device.received)[:SPOKEN_TURNS]]
    asked = [str(r["messages"][-1]["content"]) for r in chat_model.requests]
    assert len(asked) == SPOKEN_TURNS
    assert all(text in line for text, line in zip(spoken, asked, strict=True)), (spoken, asked)
    replies = [m.text for m in device.received if isinstance(m, ReplyMessage)]
    assert replies == [f"re: {line}" for line in asked]
    scraped = (await http.get("/metrics")).text
    assert metric(scraped, "chorus_channel_deliveries_total", channel="chat-ai",
                  outcome="delivered") == SPOKEN_TURNS
    assert metric(scraped, "chorus_channel_deliveries_waiting", channel="chat-ai") == 0
    await device.stop()
    await feed.close()
