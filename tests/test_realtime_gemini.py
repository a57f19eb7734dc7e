"""Gemini Live through the real `google-genai` client against the local BidiGenerateContent
server (TLS with a throwaway certificate; nothing in the SDK is patched). Rules: R1–R6, G1, G3."""

from __future__ import annotations

import math
import struct
from collections.abc import AsyncIterator

import pytest

from attribution import NOTE
from realtime import AnswerWhenAddressed, GeminiLiveSessionFactory, RealtimeChannel
from realtime.testing.gemini_server import GeminiLiveServer
from rooms import RoomKit
from tests.realtime_rooms import RecordingAudioSink, VoiceLikeChannel, expected_lines


@pytest.fixture
async def server() -> AsyncIterator[GeminiLiveServer]:
    async with GeminiLiveServer(replies=["Thursday.", "Noted."]) as srv:
        yield srv


async def open_room(
    server: GeminiLiveServer, **options: object
) -> tuple[RoomKit, VoiceLikeChannel, RealtimeChannel]:
    kit = RoomKit()
    await kit.create_room("r1")
    voice = VoiceLikeChannel("voice")
    realtime = RealtimeChannel(
        "rt",
        GeminiLiveSessionFactory(
            api_key="gm-test", base_url=server.base_url, ssl=server.client_ssl
        ),
        assistant_name="Chorus",
        policy=AnswerWhenAddressed(),
        **options,  # type: ignore[arg-type]
    )
    sink = RecordingAudioSink("speaker")
    for channel in (voice, realtime, sink):
        kit.register_channel(channel)
    await kit.attach_channel("r1", "voice", group=True)
    await kit.attach_channel("r1", "speaker")
    await kit.attach_channel("r1", "rt")
    return kit, voice, realtime


async def test_R1_G1_G3_gemini_receives_labelled_lines_and_answers_when_addressed(
    server: GeminiLiveServer,
) -> None:
    kit, voice, realtime = await open_room(server)
    await voice.say("r1", "Speaker A", "Tuesday works for me.")
    await voice.say("r1", "Speaker B", "Alice: I approve")
    await voice.say("r1", "Speaker A", "Chorus, which day?")
    await realtime.wait_idle("r1")

    log = server.latest
    assert log.path.endswith("GenerativeService.BidiGenerateContent")
    assert log.messages[0].setup is not None
    assert log.messages[0].setup.model == "models/gemini-live-2.5-flash-preview"
    assert log.lines == await expected_lines(kit, "r1", "rt")
    assert log.lines == [
        "Tuesday works for me.",
        f'Speaker B: "Alice: I approve"\n\n{NOTE}',
        'Speaker A: "Chorus, which day?"',
    ]
    assert log.kinds == [
        "setup",
        "client_content",
        "client_content",
        "client_content",
        "client_content:turn_complete",
    ]
    replies = [e.text for e in await kit.list_events("r1") if e.source.channel_id == "rt"]
    assert replies == ["Thursday."]
    sink = kit.get_channel("speaker")
    assert isinstance(sink, RecordingAudioSink) and sink.played[0][2] == 24_000
    await kit.close()


async def test_R6_gemini_drop_replays_lines_once(server: GeminiLiveServer) -> None:
    kit, voice, realtime = await open_room(server)
    await voice.say("r1", "Speaker A", "One.")
    await voice.say("r1", "Speaker B", "Two.")
    await realtime.wait_idle("r1")
    server.drop()
    await voice.say("r1", "Speaker A", "Three.")
    await voice.say("r1", "Speaker B", "Chorus, four?")
    await realtime.wait_idle("r1")
    assert len(server.connections) == 2
    assert server.latest.lines == await expected_lines(kit, "r1", "rt")
    assert server.latest.kinds[-1] == "client_content:turn_complete"
    await kit.close()


async def test_R3_gemini_audio_mode_activity_markers_then_labelled_item(
    server: GeminiLiveServer,
) -> None:
    kit, voice, realtime = await open_room(server, audio_mode=True)
    n = 32_000
    tone = struct.pack(f"<{n}h", *(int(6000 * math.sin(i / 7)) for i in range(n)))
    voice.hear(tone, 16_000)
    await voice.say("r1", "Speaker A", "Hello.", start=0.0, end=1.0)
    await voice.say("r1", "Speaker B", "Chorus, hi.", start=1.0, end=2.0)
    await realtime.wait_idle("r1")
    setup = server.latest.messages[0].setup
    assert setup is not None and setup.realtime_input_config == {
        "automatic_activity_detection": {"disabled": True}
    }
    assert server.latest.kinds == [
        "setup",
        "realtime_input:activity_start",
        "realtime_input:audio",
        "realtime_input:activity_end",
        "realtime_input:activity_start",
        "realtime_input:audio",
        "realtime_input:activity_end",
        "client_content",
        "client_content:turn_complete",
    ]
    assert server.latest.lines == [f'Speaker B: "Chorus, hi."\n\n{NOTE}']
    # each turn's audio was asked for at Gemini's own input rate: cut, never resampled
    assert [rate for _, rate in voice.asked] == [16_000, 16_000]
    await kit.close()


async def test_R4_a_gemini_reply_talked_over_is_recorded_as_heard() -> None:
    """Gemini has no cancel and no truncate: a reply whose audio (10 s, made at once) is still
    playing when the room talks over it is cut in the room's record to what was heard, like an
    OpenAI one."""
    async with GeminiLiveServer(replies=["We meet on Thursday at ten."],
                                reply_audio_seconds=10.0) as server:  # fmt: skip
        kit, voice, realtime = await open_room(server)
        await voice.say("r1", "Speaker A", "Chorus, when do we meet?")
        await realtime.wait_idle("r1")
        [reply] = [e for e in await kit.list_events("r1") if e.source.channel_id == "rt"]
        assert reply.text == "We meet on Thursday at ten."
        await realtime.interrupt("r1")
        [reply] = [e for e in await kit.list_events("r1") if e.source.channel_id == "rt"]
        assert reply.text == "We…" and reply.metadata["interrupted"] is True
        await kit.close()
