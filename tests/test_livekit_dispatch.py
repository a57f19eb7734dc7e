"""`chorus agent`'s worker on LiveKit's worker protocol: registration for explicit dispatch as
`chorus`, and the load threshold that sends rooms to other workers.

The server side is `FakeLiveKitServer`, which speaks LiveKit's own protobuf messages on `/agent`;
the worker is the real `AgentServer` that `chorus agent` runs (`build_server`). A job offered here
is only answered, not run: running it needs a LiveKit media server to join the room.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from livekit.agents import AgentServer
from livekit.protocol import agent

from livekit_worker.config import LiveKitConfig
from livekit_worker.worker import build_server
from tests.livekit_helpers import FakeLiveKitServer

KEY = "APItest"
SECRET = "a-test-secret-long-enough-for-hs256-0123456789"


@asynccontextmanager
async def worker(
    livekit: FakeLiveKitServer, config: LiveKitConfig, *, devmode: bool, **options: Any
) -> AsyncIterator[AgentServer]:
    server = build_server(config, ws_url=livekit.url, api_key=KEY, api_secret=SECRET,
                          num_idle_processes=0, port=0, **options)
    task = asyncio.create_task(server.run(devmode=devmode))
    try:
        yield server
    finally:
        await server.aclose()
        await asyncio.wait_for(task, 30)


async def test_the_worker_registers_as_chorus_and_accepts_a_room_dispatched_to_it() -> None:
    async with FakeLiveKitServer(KEY, SECRET) as livekit, \
            worker(livekit, LiveKitConfig(), devmode=True):
        registration = await asyncio.wait_for(livekit.registrations.get(), 60)
        assert registration.agent_name == "chorus"
        assert registration.type == agent.JobType.JT_ROOM
        assert livekit.tokens[0]["iss"] == KEY and livekit.tokens[0]["video"]["agent"] is True
        answer = await asyncio.wait_for(livekit.offer("standup", "chorus"), 60)
        assert answer.job_id == "AJ_1" and answer.available


async def test_above_its_load_threshold_the_worker_declines_new_rooms() -> None:
    config = LiveKitConfig(agent_name="meeting-bot", load_threshold=0.5)
    async with FakeLiveKitServer(KEY, SECRET) as livekit, \
            worker(livekit, config, devmode=False, load_fnc=lambda: 0.9):
        registration = await asyncio.wait_for(livekit.registrations.get(), 60)
        assert registration.agent_name == "meeting-bot"
        answer = await asyncio.wait_for(livekit.offer("standup", "meeting-bot"), 60)
        assert not answer.available
