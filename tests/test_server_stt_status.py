"""Issue 10.1 over real sockets: when a stream's STT service drops, the device is told
(`stt_status` degraded, then recovered), `/metrics` counts it, and no turn is lost. The room's
feed does not hear a device's outage (its device already does); a phone leg's it does
(`tests/test_server_audiosocket.py`)."""

from __future__ import annotations

import asyncio

from server.auth import Grant, issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import FeedMessage, StartMessage, SttStatusMessage
from server.testing.harness import (
    SECRET,
    eventually,
    metric_value,
    running_server_with_local_stt,
    tone,
)


async def test_an_stt_outage_is_told_to_the_device_not_the_feed_and_counted() -> None:
    statuses: list[SttStatusMessage] = []
    recovered = asyncio.Event()

    def seen(message: FeedMessage) -> None:
        if isinstance(message, SttStatusMessage):
            statuses.append(message)
            if message.status == "recovered":
                recovered.set()

    async with running_server_with_local_stt({"stt": {"diarize": False}}) as server:
        assert server.stt_server is not None
        server.stt_server.outage_after(1.0, 0.5)  # the STT service drops once it heard 1 s of audio
        feed = await EventFeed.open(server.base, "r1", issue_token(SECRET, "r1", grants=[Grant.FEED]))
        device = await DeviceStream.open(
            server.base,
            "r1",
            issue_token(SECRET, "r1"),
            StartMessage(participant="room-1", sample_rate=16000),
            on_message=seen,
        )
        await device.send_audio(tone(2.0), realtime=False)
        async with asyncio.timeout(60):
            await recovered.wait()
            await device.stop()
        # the feed hears the stream stop after anything said about it before
        await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received), 60,
                         "the stop on the feed")
        await feed.close()
        status, body = await server.http_get("/metrics")
    assert status == 200
    assert [m.status for m in statuses] == ["degraded", "recovered"]
    assert {m.stream for m in statuses} == {statuses[0].stream} and statuses[0].stream
    assert not [m for m in feed.received if isinstance(m, SttStatusMessage)]  # the device's own
    assert metric_value(body, "chorus_stt_outages_total") == 1.0
    assert metric_value(body, "chorus_stt_recoveries_total") == 1.0
    assert metric_value(body, "chorus_stt_audio_lost_seconds_total") == 0.0
