"""One process per SQLite file (issue 25.5): two processes on one file lost register entries and
relabelled turns, so the store locks the file and a second open is refused at once, with one line
naming the file and Postgres; the holder keeps everything it wrote, a closed or killed holder lets
the next one in, and `chorus agent`'s jobs share the file room by room."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

from rooms import Room, SQLiteStore, open_store
from tests.serve_process import REPO, ServeExited, ServeProcess
from tests.test_rooms_store import event

IN_USE = "is in use by another process"

HOLDER = """
import asyncio, sys
from rooms import SQLiteStore

async def hold() -> None:
    store = await SQLiteStore.open(sys.argv[1])
    print("held", flush=True)
    sys.stdin.read()  # until the test kills it

asyncio.run(hold())
"""


def serve_config(tmp_path: Path, db: Path) -> Path:
    """A `chorus serve` that loads no model: Deepgram (never reached here), no diarizer."""
    path = tmp_path / "chorus.toml"
    path.write_text(
        '[stt]\nprovider = "deepgram"\ndeepgram_url = "ws://127.0.0.1:9"\ndeepgram_api_key = "k"\n'
        '[diarizer]\nkind = "none"\n[realtime]\nprovider = "none"\n'
        f'[store]\nurl = "sqlite:///{db}"\n'
    )
    return path


async def a_room_with_turns(db: Path, count: int = 5) -> None:
    store = await SQLiteStore.open(db)
    try:
        await store.create_room(Room(id="r"))
        for n in range(count):
            await store.add_event(event(n))
    finally:
        await store.close()


async def turns_in(db: Path) -> list[str]:
    store = await SQLiteStore.open(db)
    try:
        return [e.id for e in await store.list_events("r")]
    finally:
        await store.close()


async def second_serve(config: Path) -> tuple[int | None, list[str]]:
    """`chorus serve` on `config`: its exit status and the lines it printed, or None and its lines
    when it came to listen (it took the file), then stopped."""
    try:
        server = await ServeProcess.start(config)
    except ServeExited as exited:
        return exited.returncode, [line.rstrip("\n") for line in exited.lines]
    server.proc.kill()
    await server.proc.wait()
    return None, [line.rstrip("\n") for line in server.lines]


async def test_a_second_chorus_serve_on_the_file_is_refused_and_the_first_keeps_its_rooms(
    tmp_path: Path,
) -> None:
    db = tmp_path / "data" / "chorus.db"
    await a_room_with_turns(db)
    config = serve_config(tmp_path, db)
    first = await ServeProcess.start(config)
    try:
        status, lines = await second_serve(config)
        assert status == 2 and len(lines) == 1, lines
        assert lines[0].startswith(f"chorus serve: cannot open the store sqlite:///{db}: ")
        assert f"the SQLite file {db} {IN_USE}" in lines[0] and "Postgres" in lines[0]
        assert first.proc.returncode is None  # the first serves on
    finally:
        await first.stop()
    assert await turns_in(db) == [f"e{n:05d}" for n in range(5)]
    # the first has closed: the next server takes the file
    again = await ServeProcess.start(config)
    try:
        async with httpx.AsyncClient() as client:  # answered: it serves (and will drain on stop)
            health = await client.get(f"http://127.0.0.1:{again.port}/healthz", timeout=60)
        assert health.status_code == 200
    finally:
        await again.stop()


async def test_a_killed_holder_lets_the_next_process_in(tmp_path: Path) -> None:
    db = tmp_path / "chorus.db"
    await a_room_with_turns(db)
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, str(db), cwd=REPO,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        assert holder.stdout is not None
        async with asyncio.timeout(120):
            assert (await holder.stdout.readline()).decode().strip() == "held"
        with pytest.raises(RuntimeError, match=f"the SQLite file {db} {IN_USE}"):
            await SQLiteStore.open(db)
    finally:
        holder.kill()  # SIGKILL: no close, the kernel drops the lock with the process
        await holder.wait()
    assert await turns_in(db) == [f"e{n:05d}" for n in range(5)]


async def test_one_open_store_per_file_in_this_process_too(tmp_path: Path) -> None:
    db = tmp_path / "chorus.db"
    first = await SQLiteStore.open(db)
    try:
        await first.create_room(Room(id="r"))
        with pytest.raises(RuntimeError, match=IN_USE):
            await SQLiteStore.open(db)
        with pytest.raises(RuntimeError, match=IN_USE):
            await open_store(f"sqlite:///{db}")
        await first.add_event(event(0))  # the refused open took nothing from the holder
    finally:
        await first.close()
    assert await turns_in(db) == ["e00000"]  # closed: reopened at once
    memory = [await SQLiteStore.open(":memory:") for _ in range(2)]  # no file, no lock
    for store in memory:
        await store.close()


async def test_agent_jobs_share_the_file_room_by_room(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'chorus.db'}"
    worker = await open_store(url, shared=True)  # `chorus agent` holds the file while it runs
    standup = await open_store(url, room="standup")
    retro = await open_store(url, room="retro")  # another room's job, alongside
    try:
        with pytest.raises(RuntimeError, match=f"room 'standup' of the SQLite file .* {IN_USE}"):
            await open_store(url, room="standup")
        with pytest.raises(RuntimeError, match=IN_USE):
            await open_store(url)  # a `chorus serve` on the agent's file
    finally:
        for opened in (retro, standup, worker):
            await opened.close()
    again = await open_store(url, room="standup")  # the job ended: the next job takes the room
    await again.close()
    whole = await open_store(url)
    try:
        with pytest.raises(RuntimeError, match=IN_USE):
            await open_store(url, room="retro")  # a job on a `chorus serve`'s file
    finally:
        await whole.close()
