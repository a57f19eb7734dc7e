"""The per-room speech pipeline the server runs: voice channel, diarization stage, realtime channel.

Owns turning a `ServerConfig` into the channels of a room and into one audio session per stream,
and nothing else: `server.live` only sees `Pipeline.attach_room`, `Pipeline.open_stream` and the
`StreamAudio` it returns (`push` raw frames, `finish` to flush the last turns). Models are loaded
once per server and shared by every room; model work runs off the event loop inside the voice
channel (V, P rules). With `realtime.audio = true` the room's realtime channel asks the voice
channel for each turn's audio when the turn is delivered (R3, `rooms.TurnAudioSource`): nothing
to wire per stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from diarization import enroll_voices, load_stage
from models.extras import require
from realtime import AnswerOnly, RealtimeChannel, SessionCounts, SpeakPolicy, default_policy
from realtime.providers import require_provider
from rooms import AIChannel, RoomKit, SlidingWindowMemory
from server.config import ServerConfig
from server.framing import StreamDeclaration
from server.overload import (
    DiarizationStatus,
    OverloadPolicy,
    StageLoad,
    StageOverloadedError,
)
from server.stage_guard import StageGuard
from voice.audio import AudioError
from voice.channel import VoiceChannel, VoiceSession
from voice.diarization_stage import (
    Anchors,
    ClipPrints,
    DiarizationStage,
    SpeakerPrints,
    StagePrints,
)
from voice.identify import print_turn, turn_span
from voice.second_pass import SecondPass
from voice.stt import load_stt
from voice.stt.base import SttProvider, SttStatus
from voice.stt.whisper_models import check_whisper_model

if TYPE_CHECKING:
    from rooms.acp import ACPAgentChannel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamInfo:
    """One stream to open: where it is, and what its protocol declared (unchanged)."""

    room_id: str
    stream_id: str
    declaration: StreamDeclaration


StreamStatus = SttStatus | DiarizationStatus
StreamStatusCallback = Callable[[StreamStatus], Awaitable[None]]
"""Hears one stream's STT status (degraded, recovered, audio lost, ended: issue 10.1) and its
diarization status (off the stage and back: issue 31)."""


class StreamAudio(Protocol):
    """One stream's audio session in its room's voice channel."""

    session_id: str
    """The `voice_session_id` the session's turns carry."""

    async def push(self, frame: bytes) -> None:
        """Raw audio as received (pcm16 or µ-law, interleaved channels, any frame size)."""
        ...

    async def finish(self) -> None:
        """End of stream: flush the last turns and close the session."""
        ...

    def reply_stopped(self) -> None:
        """The device stopped the reply playing into its microphone: heard again at once."""
        ...

    def speaker_prints(self) -> StagePrints | None:
        """The stream's stage's anonymous voices now (issue 27); None without a stage that
        shows them, or while the stream is off its stage."""
        ...

    def turn_printer(self, start: float, end: float) -> Callable[[], Any] | None:
        """The print of this stream's audio over `start`…`end` (session seconds: a turn) on the
        model of `speaker_prints`, to run off the loop (the audio is read now, the model runs
        when it is called; None from it for a turn too short to print, `print_turn`); None
        without such a stage, or when the stream's audio log no longer holds the turn."""
        ...

    def anchor(self, prints_of: Callable[[str], dict[str, Any]]) -> None:
        """Hand the stream's stage the known voices of its model (`prints_of(model)`), when it
        takes anchors (`voice.diarization_stage.Anchors`); otherwise nothing."""
        ...


