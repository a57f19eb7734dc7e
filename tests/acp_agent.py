"""A small ACP agent for the tests, speaking the real protocol through `agent-client-protocol`.

Run as `python tests/acp_agent.py LOG`: every prompt it receives is appended to LOG as one JSON
line (`{"session": …, "prompt": [content blocks as sent on the wire]}`), before it answers, so a
test can assert the exact prompts. It answers in two `agent_message_chunk` updates:
`Noted (N).` for its N-th prompt in that session. A prompt whose text contains `read the room`
makes it read the linked resource with `fs/read_text_file` and answer with what it read; one
containing `log a lot` first writes about 300 kB to stderr; one containing `wait for cancel` answers `Working` and waits until `session/cancel`, then ends the
turn with stop reason `cancelled`; one containing `crash now` makes the process exit at once
(code 3), mid-turn.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

from acp import (
    PROTOCOL_VERSION,
    Agent,
    Client,
    run_agent,
    text_block,
    update_agent_message,
)
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    NewSessionResponse,
    PromptResponse,
    ResourceContentBlock,
    TextContentBlock,
)


class RecordingAgent(Agent):
    def __init__(self, log: Path) -> None:
        self.log = log
        self.client: Client | None = None
        self.prompts: dict[str, int] = {}
        self.cancelled: dict[str, asyncio.Event] = {}

    def on_connect(self, conn: Client) -> None:
        self.client = conn

    async def initialize(
        self,
        protocol_version: int,
        client_capabilities: Any = None,
        client_info: Any = None,
        **kwargs: Any,
    ) -> InitializeResponse:
        return InitializeResponse(
            protocol_version=PROTOCOL_VERSION,
            agent_capabilities=AgentCapabilities(),
            agent_info=Implementation(name="recording-agent", version="1.0"),
        )

    async def new_session(
        self, cwd: str, mcp_servers: Any = None, **kwargs: Any
    ) -> NewSessionResponse:
        session_id = f"sess-{uuid.uuid4().hex[:8]}"
        self.prompts[session_id] = 0
        self.cancelled[session_id] = asyncio.Event()
        return NewSessionResponse(session_id=session_id)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        self.cancelled[session_id].set()

    async def _say(self, session_id: str, text: str) -> None:
        assert self.client is not None
        await self.client.session_update(session_id, update_agent_message(text_block(text)))

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        wire = [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in prompt]
        with self.log.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"session": session_id, "prompt": wire}) + "\n")
        self.prompts[session_id] += 1
        text = "\n".join(b.text for b in prompt if isinstance(b, TextContentBlock))
        if "read the room" in text:
            link = next(b for b in prompt if isinstance(b, ResourceContentBlock))
            assert self.client is not None
            read = await self.client.read_text_file(session_id=session_id, path=link.uri)
            await self._say(session_id, read.content)
            return PromptResponse(stop_reason="end_turn")
        if "log a lot" in text:  # more than a pipe holds: the client must read stderr
            for i in range(4000):
                print(f"debug line {i:05d} " + "x" * 60, file=sys.stderr, flush=True)
        if "crash now" in text:  # the agent process dies mid-turn, as a crashing agent does
            sys.stderr.flush()
            os._exit(3)
        if "wait for cancel" in text:
            self.cancelled[session_id].clear()
            await self._say(session_id, "Working")
            await self.cancelled[session_id].wait()
            return PromptResponse(stop_reason="cancelled")
        await self._say(session_id, "Noted ")
        await self._say(session_id, f"({self.prompts[session_id]}).")
        return PromptResponse(stop_reason="end_turn")


async def main(log: str) -> None:
    await run_agent(RecordingAgent(Path(log)))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
