"""Issue 27.2 in the LiveKit worker: with `[voices] enabled`, a shared mic's voices are named
from the voice directory as `chorus serve` names them (`server.voices.VoiceDirectory`), and a
suggestion reaches the room on `chorus.speaker_suggestion`.

The job runs as in `test_livekit_worker.py` (`run_job` inside livekit-agents' `fake_job_context`,
a never-connected `rtc.Room` emitting real events, real LiveKit audio tracks, the real Deepgram
client against the local Deepgram-protocol server with `diarize` off, so the embedded stage
splits the shared mic). The audio is the first 17 s of the LibriSpeech voiceprint pair's meeting
B (close render: LS1688 for 8 s, then LS1998); LS1688 is remembered from his enrollment clip in
the job's SQLite store by `chorus voices add`, as a user would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from livekit import rtc
from livekit.agents.testing import fake_job_context

from cli.main import main
from livekit_worker.config import LiveKitConfig
from livekit_worker.room_agent import TOPIC_SUGGESTION, TOPIC_TRANSCRIPTION, ChorusRoomAgent
from livekit_worker.worker import run_job
from server.config import ServerConfig
from server.pipeline import stt_provider
from tests.livekit_helpers import (
    FakeRoom,
    RecordingLocalParticipant,
    RecordingsWords,
    TrackPlayer,
    clip,
    clip_words,
    remote_participant,
    rttm_words,
)
from tests.test_livekit_worker import config_for, heard, voice_events
from voice.testing.deepgram_server import DeepgramTestServer

REPO = Path(__file__).resolve().parents[1]
MEETING = "librispeech-meetings/lsmeet_dev05_vpB_3spk_close"
SPAN = (0.0, 17.0)  # LS1688 0.6–8.6 s, LS1998 9.5–16.6 s


async def remembered_config(
    url: str, tmp_path: Path, shared_fixtures: Path, **voices: float
) -> ServerConfig:
    """`config_for(url)` on a SQLite store where `chorus voices add` remembered LS1688, with the
    directory on (`[voices]` `voices` over its defaults) and the STT not diarizing."""
    toml = tmp_path / "chorus.toml"
    toml.write_text(f'[store]\nurl = "sqlite:///{tmp_path}/chorus.db"\n')
    clip_path = shared_fixtures / "librispeech-meetings/enroll_LS1688_close.flac"
    command = ["voices", "--config", str(toml), "add", "LS1688", str(clip_path)]
    assert await asyncio.to_thread(main, command) == 0  # the command runs its own loop
    data = config_for(url).model_dump()
    data["stt"]["diarize"] = False
    data["store"]["url"] = f"sqlite:///{tmp_path}/chorus.db"
    data["voices"] = {**data["voices"], "enabled": True, **voices}
    return ServerConfig.model_validate(data)


async def shared_mic_plays(
    config: ServerConfig,
    shared_fixtures: Path,
    before_play: Callable[[ChorusRoomAgent], Awaitable[None]] | None = None,
) -> RecordingLocalParticipant:
    """The meeting's span played on a shared mic of a LiveKit room with a `chorus agent` job
    (`before_play` runs once the track's stream is open); what the job published."""
    local = RecordingLocalParticipant()
    room = FakeRoom("standup", local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config, LiveKitConfig(shared_mic_names=["conference*"]),
                              local=local)
    player = TrackPlayer("table")
    table = remote_participant("conference-room", "Conference room")
    words = rttm_words(shared_fixtures / f"{MEETING}.flac", shared_fixtures / f"{MEETING}.rttm")
    try:
        room.join(table)
        room.subscribe(table, player.track, "TR_table")
        await agent.wait_idle()
        assert agent.directory is not None
        if before_play is not None:
            await before_play(agent)
        await player.play(clip(words.reference, *SPAN))
        await heard(agent, "conference-room", SPAN[1] - SPAN[0] + 0.5)
        room.leave(table)
        await agent.wait_idle()
        assert await voice_events(agent)
    finally:
        for callback in ctx._shutdown_callbacks:  # what livekit-agents does when a job ends
            await callback("test over")
        await player.aclose()
    return local


@pytest.fixture(autouse=True)
def store_from_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)  # the tests' default is memory://


@pytest.fixture
async def deepgram(shared_fixtures: Path) -> AsyncIterator[DeepgramTestServer]:
    words = rttm_words(shared_fixtures / f"{MEETING}.flac", shared_fixtures / f"{MEETING}.rttm")
    async with DeepgramTestServer(RecordingsWords([clip_words(words, *SPAN)])) as server:
        yield server


async def test_a_remembered_voice_on_a_shared_mic_is_named_in_the_room(
    deepgram: DeepgramTestServer, tmp_path: Path, shared_fixtures: Path
) -> None:
    config = await remembered_config(deepgram.url, tmp_path, shared_fixtures)
    local = await shared_mic_plays(config, shared_fixtures)
    captions = [w for w in local.streams if w.topic == TOPIC_TRANSCRIPTION]
    speakers = [w.attributes["chorus.speaker"] for w in captions]
    assert speakers[0] == "LS1688"  # his first turn (8 s) already carries his name
    assert speakers.count("LS1688") >= 1 and any(s.startswith("Speaker ") for s in speakers)
    assert all(w.sender_identity == "conference-room" for w in captions)
    assert not [w for w in local.streams if w.topic == TOPIC_SUGGESTION]