class Pipeline(Protocol):
    async def attach_room(self, kit: RoomKit, room_id: str) -> None: ...

    async def open_stream(
        self, kit: RoomKit, info: StreamInfo, on_status: StreamStatusCallback | None = None
    ) -> StreamAudio:
        """The stream's audio session; `on_status` hears this stream's STT status, and only
        this stream's, until it finishes."""
        ...

    def second_pass_outcomes(self) -> dict[str, int] | None:
        """What the live second pass did (`/metrics`), or None when it is off."""
        ...

    def realtime_counts(self) -> SessionCounts | None:
        """What the realtime sessions went through (`/metrics`), or None without them."""
        ...

    async def release_room(self, kit: RoomKit, room_id: str) -> None:
        """The room is being evicted (no stream is open in it): drop what the pipeline keeps
        for it. The kit still holds the room; the caller deletes it afterwards."""
        ...

    def stage_load(self) -> StageLoad | None:
        """The diarization stage's load now (None: no stream can use a stage)."""
        ...

    def reply_playing(self, room_id: str) -> bool:
        """Whether a reply is playing in the room now (its playback window, V9, is open)."""
        ...

    def stop_reply(self, room_id: str) -> None:
        """Someone in the room talked over the reply (barge-in), and the room's streams drop
        what they hold of it: the rest of the response is not played, and the room's
        microphones are no longer silenced for it (V9). Synchronous: at the barge-in itself."""
        ...

    async def interrupt(self, room_id: str) -> None:
        """A caller in the room talked over the reply playing to them (barge-in): the room's
        model stops the response it is making, if any."""
        ...

    async def clip_voiceprint(self, audio: Any) -> tuple[str, Any]:
        """(model id, unit voiceprint) of a 16 kHz clip on the model the stages' voices are
        printed with (the voice directory's enrollment); ValueError for a clip that cannot
        make one (too little speech), LookupError when no stage can print voices."""
        ...

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- the real pipeline


