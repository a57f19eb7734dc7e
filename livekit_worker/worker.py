"""The `chorus agent` worker: a livekit-agents 1.x `AgentServer` running one Chorus room per job.

Why shaped so: LiveKit dispatches one job per room to the least loaded registered worker, and
runs each job in its own process (the default executor), so everything a job needs is built in
the job from the same configuration `chorus serve` reads: its STT provider, diarization stage
(with the enrolled voices), realtime channel, chat model, ACP agent and store
(`build_room_agent`, `run_job`). The configuration reaches job processes as the path in
`CHORUS_AGENT_CONFIG` (job processes inherit the worker's environment); `LIVEKIT_URL`,
`LIVEKIT_API_KEY` and `LIVEKIT_API_SECRET` are read by `AgentServer` itself. The worker
registers with `agent_name="chorus"` (configurable) so rooms get it only by explicit dispatch.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Callable
from typing import Any

from livekit import agents, rtc
from livekit.agents.worker import ServerEnvOption

from diarization import enroll_voices, load_stage
from livekit_worker.config import LiveKitConfig, load_agent_config
from livekit_worker.room_agent import ChorusRoomAgent, LocalParticipantLike
from rooms import Channel, RoomKit, open_kit
from server.config import ServerConfig
from server.load import CpuMeter, Load, load_figure, machine_cpu_seconds
from server.pipeline import (
    agent_channel,
    chat_channel,
    read_enrollments,
    realtime_channel,
    second_pass,
    stt_provider,
)
from voice.diarization_stage import DiarizationStage
from voice.stt.base import SttProvider

log = logging.getLogger(__name__)

CONFIG_ENV = "CHORUS_AGENT_CONFIG"
"""Path of the config file, as `chorus agent --config` set it for the job processes."""


def stage_factory(
    config: ServerConfig, stt: SttProvider, enrollments: dict[str, Any] | None = None
) -> Any:
    """A builder of diarization stages for shared mics, or None when the STT's own labels are
    used (a diarizing STT with `stt.diarize`) or `diarizer.kind = "none"`. Each stage knows the
    `[diarizer] enroll` voices (`enrollments`: name → 16 kHz audio) from its first turn (V8)."""
    cfg = config.diarizer
    if cfg.kind == "none" or (stt.diarizes and config.stt.diarize):
        return None

    def build() -> DiarizationStage:
        stage = load_stage(cfg.kind, num_speakers=cfg.num_speakers,
                           max_speakers=cfg.max_speakers, pipeline=cfg.pipeline,
                           hf_token=cfg.hf_token, threads=cfg.pyannote_threads())
        if enrollments:
            enroll_voices(stage, enrollments)
        return stage

    return build


async def build_room_agent(
    room: rtc.Room,
    room_name: str,
    config: ServerConfig,
    livekit: LiveKitConfig,
    *,
    stt: SttProvider | None = None,
    local: LocalParticipantLike | None = None,
    kit: RoomKit | None = None,
    build_stage: Callable[[], DiarizationStage] | None = None,
) -> ChorusRoomAgent:
    """A started `ChorusRoomAgent` for one LiveKit room, built from the configuration: every
    section `chorus serve` reads means the same here (`[stt]` (its `second_pass` too),
    `[diarizer]` with its `enroll` voices and its overload keys, `[voice]`, `[realtime]`,
    `[policy]`, `[chat]`, `[agent]`, `[voices]` (the voice directory of the store); `[store]`
    through `kit`). `build_stage` builds each shared-mic track's stage instead of
    `[diarizer] kind` (tests: a scripted stage; as `VoicePipeline`'s `stage_factory`, it makes
    shared mics diarized by a stage whatever the STT)."""
    provider = stt or stt_provider(config)
    enrollments: dict[str, Any] = {}
    if config.diarizer.enroll:
        enrollments = await asyncio.to_thread(read_enrollments, config)
    assistants: list[Channel] = [
        c for c in (chat_channel(config), agent_channel(config)) if c is not None
    ]
    if config.diarizer.kind == "embedded":
        import diarization.embedded  # noqa: F401  (imported on the loop's thread, not a worker's)
        from diarization.live import configure_default_service

        await asyncio.to_thread(configure_default_service,
                                precision=config.diarizer.live_precision,
                                workers=config.diarizer.live_workers)
    load = getattr(provider, "load", None)
    if load is not None:
        await load()  # Whisper: the model, in a worker thread
    redecoder = second_pass(config)
    if redecoder is not None:
        await redecoder.load()  # `[stt] second_pass`: its own copy of the model
    agent = ChorusRoomAgent(
        room,
        room_name,
        stt=provider,
        livekit=livekit,
        realtime=realtime_channel(config),
        stage_factory=build_stage or stage_factory(config, provider, enrollments),
        policy=config.voice.policy(),
        local=local,
        kit=kit,
        assistants=assistants,
        second_pass=redecoder,
        voices=config.voices,
        diarizer=config.diarizer,
    )
    try:
        await agent.start()
    except BaseException:  # nobody will close an agent that never started: its second pass
        if redecoder is not None:
            await redecoder.aclose()
        raise
    return agent


async def run_job(
    ctx: agents.JobContext,
    config: ServerConfig,
    livekit: LiveKitConfig,
    *,
    stt: SttProvider | None = None,
    local: LocalParticipantLike | None = None,
    build_stage: Callable[[], DiarizationStage] | None = None,
) -> ChorusRoomAgent:
    """Connect (audio only), open the `[store]`, start the room's agent, and close them when the
    job shuts down (`build_stage`: `build_room_agent`'s)."""
    await ctx.connect(auto_subscribe=agents.AutoSubscribe.AUDIO_ONLY)
    room_name = ctx.room.name or ctx.job.room.name
    provider = stt or stt_provider(config)
    kit, opened = await open_kit(config.store.resolved_url(), room=room_name)
    try:
        agent = await build_room_agent(
            ctx.room, room_name, config, livekit, stt=provider, local=local, kit=kit,
            build_stage=build_stage,
        )
    except BaseException:  # what `shutdown` would close: the channels, the STT, the store
        try:
            await kit.close()
            await provider.aclose()
        finally:
            await opened.close()
        raise

    async def shutdown(reason: str = "") -> None:
        log.info("room %s: job ends (%s)", room_name, reason or "shutdown")
        try:
            await agent.aclose()
        finally:
            try:
                await provider.aclose()
            finally:
                await opened.close()

    ctx.add_shutdown_callback(shutdown)
    return agent


async def entrypoint(ctx: agents.JobContext) -> None:
    """The `rtc_session` entrypoint: one Chorus room for the job's LiveKit room."""
    config, livekit = load_agent_config(os.environ.get(CONFIG_ENV) or None)
    await run_job(ctx, config, livekit)


class WorkerLoad:
    """The worker's `load_fnc`: `chorus serve`'s load figure (`server.load.load_figure`) from
    what a LiveKit worker can see. Each job (room) runs in a process of its own, with its
    stages; the worker cannot read their lag, but a stage that falls behind is a machine whose
    CPU is full, so the parts are the machine's CPU share (every process: the jobs are) and the
    running jobs over `max_jobs`; the stage part is 0 here (each job sheds its own stage's load:
    `ChorusRoomAgent.stage_guard`)."""

    def __init__(self, max_jobs: int, cpu: CpuMeter | None = None) -> None:
        self.max_jobs = max_jobs
        self.cpu = cpu or CpuMeter(cpu=machine_cpu_seconds, cores=os.cpu_count() or 1)
        self.last: Load | None = None

    def __call__(self, server: agents.AgentServer) -> float:
        self.last = load_figure(stage=0.0, streams=len(server.active_jobs),
                                max_streams=self.max_jobs, cpu=self.cpu.share())
        return self.last.load


def build_server(livekit: LiveKitConfig, **options: Any) -> agents.AgentServer:
    """The `AgentServer` `chorus agent` runs: `agent_name` from config, its load threshold, its
    load (`WorkerLoad`: `chorus serve`'s figure, unless `load_fnc` is given), and the LiveKit
    credentials from the environment (or `ws_url`/`api_key`/`api_secret` options)."""
    # development mode takes every job (as livekit-agents' own default does); production mode
    # declines new rooms above the configured load
    threshold = ServerEnvOption(dev_default=math.inf, prod_default=livekit.load_threshold)
    options.setdefault("load_fnc", WorkerLoad(livekit.max_jobs))
    server = agents.AgentServer(load_threshold=threshold, **options)
    server.rtc_session(entrypoint, agent_name=livekit.agent_name)
    return server


def missing_credentials(environ: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ) if environ is None else environ
    return [n for n in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET") if not env.get(n)]


async def serve(livekit: LiveKitConfig, *, devmode: bool) -> None:
    server = build_server(livekit)
    try:
        await server.run(devmode=devmode)
    except asyncio.CancelledError:
        pass
    finally:
        await server.aclose()
