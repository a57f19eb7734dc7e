"""Issue 25.9: work proportional to the room ran on the event loop — with 200,000 stored turns,
taking a room up or reading its transcript stalled every room for ~15 s. Now the stores parse
rows on a worker thread, a room is walked a page at a time (`RoomStore.pages`), and the labelling
of a whole room (who already spoke, the transcript) runs on a worker thread; a chat model's
speak policy reads the room once, not once per turn.

These tests check where the work runs and how often the room is read — deterministic on a
loaded machine; the stall itself is measured in `docs/benchmarks.md` ("A long room")."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import rooms.kit
import rooms.postgres
import rooms.sqlite
import rooms.store
from models import EventSource, RoomEvent, TextContent
from realtime import RealtimeChannel
from rooms import AIChannel, MockAIProvider, Room, RoomKit, TextChannel
from rooms.policy import default_policy
from rooms.postgres import PostgresStore
from rooms.sqlite import SQLiteStore
from server.auth import issue_token
from server.testing.harness import SECRET, running_server_with_local_stt

ROOM = "long"
TURNS = 150  # more than the Postgres store parses inline


def turn(n: int) -> RoomEvent:
    return RoomEvent(
        id=f"t{n:05d}",
        room_id=ROOM,
        source=EventSource(channel_id="web", participant_id=f"u{n % 3}", channel_type="text"),
        content=TextContent(body=f"turn {n}"),
        metadata={"sender_name": f"Person {n % 3}"},
    )


class Threads:
    """Which threads a patched function ran on."""

    def __init__(self) -> None:
        self.seen: list[threading.Thread] = []

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(threading.current_thread())
            return fn(*args, **kwargs)

        return recorded

    def all_off_the_loop(self) -> bool:
        return bool(self.seen) and threading.main_thread() not in self.seen


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[Threads]:
    threads = Threads()
    monkeypatch.setattr(rooms.sqlite, "thaw_event", threads.wrap(rooms.sqlite.thaw_event))
    postgres_parse = getattr(rooms.postgres, "thaw_event", rooms.store.thaw_event)
    monkeypatch.setattr(rooms.postgres, "thaw_event", threads.wrap(postgres_parse), raising=False)
    yield threads


@pytest.fixture
def labels(monkeypatch: pytest.MonkeyPatch) -> Iterator[Threads]:
    threads = Threads()
    monkeypatch.setattr(rooms.kit, "label_for", threads.wrap(rooms.kit.label_for))
    yield threads


async def test_the_sqlite_store_parses_a_room_off_the_loop(tmp_path: Path, parses: Threads) -> None:
    path = tmp_path / "chorus.db"
    store = await SQLiteStore.open(path)
    await store.create_room(Room(id=ROOM))
    for n in range(TURNS):
        await store.add_event(turn(n))
    await store.close()
    cold = await SQLiteStore.open(path)  # nothing remembered: every row is parsed
    try:
        assert [e.id for e in await cold.list_events(ROOM)] == [turn(n).id for n in range(TURNS)]
        assert parses.all_off_the_loop()
    finally:
        await cold.close()


async def test_the_postgres_store_parses_a_room_off_the_loop(
    postgres_database: str, parses: Threads
) -> None:
    store = await PostgresStore.connect(postgres_database)
    try:
        await store.create_room(Room(id=ROOM))
        for n in range(TURNS):
            await store.add_event(turn(n))
        parses.seen.clear()
        assert len(await store.list_events(ROOM)) == TURNS
        assert len(await store.list_page(ROOM, None, TURNS)) == TURNS
        assert parses.all_off_the_loop()
    finally:
        await store.close()


async def filled_kit() -> RoomKit:
    kit = RoomKit()
    await kit.create_room(room_id=ROOM)
    for n in range(TURNS):
        await kit.store.add_event(turn(n))
    return kit


def count_reads(monkeypatch: pytest.MonkeyPatch, store: Any) -> list[str]:
    """The names of the store's whole-room and page reads, in order, as they happen."""
    reads: list[str] = []
    for name in ("list_events", "list_page"):
        real = getattr(store, name)

        async def read(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            reads.append(_name)
            return await _real(*args, **kwargs)

        monkeypatch.setattr(store, name, read)
    return reads


async def test_who_already_spoke_is_labelled_off_the_loop_a_page_at_a_time(
    labels: Threads, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit = await filled_kit()
    reads = count_reads(monkeypatch, kit.store)
    got = await kit.past_labels(ROOM, lambda e: True)
    assert set(got) == {"Person 0", "Person 1", "Person 2"} and len(got) == TURNS
    assert labels.all_off_the_loop()
    assert reads == ["list_page"]  # one page of 2,000 holds the room; never read whole


async def test_a_realtime_channel_taking_a_long_room_up_labels_it_off_the_loop(
    labels: Threads,
) -> None:
    kit = await filled_kit()
    channel = RealtimeChannel("realtime")
    kit.register_channel(channel)
    await kit.attach_channel(ROOM, "realtime")
    assert labels.all_off_the_loop()
    await kit.close()


async def test_a_chat_models_speak_policy_reads_the_room_once_not_per_turn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kit = RoomKit()
    web = TextChannel("web")
    kit.register_channel(web)
    kit.register_channel(AIChannel("ai", MockAIProvider(["Noted."]), policy=default_policy()))
    await kit.create_room(room_id="r")
    await kit.attach_channel("r", "web", group=True)
    await kit.attach_channel("r", "ai")
    reads = count_reads(monkeypatch, kit.store)
    for n in range(12):
        await web.send(f"u{n % 2}", f"line {n}", room_id="r", metadata={"sender_name": f"P{n % 2}"})
    await kit.drain()  # every queued delivery to the model's channel done
    assert reads.count("list_page") == 1, reads  # the past read once, then kept up per turn
    assert "list_events" not in reads


async def test_the_transcript_route_labels_the_room_off_the_loop(labels: Threads) -> None:
    async with running_server_with_local_stt() as srv:
        kit = srv.server.rooms.kit
        await kit.create_room(room_id=ROOM)
        for n in range(TURNS):
            await kit.store.add_event(turn(n))
        labels.seen.clear()
        async with httpx.AsyncClient(base_url=srv.http_base, timeout=60) as http:
            answer = await http.get(
                f"/v1/rooms/{ROOM}/transcript",
                headers={"Authorization": f"Bearer {issue_token(SECRET, ROOM)}"},
            )
        assert answer.status_code == 200
        assert [t["text"] for t in answer.json()] == [f"turn {n}" for n in range(TURNS)]
        assert labels.all_off_the_loop()