class VoicePipeline:
    """The pipeline `chorus serve` runs, built once from the configuration.

    - One STT provider for the whole server (`stt.provider`); each stream opens its own
      connection through its voice session.
    - Streams whose speakers come from the STT (a diarizing STT on a shared mic) or need none
      (one person: a phone leg, a personal device) share one `VoiceChannel` per server.
    - Shared-mic streams whose speakers come from the diarization stage (V5) share one more
      `VoiceChannel` ("voice-diarized"), each session with a live stage of its own (a live stage
      follows one stream). The stages are pooled per room and reused (reset) when their stream
      ends, so a long-running server does not load a stage per connection.
    - Every voice session follows the `[voice]` turn rules (`TurnPolicy`).
    - Overload (issue 31): on the streams' audio, at most every `diarizer.overload_check_s`,
      each stage stream's lag goes to one `server.overload.OverloadPolicy`, and what it says is
      done by a `server.stage_guard.StageGuard` (as in a `chorus agent` job): stretch a stream's
      step, take a stream off its stage (its device hears a `diarization` status) or put it
      back; while it says so, a new stage stream is refused (`StageOverloadedError`, 4429).
    - One chat model (`AIChannel` "chat-ai", `[chat]`) in every room when `chat.provider` is not
      `none`: it reads typed messages and spoken turns as one labelled conversation.
    - One external agent (`ACPAgentChannel` "agent", `[agent]`) when `agent.command` is set: one
      subprocess for the server, one ACP session per room (G3 labelling).
    - One `RealtimeChannel` (one session per room) when `realtime.provider` is not `none`; in
      audio mode (`realtime.audio`) it reads each turn's audio from the voice channel that posted
      the turn (the stream's session, by `voice_session_id`), so streams need no extra wiring.
    """

    def __init__(
        self,
        config: ServerConfig,
        stt: SttProvider,
        stage_factory: Callable[[], DiarizationStage] | None = None,
    ) -> None:
        """`stage_factory`: builds each pooled stage instead of `[diarizer] kind` (tests: a
        scripted stage; it makes shared-mic streams diarized even with kind `none`)."""
        self.config = config
        self.stt = stt
        self.stage_factory = stage_factory
        self._on_status: dict[str, StreamStatusCallback] = {}
        """Each open stream's status callback (`open_stream(on_status=…)`), by its session id
        (the stream id); dropped when the stream finishes."""
        policy = config.voice.policy()
        bounds = config.stt.bounds()
        self.second_pass = second_pass(config)
        """Re-decodes every stream's committed turns (`[stt] second_pass`), or None."""
        self.shared_voice = VoiceChannel("voice", stt=stt, pipeline_speakers=False,
                                         policy=policy, on_status=self._stream_status,
                                         stt_bounds=bounds, second_pass=self.second_pass)
        self.diarized_voice = VoiceChannel("voice-diarized", stt=stt, pipeline_speakers=True,
                                           stage_per_session=True, catch_up=True, policy=policy,
                                           on_status=self._stream_status, stt_bounds=bounds,
                                           second_pass=self.second_pass)
        """Shared-mic streams diarized by a stage of their own (one per session, pooled); a
        stream whose stage fell behind skips its backlog's windows (`catch_up`)."""
        self.realtime = realtime_channel(config)
        self.chat_ai = chat_channel(config)
        """The room's chat model (`[chat]`), reading typed and spoken turns alike; or None."""
        self.agent = agent_channel(config)
        """The external ACP agent (`[agent]`), one session per room; or None."""
        self._pools: dict[str, list[DiarizationStage]] = {}
        """Idle live stages per room (reset before the next stream of that room)."""
        self._registered = False
        self._stage_lock = asyncio.Lock()
        self.enrollments: dict[str, Any] = {}
        """Enrolled voices (`[diarizer] enroll`): name → 16 kHz audio, read once at start."""
        self._pyannote_pipeline: Any = None
        """The pyannote pipeline every pooled pyannote stage shares (loaded by the first)."""
        self.overload = OverloadPolicy(config.diarizer.overload_bounds())
        """When a stage stream is stretched, taken off the stage, put back; when new ones are
        refused (`server.overload`)."""
        self.stage_guard = StageGuard(self.overload, check_s=config.diarizer.overload_check_s,
                                      tell=self._tell)
        """Applies `overload` to the open stage streams (on the stage or fallen back)."""
        self._printer: DiarizationStage | None = None
        """A stage kept for printing clips (the voice directory), made on first use."""

    @property
    def diarizes_with_stage(self) -> bool:
        cfg = self.config
        if self.stage_factory is not None:
            return True
        if cfg.diarizer.kind == "none":
            return False
        return not (self.stt.diarizes and cfg.stt.diarize)

    def _register(self, kit: RoomKit) -> None:
        if self._registered:
            return
        kit.register_channel(self.shared_voice)
        if self.diarizes_with_stage:
            kit.register_channel(self.diarized_voice)
        if self.realtime is not None:
            kit.register_channel(self.realtime)
        if self.chat_ai is not None:
            kit.register_channel(self.chat_ai)
        if self.agent is not None:
            kit.register_channel(self.agent)
        self._registered = True

    async def attach_room(self, kit: RoomKit, room_id: str) -> None:
        self._register(kit)
        await kit.attach_channel(room_id, self.shared_voice.channel_id)
        if self.diarizes_with_stage:
            await kit.attach_channel(room_id, self.diarized_voice.channel_id)
        if self.realtime is not None:
            await kit.attach_channel(room_id, self.realtime.channel_id)
        if self.chat_ai is not None:
            await kit.attach_channel(room_id, self.chat_ai.channel_id)
        if self.agent is not None:
            try:
                await kit.attach_channel(room_id, self.agent.channel_id)
            except Exception:  # the room works without its agent; the next turn tries again
                log.exception("the ACP agent could not join room %s", room_id)

    async def _stage_for(self, room_id: str) -> DiarizationStage:
        """An idle stage of the room's pool (reset), or a new one."""
        pool = self._pools.setdefault(room_id, [])
        if pool:
            stage = pool.pop()
            stage.reset()
            return stage
        return await self._new_stage()

    def _idle(self, room_id: str, stage: DiarizationStage) -> None:
        """A stream's stage is free again: back to its room's pool. A stage that took the voice
        directory's people (`Anchors`) lets go of them and of the stream's voices now (no print
        waits in an idle stage; the next stream is anchored afresh)."""
        if isinstance(stage, Anchors):
            stage.anchor({})
            stage.reset()
        self._pools.setdefault(room_id, []).append(stage)

    async def _stream_status(self, session: VoiceSession, status: SttStatus) -> None:
        """Every voice channel's status callback: routes a session's status to its stream's."""
        callback = self._on_status.get(session.id)
        if callback is None:
            return
        try:
            await callback(status)
        except Exception:
            log.exception("stream %s: its status callback failed", session.id)

    async def _new_stage(self) -> DiarizationStage:
        """A fresh live stage for one more pooled stream. The loaded models are shared: the
        pyannote stage loads its pipeline once per server (every later stage wraps the same
        pipeline object; calls into it are serialised), never once per stream."""
        cfg = self.config.diarizer
        if self.stage_factory is not None:
            return self.stage_factory()
        async with self._stage_lock:
            pipeline: Any = cfg.pipeline
            hf_token = cfg.hf_token
            if cfg.kind == "pyannote" and self._pyannote_pipeline is not None:
                pipeline, hf_token = self._pyannote_pipeline, None
            stage = await asyncio.to_thread(
                load_stage,
                cfg.kind,
                num_speakers=cfg.num_speakers,
                max_speakers=cfg.max_speakers,
                pipeline=pipeline,
                hf_token=hf_token,
                threads=cfg.pyannote_threads(),
            )
            if cfg.kind == "pyannote" and self._pyannote_pipeline is None:
                self._pyannote_pipeline = getattr(stage, "pipeline", None)
            if self.enrollments:
                await asyncio.to_thread(enroll_voices, stage, self.enrollments)
            return stage

    async def clip_voiceprint(self, audio: Any) -> tuple[str, Any]:
        if self._printer is None:
            if not self.diarizes_with_stage:
                raise LookupError("no diarization stage: voices cannot be printed")
            self._printer = await self._new_stage()
        printer = self._printer
        if not isinstance(printer, ClipPrints):
            raise LookupError(f"the {type(printer).__name__} stage cannot print voices")
        vector = await asyncio.to_thread(printer.live_voiceprint, audio)
        return printer.live_model, vector

    async def open_stream(
        self, kit: RoomKit, info: StreamInfo, on_status: StreamStatusCallback | None = None
    ) -> StreamAudio:
        declared = info.declaration
        pooled = declared.shared_mic and self.diarizes_with_stage
        if pooled and not self.stage_guard.admit():
            raise StageOverloadedError(
                "the diarization stage cannot keep up: no room for another shared-mic stream"
            )
        channel = self.diarized_voice if pooled else self.shared_voice
        stage = await self._stage_for(info.room_id) if pooled else None
        await kit.ensure_participant(
            info.room_id, channel.channel_id, declared.participant, display_name=declared.name
        )
        if on_status is not None:
            self._on_status[info.stream_id] = on_status
        try:
            session = await channel.start_session(
                info.room_id,
                declared.participant,
                fmt=declared.format,
                session_id=info.stream_id,
                stage=stage,
                echo_gate=declared.echo_gate,
            )
        except BaseException:
            self._on_status.pop(info.stream_id, None)
            if stage is not None:
                self._idle(info.room_id, stage)
            raise
        release = None
        if stage is not None:
            self.stage_guard.join(session)

            def release() -> None:
                if self.stage_guard.leave(session):
                    self._idle(info.room_id, stage)
                # else: a stage call still runs in its thread; the stage is not pooled (a reset
                # on the loop would wait for it)

        return VoiceStreamAudio(
            session, release, forget=lambda: self._on_status.pop(session.id, None),
            on_audio=self.check_overload if stage is not None else None,
        )

    # -- overload (issue 31) ----------------------------------------------------------------

    def check_overload(self) -> None:
        """Measure every stage stream's lag and do what the policy says (at most every
        `diarizer.overload_check_s`; called on the stage streams' audio)."""
        self.stage_guard.check()

    async def _tell(self, session_id: str, status: DiarizationStatus) -> None:
        callback = self._on_status.get(session_id)
        if callback is None:
            return
        try:
            await callback(status)
        except Exception:
            log.exception("stream %s: its status callback failed", session_id)

    def reply_playing(self, room_id: str) -> bool:
        return self.shared_voice.is_playing(room_id) or self.diarized_voice.is_playing(room_id)

    def stop_reply(self, room_id: str) -> None:
        stop_room_reply(room_id, self.realtime, (self.shared_voice, self.diarized_voice))

    async def interrupt(self, room_id: str) -> None:
        if self.realtime is None:
            return
        try:
            if await self.realtime.interrupt(room_id):
                log.info("room %s: a caller talked over the reply: its response cancelled",
                         room_id)  # fmt: skip
        except Exception:  # the session's own failures are its to handle; this is a courtesy
            log.exception("room %s: could not cancel the response talked over", room_id)

    def stage_load(self) -> StageLoad | None:
        if not self.diarizes_with_stage:
            return None
        return self.overload.load()

    def realtime_counts(self) -> SessionCounts | None:
        return None if self.realtime is None else self.realtime.session_counts()

    def second_pass_outcomes(self) -> dict[str, int] | None:
        """What the live second pass did (`/metrics`), or None when it is off."""
        return None if self.second_pass is None else self.second_pass.stats.as_dict()

    async def release_room(self, kit: RoomKit, room_id: str) -> None:
        """Drop the room's idle stages (no stream is open). The channels let go of the room
        themselves when the caller deletes it (`RoomKit.delete_room` → `on_detach`)."""
        self._pools.pop(room_id, None)

    async def close(self) -> None:
        # The kit closes every registered channel; the shared STT provider is closed once here.
        await self.stt.aclose()
        if self.second_pass is not None:
            await self.second_pass.aclose()


