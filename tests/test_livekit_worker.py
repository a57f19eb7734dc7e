"""`chorus agent`'s job: a LiveKit room as a Chorus room (issue 11, items 2 and the tests).

No LiveKit server can be installed here, so the job runs against a never-connected `rtc.Room`
that emits the real events with real participant/publication objects, inside livekit-agents' own
`fake_job_context`. The audio is real LiveKit media: each participant's track is an
`rtc.AudioSource` → `rtc.LocalAudioTrack`, which the job reads through `rtc.AudioStream.from_track`
(played out in real time by LiveKit's native side), carrying clips of the generated meeting and
of a shared fixture recording. The STT is the real Deepgram client against the local
Deepgram-protocol server, whose words come from those recordings' scripts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from livekit import rtc
from livekit.agents.testing import fake_job_context
from livekit.rtc._proto.track_pb2 import TF_ECHO_CANCELLATION, TF_NOISE_SUPPRESSION

from attribution import NOTE
from livekit_worker.config import LiveKitConfig
from livekit_worker.participants import echo_cancelled, speaker_of
from livekit_worker.room_agent import ChorusRoomAgent, _barge_in_rule
from livekit_worker.worker import run_job
from models import RoomEvent, TextContent
from realtime.testing.openai_server import OpenAIRealtimeServer
from rooms import AudioSink
from server.config import ServerConfig
from server.protocol import AssistantStatusMessage, parse_server_message
from server.reply_audio import ECHO_CANCELLED_BARGE_IN_S, ReplyEnvelope
from tests.livekit_helpers import (
    MEETING_DIR,
    RATE,
    FakeRoom,
    RecordedWriter,
    RecordingLocalParticipant,
    RecordingsWords,
    TrackPlayer,
    clip,
    clip_words,
    meeting_pcm,
    remote_participant,
    rttm_words,
    until,
)
from tests.test_server_overload import GatedStage
from voice.audio import float_to_pcm16, level_dbfs, resample
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

ALICE = (0.0, 4.45)  # the meeting's first turn (Alice)
BOB = (4.45, 9.05)  # its second (Bob)
SHARED = (0.0, 15.0)  # falcon_test: spk1, spk2, the start of spk3


def meeting_text(start: float, end: float) -> str:
    words = MeetingWords.from_meeting(MEETING_DIR).words
    return " ".join(w.punctuated_word or w.word for w in words if start <= (w.start + w.end) / 2 <= end)


def config_for(url: str) -> ServerConfig:
    return ServerConfig.model_validate({
        "stt": {"provider": "deepgram", "deepgram_url": url, "deepgram_api_key": "k"},
        "diarizer": {"kind": "embedded"},
        "realtime": {"provider": "recorder"},
        "store": {"url": "memory://"},  # each test's rooms are its own (the default is SQLite)
    })


@pytest.fixture
async def falcon(shared_fixtures: Path) -> tuple[MeetingWords, np.ndarray]:
    folder = shared_fixtures / "short-clips"
    words = rttm_words(folder / "falcon_test.flac", folder / "falcon_test.rttm")
    return words, words.reference


async def voice_events(agent: ChorusRoomAgent) -> list[RoomEvent]:
    return [e for e in await agent.kit.list_events(agent.room_name)
            if e.metadata.get("source") == "voice"]


async def heard(agent: ChorusRoomAgent, identity: str, seconds: float) -> None:
    """Wait until the participant's session has taken `seconds` of voiced audio (a LiveKit audio
    stream delivers silence before the source plays; the bound is a failure bound)."""
    def done() -> bool:
        for session in agent.sessions:
            if session.participant_id == identity:
                samples = session.audio.samples(0, session.audio.total)
                voiced = np.flatnonzero(samples)
                return len(voiced) > 0 and (session.audio.total - voiced[0]) / RATE >= seconds
        return False
    await until(done, limit=120)


@pytest.fixture
async def deepgram(falcon: tuple[MeetingWords, np.ndarray]) -> AsyncIterator[DeepgramTestServer]:
    meeting = MeetingWords.from_meeting(MEETING_DIR)
    source = RecordingsWords([
        clip_words(meeting, *ALICE), clip_words(meeting, *BOB), clip_words(falcon[0], *SHARED),
    ])
    async with DeepgramTestServer(source) as server:
        yield server


async def test_a_stalled_event_loop_leaves_no_gap_in_a_played_clip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The test player's clip reaches a reader of its track whole, even when the event loop
    stalls (a loaded machine) right after the player's first capture: no silence played into
    the middle of it, which once left the Deepgram stand-in with no words for either track."""
    import time

    player = TrackPlayer("stall")
    capture = player.source.capture_frame

    async def stalling_capture(frame: rtc.AudioFrame) -> None:
        await capture(frame)
        time.sleep(0.2)  # noqa: ASYNC251 - the whole loop, blocked, as a loaded machine does

    monkeypatch.setattr(player.source, "capture_frame", stalling_capture)
    pcm = clip(meeting_pcm(), *ALICE)
    stream = rtc.AudioStream.from_track(track=player.track, sample_rate=RATE, num_channels=1)
    received: list[np.ndarray] = []

    async def read() -> None:
        async for event in stream:
            received.append(np.frombuffer(bytes(event.frame.data), np.int16))
            audio = np.concatenate(received)
            voiced = np.flatnonzero(audio)
            if len(voiced) and len(audio) - voiced[0] >= len(pcm):
                return

    try:
        reading = asyncio.create_task(read())
        await player.play(pcm)
        await asyncio.wait_for(reading, 60)
        audio = np.concatenate(received)
        first = int(np.flatnonzero(pcm)[0])
        start = int(np.flatnonzero(audio)[0])
        assert np.array_equal(audio[start : start + len(pcm) - first], pcm[first:])
    finally:
        await stream.aclose()
        await player.aclose()


