"""Voice activity detection: Silero VAD, whose weights ship in the `silero-vad` package (rule P1).

Shape and why:
- We run Silero's *sequence* ONNX export (`silero_vad_16k_sequence.onnx`, shipped in the package)
  through onnxruntime ourselves: one ONNX call scores up to 512 frames of 32 ms, bit-exact with the
  streaming model, about 0.13 s per 30 s of audio on one core, against about 0.6 s for the per-frame
  TorchScript loop. The same model serves streaming: LSTM state and the 64-sample context are
  carried between calls, so a stream can be fed frames of any size.
- We do not `import silero_vad`: that import runs `torch.set_num_threads(1)` for the whole process
  (and imports torch). The model file is found through the package's location instead; no
  network, no hub.
- Far-field meeting audio (AMI, about −41 dBFS) is quiet: at Silero's default threshold 0.5 it
  misses a fifth of the speech. `SpeechDetector` defaults to threshold 0.2 with hysteresis
  (`threshold - 0.15` ends a segment), a minimum speech length and a bridged maximum gap, and can
  normalise the level first (the loud frames brought to `target_dbfs`, gain never below 1 nor
  above `max_gain_db`). The diarization stage passes its own cross-validated numbers (threshold
  0.1, no normalisation: on the AMI excerpts normalisation did not lower the missed speech; see
  docs/benchmarks.md).
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voice.onnx import onnx_session

SAMPLE_RATE = 16000
FRAME = 512  # samples per Silero frame at 16 kHz (32 ms)
CONTEXT = 64  # samples of the previous frame the model sees
FRAME_SECONDS = FRAME / SAMPLE_RATE
MAX_FRAMES_PER_CALL = 512

FloatArray = npt.NDArray[np.float32]


def default_model_path(name: str = "silero_vad_16k_sequence.onnx") -> Path:
    """A model file the `silero-vad` package ships: the sequence model by default (16 kHz), or
    `FRAME_MODEL` (one frame per call, 8 or 16 kHz)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("silero-vad is not installed (it ships the VAD weights)")
    path = Path(next(iter(spec.submodule_search_locations))) / "data" / name
    if not path.is_file():
        raise FileNotFoundError(f"Silero model not found at {path} (silero-vad >= 6.2 ships it)")
    return path


class SileroModel:
    """The Silero sequence ONNX model on one CPU thread. Thread-safe (one call at a time)."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_model_path()
        self.source = ("default: " if path is None else "path: ") + str(self.path)
        self.session = onnx_session(self.path)
        self._lock = threading.Lock()

    def run(
        self, frames: FloatArray, state: tuple[FloatArray, FloatArray]
    ) -> tuple[FloatArray, tuple[FloatArray, FloatArray]]:
        """Score frames shaped (n, CONTEXT + FRAME); returns probabilities (n,) and the new state."""
        with self._lock:
            probs, h, c = self.session.run(
                ["speech_probs", "hn", "cn"], {"input": frames, "h": state[0], "c": state[1]}
            )
        return np.asarray(probs, np.float32).reshape(-1), (h, c)


def _fresh_state() -> tuple[FloatArray, FloatArray]:
    return np.zeros((1, 1, 128), np.float32), np.zeros((1, 1, 128), np.float32)


_MODEL: SileroModel | None = None
_MODEL_LOCK = threading.Lock()


def default_model() -> SileroModel:
    """A process-wide Silero model (loaded once, about 50 ms)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            _MODEL = SileroModel()
        return _MODEL


def frame_levels_db(audio: FloatArray, frame: int = FRAME) -> FloatArray:
    """RMS level of each whole frame of `frame` samples (32 ms at 16 kHz) in dBFS."""
    n = len(audio) // frame
    if n == 0:
        return np.zeros(0, np.float32)
    frames = audio[: n * frame].reshape(n, frame).astype(np.float64)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    levels: FloatArray = (20 * np.log10(np.maximum(rms, 1e-8))).astype(np.float32)
    return levels


def level_gain(audio: FloatArray, target_dbfs: float = -26.0, max_gain_db: float = 30.0) -> float:
    """Gain that brings the loud frames (90th percentile of frame levels) to `target_dbfs`;
    never attenuates, never more than `max_gain_db`."""
    levels = frame_levels_db(audio)
    if len(levels) == 0:
        return 1.0
    loud = float(np.percentile(levels, 90))
    gain_db = min(max(target_dbfs - loud, 0.0), max_gain_db)
    return float(10 ** (gain_db / 20))


@dataclass(frozen=True)
class SpeechRegion:
    start: float
    end: float


