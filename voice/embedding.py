"""Speaker embeddings: the GE2E encoder whose weights ship inside `resemblyzer` (rule P1, V4).

Why our own module: resemblyzer's `VoiceEncoder` computes its mel spectrogram through librosa,
whose numba JIT costs about 16 s on first use (and on every start where site-packages is
read-only), and its package drags in webrtcvad. The network itself is tiny (a 3-layer LSTM and a
linear layer), so we load the shipped `pretrained.pt` into the same architecture here and compute
the mel spectrogram with numpy, with resemblyzer's exact parameters (25 ms Hann window, 10 ms hop,
40 Slaney mel bands, power spectrogram, not log), so the embeddings agree with resemblyzer's.

`SpeakerEmbedder.embed(audio)` gives one L2-normalised 256-d voiceprint for a clip (mean of
1.6 s partials, as resemblyzer does); `embed_windows(audio, starts, length)` embeds many windows of
one recording in one batched forward pass over a single mel spectrogram (what diarization needs).
Model work is synchronous and CPU-bound: call it off the event loop.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

SAMPLE_RATE = 16000
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 40
PARTIAL_FRAMES = 160  # 1.6 s, the partial-utterance length GE2E was trained on
EMBEDDING_SIZE = 256

FloatArray = npt.NDArray[np.float32]


def default_weights_path() -> Path:
    """`pretrained.pt` inside the installed resemblyzer package (found without importing it:
    importing resemblyzer pulls librosa and webrtcvad)."""
    spec = importlib.util.find_spec("resemblyzer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "resemblyzer is not installed; it ships the GE2E weights (pretrained.pt). "
            "Install it with `pip install --no-deps resemblyzer` or pass a weights path."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "pretrained.pt"
    if not path.is_file():
        raise FileNotFoundError(f"GE2E weights not found at {path}")
    return path


# ---------------------------------------------------------------------------------------------
# Mel spectrogram (numpy; matches librosa.feature.melspectrogram as resemblyzer calls it)


def _hz_to_mel(freqs: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Slaney mel scale (librosa's default, htk=False)."""
    f_sp = 200.0 / 3
    mels = freqs / f_sp
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_t = freqs >= min_log_hz
    mels = np.where(
        log_t, min_log_mel + np.log(np.maximum(freqs, 1e-10) / min_log_hz) / logstep, mels
    )
    return mels


def _mel_to_hz(mels: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    f_sp = 200.0 / 3
    freqs = f_sp * mels
    min_log_hz = 1000.0
    min_log_mel = min_log_hz / f_sp
    logstep = np.log(6.4) / 27.0
    log_t = mels >= min_log_mel
    return np.where(log_t, min_log_hz * np.exp(logstep * (mels - min_log_mel)), freqs)


@lru_cache(maxsize=4)
def mel_filterbank(sr: int = SAMPLE_RATE, n_fft: int = N_FFT, n_mels: int = N_MELS) -> FloatArray:
    """Slaney-normalised triangular mel filters, shape (n_mels, 1 + n_fft // 2)."""
    fftfreqs = np.fft.rfftfreq(n_fft, 1.0 / sr)
    mel_pts = np.linspace(
        _hz_to_mel(np.array([0.0]))[0], _hz_to_mel(np.array([sr / 2.0]))[0], n_mels + 2
    )
    mel_f = _mel_to_hz(mel_pts)
    fdiff = np.diff(mel_f)
    ramps = mel_f[:, None] - fftfreqs[None, :]
    weights = np.zeros((n_mels, len(fftfreqs)))
    for i in range(n_mels):
        lower = -ramps[i] / fdiff[i]
        upper = ramps[i + 2] / fdiff[i + 1]
        weights[i] = np.maximum(0.0, np.minimum(lower, upper))
    enorm = 2.0 / (mel_f[2 : n_mels + 2] - mel_f[:n_mels])
    weights *= enorm[:, None]
    return weights.astype(np.float32)


@lru_cache(maxsize=1)
def _hann(n_fft: int = N_FFT) -> FloatArray:
    # periodic Hann, as scipy.signal.get_window("hann", n, fftbins=True) (librosa's stft window)
    return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)).astype(np.float32)


