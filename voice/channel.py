"""The `VoiceChannel`: shared-microphone audio → one room event per speaker turn (rules V1–V6, V9).

Shape and why:
- One `VoiceSession` per audio stream (a conference-room microphone, a phone leg). The session
  decodes frames (`voice.audio.FrameDecoder`: any size, rate, channels, PCM16 or µ-law), keeps the
  recent audio (`AudioLog`), and runs one `SttStream` (the base that owns keepalive, reconnect and
  speaker-label continuity). Many sessions share one event loop; model work runs in threads.
- When a turn ends is decided in one place, the session's `voice.assembler.TurnAssembler` (pure,
  synchronous; its `TurnPolicy` is the channel's `policy`): STT results and the stage's view go
  in, `Commit` and `Revise` decisions come out, and the session applies them. With
  `pipeline_speakers=True` the words' speakers come from the stream's diarization stage, fed off
  the loop by a `voice.stage_driver.StageDriver` (V5): the channel's own `diarizer` for one
  stream at a time, or one stage per session (`start_session(stage=…)`).
- Each turn passes the `ON_TRANSCRIPTION` sync chain as a frozen `TranscriptionEvent` (V6): a hook
  may rename (sticks for later turns of that voice unless `sticky_renames=False`), edit the text,
  match the voice to a participant, or block (no event, no rank). The turn is then committed with
  `kit.post_event` and V2 metadata; `ON_SPEAKER_CHANGE` observers hear when the voice changes. A
  `Revise` (an early turn the final corrected, a turn whose voice went on) updates the committed
  event in place (`kit.update_event`, metadata `corrected: true`) and is counted in
  `session.corrections`.
- The agent's own voice (V9): `play()` (the `rooms.AudioSink` protocol) opens a playback window
  for the room: from the call until the audio's duration plus `echo_tail` has passed, audio
  arriving on that room's sessions is replaced by silence before STT and diarization. Session time
  keeps counting, so later turns keep true times; speech over the agent (barge-in) is not
  transcribed while it plays. This is a gate, not echo cancellation: cheap, and certain.
- The stream's health (issue 10.1): the STT stream's status events (`SttDegraded`,
  `SttRecovered`, `AudioLost`, `StreamError`) are kept on the session (`status`, bounded) and
  handed to `VoiceChannel(on_status=…)`, the one place a server tells the device and counts them.
- The live second pass (issue 23, `VoiceChannel(second_pass=…)`, `voice.second_pass`): stretches
  of committed turns are re-decoded whole in the background and each turn corrected in place
  where the words differ; a session's `finish()` waits for its turns' second passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from models import RoomEvent, VoiceTurn
from rooms import Channel, RoomContext
from voice.assembler import TurnPolicy
from voice.audio import STT_SAMPLE_RATE, Encoding, StreamFormat, float_to_pcm16, resample
from voice.diarization_stage import DiarizationStage, abilities_of
from voice.events import CommittedTurn, SpeakerChangeEvent, TranscriptionEvent
from voice.second_pass import SecondPass
from voice.session import KEPT_TURNS, StatusCallback, VoiceSession
from voice.speakers import VoiceEmbedder
from voice.stt.base import SttBounds, SttProvider, SttStatus
from voice.turn_writer import KEPT_PER_SESSION

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

KEPT_PLAYED = 256
"""`VoiceChannel.played` entries kept (the newest)."""


def _check_stage(stage: DiarizationStage) -> None:
    if not isinstance(stage, DiarizationStage):
        raise TypeError(f"diarizer must implement voice.diarization_stage.DiarizationStage, "
                        f"got {type(stage).__name__}")
    abilities_of(stage)  # a declared ability without its method fails here, not mid-stream


class VoiceChannel(Channel):
    """Turns shared-microphone audio into per-speaker room events. Implements `rooms.AudioSink`
    and `rooms.TurnAudioSource` (a turn's audio, asked for when the turn is delivered: R3)."""

    channel_type: ClassVar[str] = "voice"

    def __init__(
        self,
        channel_id: str = "voice",
        *,
        stt: SttProvider | None = None,
        pipeline_speakers: bool = False,
        diarizer: DiarizationStage | None = None,
        embedder: VoiceEmbedder | Callable[[], VoiceEmbedder] | str | None = "default",
        sticky_renames: bool = True,
        echo_tail: float = 0.3,
        diarize_step: float = 0.2,
        policy: TurnPolicy | None = None,
        speaker_wait: float | None = None,
        early_commit: bool | None = None,
        provisional_speakers: bool | None = None,
        provisional_changes: bool | None = None,
        stage_per_session: bool = False,
        catch_up: bool = False,
        kept_turns: int | None = KEPT_TURNS,
        on_play: Callable[[str, bytes, int], Awaitable[None]] | None = None,
        on_status: StatusCallback | None = None,
        stt_bounds: SttBounds | None = None,
        second_pass: SecondPass | None = None,
    ) -> None:
        """`policy`: the turn rules (`voice.assembler.TurnPolicy`); `speaker_wait`,
        `early_commit`, `provisional_speakers` and `provisional_changes` override one field of
        it each. `pipeline_speakers=True` takes the speakers from a diarization stage: this
        channel's `diarizer` (one stream at a time), or the stage each `start_session(stage=…)`
        brings (`stage_per_session=True`: a server pools stages, not channels). `catch_up=True`
        (a live server): a stream whose stage fell behind skips the windows of its backlog where
        the stage can (`StageAbilities.catches_up`) instead of running each one; off, every
        window runs (a file pushed faster than real time). `kept_turns`:
        how many committed turns each session keeps (None: all, for a file). `stt_bounds`: how
        long each session's STT stream waits on its provider (`voice.stt.base.SttBounds`).
        `second_pass`: re-decodes stretches of committed turns and corrects them in place
        (`voice.second_pass`; one may serve several channels, its owner closes it)."""
        super().__init__(channel_id)
        if pipeline_speakers and diarizer is None and not stage_per_session:
            raise ValueError(
                "pipeline_speakers=True needs a diarization stage: pass diarizer= "
                "(e.g. diarization.load_stage('embedded')), or stage_per_session=True and "
                "start_session(stage=…) for each stream, or set pipeline_speakers=False (rule V5)"
            )
        if diarizer is not None:
            _check_stage(diarizer)
        self._owns_stt = stt is None
        if stt is None:
            from voice.stt.whisper import WhisperSTT

            stt = WhisperSTT()
        self.stt = stt
        self.pipeline_speakers = pipeline_speakers
        self.diarizer = diarizer
        self._embedder = embedder
        self.sticky_renames = sticky_renames
        self.echo_tail = echo_tail
        self.diarize_step = diarize_step
        self.catch_up = catch_up
        base = policy or TurnPolicy()
        self.policy = TurnPolicy(
            early_commit=base.early_commit if early_commit is None else early_commit,
            provisional_speakers=(base.provisional_speakers if provisional_speakers is None
                                  else provisional_speakers),
            provisional_changes=(base.provisional_changes if provisional_changes is None
                                 else provisional_changes),
            speaker_wait=base.speaker_wait if speaker_wait is None else speaker_wait,
        )
        """The turn rules every session of this channel follows."""
        self.kept_turns = kept_turns
        self.on_play = on_play
        self.on_status = on_status
        self.stt_bounds = stt_bounds or SttBounds()
        self.second_pass = second_pass
        """Hears every session's stream status (degraded, recovered, audio lost, ended): the
        server tells the device and counts it. A failure in it is logged, never raised."""
        self._sessions: dict[str, VoiceSession] = {}
        self._playing_until: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.played: list[tuple[str, int, int]] = []
        """(room id, bytes, sample rate) of the latest `KEPT_PLAYED` `play` calls."""

    async def _report_status(self, session: VoiceSession, status: SttStatus) -> None:
        if self.on_status is None:
            return
        try:
            await self.on_status(session, status)
        except Exception:
            log.exception("voice session %s: the status callback failed", session.id)

    def embedder_factory(self) -> VoiceEmbedder | Callable[[], VoiceEmbedder] | None:
        """The speaker embedder for V4 matching (lazy: loaded on the first reconnect that needs it)."""
        if self._embedder == "default":
            def load() -> VoiceEmbedder:
                from voice.embedding import default_embedding_model

                return default_embedding_model()

            return load if self.stt.diarizes else None
        return self._embedder  # type: ignore[return-value]

    @property
    def sessions(self) -> list[VoiceSession]:
        return list(self._sessions.values())

    async def start_session(
        self,
        room_id: str,
        participant_id: str,
        *,
        sample_rate: int = STT_SAMPLE_RATE,
        encoding: Encoding = "pcm16",
        channels: int = 1,
        fmt: StreamFormat | None = None,
        session_id: str | None = None,
        stage: DiarizationStage | None = None,
        echo_gate: bool = True,
    ) -> VoiceSession:
        """Open a stream in a room (the channel must be attached to it). `fmt` declares the
        stream's audio at once (else `sample_rate`, `encoding`, `channels`). With pipeline
        speakers the stream's diarization stage is `stage` (the caller's, reset for this
        stream) or else the channel's own `diarizer`, which serves one stream at a time.
        `echo_gate`: the room's replies may play into this stream's microphone (a speakerphone, a
        phone that sends the reply back), so its audio is held back and silenced while one plays
        (V9) unless someone talks over it (`VoiceSession.reply_stopped`); False for a stream
        whose device cancels the reply's echo itself, so words said over a reply are heard as
        they come. Bad declared formats raise an `AudioError` naming the problem (rule V10)."""
        kit = self.require_kit()
        if await kit.get_room(room_id) is None:
            raise KeyError(f"no room {room_id!r}")
        if fmt is None:
            fmt = StreamFormat(sample_rate=sample_rate, encoding=encoding, channels=channels)
        if stage is not None:
            if not self.pipeline_speakers:
                raise ValueError("a stream's diarization stage needs pipeline_speakers=True")
            _check_stage(stage)
        elif self.pipeline_speakers:
            if self.diarizer is None:
                raise ValueError("this VoiceChannel takes a diarization stage per stream: "
                                 "start_session(stage=…)")
            if self._diarizer_in_use():
                raise RuntimeError("this VoiceChannel's diarization stage already serves a "
                                   "session; pass start_session(stage=…) for each stream, or "
                                   "use one VoiceChannel per pipeline-diarized stream")
            stage = self.diarizer
        session = VoiceSession(self, room_id, participant_id, fmt, session_id, stage,
                               echo_gate=echo_gate)
        self._sessions[session.id] = session
        try:
            await session.start()
        except BaseException:
            self._sessions.pop(session.id, None)
            raise
        return session

    def enroll(self, name: str, audio: FloatAudio) -> None:
        """Name a voice (V8) on this channel's diarization stage (mono float32 at the stage's
        rate): its turns carry `name` from the first one. Model work: call off the event loop
        (`asyncio.to_thread`) in a running server."""
        if self.diarizer is None:
            raise RuntimeError("enrollment needs a diarization stage: pass diarizer= (rule V8)")
        self.diarizer.enroll(name, audio)

    def _diarizer_in_use(self) -> bool:
        """Whether the channel's own stage serves an open session."""
        return any(not s.finished and s.stage is not None and s.stage.stage is self.diarizer
                   for s in self._sessions.values())

    # -- AudioSink (V9) ----------------------------------------------------------------------

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        """Play the agent's audio into the room; the room's sessions are gated while it plays."""
        duration = len(pcm16) // 2 / sample_rate
        loop = asyncio.get_running_loop()
        start = max(loop.time(), self._playing_until.get(room_id, 0.0) - self.echo_tail)
        self._playing_until[room_id] = start + duration + self.echo_tail
        self.played.append((room_id, len(pcm16), sample_rate))
        del self.played[:-KEPT_PLAYED]
        if self.on_play is not None:
            await self.on_play(room_id, pcm16, sample_rate)

    def stop_playing(self, room_id: str) -> None:
        """The room's reply was stopped (someone talked over it, and every device and phone leg
        dropped what it held of it): its playback window ends once the echo of what was in the
        air has died away (`echo_tail`), not when the reply would have ended (V9)."""
        until = self._playing_until.get(room_id)
        if until is not None:
            now = asyncio.get_running_loop().time()
            self._playing_until[room_id] = min(until, now + self.echo_tail)

    async def on_detach(self, room_id: str) -> None:
        """The room is gone: forget its playback window (V9)."""
        self._playing_until.pop(room_id, None)

    def is_playing(self, room_id: str) -> bool:
        until = self._playing_until.get(room_id)
        return until is not None and asyncio.get_running_loop().time() < until

    def playing_until(self, room_id: str) -> float:
        """Loop time the room's playback window ends (its echo tail included); 0 for none."""
        return self._playing_until.get(room_id, 0.0)

    # -- TurnAudioSource (R3) ----------------------------------------------------------------

    def turn_audio(self, turn: VoiceTurn, sample_rate: int) -> bytes | None:
        """The audio of one of this channel's turns (`rooms.TurnAudioSource`): its session's
        accepted samples over `start`…`end` (after the V9 gate), resampled as float and converted
        to PCM16 once. A session is readable until `finish()` returns, after its last turns were
        delivered (`post_event` returns after delivery); then None, as for a span the session's
        `AudioLog` no longer holds (a span partly dropped gives what is held)."""
        session = self._sessions.get(turn.voice_session_id)
        if session is None:
            return None
        log_rate = session.audio.sample_rate
        samples = session.audio.samples(round(turn.start * log_rate), round(turn.end * log_rate))
        if len(samples) == 0:
            return None
        return float_to_pcm16(resample(samples, log_rate, sample_rate))

    # -- Channel -----------------------------------------------------------------------------

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        """Events from other channels need no action here: replies reach the room's ears
        through `play` (the realtime channel hands its audio to every AudioSink)."""

    async def close(self) -> None:
        for session in list(self._sessions.values()):
            with contextlib.suppress(Exception):
                await session.finish()
        for task in list(self._tasks):
            task.cancel()
        if self._owns_stt:  # a provider passed in may serve other channels: its owner closes it
            await self.stt.aclose()


def pcm16_frames(audio: FloatAudio, sample_rate: int, frame_seconds: float = 0.1) -> list[bytes]:
    """Cut float audio into PCM16 frames (tests, the CLI and the bench stream files this way)."""
    pcm = float_to_pcm16(audio)
    step = max(2, int(frame_seconds * sample_rate) * 2)
    return [pcm[i : i + step] for i in range(0, len(pcm), step)]


__all__ = [
    "KEPT_PER_SESSION",
    "CommittedTurn",
    "SpeakerChangeEvent",
    "StatusCallback",
    "TranscriptionEvent",
    "VoiceChannel",
    "VoiceSession",
    "pcm16_frames",
]
