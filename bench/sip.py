"""SIP legs: turn latency of a phone call at real time, and how many calls at once hold it.

`chorus bench sip` starts `chorus serve` in its own process with `[sip]` on 127.0.0.1 (UDP) and
the server's default STT (local Whisper tiny.en; `--stt-model` for another), then for each N in
`--calls` places N SIP calls at once, each into its own room, from a small user agent written
here (`SipCaller`: INVITE answered with digest credentials, ACK, BYE; RTP from its own socket).
Each call sends `--audio` (a recording with speech, e.g. the demo meeting or a LibriSpeech
conversation) as 20 ms PCMU RTP packets paced at real time, then a second of silence and a BYE.
With `--loss P` each RTP packet is lost on the way with probability P (seeded, the same packets
in every run). With `--silence-suppression` the caller is a phone with VAD/DTX: after `HANGOVER_FRAMES` frames
under `VAD_DBFS` it sends one RFC 3389 comfort-noise packet and no RTP until a frame is loud again.
A feed on each room (`/v1/rooms/{room}/events`) receives the committed turns.

Latency per turn: from the moment the RTP packet carrying the end of the turn's audio (its `end`)
was sent (or, suppressed, was due) to the moment the turn reached the feed, as `bench.load`'s strict latency (a turn
corrected later counts from its settled version). The largest N whose p95 stays under 1 s is the
answer (the completion latency, which forgives a turn its wait for the rest of the STT result it
was cut from, is a column only). The server's CPU per call comes from /proc. Everything stays on 127.0.0.1 and every loop
is bounded (`--calls`, `--seconds`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.load import (
    DEFAULT_AUDIO,
    LATENCY_TARGET_S,
    SECRET,
    ProcessProbe,
    _free_port,
    _process,
    _wait_file,
    _wait_port,
    deepgram_server_command,
    settled_versions,
    turn_latencies,
)
from server.metrics import percentile

REPO = Path(__file__).resolve().parents[1]
USER, PASSWORD = "bench", "bench-secret"
FRAME_S = 0.02
FRAME_BYTES = 160  # 20 ms of PCMU at 8 kHz
VAD_DBFS = -45.0
"""`--silence-suppression`: a 20 ms frame under this RMS level is silence to the phone's VAD."""
HANGOVER_FRAMES = 10
"""`--silence-suppression`: silent frames (200 ms) the phone still sends before it stops."""
CN_PAYLOAD_TYPE = 13


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--calls", default="1,2,4,8", help="comma-separated N to try, rising")
    parser.add_argument("--seconds", type=float, default=60.0, help="audio per call per step")
    parser.add_argument("--audio", default=str(DEFAULT_AUDIO), help="recording to send (any rate)")
    parser.add_argument(
        "--stt-model", default=None, help="[stt] model for the server's Whisper (default tiny.en)"
    )
    parser.add_argument(
        "--stt",
        choices=("whisper", "deepgram"),
        default="whisper",
        help="whisper: the server's default; deepgram: bench.load's local Deepgram-protocol "
        "stand-in in its own process (it knows only the demo meeting's words), so the figure is "
        "the SIP leg's and the server's own cost, not the recogniser's",
    )
    parser.add_argument(
        "--loss", type=float, default=0.0,
        help="share of RTP packets lost on the way (seeded: the same packets in every run)",
    )
    parser.add_argument(
        "--silence-suppression",
        action="store_true",
        help="each caller is a phone with VAD/DTX: no RTP in pauses (one comfort-noise packet each)",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--keep-going", action="store_true", help="do not stop at the first N over target"
    )


# --------------------------------------------------------------------------- a SIP user agent


