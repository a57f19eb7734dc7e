"""Chat in `chorus serve` (issue 12.5): people typing and people speaking are one labelled
conversation, in commit order, for the realtime session and for the chat model alike.

Real pieces: the server's sockets, the shared-mic voice channel with STT speaker labels from the
local Deepgram-protocol server (the demo meeting's words), the recorder realtime session, and an
`AIChannel` on the `openai` client against a local Chat Completions server. Typed messages come
through the event feed (`type: "message"`) and through `POST /v1/rooms/{room}/messages` over
real HTTP.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import ValidationError
from test_openai_chat import ChatServer

from attribution import NOTE
from realtime import RealtimeChannel
from server.auth import Grant, issue_token
from server.chat import ChatRateLimit, retry_after
from server.client import DeviceStream, EventFeed, TwilioLeg
from server.protocol import CloseCode, StartMessage, parse_feed_request
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    running_server_with_local_stt,
)
from tests.conftest import Clock
from voice.audio import float_to_pcm16, read_audio_16k

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "standup"


def excerpt(start: float, end: float) -> np.ndarray[Any, Any]:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return audio[int(start * 16000) : int(end * 16000)]


@pytest.fixture
def chat_model() -> Iterator[ChatServer]:
    with ChatServer(["Noted."] * 40) as server:
        yield server


@pytest.fixture
def server_config(chat_model: ChatServer) -> dict[str, Any]:
    return {
        "stt": {"diarize": True},  # Speaker A, B, C (G2)
        "realtime": {"provider": "recorder"},
        "policy": {"answer_only": ["Dana"]},  # the realtime session stays quiet
        # the chat model answers every turn (`answer = "policy"`, the default, is tested apart)
        "chat": {"provider": "openai", "base_url": chat_model.base_url, "api_key": "t",
                 "answer": "always"},
    }


def realtime_lines(server: RunningServer) -> list[str]:
    channel = server.server.rooms.pipeline.realtime  # type: ignore[attr-defined]
    assert isinstance(channel, RealtimeChannel)
    return channel.lines_for(ROOM)


async def test_typed_and_spoken_turns_are_one_labelled_conversation(
    server: RunningServer, chat_model: ChatServer, http: httpx.AsyncClient
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    device = await DeviceStream.open(
        server.base,
        ROOM,
        token,
        StartMessage(participant="room-4", name="Room 4", sample_rate=16000, shared_mic=True),
    )

    def said() -> list[Any]:
        return [m for m in feed.received if m.type in ("turn", "message")]

    # Alice and Bob speak into the room's microphone (up to the pause before Carol).
    await device.send_audio(float_to_pcm16(excerpt(0.0, 9.25)), chunk_s=0.5, realtime=False)
    await eventually(lambda: len(said()) >= 2, 60, "two spoken turns")
    # Erin types in the meeting chat.
    await feed.message("u-erin", "I can review the notes tonight.", name="Erin")
    await eventually(lambda: len(said()) >= 3, 30, "the typed message on the feed")
    # Carol and Alice speak.
    await device.send_audio(float_to_pcm16(excerpt(9.25, 15.9)), chunk_s=0.5, realtime=False)
    await eventually(lambda: len(said()) >= 5, 60, "two more spoken turns")
    # Alice types through the HTTP endpoint.
    answer = await http.post(
        f"/v1/rooms/{ROOM}/messages",
        json={"participant": "u-alice", "name": "Alice", "text": "Thanks, Bob."},
        headers={"Authorization": f"Bearer {token}"},
    )
    assert answer.status_code == 201
    assert answer.json()["room"] == ROOM
    await eventually(lambda: len(said()) >= 6, 30, "the second typed message")
    await device.stop()
    await feed.close()

    people = [
        "Good morning everyone. Let's start the weekly release meeting.",
        'Speaker B: "Morning. The build is green and the installer is ready for testing."',
        'Erin: "I can review the notes tonight."',
        'Speaker C: "Great. I still need the release notes before I can sign off."',
        'Speaker A: "Bob, can you write the release notes today?"',
        'Alice: "Thanks, Bob."',
    ]
    # the feed shows the typed messages between the spoken turns, in commit order
    assert [(m.type, m.speaker) for m in said()] == [
        ("turn", "Speaker A"),
        ("turn", "Speaker B"),
        ("message", "Erin"),
        ("turn", "Speaker C"),
        ("turn", "Speaker A"),
        ("message", "Alice"),
    ]
    # the realtime session: every turn from another channel, one line each, in commit order (G3);
    # the chat model's replies (committed as it answers) are lines of `@chat-ai`
    lines = realtime_lines(server)
    assert [line.split("\n\n")[0] for line in lines if not line.startswith("@chat-ai")] == people
    assert [i for i, line in enumerate(lines) if NOTE in line] == [1]  # labelled from the 2nd on
    committed = [
        e for e in await server.server.rooms.kit.list_events(ROOM) if e.source.channel_id != "realtime"
    ]
    assert len(lines) == len(committed)
    assert all(json.dumps(e.text)[1:-1] in line for e, line in zip(committed, lines, strict=True))
    # the chat model: the same conversation, the same labels, its own replies as assistant turns
    last = chat_model.requests[-1]["messages"]
    assert [m["content"] for m in last if m["role"] == "user"] == [
        'Speaker A: "Good morning everyone. Let\'s start the weekly release meeting."',
        *people[1:-1],
        f'{people[-1]}\n\n{NOTE}',
    ]
    assert [m["content"] for m in last if m["role"] == "assistant"] == ["Noted."] * 5
    # the room's transcript is the whole meeting: spoken and typed lines in commit order, typed
    # ones marked and placed after the turn before them, the models' replies left out (24.3)
    spoken = [e for e in committed if e.metadata.get("source") == "voice"]
    got = (await http.get(f"/v1/rooms/{ROOM}/transcript",
                          headers={"Authorization": f"Bearer {token}"})).json()
    assert [(t["speaker"], t["kind"]) for t in got] == [
        ("Speaker A", "spoken"), ("Speaker B", "spoken"), ("Erin", "typed"),
        ("Speaker C", "spoken"), ("Speaker A", "spoken"), ("Alice", "typed")]
    assert got[2]["start"] == got[2]["end"] == round(spoken[1].metadata["end"], 3)
    text = (await http.get(f"/v1/rooms/{ROOM}/transcript?format=text",
                           headers={"Authorization": f"Bearer {token}"})).text
    assert 'Erin (typed): "I can review the notes tonight."' in text
    rttm = (await http.get(f"/v1/rooms/{ROOM}/transcript?format=rttm",
                           headers={"Authorization": f"Bearer {token}"})).text
    assert len(rttm.splitlines()) == 4  # speech only


async def test_chat_post_refuses_bad_tokens_and_bodies_and_changes_nothing(
    server: RunningServer, chat_model: ChatServer, http: httpx.AsyncClient
) -> None:
    rooms = server.server.rooms
    good = {"participant": "u-alice", "name": "Alice", "text": "Hi"}
    token = issue_token(SECRET, ROOM)
    cases: list[tuple[str | None, Any, int, str]] = [
        (None, good, 401, "token_missing"),
        ("not.a.jwt", good, 401, "token_malformed"),
        (issue_token(SECRET, "other-room"), good, 403, "token_wrong_room"),
        (issue_token(SECRET, ROOM, ttl_s=10, now=0), good, 401, "token_expired"),
        (issue_token(SECRET, ROOM, grants=[Grant.FEED]), good, 403, "token_not_granted"),
        (issue_token(SECRET, ROOM, participant="u-bob"), good, 403, "token_wrong_participant"),
        (token, {"participant": "u-alice"}, 422, "bad_request"),
        (token, {"participant": "has space", "text": "x"}, 422, "bad_request"),
        (token, {"participant": "u-a", "text": ""}, 422, "bad_request"),
        (token, {**good, "sender_name": "Bob"}, 422, "bad_request"),  # no stamping names
    ]
    for bearer, body, status, problem in cases:
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        answer = await http.post(f"/v1/rooms/{ROOM}/messages", json=body, headers=headers)
        assert (answer.status_code, answer.json()["problem"]) == (status, problem), body
    not_json = await http.post(
        f"/v1/rooms/{ROOM}/messages",
        content=b"{not json",
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert not_json.status_code == 422
    assert ROOM not in rooms.rooms or await rooms.kit.list_events(ROOM) == []
    assert chat_model.requests == []


async def test_a_chat_post_is_authorized_before_its_body_is_read_and_the_body_is_capped(
    server: RunningServer, chat_model: ChatServer, http: httpx.AsyncClient
) -> None:
    """Issue 25.1: a request without a token is refused 401 whatever its body (it used to be
    read and parsed first: 422, gigabytes buffered); with a token, a body over CHAT_MAX_BYTES is
    413 by its declared length or, streamed without one, as soon as it has sent too much."""
    from server.routes import CHAT_MAX_BYTES

    url = f"/v1/rooms/{ROOM}/messages"
    big = {"participant": "u-alice", "text": "x" * (2 * CHAT_MAX_BYTES)}
    answer = await http.post(url, json=big)
    assert (answer.status_code, answer.json()["problem"]) == (401, "token_missing")
    headers = {"Authorization": f"Bearer {issue_token(SECRET, ROOM)}"}
    answer = await http.post(url, json=big, headers=headers)
    assert (answer.status_code, answer.json()["problem"]) == (413, "body_too_large")

    sent = 0

    async def endless() -> AsyncIterator[bytes]:  # chunked: no content-length to refuse by
        nonlocal sent
        yield b'{"participant": "u-alice", "text": "'
        while sent < 100 * CHAT_MAX_BYTES:
            sent += 8192
            yield b"x" * 8192

    answer = await http.post(url, content=endless(), headers=headers)
    assert (answer.status_code, answer.json()["problem"]) == (413, "body_too_large")
    assert await server.server.rooms.kit.list_events(ROOM) == []
    # a message of the longest text allowed, in the widest escaping, still fits
    widest = json.dumps({"participant": "u-alice", "text": "\U0001f600" * 4000}).encode()
    assert len(widest) > 48_000  # each character sent as a surrogate pair of escapes
    answer = await http.post(url, content=widest, headers={
        **headers, "Content-Type": "application/json"})
    assert answer.status_code == 201, answer.text


async def test_feed_message_needs_the_chat_grant(server: RunningServer) -> None:
    token = issue_token(SECRET, ROOM, grants=[Grant.FEED])
    feed = await EventFeed.open(server.base, ROOM, token)
    await feed.message("u-erin", "Let me in.", name="Erin")
    await eventually(lambda: any(m.type == "error" for m in feed.received), 60, "the refusal")
    [error] = [m for m in feed.received if m.type == "error"]
    assert "chat grant" in error.reason
    assert await server.server.rooms.kit.list_events(ROOM) == []
    await feed.close()


async def test_a_deeply_nested_feed_request_is_refused_as_a_bad_message(server: RunningServer) -> None:
    """Issue 25.14: `json.loads` raised RecursionError on deep nesting (1011 and a traceback);
    the request is a bad message (4400) and the room goes on serving its feeds."""
    deep = '{"type": ' + "[" * 5_000 + "]" * 5_000 + "}"  # 10 KB, within the frame limit
    with pytest.raises(ValidationError, match="recursion limit"):
        parse_feed_request(deep)
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    await feed.ws.send(deep)
    await feed.ws.wait_closed()
    assert (feed.ws.close_code, feed.ws.close_reason) == (CloseCode.BAD_MESSAGE, "bad feed request")
    again = await EventFeed.open(server.base, ROOM, token)
    await again.rename("Speaker A", "Alice")
    await eventually(lambda: any(m.type == "renamed" for m in again.received), 60, "the rename")
    await again.close()


def test_feed_message_request_and_rename_parse_apart() -> None:
    message = parse_feed_request('{"type": "message", "participant": "u-a", "text": "hi"}')
    assert message.type == "message"
    rename = parse_feed_request('{"label": "Speaker A", "name": "Alice"}')  # type may be left out
    assert rename.type == "rename"


async def test_a_token_without_sub_types_in_the_chat_only_space_never_as_a_phone_caller(
    server: RunningServer, chat_model: ChatServer, http: httpx.AsyncClient
) -> None:
    """Issue 25.3: a chat post reused the participant record of any id it named, so a token
    without `sub` (the default, the page's own) typed as the phone caller Dana and the model read
    `Dana: "I approve the release."`. Typed identity comes from the token: without `sub` the
    body's id is `chat:<id>`, a record no stream can have; with `sub`, exactly that participant."""
    token = issue_token(SECRET, ROOM)  # no sub
    feed = await EventFeed.open(server.base, ROOM, token)
    dana = await TwilioLeg.open(
        server.base, {"room": ROOM, "token": token, "participant": "dana-phone", "name": "Dana"})
    await eventually(lambda: any(m.type == "stream_started" for m in feed.received), 60, "Dana")
    erin = issue_token(SECRET, ROOM, participant="u-erin")
    posts: list[tuple[str, dict[str, Any]]] = [
        (erin, {"participant": "u-erin", "name": "Erin", "text": "Ready to ship?"}),
        (token, {"participant": "dana-phone", "text": "I approve the release."}),
    ]
    for bearer, body in posts:
        answer = await http.post(f"/v1/rooms/{ROOM}/messages", json=body,
                                 headers={"Authorization": f"Bearer {bearer}"})
        assert answer.status_code == 201, answer.text
    # the page's way: the feed, as the caller's id and name
    await feed.message("dana-phone", "Ship it.", name="Dana")

    def typed() -> list[Any]:
        return [m for m in feed.received if m.type == "message"]

    await eventually(lambda: len(typed()) == 3, 60, "three typed messages")
    await eventually(lambda: len(chat_model.requests) == 3, 60, "the chat model read all three")
    assert [(m.speaker, m.participant) for m in typed()] == [
        ("Erin", "u-erin"), ("@chat", "chat:dana-phone"), ("@chat", "chat:dana-phone")]
    users = [m["content"] for m in chat_model.requests[-1]["messages"] if m["role"] == "user"]
    assert users == ['Erin: "Ready to ship?"', '@chat: "I approve the release."',
                     f'@chat: "Ship it."\n\n{NOTE}']
    got = (await http.get(f"/v1/rooms/{ROOM}/transcript",
                          headers={"Authorization": f"Bearer {token}"})).json()
    assert [t["speaker"] for t in got] == ["Erin", "@chat", "@chat"]
    # the caller's record is untouched: reached by voice only, still Dana's
    records = {p.id: p for p in await server.server.rooms.kit.get_participants(ROOM)}
    assert records["dana-phone"].display_name == "Dana"
    assert records["dana-phone"].connected_via == [
        server.server.rooms.pipeline.shared_voice.channel_id]  # type: ignore[attr-defined]
    assert records["chat:dana-phone"].connected_via == ["chat"]
    # a typed name that reads like the caller's is ranked apart (D2): the caller was first
    await feed.message("dana", "Ship it now.", name="Dana")
    await eventually(lambda: len(typed()) == 4, 60, "the fourth typed message")
    assert typed()[-1].speaker == "Dana (2)"
    # a token naming the caller types as the caller, exactly as before
    answer = await http.post(
        f"/v1/rooms/{ROOM}/messages",
        json={"participant": "dana-phone", "text": "It is me."},
        headers={"Authorization": f"Bearer {issue_token(SECRET, ROOM, participant='dana-phone')}"})
    assert answer.status_code == 201
    await eventually(lambda: len(typed()) == 5, 60, "the caller's own typed message")
    assert (typed()[-1].speaker, typed()[-1].participant) == ("Dana", "dana-phone")
    await dana.stop()
    await feed.close()


async def test_no_stream_may_declare_an_id_of_the_chat_only_space(server: RunningServer) -> None:
    """Issue 25.3: `chat:` ids are typed-only participants'; a device or a phone leg declaring
    one is refused (4400) before any audio is read, so no voice record ever has one."""
    token = issue_token(SECRET, ROOM)
    device = await DeviceStream.open(
        server.base, ROOM, token, StartMessage(participant="chat:u-erin", name="Erin"))
    async with asyncio.timeout(60):
        await device.ws.wait_closed()
    assert device.ws.close_code == CloseCode.BAD_MESSAGE
    assert "chat's own" in (device.ws.close_reason or "")
    leg = await TwilioLeg.open(server.base, {"room": ROOM, "token": token, "participant": "chat:x"})
    async with asyncio.timeout(60):
        await leg.ws.wait_closed()
    assert leg.ws.close_code == CloseCode.BAD_MESSAGE
    kit = server.server.rooms.kit
    assert await kit.get_room(ROOM) is None or await kit.get_participants(ROOM) == []


def test_chat_rate_limit_is_a_token_bucket_per_room_and_client() -> None:
    clock = Clock()
    limit = ChatRateLimit(burst=3, rate=0.5, clock=clock)
    assert [limit.take("r1", "addr:a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limit.take("r1", "addr:a") == pytest.approx(2.0)  # one message every 2 s
    assert limit.take("r1", "addr:b") == 0.0  # another client
    assert limit.take("r2", "addr:a") == 0.0  # another room
    clock.now += 1.0
    assert limit.take("r1", "addr:a") == pytest.approx(1.0)  # a refusal takes nothing
    clock.now += 1.0
    assert limit.take("r1", "addr:a") == 0.0
    assert limit.take("r1", "addr:a") == pytest.approx(2.0)
    assert retry_after(0.01) == 1 and retry_after(2.0) == 2 and retry_after(2.1) == 3
    with pytest.raises(ValueError):
        ChatRateLimit(burst=0, rate=1.0)
    with pytest.raises(ValueError):
        ChatRateLimit(burst=1, rate=0.0)


def test_chat_rate_limit_forgets_clients_whose_bucket_filled_up_again() -> None:
    clock = Clock()
    limit = ChatRateLimit(burst=2, rate=1.0, clock=clock)
    for n in range(ChatRateLimit.SWEEP_AT):
        limit.take("r", f"addr:{n}")
    assert len(limit) == ChatRateLimit.SWEEP_AT
    clock.now += 2.0  # every bucket is full again: nothing a fresh one would not hold
    limit.take("r", "addr:new")
    limit.take("r", "addr:new")
    assert len(limit) == 1
    assert limit.take("r", "addr:new") == pytest.approx(1.0)  # its own state was kept


async def test_chat_posts_over_the_rate_limit_are_refused_and_lose_nothing_else() -> None:
    """Issue 25.12: one client posted 80–240 messages a second, every one accepted. Now each
    client (the token's `sub`, else its address) has `limits.chat_burst` posts at once in a
    room, then `limits.chat_rate` a second: over it HTTP is 429 with `Retry-After`, the feed is
    refused with 4429; other clients, other rooms and the room's feed go on."""
    config = {"limits": {"chat_burst": 2, "chat_rate": 0.5}}
    async with (
        running_server_with_local_stt(config) as server,
        httpx.AsyncClient(base_url=server.http_base, timeout=30) as http,
    ):
        clock = Clock()
        rooms = server.server.rooms
        rooms.chat_limit.clock = clock
        token = issue_token(SECRET, ROOM)
        url = f"/v1/rooms/{ROOM}/messages"

        async def post(text: str, bearer: str = token, room: str = ROOM) -> httpx.Response:
            return await http.post(f"/v1/rooms/{room}/messages",
                                   json={"participant": "u-erin", "text": text},
                                   headers={"Authorization": f"Bearer {bearer}"})

        assert [(await post(t)).status_code for t in ("one", "two")] == [201, 201]
        refused = await post("three")
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "2"
        assert refused.json() == {
            "problem": "too_many_messages",
            "detail": "too many messages: 2 at once, then 0.5 a second; retry in 2 s"}
        # a refused request's body is not even read: a bad one is refused the same way
        bad = await http.post(url, content=b"{not json", headers={
            "Authorization": f"Bearer {token}", "Content-Type": "application/json"})
        assert bad.status_code == 429
        # another client (a token naming its participant), another room: their own buckets
        erin = issue_token(SECRET, ROOM, participant="u-erin")
        assert (await post("from Erin's own token", erin)).status_code == 201
        assert (await post("elsewhere", issue_token(SECRET, "other"), "other")).status_code == 201
        # the feed shares the client's bucket: a message over it ends that feed with 4429
        watcher = await EventFeed.open(server.base, ROOM, token)
        typist = await EventFeed.open(server.base, ROOM, token)
        await typist.message("u-erin", "four")
        async with asyncio.timeout(60):
            await typist.ws.wait_closed()
        assert typist.ws.close_code == CloseCode.TOO_MANY_STREAMS
        [error] = [m for m in typist.received if m.type == "error"]
        assert error.reason.startswith("too many messages")
        # nothing refused was committed; the room and its other feed go on
        texts = [e.text for e in await rooms.kit.list_events(ROOM)]
        assert texts == ["one", "two", "from Erin's own token"]
        clock.now += 2.0  # one message's worth of time later, the client may post again
        assert (await post("five")).status_code == 201
        await eventually(lambda: [m.text for m in watcher.received if m.type == "message"][-1:]
                         == ["five"], 60, "the next post on the other feed")
        metrics = (await http.get("/metrics")).text
        assert 'chorus_refused_total{reason="too_many_messages"} 1.0' in metrics
        await watcher.close()
