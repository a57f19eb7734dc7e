"""Two `chorus serve` processes on one Postgres serve one room (issue 14.4), over real sockets.

A phone leg (Twilio framing) talks to one process and a device to the other, while six people
whose names read alike (`Dana`, `DANA`, `dana`, `Dаna` with a Cyrillic а …) join the room through
both processes at the same moment. The room has one commit order, one register and no rank given
twice, and no turn is lost.

Both processes start with a `sitecustomize` that holds a room open between reading the register
and writing it back, until the other process has read it too (a rendezvous through files in a
shared directory, never a sleep): the first look-alike to join through each process (`a0`, `b0`)
waits there for the other. The room lock is what keeps two commits from interleaving: with
Postgres advisory locks the other process cannot read while the first holds the room, so the first
waiter always waits alone (a short bound, and the test checks it did); the control replaces them
with in-process locks (each process locks only itself), both reads happen before either write,
and the register must lose a look-alike, on every run, loaded machine or not.

STT goes through the local Deepgram-protocol server (the demo meeting's words); no diarizer, no
realtime session.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from attribution import AUTHOR_KEY, Register, format_label, label_for
from attribution.speakers import participant_source
from models import RoomEvent
from rooms import RoomKit, open_store
from server.auth import issue_token
from server.client import DeviceStream, EventFeed, TwilioLeg
from server.protocol import StartMessage
from server.testing.harness import SECRET, eventually
from tests.serve_process import ServeProcess
from tests.store_fixtures import postgres_url
from voice.audio import float_to_pcm16, mulaw_encode, read_audio_16k, resample
from voice.testing.deepgram_server import DeepgramTestServer

pytestmark = pytest.mark.asyncio

REPO = Path(__file__).resolve().parents[1]
MEETING = REPO / "examples" / "meeting"
ROOM = "bridge"
LOOK_ALIKES = [["dana", "Dаna", "DAna"], ["daNa", "DАNA", "dAna"]]
"""Who joins through each process at once (`А`/`а` are Cyrillic): all read like `Dana`."""

RENDEZVOUS = '''
import asyncio
import contextvars
import inspect
from pathlib import Path

from rooms import kit as _kit
from rooms import roster as _roster

_DIR = Path({directory!r})
_PAIR = {{"a0": "b0", "b0": "a0"}}
_joining = contextvars.ContextVar("joining", default=None)
_ensure = _kit.RoomKit.ensure_participant
_load = _roster.Rosters.get
_participant_of = inspect.signature(_ensure)


async def ensure_participant(self, *args, **kwargs):
    bound = _participant_of.bind(self, *args, **kwargs)
    token = _joining.set(bound.arguments["participant_id"])
    try:
        return await _ensure(self, *args, **kwargs)
    finally:
        _joining.reset(token)


async def load_then_meet(self, room_id):
    register = await _load(self, room_id)  # the room's participants and register, as read
    me = _joining.get()
    if me in _PAIR:  # between this read and its write-back: wait for the other process's read
        (_DIR / f"{{me}}.read").touch()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + {bound_s}
        while not (_DIR / f"{{_PAIR[me]}}.read").exists():
            if loop.time() > deadline:
                (_DIR / f"{{me}}.alone").touch()
                break
            await asyncio.sleep(0.01)
    return register


_kit.RoomKit.ensure_participant = ensure_participant
_roster.Rosters.get = load_then_meet
'''
ALONE_BOUND_S = 2.0
"""With advisory locks the other process cannot read while the waiter holds the room: the waiter
waits this long, alone, whatever the load (only the test's duration depends on it)."""
OPEN_TIMEOUT_S = 120.0
"""A failure bound for a connection's handshake: a process holding a room at the rendezvous
answers its other connections to that room late (the default 10 s is not enough under load)."""
MEET_BOUND_S = 90.0
"""With in-process locks the other process reads while the waiter holds its room: a failure bound."""

IN_PROCESS_LOCKS = '''

from rooms import postgres
from rooms.locks import InProcessLocks


class ProcessOnlyLocks(InProcessLocks):
    async def close(self):
        pass


async def in_process_locks(cls, dsn):
    return ProcessOnlyLocks()


postgres.PostgresAdvisoryLocks.connect = classmethod(in_process_locks)
'''


def excerpt(start: float, end: float) -> np.ndarray:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return audio[int(start * 16000) : int(end * 16000)]


def phone_audio(start: float, end: float) -> bytes:
    narrow = np.concatenate([resample(excerpt(start, end), 16000, 8000), np.zeros(2800, np.float32)])
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


async def join(base: str, participant: str, name: str) -> DeviceStream:
    """A one-person device that joins (its participant is registered) and says nothing yet."""
    return await DeviceStream.open(
        base, ROOM, issue_token(SECRET, ROOM),
        StartMessage(participant=participant, name=name, shared_mic=False),
        open_timeout=OPEN_TIMEOUT_S,
    )  # fmt: skip


async def run_room(tmp_path: Path, deepgram: DeepgramTestServer, url: str, locks: str) -> str:
    """Both processes, the phone leg, the device and the look-alikes; returns the store URL."""
    site, meetings = tmp_path / "site", tmp_path / "meetings"
    site.mkdir()
    meetings.mkdir()
    bound_s = MEET_BOUND_S if locks == "in-process" else ALONE_BOUND_S
    (site / "sitecustomize.py").write_text(
        RENDEZVOUS.format(directory=str(meetings), bound_s=bound_s)
        + (IN_PROCESS_LOCKS if locks == "in-process" else "")
    )
    config = tmp_path / "chorus.toml"
    config.write_text(
        f'[stt]\nprovider = "deepgram"\ndeepgram_url = "{deepgram.url}"\ndeepgram_api_key = "k"\n'
        f'[diarizer]\nkind = "none"\n[realtime]\nprovider = "none"\n[store]\nurl = "{url}"\n'
    )
    a, b = await asyncio.gather(ServeProcess.start(config, site), ServeProcess.start(config, site))
    try:
        token = issue_token(SECRET, ROOM)
        feeds = await asyncio.gather(EventFeed.open(a.base, ROOM, token), EventFeed.open(b.base, ROOM, token))
        phone, device = await asyncio.gather(
            TwilioLeg.open(
                a.base, {"room": ROOM, "token": token, "name": "Dana"}, open_timeout=OPEN_TIMEOUT_S
            ),
            DeviceStream.open(
                b.base, ROOM, token, StartMessage(participant="desk", name="DANA", shared_mic=False),
                open_timeout=OPEN_TIMEOUT_S,
            ),
        )
        # Everyone else joins through both processes at once, while the two speak.
        speaking = asyncio.gather(
            phone.send_mulaw(phone_audio(0.6, 4.3), realtime=False),
            device.send_audio(float_to_pcm16(excerpt(4.7, 8.95)), chunk_s=0.5, realtime=False),
        )
        joined = await asyncio.gather(
            *(join(base, f"{tag}{n}", name)
              for base, tag, names in ((a.base, "a", LOOK_ALIKES[0]), (b.base, "b", LOOK_ALIKES[1]))
              for n, name in enumerate(names))
        )  # fmt: skip
        await speaking
        async with asyncio.timeout(90):
            await asyncio.gather(phone.stop(), device.stop(), *(j.stop() for j in joined))
        for feed in feeds:
            await eventually(
                lambda feed=feed: sum(m.type == "stream_stopped" for m in feed.received) >= 4, 120
            )
        committed = {t.event_id for feed in feeds for t in feed.turns}
        assert committed, "no turn reached either feed"
        assert {t.event_id for t in device.turns} <= committed
        for feed in feeds:
            await feed.close()
    finally:
        await asyncio.gather(a.stop(), b.stop())
    read = sorted(f.stem for f in meetings.glob("*.read"))
    alone = sorted(f.stem for f in meetings.glob("*.alone"))
    assert read == ["a0", "b0"], f"a look-alike never reached the register: {read}"
    if locks == "in-process":
        assert alone == [], "the two reads never overlapped: the control proves nothing"
    else:  # the first waiter held the room; the other process could not read until it let go
        assert len(alone) == 1, f"the other process read while the room was held: {alone}"
    await check_room(url, committed)
    return url


async def check_room(url: str, committed: set[str]) -> None:
    """One commit order, one register, no rank twice, no turn lost."""
    opened = await open_store(url)
    try:
        kit = RoomKit(store=opened.store, locks=opened.locks)
        events = await kit.list_events(ROOM)
        turns = [e for e in events if e.source.channel_type == "voice"]
        assert {e.id for e in turns} == committed, "a turn was lost"
        people = await kit.get_participants(ROOM)
        assert len(people) == 8  # the caller, the device, six look-alikes
        register = await kit.get_register(ROOM)
        assert isinstance(register, Register)
        ranks: dict[str, int] = {}
        for person in people:
            source = register.digest("source", *participant_source(person))
            entries = [e for e in register.entries if e.source == source]
            assert len(entries) == 1, f"the register lost {person.display_name!r}"
            ranks[person.id] = entries[0].rank
        assert sorted(ranks.values()) == list(range(1, 9)), f"a rank was given twice: {ranks}"
        labels = {label_for(said_by(p), people, register) for p in people}
        assert len(labels) == 8
        for event in turns:  # every turn keeps the rank it was committed with (D3)
            record = event.metadata[AUTHOR_KEY]
            assert label_for(event, people, register) == format_label(record["name"], record["rank"])
    finally:
        await opened.close()


def said_by(person: object) -> RoomEvent:
    from models import EventSource, Participant, TextContent

    assert isinstance(person, Participant)
    return RoomEvent(
        room_id=ROOM,
        source=EventSource(channel_id=person.connected_via[0], participant_id=person.id),
        content=TextContent(body="x"),
    )


async def test_two_processes_on_one_postgres_keep_one_room(
    tmp_path: Path, deepgram: DeepgramTestServer, postgres_database: str
) -> None:
    url = postgres_url(postgres_database)
    await run_room(tmp_path, deepgram, url, locks="advisory")


async def test_with_in_process_locks_the_two_processes_break_the_register(
    tmp_path: Path, deepgram: DeepgramTestServer, postgres_database: str
) -> None:
    """The control: each process locking only itself loses register writes."""
    url = postgres_url(postgres_database)
    with pytest.raises(AssertionError, match=r"the register lost|a rank was given twice"):
        await run_room(tmp_path, deepgram, url, locks="in-process")
