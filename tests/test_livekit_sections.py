"""`chorus agent` honours every section it shares with `chorus serve` (issue 24.4).

`[diarizer] enroll`, `[store]`, `[chat]` and `[agent]` each mean in a LiveKit job what they mean
in `chorus serve`, and what a job would fail on refuses `chorus agent` at start with one line and
exit status 2. The jobs run as in `test_livekit_worker.py`: a never-connected `rtc.Room` emitting
real events inside livekit-agents' `fake_job_context`, real LiveKit audio tracks, the real
Deepgram client against the local Deepgram-protocol server; the chat model is the `openai` client
against a local Chat Completions server, the ACP agent the real test agent (`tests/acp_agent.py`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from livekit.agents import JobContext
from livekit.agents.testing import fake_job_context
from test_openai_chat import ChatServer

from cli.main import main
from diarization.embedded import EmbeddedStage
from livekit_worker.config import LiveKitConfig
from livekit_worker.room_agent import ChorusRoomAgent
from livekit_worker.worker import run_job
from rooms import SQLiteInUse, SQLiteLock, open_store
from server.config import ServerConfig
from tests.livekit_helpers import (
    MEETING_DIR,
    RATE,
    FakeRoom,
    RecordingLocalParticipant,
    RecordingsWords,
    TrackPlayer,
    clip,
    clip_words,
    meeting_pcm,
    remote_participant,
    until,
)
from tests.test_livekit_worker import ALICE, config_for, heard, meeting_text, voice_events
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

AGENT = Path(__file__).resolve().parent / "acp_agent.py"


@pytest.fixture
async def deepgram() -> AsyncIterator[DeepgramTestServer]:
    source = RecordingsWords([clip_words(MeetingWords.from_meeting(MEETING_DIR), *ALICE)])
    async with DeepgramTestServer(source) as server:
        yield server


@pytest.fixture
def chat_model() -> Iterator[ChatServer]:
    with ChatServer(["Noted."] * 4) as server:
        yield server


def with_sections(url: str, **sections: dict[str, Any]) -> ServerConfig:
    data = config_for(url).model_dump()
    for name, values in sections.items():
        data[name] = {**data[name], **values}
    return ServerConfig.model_validate(data)


async def start_job(
    config: ServerConfig, livekit: LiveKitConfig | None = None, room_name: str = "standup"
) -> tuple[ChorusRoomAgent, FakeRoom, RecordingLocalParticipant, JobContext]:
    """`run_job` for the LiveKit room `room_name`, as livekit-agents starts a job."""
    local = RecordingLocalParticipant()
    room = FakeRoom(room_name, local)
    with fake_job_context(room=room) as ctx:
        agent = await run_job(ctx, config, livekit or LiveKitConfig(), local=local)
    return agent, room, local, ctx


async def end_job(ctx: JobContext) -> None:
    """What livekit-agents does when a job ends: its shutdown callbacks, in order."""
    for callback in ctx._shutdown_callbacks:  # the list `add_shutdown_callback` fills
        await callback("test over")


async def alice_speaks(agent: ChorusRoomAgent, room: FakeRoom) -> None:
    """Alice (one person) says the meeting's first turn and leaves; her turn is committed."""
    alice = remote_participant("alice-1", "Alice")
    player = TrackPlayer("alice-1")
    try:
        room.join(alice)
        room.subscribe(alice, player.track, "TR_alice")
        await agent.wait_idle()
        pcm = clip(meeting_pcm(), *ALICE)
        await player.play(pcm)
        await heard(agent, "alice-1", len(pcm) / RATE + 0.5)
        room.leave(alice)
        await agent.wait_idle()
    finally:
        await player.aclose()


# --- [chat] ------------------------------------------------------------------------------------


