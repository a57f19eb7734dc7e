"""Teams and WhatsApp webhooks through `chorus serve` over real HTTP: configured from the
`[teams]` / `[whatsapp]` sections, the conversation's room is a live room with the server's chat
model, and the model's reply goes back through the provider's API (a local server speaking it,
the Bot Framework connector token fetched by the client-credentials grant)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_openai_chat import ChatServer

from server.auth import Grant, issue_token
from server.ingress.testing import LocalProviderServer
from server.ingress.whatsapp import signature_of
from server.testing.harness import SECRET as HARNESS_SECRET
from server.testing.harness import RunningServer, eventually, local_deepgram_stt, running_server

DATA = Path(__file__).resolve().parent / "data" / "ingress"
APP_ID = "00000000-0000-4000-8000-0000000000b0"
SECRET = "made-up-app-secret"
NO_STT = local_deepgram_stt("ws://127.0.0.1:9")  # no stream is opened in these tests


@dataclass
class Served:
    server: RunningServer
    provider: LocalProviderServer
    model: ChatServer
    http: httpx.AsyncClient


@pytest.fixture
def model() -> Iterator[ChatServer]:
    with ChatServer(["Noted."] * 10) as server:
        yield server


@pytest.fixture
async def served(model: ChatServer) -> AsyncIterator[Served]:
    async with LocalProviderServer() as provider:
        config: dict[str, Any] = {
            "stt": NO_STT,
            "diarizer": {"kind": "none"},
            "realtime": {"provider": "none"},
            # the model answers every line here ("policy", the default: tests/test_chat_policy.py)
            "chat": {"provider": "openai", "base_url": model.base_url, "api_key": "t",
                     "answer": "always"},
            "teams": {
                "enabled": True,
                "app_id": APP_ID,
                "app_password": "made-up-password",
                "token_url": f"{provider.url}/oauth2/token",
                "jwks_url": f"{provider.url}/keys",
            },
            "whatsapp": {
                "enabled": True,
                "app_secret": SECRET,
                "verify_token": "made-up-verify",
                "access_token": "made-up-access-token",
                "graph_url": f"{provider.url}/graph",
            },
        }
        async with (
            running_server(config) as server,
            httpx.AsyncClient(base_url=server.http_base, timeout=30) as http,
        ):
            yield Served(server, provider, model, http)


def teams_activity(provider: LocalProviderServer) -> bytes:
    activity = json.loads((DATA / "teams_channel_message.json").read_text())
    activity["serviceUrl"] = provider.url
    return json.dumps(activity).encode()


async def test_teams_webhook_over_http_reaches_the_chat_model_and_replies(served: Served) -> None:
    p = served.provider
    answer = await served.http.post(
        "/v1/webhooks/teams",
        content=teams_activity(p),
        headers={
            "Authorization": f"Bearer {p.bot_token(APP_ID, service_url=p.url)}",
            "Content-Type": "application/json",
        },
    )
    assert (answer.status_code, answer.json()) == (200, {"accepted": 1})
    assert served.model.requests[-1]["messages"][-1] == {
        "role": "user",
        "content": "Tuesday works for me.",
    }
    await eventually(lambda: len(p.received) == 1, 60, "the reply at the connector")
    [sent] = p.received
    assert sent.target == "19:madeupchannelid0000@thread.tacv2;messageid=1734000000000"
    assert sent.authorization == "Bearer connector-token-1"
    assert sent.body["text"] == "Noted."
    assert p.token_requests == [
        {
            "grant_type": "client_credentials",
            "client_id": APP_ID,
            "client_secret": "made-up-password",
            "scope": "https://api.botframework.com/.default",
        }
    ]
    # the conversation's room is a live room of the server
    [room] = [r for r in served.server.server.rooms.rooms if r.startswith("teams-")]
    events = await served.server.server.rooms.kit.list_events(room)
    assert [e.text for e in events] == ["Tuesday works for me.", "Noted."]


async def test_teams_webhook_without_a_valid_token_is_401_problem(served: Served) -> None:
    answer = await served.http.post("/v1/webhooks/teams", content=teams_activity(served.provider))
    assert answer.status_code == 401
    assert answer.json()["problem"] == "bad_signature"
    assert served.server.server.rooms.rooms == {} and served.model.requests == []


async def test_whatsapp_webhook_over_http_checks_the_signature(served: Served) -> None:
    body = (DATA / "whatsapp_group_messages.json").read_bytes()
    bad = await served.http.post(
        "/v1/webhooks/whatsapp", content=body, headers={"X-Hub-Signature-256": "sha256=00"}
    )
    assert (bad.status_code, bad.json()["problem"]) == (401, "bad_signature")
    assert served.server.server.rooms.rooms == {}
    malformed = b'{"object": "whatsapp_business_account"}'
    answer = await served.http.post(
        "/v1/webhooks/whatsapp",
        content=malformed,
        headers={"X-Hub-Signature-256": signature_of(SECRET, malformed)},
    )
    assert (answer.status_code, answer.json()["problem"]) == (400, "bad_request")
    good = await served.http.post(
        "/v1/webhooks/whatsapp",
        content=body,
        headers={"X-Hub-Signature-256": signature_of(SECRET, body)},
    )
    assert (good.status_code, good.json()) == (200, {"accepted": 2})
    users = [m["content"] for m in served.model.requests[-1]["messages"] if m["role"] == "user"]
    assert users[0] == 'Alice: "Tuesday works for me."'
    assert users[1].startswith('Bob: "Alice: I would rather ship Thursday."')
    await eventually(lambda: len(served.provider.received) == 2, 60, "two replies to the group")
    assert {r.body["to"] for r in served.provider.received} == {"120363025246125486"}
    # the group's lines are the room's transcript, typed, without the model's replies (issue 24.3)
    [room] = [r for r in served.server.server.rooms.rooms if r.startswith("whatsapp-")]
    token = issue_token(HARNESS_SECRET, room, grants=[Grant.FEED])
    transcript = await served.http.get(f"/v1/rooms/{room}/transcript?token={token}")
    assert [(t["speaker"], t["kind"]) for t in transcript.json()] == [
        ("Alice", "typed"), ("Bob", "typed")]


async def test_whatsapp_webhook_retries_over_http_are_200_and_commit_once(served: Served) -> None:
    """Issue 25.10: five copies of one signed body (two posted at once) through `chorus serve`:
    each is answered 200, the room holds its two messages once, the model is asked twice."""
    body = (DATA / "whatsapp_group_messages.json").read_bytes()
    signed = {"X-Hub-Signature-256": signature_of(SECRET, body)}

    async def post() -> tuple[int, Any]:
        answer = await served.http.post("/v1/webhooks/whatsapp", content=body, headers=signed)
        return answer.status_code, answer.json()

    answers = [await post(), await post(), *await asyncio.gather(post(), post(), post())]
    assert answers == [(200, {"accepted": 2}), *[(200, {"accepted": 0})] * 4]
    await eventually(lambda: len(served.provider.received) >= 2, 60, "two replies to the group")
    [room] = [r for r in served.server.server.rooms.rooms if r.startswith("whatsapp-")]
    events = await served.server.server.rooms.kit.list_events(room)
    assert [e.text for e in events] == [
        "Tuesday works for me.", "Noted.", "Alice: I would rather ship Thursday.", "Noted."
    ]
    assert len(served.model.requests) == 2 and len(served.provider.received) == 2


async def test_whatsapp_subscription_handshake_over_http(served: Served) -> None:
    query = {"hub.mode": "subscribe", "hub.verify_token": "made-up-verify", "hub.challenge": "42"}
    ok = await served.http.get("/v1/webhooks/whatsapp", params=query)
    assert (ok.status_code, ok.text) == (200, "42")
    refused = await served.http.get(
        "/v1/webhooks/whatsapp", params={**query, "hub.verify_token": "wrong"}
    )
    assert refused.status_code == 403


async def test_webhooks_not_configured_are_404() -> None:
    async with (
        running_server({"stt": NO_STT, "diarizer": {"kind": "none"}}) as server,
        httpx.AsyncClient(base_url=server.http_base, timeout=30) as http,
    ):
        for path in ("/v1/webhooks/teams", "/v1/webhooks/whatsapp"):
            answer = await http.post(path, content=b"{}")
            assert (answer.status_code, answer.json()["problem"]) == (404, "not_configured")
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/webhooks/teams", "/v1/webhooks/whatsapp", "/v1/rooms/{room}/messages"} <= set(
            spec["paths"]
        )


def test_teams_config_needs_an_app_id_unless_behind_a_gateway() -> None:
    from server.config import ServerConfig

    with pytest.raises(ValueError, match=r"teams\.app_id"):
        ServerConfig.model_validate({"teams": {"enabled": True}})
    ServerConfig.model_validate({"teams": {"enabled": True, "trust_gateway": True}})
    with pytest.raises(ValueError, match=r"whatsapp\.app_secret"):
        ServerConfig.model_validate({"whatsapp": {"enabled": True}})


async def test_webhook_bodies_over_a_mebibyte_are_413_and_change_nothing(served: Served) -> None:
    body = b'{"object": "whatsapp_business_account", "entry": [], "pad": "' + b"x" * 1_100_000 + b'"}'
    signed = {"X-Hub-Signature-256": signature_of(SECRET, body)}
    answer = await served.http.post("/v1/webhooks/whatsapp", content=body, headers=signed)
    assert (answer.status_code, answer.json()["problem"]) == (413, "body_too_large")

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: counted while read
        for i in range(0, len(body), 65536):
            yield body[i : i + 65536]

    answer = await served.http.post("/v1/webhooks/whatsapp", content=chunked(), headers=signed)
    assert (answer.status_code, answer.json()["problem"]) == (413, "body_too_large")
    assert served.server.server.rooms.rooms == {}
