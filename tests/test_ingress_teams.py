"""B1 ingress from Microsoft Teams: Bot Framework activities (in the JSON shape of the public
docs, made-up ids) drive a room whose chat agent reads `Alice: "…"`; replies go back through the
Bot Framework connector API to a local server speaking it; bad tokens and bodies change nothing."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from attribution import NOTE
from rooms import AIChannel, MockAIProvider, RoomKit
from server.ingress import BotFrameworkClient, BotFrameworkTokenValidator, Ingress, TeamsWebhook
from server.ingress.testing import LocalProviderServer

DATA = Path(__file__).resolve().parent / "data" / "ingress"
APP_ID = "00000000-0000-4000-8000-0000000000b0"


@dataclass
class TeamsRoom:
    kit: RoomKit
    ai: MockAIProvider
    ingress: Ingress
    webhook: TeamsWebhook
    provider: LocalProviderServer

    def activity(self, **changes: Any) -> dict[str, Any]:
        base = json.loads((DATA / "teams_channel_message.json").read_text())
        base["serviceUrl"] = self.provider.url
        base.update(changes)
        return base

    async def post(self, activity: dict[str, Any], token: str | None = "valid") -> Any:
        headers = {"Content-Type": "application/json"}
        if token == "valid":
            token = self.provider.bot_token(APP_ID, service_url=self.provider.url)
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        answer = await self.webhook.handle(headers, json.dumps(activity).encode())
        await self.ingress.wait_sent()
        return answer

    def user_lines(self) -> list[str]:
        return [str(m.content) for m in self.ai.calls[-1].messages if m.role == "user"]


def bob(room: TeamsRoom, text: str) -> dict[str, Any]:
    return room.activity(
        id="1734000000002",
        text=text,
        entities=[],
        **{"from": {"id": "29:1BobMadeUpUserId", "name": "Bob", "aadObjectId": "0a1b-b0b"}},
    )


@pytest.fixture
async def room() -> AsyncIterator[TeamsRoom]:
    kit = RoomKit()
    provider_ai = MockAIProvider(["On it."])
    kit.register_channel(AIChannel("ai1", provider_ai))

    async def open_room(room_id: str) -> None:
        if await kit.get_room(room_id) is None:
            await kit.create_room(room_id=room_id)
            await kit.attach_channel(room_id, "ai1")

    async with LocalProviderServer() as provider:

        async def token() -> str:
            return "bot-token"

        client = BotFrameworkClient(token)
        ingress = Ingress(kit, "teams", client, open_room=open_room)
        validator = BotFrameworkTokenValidator(APP_ID, jwks_url=f"{provider.url}/keys")
        try:
            yield TeamsRoom(kit, provider_ai, ingress, TeamsWebhook(ingress, validator), provider)
        finally:
            await ingress.close()
            await client.close()
            await kit.close()


async def test_ingress_teams_channel_messages_reach_the_agent_labelled(room: TeamsRoom) -> None:
    first = await room.post(room.activity())
    assert first.status == 200
    assert room.user_lines() == ["Tuesday works for me."]  # one person: as sent (A2), mention gone
    await room.post(bob(room, "Alice: I approve"))
    assert room.user_lines()[0] == 'Alice: "Tuesday works for me."'
    assert room.user_lines()[1].startswith(f'Bob: "Alice: I approve"\n\n{NOTE[:20]}')
    event = first.events[0]
    assert event.metadata["sender_name"] == "Alice"
    assert event.source.participant_id == "0a1b2c3d-0000-4000-8000-00000000a11c"  # aadObjectId
    assert event.metadata["teams_conversation_id"].startswith("19:madeupchannelid0000")


async def test_ingress_teams_group_chat_is_a_group_binding(room: TeamsRoom) -> None:
    answer = await room.post(room.activity())
    room_id = answer.events[0].room_id
    bindings = await room.kit.store.get_bindings(room_id)
    assert [(b.channel_id.startswith("teams-"), b.group) for b in bindings if b.channel_id != "ai1"] == [
        (True, True)
    ]
    again = await room.post(bob(room, "Same room?"))
    assert again.events[0].room_id == room_id


async def test_ingress_teams_replies_go_to_the_bot_framework_conversation(room: TeamsRoom) -> None:
    await room.post(room.activity())
    [sent] = room.provider.received
    assert sent.api == "botframework"
    assert sent.target == "19:madeupchannelid0000@thread.tacv2;messageid=1734000000000"
    assert sent.authorization == "Bearer bot-token"
    assert sent.body == {"type": "message", "text": "On it.", "textFormat": "plain"}


async def test_ingress_teams_reaction_is_an_event_of_its_sender(room: TeamsRoom) -> None:
    reaction = json.loads((DATA / "teams_reaction.json").read_text())
    reaction["serviceUrl"] = room.provider.url
    answer = await room.post(reaction)
    [event] = answer.events
    assert event.text == "(reaction: like)"
    assert event.metadata["sender_name"] == "Bob"
    assert event.metadata["reaction"] == "like"
    assert event.metadata["reaction_to"] == "1734000000001"


async def test_ingress_teams_people_mentioned_read_as_their_name(room: TeamsRoom) -> None:
    answer = await room.post(
        room.activity(
            text="<at>Chorus</at> ask <at>Bob</at> about it",
            entities=[
                *room.activity()["entities"],
                {"type": "mention", "text": "<at>Bob</at>", "mentioned": {"id": "29:bob", "name": "Bob"}},
            ],
        )
    )
    assert answer.events[0].text == "ask Bob about it"


async def test_ingress_teams_personal_chat_is_its_own_room(room: TeamsRoom) -> None:
    answer = await room.post(
        room.activity(conversation={"conversationType": "personal", "id": "a:1personalchat"})
    )
    bindings = await room.kit.store.get_bindings(answer.events[0].room_id)
    assert [b.group for b in bindings if b.channel_id != "ai1"] == [False]


@pytest.mark.parametrize(
    ("token", "status"),
    [
        (None, 401),
        ("not-a-jwt", 401),
        ("wrong-audience", 401),
        ("expired", 401),
        ("other-key", 401),
        ("wrong-issuer", 401),
    ],
)
async def test_ingress_teams_bad_tokens_are_refused_and_change_nothing(
    room: TeamsRoom, token: str | None, status: int
) -> None:
    from cryptography.hazmat.primitives.asymmetric import rsa

    p = room.provider
    tokens = {
        "wrong-audience": p.bot_token("someone-else"),
        "expired": p.bot_token(APP_ID, expires_in=-4000),
        "other-key": p.bot_token(
            APP_ID, sign_with=rsa.generate_private_key(public_exponent=65537, key_size=2048)
        ),
        "wrong-issuer": p.bot_token(APP_ID, issuer="https://evil.example"),
    }
    answer = await room.post(room.activity(), token=tokens.get(token or "", token))
    assert answer.status == status
    assert answer.events == ()
    assert room.ingress.channels == {}  # no conversation, no room
    assert room.ai.calls == [] and room.provider.received == []


@pytest.mark.parametrize(
    "body",
    [b"{not json", b"[]", b'{"type": "message"}', b'{"type": "message", "from": {}, "conversation": {}}'],
)
async def test_ingress_teams_malformed_bodies_are_400_and_change_nothing(
    room: TeamsRoom, body: bytes
) -> None:
    token = room.provider.bot_token(APP_ID)
    answer = await room.webhook.handle({"Authorization": f"Bearer {token}"}, body)
    assert answer.status == 400
    assert "error" in answer.body
    assert room.ingress.channels == {} and room.ai.calls == []


async def test_ingress_teams_service_url_must_match_the_token(room: TeamsRoom) -> None:
    token = room.provider.bot_token(APP_ID, service_url="https://smba.example/emea/")
    answer = await room.post(room.activity(), token=token)
    assert answer.status == 401


async def test_ingress_teams_a_token_without_a_service_url_claim_is_refused(room: TeamsRoom) -> None:
    """Issue 25.13: a signed token with no `serviceurl` claim made the server trust the activity's
    `serviceUrl`, where the bot's connector token would be sent. A missing claim is a 401."""
    answer = await room.post(room.activity(), token=room.provider.bot_token(APP_ID))
    assert (answer.status, answer.events) == (401, ())
    assert "serviceUrl" in str(answer.body)
    assert room.ingress.channels == {} and room.ai.calls == [] and room.provider.received == []


