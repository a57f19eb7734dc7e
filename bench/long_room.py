"""A long room: how long taking it up and reading its transcript take, and how long they hold the event loop.

`chorus bench long_room --turns 20000 200000` fills a SQLite store (in a temporary directory) with
that many committed turns of one room, starts the server on it (`chorus serve`'s app, the local
Deepgram-protocol STT, the default realtime session), and measures, for each size:

- **take-up**: a feed connects to the room, which the server takes up (its channels attach; the
  realtime channel counts who already spoke, G3);
- **transcript**: `GET /v1/rooms/{room}/transcript` (JSON), twice.

For each, the wall time and the **worst stall of the event loop** while it ran (a ticker that
wakes every 10 ms records how late it woke): a stall holds every other room's streams and feeds.
Issue 25.9 measured ~15 s stalls at 200,000 turns. The script uses only public APIs, so the same
file can be run against an older checkout (`PYTHONPATH=<old tree> python bench/long_room.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
ROOM = "long"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--turns", type=int, nargs="+", default=[20_000, 200_000])


def run(args: argparse.Namespace) -> int:
    for turns in args.turns:
        print(json.dumps(asyncio.run(measure(turns))), flush=True)
    return 0


def fill(path: Path, turns: int) -> None:
    """`turns` committed turns of room `long`, written as the SQLite store writes them (the
    event's JSON), by SQL: committing them one by one through a kit would take longer than the
    measurement."""
    from models import EventSource, RoomEvent, TextContent

    db = sqlite3.connect(path)
    template = RoomEvent(
        room_id=ROOM,
        source=EventSource(channel_id="voice", participant_id="desk", channel_type="voice"),
        content=TextContent(body="we should ship the release on thursday after the review"),
        metadata={"speaker_label": "Speaker A", "start": 1.0, "end": 3.0, "source": "voice"},
    )
    rows = []
    for n in range(turns):
        event = template.model_copy(
            update={"id": f"t{n:07d}", "metadata": {**template.metadata,
                                                   "speaker_label": f"Speaker {'ABC'[n % 3]}"}}
        )
        rows.append((ROOM, event.id, "voice", json.dumps(event.visibility), event.model_dump_json()))
    db.executemany(
        "INSERT INTO events (room_id, id, source_channel, visibility, data) VALUES (?, ?, ?, ?, ?)",
        rows,
    )
    db.commit()
    db.close()


async def _timed(work: Awaitable[T]) -> tuple[T, float, float]:
    """The result of `work`, its wall seconds, and the event loop's worst stall meanwhile."""
    loop = asyncio.get_running_loop()
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            before = loop.time()
            await asyncio.sleep(0.01)
            worst = max(worst, loop.time() - before - 0.01)

    tick = asyncio.create_task(ticker())
    start = time.perf_counter()
    result = await work
    took = time.perf_counter() - start
    done.set()
    await tick
    return result, took, worst


async def measure(turns: int) -> dict[str, Any]:
    import httpx

    from rooms import RoomKit, open_store
    from server.app import ChorusServer
    from server.auth import issue_token
    from server.client import EventFeed
    from server.config import ServerConfig
    from server.pipeline import build_pipeline
    from server.testing.harness import SECRET, local_deepgram_stt
    from voice.testing.deepgram_server import DeepgramTestServer

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "chorus.db"
        opened = await open_store(f"sqlite:///{path}")
        kit = RoomKit(store=opened.store, locks=opened.locks)
        await kit.create_room(room_id=ROOM)
        await opened.close()
        fill(path, turns)
        opened = await open_store(f"sqlite:///{path}")
        kit = RoomKit(store=opened.store, locks=opened.locks)
        out: dict[str, Any] = {"turns": turns}
        async with DeepgramTestServer(None) as deepgram:
            config = ServerConfig.model_validate({
                "secret": SECRET, "diarizer": {"kind": "none"},
                "stt": local_deepgram_stt(deepgram.url),
            })
            server = ChorusServer(config, await build_pipeline(config), SECRET, kit=kit)
            await server.start("127.0.0.1", 0)
            token = issue_token(SECRET, ROOM)

            async def take_up() -> EventFeed:
                feed = await EventFeed.open(f"ws://127.0.0.1:{server.port}", ROOM, token)
                await server.rooms.room(ROOM)  # taken up (waits for the feed's take-up)
                return feed

            feed, took, stall = await _timed(take_up())
            out["take_up_s"], out["take_up_stall_s"] = round(took, 2), round(stall, 3)
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{server.port}", timeout=600
            ) as http:
                for n in (1, 2):
                    answer, took, stall = await _timed(http.get(
                        f"/v1/rooms/{ROOM}/transcript",
                        headers={"Authorization": f"Bearer {token}"},
                    ))
                    assert answer.status_code == 200, answer.text
                    out[f"transcript{n}_s"] = round(took, 2)
                    out[f"transcript{n}_stall_s"] = round(stall, 3)
                out["transcript_bytes"] = len(answer.content)
            await feed.close()
            await server.stop()
        await opened.close()
        return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
