"""The one L2 normaliser and the one speaker-centroid type (`voice.centroids`) that the batch, live
and pyannote clustering, enrollment (V8) and reconnect labels (V4) share: unit length for every
real vector, zero and NaN handled as documented, and a centroid that is the normalised mean."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from voice.centroids import L2_EPS, SpeakerCentroid, l2_normalize, unit_or_none

REPO = Path(__file__).resolve().parents[1]

# zero, or far from zero: a vector's norm is then either exactly zero or well above L2_EPS
finite = st.one_of(
    st.just(0.0), st.floats(2**-10, 1e3, width=32), st.floats(-1e3, -(2**-10), width=32)
)
rows = hnp.arrays(np.float32, st.tuples(st.integers(1, 6), st.integers(1, 16)), elements=finite)
vectors = hnp.arrays(np.float32, st.integers(1, 32), elements=finite)


def _norms(x: np.ndarray) -> np.ndarray:
    return np.linalg.norm(x.astype(np.float64), axis=-1)


@settings(max_examples=200, deadline=None)
@given(rows)
def test_V7_l2_normalize_gives_unit_rows_in_the_same_direction(x: np.ndarray) -> None:
    out = l2_normalize(x)
    assert out.dtype == np.float32 and out.shape == x.shape
    real = _norms(x) >= L2_EPS
    np.testing.assert_allclose(_norms(out[real]), 1.0, rtol=1e-5)
    # same direction: each input row is its norm times the output row
    np.testing.assert_allclose(out[real] * _norms(x[real])[:, None], x[real], rtol=1e-4, atol=1e-4)
    assert np.all(out[~real] == 0)  # only the all-zero rows


@settings(max_examples=100, deadline=None)
@given(rows)
def test_V7_l2_normalize_along_the_first_axis_normalises_columns(x: np.ndarray) -> None:
    np.testing.assert_allclose(l2_normalize(x, axis=0), l2_normalize(x.T).T, rtol=1e-6)


def test_V7_a_zero_vector_stays_zero_and_nan_stays_nan() -> None:
    assert np.all(l2_normalize(np.zeros(192, np.float32)) == 0)
    both = l2_normalize(np.array([[0.0, 0.0], [np.nan, 1.0], [3.0, 4.0]], np.float32))
    assert np.all(both[0] == 0) and np.all(np.isnan(both[1]))
    np.testing.assert_allclose(both[2], [0.6, 0.8], rtol=1e-6)


@settings(max_examples=200, deadline=None)
@given(vectors)
def test_V7_unit_or_none_is_unit_length_or_none_for_a_zero_vector(v: np.ndarray) -> None:
    out = unit_or_none(v)
    if not np.any(v):
        assert out is None
    else:
        assert out is not None and out.shape == (v.size,)
        np.testing.assert_allclose(np.linalg.norm(out.astype(np.float64)), 1.0, rtol=1e-5)


@pytest.mark.parametrize(
    "vector", [[0.0, 0.0, 0.0], [1.0, np.nan, 0.0], [np.inf, 1.0, 0.0], [1e-9, 0.0, 0.0]]
)
def test_V7_unit_or_none_refuses_what_has_no_direction(vector: list[float]) -> None:
    assert unit_or_none(np.array(vector)) is None


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 8), st.just(12)), elements=finite))
def test_V7_a_centroid_is_the_normalised_mean_of_what_was_added(x: np.ndarray) -> None:
    speaker = SpeakerCentroid("Speaker A")
    for row in x:
        speaker.add(row)
        speaker.add(None)  # an embedding that was not computed adds nothing
    mean = x.astype(np.float64).mean(axis=0)
    assume(np.linalg.norm(mean) > 1e-2 * _norms(x).max())  # rows that cancel have no direction
    assert speaker.centroid is not None
    expected = mean / np.linalg.norm(mean)
    np.testing.assert_allclose(speaker.centroid, expected, rtol=1e-3, atol=1e-3)


def test_V8_a_centroid_starts_empty_and_keeps_its_own_copy() -> None:
    speaker = SpeakerCentroid("Alice", enrolled=True)
    assert speaker.centroid is None and speaker.total is None
    first = np.array([3.0, 4.0], np.float32)
    speaker.add(first)
    first[:] = 0  # the caller's array is not the centroid's sum
    np.testing.assert_allclose(speaker.centroid, [0.6, 0.8], rtol=1e-6)
    speaker.add(np.array([-3.0, -4.0], np.float32))
    assert speaker.centroid is None  # the sum is zero: no direction


def test_V4_the_reconnect_path_imports_the_numerics_without_torch() -> None:
    """`voice.speakers` (imported by the server) uses the normaliser without loading torch."""
    code = "import sys, voice.speakers, voice.centroids; print('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
