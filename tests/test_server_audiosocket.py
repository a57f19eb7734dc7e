"""Asterisk AudioSocket calls (`[audiosocket] listen`, issue 29.2), over a real TCP socket.

The caller here is a small AudioSocket client written in the test from Asterisk's framing (a kind
byte, a 2-byte big-endian length, the payload: `0x01` UUID, `0x10`/`0x12` slin audio, `0x03`
DTMF, `0x00` hangup), so the server's framing is checked against the wire, not against itself.
STT is the local Deepgram-protocol server (it finds the received audio in the demo meeting and
says the meeting's words); the reply comes from the local OpenAI Realtime server.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from realtime.testing.openai_server import OpenAIRealtimeServer
from server.audiosocket import (
    AUDIO_RATES,
    AudioSocketCall,
    AudioSocketCalls,
    AudioSocketFraming,
    FrameSplitter,
    Kind,
    audio_seconds,
    reply_messages,
)
from server.auth import Grant, issue_token
from server.client import EventFeed
from server.config import ConfigError, load_config
from server.framing import Refusal, StoppedBeforeStart
from server.protocol import DtmfMessage, SttStatusMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    answering,
    eventually,
    metric_value,
    running_server_with_local_stt,
)
from voice.audio import float_to_pcm16, read_audio_16k, resample
from voice.testing.deepgram_server import MeetingWords

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
BOUND_S = 120.0
"""Every wait's failure bound (a loaded machine is slow); a passing run never waits for it."""


def slin(start: float, end: float, rate: int = 8000, silence: float = 0.5) -> bytes:
    """An excerpt of the meeting as Asterisk hands it over: slin at `rate`, then a pause."""
    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    audio = resample(audio, 16000, rate)
    return float_to_pcm16(np.concatenate([audio, np.zeros(int(silence * rate), np.float32)]))


@dataclass
class AsteriskCall:
    """What Asterisk's `AudioSocket()` does on one TCP connection, frame by frame."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    received: list[tuple[int, bytes, float]] = field(default_factory=list)
    """(kind, payload, loop time it arrived) of every frame the server sent."""
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    @classmethod
    async def dial(cls, port: int, call_id: uuid.UUID | None) -> AsteriskCall:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        call = cls(reader, writer)
        call._task = asyncio.create_task(call._read())
        if call_id is not None:
            call.send(0x01, call_id.bytes)
        return call

    def send(self, kind: int, payload: bytes = b"") -> None:
        self.writer.write(struct.pack(">BH", kind, len(payload)) + payload)

    async def play(self, pcm16: bytes, kind: int = 0x10) -> None:
        """Audio as 20 ms frames, as fast as TCP takes them (the stream's burst allows it)."""
        step = AUDIO_RATES[kind] // 50 * 2
        for i in range(0, len(pcm16), step):
            self.send(kind, pcm16[i : i + step])
            await self.writer.drain()

    async def hang_up(self) -> None:
        self.send(0x00)
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()

    async def _read(self) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                kind, length = struct.unpack(">BH", await self.reader.readexactly(3))
                payload = await self.reader.readexactly(length)
                self.received.append((kind, payload, loop.time()))
        self.closed.set()

    def heard(self, kind: int = 0x10) -> list[tuple[bytes, float]]:
        """The audio frames of `kind` the server sent, but the silence that keeps the call alive."""
        return [(p, t) for k, p, t in self.received if k == kind and any(p)]

    def keepalives(self) -> list[tuple[bytes, float]]:
        """The frames of digital silence the server sent (kept alive while the caller is quiet)."""
        return [(p, t) for k, p, t in self.received if k in AUDIO_RATES and p and not any(p)]

    @property
    def hung_up(self) -> bool:
        return any(k == 0x00 for k, _, _ in self.received)

    async def close(self) -> None:
        self.writer.close()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, 10)