async def test_two_people_and_a_shared_mic_in_one_room(
    deepgram: DeepgramTestServer, falcon: tuple[MeetingWords, np.ndarray]
) -> None:
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    livekit = LiveKitConfig()
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), livekit, local=local)
    alice = remote_participant("alice-1", "Alice")
    caller = remote_participant("sip_15550100", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP,
                                attributes={"sip.phoneNumber": "+15550100"})
    table = remote_participant("table-mic", "Conference room",
                               attributes={"chorus.shared_mic": "true"})
    players = {p.identity: TrackPlayer(p.identity) for p in (alice, caller, table)}
    audio = meeting_pcm()
    clips = {
        "alice-1": clip(audio, *ALICE),
        "sip_15550100": clip(audio, *BOB),
        "table-mic": clip(falcon[1], *SHARED),
    }
    try:
        for participant in (alice, caller, table):
            room.join(participant)
            room.subscribe(participant, players[participant.identity].track,
                           f"TR_{participant.identity}")
        await agent.wait_idle()
        assert len(agent.sessions) == 3
        await asyncio.gather(*(players[i].play(pcm) for i, pcm in clips.items()))
        for identity, pcm in clips.items():
            await heard(agent, identity, len(pcm) / RATE + 0.5)  # and some silence after
        room.leave(alice)
        room.unsubscribe(caller, "TR_sip_15550100")
        room.leave(table)
        await agent.wait_idle()
        assert agent.sessions == []
        assert agent.realtime is not None
        await agent.realtime.wait_idle(agent.room_name)
        events = await voice_events(agent)
        labels = [await agent.kit.label_for("standup", e) for e in events]
        by_label: dict[str, list[str]] = {}
        for label, event in zip(labels, events, strict=True):
            by_label.setdefault(label, []).append(event.text)

        # the two one-person participants: named by LiveKit name / SIP number, one turn each
        assert " ".join(by_label.pop("Alice")) == meeting_text(*ALICE)
        assert " ".join(by_label.pop("+15550100")) == meeting_text(*BOB)
        # the shared mic: its voices by the STT's labels, in the fixture's order
        table_events = [e for e in events if e.source.participant_id == "table-mic"]
        assert [e.metadata["sender_name"] for e in table_events] == [
            "Speaker A", "Speaker B", "Speaker C"]
        for event, speaker in zip(table_events, ("spk1", "spk2", "spk3"), strict=True):
            assert set(event.text.split()) == {
                w.word for w in clip_words(falcon[0], *SHARED).words if w.speaker == speaker}
        assert sorted(by_label) == ["Speaker A", "Speaker B", "Speaker C"]

        # the realtime recorder: every turn once, labelled once two speakers were heard, note once
        lines = agent.realtime.lines_for("standup")
        assert len(lines) == len(events)
        assert sum(NOTE in line for line in lines) == 1
        assert NOTE in lines[1]
        for line, label in zip(lines[1:], labels[1:], strict=True):
            assert line.startswith(f"{label}: ")

        # the published transcriptions: each turn once, in commit order, with LiveKit's attributes
        assert [s.topic for s in local.streams] == ["lk.transcription"] * len(events)
        assert all(s.closed for s in local.streams)
        assert [s.text for s in local.streams] == [e.text for e in events]
        assert [s.attributes["lk.segment_id"] for s in local.streams] == [e.id for e in events]
        assert [s.attributes["chorus.speaker"] for s in local.streams] == labels
        assert [s.sender_identity for s in local.streams] == [
            e.source.participant_id for e in events]
        assert [s.attributes["lk.transcribed_track_id"] for s in local.streams] == [
            f"TR_{e.source.participant_id}" for e in events]
        assert {s.attributes["lk.transcription_final"] for s in local.streams} == {"true"}
        # the reply track is the agent's own published audio track
        assert [t for t, _ in local.tracks] == [agent.reply_track]
    finally:
        await agent.aclose()
        for player in players.values():
            await player.aclose()


