"""The embedded diarization stage (rule P1): offline on one CPU core, with enrollment (V8) and
clustering of unknown voices (V7).

- `diarize(audio)` (batch, whole files): the pipeline in `diarization.batch` (pyannote's
  segmentation-3.0 and 3D-Speaker's CAM++ on onnxruntime: sliding 10 s windows, one embedding per
  window and local speaker, centroid-linkage clustering, frame-level reconstruction with overlap).
- `feed(audio)` (live): frames of any size; Silero VAD, and every `LiveSettings.hop` seconds of
  new speech the last `window` seconds of speech are embedded (GE2E) and matched against the
  speaker centroids (enrolled voices first); two agreeing windows that match nobody open a new
  speaker. Decisions are never revised, so a word's speaker does not change after it was handed
  out: a window never reaches back over a pause (`cut_pause`), the tail of an utterance is
  embedded on its own, and the frames of a window that matches nobody stay undecided until the
  next window confirms a new voice (or matches a known one). (The live path moves to the batch
  pipeline's models in the live-diarization work of issue 9.)

Speaker names: an enrolled name when a cluster's centroid is close enough to that voiceprint
(each name used once per recording), otherwise `Speaker A`, `Speaker B` … in order of first
appearance. Voiceprints are embeddings only; no audio is kept after `enroll` returns.
Model work is synchronous and CPU-bound: every model runs with one thread.
"""

from __future__ import annotations

import string
import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from diarization import batch, recipe
from diarization.batch import BatchSettings
from diarization.models import (
    EmbeddingModel,
    SegmentationModel,
    default_embedding_model,
    default_segmentation_model,
)
from diarization.recipe import FloatArray, Settings
from voice.diarization_stage import Audio, SpeakerSegment, SpeakerTimeline
from voice.embedding import HOP as MEL_HOP
from voice.embedding import SpeakerEmbedder, default_embedder, mel_spectrogram
from voice.vad import FRAME, FRAME_SECONDS, SpeechDetector, VadStream

SAMPLE_RATE = 16000
EMBED_BATCH = 128  # windows per GE2E forward pass (bounds memory on long recordings)


def speaker_letter(index: int) -> str:
    """0 → `Speaker A`, 25 → `Speaker Z`, 26 → `Speaker AA` …"""
    letters = string.ascii_uppercase
    name = ""
    index += 1
    while index > 0:
        index, rem = divmod(index - 1, 26)
        name = letters[rem] + name
    return f"Speaker {name}"


@dataclass(frozen=True)
class LiveSettings:
    """Numbers of the live path. The new-speaker threshold and the centroid momentum were chosen
    by leave-one-file-out cross-validation; the speaker-change rules were built on the demo
    meeting and measured on the AMI excerpts too (docs/benchmarks.md)."""

    window: float = 1.5  # seconds of speech per embedding
    min_window: float = 1.0  # first decision once this much speech was heard; only a window
    # this long founds a new voice
    hop: float = 0.5  # seconds of new speech between decisions
    min_flush: float = 0.3  # an utterance's undecided tail is embedded if its stretch is this long
    new_speaker_threshold: float = 0.76  # best centroid similarity under this opens a speaker
    centroid_momentum: float = 0.8  # running centroid update for discovered speakers
    confirm_new: bool = True  # a new speaker needs two agreeing unmatched windows
    # speaker changes:
    cut_pause: float = 0.25  # a pause this long (s) starts a new stretch: windows never span it
    flush_embed: bool = True  # end of speech: embed the undecided tail (False: last speaker)
    open_below: float = 0.6  # a window this unlike every known voice opens one at once
    hold_new: bool = True  # an unmatched window's frames wait for the window that confirms it
    max_hold: float = 3.0  # … but never longer than this (then: the nearest known voice)
    running_mean: bool = True  # a centroid is the mean of its first 1/(1-momentum) windows


@dataclass
class _Voice:
    name: str
    centroid: FloatArray
    enrolled: bool
    count: int = 1


@dataclass
class _LiveState:
    vad: VadStream
    frames: int = 0  # VAD frames scored
    in_speech: bool = False
    speech_audio: deque[FloatArray] = field(default_factory=deque)  # last window of speech frames
    speech_frame_ids: deque[int] = field(default_factory=deque)
    undecided: list[int] = field(default_factory=list)  # speech frames awaiting a speaker
    new_speech: int = 0  # speech frames since the last decision
    gap: int = 0  # non-speech frames since the last speech frame
    voices: list[_Voice] = field(default_factory=list)
    unknown_count: int = 0
    segments: list[SpeakerSegment] = field(default_factory=list)
    open_run: tuple[int, int, str] | None = None  # (first frame, last frame, speaker)
    pending: FloatArray | None = None  # an unmatched window waiting for a second one


