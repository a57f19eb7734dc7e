"""Server load: N concurrent shared-mic device streams at real-time pace.

`chorus bench load` starts a local Deepgram-protocol server (the STT stand-in, on 127.0.0.1)
and `chorus serve` in its own process (STT through that server, embedded diarization, recorder
realtime session), then for each N in `--streams` streams the demo meeting from N devices at
once, each in its own room, exactly as a room device would (real-time pace, 100 ms frames).
It measures, per N: turn latency as a device feels it, and the server process's CPU and memory
per stream. Latency comes two ways: strict, from sending the audio up to a turn's own end to
receiving the turn; and completion, from the end of the speech that completes the turn (the STT
result it was cut from). The largest N whose strict p95 stays under 1 s is the answer: the
completion figure forgives a turn its wait for the rest of that result, the very wait early
commit exists to cut, so it cannot say what a device waits (it stays a column). `--soak SECONDS`
then keeps `--soak-streams` streams running (looping the meeting) and samples the server's memory
over time.

`--flood` adds the flood case (issue 10): `--flood-streams` rooms stream the meeting at real
time twice, first alone, then while one more device in its own room floods the server (the
meeting as fast as the socket takes it, alternating 2-byte and full-size frames; with
`--flood-frame-bytes N` frames of N bytes only, e.g. 65536: the largest the server takes). The other
rooms' p95 should not move beyond noise; the flooder's fate (how much audio the server took, how
it was closed) is reported. `--stt whisper` serves with the embedded default instead (local
Whisper, no stand-in), so any recording can be streamed (`--audio`, e.g. an unseen LibriSpeech
conversation): issue 10's latency measurement; `--diarizer none` measures it without pipeline
speakers. A turn re-sent corrected counts from its settled version (`settled_versions`).
`--second-pass MODEL` serves with the live second pass on (`[stt] second_pass`): its corrections
arrive seconds later and are counted apart; the latency stays the first pass's.
`--server-repo PATH` (repeatable) runs everything against the `chorus serve` of another
checkout too (e.g. an older commit), in the same run, one server after the other, so old and
new are measured by the same command on the same machine state. `--chat-delay SECONDS` measures
each server twice, without a chat model and then with `[chat]` pointed at a local Chat Completions
stand-in that answers every turn after SECONDS (`bench.slow_chat`; issue 24.1: a slow chat model
must not hold the voice turns back); each row also counts the turns that reached the device while
it was still streaming and the model's replies it got.

Everything stays on 127.0.0.1 and every loop is bounded (`--streams`, `--seconds`, `--soak`).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from server.client import DeviceStream
from server.config import load_config
from server.metrics import percentile
from server.protocol import (
    DiarizationStatusMessage,
    FeedMessage,
    ReplyMessage,
    StartMessage,
    TurnMessage,
)

REPO = Path(__file__).resolve().parents[1]
DEFAULT_AUDIO = REPO / "examples" / "meeting" / "meeting.wav"
SECRET = "chorus-bench-secret-0123456789abcdef"
LATENCY_TARGET_S = 1.0
CLK_TCK = os.sysconf("SC_CLK_TCK")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", default="1,2,4,6,8", help="comma-separated N to try, rising")
    parser.add_argument("--seconds", type=float, default=60.0, help="audio per stream per step")
    parser.add_argument("--audio", default=str(DEFAULT_AUDIO), help="16 kHz mono WAV to stream")
    parser.add_argument(
        "--soak", type=float, default=0.0, help="soak seconds after the ramp (0: none)"
    )
    parser.add_argument(
        "--soak-streams",
        type=int,
        default=0,
        help="streams during the soak (0: the largest N that held)",
    )
    parser.add_argument(
        "--stt",
        choices=["deepgram", "whisper"],
        default="deepgram",
        help="deepgram: the local Deepgram-protocol stand-in (knows only the demo meeting's words); "
        "whisper: the embedded default (local Whisper tiny.en), any recording",
    )
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument(
        "--keep-going", action="store_true", help="do not stop at the first N over target"
    )
    parser.add_argument(
        "--flood", action="store_true", help="add the flood case (one device floods its room)"
    )
    parser.add_argument(
        "--flood-streams", type=int, default=2, help="real-time rooms in the flood case"
    )
    parser.add_argument(
        "--flood-frame-bytes",
        type=int,
        default=0,
        metavar="BYTES",
        help="the flooder sends frames of BYTES only (65536: the server's default frame limit); "
        "0: 60 KiB frames alternating with runs of 1000 two-byte frames",
    )
    parser.add_argument(
        "--second-pass",
        default=None,
        metavar="MODEL",
        help="with --stt whisper: serve with the live second pass on ([stt] second_pass = MODEL, "
        "e.g. base); its corrections are counted apart, the latency is the first pass's",
    )
    parser.add_argument(
        "--diarizer",
        choices=["embedded", "none"],
        default="embedded",
        help="the server's diarization stage: embedded (pipeline speakers, the default) or none "
        "(speakers from the STT alone: the Deepgram stand-in's own speaker ids; with --stt "
        "whisper, none: the latency without pipeline speakers)",
    )
    parser.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="chorus.toml",
        help="the turn rules from this file's [voice] section, written into the server's config "
        "(an older checkout given with --server-repo may not know the section)",
    )
    parser.add_argument(
        "--chat-delay",
        type=float,
        default=None,
        metavar="SECONDS",
        help="measure each server without a chat model, then with [chat] (answer: always) on a "
        "local Chat Completions stand-in that takes SECONDS per answer",
    )
    parser.add_argument(
        "--server-repo",
        action="append",
        default=None,
        help="checkout whose `chorus serve` to measure (repeatable; default: this one)",
    )


def chat_section(chat: tuple[int | None, float] | None, repo: Path = REPO) -> str:
    """`[chat]` on the stand-in at `chat`'s port, answering every turn; nothing for None. The
    `answer` key only for a checkout that knows it: before issue 24.2 the chat model answered
    every turn anyway."""
    if chat is None:
        return ""
    knows_answer = "answer:" in (repo / "server" / "config.py").read_text()
    return (
        '[chat]\nprovider = "openai"\n'
        f'base_url = "http://127.0.0.1:{chat[0]}/v1"\nmodel = "bench"\napi_key = "bench"\n'
        + ('answer = "always"\n' if knows_answer else "")
    )


def chat_server_command(python: str, port_file: Path, delay: float) -> list[str]:
    """The stand-in chat model in its own process (`bench.slow_chat`)."""
    return [
        python,
        "-c",
        f"import bench.slow_chat as c; c.serve({str(port_file)!r}, {delay!r})",
    ]


def voice_section(path: Path | None) -> str:
    """`path`'s `[voice]` table (the turn rules, validated as the server will) as TOML lines."""
    if path is None:
        return ""
    voice = load_config(path, environ={}).voice
    lines = [f"{key} = {json.dumps(value)}" for key, value in voice.model_dump().items()]
    return "[voice]\n" + "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- processes


