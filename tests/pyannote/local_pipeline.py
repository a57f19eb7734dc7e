"""Build a pyannote.audio 4 speaker-diarization pipeline directory offline, from pyannote's own
model classes with untrained weights, in the layout `Pipeline.from_pretrained(dir)` reads.

The layout mirrors `pyannote/speaker-diarization-community-1` (whose config.yaml is
`pipeline: {name: pyannote.audio.pipelines.SpeakerDiarization, params: {clustering: VBxClustering,
segmentation: $model/segmentation, embedding: $model/embedding, plda: $model/plda, ...}}` with
`params: {clustering: {threshold: 0.6, Fa: 0.07, Fb: 0.8}, segmentation: {min_duration_off: 0.0}}`):

    config.yaml
    segmentation/pytorch_model.bin   SimpleSegmentationModel (pyannote's debug model), powerset
                                     over 3 speakers with at most 2 at once, 10 s chunks, like
                                     segmentation-3.0
    embedding/pytorch_model.bin      XVectorMFCC (pyannote's small x-vector), 64-d
    plda/xvec_transform.npz          a well-conditioned random LDA/PLDA, so VBx clustering runs
    plda/plda.npz

Checkpoints are written by a Lightning Trainer (`save_checkpoint`), as pyannote's training does,
so `Model.from_pretrained` reads them exactly as it reads a released checkpoint. Nothing here is
trained: the pipeline proves the loading and plumbing path, never accuracy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from lightning import Trainer
from pyannote.audio.core.model import Model
from pyannote.audio.core.task import Problem, Resolution, Specifications
from pyannote.audio.models.embedding import XVectorMFCC
from pyannote.audio.models.segmentation.debug import SimpleSegmentationModel

EMBEDDING_DIM = 64

CONFIG = """\
dependencies:
  pyannote.audio: 4.0.0
pipeline:
  name: pyannote.audio.pipelines.SpeakerDiarization
  params:
    clustering: VBxClustering
    segmentation: $model/segmentation
    segmentation_batch_size: 32
    embedding: $model/embedding
    embedding_batch_size: 32
    embedding_exclude_overlap: true
    plda: $model/plda
params:
  clustering:
    threshold: 0.6
    Fa: 0.07
    Fb: 0.8
  segmentation:
    min_duration_off: 0.0
"""


def _save(model: Model, path: Path) -> None:
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


def segmentation_model(seed: int = 0) -> SimpleSegmentationModel:
    torch.manual_seed(seed)
    model = SimpleSegmentationModel(sample_rate=16_000)
    model.specifications = Specifications(
        problem=Problem.MONO_LABEL_CLASSIFICATION,
        resolution=Resolution.FRAME,
        duration=10.0,
        classes=["speaker#1", "speaker#2", "speaker#3"],
        powerset_max_classes=2,
        permutation_invariant=True,
    )
    model.setup()  # builds the task-dependent classifier for these specifications
    with torch.no_grad():
        # Untrained weights hover around one powerset class everywhere; tilt the classifier's
        # bias away from "nobody speaks" and towards the single-speaker classes, so that the
        # random LSTM features pick between speakers over time and the plumbing has turns to
        # carry. Classes: {}, {1}, {2}, {3}, {1,2}, {1,3}, {2,3}.
        model.classifier.bias.copy_(torch.tensor([-4.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0]))
    return model


def embedding_model(seed: int = 1) -> XVectorMFCC:
    torch.manual_seed(seed)
    model = XVectorMFCC(sample_rate=16_000, dimension=EMBEDDING_DIM)
    model.specifications = Specifications(
        problem=Problem.REPRESENTATION, resolution=Resolution.CHUNK, duration=5.0
    )
    return model


def _plda(directory: Path, seed: int = 2) -> None:
    rng = np.random.default_rng(seed)
    d = EMBEDDING_DIM
    lda, _ = np.linalg.qr(rng.standard_normal((d, d)))  # orthonormal (d, d) projection
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(
        directory / "xvec_transform.npz",
        mean1=rng.standard_normal(d) * 0.01,
        mean2=rng.standard_normal(d) * 0.01,
        lda=lda,
    )
    tr, _ = np.linalg.qr(rng.standard_normal((d, d)))
    np.savez(
        directory / "plda.npz",
        mu=np.zeros(d),
        tr=tr,
        psi=np.linspace(2.0, 0.1, d),
    )


def build_pipeline_dir(root: Path) -> Path:
    """Write a complete pipeline directory under `root` and return it."""
    root.mkdir(parents=True, exist_ok=True)
    _save(segmentation_model(), root / "segmentation" / "pytorch_model.bin")
    _save(embedding_model(), root / "embedding" / "pytorch_model.bin")
    _plda(root / "plda")
    (root / "config.yaml").write_text(CONFIG)
    return root