@contextlib.asynccontextmanager
async def audiosocket_server(**config: Any) -> AsyncIterator[RunningServer]:
    section = {"listen": "127.0.0.1:0", **config.pop("audiosocket", {})}
    words = MeetingWords.from_meeting(MEETING)
    async with running_server_with_local_stt({"audiosocket": section, **config}, words) as srv:
        yield srv


async def route(srv: RunningServer, call_id: uuid.UUID, body: dict[str, Any]) -> httpx.Response:
    token = issue_token(SECRET, body["room"], grants=[Grant.ADMIN])
    async with httpx.AsyncClient(base_url=srv.http_base) as http:
        return await http.put(
            f"/v1/audiosocket/{call_id}", json=body, headers={"Authorization": f"Bearer {token}"}
        )


def port_of(srv: RunningServer) -> int:
    port = srv.server.audiosocket_port
    assert port is not None
    return port


# --- end to end ---------------------------------------------------------------------------------


async def test_a_mapped_call_speaks_into_its_room_presses_a_key_and_hears_the_reply_paced() -> None:
    async with OpenAIRealtimeServer(replies=["Hello Dana."], reply_audio_seconds=1.0) as model:
        config = answering(model.base_url, "Dana")
        async with audiosocket_server(**config) as srv:
            call_id = uuid.uuid4()
            # the room's admin maps the call before Asterisk dials in; a stream token cannot
            stream_token = issue_token(SECRET, "pbx", grants=[Grant.STREAM])
            async with httpx.AsyncClient(base_url=srv.http_base) as http:
                refused = await http.put(
                    f"/v1/audiosocket/{call_id}",
                    json={"room": "pbx"},
                    headers={"Authorization": f"Bearer {stream_token}"},
                )
            assert refused.status_code == 403
            answer = await route(srv, call_id, {"room": "pbx", "participant": "dana-line",
                                                "name": "Dana"})  # fmt: skip
            assert answer.status_code == 200 and answer.json()["uuid"] == str(call_id)

            feed = await EventFeed.open(srv.base, "pbx", issue_token(SECRET, "pbx"))
            call = await AsteriskCall.dial(port_of(srv), call_id)
            await call.play(slin(0.6, 4.3))  # Alice's first turn, on Dana's line
            call.send(0x03, b"5")
            await eventually(lambda: any(m.type == "reply" for m in feed.received), BOUND_S, "reply")
            await eventually(lambda: audio_seconds_heard(call) >= 0.99, BOUND_S, "the reply audio")

            heard = call.heard(0x10)
            assert abs(audio_seconds_heard(call) - 1.0) < 0.03  # 1 s of reply, as 8 kHz slin
            # 20 ms frames (each piece of the streamed reply may end on a shorter one)
            assert all(0 < len(p) <= 320 for p, _ in heard)
            assert np.abs(np.frombuffer(b"".join(p for p, _ in heard), "<i2")).max() > 1000
            spread = heard[-1][1] - heard[0][1]
            assert spread >= 0.6, f"the reply came all at once ({spread:.2f} s), not paced"

            await call.hang_up()
            await eventually(
                lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S, "the stop"
            )
            await call.close()
            await feed.close()

    started = next(m for m in feed.received if m.type == "stream_started")
    assert started.kind == "audiosocket" and started.participant == "dana-line"
    turns = [t for t in feed.turns if t.stream == started.stream]
    assert turns and {t.speaker for t in turns} == {"Dana"}
    assert "Good morning everyone" in " ".join(t.text for t in turns)
    dtmf = [m for m in feed.received if isinstance(m, DtmfMessage)]
    assert [(d.digit, d.participant, d.stream) for d in dtmf] == [
        ("5", "dana-line", started.stream)
    ]