class VoiceStreamAudio:
    """A `StreamAudio` over one `VoiceSession`."""

    def __init__(
        self,
        session: VoiceSession,
        release: Callable[[], None] | None,
        forget: Callable[[], object] | None = None,
        on_audio: Callable[[], None] | None = None,
    ) -> None:
        self.session = session
        self._on_audio = on_audio
        """Runs after each accepted frame (the pipeline's overload check)."""
        self.session_id = session.id
        self._release = release
        self._forget = forget
        """Drops the stream's status callback once it has finished."""
        self.skipped = 0

    async def push(self, frame: bytes) -> None:
        try:
            self.session.push(frame)
        except AudioError:
            self.skipped += 1  # logged by the session; the stream goes on (V10)
            return
        if self._on_audio is not None:
            self._on_audio()

    def anchor(self, prints_of: Callable[[str], dict[str, Any]]) -> None:
        driver = self.session.stage
        if driver is None or not driver.abilities.anchors:
            return
        stage = driver.stage
        if isinstance(stage, Anchors) and isinstance(stage, ClipPrints):
            stage.anchor(prints_of(stage.live_model))

    def _printing_stage(self) -> object | None:
        """The stream's stage while it shows its voices' prints (on the stage, declaring
        `speaker_prints`), else None."""
        driver = self.session.stage
        if driver is None or driver.suspended or not driver.abilities.speaker_prints:
            return None
        return driver.stage

    def turn_printer(self, start: float, end: float) -> Callable[[], Any] | None:
        stage = self._printing_stage()
        if not isinstance(stage, ClipPrints):
            return None
        audio = self.session.audio.between(*turn_span(start, end))  # on the loop: the log's
        if not len(audio):
            return None  # the log no longer holds the turn: it cannot be checked
        rate = self.session.audio.sample_rate  # a turn too short to print: None from `print_turn`

        def run() -> Any:
            return print_turn(audio, rate, stage.turn_voiceprint)

        return run

    def speaker_prints(self) -> StagePrints | None:
        stage = self._printing_stage()
        return stage.speaker_prints() if isinstance(stage, SpeakerPrints) else None

    def reply_stopped(self) -> None:
        self.session.reply_stopped()

    async def finish(self) -> None:
        try:
            await self.session.finish()  # its last turns were delivered with their audio (R3)
        finally:
            if self._forget is not None:
                self._forget()
                self._forget = None
            if self._release is not None:
                self._release()
                self._release = None