def _write(path: str, text: str) -> None:
    Path(path).write_text(text)


def _read_port(path: Path) -> int | None:
    text = path.read_text().strip() if path.exists() else ""
    return int(text) if text else None


def _resolve(path: str) -> Path:
    return Path(path).resolve()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessProbe:
    """CPU seconds and resident memory of one process, from /proc (Linux)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")


async def _wait_port(
    port: int, proc: subprocess.Popen[bytes], what: str, within_s: float = 120
) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        with contextlib.suppress(OSError):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{what} did not open port {port}")


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> Any:
    with log.open("wb") as out:
        proc = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=cwd)
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def deepgram_server_command(python: str, port_file: Path, meeting_dir: Path) -> list[str]:
    """The local Deepgram-protocol server in its own process (its CPU is not the server's)."""
    return [
        python,
        "-c",
        f"import bench.load as b; b.serve_deepgram({str(port_file)!r}, {str(meeting_dir)!r})",
    ]


def serve_deepgram(port_file: str, meeting_dir: str) -> None:
    """Run `DeepgramTestServer` with the meeting's words until terminated; write its port."""
    import signal

    from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        async with DeepgramTestServer(
            MeetingWords.from_meeting(meeting_dir), idle_timeout=60
        ) as server:
            _write(port_file, str(server.port))
            await stop.wait()

    asyncio.run(main())


# --------------------------------------------------------------------------- one device


@dataclass
class StreamResult:
    turns: int = 0
    latencies: list[float] = field(default_factory=list)
    """Per turn: from sending the audio up to the end of the speech that completes the turn
    (the end of the STT result it was cut from) to receiving the turn."""
    strict_latencies: list[float] = field(default_factory=list)
    """Per turn: from sending the audio up to the turn's own end to receiving it."""
    corrected: int = 0
    """Turns re-sent corrected (`corrected: true`); each counts from its settled version."""
    second_pass_corrected: int = 0
    """Turns the live second pass re-sent (`second_pass: true`; not in the latencies)."""
    second_pass_latencies: list[float] = field(default_factory=list)
    """Per second-pass correction: from sending the audio up to the turn's end to receiving it."""
    slowest: list[dict[str, Any]] = field(default_factory=list)
    """The `SLOWEST_KEPT` turns with the largest strict latency (where a tail comes from)."""
    turns_while_streaming: int = 0
    """Turns (first versions) that reached the device before its last frame was sent."""
    replies: int = 0
    """The assistant's replies (`reply` messages) the device got."""
    refused: bool = False
    """The server refused the stream (4429: its diarization stage was shedding streams)."""
    degraded: bool = False
    """The stream was taken off the diarization stage (`diarization_status` degraded)."""
    statuses: list[tuple[float, str]] = field(default_factory=list)
    """Each `diarization_status` as it arrived (monotonic wall time, `degraded`/`recovered`)."""
    ended: float | None = None
    """Monotonic wall time the stream ended (its device stopped, or failed)."""
    error: str | None = None
    versions: list[tuple[float, TurnMessage]] = field(default_factory=list)
    """Every `turn` message as it arrived (monotonic wall time, message), corrections included."""
    sent_wall: list[float] = field(default_factory=list)
    """Monotonic wall time at which each frame was sent (the first: the stream's start)."""


SLOWEST_KEPT = 5


BATCH_S = 0.05
"""Turns received within this of each other were cut from one STT result."""


def settled_versions(versions: list[tuple[float, TurnMessage]]) -> list[tuple[float, TurnMessage]]:
    """(wall time, final version) of each turn as the device finally shows it: a turn committed
    early and corrected later (`corrected: true`, same `event_id`) counts from the first version
    that already had its final speaker and end, not from its first, wrong one. The live second
    pass's versions (`second_pass: true`) are not the first pass's: left out (the latency measured
    is the first pass's)."""
    versions = [(now, m) for now, m in versions if not m.second_pass]
    latest: dict[str, TurnMessage] = {}
    for _, m in versions:
        if m.event_id is not None:
            latest[m.event_id] = m
    settled: set[str] = set()
    out: list[tuple[float, TurnMessage]] = []
    for now, m in versions:
        if m.event_id is None:
            out.append((now, m))
            continue
        final = latest[m.event_id]
        if m.event_id not in settled and (m.label, m.speaker) == (final.label, final.speaker) \
                and abs(m.end - final.end) < 0.01:
            settled.add(m.event_id)
            out.append((now, final))
    return out


def turn_latencies(
    received: list[tuple[float, float]], sent_audio: list[float], sent_wall: list[float]
) -> tuple[list[float], list[float]]:
    """(completion latencies, strict latencies) of turns received as (wall time, turn end).

    A turn that ends at a speaker change inside one STT result cannot be known before that
    result is: its completion is the result's end, the latest end among the turns that arrived
    with it.
    """

    def sent_at(audio_s: float) -> float:
        i = min(bisect.bisect_left(sent_audio, audio_s - 1e-6), len(sent_wall) - 1)
        return sent_wall[i]

    strict = [now - sent_at(end) for now, end in received]
    completion: list[float] = []
    batch: list[tuple[float, float]] = []
    for now, end in [*sorted(received), (float("inf"), 0.0)]:
        if batch and now - batch[-1][0] > BATCH_S:
            done = max(e for _, e in batch)
            completion += [t - sent_at(done) for t, _ in batch]
            batch = []
        batch.append((now, end))
    return completion, strict


def off_stage_seconds(statuses: list[tuple[float, str]], began: float, ended: float) -> float:
    """Seconds of a stream (from `began` to `ended`, monotonic wall time) its speakers came from
    the STT rather than the stage: from each `degraded` status to the next `recovered` one (or
    the stream's end)."""
    off, since = 0.0, None
    for at, status in sorted(statuses):
        at = min(max(at, began), ended)
        if status == "degraded" and since is None:
            since = at
        elif status == "recovered" and since is not None:
            off += at - since
            since = None
    if since is not None:
        off += ended - since
    return off


def stage_share(results: list[StreamResult]) -> float | None:
    """The share of the streams' time their speakers came from the stage (None: no stream
    streamed). A stream that never heard a `diarization_status` counts as on it throughout."""
    total = off = 0.0
    for r in results:
        if not r.sent_wall or r.ended is None:
            continue
        total += r.ended - r.sent_wall[0]
        off += off_stage_seconds(r.statuses, r.sent_wall[0], r.ended)
    return None if total <= 0 else 1 - off / total


async def _one_device(
    base: str,
    room: str,
    audio: bytes,
    seconds: float,
    tokens: TokenMinter,
    before_stop: Callable[[StreamResult], Awaitable[None]] | None = None,
) -> StreamResult:
    """Stream `seconds` of `audio` at real-time pace in 100 ms frames; latency of every turn.
    `before_stop`: awaited after the last frame, while the stream is still open (the turns so
    far are in the result's `versions`)."""
    result = StreamResult()
    sent_audio: list[float] = []
    sent_wall = result.sent_wall
    received: list[tuple[float, float]] = []

    versions = result.versions

    def on_message(message: FeedMessage) -> None:
        if isinstance(message, TurnMessage):
            versions.append((time.monotonic(), message))
        elif isinstance(message, ReplyMessage):
            result.replies += 1
        elif isinstance(message, DiarizationStatusMessage):
            result.statuses.append((time.monotonic(), message.status))
            result.degraded = result.degraded or message.status == "degraded"

    start = StartMessage(participant=f"dev-{room}", name=room, sample_rate=16000, shared_mic=True)
    device: DeviceStream | None = None
    try:
        device = await DeviceStream.open(
            base, room, await tokens.mint(room), start, on_message=on_message
        )
        total = min(int(seconds * 16000) * 2, len(audio))
        frame = 3200  # 100 ms
        began = time.monotonic()
        for offset in range(0, total, frame):
            delay = began + offset / 32000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            piece = audio[offset : min(offset + frame, total)]
            await device.ws.send(piece)
            sent_audio.append((offset + len(piece)) / 32000)
            sent_wall.append(time.monotonic())
        if before_stop is not None:
            await before_stop(result)
        async with asyncio.timeout(120):
            await device.stop()
    except Exception as exc:  # recorded, not raised: one failed device is a result
        if device is not None and device.ws.close_code == 4429 and not versions:
            result.refused = True  # shed by the server (issue 31): a result, not an error
        else:
            result.error = f"{type(exc).__name__}: {exc}"
    result.ended = time.monotonic()
    settled = settled_versions(versions)
    received = [(now, m.end) for now, m in settled]
    if received and sent_wall:
        result.latencies, result.strict_latencies = turn_latencies(received, sent_audio, sent_wall)
        ranked = sorted(zip(result.strict_latencies, (m for _, m in settled), strict=True),
                        key=lambda pair: -pair[0])
        result.slowest = [
            {"strict_latency_s": round(lat, 3), "start": m.start, "end": m.end,
             "speaker": m.speaker, "text": m.text[:120]}
            for lat, m in ranked[:SLOWEST_KEPT]
        ]
    result.turns = len(received)
    result.corrected = sum(1 for _, m in versions if m.corrected and not m.second_pass)
    result.second_pass_corrected = sum(1 for _, m in versions if m.second_pass)
    if result.second_pass_corrected and sent_wall:
        result.second_pass_latencies = turn_latencies(
            [(now, m.end) for now, m in versions if m.second_pass], sent_audio, sent_wall)[1]
    if sent_wall:
        result.turns_while_streaming = sum(
            1 for now, m in versions if not m.corrected and now <= sent_wall[-1]
        )
    return result


# --------------------------------------------------------------------------- steps


@dataclass
class StepResult:
    streams: int
    seconds: float
    turns: int
    p50_latency_s: float
    p95_latency_s: float
    """Completion p95: from the end of the speech that completes each turn (a column only)."""
    max_latency_s: float
    p95_strict_latency_s: float
    """Strict p95: from each turn's own end. The step holds when it is under target."""
    corrected: int
    """Turns re-sent corrected (early turns the final result changed)."""
    slowest_turns: list[dict[str, Any]]
    """The step's turns with the largest strict latency, slowest first (in the JSON only)."""
    cpu_percent_total: float
    cpu_percent_per_stream: float
    rss_before_mib: float
    rss_peak_mib: float
    rss_per_stream_mib: float
    errors: list[str]
    turns_while_streaming: int = 0
    """Turns that reached their device while it was still streaming."""
    second_pass_corrected: int = 0
    """Turns the live second pass corrected (`--second-pass`), re-sent after the latencies."""
    p95_second_pass_latency_s: float | None = None
    """How late its corrections came: p95 from each corrected turn's own end."""
    replies: int = 0
    """The chat model's (or realtime session's) replies the devices got."""
    refused: int = 0
    """Streams the server refused (4429 while its diarization stage shed streams, issue 31)."""
    degraded: int = 0
    """Streams taken off the diarization stage (speakers from the STT: `diarization_status`)."""
    on_stage: float | None = None
    """Share of the streams' time their speakers came from the stage (`stage_share`; with
    `--diarizer none` every stream counts as on it, having heard no status)."""

    @property
    def holds(self) -> bool:
        """No errors, some turns, and the strict p95 under `LATENCY_TARGET_S`."""
        return not self.errors and self.turns > 0 and self.p95_strict_latency_s < LATENCY_TARGET_S


async def _step(
    base: str,
    probe: ProcessProbe,
    audio: bytes,
    n: int,
    seconds: float,
    tag: str,
    tokens: TokenMinter,
) -> StepResult:
    rss_before = probe.rss_mib()
    cpu_before = probe.cpu_seconds()
    wall_before = time.monotonic()
    peak = rss_before
    tasks = [
        asyncio.create_task(_one_device(base, f"{tag}-{n}-{i}", audio, seconds, tokens))
        for i in range(n)
    ]
    while not all(t.done() for t in tasks):
        peak = max(peak, probe.rss_mib())
        await asyncio.sleep(0.5)
    results = [t.result() for t in tasks]
    wall = time.monotonic() - wall_before
    cpu = (probe.cpu_seconds() - cpu_before) / wall * 100
    latencies = [x for r in results for x in r.latencies]
    return StepResult(
        streams=n,
        seconds=seconds,
        turns=sum(r.turns for r in results),
        p50_latency_s=round(percentile(latencies, 50), 3),
        p95_latency_s=round(percentile(latencies, 95), 3),
        max_latency_s=round(max(latencies, default=float("nan")), 3),
        p95_strict_latency_s=round(
            percentile([x for r in results for x in r.strict_latencies], 95), 3
        ),
        corrected=sum(r.corrected for r in results),
        second_pass_corrected=sum(r.second_pass_corrected for r in results),
        p95_second_pass_latency_s=round(
            percentile([x for r in results for x in r.second_pass_latencies], 95), 3)
        if any(r.second_pass_latencies for r in results) else None,
        slowest_turns=sorted((t for r in results for t in r.slowest),
                             key=lambda t: -float(t["strict_latency_s"]))[:SLOWEST_KEPT],
        cpu_percent_total=round(cpu, 1),
        cpu_percent_per_stream=round(cpu / n, 1),
        rss_before_mib=round(rss_before, 1),
        rss_peak_mib=round(peak, 1),
        rss_per_stream_mib=round((peak - rss_before) / n, 1),
        errors=[r.error for r in results if r.error],
        turns_while_streaming=sum(r.turns_while_streaming for r in results),
        replies=sum(r.replies for r in results),
        refused=sum(r.refused for r in results),
        degraded=sum(r.degraded for r in results),
        on_stage=None if (share := stage_share(results)) is None else round(share, 3),
    )


async def _soak(
    base: str, probe: ProcessProbe, audio: bytes, n: int, seconds: float, tokens: TokenMinter
) -> dict[str, Any]:
    """`n` rooms, each holding one meeting after another (a device per meeting) for `seconds`."""
    samples: list[tuple[float, float]] = []
    began = time.monotonic()
    meeting_s = len(audio) / 32000

    async def room(i: int) -> list[StreamResult]:
        results: list[StreamResult] = []
        while time.monotonic() - began + meeting_s <= seconds + 1:  # bounded by the soak time
            results.append(await _one_device(base, f"soak-{i}", audio, meeting_s, tokens))
        return results

    tasks = [asyncio.create_task(room(i)) for i in range(n)]
    with tqdm(total=int(seconds), desc=f"soak {n} streams", unit="s") as bar:
        while not all(t.done() for t in tasks):
            elapsed = time.monotonic() - began
            samples.append((round(elapsed, 1), round(probe.rss_mib(), 1)))
            bar.n = min(int(elapsed), int(seconds))
            bar.refresh()
            await asyncio.sleep(5)
    samples.append((round(time.monotonic() - began, 1), round(probe.rss_mib(), 1)))
    results = [r for t in tasks for r in t.result()]
    latencies = [x for r in results for x in r.latencies]
    rss = [m for _, m in samples]
    later = [m for t, m in samples if t >= 60] or rss
    return {
        "streams": n,
        "seconds": round(time.monotonic() - began, 1),
        "meetings": len(results),
        "turns": sum(r.turns for r in results),
        "p95_latency_s": round(percentile(latencies, 95), 3),
        "rss_start_mib": rss[0],
        "rss_after_1min_mib": later[0],
        "rss_end_mib": rss[-1],
        "rss_max_mib": max(rss),
        "samples": samples,
        "errors": [r.error for r in results if r.error],
    }


# --------------------------------------------------------------------------- tokens


class TokenMinter:
    """Room tokens the server under test accepts, minted by that checkout's own code (an older
    server speaks an older token format), in one subprocess per batch of rooms."""

    def __init__(self, repo: Path, python: str, env: dict[str, str]) -> None:
        self.repo = repo
        self.python = python
        self.env = env
        self._cache: dict[str, str] = {}

    async def mint(self, *rooms: str) -> str:
        """Tokens for `rooms` (cached); returns the first room's."""
        wanted = [r for r in rooms if r not in self._cache]
        if wanted:
            code = (
                "import sys; from server.auth import issue_token\n"
                "for room in sys.argv[2:]: print(issue_token(sys.argv[1], room, 7200))"
            )
            proc = await asyncio.create_subprocess_exec(
                self.python, "-c", code, SECRET, *wanted,
                cwd=self.repo, env=self.env, stdout=subprocess.PIPE,
            )  # fmt: skip
            out, _ = await proc.communicate()
            lines = out.decode().split()
            if proc.returncode != 0 or len(lines) != len(wanted):
                raise RuntimeError(f"could not mint tokens in {self.repo}")
            self._cache.update(zip(wanted, lines, strict=True))
        return self._cache[rooms[0]]


# --------------------------------------------------------------------------- flood


@dataclass
class FloodResult:
    streams: int
    p95_alone_s: float
    p95_flooded_s: float
    p50_alone_s: float
    p50_flooded_s: float
    turns_alone: int
    turns_flooded: int
    flood_sent_s: float
    """Seconds of audio the flooder got onto its socket (what the server read, or buffers)."""
    flood_closed: str
    """How the flooder's socket ended (close code and reason, or `open` at the end)."""
    errors: list[str]
    flood_frame_bytes: int = 0
    """The flooder's frame size (0: 60 KiB frames alternating with runs of 2-byte frames)."""


async def _flooder(
    base: str, token: str, audio: bytes, stop: asyncio.Event, frame_bytes: int = 0
) -> tuple[float, str]:
    """One device sending `audio` over and over as fast as its socket takes it, until `stop` or
    the server closes: frames of `frame_bytes`, or (0) 2-byte frames (1000 at a time)
    alternating with 60 KiB frames."""
    start = StartMessage(participant="flooder", sample_rate=16000, shared_mic=True)
    device = await DeviceStream.open(base, "flood-room", token, start, max_size=None)
    sent = 0
    big = frame_bytes or 60 * 1024
    tiny = 0 if frame_bytes else 1000
    try:
        while not stop.is_set():
            for offset in range(0, len(audio) - big, big):
                if stop.is_set():
                    break
                await device.ws.send(audio[offset : offset + big])
                for i in range(offset, offset + 2 * tiny, 2):
                    await device.ws.send(audio[i : i + 2])
                sent += big + 2 * tiny
    except Exception:  # the server closed it: that is a result
        pass
    closed = (
        f"{device.ws.close_code} {device.ws.close_reason}"
        if device.ws.close_code is not None
        else "open"
    )
    with contextlib.suppress(Exception):
        await device.ws.close()
    return sent / 32000, closed


def flood_main(base: str, token: str, audio_path: str, frame_bytes: int = 0) -> None:
    """The flooding device as a process: floods until its stdin closes (or the server closes
    it), then prints `{"sent_s": …, "closed": …}`."""
    import threading

    from voice.audio import float_to_pcm16, read_audio_16k

    audio = float_to_pcm16(read_audio_16k(audio_path))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def wait_for_eof() -> None:
            sys.stdin.read()
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=wait_for_eof, daemon=True).start()
        sent_s, closed = await _flooder(base, token, audio, stop, frame_bytes)
        print(json.dumps({"sent_s": sent_s, "closed": closed}), flush=True)

    asyncio.run(main())