async def test_a_caller_talking_over_a_reply_stops_it_and_is_heard() -> None:
    """A 6 s reply is playing to the call; the caller talks (`BargeIn`): the reply audio not sent
    yet is dropped (the socket paces it at real time, so it has not played), the barge-in is
    counted, and what the caller said over the reply reaches the STT (a phone leg is not
    silenced while a reply plays)."""
    async with OpenAIRealtimeServer(replies=["A long answer."], reply_audio_seconds=6.0) as model:
        config = answering(model.base_url, "Dana")
        async with audiosocket_server(**config) as srv:
            call_id = uuid.uuid4()
            await route(srv, call_id, {"room": "pbx", "participant": "dana-line", "name": "Dana"})
            feed = await EventFeed.open(srv.base, "pbx", issue_token(SECRET, "pbx"))
            call = await AsteriskCall.dial(port_of(srv), call_id)
            try:
                # "Good morning everyone." and 3 s of quiet: the turn closes, the model answers
                await call.play(slin(0.6, 2.0, silence=3.0))
                await eventually(lambda: audio_seconds_heard(call) >= 0.3, BOUND_S, "the reply")
                model.reply_audio_seconds = 0.0  # what Dana says next is answered without audio
                await call.play(slin(2.0, 3.5, silence=0.0))  # Dana talks over it
                metrics = srv.server.metrics
                await eventually(lambda: metrics.barge_ins_total["audiosocket"] == 1, BOUND_S)
                await eventually(lambda: any(m.type == "reply" for m in feed.received), BOUND_S)
                (stream,) = srv.server.rooms.rooms["pbx"].streams.values()
                # every reply message went through the socket: sent, or dropped at once
                await eventually(lambda: stream.outbox.empty(), BOUND_S, "the outbox")
                assert audio_seconds_heard(call) < 4.0  # of 6 s
                assert srv.stt_server is not None

                def voiced_s() -> float:
                    pcm = np.frombuffer(bytes(srv.stt_server.connections[0].audio), "<i2")
                    return int(np.count_nonzero(pcm)) / 16000

                await eventually(lambda: voiced_s() >= 1.4 + 1.5 - 0.2, BOUND_S, "the words over it")
                assert "chorus_barge_ins_total{kind=\"audiosocket\"} 1.0" in metrics.render(1)
            finally:
                await call.hang_up()
                await call.close()
                await feed.close()


def audio_seconds_heard(call: AsteriskCall) -> float:
    return sum(len(p) for p, _ in call.heard(0x10)) / (2 * 8000)


async def test_a_caller_quiet_after_speaking_gets_the_turn_and_the_line_is_kept_alive() -> None:
    """Asterisk's `AudioSocket()` forwards only voice frames, so a caller whose phone suppresses
    silence sends nothing in a pause. The pause reads as silence, so the turn comes while the
    call is up (before, only when the caller spoke again or hung up); and while it lasts Chorus
    sends a 20 ms silence every second, since Asterisk ends an AudioSocket call after 2 s with
    nothing from either side."""
    async with audiosocket_server(stt={"diarize": False}, audiosocket={"default_room": "lobby"}) as srv:
        feed = await EventFeed.open(srv.base, "lobby", issue_token(SECRET, "lobby"))
        call = await AsteriskCall.dial(port_of(srv), uuid.uuid4())
        await call.play(slin(0.6, 2.0, silence=0.0))  # "Good morning everyone." and nothing more
        await eventually(lambda: "Good morning everyone" in " ".join(t.text for t in feed.turns),
                         BOUND_S, "the turn while the caller is quiet")  # fmt: skip
        await eventually(lambda: len(call.keepalives()) >= 2, BOUND_S, "the line kept alive")
        assert all(len(p) == 320 for p, _ in call.keepalives())  # 20 ms of 8 kHz slin
        assert not call.hung_up and srv.server.metrics.streams_active["audiosocket"] == 1
        await call.hang_up()
        await eventually(
            lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S, "the stop"
        )
        await call.close()
        await feed.close()