CHAT_EXTRA = ("openai", "the OpenAI chat provider ([chat] provider)")
AGENT_EXTRA = ("acp", "the ACP agent ([agent] command)")
"""(extra, what needs it) of the chat model and the external agent, for `require`."""


def require_extras(config: ServerConfig) -> None:
    """Raise `models.extras.MissingExtra` (one line: the extra to install) when a part the
    configuration asks for comes with a pip extra that is not installed.

    `chorus serve` and `chorus agent` call it as soon as the configuration is read, and
    `build_pipeline` first: a missing extra stops the server before the store opens or a model
    loads, never at a room's first stream. The factories below check again for callers that
    build one part alone."""
    if config.stt.provider == "deepgram":
        require("deepgram", "the Deepgram STT provider")
    else:  # a Whisper model by name (`base` needs its extra) or a complete local directory
        check_whisper_model(config.stt.model)
    if config.stt.second_pass != "off":
        check_whisper_model(config.stt.second_pass)
    require_provider(config.realtime.provider)
    if config.chat.provider != "none":
        require(*CHAT_EXTRA)
    if config.agent.command:
        require(*AGENT_EXTRA)
    if (config.store.url or "").split(":", 1)[0].lower() in ("postgresql", "postgres"):
        require("postgres", "the Postgres store")
    if config.twilio.auth_token:
        require("twilio", "checking Twilio signatures (twilio.auth_token)")