async def test_leaving_mid_turn_commits_the_turn_once_and_a_rejoin_keeps_the_name(
    deepgram: DeepgramTestServer,
) -> None:
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local)
    audio = meeting_pcm()
    first, second = TrackPlayer("a"), TrackPlayer("b")
    try:
        alice = remote_participant("alice-1", "Alice")
        room.join(alice)
        room.subscribe(alice, first.track, "TR_1")
        await agent.wait_idle()
        # Alice leaves mid-sentence (her turn runs to 4.2 s): the track carries her first 2.7 s
        # only, so what she said before leaving does not depend on how fast the test runs
        await first.play(clip(audio, ALICE[0], 2.7))
        await heard(agent, "alice-1", 2.7 - ALICE[0])  # all of it taken
        room.leave(alice)
        await agent.wait_idle()
        events = await voice_events(agent)
        assert len(events) == 1
        full = meeting_text(*ALICE)
        assert events[0].text and full.startswith(events[0].text) and events[0].text != full
        assert len(local.streams) == 1 and local.streams[0].text == events[0].text

        again = remote_participant("alice-1", "Alice")
        room.join(again)
        room.subscribe(again, second.track, "TR_2")
        await agent.wait_idle()
        await second.play(clip(audio, *BOB))
        await heard(agent, "alice-1", BOB[1] - BOB[0] + 0.5)
        room.unsubscribe(again, "TR_2")
        await agent.wait_idle()
        events = await voice_events(agent)
        assert len(events) == 2
        assert events[1].text == meeting_text(*BOB)
        assert [await agent.kit.label_for("standup", e) for e in events] == ["Alice", "Alice"]
        people = await agent.kit.get_participants("standup")
        assert [p.id for p in people if p.id == "alice-1"] == ["alice-1"]
        assert len(local.streams) == 2 and local.streams[1].text == events[1].text
    finally:
        await agent.aclose()
        await first.aclose()
        await second.aclose()


async def played(reader: rtc.AudioStream, samples: int) -> np.ndarray:
    """The first `samples` a reader of the agent's reply track hears, from its first sound."""
    out: list[np.ndarray] = []
    async for event in reader:
        out.append(np.frombuffer(event.frame.data, dtype=np.int16).copy())
        got = np.concatenate(out)
        voiced = np.flatnonzero(got)
        if len(voiced) and len(got) - voiced[0] >= samples:
            return got[voiced[0] : voiced[0] + samples]
    raise AssertionError("the reply track ended first")


