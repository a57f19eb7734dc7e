"""Attribution: what building a model's context costs as a room grows, beside roomkit 0.109.

The room from issue 14: three speakers (Alice, Bob, Carol, registered participants) on one group
text channel, an `AIChannel` with the default 50-event window answering every turn with
`MockAIProvider`. `--answered` turns are said and answered (200 answered turns make a 400-event
room, 2,000 a 4,000-event one), then `--triggers` measured turns. Per measured turn:

- the CPU time (`time.process_time`) and wall time of `AIChannel.build_context`;
- the CPU and wall time from `process_inbound` being called to the provider's `generate` (the
  commit under the room lock, delivery, memory, attribution and rendering).

The same room through roomkit 0.109 runs beside it, in one run, when `--roomkit-python PATH`
names an interpreter with `roomkit==0.109.0` installed (roomkit needs Python 3.12; make a venv
for it outside the repo). Its half is `bench/_roomkit_attribution.py`, run as a subprocess.

Prints medians and 95th percentiles; `--json` writes every sample. CPU time is the figure to read
on a shared machine: wall time includes whatever else the machine was doing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from models import AIContext, InboundMessage, TextContent
from rooms import (
    AIChannel,
    AIResponse,
    MockAIProvider,
    RoomContext,
    RoomKit,
    RoomStore,
    TextChannel,
)
from rooms.sqlite import SQLiteStore

ROOMKIT_HALF = Path(__file__).with_name("_roomkit_attribution.py")
SPEAKERS = [("alice", "Alice"), ("bob", "Bob"), ("carol", "Carol")]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--answered", default="200,2000",
        help="answered turns before measuring, one room per value (default 200,2000: "
             "400- and 4,000-event rooms)",
    )
    parser.add_argument("--triggers", type=int, default=20, help="measured turns per room")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory",
                        help="Chorus's store (sqlite: a file in a temporary directory)")
    parser.add_argument("--roomkit-python", default=None,
                        help="a Python with roomkit==0.109.0 installed: runs the same room "
                             "through roomkit beside Chorus")
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")


def line(n: int) -> str:
    """What turn `n` says (the roomkit half says the same)."""
    return f"Turn {n}: I think we should ship the release on Thursday, after QA signs off."


class _TimingProvider(MockAIProvider):
    def __init__(self) -> None:
        super().__init__(["Noted."])
        self.reached: list[tuple[float, float]] = []

    async def generate(self, context: AIContext) -> AIResponse:
        self.reached.append((time.process_time(), time.perf_counter()))
        self.calls.clear()  # keep no history: the bench measures the room, not the mock
        return AIResponse(text="Noted.")


class _TimedAIChannel(AIChannel):
    def __init__(self, provider: _TimingProvider) -> None:
        super().__init__("ai", provider=provider)
        self.builds: list[tuple[float, float]] = []

    async def build_context(self, trigger: Any, ctx: RoomContext) -> AIContext:
        cpu, wall = time.process_time(), time.perf_counter()
        context = await super().build_context(trigger, ctx)
        self.builds.append((time.process_time() - cpu, time.perf_counter() - wall))
        return context


async def measure_chorus(answered: int, triggers: int, store: RoomStore) -> dict[str, Any]:
    provider = _TimingProvider()
    ai = _TimedAIChannel(provider)
    kit = RoomKit(store=store)
    kit.register_channel(TextChannel("web"))
    kit.register_channel(ai)
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    await kit.attach_channel("r", "ai")
    for pid, name in SPEAKERS:
        await kit.ensure_participant("r", "web", pid, display_name=name)

    async def say(n: int) -> tuple[float, float]:
        message = InboundMessage(
            channel_id="web", sender_id=SPEAKERS[n % 3][0], content=TextContent(body=line(n))
        )
        cpu, wall = time.process_time(), time.perf_counter()
        result = await kit.process_inbound(message)
        assert result.event is not None and result.room_id == "r"
        return cpu, wall

    for n in range(answered):
        await say(n)
    events = len(await store.list_events("r"))
    samples: dict[str, list[float]] = {
        "build_cpu_s": [], "build_wall_s": [],
        "inbound_to_provider_cpu_s": [], "inbound_to_provider_wall_s": [],
    }
    for n in range(answered, answered + triggers):
        ai.builds.clear()
        provider.reached.clear()
        cpu, wall = await say(n)
        samples["build_cpu_s"].append(ai.builds[0][0])
        samples["build_wall_s"].append(ai.builds[0][1])
        samples["inbound_to_provider_cpu_s"].append(provider.reached[0][0] - cpu)
        samples["inbound_to_provider_wall_s"].append(provider.reached[0][1] - wall)
    return {"events": events, **samples}


async def _chorus_rooms(answered: list[int], triggers: int, store_kind: str) -> list[dict[str, Any]]:
    rooms = []
    with tempfile.TemporaryDirectory(prefix="chorus-bench-") as tmp:
        for i, count in enumerate(answered):
            store: RoomStore
            if store_kind == "sqlite":
                sqlite = await SQLiteStore.open(Path(tmp) / f"room{i}.db")
                try:
                    rooms.append(await measure_chorus(count, triggers, sqlite))
                finally:
                    await sqlite.close()
            else:
                from rooms import InMemoryStore

                store = InMemoryStore()
                rooms.append(await measure_chorus(count, triggers, store))
    return rooms


def roomkit_rooms(python: str, answered: list[int], triggers: int) -> dict[str, Any]:
    """Runs the roomkit half under `python`; its JSON."""
    done = subprocess.run(
        [python, str(ROOMKIT_HALF), ",".join(str(a) for a in answered), str(triggers)],
        capture_output=True, text=True, check=False,
        cwd=tempfile.gettempdir(), env={**os.environ, "PYTHONPATH": ""},
    )
    if done.returncode != 0:
        raise RuntimeError(f"the roomkit half failed ({python}):\n{done.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if q == 0.5:
        return statistics.median(ordered) * 1e3
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1e3


def summary(room: dict[str, Any]) -> dict[str, float]:
    return {
        f"{key[:-2]}_{name}_ms": _ms(room[key], q)
        for key in ("build_cpu_s", "build_wall_s", "inbound_to_provider_cpu_s", "inbound_to_provider_wall_s")
        for name, q in (("p50", 0.5), ("p95", 0.95))
    }


def run(args: argparse.Namespace) -> int:
    answered = [int(a) for a in str(args.answered).split(",") if a.strip()]
    if not answered or min(answered) < 1 or args.triggers < 1:
        print("chorus bench attribution: --answered and --triggers must be positive", file=sys.stderr)
        return 2
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    chorus = asyncio.run(_chorus_rooms(answered, args.triggers, args.store))
    roomkit: dict[str, Any] | None = None
    if args.roomkit_python:
        roomkit = roomkit_rooms(args.roomkit_python, answered, args.triggers)
    print(f"attribution bench: {args.triggers} measured triggers per room, window 50, "
          f"Chorus store: {args.store}; medians (p95) in ms; CPU = process time")
    header = f"{'':>10} {'events':>7} {'build CPU':>16} {'build wall':>16} {'inbound→provider CPU':>22}"
    print(header)
    for label, rooms in (("chorus", chorus), ("roomkit", roomkit["rooms"] if roomkit else None)):
        if rooms is None:
            print(f"{label:>10}  skipped: no --roomkit-python given (a Python with roomkit==0.109.0)")
            continue
        for room in rooms:
            s = summary(room)
            print(f"{label:>10} {room['events']:>7} "
                  f"{s['build_cpu_p50_ms']:>8.3f} ({s['build_cpu_p95_ms']:.3f}) "
                  f"{s['build_wall_p50_ms']:>8.3f} ({s['build_wall_p95_ms']:.3f}) "
                  f"{s['inbound_to_provider_cpu_p50_ms']:>12.3f} ({s['inbound_to_provider_cpu_p95_ms']:.3f})")
    if len(chorus) >= 2:
        first, last = summary(chorus[0]), summary(chorus[-1])
        print(f"chorus: build CPU at {chorus[-1]['events']} events / at {chorus[0]['events']} events: "
              f"{last['build_cpu_p50_ms'] / first['build_cpu_p50_ms']:.2f}×")
    if roomkit:
        for ours, theirs in zip(chorus, roomkit["rooms"], strict=False):
            ratio = summary(theirs)["build_cpu_p50_ms"] / summary(ours)["build_cpu_p50_ms"]
            print(f"roomkit {roomkit['roomkit']} / chorus, build CPU at ~{ours['events']} events: {ratio:.1f}×")
    if args.json:
        args.json.write_text(json.dumps({"chorus": chorus, "roomkit": roomkit, "store": args.store}, indent=1))
    return 0