def stt_provider(config: ServerConfig) -> SttProvider:
    """The configured STT provider (`[stt]`); `chorus serve` and `chorus agent` both build it here."""
    stt = config.stt
    if stt.provider == "deepgram":
        return load_stt(
            "deepgram",
            api_key=stt.deepgram_api_key,
            url=stt.deepgram_url,
            model=stt.model or "nova-3",
            language=stt.language or "en",
            diarize=stt.diarize,
        )
    return load_stt("whisper", model=stt.model, language=stt.language or "en")


def second_pass(config: ServerConfig) -> SecondPass | None:
    """The live second pass `[stt] second_pass` names (a Whisper model), or None for `off`."""
    stt = config.stt
    if stt.second_pass == "off":
        return None
    from voice.stt.whisper import WhisperSTT

    recogniser = WhisperSTT(stt.second_pass, language=stt.language or "en",
                            encoder_window=stt.second_pass_window_s, instance="second-pass")
    return SecondPass(recogniser, max_age=stt.second_pass_max_age_s)


def speak_policy(config: ServerConfig) -> SpeakPolicy:
    """`policy.answer_only` people, else the default: answer when addressed or alone (R4)."""
    if config.policy.answer_only:
        return AnswerOnly(people=tuple(config.policy.answer_only))
    return default_policy()


def realtime_channel(config: ServerConfig) -> RealtimeChannel | None:
    """The configured realtime channel (`[realtime]`, `[policy]`), or None for `none`; `chorus
    serve` and `chorus agent` both build it here."""
    rt = config.realtime
    if rt.provider == "none":
        return None
    options: dict[str, Any] = {}
    if rt.provider != "recorder":
        if rt.model:
            options["model"] = rt.model
        if rt.api_key:
            options["api_key"] = rt.api_key
        if rt.base_url:
            options["base_url"] = rt.base_url
    return RealtimeChannel(
        "realtime",
        rt.provider,
        assistant_name=config.policy.assistant_name,
        instructions=config.policy.system_prompt,
        policy=speak_policy(config),
        audio_mode=rt.audio,
        voice=rt.voice,
        response_timeout=rt.response_timeout,
        **options,
    )