async def test_a_stalled_event_loop_leaves_no_gap_in_the_agent_s_reply(
    deepgram: DeepgramTestServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's reply reaches a reader of its track whole when the event loop stalls (a
    loaded machine) right after each capture: the reply is handed over in pieces of up to
    `REPLY_CAPTURE_S`, not 20 ms frames the native side runs dry between (it then plays silence
    into the reply)."""
    import time

    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local)
    capture = agent.reply_source.capture_frame

    async def stalling_capture(frame: rtc.AudioFrame) -> None:
        await capture(frame)
        time.sleep(0.1)  # noqa: ASYNC251 - the whole loop, blocked, as a loaded machine does

    monkeypatch.setattr(agent.reply_source, "capture_frame", stalling_capture)
    reader = rtc.AudioStream.from_track(track=agent.reply_track, sample_rate=24000,
                                        num_channels=1)
    t = np.arange(18000) / 24000
    tone = (np.cos(2 * np.pi * 440 * t) * 8000).astype(np.int16)  # 0.75 s, from 8000
    try:
        await agent.voice.play("standup", tone.tobytes(), 24000)
        assert np.array_equal(await played(reader, len(tone)), tone)
    finally:
        await reader.aclose()
        for callback in ctx._shutdown_callbacks:
            await callback("test over")


async def test_reply_audio_is_published_on_the_agent_track_and_gates_the_sessions(
    deepgram: DeepgramTestServer,
) -> None:
    """The realtime channel hands reply audio to every `AudioSink` in the room (R5); the voice
    channels are the sinks: their playback window gates a shared mic's session (V9: a
    speakerphone plays the reply into its microphone), and the audio comes out of the agent's
    published track, read back through a real `rtc.AudioStream`, once (the diarized channel of
    the shared mic is a second sink). A SIP participant (a phone caller) is gated too (a phone
    may send the reply back; its own barge-in lifts the gate: the next test); a person on their
    own microphone is not: the client's echo cancellation keeps the reply out."""
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local,
                              build_stage=GatedStage)
    player = TrackPlayer("alice")
    table = TrackPlayer("table")
    alice = remote_participant("alice-1", "Alice")
    phone = TrackPlayer("phone")
    caller = remote_participant("sip_15550100", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP)
    reader = rtc.AudioStream.from_track(track=agent.reply_track, sample_rate=24000,
                                        num_channels=1)
    t = np.arange(12000) / 24000
    tone = (np.cos(2 * np.pi * 440 * t) * 8000).astype(np.int16)  # 0.5 s at 24 kHz, from 8000
    try:
        room.join(alice)
        room.subscribe(alice, player.track, "TR_1")
        room.join(caller)
        room.subscribe(caller, phone.track, "TR_2")
        shared = remote_participant("table", "Table", attributes={"chorus.shared_mic": "true"})
        room.join(shared)
        room.subscribe(shared, table.track, "TR_3")
        await agent.wait_idle()
        [session] = [s for s in agent.sessions if s.participant_id == "alice-1"]
        [phone_session] = [s for s in agent.sessions if s.participant_id.startswith("sip")]
        [table_session] = [s for s in agent.sessions if s.participant_id == "table"]
        assert table_session.channel is agent.diarized
        # as the realtime channel hands a reply to the room (R5): every audio sink in it
        sinks = [c for c in await agent.kit.channels_in("standup") if isinstance(c, AudioSink)]
        assert agent.voice in sinks and agent.diarized in sinks
        for sink in sinks:
            await sink.play("standup", tone.tobytes(), 24000)
        assert agent.voice.is_playing("standup") and agent.diarized.is_playing("standup")
        assert np.array_equal(await played(reader, len(tone)), tone)
        # what the shared mic heard meanwhile: silenced (held back half a second first)
        await until(lambda: table_session.gated_seconds > 0)
        assert phone_session.echo_gate
        await until(lambda: phone_session.gated_seconds > 0)
        assert not session.echo_gate and session.gated_seconds == 0
        await until(lambda: not agent.reply_playing)
        assert agent.reply_queued_s == pytest.approx(0.5)  # once, not once per sink
    finally:
        await reader.aclose()
        await agent.aclose()
        await player.aclose()
        await phone.aclose()
        await table.aclose()


@pytest.mark.parametrize("who", ["sip", "own microphone", "shared mic cancelling echo"])
async def test_someone_talking_over_the_reply_stops_it(
    deepgram: DeepgramTestServer, who: str
) -> None:
    """A SIP participant, a person on their own microphone, or a shared mic whose track was
    published with echo cancellation (`TF_ECHO_CANCELLATION`) talks over a 6 s reply
    (`server.reply_audio.BargeIn`, as on `chorus serve`'s phone legs; 256 ms for a microphone
    that cancels echo, as the page): the reply queued for the agent's track is dropped and the
    track's own buffer cleared, so the track falls silent well before the reply's end; counted
    once. The phone and the shared mic, gated while the reply played (V9), are heard again at
    once: the half second held before the barge-in is handed on, not silenced."""
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local)
    phone = TrackPlayer("phone")
    caller = {
        "sip": remote_participant("sip_15550100", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP),
        "own microphone": remote_participant("alice-1", "Alice"),
        "shared mic cancelling echo": remote_participant(
            "table", "Table", attributes={"chorus.shared_mic": "true"}),
    }[who]  # fmt: skip
    reply = (np.sin(2 * np.pi * 440 * np.arange(6 * 24000) / 24000) * 8000).astype(np.int16)
    reader = rtc.AudioStream.from_track(track=agent.reply_track, sample_rate=24000,
                                        num_channels=1)
    heard: list[np.ndarray] = []

    async def listen() -> None:  # the agent's track, until 0.5 s of silence after the reply
        async for event in reader:
            heard.append(np.frombuffer(event.frame.data, dtype=np.int16).copy())
            got = np.concatenate(heard)
            voiced = np.flatnonzero(got)
            if len(voiced) and len(got) - voiced[-1] > 12000:
                return

    listening = asyncio.create_task(listen())
    try:
        room.join(caller)
        room.subscribe(caller, phone.track, "TR_1", features=(
            (TF_ECHO_CANCELLATION,) if who.startswith("shared") else ()))
        await agent.wait_idle()
        await agent.voice.play("standup", reply.tobytes(), 24000)
        await until(lambda: agent.reply_playing)
        await phone.play(clip(meeting_pcm(), *ALICE))  # the caller talks over it
        await until(lambda: agent.barge_ins == 1)
        await asyncio.wait_for(listening, 60)
        played = np.concatenate(heard)
        voiced = np.flatnonzero(played)
        assert (voiced[-1] - voiced[0]) / 24000 < 5.0  # of 6 s
        await agent.wait_idle()
        assert agent.barge_ins == 1 and not agent.reply_playing
        [session] = agent.sessions
        # a phone's gate was lifted with what it held: at most the line's noise before the
        # caller's first word (0.6 s into the clip) was silenced, nothing they said
        assert session.echo_gate == (who != "own microphone") and session.gated_seconds < 0.6
    finally:
        listening.cancel()
        await reader.aclose()
        await agent.aclose()
        await phone.aclose()