async def _flood_case(
    base: str,
    audio: bytes,
    audio_path: Path,
    n: int,
    seconds: float,
    tokens: TokenMinter,
    frame_bytes: int = 0,
) -> FloodResult:
    async def rooms(tag: str) -> list[StreamResult]:
        names = [f"{tag}-{i}" for i in range(n)]
        await tokens.mint(*names)
        return list(
            await asyncio.gather(*(_one_device(base, r, audio, seconds, tokens) for r in names))
        )

    alone = await rooms("calm")
    # the flooder runs in its own process: its sending must not slow the measuring clients' loop
    flooder = await asyncio.create_subprocess_exec(
        sys.executable, "-c",
        f"import bench.load as b; b.flood_main({base!r}, {await tokens.mint('flood-room')!r}, "
        f"{str(audio_path)!r}, {frame_bytes})",
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    flooded = await rooms("busy")
    assert flooder.stdin is not None
    flooder.stdin.close()  # stop flooding
    async with asyncio.timeout(120):
        out, _ = await flooder.communicate()
    try:
        report = json.loads(out.decode().strip().splitlines()[-1])
        sent_s, closed = float(report["sent_s"]), str(report["closed"])
    except (ValueError, KeyError, IndexError):
        sent_s, closed = float("nan"), f"flooder failed ({flooder.returncode})"

    def lat(results: list[StreamResult]) -> list[float]:
        return [x for r in results for x in r.latencies]

    return FloodResult(
        streams=n,
        p95_alone_s=round(percentile(lat(alone), 95), 3),
        p95_flooded_s=round(percentile(lat(flooded), 95), 3),
        p50_alone_s=round(percentile(lat(alone), 50), 3),
        p50_flooded_s=round(percentile(lat(flooded), 50), 3),
        turns_alone=sum(r.turns for r in alone),
        turns_flooded=sum(r.turns for r in flooded),
        flood_sent_s=round(sent_s, 1),
        flood_closed=closed,
        errors=[r.error for r in alone + flooded if r.error],
        flood_frame_bytes=frame_bytes,
    )


# --------------------------------------------------------------------------- entry point


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> int:
    for _ in range(600):
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        port = _read_port(path)
        if port is not None:
            return port
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{what} did not start")


@dataclass
class ServerRun:
    """Everything measured against one checkout's `chorus serve`."""

    repo: str
    commit: str
    steps: list[StepResult]
    soak: dict[str, Any] | None
    flood: FloodResult | None
    chat_delay_s: float | None = None
    """Seconds the stand-in chat model took per answer; None: the server had no chat model."""

    @property
    def largest(self) -> int:
        """The largest N whose step held (strict p95 under target); 0 when none did."""
        return max((s.streams for s in self.steps if s.holds), default=0)


def _commit_of(repo: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


async def _run(args: argparse.Namespace) -> int:
    from voice.audio import float_to_pcm16, read_audio_16k

    audio = float_to_pcm16(read_audio_16k(args.audio))
    counts = sorted({int(x) for x in str(args.streams).split(",") if x.strip()})
    seconds = min(args.seconds, len(audio) / 32000)  # one pass: the STT stand-in knows one meeting
    workdir = Path(tempfile.mkdtemp(prefix="chorus-bench-load-"))
    env = {**os.environ, "PYANNOTE_METRICS_ENABLED": "0", "CHORUS_SECRET": SECRET}
    py = sys.executable
    port_file = workdir / "deepgram.port"
    meeting_dir = _resolve(args.audio).parent
    repos = [_resolve(r) for r in (args.server_repo or [str(REPO)])]
    runs: list[ServerRun] = []
    chat_delays: list[float | None] = [None] if args.chat_delay is None else [None, args.chat_delay]
    with contextlib.ExitStack() as stack:
        chat_port = None
        if args.chat_delay is not None:
            chat_file = workdir / "chat.port"
            chat = stack.enter_context(
                _process(chat_server_command(py, chat_file, args.chat_delay), env, workdir / "chat.log")
            )
            chat_port = await _wait_file(chat_file, chat, "chat completions stand-in")
        dg_port = None
        if args.stt == "deepgram":
            dg = stack.enter_context(
                _process(
                    deepgram_server_command(py, port_file, meeting_dir), env, workdir / "deepgram.log"
                )
            )
            dg_port = await _wait_file(port_file, dg, "deepgram-protocol server")
        for k, repo in enumerate(repos):
            for c, delay in enumerate(chat_delays):
                runs.append(
                    await _one_server(
                        args, repo, workdir / f"server-{k}-{c}", dg_port, audio, counts, seconds,
                        env, chat=None if delay is None else (chat_port, delay),
                    )
                )  # fmt: skip
    for run in runs:
        _print_run(run, len(runs) > 1)
    if args.json:
        out = [
            {
                "repo": r.repo,
                "commit": r.commit,
                "chat_delay_s": r.chat_delay_s,
                # decided on each step's strict p95 (from each turn's own end), not the
                # completion p95 (`p95_latency_s`), which forgives the wait early commit cuts
                "largest_streams_under_target": r.largest,
                "target_p95_s": LATENCY_TARGET_S,
                "target_p95_of": "p95_strict_latency_s",
                "steps": [asdict(s) for s in r.steps],
                "soak": r.soak,
                "flood": asdict(r.flood) if r.flood else None,
            }
            for r in runs
        ]
        await asyncio.to_thread(
            Path(args.json).write_text, json.dumps(out[0] if len(out) == 1 else out, indent=2)
        )
    return 0


def serve_module(repo: Path) -> str:
    """The module that runs `chorus serve` in `repo`: `cli.main` since the CLI moved out of
    `server` (issue 10), `server.cli` in an older checkout given to `--server-repo`."""
    return "cli.main" if (repo / "cli" / "main.py").is_file() else "server.cli"


async def _one_server(
    args: argparse.Namespace,
    repo: Path,
    workdir: Path,
    dg_port: int | None,
    audio: bytes,
    counts: list[int],
    seconds: float,
    env: dict[str, str],
    chat: tuple[int | None, float] | None = None,
) -> ServerRun:
    """One checkout's server through the ramp (and the flood and soak when asked); `chat`: the
    stand-in chat model's port and delay, for a server with `[chat]` answering every turn."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    py = sys.executable
    steps: list[StepResult] = []
    soak: dict[str, Any] | None = None
    flood: FloodResult | None = None
    port = _free_port()
    config = workdir / "chorus.toml"
    stt = (
        '[stt]\nprovider = "whisper"\n'
        + (f'second_pass = "{args.second_pass}"\n' if args.second_pass else "")
        if dg_port is None
        else '[stt]\nprovider = "deepgram"\n'
        f'deepgram_url = "ws://127.0.0.1:{dg_port}"\ndeepgram_api_key = "bench"\n'
        # the stand-in's own speaker ids (Deepgram diarization) only when no stage gives them
        f"diarize = {'true' if args.diarizer == 'none' else 'false'}\n"
    )
    config.write_text(
        stt
        + voice_section(args.config)
        + f'[diarizer]\nkind = "{args.diarizer}"\n'
        '[realtime]\nprovider = "recorder"\n'
        + chat_section(chat, repo)
        + f"[limits]\nmax_streams = {max([*counts, args.soak_streams, args.flood_streams]) + 4}\n"
    )
    serve = [py, "-m", serve_module(repo), "serve", "--port", str(port), "--config", str(config),
             "--log-level", "WARNING"]  # fmt: skip
    tokens = TokenMinter(repo, py, env)
    with _process(serve, env, workdir / "server.log", cwd=repo) as srv:
        await _wait_port(port, srv, "chorus serve")
        probe = ProcessProbe(srv.pid)
        base = f"ws://127.0.0.1:{port}"
        print(
            f"{repo} ({_commit_of(repo)}): server pid {srv.pid}, idle RSS "
            f"{probe.rss_mib():.0f} MiB; logs in {workdir}",
            file=sys.stderr,
        )
        for n in tqdm(counts, desc="streams", unit="step"):
            await tokens.mint(*(f"load-{n}-{i}" for i in range(n)))
            step = await _step(base, probe, audio, n, seconds, "load", tokens)
            steps.append(step)
            tqdm.write(
                f"N={n}: turns {step.turns}, strict p95 {step.p95_strict_latency_s:.2f} s "
                f"(completion {step.p95_latency_s:.2f} s), "
                f"CPU {step.cpu_percent_per_stream:.1f} %/stream, RSS peak {step.rss_peak_mib:.0f} MiB"
                + (f", refused {step.refused}, degraded {step.degraded}"
                   if step.refused or step.degraded else "")
                + (f", errors {step.errors[:2]}" if step.errors else "")
            )
            if not step.holds and not args.keep_going:
                break
        held = [s.streams for s in steps if s.holds]
        if args.flood:
            flood = await _flood_case(
                base,
                audio,
                _resolve(args.audio),
                args.flood_streams,
                seconds,
                tokens,
                args.flood_frame_bytes,
            )
        if args.soak > 0:
            n_soak = args.soak_streams or (max(held) if held else 1)
            await tokens.mint(*(f"soak-{i}" for i in range(n_soak)))
            soak = await _soak(base, probe, audio, n_soak, args.soak, tokens)
    return ServerRun(
        str(repo), _commit_of(repo), steps, soak, flood, None if chat is None else chat[1]
    )


def _print_run(run: ServerRun, named: bool) -> None:
    print()
    if named:
        model = "" if run.chat_delay_s is None else f", chat model taking {run.chat_delay_s:g} s"
        print(f"### {run.repo} ({run.commit}){model}\n")
    print(
        "| streams | turns | p50 latency (s) | p95 latency (s) | p95 by turn end (s) "
        "| corrected | CPU %/stream | RSS peak (MiB) | RSS/stream (MiB) | turns while streaming "
        "| replies | refused | degraded | on the stage |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for s in run.steps:
        print(
            f"| {s.streams} | {s.turns} | {s.p50_latency_s:.2f} | {s.p95_latency_s:.2f} | "
            f"{s.p95_strict_latency_s:.2f} | {s.corrected} | "
            f"{s.cpu_percent_per_stream:.1f} | {s.rss_peak_mib:.0f} | {s.rss_per_stream_mib:.1f} | "
            f"{s.turns_while_streaming} | {s.replies} | {s.refused} | {s.degraded} | "
            f"{'—' if s.on_stage is None else f'{s.on_stage:.0%}'} |"
        )
    print(
        f"\nlargest N with strict p95 latency (the p95 by turn end column) < "
        f"{LATENCY_TARGET_S:g} s: {run.largest}"
    )
    for s in run.steps:
        if s.second_pass_corrected:
            print(f"second pass, {s.streams} streams: {s.second_pass_corrected} turns corrected, "
                  f"p95 {s.p95_second_pass_latency_s} s from a turn's end to its correction")
    if run.flood is not None:
        f = run.flood
        print(
            f"flood: {f.streams} real-time rooms, p50/p95 {f.p50_alone_s:.2f}/{f.p95_alone_s:.2f} s "
            f"alone, {f.p50_flooded_s:.2f}/{f.p95_flooded_s:.2f} s beside the flooder "
            f"(turns {f.turns_alone} / {f.turns_flooded}); the flooder "
            + (f"({f.flood_frame_bytes}-byte frames) " if f.flood_frame_bytes else "")
            + f"sent {f.flood_sent_s:.0f} s "
            f"of audio, closed: {f.flood_closed}" + (f", errors {f.errors[:2]}" if f.errors else "")
        )
    soak = run.soak
    if soak is not None:
        print(
            f"soak: {soak['streams']} streams for {soak['seconds']:.0f} s ({soak['meetings']} meetings): "
            f"RSS {soak['rss_start_mib']:.0f} → {soak['rss_after_1min_mib']:.0f} (1 min) → "
            f"{soak['rss_end_mib']:.0f} MiB (max {soak['rss_max_mib']:.0f}), "
            f"p95 {soak['p95_latency_s']:.2f} s, turns {soak['turns']}, errors {len(soak['errors'])}"
        )