def stop_room_reply(
    room_id: str, realtime: RealtimeChannel | None, voices: Iterable[VoiceChannel]
) -> None:
    """Someone talked over the reply (a barge-in): the rest of the model's response is dropped
    (`RealtimeChannel.stop_reply`) and the room's microphones are no longer silenced for it (V9,
    `VoiceChannel.stop_playing`). Synchronous, at the barge-in itself. The one home of these
    steps, for `chorus serve` (`VoicePipeline.stop_reply`) and the LiveKit worker."""
    if realtime is not None:
        realtime.stop_reply(room_id)
    for voice in voices:
        voice.stop_playing(room_id)


def chat_channel(config: ServerConfig) -> AIChannel | None:
    """The configured chat model (`[chat]`, its speak policy from `[policy]`), or None for
    `none`; `chorus serve` and `chorus agent` both build it here."""
    chat = config.chat
    if chat.provider == "none":
        return None
    require(*CHAT_EXTRA)
    from rooms.providers.openai_chat import DEFAULT_MODEL, OpenAIChatProvider

    provider = OpenAIChatProvider(
        chat.model or DEFAULT_MODEL, api_key=chat.api_key, base_url=chat.base_url
    )
    return AIChannel(
        "chat-ai",
        provider,
        chat.system_prompt or config.policy.system_prompt,
        memory=SlidingWindowMemory(chat.history),
        policy=None if chat.answer == "always" else speak_policy(config),
        assistant_name=config.policy.assistant_name,
    )


def agent_channel(config: ServerConfig) -> ACPAgentChannel | None:
    """The configured external ACP agent (`[agent]`), or None without a command; `chorus serve`
    and `chorus agent` both build it here."""
    agent = config.agent
    if not agent.command:
        return None
    require(*AGENT_EXTRA)
    from rooms.acp import ACPAgentChannel

    return ACPAgentChannel(
        "agent", agent.command, cwd=agent.cwd, prompt_timeout=agent.prompt_timeout
    )


async def build_pipeline(
    config: ServerConfig, stage_factory: Callable[[], DiarizationStage] | None = None
) -> VoicePipeline:
    """The configured pipeline, with its STT provider created and its models loaded once,
    before the server takes its first stream.

    Modules are imported here on the loop's thread, never inside worker threads: importing in
    two threads at once trips a CPython 3.11 bug in the ast module (seen under pytest).
    """
    require_extras(config)
    stt = stt_provider(config)
    if config.diarizer.kind == "embedded":
        import torch.onnx  # noqa: F401  (the first start exports CAM++ to ONNX)

        import diarization.embedded  # noqa: F401  (see above)
        import voice.campplus  # noqa: F401
        from diarization.models import default_embedding_model, default_segmentation_model
        await asyncio.to_thread(default_segmentation_model)
        await asyncio.to_thread(default_embedding_model)
        # live streams: the CAM++ trunk (exported once) and the model service they all share,
        # which batches every stream's windows into one segmentation and one embedding call
        from diarization.live import configure_default_service

        await asyncio.to_thread(configure_default_service,
                                precision=config.diarizer.live_precision,
                                workers=config.diarizer.live_workers)
    load = getattr(stt, "load", None)
    if load is not None:
        await load()  # Whisper: the model, in a worker thread
    pipeline = VoicePipeline(config, stt, stage_factory)
    if pipeline.second_pass is not None:
        await pipeline.second_pass.load()  # its own copy of the model
    if config.diarizer.enroll:
        pipeline.enrollments = await asyncio.to_thread(read_enrollments, config)
    return pipeline


def read_enrollments(config: ServerConfig) -> dict[str, Any]:
    """The `[diarizer] enroll` clips as 16 kHz audio; a missing or unreadable clip is a
    ConfigError naming the key."""
    from server.config import ConfigError
    from voice.audio import AudioError, read_audio_16k

    clips: dict[str, Any] = {}
    for name, path in config.diarizer.enroll.items():
        try:
            clips[name] = read_audio_16k(Path(path).expanduser())
        except (AudioError, OSError, RuntimeError) as exc:
            raise ConfigError(f"diarizer.enroll.{name}: cannot read {path}: {exc}") from exc
    return clips