@pytest.mark.parametrize("case", ["heard whole", "talked over", "no audio"])
async def test_the_agent_s_spoken_reply_is_captioned_as_the_agent_as_it_is_heard(
    deepgram: DeepgramTestServer, case: str
) -> None:
    """The realtime model's reply (the real `openai` client against the local OpenAI Realtime
    server, which sends the whole reply at once) is captioned as livekit-agents captions an
    agent's speech: `lk.transcription`, sent as the agent, naming the reply track, one segment
    per response. While the reply plays the caption grows with the words heard so far, never a
    word ahead; then it is final as the room keeps the reply: whole, or, talked over, cut at
    the word the barge-in fell in (`…`, `chorus.interrupted`). A reply with no audio is
    captioned final at once. Before, the people in the room saw no text of what the agent
    said."""
    reply = ("Happy to help, Alice. The release is on track for Friday, the notes are written, "
             "and the last two fixes are in review with the team this afternoon.")
    talked_over = case == "talked over"
    seconds = 0.0 if case == "no audio" else 6.0
    async with OpenAIRealtimeServer(replies=[reply], reply_audio_seconds=seconds) as model:
        config = ServerConfig.model_validate({
            **config_for(deepgram.url).model_dump(exclude_unset=True),
            "realtime": {"provider": "openai", "base_url": model.base_url, "api_key": "test"},
        })
        local = RecordingLocalParticipant()
        room = FakeRoom("standup", local)
        with fake_job_context(room=room) as ctx:
            agent = await run_job(ctx, config, LiveKitConfig(), local=local)
        player = TrackPlayer("alice")
        alice = remote_participant("alice-1", "Alice")

        def captions() -> list[RecordedWriter]:
            return [w for w in local.streams if w.topic == "lk.transcription" and w.closed
                    and w.attributes.get("lk.transcribed_track_id") == "TR_chorus-reply"]

        def final() -> bool:
            return any(w.attributes["lk.transcription_final"] == "true" for w in captions())

        try:
            room.join(alice)
            room.subscribe(alice, player.track, "TR_alice")
            await agent.wait_idle()
            await player.play(clip(meeting_pcm(), *ALICE))  # the only voice: the model answers
            if seconds:
                await until(lambda: len(captions()) >= 2)  # two words heard, at least
                assert not final()  # nothing final while the reply plays
            if talked_over:
                await player.play(clip(meeting_pcm(), *BOB))  # she talks over it
                await until(lambda: agent.barge_ins == 1)
            await until(final)
            [event] = [e for e in await agent.kit.list_events("standup")
                       if e.metadata.get("ai_response")][:1]
            ours = [w for w in captions()
                    if w.attributes["lk.segment_id"] == event.metadata["response_id"]]
            *growing, last = ours
            assert all(w.sender_identity is None for w in ours)  # the agent itself
            assert [w.attributes["lk.transcription_final"] for w in ours] == (
                ["false"] * len(growing) + ["true"])
            assert last.attributes["chorus.event_id"] == event.id
            label = await agent.kit.label_for("standup", event)
            assert {w.attributes["chorus.speaker"] for w in ours} == {label}  # growing ones too
            assert last.text == event.text  # as the room keeps it
            heard = last.text.removesuffix("…")
            for before, after in itertools.pairwise([w.text for w in growing] + [heard]):
                assert after.startswith(before) and len(after) >= len(before)
            if not talked_over:
                assert last.text == reply and "chorus.interrupted" not in last.attributes
                assert bool(growing) == bool(seconds)  # no audio: final at once
                return
            assert last.attributes["chorus.interrupted"] == "true"
            assert last.text.endswith("…") and reply.startswith(heard) and len(heard) < len(reply)
            assert all(w.text != reply for w in ours)  # the unheard words were never shown
        finally:
            await agent.aclose()
            await player.aclose()