async def test_a_likely_voice_keeps_its_letter_and_the_room_hears_the_suggestion(
    deepgram: DeepgramTestServer, tmp_path: Path, shared_fixtures: Path
) -> None:
    config = await remembered_config(deepgram.url, tmp_path, shared_fixtures, auto=0.99, suggest=0.3)
    local = await shared_mic_plays(config, shared_fixtures)
    speakers = [w.attributes["chorus.speaker"] for w in local.streams
                if w.topic == TOPIC_TRANSCRIPTION]
    assert speakers and all(s.startswith("Speaker ") for s in speakers)
    [suggestion] = [w for w in local.streams if w.topic == TOPIC_SUGGESTION]
    message = json.loads(suggestion.text)
    assert message["type"] == "speaker_suggestion" and message["source"] == "voice"
    assert message["name"] == "LS1688" and message["label"] == speakers[0]
    assert message["room"] == "standup" and message["voice"].startswith("voice-")
    assert suggestion.sender_identity == "conference-room"
    assert suggestion.attributes == {"chorus.speaker": speakers[0],
                                     "lk.transcribed_track_id": "TR_table"}
    assert set(message) == {"type", "room", "label", "name", "source", "stream", "voice"}


async def test_a_voice_forgotten_by_another_process_while_the_job_runs_is_named_no_more(
    deepgram: DeepgramTestServer, tmp_path: Path, shared_fixtures: Path
) -> None:
    """The job's stream is open, its stage anchored on LS1688, when `chorus voices forget` (a
    process of its own, beside the job holding the SQLite file) deletes him: the job's directory
    sees it within its `refresh_s`, and none of his turns is named or suggested."""
    config = await remembered_config(deepgram.url, tmp_path, shared_fixtures, refresh_s=0.2)
    forgotten: list[str] = []

    async def forget(agent: ChorusRoomAgent) -> None:
        directory = agent.directory
        assert directory is not None
        [ls1688] = directory.people
        env = {k: v for k, v in os.environ.items() if k != "CHORUS_STORE_URL"}
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "cli", "voices", "--config", str(tmp_path / "chorus.toml"),
            "forget", ls1688.id, cwd=REPO, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        async with asyncio.timeout(120):
            _, err = await process.communicate()
        assert process.returncode == 0, err.decode()
        deadline = time.monotonic() + 30
        while directory.people:  # seen by the running job, without a restart
            assert time.monotonic() < deadline, "the job never saw the forget"
            await asyncio.sleep(0.02)
        forgotten.append(ls1688.id)

    local = await shared_mic_plays(config, shared_fixtures, before_play=forget)
    assert forgotten
    speakers = [w.attributes["chorus.speaker"] for w in local.streams
                if w.topic == TOPIC_TRANSCRIPTION]
    assert speakers and all(s.startswith("Speaker ") for s in speakers)
    assert not [w for w in local.streams if w.topic == TOPIC_SUGGESTION]


class RefusingLocalParticipant(RecordingLocalParticipant):
    """A local participant whose track publication fails (LiveKit refused it)."""

    async def publish_track(self, track: rtc.LocalTrack, options: rtc.TrackPublishOptions) -> Any:
        raise RuntimeError("publishing the reply track was refused")


async def test_a_job_whose_start_fails_leaves_no_watcher_or_pump_running(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's start fails after the voice directory began to follow the store (here: the
    reply track cannot be published): `run_job` gets the error and never an agent to close, so
    the start itself stops the directory's watcher and the publishing pumps, and `run_job`
    closes the STT provider, the channels and the store."""
    data = config_for("ws://127.0.0.1:9").model_dump()  # no track opens: never connected
    data["store"]["url"] = f"sqlite:///{tmp_path}/chorus.db"
    data["voices"] = {**data["voices"], "enabled": True}
    config = ServerConfig.model_validate(data)
    assert config.realtime.provider == "recorder"  # so the reply track is published at start
    room = FakeRoom("standup", RefusingLocalParticipant())
    provider = stt_provider(config)
    closed: list[str] = []
    close_provider = provider.aclose

    async def aclose() -> None:
        closed.append("stt")
        await close_provider()

    monkeypatch.setattr(provider, "aclose", aclose)
    with fake_job_context(room=room) as ctx:
        with pytest.raises(RuntimeError, match="reply track was refused"):
            await run_job(ctx, config, LiveKitConfig(), stt=provider, local=room.fake_local)
    running = [t.get_name() for t in asyncio.all_tasks()
               if t.get_name().startswith("chorus-") and not t.done()]
    assert running == []
    assert closed == ["stt"]  # what the job's shutdown would have closed is closed
