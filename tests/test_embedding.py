"""GE2E speaker embeddings (P1, V4): our numpy-mel + torch module agrees with resemblyzer.

The reference embeddings in tests/data/ge2e_reference.npz were computed once with resemblyzer's
own `VoiceEncoder.embed_utterance` (librosa 0.11 mel spectrogram) on the fixture clips named in
the keys; librosa is not a dependency, so the reference is stored, not recomputed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch

from voice.embedding import (
    SpeakerEmbedder,
    cosine,
    default_embedder,
    default_weights_path,
    mel_spectrogram,
)

REFERENCE = Path(__file__).parent / "data" / "ge2e_reference.npz"


@pytest.fixture(scope="module")
def embedder() -> SpeakerEmbedder:
    return default_embedder()


def _clip(path: Path, seconds: float) -> np.ndarray:
    audio, sr = sf.read(path, dtype="float32")
    assert sr == 16000
    return np.asarray(audio[: int(seconds * sr)], np.float32)


def test_P1_mel_matches_librosa_reference(shared_fixtures: Path) -> None:
    ref = np.load(REFERENCE)
    mel = mel_spectrogram(_clip(shared_fixtures / "ami" / "trn01.wav", 8))
    assert mel.shape == (801, 40)
    expected = ref["trn01_0_8_mel_rows_100_110"]
    np.testing.assert_allclose(mel[100:110], expected, rtol=1e-4, atol=1e-6 * expected.max())


@pytest.mark.parametrize(
    ("key", "path", "seconds"),
    [("trn01_0_8", "ami/trn01.wav", 8), ("sample_0_6", "pyannote-sample/sample.wav", 6)],
)
def test_P1_embedding_matches_resemblyzer(
    embedder: SpeakerEmbedder, shared_fixtures: Path, key: str, path: str, seconds: float
) -> None:
    ours = embedder.embed(_clip(shared_fixtures / path, seconds))
    theirs = np.load(REFERENCE)[key]
    assert ours.shape == (256,)
    assert abs(float(np.linalg.norm(ours)) - 1.0) < 1e-5
    assert cosine(ours, theirs) > 0.9999
    assert np.abs(ours - theirs).max() < 1e-4


def test_embed_windows_batched_equals_one_by_one(
    embedder: SpeakerEmbedder, shared_fixtures: Path
) -> None:
    audio = _clip(shared_fixtures / "pyannote-sample" / "sample.wav", 12)
    starts = [0.0, 1.5, 4.0, 10.5]  # the last window runs past the end: zero-padded
    batch = embedder.embed_windows(audio, starts, 2.0, batch_size=3)
    assert batch.shape == (4, 256)
    mel = mel_spectrogram(np.pad(audio, (0, 16000)))
    for i, s in enumerate(starts):
        one = embedder.embed_mels(mel[None, int(s * 100) : int(s * 100) + 200])[0]
        np.testing.assert_allclose(batch[i], one, atol=1e-4)


def test_loads_from_path_object_or_default(embedder: SpeakerEmbedder, tmp_path: Path) -> None:
    assert embedder.source.startswith("default:")
    state = torch.load(default_weights_path(), map_location="cpu", weights_only=False)
    from_obj = SpeakerEmbedder(state)
    assert from_obj.source == "object: state dict"
    from_module = SpeakerEmbedder(embedder.model)
    assert from_module.source.startswith("object:")
    saved = tmp_path / "ge2e.pt"
    torch.save({"model_state": embedder.model.state_dict()}, saved)
    from_path = SpeakerEmbedder(saved)
    assert from_path.source == f"path: {saved}"
    noise = np.random.default_rng(0).normal(0, 0.05, 16000 * 2).astype(np.float32)
    np.testing.assert_allclose(from_path.embed(noise), embedder.embed(noise), atol=1e-6)


def test_bad_input_is_refused_clearly(embedder: SpeakerEmbedder, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="empty"):
        embedder.embed(np.zeros(0, np.float32))
    with pytest.raises(ValueError, match="NaN"):
        embedder.embed(np.full(16000, np.nan, np.float32))
    with pytest.raises(ValueError, match="mono"):
        embedder.embed(np.zeros((2, 16000), np.float32))
    with pytest.raises(FileNotFoundError):
        SpeakerEmbedder(tmp_path / "missing.pt")
    with pytest.raises(ValueError, match="GE2E"):
        SpeakerEmbedder({"model_state": {"foo": torch.zeros(1)}})


def test_same_voice_scores_higher_than_other_voice(
    embedder: SpeakerEmbedder, shared_fixtures: Path
) -> None:
    # pyannote sample (sample.rttm): speaker90 alone 10.6–14.5 s and 18.6–21.5 s,
    # speaker91 alone 22–28.5 s
    audio = _clip(shared_fixtures / "pyannote-sample" / "sample.wav", 30)
    a1 = embedder.embed(audio[int(11.0 * 16000) : int(14.0 * 16000)])
    a2 = embedder.embed(audio[int(18.6 * 16000) : int(21.4 * 16000)])
    b = embedder.embed(audio[int(23.0 * 16000) : int(27.0 * 16000)])
    assert cosine(a1, a2) > cosine(a1, b)