async def test_the_room_is_told_when_the_agent_s_model_is_away_and_back(
    deepgram: DeepgramTestServer,
) -> None:
    """The realtime model's key is revoked while the agent is in the room: its reconnect is
    refused (HTTP 401), and the room is told once, on `chorus.assistant` as the agent (the text
    is `chorus serve`'s `assistant_status`; `chorus.assistant` and `chorus.reason` say the
    same), never with the provider's words; once the key is good again (the session retries
    after 5 s), that it is back."""
    async with OpenAIRealtimeServer(api_key="sk-test") as model:
        config = ServerConfig.model_validate({
            **config_for(deepgram.url).model_dump(exclude_unset=True),
            "realtime": {"provider": "openai", "base_url": model.base_url, "api_key": "sk-test"},
        })  # fmt: skip
        local = RecordingLocalParticipant()
        with fake_job_context(room=FakeRoom("standup", local)) as ctx:
            agent = await run_job(ctx, config, LiveKitConfig(), local=local)

        def told() -> list[RecordedWriter]:
            return [w for w in local.streams if w.topic == "chorus.assistant" and w.closed]

        try:
            await until(lambda: len(model.connections) == 1)
            model.api_key = "sk-revoked"
            model.drop()
            await until(lambda: len(told()) == 1)
            model.api_key = "sk-test"
            await until(lambda: len(told()) == 2, 60)
            away, back = told()
            assert [w.attributes["chorus.assistant"] for w in (away, back)] == [
                "unavailable", "available"]  # fmt: skip
            assert away.attributes["chorus.reason"] == "openai refused the session, HTTP 401"
            assert "chorus.reason" not in back.attributes
            assert all(w.sender_identity is None for w in (away, back))  # the agent itself
            message = parse_server_message(away.text)
            assert isinstance(message, AssistantStatusMessage)
            assert (message.room, message.status) == ("standup", "unavailable")
        finally:
            await agent.aclose()


async def test_who_may_talk_over_the_reply_and_by_which_rule() -> None:
    """A phone: the phone rule, with the double-talk check against the reply track; a person's
    own microphone: the rule for a microphone that cancels echo; a shared mic: that rule only
    when its track was published with echo cancellation, else none (its loudspeaker plays the
    reply into it as loud as a person)."""
    reply = ReplyEnvelope()
    room = FakeRoom("standup", RecordingLocalParticipant())
    table = remote_participant("table", "Table", attributes={"chorus.shared_mic": "true"})
    player = TrackPlayer("table")
    room.subscribe(table, player.track, "TR_1", features=(TF_NOISE_SUPPRESSION,))
    room.subscribe(table, player.track, "TR_2", features=(TF_ECHO_CANCELLATION,))
    await player.aclose()
    assert not echo_cancelled(table, "TR_1") and echo_cancelled(table, "TR_2")
    assert not echo_cancelled(table, "TR_9")  # (no such publication)
    shared = speaker_of(table)
    assert _barge_in_rule(shared, reply, cancels_echo=False) is None
    cancelling = _barge_in_rule(shared, reply, cancels_echo=True)
    assert cancelling is not None and cancelling.hold_s == ECHO_CANCELLED_BARGE_IN_S
    phone = _barge_in_rule(speaker_of(remote_participant(
        "sip_1", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP)), reply, cancels_echo=False)
    assert phone is not None and phone.narrowband and phone.reply is reply
    own = _barge_in_rule(speaker_of(remote_participant("alice-1", "Alice")), reply, False)
    assert own is not None and own.hold_s == ECHO_CANCELLED_BARGE_IN_S


async def test_a_sip_caller_s_echo_of_the_reply_does_not_stop_it(
    deepgram: DeepgramTestServer,
) -> None:
    """A SIP participant whose phone sends the agent's spoken reply back 20 dB down: over the
    barge-in floor, and speech. Measured against the reply track as it played
    (`ChorusRoomAgent.reply_envelope`, the double-talk check of `BargeIn`), it is no louder
    than an echo can be: nothing stops the reply and the phone stays gated (V9). Without the
    check the echo stopped the reply, as the caller talking over it does (the test above)."""
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local)
    phone = TrackPlayer("phone")
    caller = remote_participant("sip_15550100", kind=rtc.ParticipantKind.PARTICIPANT_KIND_SIP)
    speech = (clip(meeting_pcm(), 41.41, 47.41) / 32768).astype(np.float32)  # a later turn
    speech = (speech * 10 ** ((-14 - level_dbfs(speech)) / 20)).astype(np.float32)  # −14 dBFS
    reply = float_to_pcm16(resample(speech, 16000, 24000))
    echo = resample(resample(speech[: 4 * 16000], 16000, 8000), 8000, 16000) * np.float32(0.1)
    try:
        room.join(caller)
        room.subscribe(caller, phone.track, "TR_1")
        await agent.wait_idle()
        await agent.voice.play("standup", reply, 24000)
        await until(lambda: agent.reply_playing)
        await phone.play(np.frombuffer(float_to_pcm16(echo), np.int16))  # as it plays
        await until(lambda: not agent.reply_playing)
        await agent.wait_idle()
        [session] = agent.sessions
        assert agent.barge_ins == 0
        assert session.gated_seconds > 3.0  # the echo never reached the STT
        assert agent.reply_envelope.loudest() is not None  # (the reply's last second)
    finally:
        await agent.aclose()
        await phone.aclose()