class SpeechDetector:
    """Speech probabilities and speech regions for 16 kHz mono float32 audio (batch)."""

    sample_rate = SAMPLE_RATE
    frame_seconds = FRAME_SECONDS

    def __init__(
        self,
        *,
        threshold: float = 0.2,
        normalize: bool = True,
        target_dbfs: float = -26.0,
        max_gain_db: float = 30.0,
        min_speech: float = 0.1,
        max_gap: float = 0.15,
        model: SileroModel | None = None,
    ) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError("VAD threshold must be in (0, 1)")
        self.threshold = threshold
        self.normalize = normalize
        self.target_dbfs = target_dbfs
        self.max_gain_db = max_gain_db
        self.min_speech = min_speech
        self.max_gap = max_gap
        self.model = model or default_model()

    def prepare(self, audio: FloatArray) -> FloatArray:
        """Level-normalised copy of `audio` (what the model hears)."""
        wav = _checked(audio)
        if not self.normalize:
            return wav
        gain = level_gain(wav, self.target_dbfs, self.max_gain_db)
        return np.clip(wav * gain, -1.0, 1.0).astype(np.float32) if gain != 1.0 else wav

    def probabilities(self, audio: FloatArray) -> FloatArray:
        """Speech probability of each 32 ms frame (the last frame zero-padded)."""
        wav = self.prepare(audio)
        stream = VadStream(self, gain=1.0)
        probs = stream.accept(wav)
        tail = stream.flush()
        return np.concatenate([probs, tail]) if len(tail) else probs

    def regions(self, audio: FloatArray) -> list[SpeechRegion]:
        return self.regions_from(self.probabilities(audio))

    def regions_from(self, probs: FloatArray, threshold: float | None = None) -> list[SpeechRegion]:
        """Speech regions from frame probabilities: hysteresis (start above `threshold`, end below
        `threshold - 0.15`), gaps up to `max_gap` bridged, regions under `min_speech` dropped."""
        return speech_regions(
            probs,
            threshold=self.threshold if threshold is None else threshold,
            min_speech=self.min_speech,
            max_gap=self.max_gap,
        )


def speech_regions(
    probs: FloatArray,
    *,
    threshold: float,
    min_speech: float = 0.1,
    max_gap: float = 0.15,
    frame_seconds: float = FRAME_SECONDS,
) -> list[SpeechRegion]:
    low = max(threshold - 0.15, threshold * 0.5)
    regions: list[list[float]] = []
    active = False
    start = 0
    for i, p in enumerate(probs):
        if not active and p >= threshold:
            active, start = True, i
        elif active and p < low:
            active = False
            regions.append([start * frame_seconds, i * frame_seconds])
    if active:
        regions.append([start * frame_seconds, len(probs) * frame_seconds])
    merged: list[list[float]] = []
    for r in regions:
        if merged and r[0] - merged[-1][1] <= max_gap:
            merged[-1][1] = r[1]
        else:
            merged.append(r)
    return [SpeechRegion(a, b) for a, b in merged if b - a >= min_speech]