class EmbeddedStage:
    """The embedded stage. Implements `voice.diarization_stage.DiarizationStage` (P3)."""

    sample_rate = SAMPLE_RATE

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        live: LiveSettings | None = None,
        num_speakers: int | None = None,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        embedder: SpeakerEmbedder | None = None,
        enroll_threshold: float = 0.8,
        batch_settings: BatchSettings | None = None,
        segmentation: SegmentationModel | None = None,
        embedding: EmbeddingModel | None = None,
        batch_enroll_threshold: float = 0.5,
    ) -> None:
        self.settings = settings or Settings()
        self.live = live or LiveSettings()
        self.batch = batch_settings or BatchSettings()
        self.num_speakers = num_speakers
        self.min_speakers = min_speakers
        self.max_speakers = max_speakers
        self.enroll_threshold = enroll_threshold
        self.batch_enroll_threshold = batch_enroll_threshold
        self.embedder = embedder or default_embedder()
        self.segmentation = segmentation or default_segmentation_model()
        self.embedding = embedding or default_embedding_model()
        self._campplus_prints: dict[str, FloatArray] = {}
        self.detector = SpeechDetector(
            threshold=self.settings.vad_threshold,
            normalize=self.settings.normalize,
            min_speech=self.settings.min_speech,
            max_gap=self.settings.max_gap,
        )
        self._voiceprints: dict[str, FloatArray] = {}
        self._lock = threading.Lock()
        self._live = self._new_live()

    # -- enrollment (V8) ---------------------------------------------------------------------

    @property
    def enrolled(self) -> dict[str, FloatArray]:
        """Enrolled voiceprints (256-d embeddings; never audio)."""
        return dict(self._voiceprints)

    def enroll(self, name: str, audio: Audio) -> None:
        name = name.strip()
        if not name:
            raise ValueError("an enrolled voice needs a name")
        voiceprint = self.voiceprint(audio)
        campplus = self.embedding.voiceprint(self._speech_of(audio))
        with self._lock:
            self._voiceprints[name] = voiceprint
            self._campplus_prints[name] = campplus
            for voice in self._live.voices:
                if voice.enrolled and voice.name == name:
                    voice.centroid = voiceprint
                    break
            else:
                self._live.voices.insert(0, _Voice(name, voiceprint, enrolled=True))

    def forget(self, name: str) -> None:
        with self._lock:
            if name not in self._voiceprints:
                raise KeyError(f"no enrolled voice named {name!r}")
            del self._voiceprints[name]
            self._campplus_prints.pop(name, None)
            self._live.voices = [
                v for v in self._live.voices if not (v.enrolled and v.name == name)
            ]

    def voiceprint(self, audio: Audio) -> FloatArray:
        """The live voiceprint of a clip: the mean GE2E embedding of its speech (1.6 s partials)."""
        return self.embedder.embed(self._speech_of(audio))

    def _speech_of(self, audio: Audio) -> FloatArray:
        """The speech of an enrollment clip (VAD), joined; at least 1 s of it."""
        wav = _checked(audio)
        if len(wav) < SAMPLE_RATE // 2:
            raise ValueError("enrollment audio is shorter than 0.5 s; give a few seconds of speech")
        mask = recipe.speech_mask(self.detector.probabilities(wav), self.settings)
        samples = np.repeat(mask, FRAME)[: len(wav)]
        speech = wav[: len(samples)][samples]
        if len(speech) < SAMPLE_RATE:
            raise ValueError(
                f"enrollment audio holds {len(speech) / SAMPLE_RATE:.1f} s of speech; at least 1 s is needed"
            )
        return speech

    # -- batch -------------------------------------------------------------------------------

    def diarize(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
        min_speakers: int | None = None,
    ) -> SpeakerTimeline:
        """The whole recording (batch pipeline, `diarization.batch`): overlapped speech gets two
        speakers. `num_speakers` fixes the count; `min_speakers`/`max_speakers` bound it."""
        wav = _checked(audio)
        num = num_speakers if num_speakers is not None else self.num_speakers
        low = min_speakers if min_speakers is not None else self.min_speakers
        cap = max_speakers if max_speakers is not None else self.max_speakers
        for label, value in (("num_speakers", num), ("min_speakers", low), ("max_speakers", cap)):
            if value is not None and value < 1:
                raise ValueError(f"{label} must be at least 1")
        if low is not None and cap is not None and low > cap:
            raise ValueError(f"min_speakers ({low}) is more than max_speakers ({cap})")
        analysis = batch.analyse(wav, self.segmentation, self.embedding, self.batch)
        clustering = batch.cluster_analysis(
            analysis, self.batch, num_speakers=num, min_speakers=low, max_speakers=cap
        )
        ids = [str(k) for k in range(len(clustering.centroids))]
        segments = sorted(batch.reconstruct(analysis, clustering, ids), key=lambda g: g.start)
        order = [int(k) for k in dict.fromkeys(g.speaker for g in segments)]
        names = self._names_for(clustering.centroids, order)
        return SpeakerTimeline(
            [SpeakerSegment(g.start, g.end, names[int(g.speaker)]) for g in segments]
        )

    def _names_for(self, cents: FloatArray, order: list[int]) -> list[str]:
        """Enrolled names for clusters whose centroid is close enough to a voiceprint (closest
        pairs first, each name once per recording, so a voice that was not enrolled never takes
        an enrolled name just because it is the nearest); `Speaker A`, `B` … for the others in
        order of first appearance (V7)."""
        names: list[str | None] = [None] * len(cents)
        with self._lock:
            prints = list(self._campplus_prints.items())
        if prints and len(cents):
            sims = cents @ np.stack([p for _, p in prints]).T
            pairs = sorted(
                ((float(sims[i, j]), i, j) for i in range(len(cents)) for j in range(len(prints))),
                reverse=True,
            )
            used_clusters: set[int] = set()
            used_prints: set[int] = set()
            for sim, i, j in pairs:
                if sim < self.batch_enroll_threshold:
                    break
                if i in used_clusters or j in used_prints:
                    continue
                names[i] = prints[j][0]
                used_clusters.add(i)
                used_prints.add(j)
        order = order + [k for k in range(len(cents)) if k not in order]
        letter = 0
        for k in order:
            if names[k] is None:
                names[k] = speaker_letter(letter)
                letter += 1
        return [n if n is not None else "" for n in names]

    # -- live --------------------------------------------------------------------------------

    def _new_live(self) -> _LiveState:
        state = _LiveState(vad=VadStream(self.detector))
        state.voices = [_Voice(n, p, enrolled=True) for n, p in self._voiceprints.items()]
        return state

    def reset(self) -> None:
        with self._lock:
            self._live = self._new_live()

    def feed(self, audio: Audio) -> SpeakerTimeline:
        samples = _checked(audio, allow_empty=True)
        with self._lock:
            state = self._live
            probs, frames = state.vad.accept_frames(samples)
            for p, frame_audio in zip(probs, frames, strict=True):
                self._live_frame(state, float(p), frame_audio)
            return self._live_timeline(state)

    @property
    def live_speakers(self) -> list[str]:
        """Speakers known to the live stream (enrolled first, then `Speaker A` …)."""
        return [v.name for v in self._live.voices]

    def _live_frame(self, state: _LiveState, prob: float, frame_audio: FloatArray) -> None:
        index = state.frames
        state.frames += 1
        threshold = self.settings.vad_threshold
        was_speech = state.in_speech
        if state.in_speech:
            state.in_speech = prob >= max(threshold - 0.15, threshold * 0.5)
        else:
            state.in_speech = prob >= threshold
        if not state.in_speech:
            state.gap += 1
            if was_speech and state.undecided:
                self._live_end_of_speech(state)
            elif (
                state.pending is not None
                and state.undecided
                and state.voices
                and (state.frames - state.undecided[0]) * FRAME_SECONDS >= self.live.max_hold
            ):
                # held frames of an unconfirmed voice wait at most max_hold, speech or not
                pending = state.pending
                self._live_assign(
                    state, max(state.voices, key=lambda v: float(v.centroid @ pending)).name
                )
            return
        cut = self.live.cut_pause
        if cut > 0 and state.gap * FRAME_SECONDS + 1e-9 >= cut and state.speech_audio:
            # after a pause the speaker may have changed: windows never reach back over it
            state.speech_audio.clear()
            state.speech_frame_ids.clear()
        state.gap = 0
        per_window = round(self.live.window / FRAME_SECONDS)
        state.speech_audio.append(frame_audio.astype(np.float32))
        state.speech_frame_ids.append(index)
        while len(state.speech_audio) > per_window:
            state.speech_audio.popleft()
            state.speech_frame_ids.popleft()
        state.undecided.append(index)
        state.new_speech += 1
        heard = len(state.speech_audio) * FRAME_SECONDS
        if heard + 1e-9 < self.live.min_window:
            return
        if state.new_speech * FRAME_SECONDS + 1e-9 < self.live.hop:
            return
        self._live_decide(state)

    def _live_end_of_speech(self, state: _LiveState) -> None:
        """End of a stretch of speech: its undecided frames (less than a hop, or a short
        utterance) are decided now, so an utterance's last words do not wait for the next one;
        frames held back by an unconfirmed new voice wait for the next window."""
        if state.pending is not None and state.new_speech == 0:
            return
        heard = len(state.speech_audio) * FRAME_SECONDS + 1e-9
        if state.open_run is not None and not (
            self.live.flush_embed and heard >= self.live.min_flush
        ):
            self._live_assign(state, state.open_run[2])
        elif heard >= self.live.min_flush:
            self._live_decide(state)

    def _live_decide(self, state: _LiveState) -> None:
        audio = np.concatenate(list(state.speech_audio))
        mel = mel_spectrogram(audio)
        n = min(len(mel), round(self.live.window * SAMPLE_RATE / MEL_HOP))
        embedding = self.embedder.embed_mels(mel[None, :n])[0]
        speaker = self._live_match(state, embedding)
        if speaker is None:  # an unconfirmed new voice: its frames wait for the next window
            state.new_speech = 0
            return
        self._live_assign(state, speaker)

    def _live_assign(self, state: _LiveState, speaker: str) -> None:
        for frame in state.undecided:
            self._live_extend(state, frame, speaker)
        state.undecided = []
        state.new_speech = 0

    def _live_match(self, state: _LiveState, embedding: FloatArray) -> str | None:
        """The speaker of a window, or None while a voice that matches nobody waits for a
        second window to confirm it (`LiveSettings.hold_new`)."""
        cap = self.max_speakers or self.settings.max_speakers
        if self.num_speakers is not None:
            cap = self.num_speakers
        best: _Voice | None = None
        best_sim = -1.0
        for voice in state.voices:
            sim = float(voice.centroid @ embedding)
            threshold = self.enroll_threshold if voice.enrolled else self.live.new_speaker_threshold
            if sim >= threshold and sim > best_sim:
                best, best_sim = voice, sim
        discovered = [v for v in state.voices if not v.enrolled]
        if best is None and len(discovered) >= cap and discovered:
            best = max(discovered, key=lambda v: float(v.centroid @ embedding))
        if best is None and self.live.confirm_new and state.voices:
            # a voice that matches nobody opens a speaker only when the next unmatched window
            # agrees with it; meanwhile the window's frames wait (hold_new) or go to the nearest
            # known voice
            pending = state.pending
            # only a full window (min_window of speech) founds a voice: a short stretch's
            # embedding is too noisy to be a speaker's first centroid, so it may only wait
            full = len(state.speech_audio) * FRAME_SECONDS + 1e-9 >= self.live.min_window
            if (
                full
                and pending is not None
                and float(pending @ embedding) >= self.live.new_speaker_threshold
            ):
                state.pending = None
                return self._open_voice(state, recipe.l2(pending + embedding)).name
            nearest = max(float(v.centroid @ embedding) for v in state.voices)
            if full and nearest < self.live.open_below:  # clearly nobody known: open at once
                state.pending = None
                return self._open_voice(state, embedding.copy()).name
            if full or pending is None:
                state.pending = embedding.copy()
            waited = (state.frames - state.undecided[0]) * FRAME_SECONDS if state.undecided else 0.0
            if self.live.hold_new and waited < self.live.max_hold:
                return None
            return max(state.voices, key=lambda v: float(v.centroid @ embedding)).name
        if best is None:
            return self._open_voice(state, embedding.copy()).name
        state.pending = None
        if not best.enrolled:
            m = self.live.centroid_momentum
            if self.live.running_mean:
                m = min(m, best.count / (best.count + 1))
            best.centroid = recipe.l2(m * best.centroid + (1 - m) * embedding)
            best.count += 1
        return best.name

    @staticmethod
    def _open_voice(state: _LiveState, centroid: FloatArray) -> _Voice:
        voice = _Voice(speaker_letter(state.unknown_count), centroid, enrolled=False)
        state.unknown_count += 1
        state.voices.append(voice)
        return voice

    def _live_extend(self, state: _LiveState, frame: int, speaker: str) -> None:
        run = state.open_run
        bridge = 1 + round(self.settings.max_gap / FRAME_SECONDS)
        if run is not None and run[2] == speaker and frame - run[1] <= bridge:
            state.open_run = (run[0], frame, speaker)
            return
        if run is not None:
            state.segments.append(_segment(run))
        state.open_run = (frame, frame, speaker)

    @staticmethod
    def _live_timeline(state: _LiveState) -> SpeakerTimeline:
        segments = list(state.segments)
        if state.open_run is not None:
            segments.append(_segment(state.open_run))
        return SpeakerTimeline(segments)


def _segment(run: tuple[int, int, str]) -> SpeakerSegment:
    return SpeakerSegment(
        round(run[0] * FRAME_SECONDS, 3), round((run[1] + 1) * FRAME_SECONDS, 3), run[2]
    )


def _checked(audio: Audio, *, allow_empty: bool = False) -> FloatArray:
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D float32 at 16 kHz), got shape {wav.shape}")
    if not allow_empty and len(wav) == 0:
        raise ValueError("empty audio")
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio holds NaN or infinite samples")
    return wav