async def test_a_shared_mic_is_split_by_the_diarization_stage_when_the_stt_does_not_label(
) -> None:
    """`stt.diarize = false`: the STT hears one voice, so the shared mic's track gets a voice
    channel with its own embedded stage (pooled and reset for the next shared-mic track)."""
    meeting = clip_words(MeetingWords.from_meeting(MEETING_DIR), 0.0, 15.7)
    for i, word in enumerate(meeting.words):
        meeting.words[i] = dataclasses.replace(word, speaker=0)
    async with DeepgramTestServer(RecordingsWords([meeting])) as server:
        config = config_for(server.url)
        config.stt.diarize = False
        local = RecordingLocalParticipant()
        room = FakeRoom("standup", local)
        with fake_job_context(room=room) as ctx:
            agent = await run_job(ctx, config, LiveKitConfig(shared_mic_names=["conference*"]),
                                  local=local)
        player = TrackPlayer("table")
        table = remote_participant("conference-room", "Conference room")
        try:
            room.join(table)
            room.subscribe(table, player.track, "TR_table")
            await agent.wait_idle()
            [session] = agent.sessions
            assert session.channel is not agent.voice and session.channel.pipeline_speakers
            await player.play(clip(meeting_pcm(), 0.0, 15.7))
            await heard(agent, "conference-room", 15.7 + 0.5)
            room.leave(table)
            await agent.wait_idle()
            events = await voice_events(agent)
            names = [e.metadata.get("sender_name") for e in events]
            assert [e.text for e in events] == [meeting_text(s, e) for s, e in
                                                 ((0, 4.45), (4.45, 9.05), (9.05, 12.9), (12.9, 15.7))]
            assert names[0] == names[3] and len({names[0], names[1], names[2]}) == 3
            assert [s.attributes["chorus.speaker"] for s in local.streams] == names
            assert session.stage is not None
            assert agent._pool == [session.stage.stage]  # back in the room's pool for the next mic
        finally:
            await agent.aclose()
            await player.aclose()


async def test_audio_mode_commits_each_turn_s_own_audio_before_its_line(
    deepgram: DeepgramTestServer,
) -> None:
    """`realtime.audio = true`: each track's audio goes to the realtime channel under its session
    id; every turn is committed to the model with the span of its own track's audio (R3)."""
    config = config_for(deepgram.url)
    config.realtime.audio = True
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config, LiveKitConfig(), local=local)
    players = {"alice-1": TrackPlayer("a"), "bob-1": TrackPlayer("b")}
    clips = {"alice-1": clip(meeting_pcm(), *ALICE), "bob-1": clip(meeting_pcm(), *BOB)}
    try:
        for identity, name in (("alice-1", "Alice"), ("bob-1", "Bob")):
            participant = remote_participant(identity, name)
            room.join(participant)
            room.subscribe(participant, players[identity].track, f"TR_{identity}")
        await agent.wait_idle()
        await asyncio.gather(*(players[i].play(pcm) for i, pcm in clips.items()))
        for identity, pcm in clips.items():
            await heard(agent, identity, len(pcm) / RATE + 0.5)
        for participant in list(room.remote_participants.values()):
            room.leave(participant)
        await agent.wait_idle()
        assert agent.realtime is not None
        await agent.realtime.wait_idle("standup")
        events = await voice_events(agent)
        assert sorted([await agent.kit.label_for("standup", e) for e in events]) == ["Alice", "Bob"]
        recorded = agent.realtime.session_for("standup").events  # type: ignore[attr-defined]
        kinds = [e["type"] for e in recorded]
        commits = [i for i, kind in enumerate(kinds) if kind == "input_audio_buffer.commit"]
        assert len(commits) == len(events) == 2
        start = 0
        for event, commit in zip(events, commits, strict=True):
            # the record keeps each append's size, not its payload (bounded memory, issue 10.3)
            appended = sum(e["audio_bytes"] for e in recorded[start:commit]
                           if e["type"] == "input_audio_buffer.append")
            seconds = appended / 2 / 24000
            assert abs(seconds - (event.metadata["end"] - event.metadata["start"])) < 0.05
            start = commit + 1
    finally:
        await agent.aclose()
        for player in players.values():
            await player.aclose()


