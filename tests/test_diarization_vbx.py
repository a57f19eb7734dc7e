"""VBx (issue 30, item 2): the VB-HMM over an x-vector sequence with the recording's own speaker
model (`diarization.vbx`), and the batch pipeline's optional step (`BatchSettings.vbx`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diarization import batch, vbx
from diarization.batch import BatchSettings
from diarization.embedded import EmbeddedStage
from diarization.scoring import score
from voice.audio import read_audio_16k
from voice.centroids import l2_normalize
from voice.diarization_stage import SpeakerTimeline

DIM = 64


def _sequence(turns: list[tuple[int, int]], seed: int = 0, noise: float = 0.9) -> tuple[
    np.ndarray, np.ndarray
]:
    """L2-normalised x-vectors of consecutive turns (speaker, length) around random speaker
    means, and who speaks at each."""
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(max(s for s, _ in turns) + 1, DIM))
    who = np.concatenate([np.full(n, s) for s, n in turns]).astype(np.int64)
    points = means[who] + noise * rng.normal(size=(len(who), DIM))
    return l2_normalize(points.astype(np.float32)), who


def _refine(x: np.ndarray, labels: np.ndarray, k: int, within_from: str = "lag") -> list[int]:
    posteriors = vbx.refine(
        x,
        labels,
        np.arange(len(x)),
        k=k,
        lag=3,
        dim=16,
        loop=0.9,
        fa=0.3,
        fb=17.0,
        within_from=within_from,
    )
    assert posteriors is not None
    assert posteriors.shape == (len(x), k)
    assert np.allclose(posteriors.sum(axis=1), 1.0)
    return [int(v) for v in np.argmax(posteriors, axis=1)]


@pytest.mark.parametrize("within_from", vbx.WITHIN_FROM)
def test_vbx_fixes_a_wrong_initial_clustering(within_from: str) -> None:
    x, who = _sequence([(0, 60), (1, 60), (0, 60), (2, 60)])
    wrong = who.copy()
    wrong[10:25] = 1  # a stretch of speaker 0's turn given to speaker 1
    wrong[130:140] = 2  # and one of speaker 0's second turn to speaker 2
    wrong[[70, 95, 200]] = 0  # and three lone x-vectors
    assert (wrong != who).sum() == 28
    fixed = _refine(x, wrong, 3, within_from)
    assert fixed == who.tolist()


def test_vbx_empties_a_speaker_the_initial_clustering_invented() -> None:
    x, who = _sequence([(0, 60), (1, 60), (0, 60)])
    split = who.copy()
    split[120:] = 2  # the second turn of speaker 0 as a third speaker
    out = np.array(_refine(x, split, 3))
    # the same partition as the truth: speaker 0's two turns end up one speaker
    assert len(set(out.tolist())) == 2
    assert len(set(out[who == 0].tolist())) == 1 and len(set(out[who == 1].tolist())) == 1


@pytest.mark.parametrize("within_from", vbx.WITHIN_FROM)
def test_vbx_keeps_a_correct_clustering(within_from: str) -> None:
    x, who = _sequence([(0, 40), (1, 30), (2, 50), (0, 20), (1, 40)], seed=3)
    assert _refine(x, who, 3, within_from) == who.tolist()


def test_vbx_is_deterministic() -> None:
    x, who = _sequence([(0, 50), (1, 50), (0, 50)], seed=5)
    labels = who.copy()
    labels[::7] = 1 - labels[::7]
    first = vbx.refine(x, labels, np.arange(len(x)), k=2, lag=3, dim=16, loop=0.9, fa=0.3, fb=17.0)
    again = vbx.refine(x, labels, np.arange(len(x)), k=2, lag=3, dim=16, loop=0.9, fa=0.3, fb=17.0)
    assert first is not None and again is not None
    assert np.array_equal(first, again)


def test_the_speaker_model_whitens_the_within_speaker_scatter() -> None:
    x, who = _sequence([(0, 80), (1, 80), (2, 80)], seed=7)
    model = vbx.estimate_model(x, who, np.arange(len(x)), lag=3, dim=8)
    assert model is not None
    y = model.project(x)
    residual = y - np.stack([y[who == s].mean(axis=0) for s in range(3)])[who]
    within = residual.T @ residual / len(y)
    assert np.allclose(np.diag(within), 1.0, atol=0.35)
    # the speakers lie along the leading dimensions: there phi is far above the others
    assert model.phi[0] > 5 and model.phi[1] > 5 and model.phi[-1] < 1


def test_an_unknown_covariance_source_is_refused() -> None:
    x, who = _sequence([(0, 30), (1, 30)])
    with pytest.raises(ValueError, match="within_from"):
        vbx.estimate_model(x, who, np.arange(60), lag=3, dim=8, within_from="plda")


def test_too_few_x_vectors_give_no_model() -> None:
    x, who = _sequence([(0, 3), (1, 2)])
    assert vbx.refine(x, who, np.arange(5), k=2, lag=3, dim=16, loop=0.9, fa=0.3, fb=17.0) is None
    # positions 0, 1, 3, 4, 7 (gaps: no speech there); three apart with one label: 0–3 and 4–7
    pairs = vbx.same_speaker_pairs(who, np.array([0, 1, 3, 4, 7]), 3)
    assert pairs.tolist() == [[0, 2], [3, 4]]


@pytest.mark.slow
def test_vbx_step_on_falcon_test_keeps_its_three_speakers(shared_fixtures: Path) -> None:
    clips = shared_fixtures / "short-clips"
    audio = read_audio_16k(clips / "falcon_test.flac")
    # 18.6 s hold fewer x-vectors than the default floor: VBx is made to run here
    stage = EmbeddedStage(batch_settings=BatchSettings(vbx=True, vbx_min_xvectors=0))
    analysis = batch.analyse(audio, stage.segmentation, stage.embedding, stage.batch)
    vectors = batch.xvectors(audio, analysis, stage.embedding, stage.batch)
    assert len(vectors.positions) > 20 and vectors.embeddings.shape[1] == 192
    assert np.all(np.diff(vectors.positions) > 0)
    timeline = stage.diarize(audio)
    reference = SpeakerTimeline.read_rttm(clips / "falcon_test.rttm")
    assert len(timeline.speakers) == 3
    assert score(reference, timeline, duration=18.6, collar=0.25).der < 0.1


def test_the_batch_step_leaves_a_recording_with_too_few_x_vectors_alone() -> None:
    decisions = np.zeros((2, 589, 3), np.uint8)
    decisions[:, :300, 0] = 1
    decisions[:, 300:, 1] = 1
    embeddings = np.zeros((2, 3, DIM), np.float32)
    analysis = batch.Analysis(12.0, [0, 32000], decisions, embeddings, np.zeros((2, 3), np.int64))
    clustering = batch.Clustering(
        np.eye(2, DIM, dtype=np.float32), np.array([[0, 1, -1], [0, 1, -1]], np.int64)
    )
    x, _ = _sequence([(0, 10), (1, 10)])
    vectors = batch.XVectors(np.arange(20, dtype=np.int64), x, 0.5, 1.5)
    settings = BatchSettings(vbx=True, vbx_min_xvectors=21)
    assert batch.vbx_refine(analysis, clustering, vectors, settings) is clustering
    one = batch.XVectors(np.zeros(1, np.int64), x[:1], 0.5, 1.5)
    assert batch.vbx_refine(analysis, clustering, one, BatchSettings(vbx=True)) is clustering
