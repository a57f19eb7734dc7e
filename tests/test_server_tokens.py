"""Room tokens are JWTs (issue 13.2): minted by any JWT library, limited by grants, refused
clearly when old-format, non-ASCII or for another participant — over real sockets."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
import logging
import time

import jwt
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from server.auth import Grant, TokenError, TokenProblem, issue_token, verify_token
from server.client import DeviceStream, EventFeed, TwilioLeg, events_url, stream_url
from server.protocol import CloseCode, StartMessage, dump
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    tone,
)


@pytest.fixture
def stt_words() -> None:
    """The `server` fixture's STT says nothing: these tests are about who may connect."""
    return None


async def _closed_with(ws: ClientConnection) -> tuple[int, str]:
    async with asyncio.timeout(30):
        with contextlib.suppress(ConnectionClosed):
            async for _ in ws:
                pass
        await ws.wait_closed()
    assert ws.close_code is not None
    return ws.close_code, ws.close_reason or ""


def _old_v1_token(secret: str, room: str) -> str:
    """A token in the home-made format earlier servers issued."""

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    payload = json.dumps({"room": room, "iat": int(time.time()), "exp": int(time.time()) + 60})
    body = f"v1.{b64(payload.encode())}"
    sig = b64(hmac.new(secret.encode(), body.encode(), hashlib.sha256).digest())
    return f"{body}.{sig}"


async def test_a_token_minted_with_pyjwt_alone_streams(server: RunningServer) -> None:
    now = int(time.time())
    token = jwt.encode(
        {"room": "r1", "iat": now, "exp": now + 60, "sub": "dev-1", "grants": ["stream"]},
        SECRET,
        algorithm="HS256",
    )
    device = await DeviceStream.open(
        server.base, "r1", token, StartMessage(participant="dev-1", shared_mic=False)
    )
    await device.send_audio(tone(0.3), realtime=False)
    await eventually(lambda: server.audio_read() >= 0.3, 10, "audio read")
    async with asyncio.timeout(30):
        await device.stop()
    assert device.received[0].type == "started"
    assert device.ws.close_code == CloseCode.NORMAL


async def test_a_feed_only_token_reads_the_feed_but_cannot_stream(server: RunningServer) -> None:
    token = issue_token(SECRET, "r1", grants=[Grant.FEED])
    feed = await EventFeed.open(server.base, "r1", token)
    async with connect(stream_url(server.base, "r1", token)) as ws:
        with contextlib.suppress(ConnectionClosed):
            await ws.send(dump(StartMessage(participant="p")))
            await ws.send(tone(0.2))
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_INVALID, "token does not grant stream")
    leg = await TwilioLeg.open(server.base, {"room": "r1", "token": token})
    assert leg._reader is not None
    async with asyncio.timeout(30):
        await leg._reader
    assert leg.ws.close_code == CloseCode.TOKEN_INVALID
    assert server.audio_read() == 0.0
    assert feed.ws.close_code is None
    await feed.close()


async def test_a_stream_only_token_cannot_read_the_feed(server: RunningServer) -> None:
    token = issue_token(SECRET, "r1", grants=[Grant.STREAM])
    async with connect(events_url(server.base, "r1", token)) as ws:
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_INVALID, "token does not grant feed")


async def test_an_old_v1_token_is_refused_with_a_clear_message(server: RunningServer) -> None:
    async with connect(stream_url(server.base, "r1", _old_v1_token(SECRET, "r1"))) as ws:
        code, reason = await _closed_with(ws)
    assert code == CloseCode.TOKEN_INVALID
    assert "old-format" in reason and "chorus token" in reason


async def test_a_non_ascii_token_is_refused_with_4401(server: RunningServer) -> None:
    """Issue 10.6: it closed with 1011 and a traceback."""
    async with connect(stream_url(server.base, "r1", "tökén")) as ws:
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_MISSING, "token is not ASCII text")
    async with connect(events_url(server.base, "r1", "ключ")) as ws:
        assert (await _closed_with(ws))[0] == CloseCode.TOKEN_MISSING