@contextlib.asynccontextmanager
async def agent_without_realtime(
    stt_url: str,
) -> AsyncIterator[tuple[ChorusRoomAgent, RecordingLocalParticipant]]:
    """A job's agent in room "standup" with `[realtime] provider = "none"`, closed after."""
    config = config_for(stt_url)
    config.realtime.provider = "none"
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config, LiveKitConfig(), local=local)
    try:
        yield agent, local
    finally:
        await agent.aclose()


async def test_without_a_realtime_model_no_reply_track_is_published(
    deepgram: DeepgramTestServer,
) -> None:
    async with agent_without_realtime(deepgram.url) as (agent, local):
        assert agent.realtime is None and local.tracks == []


async def test_tracks_subscribed_before_the_job_started_are_taken(
    deepgram: DeepgramTestServer,
) -> None:
    """LiveKit may subscribe tracks while the job is still loading its models: the agent takes
    the tracks already there when it starts, and a repeated event for one opens nothing twice."""
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    player = TrackPlayer("early")
    early = remote_participant("early-1", "Erin")
    room.join(early)
    publication = room.subscribe(early, player.track, "TR_early")
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config_for(deepgram.url), LiveKitConfig(), local=local)
    try:
        room.emit("track_subscribed", player.track, publication, early)
        await agent.wait_idle()
        assert [(s.participant_id, s.id.split("-")[0]) for s in agent.sessions] == [
            ("early-1", "TR_early")]
    finally:
        await agent.aclose()
        await player.aclose()


async def test_a_corrected_turn_is_published_again_under_its_segment_id(
    deepgram: DeepgramTestServer,
) -> None:
    """An early turn the final result corrected (`RoomKit.update_event`) is published again with
    the same `lk.segment_id`, which LiveKit's clients show in the first version's place."""
    from rooms import TextChannel

    async with agent_without_realtime(deepgram.url) as (agent, _):
        voice = TextChannel("voice-like")
        agent.kit.register_channel(voice)
        await agent.kit.attach_channel("standup", voice.channel_id)
        metadata = {"source": "voice", "sender_name": "Speaker A", "speaker_label": "Speaker A"}
        early = await agent.kit.post_event("standup", voice.channel_id,
                                           TextContent(body="Write."), metadata=metadata)
        assert early is not None
        await agent.kit.update_event("standup", early.id, content=TextContent(body="Right."))
        await agent.wait_idle()
        assert [(p.text, p.attributes["lk.segment_id"]) for p in agent.published] == [
            ("Write.", early.id), ("Right.", early.id)]


async def test_the_second_pass_corrects_a_caption_under_its_segment_id() -> None:
    """`[stt] second_pass` in the job's configuration (issue 23, item 3): the real tiny.en
    re-decodes a turn the first pass misheard, and the corrected turn is published again under
    the first caption's `lk.segment_id`."""
    meeting = MeetingWords.from_meeting(MEETING_DIR)
    said = clip_words(meeting, *ALICE)
    wrong = ["lorem", "ipsum", "dolor", "sit", "amet"]
    misheard = MeetingWords(said.reference, [
        dataclasses.replace(w, word=wrong[i % len(wrong)], punctuated_word=wrong[i % len(wrong)])
        for i, w in enumerate(said.words)], RATE)
    async with DeepgramTestServer(RecordingsWords([misheard])) as server:
        config = config_for(server.url)
        config.realtime.provider = "none"
        config.stt.second_pass = "tiny.en"
        local = RecordingLocalParticipant()
        room = FakeRoom("standup", local)
        with fake_job_context(room=room) as ctx:
            agent = await run_job(ctx, config, LiveKitConfig(), local=local)
        alice = remote_participant("alice-1", "Alice")
        player = TrackPlayer("alice-1")
        pcm = clip(meeting_pcm(), *ALICE)
        try:
            assert agent.second_pass is not None
            room.join(alice)
            room.subscribe(alice, player.track, "TR_alice-1")
            await agent.wait_idle()
            await player.play(pcm)
            await heard(agent, "alice-1", len(pcm) / RATE + 0.5)
            room.leave(alice)  # the session ends: its turns' second passes are waited for
            await agent.wait_idle()
            [event] = await voice_events(agent)
            assert event.metadata["second_pass"] is True
            first, fixed = agent.published
            assert first.attributes["lk.segment_id"] == fixed.attributes["lk.segment_id"] == event.id
            assert set(first.text.split()) <= set(wrong)
            reference = {w.strip(".,?!").lower() for w in meeting_text(*ALICE).split()}
            heard_words = [w.strip(".,?!").lower() for w in fixed.text.split()]
            assert sum(w in reference for w in heard_words) >= 0.7 * len(reference), fixed.text
        finally:
            await agent.aclose()
            await player.aclose()