async def test_the_chat_model_reads_the_turns_and_answers_on_the_room_chat(
    deepgram: DeepgramTestServer, chat_model: ChatServer
) -> None:
    config = with_sections(
        deepgram.url,
        chat={"provider": "openai", "base_url": chat_model.base_url, "api_key": "t",
              "answer": "always"},
    )  # fmt: skip
    agent, room, local, ctx = await start_job(config)
    try:
        await alice_speaks(agent, room)
        await until(lambda: any(s.topic == "lk.chat" for s in local.streams), limit=30)
        await agent.wait_idle()
    finally:
        await end_job(ctx)
    [request] = chat_model.requests
    assert [m["content"] for m in request["messages"] if m["role"] == "user"] == [
        meeting_text(*ALICE)
    ]
    # the turn on lk.transcription as before, then the model's answer on the room's chat
    assert [(s.topic, s.text) for s in local.streams] == [
        ("lk.transcription", meeting_text(*ALICE)),
        ("lk.chat", "Noted."),
    ]
    reply = local.streams[1]
    assert reply.sender_identity is None and reply.closed  # sent as the agent itself
    assert reply.attributes["chorus.speaker"] == "@chat-ai"  # the attribution label of a model


# --- [agent] -----------------------------------------------------------------------------------


async def test_the_acp_agent_is_prompted_with_the_turns_and_answers_on_the_room_chat(
    deepgram: DeepgramTestServer, tmp_path: Path
) -> None:
    log = tmp_path / "prompts.jsonl"
    config = with_sections(
        deepgram.url, agent={"command": [sys.executable, str(AGENT), str(log)],
                             "cwd": str(tmp_path)},
    )  # fmt: skip
    agent, room, local, ctx = await start_job(config)
    try:
        await alice_speaks(agent, room)
        await until(lambda: any(s.topic == "lk.chat" for s in local.streams), limit=60)
    finally:
        await end_job(ctx)
    prompts = [json.loads(line)["prompt"][0]["text"] for line in log.read_text().splitlines()]
    assert prompts == [meeting_text(*ALICE)]
    assert [(s.topic, s.text) for s in local.streams] == [
        ("lk.transcription", meeting_text(*ALICE)),
        ("lk.chat", "Noted (1)."),
    ]


# --- [store] -----------------------------------------------------------------------------------


async def test_the_room_lives_in_the_configured_store_and_a_later_job_takes_it_up(
    deepgram: DeepgramTestServer, tmp_path: Path
) -> None:
    db = tmp_path / "rooms.db"
    config = with_sections(deepgram.url, store={"url": f"sqlite:///{db}"})
    agent, room, _, ctx = await start_job(config)
    try:
        await alice_speaks(agent, room)
        first = [e.text for e in await voice_events(agent)]
    finally:
        await end_job(ctx)
    assert first == [meeting_text(*ALICE)] and db.exists()
    # the next job for the same LiveKit room (a restart, another dispatch) continues the room
    later, _, _, ctx = await start_job(config)
    try:
        assert [e.text for e in await voice_events(later)] == first
        participants = await later.kit.get_participants("standup")
        assert [p.display_name for p in participants] == ["Alice"]
    finally:
        await end_job(ctx)


async def test_jobs_share_a_sqlite_file_room_by_room_and_a_room_has_one_job(
    deepgram: DeepgramTestServer, tmp_path: Path
) -> None:
    config = with_sections(deepgram.url, store={"url": f"sqlite:///{tmp_path / 'rooms.db'}"})
    agent, room, _, ctx = await start_job(config)
    try:
        # a second job for the same room while the first runs would write its register too
        with pytest.raises(SQLiteInUse, match="room 'standup' of the SQLite file"):
            await start_job(config)
        other, _, _, other_ctx = await start_job(config, room_name="retro")  # another room: alongside
        try:
            assert await other.kit.get_room("retro") is not None
        finally:
            await end_job(other_ctx)
        await alice_speaks(agent, room)
        assert [e.text for e in await voice_events(agent)] == [meeting_text(*ALICE)]
    finally:
        await end_job(ctx)


# --- [diarizer] enroll -------------------------------------------------------------------------