async def test_a_token_for_one_participant_opens_no_stream_for_another(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, "r1", participant="alice")
    async with connect(stream_url(server.base, "r1", token)) as ws:
        await ws.send(dump(StartMessage(participant="mallory")))
        code, reason = await _closed_with(ws)
    assert (code, reason) == (CloseCode.TOKEN_INVALID, "token is for another participant")


async def test_a_token_in_the_authorization_header_is_read(server: RunningServer) -> None:
    token = issue_token(SECRET, "r1")
    async with connect(
        f"{server.base}/v1/rooms/r1/events", additional_headers={"Authorization": f"Bearer {token}"}
    ) as ws:
        await ws.send(json.dumps({"type": "rename", "label": "Speaker A", "name": "Ann"}))
        async with asyncio.timeout(30):
            while json.loads(await ws.recv())["type"] != "renamed":
                pass


# --- unit level: the claims -------------------------------------------------------------------


def test_claims_are_standard_jwt_claims() -> None:
    token = issue_token(SECRET, "r1", 60, grants=["feed", "admin"], participant="p", now=1000)
    claims = jwt.decode(token, SECRET, algorithms=["HS256"], options={"verify_exp": False})
    assert claims == {
        "room": "r1",
        "iat": 1000,
        "exp": 1060,
        "sub": "p",
        "grants": ["admin", "feed"],
    }


def test_a_token_without_grants_allows_stream_feed_chat_but_not_admin() -> None:
    token = jwt.encode({"room": "r", "iat": 1, "exp": 2**40}, SECRET, algorithm="HS256")
    grant = verify_token(SECRET, token, "r")
    assert grant.grants == {Grant.STREAM, Grant.FEED, Grant.CHAT}
    with pytest.raises(TokenError) as err:
        verify_token(SECRET, token, "r", need=Grant.ADMIN)
    assert err.value.problem is TokenProblem.NOT_GRANTED


@pytest.mark.parametrize(
    ("claims", "algorithm"),
    [
        ({"iat": 1, "exp": 2**40}, "HS256"),  # no room
        ({"room": "r", "iat": 1}, "HS256"),  # no exp
        ({"room": "r", "iat": 1, "exp": 2**40, "grants": ["root"]}, "HS256"),
        ({"room": "r", "iat": 1, "exp": 2**40, "grants": "stream"}, "HS256"),
        ({"room": "r", "iat": 1, "exp": 2**40}, "HS512"),
    ],
)
def test_tokens_with_bad_claims_or_algorithm_are_malformed(
    claims: dict[str, object], algorithm: str
) -> None:
    token = jwt.encode(claims, SECRET, algorithm=algorithm)
    with pytest.raises(TokenError) as err:
        verify_token(SECRET, token, "r")
    assert err.value.problem is TokenProblem.MALFORMED


def test_an_unsigned_token_is_refused() -> None:
    token = jwt.encode({"room": "r", "iat": 1, "exp": 2**40}, None, algorithm="none")
    with pytest.raises(TokenError) as err:
        verify_token(SECRET, token, "r")
    assert err.value.problem is TokenProblem.MALFORMED


def test_token_command_grants_and_participant(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    monkeypatch.setenv("CHORUS_SECRET", SECRET)
    assert main(["token", "room-9", "--grant", "feed", "--participant", "ann"]) == 0
    grant = verify_token(SECRET, capsys.readouterr().out.strip(), "room-9")
    assert grant.grants == {Grant.FEED} and grant.participant == "ann"


async def test_tokens_stay_out_of_the_server_log(
    server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    token = issue_token(SECRET, "r1")
    async with connect(events_url(server.base, "r1", token)):
        pass
    await eventually(lambda: "events?token=" in caplog.text, 30, "the request line logged")
    assert token not in caplog.text and "token=…" in caplog.text
