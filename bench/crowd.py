"""A crowded room: turns per second as participants pile up, each turn from someone new.

`chorus bench crowd --participants 1000 --store sqlite memory` commits, in one room of a fresh
store, one turn from each of N new participants (joined with `ensure_participant`, as the chat and
stream routes do, then a group text turn), and reports the turns per second around every 250th
participant (the 50 turns before it), with the register's size at the end. Issue 25.12 measured
5–15 commits/s at about 1,000 participants over the chat route, the room's register (214 KB)
rewritten on every turn. The script uses only public APIs, so the same file runs against an older
checkout (`PYTHONPATH=<old tree> python bench/crowd.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--participants", type=int, default=1000)
    parser.add_argument("--store", nargs="+", choices=["sqlite", "memory"], default=["sqlite", "memory"])


def run(args: argparse.Namespace) -> int:
    for store in args.store:
        print(json.dumps(asyncio.run(measure(store, args.participants))), flush=True)
    return 0


async def measure(store: str, participants: int) -> dict[str, Any]:
    from rooms import RoomKit, TextChannel, open_store

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'chorus.db'}" if store == "sqlite" else "memory://"
        opened = await open_store(url)
        kit = RoomKit(store=opened.store, locks=opened.locks)
        web = TextChannel("web")
        kit.register_channel(web)
        await kit.create_room(room_id="crowd")
        await kit.attach_channel("crowd", "web", group=True)
        out: dict[str, Any] = {"store": store, "participants": participants, "turns_per_s": {}}
        window: list[float] = []
        for n in range(1, participants + 1):
            start = time.perf_counter()
            await kit.ensure_participant("crowd", "web", f"u{n}", display_name=f"Person {n}")
            await web.send(f"u{n}", f"a word from person {n}", room_id="crowd")
            window = [*window[-49:], time.perf_counter() - start]
            if n % 250 == 0 or n == participants:
                out["turns_per_s"][n] = round(len(window) / sum(window), 1)
                print(f"  {store}: {n} participants, {out['turns_per_s'][n]} turns/s", flush=True)
        register = await kit.get_register("crowd")
        out["register_bytes"] = len(register.model_dump_json()) if register is not None else 0
        await opened.close()
        return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