async def test_a_wideband_call_in_the_default_room_is_flushed_and_hung_up_on_a_drain() -> None:
    config = {"audiosocket": {"default_room": "lobby", "default_shared_mic": True}}
    async with audiosocket_server(**config) as srv:
        feed = await EventFeed.open(srv.base, "lobby", issue_token(SECRET, "lobby"))
        call = await AsteriskCall.dial(port_of(srv), uuid.uuid4())  # not mapped: the default
        await call.play(slin(0.6, 4.3, rate=16000, silence=0.0), kind=0x12)  # slin16
        await eventually(lambda: srv.audio_read() >= 3.6, BOUND_S, "the call's audio read")
        await srv.server.stop()  # the drain: the last turn is flushed, then the call hung up
        async with asyncio.timeout(BOUND_S):
            await call.closed.wait()
        assert call.hung_up
        await call.close()
        await feed.close()
    started = next(m for m in feed.received if m.type == "stream_started")
    assert started.participant.startswith("call-") and started.kind == "audiosocket"
    turns = [t for t in feed.turns if t.stream == started.stream]
    assert "Good morning everyone" in " ".join(t.text for t in turns)
    assert all(t.label for t in turns)  # a speakerphone: its voices are labelled


async def test_bad_calls_are_hung_up_and_the_server_keeps_serving() -> None:
    async with audiosocket_server(limits={"start_timeout_s": 1.0}) as srv:
        port = port_of(srv)
        metrics = srv.server.metrics.refused_total

        async def refused(call: AsteriskCall, metric: str) -> None:
            async with asyncio.timeout(BOUND_S):
                await call.closed.wait()
            assert call.hung_up and metrics[metric] >= 1, metric
            await call.close()

        unmapped = await AsteriskCall.dial(port, uuid.uuid4())  # no map entry, no default room
        unmapped.send(0x10, bytes(320))
        await refused(unmapped, "unknown_call")

        early = await AsteriskCall.dial(port, None)  # audio before the UUID
        early.send(0x10, bytes(320))
        await refused(early, "audio_before_start")

        garbage = await AsteriskCall.dial(port, uuid.uuid4())
        garbage.send(0x42, b"??")  # a kind Asterisk never sends
        await refused(garbage, "bad_message")

        silent = await AsteriskCall.dial(port, uuid.uuid4())  # a caller that never sends audio
        await refused(silent, "start_timeout")

        call_id = uuid.uuid4()
        assert (await route(srv, call_id, {"room": "pbx"})).status_code == 200
        rate_change = await AsteriskCall.dial(port, call_id)
        rate_change.send(0x10, bytes(320))
        rate_change.send(0x12, bytes(640))
        await refused(rate_change, "bad_format")

        # still serving: a mapped call opens its stream
        ok_id = uuid.uuid4()
        assert (await route(srv, ok_id, {"room": "pbx"})).status_code == 200
        ok = await AsteriskCall.dial(port, ok_id)
        await ok.play(bytes(3200))
        await eventually(lambda: srv.server.metrics.streams_active["audiosocket"] == 1, BOUND_S)
        await ok.hang_up()
        await eventually(lambda: srv.server.metrics.streams_active["audiosocket"] == 0, BOUND_S)
        await ok.close()
        assert srv.server.open_sockets == 0


async def test_the_uuid_map_is_off_without_audiosocket_and_validates_its_body() -> None:
    async with running_server_with_local_stt() as srv:
        assert srv.server.audiosocket_port is None
        assert (await route(srv, uuid.uuid4(), {"room": "pbx"})).status_code == 404
    async with audiosocket_server() as srv:
        assert (await route(srv, uuid.uuid4(), {"room": "pbx", "participant": "+1 555"})
                ).status_code == 422  # fmt: skip
        assert (await route(srv, uuid.uuid4(), {"room": "pbx", "extra": 1})).status_code == 422
        # what Asterisk's CURL() sends: a POST with the token in the query
        call_id = uuid.uuid4()
        async with httpx.AsyncClient(base_url=srv.http_base) as http:
            posted = await http.post(
                f"/v1/audiosocket/{call_id}?token={issue_token(SECRET, 'pbx', grants=['admin'])}",
                content=b'{"room":"pbx","name":"Dana"}',
                headers={"Content-Type": "application/json"},
            )
        assert posted.status_code == 200
        assert srv.server.audiosocket_calls.take(call_id) == AudioSocketCall(room="pbx", name="Dana")