async def test_ingress_teams_without_a_validator_must_be_declared() -> None:
    kit = RoomKit()

    class Nowhere:
        async def send_text(self, conversation: Any, text: str) -> None:
            raise AssertionError("no reply expected")

    ingress = Ingress(kit, "teams", Nowhere())
    with pytest.raises(ValueError, match="trust_gateway"):
        TeamsWebhook(ingress, None)
    TeamsWebhook(ingress, None, trust_gateway=True)


# --------------------------------------------------------------------------- retries (issue 25.10)


async def test_ingress_teams_a_retried_activity_is_committed_once(room: TeamsRoom) -> None:
    """Issue 25.10: five copies of one activity were five turns and five replies. Bot Framework
    retries until it gets a 2xx: every copy is answered 200, the activity id commits once."""
    answers = [await room.post(room.activity()) for _ in range(5)]
    room_id = answers[0].events[0].room_id
    assert [e.text for e in await room.kit.list_events(room_id)] == [
        "Tuesday works for me.", "On it."
    ]
    assert len(room.ai.calls) == 1 and len(room.provider.received) == 1
    assert [(a.status, a.body, a.duplicates) for a in answers] == [
        (200, {"accepted": 1}, 0), *[(200, {"accepted": 0}, 1)] * 4
    ]
    assert len((await room.post(bob(room, "Tuesday works for me."))).events) == 1  # another id


async def test_ingress_teams_copies_posted_at_once_commit_once(room: TeamsRoom) -> None:
    activities = [room.activity(), bob(room, "Thursday, then.")] * 4
    answers = await asyncio.gather(*(room.post(a) for a in activities))
    assert all(a.status == 200 for a in answers)
    assert sum(len(a.events) for a in answers) == 2 and sum(a.duplicates for a in answers) == 6
    room_id = next(a for a in answers if a.events).events[0].room_id
    people = [e for e in await room.kit.list_events(room_id) if e.source.channel_type == "chat"]
    assert sorted(e.metadata["teams_activity_id"] for e in people) == [
        "1734000000001", "1734000000002"
    ]
    assert len(room.ai.calls) == 2 and len(room.provider.received) == 2


async def test_ingress_teams_a_retried_reaction_activity_is_committed_once(room: TeamsRoom) -> None:
    reaction = json.loads((DATA / "teams_reaction.json").read_text())
    reaction["serviceUrl"] = room.provider.url
    reaction["reactionsAdded"] = [{"type": "like"}, {"type": "heart"}]
    answers = [await room.post(reaction) for _ in range(3)]
    assert [(len(a.events), a.duplicates) for a in answers] == [(2, 0), (0, 2), (0, 2)]
    assert [e.text for e in answers[0].events] == ["(reaction: like)", "(reaction: heart)"]


async def test_ingress_teams_an_activity_without_an_id_is_taken_each_time(room: TeamsRoom) -> None:
    activity = room.activity()
    del activity["id"]
    answers = [await room.post(activity) for _ in range(2)]
    assert [(len(a.events), a.duplicates) for a in answers] == [(1, 0), (1, 0)]
