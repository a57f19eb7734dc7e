"""One audio stream in one room: the `VoiceSession`, I/O glue around its turn assembler.

Frames in (`push`: any size, rate, channels, PCM16 or µ-law, decoded by `voice.audio.FrameDecoder`;
bad frames skipped and counted, V10), the recent audio kept (`AudioLog`), one `SttStream` (the base
that owns keepalive, reconnect and speaker-label continuity), the stream's diarization stage fed
off the loop (`voice.stage_driver.StageDriver`, pipeline speakers, V5). STT results and the
stage's view go into the session's `voice.assembler.TurnAssembler`; its decisions go to the
session's `voice.turn_writer.TurnWriter` (hooks, posts, corrections in place). Created by
`VoiceChannel.start_session`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from voice.assembler import TurnAssembler
from voice.audio import STT_SAMPLE_RATE, AudioError, AudioLog, FrameDecoder, StreamFormat, resample
from voice.diarization_stage import DiarizationStage
from voice.events import CommittedTurn, TranscriptionEvent
from voice.speakers import SpeakerContinuity
from voice.stage_driver import StageDriver
from voice.stt.base import (
    AudioLost,
    StreamError,
    SttDegraded,
    SttEvent,
    SttRecovered,
    SttRefused,
    SttStatus,
    SttStream,
    Transcript,
    UtteranceEnd,
)
from voice.turn_writer import KEPT_PER_SESSION, TurnWriter
from voice.turns import Word

if TYPE_CHECKING:
    from voice.channel import VoiceChannel

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

STATUS_KEPT = 64
"""Status events a session keeps (an endless flapping connection cannot grow memory)."""
KEPT_TURNS = 1000
"""Committed turns a session keeps by default (`VoiceChannel(kept_turns=…)`; the room's store
holds them all)."""

GATE_LOOKBEHIND_S = 0.5
"""How long a gated stream's audio is held back before silence takes its place (V9): a device
that stops the reply because someone talks over it (the page's barge-in) has heard them for its
hold time (240 ms) before it says so, and the message takes its way here; what it held of that
time is handed on as it was heard (`VoiceSession.reply_stopped`), so the interrupter's first
word reaches the STT. While a reply plays, the STT hears the stream this much later."""

StatusCallback = Callable[["VoiceSession", SttStatus], Awaitable[None]]
"""Hears a session's stream status (`VoiceChannel(on_status=…)`)."""


class VoiceSession:
    """One audio stream in one room: I/O glue around its `TurnAssembler`. Create with
    `VoiceChannel.start_session`."""

    def __init__(
        self,
        channel: VoiceChannel,
        room_id: str,
        participant_id: str,
        fmt: StreamFormat,
        session_id: str | None = None,
        stage: DiarizationStage | None = None,
        *,
        echo_gate: bool = True,
    ) -> None:
        self.channel = channel
        self.echo_gate = echo_gate
        """Silence this stream's audio while the room's agent plays a reply (V9): see
        `VoiceChannel.start_session`."""
        self._heard_until = 0.0
        """The playback window this stream is heard through (`reply_stopped`)."""
        self.room_id = room_id
        self.participant_id = participant_id
        self.format = fmt
        self.id = session_id or uuid.uuid4().hex[:12]
        self.decoder = FrameDecoder(fmt, STT_SAMPLE_RATE)
        self.audio = AudioLog()
        self.paused = False
        self.finished = False
        self.skipped_frames: deque[str] = deque(maxlen=KEPT_PER_SESSION)
        """Why the latest bad frames were skipped (bounded: a client may send only bad frames)."""
        self.skipped_count = 0
        self.gated_seconds = 0.0
        """Seconds of this stream's audio silenced while a reply played (V9)."""
        self._held: deque[tuple[FloatAudio, bool]] = deque()
        """Audio held back while gated, newest last, each piece with whether it was captured
        inside the playback window: silenced once older than `GATE_LOOKBEHIND_S`, handed on as
        heard if the device stops the reply first (`reply_stopped`)."""
        self._held_s = 0.0
        self.interim: tuple[Word, ...] = ()
        self._lock = asyncio.Lock()
        self.speakers = SpeakerContinuity(embedder=channel.embedder_factory())
        self.stt = SttStream(channel.stt, self._on_stt_event, audio=self.audio, speakers=self.speakers,
                             bounds=channel.stt_bounds)
        self.assembler = TurnAssembler(channel.policy, pipeline=stage is not None)
        self.writer = TurnWriter(self, self.assembler, channel.kept_turns)
        """Applies the assembler's decisions: hooks, posts, corrections in place."""
        self.stage: StageDriver | None = None
        """Feeds the stream's diarization stage (pipeline speakers, V5); None otherwise."""
        if stage is not None:
            self.stage = StageDriver(stage, self.audio, step=channel.diarize_step,
                                     catch_up=channel.catch_up, since=self._placing_since,
                                     on_view=self.assembler.stage_heard,
                                     on_handover=self._handover)
        self.error: str | None = None
        self.status: deque[SttStatus] = deque(maxlen=STATUS_KEPT)
        """The stream's latest status events (outages, recoveries, lost audio), oldest first."""

    @property
    def turns(self) -> list[CommittedTurn]:
        """The session's committed turns, oldest first (the latest `VoiceChannel.kept_turns`)."""
        return self.writer.turns

    @property
    def corrections(self) -> int:
        """Committed turns corrected in place (early commits the final corrected, turns whose
        voice went on after an early end)."""
        return self.writer.corrections

    @property
    def second_pass_corrections(self) -> int:
        """Committed turns the live second pass corrected in place (`voice.second_pass`)."""
        return self.writer.second_pass_corrections

    @property
    def blocked(self) -> deque[TranscriptionEvent]:
        """The latest turns a hook blocked."""
        return self.writer.blocked

    # -- audio in --------------------------------------------------------------------------

    def push(self, frame: bytes) -> int:
        """Accept one live frame (any size). Returns the 16 kHz samples it produced.

        A bad frame raises an `AudioError` naming the problem; it is skipped and logged, and the
        session goes on (rule V10)."""
        if self.finished:
            raise RuntimeError(f"voice session {self.id} is finished")
        if self.paused:
            self.decoder.skip(frame)
            return 0
        try:
            samples = self.decoder.decode(frame)
        except AudioError as exc:
            self.skipped_frames.append(str(exc))
            self.skipped_count += 1
            if self.skipped_count == 1 or self.skipped_count % 1000 == 0:
                log.warning("voice session %s: skipped a frame (%d so far): %s", self.id,
                            self.skipped_count, exc)
            raise
        if len(samples) == 0:
            return 0
        return self._accept(samples)

    def push_audio(self, audio: FloatAudio, sample_rate: int = STT_SAMPLE_RATE) -> int:
        """Accept float32 mono audio directly (files, tests): same path as `push` after decoding."""
        if self.finished:
            raise RuntimeError(f"voice session {self.id} is finished")
        samples = resample(np.asarray(audio, np.float32), sample_rate, STT_SAMPLE_RATE)
        if not np.all(np.isfinite(samples)):
            raise AudioError("audio holds NaN or infinite samples")
        return self._accept(samples) if not self.paused else 0

    def _accept(self, samples: FloatAudio) -> int:
        until = self.channel.playing_until(self.room_id)
        gated = (self.echo_gate and until > self._heard_until
                 and asyncio.get_running_loop().time() < until)
        if gated or self._held:
            self._held.append((samples, gated))
            self._held_s += len(samples) / STT_SAMPLE_RATE
            if not gated:  # the window is over: what was held in it was the reply's echo
                self._release_held(as_heard=False)
            while self._held_s > GATE_LOOKBEHIND_S:
                self._hand_on(*self._pop_held(), as_heard=False)
        else:
            self._hand_on(samples, False, as_heard=True)
        if self.stage is not None:
            self.stage.wake()
        return len(samples)

    def _pop_held(self) -> tuple[FloatAudio, bool]:
        samples, gated = self._held.popleft()
        self._held_s -= len(samples) / STT_SAMPLE_RATE
        return samples, gated

    def _hand_on(self, samples: FloatAudio, gated: bool, *, as_heard: bool) -> None:
        if gated and not as_heard:
            self.gated_seconds += len(samples) / STT_SAMPLE_RATE
            samples = np.zeros_like(samples)  # V9: the agent's own voice is not a participant
        self.stt.push(samples)  # also appends to self.audio

    def _release_held(self, *, as_heard: bool) -> None:
        """Hand on everything held: as heard (the reply was stopped), or silenced where it
        was captured inside the playback window."""
        while self._held:
            self._hand_on(*self._pop_held(), as_heard=as_heard)
        self._held_s = 0.0

    def reply_stopped(self) -> None:
        """The device stopped the reply it was playing into this stream's microphone (someone
        talked over it): the stream is heard again at once, for the rest of the room's current
        playback window (V9 silences it for a reply it plays, not for one it has stopped), and
        the last `GATE_LOOKBEHIND_S` it held back is handed on as heard (the words that made
        the device stop the reply). A reply played later (the window growing past it) is
        gated again."""
        self._heard_until = self.channel.playing_until(self.room_id)
        if self._held:
            self._release_held(as_heard=True)
            if self.stage is not None:
                self.stage.wake()

    def pause(self) -> None:
        """Stop accepting audio (frames pushed while paused are dropped); pending speech is
        finalized in the background."""
        self.paused = True
        task = asyncio.get_running_loop().create_task(self.flush())
        self.channel._tasks.add(task)
        task.add_done_callback(self.channel._tasks.discard)

    def resume(self) -> None:
        self.paused = False

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        if self.stage is not None:
            self.stage.start(self._stage_stepped)
        await self.stt.start()

    async def flush(self) -> None:
        """Make everything heard so far final and commit its turns."""
        self._release_held(as_heard=False)
        await self.stt.flush()
        async with self._lock:
            await self._advance(force=True)

    async def finish(self) -> list[CommittedTurn]:
        """End the stream: flush, close the STT connection, return the session's turns."""
        if self.finished:
            return self.turns
        tail = self.decoder.flush()  # the resampler's last samples (ends the decoder)
        if len(tail) and not self.paused:
            self._accept(tail)
        self._release_held(as_heard=False)  # before the stage's flush reads the audio log
        try:
            if self.stage is not None:
                # before the STT's flush force-assigns the last words: what the stage still
                # holds back (the embedded live stage decides up to a second late) must be
                # decided first, or the stream's last words fall back to the stream owner
                await self.stage.flush(self.id)
            await self.flush()
            self.finished = True
            await self.stt.aclose()
            async with self._lock:
                await self._advance(force=True)
            if self.channel.second_pass is not None:
                self.writer.flush_second_pass()  # the last stretch goes now
                await self.channel.second_pass.settled(self.id)  # its turns' second passes
        except asyncio.CancelledError:  # the caller's deadline (a server drain): stop now
            self.finished = True
            self.writer.drop_second_pass()
            self.stt.abort()
            if self.stage is not None:
                self.stage.cancel()
            self.channel._sessions.pop(self.id, None)
            raise
        if self.stage is not None:
            await self.stage.stop()
        self.channel._sessions.pop(self.id, None)
        self.audio.release()  # nothing reads a finished session's audio (turn_audio: None)
        return self.turns

    # -- STT events and stage decisions → the assembler ------------------------------------

    async def _on_stt_event(self, event: SttEvent) -> None:
        if isinstance(event, StreamError | SttDegraded | SttRecovered | AudioLost | SttRefused):
            if isinstance(event, StreamError):
                self.error = event.message
                log.error("voice session %s: %s", self.id, event.message)
            elif isinstance(event, SttRefused):
                self.error = f"the STT refused the stream: {event.reason}"
                log.error("voice session %s: %s", self.id, self.error)
            self.status.append(event)
            await self.channel._report_status(self, event)
            return
        async with self._lock:
            if isinstance(event, UtteranceEnd):
                self.assembler.end_of_speech()
                await self._advance(force=False)
                return
            if not isinstance(event, Transcript):
                return
            if not event.is_final:
                self.interim = event.words
                if self.stage is not None and self.assembler.wants_decided_hints:
                    await self.stage.feed_quietly(self.id)  # the stage's latest decisions first
                await self.writer.apply(self.assembler.interim(event.words, event.hints,
                                                         final_until=self.stt.final_until))
                return
            self.interim = ()
            await self.writer.apply(self.assembler.final(event.words, speech_final=event.speech_final))
            await self._advance(force=False)

    async def _advance(self, *, force: bool) -> None:
        """Words the stage must place first hear its latest decisions; then the assembler moves
        final words on and its decisions are applied."""
        if self.stage is not None and self.assembler.unplaced:
            await self.stage.feed_quietly(self.id)
        await self.writer.apply(self.assembler.advance(force=force))

    async def _stage_stepped(self) -> None:
        if self.assembler.waiting_on_stage:
            # words waiting for the stage to place them, or a run it may have ended
            async with self._lock:
                await self._advance(force=False)

    # -- overload: off the stage and back (issue 31) ----------------------------------------

    @property
    def on_stage(self) -> bool:
        """The stream's speakers come from its diarization stage now."""
        return self.stage is not None and not self.stage.suspended

    async def fall_back(self) -> None:
        """Take the stream off its stage: the stage is not fed any more and the words take the
        STT's speakers (one speaker when it labels nobody), those waiting for the stage too."""
        if self.stage is None or self.stage.suspended:
            return
        self.stage.suspend()
        self.assembler.speakers_from_stage(False)
        async with self._lock:
            await self._advance(force=False)

    def return_to_stage(self) -> None:
        """Put the stream back on its stage, fed afresh from the audio accepted from now on."""
        if self.stage is None or not self.stage.suspended:
            return
        self.stage.resume()
        self.assembler.speakers_from_stage(True)

    def _placing_since(self) -> float:
        """From when the stage's decided timeline is still needed: the first word waiting to be
        placed, or those the STT has yet to make final (after its last final word)."""
        first = self.assembler.first_unplaced_start
        final_until = self.stt.final_until
        return min(final_until if first is None else first, final_until)

    def _handover(self, at: float, speaker: str) -> None:
        """The stage decided a handover: a local engine (Whisper) ends its utterance there, so the
        turn before it is decoded then instead of at the next pause or the utterance cap."""
        self.stt.voice_change(at)
        self.assembler.handover(at, speaker)


__all__ = ["KEPT_TURNS", "STATUS_KEPT", "StatusCallback", "VoiceSession"]
