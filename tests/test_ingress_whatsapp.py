"""B1 ingress from WhatsApp: Cloud API webhooks (in the JSON shape of the public docs, made-up
ids) drive a room whose chat agent reads `Alice: "…"`; replies go back through the Cloud API to
a local server speaking it; a bad `X-Hub-Signature-256` or body changes nothing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from attribution import NOTE
from rooms import AIChannel, MockAIProvider, RoomKit
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


async def make_room(provider: LocalProviderServer) -> tuple[WhatsAppRoom, CloudApiClient]:
    kit = RoomKit()
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
