"""Issue 31, item 3: the load figure a load balancer or LiveKit's dispatcher acts on — the
largest of the stage's, the streams' and the CPU's shares — and the LiveKit worker's `load_fnc`
computing the same figure from what a worker sees."""

from __future__ import annotations

from dataclasses import dataclass, field

from livekit_worker.config import LiveKitConfig
from livekit_worker.worker import WorkerLoad, build_server
from server.load import CpuMeter, load_figure, machine_cpu_seconds


class Clocks:
    """A wall clock and a CPU-time clock the test moves."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0


def meter(clocks: Clocks, cores: int) -> CpuMeter:
    return CpuMeter(cpu=lambda: clocks.cpu, wall=lambda: clocks.wall, cores=cores)


def test_the_load_is_the_largest_share() -> None:
    assert load_figure(stage=0.2, streams=8, max_streams=64, cpu=0.5).load == 0.5
    assert load_figure(stage=1.0, streams=1, max_streams=64, cpu=0.1).load == 1.0
    figure = load_figure(stage=0.0, streams=48, max_streams=64, cpu=0.3)
    assert (figure.load, figure.streams) == (0.75, 0.75)


def test_the_cpu_share_is_cpu_time_over_wall_time_over_the_cores() -> None:
    clocks = Clocks()
    cpu = meter(clocks, cores=2)
    clocks.wall, clocks.cpu = 2.0, 3.0  # 1.5 cores busy of 2
    assert cpu.share() == 0.75
    clocks.wall, clocks.cpu = 2.5, 4.0  # sooner than its window: the last reading
    assert cpu.share() == 0.75
    clocks.wall, clocks.cpu = 4.0, 4.0  # idle since
    assert cpu.share() == 0.25  # (4 - 3) / (4 - 2) / 2
    assert machine_cpu_seconds() > 0


@dataclass
class FakeWorker:
    active_jobs: list[object] = field(default_factory=list)


def test_the_livekit_worker_reports_the_same_figure_from_its_jobs_and_the_machine_cpu() -> None:
    clocks = Clocks()
    load = WorkerLoad(max_jobs=4, cpu=meter(clocks, cores=2))
    worker = FakeWorker(active_jobs=[object(), object()])
    clocks.wall, clocks.cpu = 1.0, 0.4
    assert load(worker) == 0.5  # type: ignore[arg-type]  (2 of 4 jobs over 20 % CPU)
    clocks.wall, clocks.cpu = 2.0, 2.2  # 1.8 cores of 2
    assert load(worker) == 0.9  # type: ignore[arg-type]
    server = build_server(LiveKitConfig(max_jobs=3), ws_url="ws://127.0.0.1:7880",
                          api_key="k", api_secret="s")
    assert isinstance(server.load_fnc, WorkerLoad) and server.load_fnc.max_jobs == 3
