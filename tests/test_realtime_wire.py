"""The typed OpenAI Realtime wire models, checked against the `openai` package's own GA types, and
bad input on both sides of the protocol (clear errors, nothing else lost)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types import realtime as sdk
from websockets.asyncio.client import connect

from realtime import ContextItem, OpenAIRealtimeSessionFactory, SessionError, SessionOptions
from realtime import openai_wire as wire
from realtime.openai_session import OpenAIRealtimeSession, session_config
from realtime.testing import OpenAIRealtimeServer, lines_sent

SDK_SERVER_TYPES: dict[str, Any] = {
    "session.created": sdk.SessionCreatedEvent,
    "session.updated": sdk.SessionUpdatedEvent,
    "conversation.item.added": sdk.ConversationItemAdded,
    "conversation.item.done": sdk.ConversationItemDone,
    "conversation.item.created": sdk.ConversationItemCreatedEvent,
    "input_audio_buffer.committed": sdk.InputAudioBufferCommittedEvent,
    "response.created": sdk.ResponseCreatedEvent,
    "response.done": sdk.ResponseDoneEvent,
    "response.output_audio.delta": sdk.ResponseAudioDeltaEvent,
    "response.output_audio.done": sdk.ResponseAudioDoneEvent,
    "response.output_audio_transcript.delta": sdk.ResponseAudioTranscriptDeltaEvent,
    "response.output_audio_transcript.done": sdk.ResponseAudioTranscriptDoneEvent,
    "conversation.item.truncated": sdk.ConversationItemTruncatedEvent,
    "error": sdk.RealtimeErrorEvent,
}
SDK_CLIENT_TYPES: dict[str, Any] = {
    "session.update": sdk.SessionUpdateEvent,
    "conversation.item.create": sdk.ConversationItemCreateEvent,
    "input_audio_buffer.append": sdk.InputAudioBufferAppendEvent,
    "input_audio_buffer.commit": sdk.InputAudioBufferCommitEvent,
    "response.create": sdk.ResponseCreateEvent,
    "response.cancel": sdk.ResponseCancelEvent,
    "conversation.item.truncate": sdk.ConversationItemTruncateEvent,
}


def test_R1_client_events_validate_as_the_sdk_types() -> None:
    options = SessionOptions(instructions="Be brief.", audio_input=True, voice="marin")
    events = [
        wire.SessionUpdate(session=session_config(options)),
        wire.ConversationItemCreate(item=wire.user_text_item('Speaker A: "hi"')),
        wire.ConversationItemCreate(item=wire.system_text_item("Meeting starts.")),
        wire.ConversationItemCreate(item=wire.assistant_text_item("Hello.")),
        wire.InputAudioBufferAppend(audio="AAAA"),
        wire.InputAudioBufferCommit(),
        wire.ResponseCreate(),
        wire.ResponseCancel(),
        wire.ConversationItemTruncate(item_id="item_1", audio_end_ms=1500),
    ]
    for event in events:
        data = wire.client_event_wire(event)
        parsed = SDK_CLIENT_TYPES[data["type"]].model_validate(data)
        assert parsed.type == data["type"]
        assert wire.parse_client_event(data) == event
    update = wire.client_event_wire(events[0])
    assert update["session"]["audio"]["input"]["turn_detection"] is None  # null on the wire


async def test_R1_local_server_events_validate_as_the_sdk_types() -> None:
    async with OpenAIRealtimeServer() as server:
        url = server.base_url.replace("http", "ws") + "/realtime?model=gpt-realtime"
        seen: list[dict[str, Any]] = []
        async with connect(url) as ws:
            for event in (
                wire.SessionUpdate(session=session_config(SessionOptions(audio_input=True))),
                wire.ConversationItemCreate(item=wire.user_text_item("hi")),
                wire.InputAudioBufferAppend(audio="AAAAAAAA"),
                wire.InputAudioBufferCommit(),
                wire.ResponseCreate(),
                wire.ResponseCreate(),
            ):
                await ws.send(json.dumps(wire.client_event_wire(event)))
            while not seen or seen[-1]["type"] != "response.done":
                seen.append(json.loads(await ws.recv()))
            item = next(d["item_id"] for d in seen if d["type"] == "response.output_audio.delta")
            truncate = wire.ConversationItemTruncate(item_id=item, audio_end_ms=50)
            await ws.send(json.dumps(wire.client_event_wire(truncate)))
            seen.append(json.loads(await ws.recv()))
        for data in seen:
            SDK_SERVER_TYPES[data["type"]].model_validate(data)
            assert wire.parse_server_event(json.dumps(data)) is not None
        assert {d["type"] for d in seen} >= {
            "session.created",
            "session.updated",
            "conversation.item.added",
            "conversation.item.done",
            "input_audio_buffer.committed",
            "response.created",
            "response.output_audio.delta",
            "response.output_audio_transcript.delta",
            "response.output_audio_transcript.done",
            "response.done",
            "conversation.item.truncated",
            "error",
        }


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        ("not json", "not valid JSON"),
        ('{"type": "session.nope"}', "unsupported client event type 'session.nope'"),
        ('{"type": "conversation.item.create", "item": {"type": "message"}}', "malformed"),
        ('{"type": "input_audio_buffer.append", "audio": "###"}', "Invalid base64"),
    ],
)
async def test_malformed_client_event_gets_error_and_connection_survives(
    raw: str, reason: str
) -> None:
    async with OpenAIRealtimeServer() as server:
        url = server.base_url.replace("http", "ws") + "/realtime?model=m"
        async with connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            await ws.send(raw)
            error = json.loads(await ws.recv())
            assert error["type"] == "error" and reason in error["error"]["message"]
            await ws.send(
                json.dumps(
                    wire.client_event_wire(
                        wire.ConversationItemCreate(item=wire.user_text_item("still here"))
                    )
                )
            )
            assert json.loads(await ws.recv())["type"] == "conversation.item.added"
        assert lines_sent(server) == ["still here"]


async def test_malformed_server_event_is_reported_and_the_session_carries_on() -> None:
    async with OpenAIRealtimeServer() as server:
        session = OpenAIRealtimeSessionFactory(api_key="k", base_url=server.base_url)(
            SessionOptions()
        )
        assert isinstance(session, OpenAIRealtimeSession)
        errors: list[SessionError] = []
        session.add_listener(lambda e: errors.append(e) if isinstance(e, SessionError) else None)
        async with session:
            await server.wait_for(lambda s: len(s.connections) == 1)
            await server.send_raw("{{ not json")
            await server.send_raw('{"type": "response.done", "event_id": 3}')
            await server.send_raw(
                '{"type": "rate_limits.updated", "event_id": "e", "rate_limits": []}'
            )
            await session.add_item(ContextItem("user", "after the noise"))
            await session.request_response()
            await session.wait_idle()
        assert [e.code for e in errors] == ["malformed_server_event", "malformed_server_event"]
        assert lines_sent(server) == ["after the noise"]
        assert len(server.connections) == 1