async def test_every_shared_mic_stage_knows_the_enrolled_voices(
    deepgram: DeepgramTestServer, tmp_path: Path
) -> None:
    alice = tmp_path / "alice.wav"
    sf.write(alice, clip(meeting_pcm(), *ALICE).astype(np.float32) / 32768.0, RATE)
    config = with_sections(deepgram.url, stt={"diarize": False},
                           diarizer={"enroll": {"Alice": str(alice)}})
    agent, room, _, ctx = await start_job(config, LiveKitConfig(shared_mic_names=["conference*"]))
    tables = [TrackPlayer(f"table-{n}") for n in (1, 2)]
    try:
        for n, player in enumerate(tables, 1):
            table = remote_participant(f"conference-{n}", f"Conference room {n}")
            room.join(table)
            room.subscribe(table, player.track, f"TR_table{n}")
        await agent.wait_idle()
        stages = [s.stage.stage for s in agent.sessions if s.stage is not None]
        assert len(stages) == 2 and stages[0] is not stages[1]  # one stage per shared mic
        for stage in stages:
            assert isinstance(stage, EmbeddedStage)
            assert list(stage.enrolled) == ["Alice"] and stage.live_speakers == ["Alice"]
    finally:
        await end_job(ctx)
        for player in tables:
            await player.aclose()


# --- what would fail in a job refuses at start --------------------------------------------------


@pytest.fixture
def credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in (("LIVEKIT_URL", "ws://127.0.0.1:9"), ("LIVEKIT_API_KEY", "k"),
                        ("LIVEKIT_API_SECRET", "s")):
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("CHORUS_STORE_URL", raising=False)  # the file names the store


@pytest.mark.usefixtures("credentials")
@pytest.mark.parametrize(
    ("section", "message"),
    [
        ('[diarizer]\nenroll = {Bob = "{tmp}/nope.wav"}\n', "diarizer.enroll.Bob: cannot read"),
        ('[store]\nurl = "sqlite:///{tmp}/chorus.toml/rooms.db"\n', "cannot open the store"),
        ('[store]\nurl = "postgresql://chorus@127.0.0.1:9/chorus"\n', "cannot open the store"),
        ('[store]\nurl = "redis://x"\n', "store.url"),
    ],
)
def test_chorus_agent_refuses_what_a_job_would_fail_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], section: str, message: str
) -> None:
    config = tmp_path / "chorus.toml"
    config.write_text('[stt]\nprovider = "deepgram"\ndeepgram_api_key = "k"\n'
                      + section.replace("{tmp}", str(tmp_path)))
    assert main(["agent", "--config", str(config)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chorus agent: ") and message in err[0], err


@pytest.mark.usefixtures("credentials")
def test_chorus_agent_refuses_a_sqlite_file_another_process_holds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "rooms.db"
    config = tmp_path / "chorus.toml"
    config.write_text('[stt]\nprovider = "deepgram"\ndeepgram_api_key = "k"\n'
                      f'[store]\nurl = "sqlite:///{db}"\n')
    held = SQLiteLock(str(db))  # as a running `chorus serve` holds its file
    try:
        assert main(["agent", "--config", str(config)]) == 2
    finally:
        held.release()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("chorus agent: cannot open the store: "), err
    assert f"the SQLite file {db} is in use by another process" in err[0] and "Postgres" in err[0]


@pytest.mark.usefixtures("credentials")
def test_chorus_agent_holds_its_sqlite_file_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'rooms.db'}"
    config = tmp_path / "chorus.toml"
    config.write_text(f'[stt]\nprovider = "deepgram"\ndeepgram_api_key = "k"\n[store]\nurl = "{url}"\n')
    refused: list[str] = []

    async def serve(livekit: LiveKitConfig, *, devmode: bool) -> None:  # the worker, registered
        with pytest.raises(SQLiteInUse) as whole:
            await open_store(url)  # a `chorus serve` started meanwhile
        refused.append(str(whole.value))
        job = await open_store(url, room="standup")  # its own jobs share the file
        await job.close()

    monkeypatch.setattr("livekit_worker.worker.serve", serve)
    assert main(["agent", "--config", str(config)]) == 0
    assert len(refused) == 1 and "Postgres" in refused[0]
    async def reopen() -> None:
        opened = await open_store(url)  # the worker has stopped: the file is free
        await opened.close()

    asyncio.run(reopen())
