"""Issue 10.3: what a voice session keeps about client input is bounded."""

from __future__ import annotations

from tests.voice_helpers import voice_room
from voice.audio import AudioError
from voice.channel import KEPT_PER_SESSION, VoiceChannel
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer


async def test_a_client_sending_only_bad_frames_grows_no_list() -> None:
    async with DeepgramTestServer() as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        not_bytes = "a text frame"  # a live frame must be bytes
        for _ in range(2000):
            try:
                session.push(not_bytes)  # type: ignore[arg-type]
            except AudioError:
                pass
        await session.finish()
    assert session.skipped_count == 2000
    assert len(session.skipped_frames) == KEPT_PER_SESSION