# --- the call's STT status, on the room's feed ---------------------------------------------------


async def hang_up_and_read_metrics(srv: RunningServer, call: AsteriskCall,
                                   feed: EventFeed) -> str:
    """Hang the call up, wait for its stream's stop on the feed (every status published before
    it has arrived), and read `/metrics`; the call and the feed are closed."""
    await call.hang_up()
    await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received),
                     BOUND_S, "the stop")
    _, body = await srv.http_get("/metrics")
    await call.close()
    await feed.close()
    return body


def stt_statuses(feed: EventFeed) -> list[SttStatusMessage]:
    return [m for m in feed.received if isinstance(m, SttStatusMessage)]


async def test_a_calls_stt_outage_and_recovery_reach_the_rooms_feed_and_are_counted() -> None:
    """A phone leg has no message channel to its caller, so the operator watching the room's
    feed hears its STT statuses: degraded, then recovered, for the call's stream."""
    async with audiosocket_server(stt={"diarize": False}) as srv:
        stt = srv.stt_server
        assert stt is not None
        stt.outage_after(1.0, 0.5)  # the STT service drops once it heard 1 s of the call
        call_id = uuid.uuid4()
        assert (await route(srv, call_id, {"room": "pbx", "name": "Dana"})).status_code == 200
        feed = await EventFeed.open(srv.base, "pbx", issue_token(SECRET, "pbx", grants=[Grant.FEED]))
        call = await AsteriskCall.dial(port_of(srv), call_id)
        await call.play(slin(0.6, 4.3))
        await eventually(lambda: any(m.status == "recovered" for m in stt_statuses(feed)),
                         BOUND_S, "recovered on the feed")
        body = await hang_up_and_read_metrics(srv, call, feed)
    started = next(m for m in feed.received if m.type == "stream_started")
    told = stt_statuses(feed)
    assert [(m.status, m.stream) for m in told] == [("degraded", started.stream),
                                                    ("recovered", started.stream)]
    assert told[0].reason
    assert metric_value(body, "chorus_stt_outages_total") == 1.0
    assert metric_value(body, "chorus_stt_recoveries_total") == 1.0
    assert metric_value(body, "chorus_stt_audio_lost_seconds_total") == 0.0


async def test_a_calls_stt_refusal_reaches_the_rooms_feed_once() -> None:
    """A refusal goes to the feed for every stream; a phone leg's is not told twice."""
    async with audiosocket_server(stt={"diarize": False}) as srv:
        stt = srv.stt_server
        assert stt is not None
        call_id = uuid.uuid4()
        assert (await route(srv, call_id, {"room": "pbx"})).status_code == 200
        feed = await EventFeed.open(srv.base, "pbx", issue_token(SECRET, "pbx", grants=[Grant.FEED]))
        call = await AsteriskCall.dial(port_of(srv), call_id)
        await call.play(slin(0.6, 1.6, silence=0.0))
        await eventually(lambda: bool(stt.connections and stt.connections[0].audio), BOUND_S,
                         "audio at the STT")
        stt.refuse_handshakes(HTTPStatus.UNAUTHORIZED)
        stt.drop_now()
        await eventually(lambda: any(m.status == "refused" for m in stt_statuses(feed)),
                         BOUND_S, "refused on the feed")
        body = await hang_up_and_read_metrics(srv, call, feed)
    told = stt_statuses(feed)
    assert [m.status for m in told][:2] == ["degraded", "refused"]
    assert [m.status for m in told].count("refused") == 1
    assert told[1].reason is not None and "HTTP 401" in told[1].reason
    assert metric_value(body, "chorus_stt_refused_total") == 1.0


# --- the framing, list in, list out -------------------------------------------------------------


