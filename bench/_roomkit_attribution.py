"""The roomkit half of `chorus bench attribution`: the same room, through roomkit 0.109.

Run by the bench as a subprocess with an interpreter that has `roomkit==0.109.0` installed
(Python 3.12: `--roomkit-python PATH`); it prints one JSON object on stdout. Kept free of any
Chorus import, and of any roomkit import at module level, so `chorus bench` can discover the bench
package under the project's own Python without roomkit.

The room: one group text channel (`WebSocketChannel("web")` attached with `group=True`), an
`AIChannel` with roomkit's defaults (a 50-event sliding window) answering with `MockAIProvider`,
three members (Alice, Bob, Carol) added with `add_member`, `answered` turns each answered by the
AI, then `triggers` measured turns. Per measured turn: the CPU and wall time of
`AIChannel._build_context`, and the CPU and wall time from `process_inbound` to the provider's
`generate`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import sys
import time
from typing import Any

SPEAKERS = [("alice", "Alice"), ("bob", "Bob"), ("carol", "Carol")]


def line(n: int) -> str:
    return f"Turn {n}: I think we should ship the release on Thursday, after QA signs off."


async def measure(answered: int, triggers: int) -> dict[str, Any]:
    # Imported by name: this script runs under roomkit's interpreter, never the project's.
    rk: Any = importlib.import_module("roomkit")
    mock: Any = importlib.import_module("roomkit.providers.ai")

    reached: list[tuple[float, float]] = []
    provider = mock.MockAIProvider(responses=["Noted."])
    generate = provider.generate

    async def timed_generate(context: Any, *args: Any, **kwargs: Any) -> Any:
        reached.append((time.process_time(), time.perf_counter()))
        return await generate(context, *args, **kwargs)

    provider.generate = timed_generate
    kit = rk.RoomKit()
    web = rk.WebSocketChannel("web")
    ai = rk.AIChannel("ai", provider=provider)
    builds: list[tuple[float, float]] = []
    original = ai._build_context

    async def timed_build(*args: Any, **kwargs: Any) -> Any:
        cpu, wall = time.process_time(), time.perf_counter()
        result = await original(*args, **kwargs)
        builds.append((time.process_time() - cpu, time.perf_counter() - wall))
        return result

    ai._build_context = timed_build
    kit.register_channel(web)
    kit.register_channel(ai)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    await kit.attach_channel("r", "ai", category=rk.ChannelCategory.INTELLIGENCE)
    for pid, name in SPEAKERS:
        await kit.add_member("r", "web", pid, display_name=name)

    async def say(n: int) -> tuple[float, float]:
        sender = SPEAKERS[n % 3][0]
        cpu, wall = time.process_time(), time.perf_counter()
        result = await kit.process_inbound(
            rk.InboundMessage(
                channel_id="web", sender_id=sender, content=rk.TextContent(body=line(n))
            )
        )
        assert not result.blocked and result.event is not None and result.event.room_id == "r"
        return cpu, wall

    for n in range(answered):
        await say(n)
    events_before = await kit.store.get_event_count("r")
    build_cpu, build_wall, inbound_cpu, inbound_wall = [], [], [], []
    for n in range(answered, answered + triggers):
        builds.clear()
        reached.clear()
        cpu, wall = await say(n)
        build_cpu.append(builds[0][0])
        build_wall.append(builds[0][1])
        inbound_cpu.append(reached[0][0] - cpu)
        inbound_wall.append(reached[0][1] - wall)
    return {
        "events": events_before,
        "build_cpu_s": build_cpu,
        "build_wall_s": build_wall,
        "inbound_to_provider_cpu_s": inbound_cpu,
        "inbound_to_provider_wall_s": inbound_wall,
    }


def main(argv: list[str]) -> int:
    roomkit: Any = importlib.import_module("roomkit")
    answered = [int(a) for a in argv[0].split(",")]
    triggers = int(argv[1])
    out: dict[str, Any] = {"roomkit": roomkit.__version__, "python": sys.version.split()[0], "rooms": []}
    for count in answered:
        out["rooms"].append(asyncio.run(measure(count, triggers)))
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