def mel_spectrogram(audio: FloatArray) -> FloatArray:
    """Power mel spectrogram of 16 kHz mono audio, shape (frames, 40), 1 + len // 160 frames
    (centred frames, zero padding: librosa >= 0.10 defaults)."""
    wav = np.asarray(audio, dtype=np.float32).reshape(-1)
    pad = N_FFT // 2
    padded = np.pad(wav, (pad, pad), mode="constant")
    n_frames = 1 + (len(padded) - N_FFT) // HOP
    if n_frames <= 0:
        return np.zeros((0, N_MELS), dtype=np.float32)
    frames = np.lib.stride_tricks.as_strided(
        padded,
        shape=(n_frames, N_FFT),
        strides=(padded.strides[0] * HOP, padded.strides[0]),
        writeable=False,
    )
    spectrum = np.fft.rfft(frames * _hann(), axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    return (power @ mel_filterbank().T).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# The network


class GE2EEncoder(nn.Module):
    """resemblyzer's VoiceEncoder architecture: LSTM(40→256, 3 layers) → Linear → ReLU → L2."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(N_MELS, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, EMBEDDING_SIZE)
        self.relu = nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, (hidden, _) = self.lstm(mels)
        raw: torch.Tensor = self.relu(self.linear(hidden[-1]))
        normed: torch.Tensor = raw / torch.norm(raw, dim=1, keepdim=True).clamp_min(1e-12)
        return normed


def _l2(x: FloatArray, axis: int = -1) -> FloatArray:
    norm = np.linalg.norm(x, axis=axis, keepdims=True)
    out: FloatArray = (x / np.maximum(norm, 1e-12)).astype(np.float32)
    return out


class SpeakerEmbedder:
    """GE2E voiceprints from 16 kHz mono float32 audio.

    `source` says where the weights came from: a path, an object (a state dict or a module), or
    the default (resemblyzer's pretrained.pt). `threads` is the torch thread count used for every
    forward pass (torch's setting is process-wide; we set it explicitly before each call).
    """

    sample_rate = SAMPLE_RATE
    dim = EMBEDDING_SIZE

    def __init__(
        self,
        weights: str | Path | Mapping[str, Any] | nn.Module | None = None,
        *,
        threads: int | None = 1,
    ) -> None:
        self.threads = threads
        self.model = GE2EEncoder()
        if weights is None:
            path = default_weights_path()
            self._load_state(torch.load(path, map_location="cpu", weights_only=False))
            self.source = f"default: resemblyzer GE2E weights at {path}"
        elif isinstance(weights, (str, Path)):
            path = Path(weights)
            if not path.is_file():
                raise FileNotFoundError(f"GE2E weights file not found: {path}")
            self._load_state(torch.load(path, map_location="cpu", weights_only=False))
            self.source = f"path: {path}"
        elif isinstance(weights, nn.Module):
            self._load_state(weights.state_dict())
            self.source = f"object: {type(weights).__name__} module"
        elif isinstance(weights, Mapping):
            self._load_state(weights)
            self.source = "object: state dict"
        else:
            raise TypeError(f"cannot load GE2E weights from {type(weights).__name__}")
        self.model.eval()
        self._lock = threading.Lock()

    def _load_state(self, state: Mapping[str, Any]) -> None:
        if "model_state" in state:
            state = state["model_state"]
        wanted = {k: v for k, v in state.items() if k.startswith(("lstm.", "linear."))}
        missing = set(self.model.state_dict()) - set(wanted)
        if missing:
            raise ValueError(f"GE2E weights lack {sorted(missing)[:3]}… (not a GE2E checkpoint?)")
        self.model.load_state_dict(wanted, strict=True)

    def __repr__(self) -> str:
        return f"SpeakerEmbedder({self.source})"

    # -- forward passes ----------------------------------------------------------------------

    def embed_mels(self, mels: FloatArray) -> FloatArray:
        """Embeddings of a batch of mel windows, shape (batch, frames, 40) → (batch, 256)."""
        if mels.ndim != 3 or mels.shape[2] != N_MELS:
            raise ValueError(f"expected mel windows of shape (batch, frames, 40), got {mels.shape}")
        if len(mels) == 0:
            return np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)
        with self._lock, torch.inference_mode():
            if self.threads is not None and torch.get_num_threads() != self.threads:
                torch.set_num_threads(self.threads)
            out = self.model(torch.from_numpy(np.ascontiguousarray(mels, dtype=np.float32)))
        result: FloatArray = out.numpy().astype(np.float32)
        return result

    def embed(
        self, audio: FloatArray, *, rate: float = 1.3, min_coverage: float = 0.75
    ) -> FloatArray:
        """One voiceprint for a clip: the L2-normalised mean of its 1.6 s partial embeddings,
        exactly as resemblyzer's `embed_utterance` (same partial slicing)."""
        wav = _checked(audio)
        slices = partial_slices(len(wav), rate, min_coverage)
        need = slices[-1][1] * HOP
        if need >= len(wav):
            wav = np.pad(wav, (0, need - len(wav)))
        mel = mel_spectrogram(wav)
        batch = np.stack([mel[a:b] for a, b in slices])
        partials = self.embed_mels(batch)
        return _l2(partials.mean(axis=0))

    def embed_windows(
        self,
        audio: FloatArray,
        starts: Sequence[float] | npt.NDArray[np.floating[Any]],
        length: float,
        *,
        mel: FloatArray | None = None,
        batch_size: int = 64,
    ) -> FloatArray:
        """Embeddings of windows [start, start + length) seconds of one recording, (n, 256).

        The mel spectrogram is computed once for the whole recording (or passed in as `mel`)
        and windows are cut from it, so overlapping windows cost only the network. Windows that
        run past the end are zero-padded.
        """
        wav = _checked(audio)
        if mel is None:
            mel = mel_spectrogram(wav)
        n = round(length * SAMPLE_RATE / HOP)
        if n <= 0:
            raise ValueError("window length must be positive")
        firsts = [round(float(s) * SAMPLE_RATE / HOP) for s in starts]
        if not firsts:
            return np.zeros((0, EMBEDDING_SIZE), dtype=np.float32)
        last = max(firsts) + n
        if last > len(mel):
            mel = np.concatenate([mel, np.zeros((last - len(mel), N_MELS), np.float32)])
        out = []
        for i in range(0, len(firsts), batch_size):
            chunk = np.stack([mel[f : f + n] for f in firsts[i : i + batch_size]])
            out.append(self.embed_mels(chunk))
        return np.concatenate(out)


def partial_slices(
    n_samples: int, rate: float = 1.3, min_coverage: float = 0.75
) -> list[tuple[int, int]]:
    """Mel-frame ranges of the 1.6 s partials resemblyzer averages (its compute_partial_slices)."""
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    frame_step = max(1, min(PARTIAL_FRAMES, int(np.round((SAMPLE_RATE / rate) / HOP))))
    steps = max(1, n_frames - PARTIAL_FRAMES + frame_step + 1)
    slices = [(i, i + PARTIAL_FRAMES) for i in range(0, steps, frame_step)]
    start, stop = slices[-1][0] * HOP, slices[-1][1] * HOP
    coverage = (n_samples - start) / (stop - start)
    if coverage < min_coverage and len(slices) > 1:
        slices = slices[:-1]
    return slices


def _checked(audio: FloatArray) -> FloatArray:
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {wav.shape}")
    if len(wav) == 0:
        raise ValueError("cannot embed empty audio")
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio holds NaN or infinite samples")
    return wav


def cosine(a: FloatArray, b: FloatArray) -> float:
    """Cosine similarity of two voiceprints."""
    return float(np.dot(a, b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-12))


_DEFAULT: SpeakerEmbedder | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedder() -> SpeakerEmbedder:
    """A process-wide embedder with the default weights (loaded once, about 0.1 s)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = SpeakerEmbedder()
        return _DEFAULT
