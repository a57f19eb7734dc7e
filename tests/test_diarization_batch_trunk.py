"""The batch pipeline on the live stage's CAM++ trunk (issue 30: tried for the batch RTF, not the
default): at fp32 it is CAM++'s own embedding, and the span pooling puts each local speaker's
mask on its own window's frames of the block."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diarization import batch
from diarization.live_models import LiveModels, SpanTrunkEmbedding, TrunkEmbedding
from diarization.models import SegmentationModel
from voice.audio import read_audio_16k
from voice.embedding import EmbeddingModel, fbank

RATE = 16000


@pytest.fixture(scope="module")
def meeting(shared_fixtures: Path) -> np.ndarray:
    return read_audio_16k(
        shared_fixtures / "librispeech-meetings" / "lsmeet_dev02_3spk_far.flac")[: 24 * RATE]


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    cos: np.ndarray = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return cos


def test_the_float_trunk_embeds_a_slice_as_cam_plus_plus_does(meeting: np.ndarray) -> None:
    feats = fbank(meeting)
    slices = [feats[a : a + n] for a, n in ((0, 300), (450, 77), (900, 640), (1500, 5))]
    trunk, cam = TrunkEmbedding(LiveModels(precision="fp32")), EmbeddingModel()
    assert trunk.name == "campplus-trunk-fp32" != cam.name  # their own files in a --cache
    ours, theirs = trunk.embed_features(slices), cam.embed_features(slices)
    assert np.isnan(ours[3]).all() and np.isnan(theirs[3]).all()  # under min_frames
    assert _cosines(ours[:3], theirs[:3]).min() > 0.9999
    int8 = TrunkEmbedding(LiveModels(precision="int8")).embed_features(slices)
    assert 0.9 < _cosines(int8[:3], theirs[:3]).min() < 0.9999  # near, and not the same graph


def test_span_pooling_takes_each_speaker_from_its_own_window_of_the_block(
    meeting: np.ndarray,
) -> None:
    embedding = SpanTrunkEmbedding(LiveModels(precision="fp32"))
    segmentation = SegmentationModel()
    settings = batch.BatchSettings()
    analysis = batch.analyse(meeting, segmentation, embedding, settings)
    sliced = batch.analyse(meeting, segmentation, TrunkEmbedding(embedding.models), settings)
    heard = ~np.isnan(analysis.embeddings[..., 0])
    assert heard.sum() >= 6
    assert np.array_equal(heard, ~np.isnan(sliced.embeddings[..., 0]))
    # the second window of the second block, by hand: its speaker's mask placed 1 window in
    w = batch.BLOCK + 1
    s = int(np.flatnonzero(heard[w])[0])
    lo = analysis.starts[batch.BLOCK]
    span = meeting[lo : analysis.starts[2 * batch.BLOCK - 1] + 10 * RATE]  # the whole block
    assert len(span) == analysis.starts[2 * batch.BLOCK - 1] + 10 * RATE - lo
    feats = fbank(span)
    decisions = analysis.decisions[w]
    alone = decisions.sum(axis=1) == 1
    clean = (decisions[:, s] == 1) & alone
    first = (analysis.starts[w] - lo) // 160
    to_frame = batch._fbank_to_frame(segmentation.frames)
    keep = clean[to_frame][: len(feats) - first]
    assert keep.sum() >= 20
    mask = np.zeros(len(feats), np.bool_)
    mask[first : first + len(keep)] = keep
    expected = embedding.pool(embedding.span_frames(feats), mask[None])[0]
    assert _cosines(expected[None], analysis.embeddings[w, s][None])[0] > 0.9999
    # pooled with the other voices' context: near the slice's own embedding, not equal to it
    cos = _cosines(analysis.embeddings[heard], sliced.embeddings[heard])
    assert cos.mean() > 0.6 and cos.min() < 0.9999
