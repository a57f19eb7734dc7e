"""Issue 10.1, the server-facing seam: the pipeline hands every stream's STT status (degraded,
recovered, audio lost, ended) to its listeners, where the server tells the device and counts it."""

from __future__ import annotations

import asyncio

from rooms import RoomKit
from server.config import DiarizerConfig, RealtimeConfig, ServerConfig, SttConfig
from server.pipeline import StreamInfo, VoicePipeline, stt_provider
from server.testing.harness import eventually, local_deepgram_stt
from voice.channel import VoiceSession
from voice.stt.base import SttDegraded, SttRecovered, SttStatus
from voice.testing.deepgram_server import DeepgramTestServer


async def test_the_pipeline_hands_each_streams_status_to_its_listeners() -> None:
    heard: list[tuple[str, SttStatus]] = []
    recovered = asyncio.Event()

    async def listener(session: VoiceSession, status: SttStatus) -> None:
        heard.append((session.id, status))
        if isinstance(status, SttRecovered):
            recovered.set()

    async def broken(session: VoiceSession, status: SttStatus) -> None:
        raise RuntimeError("a failing listener must not stop the others")

    async with DeepgramTestServer() as server:
        config = ServerConfig(stt=SttConfig(**local_deepgram_stt(server.url)),
                              diarizer=DiarizerConfig(kind="none"),
                              realtime=RealtimeConfig(provider="none"))
        pipeline = VoicePipeline(config, stt_provider(config))
        pipeline.status_listeners.extend([broken, listener])
        kit = RoomKit()
        await kit.create_room(room_id="r")
        await pipeline.attach_room(kit, "r")
        stream = await pipeline.open_stream(
            kit, StreamInfo("r", "s1", "device-1", None, False, 16000, "pcm16", 1))
        # the outage drops what the server holds open: wait until it has the stream's connection
        await eventually(lambda: len(server.connections) == 1, 60, "the STT connection")
        server.outage(0.3)
        await asyncio.wait_for(recovered.wait(), 30)
        await stream.finish()
        await pipeline.close()
    assert [type(status) for _, status in heard] == [SttDegraded, SttRecovered]
    assert {sid for sid, _ in heard} == {stream.session_id}