class _Inbox(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.messages: asyncio.Queue[str] = asyncio.Queue()

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.messages.put_nowait(data.decode(errors="replace"))


class _Drop(asyncio.DatagramProtocol):
    """The caller's RTP socket: what the server sends back (reply audio) is counted only."""

    def __init__(self) -> None:
        self.received = 0

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received += 1


class SipCaller:
    """Just enough of a SIP UA over UDP for one call: INVITE (answering a digest challenge),
    ACK, RTP out of its own port, BYE; a BYE from the server is answered 200."""

    def __init__(self, server_port: int, room: str, name: str = "Bench") -> None:
        self.server = ("127.0.0.1", server_port)
        self.room = room
        self.name = name
        """The From header's display name: the caller's name in the room."""
        self.call_id = uuid.uuid4().hex
        self.cseq = 0
        self.to_tag = ""
        self.answer_port = 0
        self.hung_up_by_server = False
        self._sip: asyncio.DatagramTransport | None = None
        self._inbox = _Inbox()
        self._rtp: asyncio.DatagramTransport | None = None
        self.rtp_in = _Drop()
        self.port = 0
        self.rtp_port = 0

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._sip, _ = await loop.create_datagram_endpoint(
            lambda: self._inbox, local_addr=("127.0.0.1", 0)
        )
        self._rtp, _ = await loop.create_datagram_endpoint(
            lambda: self.rtp_in, local_addr=("127.0.0.1", 0)
        )
        self.port = self._sip.get_extra_info("sockname")[1]
        self.rtp_port = self._rtp.get_extra_info("sockname")[1]

    def close(self) -> None:
        for transport in (self._sip, self._rtp):
            if transport is not None:
                transport.close()

    def _uri(self) -> str:
        return f"sip:{self.room}@127.0.0.1:{self.server[1]}"

    def _send(self, method: str, headers: dict[str, str] | None = None, body: str = "") -> None:
        assert self._sip is not None
        self.cseq += 1
        lines = [
            f"{method} {self._uri()} SIP/2.0",
            f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch=z9hG4bK{uuid.uuid4().hex[:16]}",
            f'From: "{self.name}" <sip:{USER}@127.0.0.1:{self.port}>;tag=b{self.call_id[:8]}',
            f"To: <{self._uri()}>{self.to_tag}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {self.cseq} {method}",
            f"Contact: <sip:{USER}@127.0.0.1:{self.port}>",
            "Max-Forwards: 70",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        if body:
            lines.append("Content-Type: application/sdp")
        lines += [f"Content-Length: {len(body.encode())}", "", body]
        self._sip.sendto("\r\n".join(lines).encode(), self.server)

    def _sdp(self) -> str:
        return (
            "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 127.0.0.1\r\nt=0 0\r\n"
            f"m=audio {self.rtp_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=ptime:20\r\n"
        )

    async def _final(self, within_s: float = 30.0) -> str:
        """The next final response (1xx read past; a BYE from the server answered)."""
        async with asyncio.timeout(within_s):
            while True:
                message = await self._inbox.messages.get()
                if message.startswith("BYE "):
                    self._answer_bye(message)
                    continue
                if message.startswith("SIP/2.0 ") and not message.startswith("SIP/2.0 1"):
                    return message

    def _answer_bye(self, request: str) -> None:
        assert self._sip is not None
        self.hung_up_by_server = True
        keep = ("via", "from", "to", "call-id", "cseq")
        headers = [ln for ln in request.split("\r\n") if ln.split(":", 1)[0].lower() in keep]
        reply = "\r\n".join(["SIP/2.0 200 OK", *headers, "Content-Length: 0", "", ""])
        self._sip.sendto(reply.encode(), self.server)

    async def call(self) -> None:
        """INVITE, the digest answer to its 401, ACK: the call is up (else RuntimeError)."""
        self._send("INVITE", body=self._sdp())
        response = await self._final()
        status = int(response.split(" ", 2)[1])
        if status == 401:
            self._send("ACK")
            nonce = re.search(r'nonce="([^"]+)"', response)
            if nonce is None:
                raise RuntimeError("401 without a nonce")

            def h(text: str) -> str:
                return hashlib.md5(text.encode()).hexdigest()

            ha1, ha2 = h(f"{USER}:chorus:{PASSWORD}"), h(f"INVITE:{self._uri()}")
            answer = h(f"{ha1}:{nonce.group(1)}:00000001:bench:auth:{ha2}")
            auth = (
                f'Digest username="{USER}", realm="chorus", nonce="{nonce.group(1)}", '
                f'uri="{self._uri()}", response="{answer}", qop=auth, nc=00000001, cnonce="bench"'
            )
            self._send("INVITE", {"Authorization": auth}, self._sdp())
            response = await self._final()
            status = int(response.split(" ", 2)[1])
        if status != 200:
            raise RuntimeError(f"INVITE answered {response.splitlines()[0]}")
        tag = re.search(r"^To:.*?;tag=([^;>\s]+)", response, re.MULTILINE | re.IGNORECASE)
        self.to_tag = f";tag={tag.group(1)}" if tag else ""
        port = re.search(r"m=audio (\d+)", response)
        if port is None:
            raise RuntimeError("200 OK without an audio answer")
        self.answer_port = int(port.group(1))
        self._send("ACK")

    def rtp(self, seq: int, payload: bytes, frame: int | None = None,
            payload_type: int = 0) -> None:  # fmt: skip
        """One RTP packet: sequence number `seq`, the timestamp of 20 ms frame `frame` (`seq`
        unless frames were suppressed)."""
        assert self._rtp is not None
        stamp = ((seq if frame is None else frame) * FRAME_BYTES) & 0xFFFFFFFF
        header = struct.pack(">BBHII", 0x80, payload_type, seq & 0xFFFF, stamp, 0xB0)
        self._rtp.sendto(header + payload, ("127.0.0.1", self.answer_port))

    async def hang_up(self) -> None:
        if self.hung_up_by_server:
            return
        self._send("BYE")
        with contextlib.suppress(TimeoutError):
            await self._final(10.0)


# --------------------------------------------------------------------------- one call


@dataclass
class CallResult:
    turns: int = 0
    latencies: list[float] = field(default_factory=list)
    """Per turn: from sending the RTP packet with the turn's end to the turn on the feed."""
    completion: list[float] = field(default_factory=list)
    """Per turn: from the end of the speech that completes it (the latest end among the turns
    that arrived with it, `bench.load`'s completion latency) to the turn on the feed."""
    corrected: int = 0
    late_packets: int = 0
    """RTP packets sent more than 20 ms after their due time (the sender could not keep pace)."""
    slowest: list[dict[str, Any]] = field(default_factory=list)
    comfort_noise: int = 0
    """Comfort-noise packets sent (`--silence-suppression`: one per pause)."""
    suppressed_s: float = 0.0
    """Audio not sent (`--silence-suppression`)."""
    error: str | None = None


def lost_packets(count: int, loss: float, room: str) -> set[int]:
    """Which of `count` audio packets are lost on the way at `loss` (seeded by the room's name,
    so each call of a step loses its own packets, and every run the same ones)."""
    import random

    rng = random.Random(f"{room}:{loss}")
    return {n for n in range(count) if rng.random() < loss}


def suppressed_frames(frames: list[bytes]) -> list[bool]:
    """Which PCMU frames a phone with VAD/DTX does not send: every frame after
    `HANGOVER_FRAMES` frames in a row under `VAD_DBFS`, until a frame is loud again."""
    from voice.audio import level_dbfs, mulaw_decode, pcm16_to_float

    quiet_run, out = 0, []
    for frame in frames:
        level = level_dbfs(pcm16_to_float(mulaw_decode(frame)))
        quiet_run = quiet_run + 1 if level < VAD_DBFS else 0
        out.append(quiet_run > HANGOVER_FRAMES)
    return out


async def one_call(base: str, sip_port: int, room: str, mulaw: bytes, token: str,
                   suppress: bool = False, loss: float = 0.0) -> CallResult:  # fmt: skip
    """One SIP call into `room`: `mulaw` sent at real time (`suppress`: as a phone with silence
    suppression sends it), the latency of every turn its feed (opened with `token`) receives."""
    from server.client import EventFeed
    from server.protocol import FeedMessage, TurnMessage

    result = CallResult()
    versions: list[tuple[float, TurnMessage]] = []
    stopped = asyncio.Event()

    def on_message(message: FeedMessage) -> None:
        if isinstance(message, TurnMessage):
            versions.append((time.monotonic(), message))
        elif getattr(message, "type", "") == "stream_stopped":
            stopped.set()

    sent_audio: list[float] = []
    sent_wall: list[float] = []
    feed = await EventFeed.open(base, room, token, on_message=on_message)
    caller = SipCaller(sip_port, room)
    async with recorded(result, caller, feed):
        await caller.open()
        await caller.call()
        silence = b"\xff" * FRAME_BYTES
        frames = [mulaw[i : i + FRAME_BYTES] for i in range(0, len(mulaw), FRAME_BYTES)]
        frames += [silence] * int(1.0 / FRAME_S)
        quiet = suppressed_frames(frames) if suppress else [False] * len(frames)
        lost = lost_packets(len(frames), loss, room)
        result.suppressed_s = round(sum(quiet) * FRAME_S, 2)
        began, seq = time.monotonic(), 0
        for n, frame in enumerate(frames):
            due = began + n * FRAME_S
            delay = due - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            elif delay < -FRAME_S:
                result.late_packets += 1
            if not quiet[n]:
                if n not in lost:
                    caller.rtp(seq, frame.ljust(FRAME_BYTES, b"\xff"), n)
                seq += 1
            elif n == 0 or not quiet[n - 1]:  # the pause begins: one comfort-noise packet
                caller.rtp(seq, bytes([60]), n, CN_PAYLOAD_TYPE)  # -60 dBov
                seq += 1
                result.comfort_noise += 1
            sent_audio.append((n + 1) * FRAME_S)
            sent_wall.append(time.monotonic())
        await hang_up_and_flush(caller, stopped)
    settled = settled_versions(versions)
    if settled and sent_wall:
        result.completion, result.latencies = turn_latencies(
            [(t, m.end) for t, m in settled], sent_audio, sent_wall
        )
        ranked = sorted(zip(result.latencies, (m for _, m in settled), strict=True),
                        key=lambda pair: -pair[0])  # fmt: skip
        result.slowest = [
            {"latency_s": round(lat, 3), "start": m.start, "end": m.end, "text": m.text[:120]}
            for lat, m in ranked[:5]
        ]
    result.turns = len(settled)
    result.corrected = sum(1 for _, m in versions if m.corrected)
    return result


@contextlib.asynccontextmanager
async def recorded(result: Any, caller: SipCaller, feed: Any) -> AsyncIterator[None]:
    """A call's body: a failure is recorded in `result.error`, not raised (one failed call is a
    result); the caller and its room's feed are closed either way."""
    try:
        yield
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
    finally:
        caller.close()
        await feed.close()


async def hang_up_and_flush(caller: SipCaller, stopped: asyncio.Event) -> None:
    """BYE, then wait until the leg's last turns are flushed (`stopped`: its room's feed heard
    `stream_stopped`, which comes after them)."""
    await caller.hang_up()
    async with asyncio.timeout(120):
        await stopped.wait()


@dataclass
class Step:
    calls: int
    seconds: float
    turns: int
    p50_latency_s: float
    p95_latency_s: float
    max_latency_s: float
    p95_completion_s: float
    corrected: int
    late_packets: int
    cpu_percent_total: float
    cpu_percent_per_call: float
    rss_peak_mib: float
    errors: list[str]
    comfort_noise_packets: int
    suppressed_s: float
    slowest_turns: list[dict[str, Any]]

    @property
    def holds(self) -> bool:
        return not self.errors and self.turns > 0 and self.p95_latency_s < LATENCY_TARGET_S


async def _step(base: str, sip_port: int, probe: ProcessProbe, mulaw: bytes, n: int,
                seconds: float, suppress: bool = False, loss: float = 0.0) -> Step:  # fmt: skip
    cpu_before, wall_before, peak = probe.cpu_seconds(), time.monotonic(), probe.rss_mib()
    from server.auth import issue_token

    rooms = [f"sipbench-{n}-{i}" for i in range(n)]
    tasks = [asyncio.create_task(one_call(base, sip_port, room, mulaw,
                                          issue_token(SECRET, room, 7200), suppress, loss))
             for room in rooms]  # fmt: skip
    while not all(t.done() for t in tasks):
        peak = max(peak, probe.rss_mib())
        await asyncio.sleep(0.5)
    results = [t.result() for t in tasks]
    cpu = (probe.cpu_seconds() - cpu_before) / (time.monotonic() - wall_before) * 100
    latencies = [x for r in results for x in r.latencies]
    return Step(
        calls=n,
        seconds=seconds,
        turns=sum(r.turns for r in results),
        p50_latency_s=round(percentile(latencies, 50), 3),
        p95_latency_s=round(percentile(latencies, 95), 3),
        max_latency_s=round(max(latencies, default=float("nan")), 3),
        p95_completion_s=round(percentile([x for r in results for x in r.completion], 95), 3),
        corrected=sum(r.corrected for r in results),
        late_packets=sum(r.late_packets for r in results),
        cpu_percent_total=round(cpu, 1),
        cpu_percent_per_call=round(cpu / n, 1),
        rss_peak_mib=round(peak, 1),
        errors=[r.error for r in results if r.error],
        comfort_noise_packets=sum(r.comfort_noise for r in results),
        suppressed_s=round(sum(r.suppressed_s for r in results), 2),
        slowest_turns=sorted((t for r in results for t in r.slowest),
                             key=lambda t: -float(t["latency_s"]))[:5],
    )


def phone_audio(path: str, seconds: float) -> bytes:
    """The recording's first `seconds`, at 8 kHz, as PCMU bytes."""
    import numpy as np

    from voice.audio import float_to_pcm16, mulaw_encode, read_audio_16k, resample

    audio = read_audio_16k(path)[: int(seconds * 16000)]
    narrow = resample(audio, 16000, 8000)
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    counts = sorted({int(x) for x in str(args.calls).split(",") if x.strip()})
    mulaw = phone_audio(args.audio, args.seconds)
    seconds = len(mulaw) / 8000
    workdir = Path(tempfile.mkdtemp(prefix="chorus-bench-sip-"))
    env = {**os.environ, "PYANNOTE_METRICS_ENABLED": "0", "CHORUS_SECRET": SECRET}
    port, sip_port = _free_port(), _free_udp_port()
    most = max(counts) + 4
    model = f'model = "{args.stt_model}"\n' if args.stt_model else ""
    async with contextlib.AsyncExitStack() as stack:
        stt = f'[stt]\nprovider = "whisper"\n{model}'
        if args.stt == "deepgram":
            dg_port = await stack.enter_async_context(_deepgram_stand_in(workdir, env))
            stt = ('[stt]\nprovider = "deepgram"\n'
                   f'deepgram_url = "ws://127.0.0.1:{dg_port}"\ndeepgram_api_key = "bench"\n')
        return await _serve_and_call(args, counts, mulaw, seconds, workdir, env, port, sip_port,
                                     most, stt)


@contextlib.asynccontextmanager
async def _deepgram_stand_in(workdir: Path, env: dict[str, str]) -> AsyncIterator[int]:
    """`bench.load`'s Deepgram-protocol stand-in in its own process; yields its port."""
    port_file = workdir / "deepgram.port"
    command = deepgram_server_command(sys.executable, port_file, REPO / "examples" / "meeting")
    with _process(command, env, workdir / "deepgram.log") as dg:
        yield await _wait_file(port_file, dg, "deepgram-protocol server")


async def _serve_and_call(
    args: argparse.Namespace, counts: list[int], mulaw: bytes, seconds: float, workdir: Path,
    env: dict[str, str], port: int, sip_port: int, most: int, stt: str,
) -> int:
    config = workdir / "chorus.toml"
    config.write_text(
        stt
        + '[store]\nurl = "memory://"\n'  # each run's rooms its own (the default keeps them)
        + '[realtime]\nprovider = "recorder"\n'
        f"[limits]\nmax_streams = {most}\n"
        f'[sip]\nenabled = true\nlisten = "127.0.0.1:{sip_port}"\n'
        f'users = {{ {USER} = "{PASSWORD}" }}\nmax_calls = {most}\n'
    )
    serve = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--config",
             str(config), "--log-level", "WARNING"]  # fmt: skip
    steps: list[Step] = []
    with _process(serve, env, workdir / "server.log") as srv:
        await _wait_port(port, srv, "chorus serve")
        probe = ProcessProbe(srv.pid)
        print(f"server pid {srv.pid}, SIP on udp/{sip_port}, {seconds:.0f} s of {args.audio} per "
              f"call; logs in {workdir}", file=sys.stderr)  # fmt: skip
        for n in counts:
            step = await _step(f"ws://127.0.0.1:{port}", sip_port, probe, mulaw, n, seconds,
                               args.silence_suppression, args.loss)
            steps.append(step)
            print(f"N={n}: turns {step.turns}, p50 {step.p50_latency_s:.2f} s, p95 "
                  f"{step.p95_latency_s:.2f} s, CPU {step.cpu_percent_per_call:.0f} %/call"
                  + (f", errors {step.errors[:2]}" if step.errors else ""),
                  file=sys.stderr)  # fmt: skip
            if not step.holds and not args.keep_going:
                break
    largest = max((s.calls for s in steps if s.holds), default=0)
    print("| SIP calls | turns | p50 latency (s) | p95 latency (s) | max (s) | p95 completion (s) "
          "| corrected | late RTP packets | server CPU %/call | RSS peak (MiB) | errors |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in steps:
        print(f"| {s.calls} | {s.turns} | {s.p50_latency_s:.2f} | {s.p95_latency_s:.2f} | "
              f"{s.max_latency_s:.2f} | {s.p95_completion_s:.2f} | {s.corrected} | {s.late_packets} | "
              f"{s.cpu_percent_per_call:.0f} | {s.rss_peak_mib:.0f} | {len(s.errors)} |")  # fmt: skip
    print(f"\nlargest N with p95 latency < {LATENCY_TARGET_S:g} s: {largest}")
    if args.json:
        out = {"largest_calls_under_target": largest, "target_p95_s": LATENCY_TARGET_S,
               "audio": args.audio, "silence_suppression": args.silence_suppression,
               "loss": args.loss,
               "steps": [asdict(s) for s in steps]}  # fmt: skip
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(out, indent=2))
    return 0


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
