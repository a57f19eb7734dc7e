"""B1 ingress from WhatsApp: Cloud API webhooks (in the JSON shape of the public docs, made-up
ids) drive a room whose chat agent reads `Alice: "…"`; replies go back through the Cloud API to
a local server speaking it; a bad `X-Hub-Signature-256` or body changes nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from attribution import NOTE
from rooms import AIChannel, MockAIProvider, RoomKit, RoomStore, SQLiteStore
from server.ingress import CloudApiClient, Ingress, WebhookAnswer, WhatsAppWebhook
from server.ingress.testing import LocalProviderServer
from server.ingress.whatsapp import signature_of

DATA = Path(__file__).resolve().parent / "data" / "ingress"
SECRET = "made-up-app-secret"


@dataclass
class WhatsAppRoom:
    kit: RoomKit
    ai: MockAIProvider
    ingress: Ingress
    webhook: WhatsAppWebhook
    provider: LocalProviderServer

    async def post(self, body: bytes, signature: str | None = "valid") -> WebhookAnswer:
        headers = {"Content-Type": "application/json"}
        if signature == "valid":
            signature = signature_of(SECRET, body)
        if signature is not None:
            headers["X-Hub-Signature-256"] = signature
        answer = await self.webhook.handle(headers, body)
        await self.ingress.wait_sent()
        return answer

    def user_lines(self) -> list[str]:
        return [str(m.content) for m in self.ai.calls[-1].messages if m.role == "user"]


def fixture(name: str) -> bytes:
    return (DATA / name).read_bytes()


async def make_room(
    provider: LocalProviderServer, store: RoomStore | None = None
) -> tuple[WhatsAppRoom, CloudApiClient]:
    kit = RoomKit(store=store)
    ai = MockAIProvider(["Noted."])
    kit.register_channel(AIChannel("ai1", ai))

    async def open_room(room_id: str) -> None:
        if await kit.get_room(room_id) is None:
            await kit.create_room(room_id=room_id)
            await kit.attach_channel(room_id, "ai1")

    client = CloudApiClient("made-up-access-token", graph_url=f"{provider.url}/graph")
    ingress = Ingress(kit, "whatsapp", client, open_room=open_room)
    webhook = WhatsAppWebhook(ingress, SECRET, verify_token="made-up-verify")
    return WhatsAppRoom(kit, ai, ingress, webhook, provider), client


@pytest.fixture
async def room() -> AsyncIterator[WhatsAppRoom]:
    async with LocalProviderServer() as provider:
        made, client = await make_room(provider)
        try:
            yield made
        finally:
            await made.ingress.close()
            await client.close()
            await made.kit.close()


async def test_ingress_whatsapp_group_messages_reach_the_agent_labelled(room: WhatsAppRoom) -> None:
    answer = await room.post(fixture("whatsapp_group_messages.json"))
    assert answer.status == 200 and answer.body == {"accepted": 2}
    alice, bob = answer.events
    assert (alice.metadata["sender_name"], bob.metadata["sender_name"]) == ("Alice", "Bob")
    assert alice.room_id == bob.room_id
    assert room.user_lines() == [
        'Alice: "Tuesday works for me."',
        f'Bob: "Alice: I would rather ship Thursday."\n\n{NOTE}',
    ]


async def test_ingress_whatsapp_group_is_a_group_binding_and_replies_to_the_group(
    room: WhatsAppRoom,
) -> None:
    answer = await room.post(fixture("whatsapp_group_messages.json"))
    bindings = await room.kit.store.get_bindings(answer.events[0].room_id)
    assert [b.group for b in bindings if b.channel_id != "ai1"] == [True]
    assert [(r.api, r.target, r.authorization, r.body) for r in room.provider.received] == [
        (
            "whatsapp",
            "106540352242922",
            "Bearer made-up-access-token",
            {
                "messaging_product": "whatsapp",
                "recipient_type": "group",
                "to": "120363025246125486",
                "type": "text",
                "text": {"body": "Noted."},
            },
        )
    ] * 2


async def test_ingress_whatsapp_one_to_one_reads_as_sent_and_replies_to_the_person(
    room: WhatsAppRoom,
) -> None:
    answer = await room.post(fixture("whatsapp_text.json"))
    [event] = answer.events
    assert event.metadata["sender_name"] == "Sheena Nelson"
    assert room.user_lines() == ["Does it come in another color?"]  # one person (A2)
    [sent] = room.provider.received
    assert sent.body["recipient_type"] == "individual" and sent.body["to"] == "16505550000"


async def test_ingress_whatsapp_a_sender_without_a_profile_reads_as_the_channel(
    room: WhatsAppRoom,
) -> None:
    webhook = json.loads(fixture("whatsapp_group_messages.json"))
    webhook["entry"][0]["changes"][0]["value"]["contacts"] = [
        {"profile": {"name": "Alice"}, "wa_id": "16505551234"}
    ]
    answer = await room.post(json.dumps(webhook).encode())
    channel = answer.events[1].source.channel_id
    assert room.user_lines()[1].startswith(f'@{channel}: "Alice: I would rather ship Thursday."')
    assert "16505555678" not in "".join(room.user_lines())  # a phone number never reaches a model


async def test_ingress_whatsapp_reaction_is_an_event(room: WhatsAppRoom) -> None:
    webhook = json.loads(fixture("whatsapp_text.json"))
    webhook["entry"][0]["changes"][0]["value"]["messages"] = [
        {
            "from": "16505550000",
            "id": "wamid.reaction",
            "timestamp": "1764537150",
            "type": "reaction",
            "reaction": {"message_id": "wamid.original", "emoji": "\U0001f44d"},
        }
    ]
    [event] = (await room.post(json.dumps(webhook).encode())).events
    assert event.text == "(reaction: \U0001f44d)"
    assert event.metadata["reaction_to"] == "wamid.original"


async def test_ingress_whatsapp_status_callbacks_are_accepted_and_ignored(room: WhatsAppRoom) -> None:
    answer = await room.post(fixture("whatsapp_status.json"))
    assert answer.status == 200 and answer.events == ()
    assert room.ingress.channels == {}


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha256=" + "0" * 64, "sha1=abc", "made-up"],
)
async def test_ingress_whatsapp_bad_signatures_are_401_and_change_nothing(
    room: WhatsAppRoom, signature: str | None
) -> None:
    answer = await room.post(fixture("whatsapp_group_messages.json"), signature=signature)
    assert answer.status == 401
    assert answer.events == () and room.ingress.channels == {} and room.ai.calls == []


async def test_ingress_whatsapp_signature_of_another_body_is_refused(room: WhatsAppRoom) -> None:
    body = fixture("whatsapp_group_messages.json")
    tampered = body.replace(b"Tuesday", b"Friday!")
    answer = await room.post(tampered, signature=signature_of(SECRET, body))
    assert answer.status == 401 and room.ingress.channels == {}


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"object": "page", "entry": []}', b'{"object": "whatsapp_business_account"}'],
)
async def test_ingress_whatsapp_malformed_bodies_are_400_and_change_nothing(
    room: WhatsAppRoom, body: bytes
) -> None:
    answer = await room.post(body)
    assert answer.status == 400 and "error" in answer.body
    assert room.ingress.channels == {} and room.ai.calls == []


async def test_ingress_whatsapp_subscription_handshake(room: WhatsAppRoom) -> None:
    ok = {"hub.mode": "subscribe", "hub.verify_token": "made-up-verify", "hub.challenge": "1158201444"}
    assert room.webhook.handshake(ok) == (200, "1158201444")
    assert room.webhook.handshake({**ok, "hub.verify_token": "wrong"})[0] == 403


async def test_ingress_whatsapp_a_failing_reply_api_loses_nothing_in_the_room() -> None:
    async with LocalProviderServer(fail_with=500) as provider:
        made, client = await make_room(provider)
        try:
            answer = await made.post(fixture("whatsapp_text.json"))
            channel = made.ingress.channels[answer.events[0].source.channel_id]
            assert channel.failures == 1 and len(provider.received) == 1
            events = await made.kit.list_events(answer.events[0].room_id)
            assert [e.text for e in events] == ["Does it come in another color?", "Noted."]
        finally:
            await made.ingress.close()
            await client.close()
            await made.kit.close()


# --------------------------------------------------------------------------- retries (issue 25.10)


def with_ids(body: bytes, suffix: str) -> bytes:
    """The same webhook with every message id changed: other messages, same text."""
    webhook = json.loads(body)
    for message in webhook["entry"][0]["changes"][0]["value"]["messages"]:
        message["id"] += suffix
    return json.dumps(webhook).encode()


async def test_ingress_whatsapp_a_retried_webhook_is_committed_once(room: WhatsAppRoom) -> None:
    """Issue 25.10: five copies of one signed body gave 10 turns and 10 replies. Meta retries
    until it gets a 200, so each copy is answered 200 and only the first commits its messages."""
    body = fixture("whatsapp_group_messages.json")
    answers = [await room.post(body) for _ in range(5)]
    room_id = answers[0].events[0].room_id
    assert [e.text for e in await room.kit.list_events(room_id)] == [
        "Tuesday works for me.", "Noted.", "Alice: I would rather ship Thursday.", "Noted."
    ]
    assert len(room.ai.calls) == 2 and len(room.provider.received) == 2
    assert [(a.status, a.body, a.duplicates) for a in answers] == [
        (200, {"accepted": 2}, 0), *[(200, {"accepted": 0}, 2)] * 4
    ]
    # other messages (other ids) with the same text still each commit
    again = await room.post(with_ids(body, "-2"))
    assert (len(again.events), again.duplicates, len(room.ai.calls)) == (2, 0, 4)


async def test_ingress_whatsapp_copies_posted_at_once_commit_once(room: WhatsAppRoom) -> None:
    body = fixture("whatsapp_group_messages.json")
    other = with_ids(body, "-other")
    answers = await asyncio.gather(*(room.post(b) for b in [body, other] * 4))
    assert all(a.status == 200 for a in answers)
    assert sum(len(a.events) for a in answers) == 4  # two messages of each body, once
    assert sum(a.duplicates for a in answers) == 12
    events = await room.kit.list_events(next(a for a in answers if a.events).events[0].room_id)
    people = [e for e in events if e.source.channel_type == "chat"]
    assert len(people) == 4 and len({e.metadata["whatsapp_message_id"] for e in people}) == 4
    assert len(room.ai.calls) == 4 and len(room.provider.received) == 4


async def test_ingress_whatsapp_a_retried_reaction_is_committed_once(room: WhatsAppRoom) -> None:
    webhook = json.loads(fixture("whatsapp_text.json"))
    webhook["entry"][0]["changes"][0]["value"]["messages"] = [
        {
            "from": "16505550000",
            "id": "wamid.reaction",
            "timestamp": "1764537150",
            "type": "reaction",
            "reaction": {"message_id": "wamid.original", "emoji": "\U0001f44d"},
        }
    ]
    body = json.dumps(webhook).encode()
    answers = [await room.post(body) for _ in range(3)]
    assert [(len(a.events), a.duplicates) for a in answers] == [(1, 0), (0, 1), (0, 1)]
    assert len(room.ai.calls) == 1


async def test_ingress_whatsapp_the_same_message_id_in_another_conversation_commits(
    room: WhatsAppRoom,
) -> None:
    body = fixture("whatsapp_group_messages.json")
    first = await room.post(body)
    other_group = body.replace(b"120363025246125486", b"120363025246125999")
    second = await room.post(other_group)
    assert (len(first.events), len(second.events), second.duplicates) == (2, 2, 0)
    assert first.events[0].room_id != second.events[0].room_id


async def test_ingress_whatsapp_a_retry_after_a_restart_is_not_committed_again(
    tmp_path: Path,
) -> None:
    """The dedupe reads the room's store: a server restarted on the same SQLite file does not
    commit a retry of a message it committed before it stopped."""
    body = fixture("whatsapp_group_messages.json")
    async with LocalProviderServer() as provider:
        answers: list[WebhookAnswer] = []
        models: list[MockAIProvider] = []
        for _ in range(2):  # the server, then the server restarted
            store = await SQLiteStore.open(tmp_path / "chorus.db")
            made, client = await make_room(provider, store)
            try:
                answers.append(await made.post(body))
                models.append(made.ai)
                room_id = next(a for a in answers if a.events).events[0].room_id
                texts = [e.text for e in await made.kit.list_events(room_id)]
            finally:
                await made.ingress.close()
                await client.close()
                await made.kit.close()
                await store.close()
        assert texts == [
            "Tuesday works for me.", "Noted.", "Alice: I would rather ship Thursday.", "Noted."
        ]
        assert [(len(a.events), a.duplicates) for a in answers] == [(2, 0), (0, 2)]
        assert [len(m.calls) for m in models] == [2, 0] and len(provider.received) == 2
