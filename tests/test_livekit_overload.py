"""Issue 31 in the LiveKit worker: a `chorus agent` job degrades exactly as `chorus serve` does
when a shared mic's diarization stage falls behind — it stretches the track's step, takes the
track off the stage (its turns take the STT's labels), runs a shared-mic track subscribed
meanwhile without a stage, and puts the track back once the stage keeps up; the room hears each
change on `chorus.diarization`.

The job runs as in `test_livekit_worker.py` (`run_job` inside livekit-agents' `fake_job_context`,
a never-connected `rtc.Room` emitting real events, real LiveKit audio tracks, the real Deepgram
client against the local Deepgram-protocol server, which labels the meeting's two voices), with
the `[diarizer]` overload keys of `test_server_overload.py` and its scripted stage
(`GatedStage`: it answers only once the test lets it), so "the stage is slow" is an event the
test controls. A LiveKit audio stream delivers silence before its source plays, in real time:
with the stage held, the track's lag grows with that silence until the job acts; every wait is
on what the job publishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import pytest
from livekit.agents.testing import fake_job_context

from livekit_worker.config import LiveKitConfig
from livekit_worker.room_agent import NOT_ADMITTED, TOPIC_DIARIZATION, ChorusRoomAgent
from livekit_worker.worker import run_job
from server.config import ServerConfig
from tests.livekit_helpers import (
    MEETING_DIR,
    FakeRoom,
    RecordedWriter,
    RecordingLocalParticipant,
    RecordingsWords,
    TrackPlayer,
    clip,
    clip_words,
    meeting_pcm,
    remote_participant,
)
from tests.test_livekit_worker import ALICE, BOB, config_for, heard, meeting_text
from tests.test_server_overload import GatedStage
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

TALK = (ALICE[0], BOB[1])  # Alice, then Bob: the STT labels them Speaker A and Speaker B
OVERLOAD = {"stretch_lag_s": 1.0, "fallback_lag_s": 2.0, "max_lag_s": 10.0,
            "fallback_every_s": 0.0, "recover_lag_s": 0.5, "recover_after_s": 3600.0,
            "overload_check_s": 0.0}
"""No track comes back on its own: with no stream left on the stage the policy's recovery test
holds at once, so a track that fell back would return at the next check, a race with what the
test reads; the tests of recovery allow it (`allow_recovery`)."""


def allow_recovery(job: Job) -> None:
    """From now on a track that fell back returns once the stage keeps up (at once)."""
    policy = job.agent.overload
    policy.bounds = replace(policy.bounds, recover_after_s=0.0)


class StatusRoom(RecordingLocalParticipant):
    """Records what the job publishes, and lets a test wait for a track's diarization status."""

    def __init__(self) -> None:
        super().__init__()
        self._heard: defaultdict[tuple[str, str], asyncio.Event] = defaultdict(asyncio.Event)

    async def stream_text(
        self,
        *,
        topic: str = "",
        attributes: dict[str, str] | None = None,
        sender_identity: str | None = None,
    ) -> RecordedWriter:
        writer = await super().stream_text(topic=topic, attributes=attributes,
                                           sender_identity=sender_identity)
        if topic == TOPIC_DIARIZATION:
            key = (writer.attributes["lk.transcribed_track_id"],
                   writer.attributes["chorus.diarization"])
            self._heard[key].set()
        return writer

    async def status(self, track_sid: str, status: str) -> RecordedWriter:
        """The track's `status` (`degraded`, `recovered`) once the job has published it."""
        async with asyncio.timeout(60):  # a failure bound: the job acts on the lag it measures
            await self._heard[(track_sid, status)].wait()
        [writer] = [w for w in self.statuses(track_sid) if w.attributes["chorus.diarization"] == status]
        return writer

    def statuses(self, track_sid: str) -> list[RecordedWriter]:
        return [w for w in self.streams if w.topic == TOPIC_DIARIZATION
                and w.attributes.get("lk.transcribed_track_id") == track_sid]

    def captions(self, identity: str) -> list[RecordedWriter]:
        return [w for w in self.streams
                if w.topic == "lk.transcription" and w.sender_identity == identity]


