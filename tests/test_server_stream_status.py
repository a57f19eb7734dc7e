"""Issue 10.1, the server-facing seam: the pipeline hands each stream's STT status (degraded,
recovered, audio lost, ended) to that stream's own callback, where the server tells the device
and counts it; a stream that finished leaves no callback behind."""

from __future__ import annotations

import asyncio

from rooms import RoomKit
from server.config import DiarizerConfig, RealtimeConfig, ServerConfig, SttConfig
from server.framing import StreamDeclaration
from server.pipeline import StreamInfo, VoicePipeline, stt_provider
from server.testing.harness import eventually, local_deepgram_stt
from voice.audio import StreamFormat
from voice.stt.base import SttDegraded, SttRecovered, SttStatus
from voice.testing.deepgram_server import DeepgramTestServer


def _info(stream_id: str, participant: str) -> StreamInfo:
    return StreamInfo("r", stream_id, StreamDeclaration(participant, None, False, StreamFormat()))


async def test_each_streams_status_reaches_its_own_callback_and_no_other() -> None:
    heard: list[SttStatus] = []
    recovered = asyncio.Event()

    async def on_status(status: SttStatus) -> None:
        heard.append(status)
        if isinstance(status, SttRecovered):
            recovered.set()

    async def broken(status: SttStatus) -> None:
        raise RuntimeError("a failing callback must not break its stream")

    async with DeepgramTestServer() as server:
        config = ServerConfig(stt=SttConfig(**local_deepgram_stt(server.url)),
                              diarizer=DiarizerConfig(kind="none"),
                              realtime=RealtimeConfig(provider="none"))
        pipeline = VoicePipeline(config, stt_provider(config))
        kit = RoomKit()
        await kit.create_room(room_id="r")
        await pipeline.attach_room(kit, "r")
        first = await pipeline.open_stream(kit, _info("s1", "device-1"), on_status)
        second = await pipeline.open_stream(kit, _info("s2", "device-2"), broken)
        assert set(pipeline._on_status) == {"s1", "s2"}
        # the outage drops what the server holds open: wait until it has both connections
        await eventually(lambda: len(server.connections) == 2, 60, "the STT connections")
        server.outage(0.3)
        await asyncio.wait_for(recovered.wait(), 30)
        await first.finish()
        await second.finish()
        assert pipeline._on_status == {}  # finished streams leave no callback behind
        await pipeline.close()
    # s1 heard its own outage once (not the other stream's too); s2's failing callback broke nothing
    assert [type(status) for status in heard] == [SttDegraded, SttRecovered]
