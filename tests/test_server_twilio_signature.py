"""Issue 25.6: a few addresses could lock every phone caller out — 64 unauthenticated legs from
8+ addresses filled `limits.max_unauthenticated` and every real leg got 4429. With `[twilio]
auth_token` the upgrade itself is authenticated (Twilio's `X-Twilio-Signature`, signed here by
the Twilio SDK as Twilio signs it): an unsigned or wrongly signed leg is refused with HTTP 403
before it is accepted, so it takes no slot, and Twilio's own legs are never counted as waiting."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from server.auth import issue_token
from server.client import EventFeed, TwilioLeg
from server.config import ConfigError, load_config
from server.protocol import dump
from server.testing.harness import SECRET, RunningServer, eventually, running_server_with_local_stt
from server.twilio import TwilioConnected, TwilioSignatures
from voice.testing.deepgram_server import MeetingWords

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
AUTH_TOKEN = "twilio-auth-token-for-tests"


@contextlib.asynccontextmanager
async def signed_server(**twilio: Any) -> AsyncIterator[RunningServer]:
    config = {
        "twilio": {"auth_token": AUTH_TOKEN, **twilio},
        "limits": {"max_unauthenticated": 2, "max_unauthenticated_per_address": 1},
    }
    async with running_server_with_local_stt(config, MeetingWords.from_meeting(MEETING)) as srv:
        yield srv


async def _refused_at_upgrade(url: str, **options: Any) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as info:
        async with connect(url, **options):
            pass
    return info.value


async def test_unsigned_legs_are_refused_before_they_take_a_slot_and_signed_legs_still_start() -> None:
    async with signed_server() as srv:
        url = f"{srv.base}/v1/twilio"
        # more unsigned legs from more addresses than the waiting caps allow: each is a 403
        for n in range(2, 8):
            refused = await _refused_at_upgrade(url, local_addr=(f"127.0.0.{n}", 0))
            assert refused.response.status_code == 403
            assert b"bad_signature" in refused.response.body
        wrong = await _refused_at_upgrade(
            url, additional_headers={"X-Twilio-Signature": "bm90IGEgc2lnbmF0dXJl"}
        )
        assert wrong.response.status_code == 403
        assert srv.server.metrics.refused_total["bad_twilio_signature"] == 7
        assert srv.server.open_sockets == 0 and srv.server._unauthenticated_total == 0

        # Twilio's own legs, more than the waiting caps, from one address: none is refused
        waiting: list[ClientConnection] = []
        for _ in range(3):  # connected, and no start yet: what held the slots before
            ws = await connect(url, additional_headers={"X-Twilio-Signature": _sign(url)})
            await ws.send(dump(TwilioConnected()))
            waiting.append(ws)
        await eventually(lambda: srv.server.open_sockets == 3, 30, "three signed legs held")
        assert srv.server._unauthenticated_total == 0
        assert all(ws.close_code is None for ws in waiting)
        for ws in waiting:
            with contextlib.suppress(ConnectionClosed):
                await ws.close()

        token = issue_token(SECRET, "bridge")
        feed = await EventFeed.open(srv.base, "bridge", token)
        caller = await TwilioLeg.open(
            srv.base, {"room": "bridge", "token": token, "name": "Dana"}, auth_token=AUTH_TOKEN
        )
        await eventually(
            lambda: any(m.type == "stream_started" for m in feed.received), 30, "the caller's stream"
        )
        assert caller.ws.close_code is None
        await caller.ws.close()
        await feed.close()


async def test_a_signature_made_with_another_auth_token_is_refused() -> None:
    async with signed_server() as srv:
        with pytest.raises(InvalidStatus) as info:
            await TwilioLeg.open(srv.base, {}, auth_token="someone-elses-token")
        assert info.value.response.status_code == 403


async def test_a_configured_stream_url_is_what_the_signature_must_sign() -> None:
    """Behind a proxy Twilio signs the public URL of the TwiML, not the one the server sees."""
    public = "wss://bridge.example/v1/twilio"
    async with signed_server(stream_url=public) as srv:
        # signed for the URL the request reached: not the configured one
        refused = await _refused_at_upgrade(
            f"{srv.base}/v1/twilio",
            additional_headers={
                "X-Twilio-Signature": _sign(f"{srv.base}/v1/twilio"),
            },
        )
        assert refused.response.status_code == 403
        async with connect(
            f"{srv.base}/v1/twilio", additional_headers={"X-Twilio-Signature": _sign(public)}
        ) as ws:
            await ws.send(dump(TwilioConnected()))
            await eventually(lambda: srv.server.open_sockets == 1, 30, "the signed leg")
            assert srv.server._unauthenticated_total == 0


def _sign(url: str) -> str:
    from twilio.request_validator import RequestValidator

    return str(RequestValidator(AUTH_TOKEN).compute_signature(url, {}))


def test_the_check_takes_the_url_as_wss_or_ws_and_with_or_without_its_port() -> None:
    check = TwilioSignatures(AUTH_TOKEN)
    seen = "ws://chorus.example:443/v1/twilio"
    assert check.signed(_sign("wss://chorus.example/v1/twilio"), seen)
    assert check.signed(_sign("ws://chorus.example:443/v1/twilio"), seen)
    assert not check.signed(_sign("wss://elsewhere.example/v1/twilio"), seen)
    assert not check.signed(None, seen) and not check.signed("", seen)


def test_the_twilio_section_reads_from_the_file_and_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text('[twilio]\nauth_token = "t"\nstream_url = "wss://x.example/v1/twilio"\n')
    assert load_config(file, {}).twilio.stream_url == "wss://x.example/v1/twilio"
    config = load_config(None, {"CHORUS_TWILIO_AUTH_TOKEN": "from-env"})
    assert config.twilio.auth_token == "from-env" and config.twilio.stream_url is None
    typo = tmp_path / "typo.toml"
    typo.write_text('[twilio]\nauthtoken = "t"\n')
    with pytest.raises(ConfigError, match=r"twilio\.authtoken"):
        load_config(typo, {})
