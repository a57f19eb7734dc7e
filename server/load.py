"""How loaded this server is, as one figure a load balancer or LiveKit's dispatcher can act on.

Owns the load figure (issue 31, item 3): `load_figure` is the largest of three shares, each 0..1,
so whichever runs out first says the server is full:
- the diarization stage's (`server.overload.StageLoad.load`: its worst stream lag over
  `diarizer.fallback_lag_s`, 1.0 while new shared-mic streams are refused),
- the streams' (open streams over `limits.max_streams`),
- the CPU's (the process's CPU time over the wall time since the last reading, shared by the
  cores it may run on; `CpuMeter`).
`/healthz` and `/metrics` report it with its parts, and `chorus agent` hands the same function
to LiveKit as its `load_fnc` (`livekit_worker.worker.worker_load`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

CPU_WINDOW_S = 1.0
"""A CPU reading covers at least this long (a reading sooner returns the last one)."""


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else all)."""
    affinity = getattr(os, "sched_getaffinity", None)
    if affinity is not None:
        return max(1, len(affinity(0)))
    return max(1, os.cpu_count() or 1)


def machine_cpu_seconds() -> float:
    """CPU seconds every process of the machine has used (Linux `/proc/stat`: all but idle and
    iowait); elsewhere this process's own (`time.process_time`)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            fields = stat.readline().split()
    except OSError:
        return time.process_time()
    if not fields or fields[0] != "cpu":
        return time.process_time()
    ticks = [int(f) for f in fields[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]  # idle, iowait
    return busy / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """The share of the usable cores a CPU-time clock used between readings, at least
    `window_s` apart: `share()` (0..1). `cpu` and `wall` are the clocks (the process's own by
    default; tests pass their own)."""

    def __init__(
        self,
        cpu: Callable[[], float] = time.process_time,
        wall: Callable[[], float] = time.monotonic,
        cores: int | None = None,
        window_s: float = CPU_WINDOW_S,
    ) -> None:
        self._cpu = cpu
        self._wall = wall
        self.cores = cores or usable_cores()
        self.window_s = window_s
        self._at = (wall(), cpu())
        self._share = 0.0

    def share(self) -> float:
        wall, cpu = self._wall(), self._cpu()
        elapsed = wall - self._at[0]
        if elapsed >= self.window_s:
            used = cpu - self._at[1]
            self._share = min(1.0, max(0.0, used / elapsed / self.cores))
            self._at = (wall, cpu)
        return self._share


@dataclass(frozen=True)
class Load:
    """The load figure and its parts (each 0..1)."""

    load: float
    stage: float
    streams: float
    cpu: float


def load_figure(*, stage: float, streams: int, max_streams: int, cpu: float) -> Load:
    """The largest share: the stage's, the streams' (`streams / max_streams`), the CPU's."""
    stream_share = min(1.0, streams / max_streams) if max_streams > 0 else 1.0
    parts = (min(1.0, max(0.0, stage)), stream_share, min(1.0, max(0.0, cpu)))
    return Load(round(max(parts), 4), *(round(p, 4) for p in parts))


__all__ = ["CPU_WINDOW_S", "CpuMeter", "Load", "load_figure", "machine_cpu_seconds",
           "usable_cores"]
