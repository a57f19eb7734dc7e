"""The `VoiceChannel`: shared-microphone audio → one room event per speaker turn (rules V1–V6, V9).

Shape and why:
- One `VoiceSession` per audio stream (a conference-room microphone, a phone leg). The session
  decodes frames (`voice.audio.FrameDecoder`: any size, rate, channels, PCM16 or µ-law), keeps the
  recent audio (`AudioLog`), and runs one `SttStream` (the base that owns keepalive, reconnect and
  speaker-label continuity). Many sessions share one event loop; model work runs in threads.
- Turns are cut in one place (`voice.turns.speaker_runs`): final words are split into runs of
  consecutive words with one speaker (V3). With `pipeline_speakers=True` the words' speakers come
  from the diarization stage instead: each word takes `timeline.speaker_over(start, end)` (V5).
  The last run of a final stays open until the speaker changes, the STT marks the end of speech
  (`speech_final`, `UtteranceEnd`), or the stream is flushed; so a sentence split over two finals
  is still one turn, and one final holding two voices is two turns.
- Early commit (latency, issue 10): with a diarizing streaming STT a turn that ends where another
  voice starts without a pause would wait for the final that closes the next voice's words
  (seconds). Interim results carry speaker hints (`Transcript.hints`): when an interim shows the
  voice changing, the runs it closes are committed at once from the interim words
  (`provisional`), and the pending final run before them too. When the final covering them
  arrives, its words replace nothing if they agree; if they disagree (other words, another
  voice), the committed event is corrected in place (`kit.update_event`, metadata
  `corrected: true`) and counted in `session.corrections`. `early_commit=False` turns it off.
  With pipeline speakers (V5) the hints are the stage's *decided* speakers of the interim words
  (`_decided_hints`; words after the last one it placed are left out: not decided is not a
  change), and the final's words settle the early turns once they have the stage's speakers.
  Whisper sends no interim results, so the embedded default is unchanged.
- Each turn passes the `ON_TRANSCRIPTION` sync chain as a frozen `TranscriptionEvent` (V6): a hook
  may rename (sticks for later turns of that voice unless `sticky_renames=False`), edit the text,
  match the voice to a participant, or block (no event, no rank). The turn is then committed with
  `kit.post_event` and V2 metadata; `ON_SPEAKER_CHANGE` observers hear when the voice changes.
- The agent's own voice (V9): `play()` (the `rooms.AudioSink` protocol) opens a playback window
  for the room: from the call until the audio's duration plus `echo_tail` has passed, audio
  arriving on that room's sessions is replaced by silence before STT and diarization. Session time
  keeps counting, so later turns keep true times; speech over the agent (barge-in) is not
  transcribed while it plays. This is a gate, not echo cancellation: cheap, and certain.
- The stream's health (issue 10.1): the STT stream's status events (`SttDegraded`,
  `SttRecovered`, `AudioLost`, `StreamError`) are kept on the session (`status`, bounded) and
  handed to `VoiceChannel(on_status=…)`, the one place a server tells the device and counts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np
import numpy.typing as npt

from models import RoomEvent, TextContent, VoiceTurn
from rooms import Channel, HookContext, HookTrigger, RoomContext
from voice.audio import (
    STT_SAMPLE_RATE,
    AudioError,
    AudioLog,
    Encoding,
    FrameDecoder,
    StreamFormat,
    float_to_pcm16,
    resample,
)
from voice.diarization_stage import DiarizationStage, SpeakerTimeline
from voice.speakers import SpeakerContinuity, VoiceEmbedder
from voice.stt.base import (
    AudioLost,
    StreamError,
    SttDegraded,
    SttEvent,
    SttProvider,
    SttRecovered,
    SttStatus,
    SttStream,
    Transcript,
    UtteranceEnd,
)
from voice.turns import (
    MIN_WORD_EVIDENCE,
    SpeakerTurn,
    Word,
    assign_speakers,
    join_words,
    speaker_runs,
)

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]


@dataclass(frozen=True)
class TranscriptionEvent:
    """One speaker turn before it becomes a room event (rule V6). Hooks return a modified copy
    (`dataclasses.replace`) to rename (`sender_name`), edit (`text`) or match a participant."""

    text: str
    speaker: str | None
    """The raw label (`Speaker A` …, or the diarization stage's name); never changed by hooks."""
    sender_name: str | None
    start: float
    end: float
    words: tuple[Word, ...]
    participant_id: str | None
    session: VoiceSession = field(compare=False, repr=False)


@dataclass(frozen=True)
class SpeakerChangeEvent:
    """`ON_SPEAKER_CHANGE` (observer): the turn's voice differs from the previous turn's."""

    speaker: str | None
    sender_name: str | None
    previous_speaker: str | None
    is_new_speaker: bool
    """True the first time this voice is heard in the session."""
    start: float
    participant_id: str | None
    session: VoiceSession = field(compare=False, repr=False)


@dataclass(frozen=True)
class CommittedTurn:
    """What a session committed: the room event, the turn as hooks left it, and when (loop time)."""

    event: RoomEvent
    transcription: TranscriptionEvent
    committed_at: float

    @property
    def sender_name(self) -> str | None:
        return self.transcription.sender_name

    @property
    def text(self) -> str:
        return self.transcription.text

    @property
    def start(self) -> float:
        return self.transcription.start

    @property
    def end(self) -> float:
        return self.transcription.end


class VoiceSession:
    """One audio stream in one room. Create with `VoiceChannel.start_session`."""

    def __init__(
        self,
        channel: VoiceChannel,
        room_id: str,
        participant_id: str,
        fmt: StreamFormat,
        session_id: str | None = None,
    ) -> None:
        self.channel = channel
        self.room_id = room_id
        self.participant_id = participant_id
        self.format = fmt
        self.id = session_id or uuid.uuid4().hex[:12]
        self.decoder = FrameDecoder(fmt, STT_SAMPLE_RATE)
        self.audio = AudioLog()
        self.paused = False
        self.finished = False
        self.turns: list[CommittedTurn] = []
        self.blocked: deque[TranscriptionEvent] = deque(maxlen=KEPT_PER_SESSION)
        """The latest turns a hook blocked (bounded: a blocking hook may block every turn)."""
        self.skipped_frames: deque[str] = deque(maxlen=KEPT_PER_SESSION)
        """Why the latest bad frames were skipped (bounded: a client may send only bad frames)."""
        self.skipped_count = 0
        self.gated_seconds = 0.0
        self.names: dict[str, str] = {}
        """Sticky renames: raw label → the name a hook gave it (V6)."""
        self.matches: dict[str, str] = {}
        """Sticky participant matches: raw label → participant id (V6)."""
        self.heard: set[str | None] = set()
        self.last_speaker: str | object | None = _NOBODY
        self.interim: tuple[Word, ...] = ()
        self._pending: list[Word] = []
        """Final words with speakers, waiting for their run to end."""
        self._unassigned: list[Word] = []
        """Final words waiting for the diarization stage (pipeline mode)."""
        self._end_of_speech = False
        self._provisional: list[_Provisional] = []
        """Turns committed from interim words, waiting for the final that confirms them."""
        self.corrections = 0
        """Early-committed turns the final results corrected (and turns reopened because the
        voice went on after an early end)."""
        self._closed_early: CommittedTurn | None = None
        """The last turn, when it was closed by a provisional voice change not yet decided."""
        self._reopened: CommittedTurn | None = None
        """A turn closed early whose voice went on: its run's commit updates it in place."""
        self._lock = asyncio.Lock()
        self.speakers = SpeakerContinuity(embedder=channel.embedder_factory())
        self.stt = SttStream(channel.stt, self._on_stt_event, audio=self.audio, speakers=self.speakers)
        self._diarizer = channel.diarizer if channel.pipeline_speakers else None
        self._timeline = SpeakerTimeline()
        self._undecided = SpeakerTimeline()
        """The stage's provisional speakers of the frames it has heard but not decided (a stage
        with a `provisional()` method, like the embedded live stage); empty otherwise."""
        self._fed = 0
        self._change_told = 0.0
        """Session time of the last decided voice change told to the STT stream."""
        self._handovers: deque[tuple[float, str]] = deque(maxlen=8)
        """The latest decided handovers: (where the voice ended, whose voice it was)."""
        self._diar_task: asyncio.Task[None] | None = None
        self._diar_wake = asyncio.Event()
        self._feed_lock = asyncio.Lock()  # the stage hears its audio once, in order
        self.error: str | None = None
        self.status: deque[SttStatus] = deque(maxlen=STATUS_KEPT)
        """The stream's latest status events (outages, recoveries, lost audio), oldest first."""

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
        if self.channel.is_playing(self.room_id):
            self.gated_seconds += len(samples) / STT_SAMPLE_RATE
            samples = np.zeros_like(samples)  # V9: the agent's own voice is not a participant
        self.stt.push(samples)  # also appends to self.audio
        if self._diarizer is not None:
            self._diar_wake.set()
        return len(samples)

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
        if self._diarizer is not None:
            self._diar_task = asyncio.create_task(self._diarize_loop())
        await self.stt.start()

    async def flush(self) -> None:
        """Make everything heard so far final and commit its turns."""
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
        if self._diarizer is not None:
            # before the STT's flush force-assigns the last words: what the stage still holds
            # back (the embedded live stage decides up to a second late) must be decided first,
            # or the stream's last words fall back to the stream owner
            await self._flush_stage(self._diarizer)
        await self.flush()
        self.finished = True
        await self.stt.aclose()
        async with self._lock:
            await self._advance(force=True)
        if self._diar_task is not None:
            self._diar_task.cancel()
            with contextlib.suppress(BaseException):
                await self._diar_task
        self.channel._sessions.pop(self.id, None)
        self.audio.release()  # nothing reads a finished session's audio (turn_audio: None)
        return self.turns

    # -- STT events → turns ----------------------------------------------------------------

    async def _on_stt_event(self, event: SttEvent) -> None:
        if isinstance(event, StreamError | SttDegraded | SttRecovered | AudioLost):
            if isinstance(event, StreamError):
                self.error = event.message
                log.error("voice session %s: %s", self.id, event.message)
            self.status.append(event)
            await self.channel._report_status(self, event)
            return
        async with self._lock:
            if isinstance(event, UtteranceEnd):
                self._end_of_speech = True
                await self._advance(force=False)
                return
            if not isinstance(event, Transcript):
                return
            if not event.is_final:
                self.interim = event.words
                if not self.channel.early_commit:
                    return
                if event.hints and self._diarizer is None:
                    await self._commit_early(event.words, event.hints)
                elif self._diarizer is not None and not self._unassigned:
                    try:  # the stage's latest decisions first
                        await self._feed_stage(self._diarizer, self.audio.total)
                    except Exception:
                        log.exception("voice session %s: the diarization stage failed", self.id)
                    words, hints = self._decided_hints(event.words)
                    if words:
                        await self._commit_early(words, hints)
                return
            self.interim = ()
            words = event.words
            if self._provisional and self._diarizer is None:
                words = await self._settle_provisional(words)
            # (pipeline mode: early turns are settled once the final words have the stage's
            # speakers, in `_advance`)
            self._unassigned.extend(words)
            self._end_of_speech = event.speech_final
            await self._advance(force=False)

    # -- early commit from interim results (latency) -----------------------------------------

    async def _commit_early(self, words: tuple[Word, ...], hints: tuple[str | None, ...]) -> None:
        """An interim shows where voices change: commit what that change closes, now."""
        done_until = max((p.end for p in self._provisional), default=self.stt.final_until)
        done_until = max(done_until, self.stt.final_until)  # replayed after a reconnect: final
        if self._pending:
            done_until = max(done_until, self._pending[-1].end)
        fresh = [replace(w, speaker=h) for w, h in zip(words, hints, strict=False)
                 if w.end > done_until + _SAME_TIME]
        if not fresh:
            return
        runs = speaker_runs(fresh)
        first = runs[0].speaker
        if self._pending:
            last = self._pending[-1].speaker
            if first is not None and first != last:
                await self._emit_pending(force=True)  # the final run ended where this voice began
        closed = runs[:-1]
        if not closed or any(r.speaker is None for r in closed):
            return  # no change yet, or a voice not bound yet: wait for the final
        if self._pending:
            # the pending final words continue the first closed run: one turn
            await self._emit_pending(force=False)
            lead = list(self._pending)
            self._pending = []
        else:
            lead = []
        for i, run in enumerate(closed):
            before = tuple(lead) if i == 0 else ()
            turn = SpeakerTurn(run.speaker, before + run.words)
            committed = await self._commit_quietly(turn)
            self._provisional.append(_Provisional(turn, committed, len(before)))

    def _decided_hints(self, words: tuple[Word, ...]) -> tuple[tuple[Word, ...], tuple[str | None, ...]]:
        """Pipeline mode: the interim words up to the last one the stage's decided timeline
        places, with the decided speaker of each (None for a word it has not placed). Words
        after the last placed one are left out: not decided is not a change of voice, so only
        a run followed by another decided voice is closed early. Provisional speakers are not
        used here: they change as more windows vote, and an early turn they closed would be
        split from its own voice's next words."""
        timeline = self._timeline
        speakers = assign_speakers(words, timeline)
        hints = tuple(s.speaker if _overlapped(timeline, w) or _no_duration(w) else None
                      for w, s in zip(words, speakers, strict=True))
        last = max((i for i, (w, h) in enumerate(zip(words, hints, strict=True))
                    if h is not None and not _no_duration(w)), default=-1)
        return words[: last + 1], hints[: last + 1]

    async def _settle_provisional(self, words: tuple[Word, ...]) -> tuple[Word, ...]:
        """A final result arrived: its words over early-committed turns confirm or correct them;
        the rest go on as usual."""
        rest: list[Word] = []
        for w in words:
            mid = (w.start + w.end) / 2
            owner = next((p for p in self._provisional
                          if p.start - _SAME_TIME <= mid <= p.end + _SAME_TIME
                          and (w.speaker is None or w.speaker == p.turn.speaker)), None)
            if owner is None:
                rest.append(w)  # not said in an early turn: a turn of its own, as usual
            else:
                owner.confirmed.append(w)
        final_end = max((w.end for w in words), default=0.0)
        settled = [p for p in self._provisional if p.end <= final_end + _SAME_TIME]
        for early in settled:
            await self._correct(early, tuple(early.confirmed))
        self._provisional = [p for p in self._provisional if p not in settled]
        return tuple(rest)

    async def _correct(self, early: _Provisional, confirmed: tuple[Word, ...]) -> None:
        said = [(w.text, w.speaker) for w in early.interim_words]
        if [(w.text, w.speaker) for w in confirmed] == said or early.committed is None:
            return
        final = early.turn.words[: early.final_lead] + confirmed  # the lead was final already
        self.corrections += 1
        if not confirmed:
            # The final heard none of it (interim words it dropped): keep the text, say so.
            final = early.turn.words
        text = join_words(w.text for w in final)
        log.info("voice session %s: the final result corrected an early turn: %r -> %r",
                 self.id, early.turn.text, text)
        await self._update_turn(early.committed, text, final, unconfirmed=not confirmed)

    async def _update_turn(self, turn: CommittedTurn, text: str, words: tuple[Word, ...], *,
                           unconfirmed: bool = False, settled_now: bool = False) -> bool:
        """Replace a committed turn in place (`kit.update_event`, metadata `corrected: true`
        and the words' times) with `text` and `words`; every channel of the room is told.
        `settled_now`: the turn as finally shown arrived now (its end moved), so its
        `committed_at` becomes now. False when the room dropped the event meanwhile."""
        metadata = dict(turn.event.metadata)
        metadata["corrected"] = True
        if unconfirmed:
            metadata["unconfirmed"] = True
        metadata.update(VoiceTurn(turn.transcription.speaker, words[0].start, words[-1].end,
                                  self.id).metadata())
        try:
            updated = await self.channel.require_kit().update_event(
                self.room_id, turn.event.id, content=TextContent(body=text), metadata=metadata)
        except KeyError:  # the room dropped it meanwhile
            return False
        transcription = replace(turn.transcription, text=text, words=words,
                                start=words[0].start, end=words[-1].end)
        committed_at = asyncio.get_running_loop().time() if settled_now else turn.committed_at
        fixed = CommittedTurn(updated, transcription, committed_at)
        self.turns = [fixed if t is turn else t for t in self.turns]
        return True

    async def _commit_quietly(self, run: SpeakerTurn) -> CommittedTurn | None:
        before = len(self.turns)
        try:
            await self._commit(run)
        except Exception:
            log.exception("voice session %s: a turn was dropped because committing it failed",
                          self.id)
        return self.turns[-1] if len(self.turns) > before else None

    async def _advance(self, *, force: bool) -> None:
        """Move final words on: give them speakers (pipeline mode) and commit finished runs.

        In pipeline mode a word the stage has not placed yet (no segment near it) waits until the
        stage has heard `speaker_wait` seconds past it, so the stage's lag does not leave early
        words without a speaker; `force` (flush, end of stream) assigns whatever is known."""
        if self._diarizer is None:
            self._pending.extend(self._unassigned)
            self._unassigned = []
        elif self._unassigned:
            try:
                await self._feed_stage(self._diarizer, self.audio.total)
            except Exception:
                log.exception("voice session %s: the diarization stage failed", self.id)
            heard = self._fed / STT_SAMPLE_RATE
            ready = 0
            timeline = self._timeline
            early: SpeakerTimeline | None = None  # built once, when a word first needs it
            for w in self._unassigned:
                placed = _overlapped(self._timeline, w)
                if not placed and not force and heard < w.end + self.channel.speaker_wait:
                    early = early or self._with_provisional()
                    if early is None or not self._continues_voice(early, w, ready):
                        break
                    timeline = early
                ready += 1
            if ready < len(self._unassigned) and not force:
                # a word with no duration takes the speaker of the word after it (V5): it waits
                # with that word
                while ready and _no_duration(self._unassigned[ready - 1]):
                    ready -= 1
            if ready:
                assigned = assign_speakers(self._unassigned[:ready], timeline)
                self._unassigned = self._unassigned[ready:]
                if self._provisional:  # final words over early turns confirm or correct them
                    assigned = list(await self._settle_provisional(tuple(assigned)))
                if assigned:
                    self._reopen_if_voice_went_on(assigned[0])
                self._pending.extend(assigned)
            if self._unassigned and not force:
                await self._close_on_voice_change()
        if self._diarizer is not None and self._handovers and not self._unassigned and not force:
            await self._close_at_handover()
        done = not self._unassigned and (self._end_of_speech or force)
        await self._emit_pending(force=done)
        if done:
            self._end_of_speech = False

    async def _close_on_voice_change(self) -> None:
        """Pipeline speakers (latency): the run waiting for its end is committed as soon as the
        stage's provisional view hears another voice on the next word, instead of when the
        stage has decided that word (0.9-1.4 s of audio after it). The run's own words already
        have their speakers; only where it ends is provisional: if the decision then gives the
        next word the run's voice after all, the turn is reopened (`_reopen_if_voice_went_on`)."""
        if not (self.channel.provisional_changes and self._pending and self._unassigned):
            return
        both = self._with_provisional()
        word = self._unassigned[0]
        if both is None or _no_duration(word) or not _overlapped(both, word):
            return
        voice = both.speaker_over(word.start, word.end)
        if voice is None or voice == self._pending[-1].speaker:
            return
        before = len(self.turns)
        await self._emit_pending(force=True)
        if len(self.turns) > before:
            self._closed_early = self.turns[-1]

    def _reopen_if_voice_went_on(self, first: Word) -> None:
        """The stage decided the word after a turn closed early (`_close_on_voice_change`): if
        it is the turn's voice and nothing was committed since, the turn goes on; its words go
        back to the head of the waiting run, and committing that run updates the turn in place
        (`corrected`) instead of posting a second turn of the same voice."""
        closed, self._closed_early = self._closed_early, None
        if closed is None or self._pending or not self.turns or self.turns[-1] is not closed:
            return
        if first.speaker != closed.transcription.speaker:
            return  # the change was real
        self._pending = list(closed.transcription.words)
        self._reopened = closed

    def _with_provisional(self) -> SpeakerTimeline | None:
        """The decided timeline plus the stage's provisional speakers of the frames it has not
        decided yet, or None (`VoiceChannel(provisional_speakers=False)`, or nothing provisional)."""
        if not self.channel.provisional_speakers or not self._undecided.segments:
            return None
        return SpeakerTimeline(self._timeline.segments + self._undecided.segments)

    def _continues_voice(self, both: SpeakerTimeline, word: Word, ready: int) -> bool:
        """Whether a word the stage has not decided yet may go on at once with its provisional
        speaker (`both`: decided + provisional): when that is the voice of the word before it
        (the common case: a turn's last words, which would otherwise wait about a second for the
        stage's decision). A voice change, or nothing heard over the word yet, waits."""
        if not _overlapped(both, word) or _no_duration(word):
            return False
        if ready:
            before = self._unassigned[ready - 1]
            previous = both.speaker_over(before.start, before.end)
        elif self._pending:
            previous = self._pending[-1].speaker
        else:
            previous = None if self.last_speaker is _NOBODY else self.last_speaker  # type: ignore[assignment]
        return previous is not None and both.speaker_over(word.start, word.end) == previous

    async def _emit_pending(self, *, force: bool) -> None:
        runs = speaker_runs(self._pending)
        if not runs:
            return
        done = runs if force else runs[:-1]
        self._pending = [] if force else list(runs[-1].words)
        for run in done:
            try:
                if self._reopened is not None:
                    await self._extend_reopened(run)
                    continue
                await self._commit(run)
            except Exception:
                # Fail closed: a hook that raises may have been the one that blocks this turn.
                log.exception("voice session %s: a turn was dropped because committing it failed",
                              self.id)

    async def _extend_reopened(self, run: SpeakerTurn) -> None:
        """Commit the run that a reopened turn began: the turn is updated in place with it."""
        turn, self._reopened = self._reopened, None
        assert turn is not None
        before = turn.transcription
        words = run.words
        text = join_words(w.text for w in words)
        if before.text != join_words(w.text for w in before.words):
            # a hook edited the turn's text: keep the edit, add the words that followed
            text = join_words([before.text, *(w.text for w in words[len(before.words):])])
        log.info("voice session %s: the voice went on after an early end: %r -> %r",
                 self.id, before.text, text)
        # its end moved: the turn as finally shown arrived now (latency counts from here)
        if await self._update_turn(turn, text, words, settled_now=True):
            self.corrections += 1

    async def _commit(self, run: SpeakerTurn) -> None:
        kit = self.channel.require_kit()
        label = run.speaker
        text = join_words(w.text for w in run.words)
        if not text:
            return
        sender = self.names.get(label, label) if label is not None else None
        participant = self.matches.get(label, self.participant_id) if label else self.participant_id
        proposed = TranscriptionEvent(text, label, sender, run.start, run.end, run.words, participant, self)
        ctx = HookContext(self.room_id, self.channel.channel_id, kit, participant_id=self.participant_id,
                          extra={"voice_session_id": self.id})
        result = await kit.run_hooks(HookTrigger.ON_TRANSCRIPTION, proposed, ctx)
        if result.blocked:
            self.blocked.append(proposed)
            log.info("voice session %s: turn blocked by a hook (%s)", self.id, result.reason)
            return
        final = result.value if isinstance(result.value, TranscriptionEvent) else proposed
        if label is not None and self.channel.sticky_renames:
            if final.sender_name and final.sender_name != proposed.sender_name:
                self.names[label] = final.sender_name
            if final.participant_id and final.participant_id != proposed.participant_id:
                self.matches[label] = final.participant_id
        metadata = VoiceTurn(label, final.start, final.end, self.id).metadata()
        # A hook that matched the voice to a participant without naming it lets the room's
        # participant record name the turn (attribution B2); otherwise the name is stamped (B1).
        name = final.sender_name
        matched_only = final.participant_id != self.participant_id and name == label
        if name and not matched_only:
            metadata["sender_name"] = name
        event = await kit.post_event(self.room_id, self.channel.channel_id,
                                     TextContent(body=final.text),
                                     participant_id=final.participant_id, metadata=metadata)
        if event is None:  # a BEFORE_BROADCAST hook blocked it
            self.blocked.append(final)
            return
        self.turns.append(CommittedTurn(event, final, asyncio.get_running_loop().time()))
        if self.last_speaker is _NOBODY or self.last_speaker != label:
            change = SpeakerChangeEvent(
                speaker=label, sender_name=final.sender_name,
                previous_speaker=None if self.last_speaker is _NOBODY else self.last_speaker,  # type: ignore[arg-type]
                is_new_speaker=label not in self.heard, start=final.start,
                participant_id=final.participant_id, session=self,
            )
            kit.emit(HookTrigger.ON_SPEAKER_CHANGE, change, ctx)
        self.heard.add(label)
        self.last_speaker = label

    # -- pipeline speakers (V5) --------------------------------------------------------------

    async def _diarize_loop(self) -> None:
        stage = self._diarizer
        assert stage is not None
        step = int(self.channel.diarize_step * STT_SAMPLE_RATE)
        while True:
            await self._diar_wake.wait()
            self._diar_wake.clear()
            while self.audio.total - self._fed >= step:
                await self._feed_stage(stage, self.audio.total)
                if self._unassigned or (self._pending and self._handovers):
                    # words waiting for the stage to place them, or a run it may have ended
                    async with self._lock:
                        await self._advance(force=False)

    async def _flush_stage(self, stage: DiarizationStage) -> None:
        """End of stream: the stage hears the rest, and a stage that decides with a delay (a
        `flush()` method, like the embedded live stage) decides what it still holds back."""
        try:
            await self._feed_stage(stage, self.audio.total)
            flush = getattr(stage, "flush", None)
            if callable(flush):
                async with self._feed_lock:
                    self._timeline = await asyncio.to_thread(flush)
        except Exception:
            log.exception("voice session %s: the diarization stage failed", self.id)

    async def _feed_stage(self, stage: DiarizationStage, upto: int) -> None:
        async with self._feed_lock:
            if upto <= self._fed:
                return
            chunk = self.audio.samples(self._fed, upto)
            self._fed = upto
            if len(chunk) == 0:
                return
            if stage.sample_rate != STT_SAMPLE_RATE:
                chunk = resample(chunk, STT_SAMPLE_RATE, stage.sample_rate)
            # words still to place: the first waiting word, or those the STT has yet to make
            # final (after its last final word); the margin covers a reconnect's replay
            first = self._unassigned[0].start if self._unassigned else self.stt.final_until
            since = min(first, self.stt.final_until) - _TIMELINE_KEPT
            self._timeline, self._undecided = await asyncio.to_thread(_feed, stage, chunk, since)
            self._tell_voice_changes()

    def _tell_voice_changes(self) -> None:
        """Tell the STT stream where the stage has *decided* that one voice ended and another
        goes on (they overlap, or the pause between them is too short for the VAD to end the
        utterance), once per change: a local engine (Whisper) ends its utterance there, so the
        turn before the change is decoded then instead of at the next pause or the utterance
        cap (latency). Only decided segments count (the provisional view flickers: cutting at
        it split sentences of one voice, docs/benchmarks.md "Turn latency, third pass"), only
        voices heard `_CHANGE_MIN_VOICE` each, and only where the first voice's segment ended
        before the second's (a short voice inside a longer one is no handover)."""
        told = self._change_told
        heard = sorted((s for s in self._timeline.segments
                        if s.end > told and s.duration >= _CHANGE_MIN_VOICE),
                       key=lambda s: (s.start, s.end))
        for before, after in itertools.pairwise(heard):
            if after.speaker == before.speaker or after.start - before.end > _CHANGE_MAX_GAP:
                continue
            if after.end <= before.end:
                continue  # the second voice ended first: the first one goes on
            at = max(before.end, (before.end + after.start) / 2)
            if at > told:
                self.stt.voice_change(at)
                self._handovers.append((at, before.speaker))
                told = at
        self._change_told = told

    async def _close_at_handover(self) -> None:
        """The waiting run is over when the stage decided its voice handed over to another
        right after its last word: a piece of an utterance cut at that handover is not the end
        of speech (the next voice goes on), and the run must not wait for the next piece's
        words (seconds, when the next voice talks on) to learn that its voice changed."""
        if not self._pending:
            return
        last = self._pending[-1]
        # a handover the waiting run already outlasts closes neither it nor a later run (runs
        # end later and later): forget it, so a stream does not re-check it every step
        while self._handovers and self._handovers[0][0] + _CHANGE_MAX_GAP < last.end:
            self._handovers.popleft()
        if any(voice == last.speaker and last.end >= at - _HANDOVER_REACH
               for at, voice in self._handovers):
            await self._emit_pending(force=True)


def _feed(stage: DiarizationStage, chunk: FloatAudio,
          since: float) -> tuple[SpeakerTimeline, SpeakerTimeline]:
    """Feed the stage (in a worker thread) and read its provisional speakers with it. A stage
    that can say which of its segments end after a time (`recent(since)`, like the embedded
    live stage) hands over only those: a long stream's whole timeline grows with it, and every
    waiting word searched it (milliseconds per word after a few hours)."""
    timeline = stage.feed(chunk)
    recent = getattr(stage, "recent", None)
    if callable(recent):
        timeline = recent(since)
    provisional = getattr(stage, "provisional", None)
    return timeline, (provisional() if callable(provisional) else SpeakerTimeline())


_NOBODY = object()
_CHANGE_MIN_VOICE = 0.3
"""Seconds: a decided voice change is told to the STT only when the stage heard each voice at
least this long."""
_CHANGE_MAX_GAP = 0.3
"""Seconds between one voice's end and the next one's start that make a change inside one
utterance (a longer pause ends the utterance anyway)."""
_HANDOVER_REACH = 1.5
"""Seconds before a decided handover within which a run's last word must end for the handover
to close it (its voice's last words; an older run is some other turn's)."""
_TIMELINE_KEPT = 10.0
"""Seconds of the stage's decided timeline kept before the earliest word still to be placed."""
_SAME_TIME = 0.05
"""Seconds within which an interim word and a final word are the same word."""


@dataclass
class _Provisional:
    """A turn committed from interim words (early commit), until a final confirms it."""

    turn: SpeakerTurn
    committed: CommittedTurn | None
    final_lead: int = 0
    """How many of the turn's first words were final already (the pending run it continued)."""
    confirmed: list[Word] = field(default_factory=list)
    """The final words over its interim words' span so far."""

    @property
    def interim_words(self) -> tuple[Word, ...]:
        return self.turn.words[self.final_lead :]

    @property
    def start(self) -> float:
        return self.interim_words[0].start

    @property
    def end(self) -> float:
        return self.turn.end
STATUS_KEPT = 64
"""Status events a session keeps (an endless flapping connection cannot grow memory)."""
KEPT_PER_SESSION = 100
"""Skipped-frame reasons and blocked turns a session keeps (the newest)."""

StatusCallback = Callable[["VoiceSession", SttStatus], Awaitable[None]]


def _no_duration(word: Word) -> bool:
    return word.end - word.start < MIN_WORD_EVIDENCE


def _overlapped(timeline: SpeakerTimeline, word: Word) -> bool:
    """Whether the stage has decided a segment that overlaps the word (not merely one nearby)."""
    if word.end <= word.start:
        return timeline.speaker_over(word.start, word.end) is not None
    return any(min(word.end, s.end) > max(word.start, s.start) for s in timeline.segments)


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
        speaker_wait: float = 2.0,
        on_play: Callable[[str, bytes, int], Awaitable[None]] | None = None,
        on_status: StatusCallback | None = None,
        early_commit: bool = True,
        provisional_speakers: bool = True,
        provisional_changes: bool = True,
    ) -> None:
        super().__init__(channel_id)
        if pipeline_speakers and diarizer is None:
            raise ValueError(
                "pipeline_speakers=True needs a diarization stage: pass diarizer= "
                "(e.g. diarization.load_stage('embedded')) or set pipeline_speakers=False (rule V5)"
            )
        if diarizer is not None and not isinstance(diarizer, DiarizationStage):
            raise TypeError(f"diarizer must implement voice.diarization_stage.DiarizationStage, "
                            f"got {type(diarizer).__name__}")
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
        self.speaker_wait = speaker_wait
        self.on_play = on_play
        self.on_status = on_status
        """Hears every session's stream status (degraded, recovered, audio lost, ended): the
        server tells the device and counts it. A failure in it is logged, never raised."""
        self.early_commit = early_commit
        """Commit a turn as soon as an interim result shows the next voice (streaming STT)."""
        self.provisional_speakers = provisional_speakers
        """Pipeline speakers: a word the stage has not decided yet takes the stage's provisional
        speaker at once when that continues the voice before it (latency)."""
        self.provisional_changes = provisional_changes
        """Pipeline speakers: a turn is committed as soon as the stage's provisional view hears
        another voice on the next word (reopened in place if the decision says the voice went
        on), instead of when the stage has decided that word (latency)."""
        self._sessions: dict[str, VoiceSession] = {}
        self._playing_until: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.played: list[tuple[str, int, int]] = []
        """(room id, bytes, sample rate) of every `play` call."""

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
        session_id: str | None = None,
    ) -> VoiceSession:
        """Open a stream in a room (the channel must be attached to it). Bad declared formats
        raise an `AudioError` naming the problem (rule V10)."""
        kit = self.require_kit()
        if await kit.get_room(room_id) is None:
            raise KeyError(f"no room {room_id!r}")
        fmt = StreamFormat(sample_rate=sample_rate, encoding=encoding, channels=channels)
        session = VoiceSession(self, room_id, participant_id, fmt, session_id)
        if self._diarizer_in_use():
            raise RuntimeError("this VoiceChannel's diarization stage already serves a session; "
                               "use one VoiceChannel per pipeline-diarized stream")
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
        return self.pipeline_speakers and any(not s.finished for s in self._sessions.values())

    # -- AudioSink (V9) ----------------------------------------------------------------------

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        """Play the agent's audio into the room; the room's sessions are gated while it plays."""
        duration = len(pcm16) // 2 / sample_rate
        loop = asyncio.get_running_loop()
        start = max(loop.time(), self._playing_until.get(room_id, 0.0) - self.echo_tail)
        self._playing_until[room_id] = start + duration + self.echo_tail
        self.played.append((room_id, len(pcm16), sample_rate))
        if self.on_play is not None:
            await self.on_play(room_id, pcm16, sample_rate)

    async def on_detach(self, room_id: str) -> None:
        """The room is gone: forget its playback window (V9)."""
        self._playing_until.pop(room_id, None)

    def is_playing(self, room_id: str) -> bool:
        until = self._playing_until.get(room_id)
        return until is not None and asyncio.get_running_loop().time() < until

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
    "CommittedTurn",
    "SpeakerChangeEvent",
    "StatusCallback",
    "TranscriptionEvent",
    "VoiceChannel",
    "VoiceSession",
    "pcm16_frames",
]