def test_frames_cut_from_a_byte_stream_in_any_pieces() -> None:
    wire = b"".join(struct.pack(">BH", k, len(p)) + p
                    for k, p in [(0x01, bytes(16)), (0x10, bytes(320)), (0x03, b"#"), (0x00, b"")])  # fmt: skip
    splitter = FrameSplitter()
    frames = [f for i in range(len(wire)) for f in splitter.feed(wire[i : i + 1])]
    assert [f[0] for f in frames] == [0x01, 0x10, 0x03, 0x00]
    assert b"".join(frames) == wire


def test_a_call_opens_at_its_first_audio_with_that_audio_s_rate() -> None:
    framing = AudioSocketFraming()
    call_id = uuid.uuid4()
    assert framing.opening(struct.pack(">BH", 0x01, 16) + call_id.bytes) is None
    assert framing.opening(struct.pack(">BH", 0x03, 1) + b"1") is None
    first = struct.pack(">BH", 0x12, 640) + bytes(640)
    opening = framing.opening(first)
    assert opening is not None and opening.call_id == call_id and opening.first_audio == first
    declared = framing.declare(opening, AudioSocketCall(room="r", name="Dana"))
    assert declared.format.sample_rate == 16000 and declared.format.encoding == "pcm16"
    assert declared.participant == f"call-{call_id}" and declared.name == "Dana"
    assert framing.audio(first) == bytes(640)
    assert framing.audio(struct.pack(">BH", 0x12, 3) + b"abc") == b"ab"  # whole samples only
    assert framing.audio(struct.pack(">BH", 0x00, 0)) is None
    with pytest.raises(StoppedBeforeStart):
        AudioSocketFraming().opening(struct.pack(">BH", 0xFF, 1) + b"\x02")
    with pytest.raises(Refusal, match="16 bytes"):
        AudioSocketFraming().opening(struct.pack(">BH", 0x01, 4) + b"abcd")
    with pytest.raises(Refusal, match="malformed"):
        AudioSocketFraming().opening(b"\x10\x00")


def test_reply_audio_is_20_ms_frames_of_the_call_s_own_kind() -> None:
    one_second_24k = bytes(2 * 24000)
    messages = reply_messages(one_second_24k, 24000, Kind.AUDIO)
    frames = [f for m in messages for f in FrameSplitter().feed(m)]
    assert {f[0] for f in frames} == {0x10} and len(frames) == 50
    assert sum(audio_seconds(m) for m in messages) == pytest.approx(1.0)
    assert {f[0] for m in reply_messages(one_second_24k, 24000, Kind.SLIN48) for f in
            FrameSplitter().feed(m)} == {0x16}  # fmt: skip


def test_a_map_entry_is_taken_once_expires_and_is_bounded() -> None:
    calls = AudioSocketCalls(ttl_s=60, max_entries=2)
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for call_id in (a, b, c):
        calls.put(call_id, AudioSocketCall(room="r"))
    assert len(calls) == 2 and calls.take(a) is None  # the oldest went
    assert calls.take(b) == AudioSocketCall(room="r") and calls.take(b) is None
    expiring = AudioSocketCalls(ttl_s=1e-9, max_entries=2)
    expiring.put(a, AudioSocketCall(room="r"))
    assert expiring.take(a) is None


def test_the_audiosocket_section_reads_from_the_file_and_the_environment(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text('[audiosocket]\nlisten = "127.0.0.1:5071"\ndefault_room = "lobby"\n')
    section = load_config(file, {}).audiosocket
    assert section.listen == "127.0.0.1:5071" and section.default_room == "lobby"
    assert load_config(None, {}).audiosocket.listen is None  # off unless set
    env = load_config(None, {"CHORUS_AUDIOSOCKET_LISTEN": "0.0.0.0:9092"})
    assert env.audiosocket.listen == "0.0.0.0:9092"
    with pytest.raises(ConfigError, match=r"audiosocket\.listen"):
        load_config(None, {"CHORUS_AUDIOSOCKET_LISTEN": "5071"})
    with pytest.raises(ConfigError, match=r"audiosocket\.default_room"):
        load_config(None, {"CHORUS_AUDIOSOCKET_DEFAULT_ROOM": "no/slash"})