@dataclass
class Job:
    agent: ChorusRoomAgent
    room: FakeRoom
    local: StatusRoom
    stages: list[GatedStage]
    players: list[TrackPlayer] = field(default_factory=list)

    async def shared_mic(self, identity: str) -> TrackPlayer:
        """A shared-mic participant joins with one track (`TR_<identity>`), opened by the job."""
        player = TrackPlayer(identity)
        self.players.append(player)
        participant = remote_participant(identity, identity,
                                         attributes={"chorus.shared_mic": "true"})
        self.room.join(participant)
        self.room.subscribe(participant, player.track, f"TR_{identity}")
        await self.agent.wait_idle()
        return player

    async def talk(self, player: TrackPlayer, identity: str) -> None:
        """Alice then Bob on the track, all of it heard, then the participant leaves."""
        pcm = clip(meeting_pcm(), *TALK)
        await player.play(pcm)
        await heard(self.agent, identity, len(pcm) / 16000 + 0.5)
        self.room.leave(self.room.remote_participants[identity])
        await self.agent.wait_idle()


@pytest.fixture
async def job() -> AsyncIterator[Job]:
    words = clip_words(MeetingWords.from_meeting(MEETING_DIR), *TALK)
    stages: list[GatedStage] = []

    def build_stage() -> GatedStage:
        stages.append(GatedStage())
        return stages[-1]

    async with DeepgramTestServer(RecordingsWords([words])) as deepgram:
        config = config_for(deepgram.url)
        data = config.model_dump()
        data["realtime"]["provider"] = "none"
        data["diarizer"] = {"kind": "none", **OVERLOAD}
        local = StatusRoom()
        room = FakeRoom("standup", local)
        with fake_job_context(room=room) as ctx:
            agent = await run_job(ctx, ServerConfig.model_validate(data), LiveKitConfig(),
                                  local=local, build_stage=build_stage)
        state = Job(agent, room, local, stages)
        try:
            yield state
        finally:
            for stage in stages:
                stage.gate.set()
            with contextlib.suppress(Exception):
                await agent.aclose()
            for player in state.players:
                await player.aclose()


async def degraded_table(job: Job) -> RecordedWriter:
    """The table mic's track opens on a stage that then stops answering: the job stretches its
    step, then takes it off the stage; the room's `degraded` status."""
    await job.shared_mic("table")
    [stage] = job.stages
    [session] = job.agent.sessions
    assert session.stage is not None and session.on_stage
    stage.gate.clear()  # the stage stops answering: the track's lag grows with its audio
    status = await job.local.status("TR_table", "degraded")
    assert session.stage.stretch_factor == 2.0 and not session.on_stage
    counts = job.agent.overload.load().counts
    assert (counts.stretches, counts.fallbacks) == (1, 1)
    assert not job.agent.overload.admitting
    return status


async def test_a_track_whose_stage_falls_behind_is_stretched_then_takes_the_stt_labels(
    job: Job,
) -> None:
    status = await degraded_table(job)
    [session] = job.agent.sessions
    assert status.sender_identity == "table"
    assert status.attributes["chorus.speakers"] == "stt"
    assert "behind" in status.attributes["chorus.reason"]
    assert float(status.attributes["chorus.lag_s"]) > 2.0
    message = json.loads(status.text)
    assert message == {"type": "diarization_status", "stream": session.id, "status": "degraded",
                       "speakers": "stt", "reason": status.attributes["chorus.reason"]}
    await job.talk(job.players[0], "table")
    # the stage (held) never placed a word: Alice's and Bob's turns carry the STT's labels
    captions = job.local.captions("table")
    labels = [c.attributes["chorus.speaker"] for c in captions]
    assert list(dict.fromkeys(labels)) == ["Speaker A", "Speaker B"]
    for label, span in (("Speaker A", ALICE), ("Speaker B", BOB)):
        assert " ".join(c.text for c in captions if c.attributes["chorus.speaker"] == label) == \
            meeting_text(*span)
    assert job.local.streams.index(status) < job.local.streams.index(captions[0])


