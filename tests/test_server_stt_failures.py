"""Issue 25.7 and 25.15 over real sockets: what a device and the feed hear when the STT service
refuses the server's key, and that a drain with the STT down has a deadline (the device gets
4503). The STT is the real deepgram-sdk against the local Deepgram-protocol server."""

from __future__ import annotations

import asyncio
import contextlib
from http import HTTPStatus

from websockets.exceptions import ConnectionClosed

from server.auth import Grant, issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import CloseCode, ErrorMessage, FeedMessage, StartMessage, SttStatusMessage
from server.testing.harness import (
    SECRET,
    eventually,
    metric_value,
    running_server_with_local_stt,
    tone,
)


def statuses(received: list[FeedMessage]) -> list[SttStatusMessage]:
    return [m for m in received if isinstance(m, SttStatusMessage)]


async def test_a_401_on_reconnect_is_told_to_device_and_feed_as_refused_and_counted() -> None:
    async with running_server_with_local_stt({"stt": {"diarize": False}}) as server:
        stt = server.stt_server
        assert stt is not None
        feed = await EventFeed.open(server.base, "r1", issue_token(SECRET, "r1", grants=[Grant.FEED]))
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"), StartMessage(participant="room-1")
        )
        await device.send_audio(tone(0.5), realtime=False)
        await eventually(lambda: bool(stt.connections and stt.connections[0].audio), 30, "audio")
        stt.refuse_handshakes(HTTPStatus.UNAUTHORIZED)
        stt.drop_now()
        await eventually(lambda: any(m.status == "refused" for m in statuses(device.received)),
                         30, "refused on the device")
        await eventually(lambda: any(m.status == "refused" for m in statuses(feed.received)),
                         30, "refused on the feed")
        await device.send_audio(tone(0.5), realtime=False)  # the stream goes on reading
        async with asyncio.timeout(60):
            await device.stop()
        _, body = await server.http_get("/metrics")
        await feed.close()
    told = statuses(device.received)
    assert [m.status for m in told][:2] == ["degraded", "refused"]
    refused = told[1]
    assert refused.reason is not None and "HTTP 401" in refused.reason
    assert "test" not in refused.reason.split()  # the API key ("test") is never in it
    assert [m.stream for m in statuses(feed.received)] == [refused.stream]
    assert stt.refused == 1  # never retried
    assert metric_value(body, "chorus_stt_refused_total") == 1.0


async def test_a_401_on_the_first_connect_refuses_the_stream_at_once_and_counts_it() -> None:
    async with running_server_with_local_stt({"stt": {"diarize": False}}) as server:
        stt = server.stt_server
        assert stt is not None
        stt.refuse_handshakes(HTTPStatus.UNAUTHORIZED)
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"), StartMessage(participant="room-1")
        )
        async with asyncio.timeout(60):
            await device.ws.wait_closed()
        _, body = await server.http_get("/metrics")
    errors = [m for m in device.received if isinstance(m, ErrorMessage)]
    assert device.ws.close_code == CloseCode.INTERNAL_ERROR
    assert errors and "HTTP 401" in errors[0].reason
    assert stt.refused == 1
    assert metric_value(body, "chorus_stt_refused_total") == 1.0


async def _keep_sending(device: DeviceStream) -> None:
    """A device that goes on streaming until the server closes it."""
    with contextlib.suppress(ConnectionClosed):
        while True:
            await device.ws.send(tone(0.1))
            await asyncio.sleep(0.01)


async def test_a_drain_with_the_stt_down_closes_the_device_with_4503_by_the_deadline() -> None:
    """Issue 25.15: the draining stream waited on an STT that was down (flush, then close) for
    40 s and more, without reading its socket, so the device never got 4503."""
    config = {"stt": {"diarize": False}, "limits": {"drain_timeout_s": 2.0}}
    async with running_server_with_local_stt(config) as server:
        stt = server.stt_server
        assert stt is not None
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"), StartMessage(participant="room-1")
        )
        await device.send_audio(tone(0.5), realtime=False)
        await eventually(lambda: bool(stt.connections and stt.connections[0].audio), 30, "audio")
        stt.outage(600.0)  # the STT is down for the rest of the test
        await eventually(lambda: any(m.status == "degraded" for m in statuses(device.received)),
                         30, "degraded")
        sending = asyncio.create_task(_keep_sending(device))
        async with asyncio.timeout(25):  # a bound far above the 2 s deadline, far below 40 s
            await server.server.stop()
            await device.ws.wait_closed()
        await sending
    assert device.ws.close_code == CloseCode.SHUTTING_DOWN


async def test_an_stt_that_never_completes_the_handshake_refuses_the_stream_within_the_bound() -> None:
    """Issue 25.7: a device whose STT accepted TCP and never answered the upgrade waited 102 s
    without `started`; now it is refused once `stt.start_timeout_s` has passed."""
    config = {"stt": {"diarize": False, "connect_timeout_s": 0.5, "start_timeout_s": 1.0}}
    async with running_server_with_local_stt(config) as server:
        stt = server.stt_server
        assert stt is not None
        stt.hold_handshakes()
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"), StartMessage(participant="room-1")
        )
        async with asyncio.timeout(25):  # far above the 1 s bound, far below 102 s
            await device.ws.wait_closed()
    errors = [m for m in device.received if isinstance(m, ErrorMessage)]
    assert device.ws.close_code == CloseCode.INTERNAL_ERROR
    assert errors and "did not complete" in errors[0].reason


async def test_audio_after_the_stt_went_down_for_good_is_told_as_audio_lost_and_counted() -> None:
    """Issue 25.7: an STT still down when the stream ended lost its audio with no `audio_lost`
    and no metric."""
    async with running_server_with_local_stt({"stt": {"diarize": False}}) as server:
        stt = server.stt_server
        assert stt is not None
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"), StartMessage(participant="room-1")
        )
        await eventually(lambda: bool(stt.connections), 30, "the STT connection")
        stt.outage(600.0)
        await eventually(lambda: any(m.status == "degraded" for m in statuses(device.received)),
                         30, "degraded")
        await device.send_audio(tone(2.0), realtime=False)
        async with asyncio.timeout(60):
            await device.stop()
        _, body = await server.http_get("/metrics")
    lost = [m for m in statuses(device.received) if m.status == "audio_lost"]
    assert len(lost) == 1 and lost[0].start is not None and lost[0].end is not None
    assert lost[0].end - lost[0].start >= 2.0 - 1e-6
    assert metric_value(body, "chorus_stt_audio_lost_seconds_total") >= 2.0 - 1e-6
