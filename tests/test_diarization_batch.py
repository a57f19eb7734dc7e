"""The batch pipeline (P1, issue 9): clustering and reconstruction on their own, then the whole
pipeline on the real weights (overlap gets two speakers, speakers found, DER under a bound)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diarization import batch, load_stage
from diarization.batch import Analysis, BatchSettings, Clustering
from diarization.models import CAMPPLUS_DIM, FRAME_STEP
from diarization.scoring import score
from voice.audio import read_audio_16k
from voice.centroids import l2_normalize
from voice.diarization_stage import SpeakerTimeline

FRAMES = 589


def _voices(n: int, per: int, seed: int = 0, noise: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(n, CAMPPLUS_DIM))
    who = np.repeat(np.arange(n), per)
    points = (
        centres[who]
        + noise
        * rng.normal(size=(n * per, CAMPPLUS_DIM))
        * np.sqrt(1 / CAMPPLUS_DIM)
        * np.linalg.norm(centres, axis=1).mean()
    )
    return l2_normalize(points.astype(np.float32)), who


def test_P1_clustering_finds_the_voices_and_honours_speaker_counts() -> None:
    train, who = _voices(3, 10)
    labels = batch.cluster_embeddings(train, BatchSettings())
    assert len(set(labels.tolist())) == 3
    for k in range(3):
        assert len(set(labels[who == k].tolist())) == 1
    assert batch.cluster_embeddings(train, BatchSettings(), num_speakers=2).max() == 1
    assert batch.cluster_embeddings(train, BatchSettings(), max_speakers=2).max() == 1
    assert batch.cluster_embeddings(train, BatchSettings(), min_speakers=4).max() == 3


def test_P1_a_lone_embedding_of_a_distinct_voice_stays_a_speaker() -> None:
    train, _ = _voices(3, 10)
    lone, _ = _voices(1, 1, seed=9)
    labels = batch.cluster_embeddings(np.concatenate([train, lone]), BatchSettings())
    assert labels.max() == 3  # fold_below keeps it
    folded = batch.cluster_embeddings(np.concatenate([train, lone]), BatchSettings(fold_below=2.0))
    assert folded.max() == 2


def _analysis(decisions: np.ndarray, embeddings: np.ndarray, step: float = 2.0) -> Analysis:
    windows = len(decisions)
    starts = [round(i * step * 16000) for i in range(windows)]
    alone = decisions.sum(axis=2, keepdims=True) == 1
    clean = (decisions * alone).sum(axis=1).astype(np.int64)
    return Analysis(
        duration=(starts[-1] + 160000) / 16000,
        starts=starts,
        decisions=decisions.astype(np.uint8),
        embeddings=embeddings.astype(np.float32),
        clean_frames=clean,
    )


def test_P1_overlap_in_one_window_gives_two_speakers_even_with_one_cluster() -> None:
    """The segmentation hears two voices at once; only one has enough clean speech to train the
    clustering. open_unmatched makes the other a speaker of its own, so the overlap has two."""
    decisions = np.zeros((1, FRAMES, 3), np.uint8)
    decisions[0, 0:400, 0] = 1  # 6.75 s, mostly alone
    decisions[0, 300:400, 1] = 1  # 1.7 s, all of it overlapped
    vectors, _ = _voices(2, 1, seed=3)
    embeddings = np.full((1, 3, CAMPPLUS_DIM), np.nan, np.float32)
    embeddings[0, :2] = vectors
    analysis = _analysis(decisions, embeddings)
    clustering = batch.cluster_analysis(analysis, BatchSettings())
    assert len(clustering.centroids) == 2
    timeline = SpeakerTimeline(batch.reconstruct(analysis, clustering, ["A", "B"]))
    both = 350 * FRAME_STEP
    assert {s.speaker for s in timeline if s.start <= both < s.end} == {"A", "B"}
    merged = batch.cluster_analysis(analysis, BatchSettings(open_unmatched=False))
    assert len(merged.centroids) == 1
    capped = batch.cluster_analysis(analysis, BatchSettings(), max_speakers=1)
    assert len(capped.centroids) == 1  # an asked-for count holds even against the segmentation


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, FRAMES - 1), st.integers(1, FRAMES), st.integers(0, 2)),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 4),
)
def test_P1_reconstruction_never_exceeds_the_counted_speakers(
    runs: list[tuple[int, int, int]], windows: int
) -> None:
    """Property: at every frame the timeline holds at most as many speakers as the windows
    counted there (rounded mean), and never more than two at once (the model's limit)."""
    decisions = np.zeros((windows, FRAMES, 3), np.uint8)
    for w in range(windows):
        for start, length, speaker in runs:
            decisions[w, start : start + length, speaker] = 1
        over = decisions[w].sum(axis=1) > 2
        decisions[w, over, 2] = 0
    vectors, _ = _voices(3, 1, seed=1)
    embeddings = np.repeat(vectors[None], windows, axis=0)
    analysis = _analysis(decisions, embeddings)
    clustering = Clustering(vectors, np.tile(np.arange(3), (windows, 1)))
    segments = batch.reconstruct(analysis, clustering, ["A", "B", "C"])
    for t in np.arange(0.05, analysis.duration, 0.37):
        heard = sum(s.start <= t < s.end for s in segments)
        assert heard <= 2
        index = int((t - 0.0225) / FRAME_STEP)
        counts = [
            decisions[w, index - round(w * 2.0 / FRAME_STEP)].sum()
            for w in range(windows)
            if 0 <= index - round(w * 2.0 / FRAME_STEP) < FRAMES
        ]
        if counts:
            assert heard <= int(np.rint(np.mean(counts))) + 1  # +1: frame-boundary rounding


@pytest.mark.slow
def test_P1_fw_stereo_mix_gets_two_speakers_where_the_reference_overlaps(
    shared_fixtures: Path,
) -> None:
    clips = shared_fixtures / "short-clips"
    timeline = load_stage().diarize(read_audio_16k(clips / "fw_stereo_mix.flac"))
    reference = SpeakerTimeline.read_rttm(clips / "fw_stereo_mix.rttm")
    assert len(timeline.speakers) == 2
    overlap = [
        t
        for t in np.arange(0.0, 5.0, 0.05)
        if sum(s.start <= t < s.end for s in reference.segments) == 2
    ]
    assert len(overlap) > 20
    two = [t for t in overlap if len({s.speaker for s in timeline if s.start <= t < s.end}) == 2]
    assert len(two) / len(overlap) > 0.6


@pytest.mark.slow
def test_P1_falcon_test_finds_its_three_speakers(shared_fixtures: Path) -> None:
    clips = shared_fixtures / "short-clips"
    timeline = load_stage().diarize(read_audio_16k(clips / "falcon_test.flac"))
    reference = SpeakerTimeline.read_rttm(clips / "falcon_test.rttm")
    assert len(timeline.speakers) == 3
    assert score(reference, timeline, duration=18.6, collar=0.25).der < 0.1


@pytest.mark.slow
def test_P1_der_on_an_ami_meeting_excerpt_is_under_a_generous_bound(
    shared_fixtures: Path,
) -> None:
    ami = shared_fixtures / "ami"
    reference = SpeakerTimeline.read_rttm(ami / "train.rttm", "trn06")
    timeline = load_stage().diarize(read_audio_16k(ami / "trn06.wav"))
    result = score(reference, timeline, duration=30.0, collar=0.25)
    assert result.der < 0.25, result  # measured 11.0 % (docs/benchmarks.md)


def test_P1_clusters_heard_together_in_a_window_never_merge() -> None:
    """Two clusters heard as different local speakers of one window are two people, however
    close their embeddings; the same closeness without that evidence merges."""
    one_voice, _ = _voices(1, 12, noise=0.2)
    halves = np.array([0] * 6 + [1] * 6, np.int64)
    together = np.array(list(range(6)) * 2, np.int64)  # each window holds one of each half
    kept = batch._merge_apart(one_voice, halves, together, threshold=1.0)
    assert set(kept.tolist()) == {0, 1}
    apart = np.arange(12, dtype=np.int64)
    assert set(batch._merge_apart(one_voice, halves, apart, threshold=1.0).tolist()) == {0}
    assert set(batch._merge_apart(one_voice, halves, apart, threshold=0.01).tolist()) == {0, 1}