class VadStream:
    """Streaming Silero: feed samples of any size, get probabilities of each completed frame.

    Carries the LSTM state and context between calls. Level normalisation, when on, follows the
    stream: a fast-attack, slow-release tracker of the loud-frame level sets the gain applied to
    each frame before the model hears it (a fixed `gain` may be given instead).
    """

    def __init__(self, detector: SpeechDetector, *, gain: float | None = None) -> None:
        self.detector = detector
        self.model = detector.model
        self.fixed_gain = gain
        self._state = _fresh_state()
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._level_db: float | None = None
        self.frames_done = 0

    def reset(self) -> None:
        self._state = _fresh_state()
        self._context = np.zeros(CONTEXT, np.float32)
        self._pending = np.zeros(0, np.float32)
        self._level_db = None
        self.frames_done = 0

    def _gains(self, frames: FloatArray) -> FloatArray:
        if self.fixed_gain is not None:
            return np.full(len(frames), self.fixed_gain, np.float32)
        if not self.detector.normalize:
            return np.ones(len(frames), np.float32)
        out = np.empty(len(frames), np.float32)
        levels = 20 * np.log10(
            np.maximum(np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1)), 1e-8)
        )
        for i, db in enumerate(levels):
            if self._level_db is None:
                self._level_db = float(db)
            elif db > self._level_db:
                self._level_db = 0.5 * self._level_db + 0.5 * float(db)
            else:
                self._level_db -= 0.02  # about 0.6 dB per second of release
            g_db = min(
                max(self.detector.target_dbfs - self._level_db, 0.0), self.detector.max_gain_db
            )
            out[i] = 10 ** (g_db / 20)
        return out

    def accept(self, samples: FloatArray) -> FloatArray:
        """Append samples; return the probabilities of the frames completed by them."""
        return self.accept_frames(samples)[0]

    def accept_frames(self, samples: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Append samples; return the probabilities of the frames completed by them and those
        frames' samples as given (before level normalisation), shaped (n, FRAME)."""
        data = np.concatenate([self._pending, _checked(samples, allow_empty=True)])
        n = len(data) // FRAME
        self._pending = data[n * FRAME :].copy()
        frames = data[: n * FRAME].reshape(n, FRAME)
        if n == 0:
            return np.zeros(0, np.float32), frames
        return self._score(frames), frames

    def flush(self) -> FloatArray:
        """Score the trailing partial frame, zero-padded (end of stream)."""
        if len(self._pending) == 0:
            return np.zeros(0, np.float32)
        frame = np.zeros((1, FRAME), np.float32)
        frame[0, : len(self._pending)] = self._pending
        self._pending = np.zeros(0, np.float32)
        return self._score(frame)

    def _score(self, frames: FloatArray) -> FloatArray:
        frames = np.clip(frames * self._gains(frames)[:, None], -1.0, 1.0).astype(np.float32)
        out = []
        for i in range(0, len(frames), MAX_FRAMES_PER_CALL):
            block = frames[i : i + MAX_FRAMES_PER_CALL]
            contexts = np.empty((len(block), CONTEXT), np.float32)
            contexts[0] = self._context
            if len(block) > 1:
                contexts[1:] = block[:-1, -CONTEXT:]
            self._context = block[-1, -CONTEXT:].copy()
            probs, self._state = self.model.run(
                np.concatenate([contexts, block], axis=1), self._state
            )
            out.append(probs)
        self.frames_done += len(frames)
        return np.concatenate(out)


FRAME_MODEL = "silero_vad.onnx"
"""Silero's per-frame ONNX export: one 32 ms frame per call, at 8 or 16 kHz natively (its `sr`
input). The sequence model above is 16 kHz only; a phone's 8 kHz audio upsampled to 16 kHz for
it is heard about 80 ms later than by this model at 8 kHz (`chorus bench barge_in_rule`)."""


class SileroFrameModel:
    """`FRAME_MODEL` on one CPU thread. Thread-safe (one call at a time)."""

    RATES = (8000, 16000)

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_model_path(FRAME_MODEL)
        self.session = onnx_session(self.path)
        self._lock = threading.Lock()

    def run(self, frame: FloatArray, state: FloatArray, rate: int) -> tuple[float, FloatArray]:
        """One frame with its context before it, shaped (1, context + frame); the speech
        probability and the new state."""
        with self._lock:
            out, new_state = self.session.run(
                None, {"input": frame, "state": state, "sr": np.array(rate, np.int64)}
            )
        return float(np.asarray(out).reshape(-1)[0]), np.asarray(new_state, np.float32)


class FrameVadStream:
    """Streaming Silero at `rate` (8000 or 16000) through `SileroFrameModel`: feed samples at that
    rate, get the probability of each completed 32 ms frame (256 samples at 8 kHz, 512 at
    16 kHz). One ONNX call per frame: for a live rule that hears a stream as it comes (the
    barge-in rule), not for a whole recording (`VadStream` batches)."""

    def __init__(self, model: SileroFrameModel, rate: int) -> None:
        if rate not in SileroFrameModel.RATES:
            raise ValueError(f"Silero hears 8000 or 16000 Hz, not {rate}")
        self.model = model
        self.rate = rate
        self.frame = 256 if rate == 8000 else 512
        self._context_size = 32 if rate == 8000 else 64
        self._state = np.zeros((2, 1, 128), np.float32)
        self._context = np.zeros(self._context_size, np.float32)
        self._pending = np.zeros(0, np.float32)

    def accept(self, samples: FloatArray) -> FloatArray:
        """Append samples; the probabilities of the frames they complete."""
        return self.accept_levels(samples)[0]

    def accept_levels(self, samples: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Append samples; the probabilities of the frames they complete, and each frame's RMS
        level in dBFS."""
        data = np.concatenate([self._pending, _checked(samples, allow_empty=True)])
        n = len(data) // self.frame
        self._pending = data[n * self.frame :].copy()
        out = np.empty(n, np.float32)
        for i in range(n):
            frame = data[i * self.frame : (i + 1) * self.frame]
            window = np.concatenate([self._context, frame])[None, :]
            out[i], self._state = self.model.run(window, self._state, self.rate)
            self._context = frame[-self._context_size :].copy()
        return out, frame_levels_db(data[: n * self.frame], self.frame)


def _checked(audio: Any, *, allow_empty: bool = False) -> FloatArray:
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {wav.shape}")
    if not allow_empty and len(wav) == 0:
        raise ValueError("empty audio")
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio holds NaN or infinite samples")
    return wav
