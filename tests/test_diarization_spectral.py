"""NME-SC, the batch pipeline's spectral clustering (issue 30): it counts speakers on its own
(embeddings with known voices, and one real recording), honours a speaker count asked for, and
takes degenerate input (nothing, one embedding, identical embeddings) without failing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diarization import batch, spectral
from diarization.batch import BatchSettings
from tests.test_diarization_batch import _voices

NME = BatchSettings(clustering="nme-sc")


def _same_partition(labels: np.ndarray, who: np.ndarray) -> bool:
    pairs = {(int(a), int(b)) for a, b in zip(labels, who, strict=True)}
    return len(pairs) == len(set(labels.tolist())) == len(set(who.tolist()))


@pytest.mark.parametrize("voices", [2, 3, 4, 5, 6])
@pytest.mark.parametrize("noise", [0.2, 0.8])
def test_P1_nme_sc_counts_the_voices_and_groups_them(voices: int, noise: float) -> None:
    train, who = _voices(voices, 10, seed=voices, noise=noise)
    result = spectral.nme_sc(train)
    assert result.eigengap_count == voices
    assert _same_partition(result.labels, who)
    labels = batch.cluster_embeddings(train, NME, windows=np.arange(len(train), dtype=np.int64))
    assert _same_partition(labels, who)


def test_P1_nme_sc_counts_voices_where_one_ahc_threshold_merges_them() -> None:
    """Noisy embeddings (far-field): the fixed AHC cut hears one voice, the eigengap four."""
    train, who = _voices(4, 10, seed=4, noise=0.8)
    assert batch.cluster_embeddings(train, BatchSettings()).max() == 0
    assert _same_partition(batch.cluster_embeddings(train, NME), who)


def test_P1_nme_sc_honours_the_speaker_count_asked_for() -> None:
    train, _ = _voices(4, 10, seed=1)
    assert spectral.nme_sc(train, num_speakers=2).labels.max() == 1
    assert spectral.nme_sc(train, max_speakers=3).labels.max() <= 2
    assert spectral.nme_sc(train, min_speakers=5).labels.max() == 4
    assert batch.cluster_embeddings(train, NME, num_speakers=3).max() == 2
    assert batch.cluster_embeddings(train, NME, max_speakers=2).max() == 1


def test_P1_one_voice_is_one_speaker_once_clusters_never_heard_together_merge() -> None:
    """The eigengap cannot say "one" (a single voice's graph splits anywhere); the merge of
    close clusters that were never two voices of one window makes it one speaker."""
    train, _ = _voices(1, 20, seed=3, noise=0.5)
    windows = np.arange(len(train), dtype=np.int64)
    assert batch.cluster_embeddings(train, NME, windows=windows).max() == 0


def test_P1_nme_sc_takes_degenerate_input() -> None:
    assert len(spectral.nme_sc(np.zeros((0, 4))).labels) == 0
    assert spectral.nme_sc(np.ones((1, 4))).labels.tolist() == [0]
    same = np.tile(np.arange(1.0, 5.0), (6, 1))
    assert spectral.nme_sc(same).labels.tolist() == [0] * 6
    assert set(spectral.nme_sc(same, num_speakers=2).labels.tolist()) == {0, 1}
    two = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert len(spectral.nme_sc(two).labels) == 2
    assert batch.cluster_embeddings(np.ones((1, 192), np.float32), NME).tolist() == [0]
    zeros = np.zeros((5, 192), np.float32)  # zero vectors: similar to nothing, still labelled
    assert len(batch.cluster_embeddings(zeros, NME)) == 5


def test_P1_nme_sc_is_deterministic() -> None:
    train, _ = _voices(3, 12, seed=7, noise=0.8)
    first = spectral.nme_sc(train).labels
    assert all((spectral.nme_sc(train).labels == first).all() for _ in range(3))


def test_P1_an_unknown_clustering_method_is_refused() -> None:
    with pytest.raises(ValueError, match="ahc, nme-sc"):
        BatchSettings(clustering="kmeans")


@pytest.mark.slow
def test_P1_nme_sc_finds_the_three_speakers_of_falcon_test_and_the_analysis_caches(
    shared_fixtures: Path, tmp_path: Path
) -> None:
    from diarization.models import default_embedding_model, default_segmentation_model
    from diarization.scoring import score
    from diarization.tuning import TuningFile
    from voice.diarization_stage import SpeakerTimeline

    clips = shared_fixtures / "short-clips"
    reference = SpeakerTimeline.read_rttm(clips / "falcon_test.rttm")
    models = (default_segmentation_model(), default_embedding_model())
    first = TuningFile.load(clips / "falcon_test.flac", reference, None, cache=tmp_path)
    timeline = first.run(NME, *models)
    assert len(timeline.speakers) == 3
    assert score(reference, timeline, duration=first.duration).der < 0.1
    assert len(list(tmp_path.glob("falcon_test-*.npz"))) == 1
    again = TuningFile.load(clips / "falcon_test.flac", reference, None, cache=tmp_path)
    cached = again.analysis(NME, *models)
    fresh = first.analysis(NME, *models)
    assert cached.starts == fresh.starts
    np.testing.assert_array_equal(cached.decisions, fresh.decisions)
    np.testing.assert_array_equal(cached.embeddings, fresh.embeddings)


def test_P1_nme_sc_on_a_long_recording_clusters_centroids_and_stays_right() -> None:
    """Beyond `MAX_SIZE` embeddings NME-SC runs on k-means centroids: still the right voices."""
    train, who = _voices(3, (spectral.MAX_SIZE // 3) + 50, seed=5, noise=0.5)
    result = spectral.nme_sc(train)
    assert len(result.labels) == len(train) > spectral.MAX_SIZE
    assert _same_partition(result.labels, who)