async def test_a_shared_mic_subscribed_while_the_stage_sheds_load_runs_without_one(
    job: Job,
) -> None:
    """A job cannot refuse a track as `chorus serve` refuses a stream (4429): the new shared
    mic runs on the STT's labels, the room is told, and the policy counts the refusal."""
    await degraded_table(job)
    player = await job.shared_mic("lounge")
    [lounge] = [s for s in job.agent.sessions if s.participant_id == "lounge"]
    assert lounge.channel is job.agent.voice and lounge.stage is None
    assert job.agent.diarized.catch_up  # a staged track behind its stage skips its backlog
    assert len(job.stages) == 1  # no stage was built for it
    assert job.agent.overload.load().counts.refusals == 1
    status = await job.local.status("TR_lounge", "degraded")
    assert status.sender_identity == "lounge"
    assert status.attributes["chorus.reason"] == NOT_ADMITTED
    assert status.attributes["chorus.speakers"] == "stt"
    assert json.loads(status.text)["stream"] == lounge.id
    await job.talk(player, "lounge")
    captions = job.local.captions("lounge")
    assert list(dict.fromkeys(c.attributes["chorus.speaker"] for c in captions)) == [
        "Speaker A", "Speaker B"]
    assert " ".join(c.text for c in captions) == meeting_text(*TALK)


async def test_a_stage_that_keeps_up_again_takes_the_track_back(job: Job) -> None:
    await degraded_table(job)
    [stage] = job.stages
    [session] = job.agent.sessions
    allow_recovery(job)
    stage.gate.set()  # the stage answers again
    status = await job.local.status("TR_table", "recovered")
    assert session.on_stage and job.agent.overload.admitting
    assert status.attributes == {"lk.transcribed_track_id": "TR_table",
                                 "chorus.diarization": "recovered", "chorus.speakers": "stage"}
    assert json.loads(status.text) == {"type": "diarization_status", "stream": session.id,
                                       "status": "recovered", "speakers": "stage",
                                       "reason": None}
    assert job.agent.overload.load().counts.recoveries == 1
    await job.talk(job.players[0], "table")
    # back on the stage, which hears one voice: Alice and Bob under one label, not the STT's two
    captions = job.local.captions("table")
    assert captions and len({c.attributes["chorus.speaker"] for c in captions}) == 1
    assert " ".join(c.text for c in captions) == meeting_text(*TALK)
    assert stage.resets >= 1 and stage.fed > 0  # reset, then fed afresh
    assert job.local.streams.index(status) < job.local.streams.index(captions[0])


async def test_a_shared_mic_that_opened_without_a_stage_takes_one_once_the_stage_keeps_up(
    job: Job,
) -> None:
    """The track that ran on the STT's labels while the stage shed load is not left there: once
    the policy admits again, its session ends and a new one starts on a stage, and the room
    hears it `recovered`."""
    await degraded_table(job)
    lounge = await job.shared_mic("lounge")
    await job.local.status("TR_lounge", "degraded")
    assert len(job.stages) == 1
    allow_recovery(job)
    job.stages[0].gate.set()  # the table's stage answers again: the policy admits
    await job.local.status("TR_table", "recovered")
    assert job.agent.overload.admitting
    playing = asyncio.create_task(lounge.play(clip(meeting_pcm(), *TALK)))  # the lounge's frames
    try:
        status = await job.local.status("TR_lounge", "recovered")
    finally:
        await playing
    [moved] = [s for s in job.agent.sessions if s.participant_id == "lounge"]
    assert moved.channel is job.agent.diarized and moved.stage is not None
    assert len(job.stages) == 2  # a stage of its own now
    assert status.sender_identity == "lounge" and status.attributes["chorus.speakers"] == "stage"
    assert json.loads(status.text)["stream"] == moved.id
