"""Deepgram streaming (rules S2, V3, V4) with the real deepgram-sdk client against the local
Deepgram-protocol server (voice.testing.deepgram_server)."""

from __future__ import annotations

import asyncio
from collections import Counter

import numpy as np
import pytest
from deepgram import AsyncDeepgramClient

from server.testing.harness import eventually
from tests.voice_helpers import meeting, stream, turns_of, voice_room
from voice.channel import VoiceChannel
from voice.stt.deepgram import DeepgramSTT, environment_for
from voice.testing.deepgram_server import (
    DeepgramTestServer,
    MeetingWords,
    ScriptedWords,
    SpokenWord,
)

SILENCE = np.zeros(32000, np.float32)


def two_voices_in_one_final() -> ScriptedWords:
    return ScriptedWords([[
        SpokenWord("so", 0.10, 0.30, 0, "So"),
        SpokenWord("thursday", 0.35, 0.80, 0, "Thursday?"),
        SpokenWord("yes", 0.90, 1.20, 1, "Yes,"),
        SpokenWord("thursday", 1.25, 1.70, 1, "Thursday."),
    ]])


async def test_V3_final_with_two_speakers_becomes_two_turns() -> None:
    async with DeepgramTestServer(two_voices_in_one_final()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("test-key", url=server.url))
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await turns_of(session, SILENCE, 16000)
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [
        ("Speaker A", "So Thursday?"),
        ("Speaker B", "Yes, Thursday."),
    ]
    assert [(e.metadata["start"], e.metadata["end"]) for e in events] == [(0.1, 0.8), (0.9, 1.7)]
    assert all(e.metadata["source"] == "voice" and e.metadata["voice_session_id"] == session.id
               and e.source.participant_id == "mic-1" for e in events)
    assert len(server.connections[0].finals_sent) >= 1


async def test_V3_labels_follow_first_appearance_and_interims_carry_no_speaker() -> None:
    script = ScriptedWords([[SpokenWord("hello", 0.1, 0.4, 1)], [SpokenWord("hi", 0.9, 1.1, 0)]])
    seen = []
    async with DeepgramTestServer(script, interim_every=0.05) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        original = session._on_stt_event

        async def spy(event):  # type: ignore[no-untyped-def]
            seen.append(event)
            await original(event)

        session.stt.on_event = spy
        turns = await turns_of(session, SILENCE, 16000)
    assert [t.sender_name for t in turns] == ["Speaker A", "Speaker B"]  # raw 1 came first
    interims = [e for e in seen if getattr(e, "is_final", True) is False]
    assert interims and all(w.speaker is None for e in interims for w in e.words)


async def test_S2_sdk_options_keepalive_finalize_and_close_stream() -> None:
    async with DeepgramTestServer(ScriptedWords([])) as server:
        stt = DeepgramSTT("secret", url=server.url, keepalive_interval=0.2)
        channel = VoiceChannel(stt=stt)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await stream(session, SILENCE[:1600], 16000)
        # no audio: KeepAlive text frames keep the stream open
        await eventually(lambda: server.connections[0].keepalives >= 1, 30, "a KeepAlive")
        await session.finish()
        conn = server.connections[0]
    assert conn.path == "/v1/listen"
    assert conn.headers["authorization"] == "Token secret"
    assert conn.query["diarize"] == "true" and conn.query["interim_results"] == "true"
    assert conn.query["utterance_end_ms"] == "1000" and conn.query["encoding"] == "linear16"
    assert conn.keepalives >= 1 and conn.finalizes >= 1 and conn.close_streams == 1
    assert conn.closed_reason == "close_stream" and conn.malformed == 0


async def test_S2_server_closes_an_idle_connection_and_the_stream_reconnects() -> None:
    script = ScriptedWords([[SpokenWord("late", 0.1, 0.4, 0)]])
    async with DeepgramTestServer(script, idle_timeout=0.3) as server:
        stt = DeepgramSTT("k", url=server.url, keepalive_interval=60.0)  # too rare to help
        channel = VoiceChannel(stt=stt)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await eventually(lambda: session.stt.reconnects >= 1, 30, "the idle close and reconnect")
        turns = await turns_of(session, SILENCE, 16000)
    assert server.connections[0].closed_reason == "idle"
    assert session.stt.reconnects >= 1
    assert [t.text for t in turns] == ["late"]


async def test_V4_forced_disconnect_loses_no_word_and_keeps_every_voice_label() -> None:
    demo = meeting(seconds=45.0)
    source = MeetingWords.from_meeting("examples/meeting")
    source.rotate_speakers = True  # the new connection numbers the voices differently
    async with DeepgramTestServer(source) as server:
        server.drop_after(25.0)
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, demo.audio, demo.sample_rate, speed=8.0)
        assert [c.closed_reason for c in server.connections] == ["dropped", "close_stream"]
    got = [w.text for t in turns for w in t.transcription.words]
    sent = [w for c in server.connections for r in c.finals_sent
            for w in r["channel"]["alternatives"][0]["words"]]
    expected = [w for w in MeetingWords.from_meeting("examples/meeting").words
                if (w.start + w.end) / 2 < len(demo.audio) / demo.sample_rate]
    assert Counter(got) == Counter(w.punctuated_word for w in expected)  # none lost, none twice
    assert len(sent) > len(got)  # the replayed audio really was transcribed twice by the server
    # Each script voice has exactly one label, before and after the reconnect.
    label_of: dict[object, set[str | None]] = {}
    for t in turns:
        for w in t.transcription.words:
            said = next(x for x in expected
                        if x.punctuated_word == w.text and abs(x.start - w.start) < 0.05)
            label_of.setdefault(said.speaker, set()).add(w.speaker)
    assert all(len(labels) == 1 for labels in label_of.values()), label_of
    assert len({next(iter(v)) for v in label_of.values()}) == 3
    # each voice of the new connection was bound by the replayed audio (time) or by its voice
    voiced = [d for d in session.speakers.decisions if d[0] == 1]
    timed = [d for d in session.speakers.timed if d[0] == 1]
    assert len(voiced) + len(timed) == 3 and {d[1] for d in voiced + timed} == {0, 1, 2}
    assert all(sim is not None and sim >= 0.7 for _, _, _, sim in voiced)


