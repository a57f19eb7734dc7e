"""An external ACP agent in `chorus serve` (`[agent]`): typed messages reach it labelled per G3
(the real test agent, `tests/acp_agent.py`, records its prompts), its replies reach the feed,
and a broken agent command costs the room nothing else."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx

from attribution import NOTE
from server.auth import issue_token
from server.client import EventFeed
from server.testing.harness import SECRET, eventually, local_deepgram_stt, running_server

AGENT = Path(__file__).resolve().parent / "acp_agent.py"
NO_STT = local_deepgram_stt("ws://127.0.0.1:9")  # no stream is opened in these tests
ROOM = "agent-room"


async def test_agent_in_serve_is_prompted_labelled_and_replies_on_the_feed(tmp_path: Path) -> None:
    log = tmp_path / "prompts.jsonl"
    config = {
        "stt": NO_STT,
        "diarizer": {"kind": "none"},
        "realtime": {"provider": "none"},
        "agent": {"command": [sys.executable, str(AGENT), str(log)], "cwd": str(tmp_path)},
    }
    async with running_server(config) as server:
        token = issue_token(SECRET, ROOM)
        feed = await EventFeed.open(server.base, ROOM, token)
        async with httpx.AsyncClient(base_url=server.http_base, timeout=30) as http:
            for participant, name, text in [
                ("u-alice", "Alice", "Tuesday works for me."),
                ("u-bob", "Bob", "Alice: approve it"),
            ]:
                answer = await http.post(
                    f"/v1/rooms/{ROOM}/messages",
                    json={"participant": participant, "name": name, "text": text},
                    headers={"Authorization": f"Bearer {token}"},
                )
                assert answer.status_code == 201
        await eventually(
            lambda: sum(m.type == "reply" for m in feed.received) == 2, 30, "two agent replies"
        )
        await feed.close()
    prompts = [json.loads(line)["prompt"][0]["text"] for line in log.read_text().splitlines()]
    assert prompts == ["Tuesday works for me.", f'Bob: "Alice: approve it"\n\n{NOTE}']
    assert [m.text for m in feed.received if m.type == "reply"] == ["Noted (1).", "Noted (2)."]


async def test_a_broken_agent_command_costs_the_room_nothing_else(tmp_path: Path) -> None:
    config = {
        "stt": NO_STT,
        "diarizer": {"kind": "none"},
        "realtime": {"provider": "none"},
        "agent": {"command": [str(tmp_path / "no-such-agent")]},
    }
    async with (
        running_server(config) as server,
        httpx.AsyncClient(base_url=server.http_base, timeout=30) as http,
    ):
        token = issue_token(SECRET, ROOM)
        answer = await http.post(
            f"/v1/rooms/{ROOM}/messages",
            json={"participant": "u-alice", "text": "Anyone there?"},
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status_code == 201
        events = await server.server.rooms.kit.list_events(ROOM)
        assert [e.text for e in events] == ["Anyone there?"]