def test_S2_deepgram_url_points_the_sdk_environment() -> None:
    env = environment_for("ws://127.0.0.1:9000/")
    assert env.production == "ws://127.0.0.1:9000" and env.base == "http://127.0.0.1:9000"
    with pytest.raises(ValueError, match="DEEPGRAM_URL must start with"):
        environment_for("127.0.0.1:9000")


def test_S2_missing_api_key_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEEPGRAM_API_KEY", raising=False)
    with pytest.raises(ValueError, match="DEEPGRAM_API_KEY"):
        DeepgramSTT()


async def test_S2_repeated_words_of_one_connection_are_not_mistaken_for_duplicates() -> None:
    script = ScriptedWords([[SpokenWord("no", 0.10, 0.30, 0, "No,"),
                             SpokenWord("no", 0.35, 0.55, 0, "no,"),
                             SpokenWord("no", 0.60, 0.80, 0, "no.")]])
    async with DeepgramTestServer(script) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, SILENCE, 16000)
    assert [t.text for t in turns] == ["No, no, no."]


async def test_S2_unreachable_server_is_a_clear_error_not_a_hang() -> None:
    channel = VoiceChannel(stt=DeepgramSTT("k", url="ws://127.0.0.1:9"))  # nothing listens there
    await voice_room(channel)
    with pytest.raises(ConnectionError, match="deepgram: cannot connect"):
        await asyncio.wait_for(channel.start_session("room", "mic-1"), 20)
    assert channel.sessions == []


async def test_S2_malformed_server_messages_are_skipped_and_the_stream_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with DeepgramTestServer(two_voices_in_one_final()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await eventually(lambda: len(server.connections) == 1, 30, "the connection")
        await server.send_raw('{"type": "Results", "channel": "not a channel"}')
        await server.send_raw('{"type": "Results", "channel_index": [0, 1], "duration": 1, '
                              '"start": 0, "is_final": true, "channel": {"alternatives": '
                              '[{"transcript": "x", "confidence": 1, "words": [{"word": "x"}]}]}}')
        await server.send_raw("not json at all")
        await turns_of(session, SILENCE, 16000)
        events = await kit.list_events("room")
    assert [e.text for e in events] == ["So Thursday?", "Yes, Thursday."]
    assert len(server.connections) == 1  # nothing was mistaken for a dropped connection


async def test_S2_drop_now_mid_stream_reconnects_without_losing_the_final() -> None:
    async with DeepgramTestServer(two_voices_in_one_final()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await stream(session, SILENCE[:8000], 16000)  # 0.5 s: no final yet
        await eventually(lambda: server.connections[0].audio_seconds >= 0.5, 30, "the audio")
        server.drop_now()
        await turns_of(session, SILENCE[8000:], 16000)
        events = await kit.list_events("room")
    assert [c.closed_reason for c in server.connections] == ["dropped", "close_stream"]
    assert [e.text for e in events] == ["So Thursday?", "Yes, Thursday."]


async def test_S2_streams_and_reconnects_open_their_sockets_from_one_sdk_client(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the SDK client makes an HTTP client and a TLS context (about 25 ms of CPU on
    the event loop): every stream and every reconnect of one provider share one (issue 31)."""
    import voice.stt.deepgram as provider_module

    built: list[object] = []

    real = AsyncDeepgramClient

    def counted(**kwargs: object) -> object:  # the real SDK client, counted
        client = real(**kwargs)
        built.append(client)
        return client

    monkeypatch.setattr(provider_module, "AsyncDeepgramClient", counted)
    async with DeepgramTestServer(two_voices_in_one_final()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        first = await channel.start_session("room", "mic-1")
        second = await channel.start_session("room", "mic-2")
        await stream(first, SILENCE[:8000], 16000)
        await eventually(lambda: len(server.connections) >= 2
                         and server.connections[0].audio_seconds >= 0.5, 30, "the audio")
        server.drop_now()
        await turns_of(first, SILENCE[8000:], 16000)
        await turns_of(second, SILENCE, 16000)
        events = await kit.list_events("room")
    assert len(server.connections) >= 3 and "dropped" in [c.closed_reason for c in server.connections]
    assert len(built) == 1
    assert [e.text for e in events].count("So Thursday?") == 2


async def test_diarize_false_reaches_deepgram_and_the_server_config_sends_it() -> None:
    """Issue 10.9: `stt.diarize = false` was dropped and Deepgram was still asked to diarize."""
    from server.config import ServerConfig, SttConfig
    from server.pipeline import stt_provider

    async with DeepgramTestServer(two_voices_in_one_final()) as server:
        config = ServerConfig(stt=SttConfig(provider="deepgram", deepgram_url=server.url,
                                            deepgram_api_key="k", diarize=False))
        stt = stt_provider(config)
        assert stt.diarizes is False
        channel = VoiceChannel(stt=stt)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, SILENCE, 16000)
    assert server.connections[0].query["diarize"] == "false"
    assert [(t.sender_name, t.text) for t in turns] == [(None, "So Thursday? Yes, Thursday.")]


def test_diarize_model_without_diarize_is_refused() -> None:
    with pytest.raises(ValueError, match="diarize_model needs diarize=True"):
        DeepgramSTT("k", diarize=False, diarize_model="nova-3")
