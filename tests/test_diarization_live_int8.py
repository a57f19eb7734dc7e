"""The live stage's int8 CAM++ trunk (issue 31, item 1): built from the committed calibration,
near the float trunk on real speech, never used for voiceprints, and refused cleanly when the
calibration does not fit the export."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from diarization import quantize
from diarization.live import _pooling_masks
from diarization.live_models import INT8_CALIBRATION, LiveModels, _quantize_trunk
from voice.audio import read_audio_16k

RATE = 16000


@pytest.fixture(scope="module")
def far_meeting(shared_fixtures: Path) -> np.ndarray:
    return read_audio_16k(
        shared_fixtures / "librispeech-meetings" / "lsmeet_dev02_3spk_far.flac")[: 60 * RATE]


@pytest.fixture(scope="module")
def both() -> tuple[LiveModels, LiveModels]:
    return LiveModels(), LiveModels(precision="fp32")


def _embeddings(models: LiveModels, windows: np.ndarray, activity: np.ndarray) -> np.ndarray:
    return np.concatenate([models.pool(f, _pooling_masks(a))
                           for f, a in zip(models.frame_features(windows), activity, strict=True)])


def test_the_default_trunk_is_int8_and_its_speakers_match_the_float_ones(
    both: tuple[LiveModels, LiveModels], far_meeting: np.ndarray
) -> None:
    int8, fp32 = both
    assert int8.precision == "int8" and "int8" in int8.window_trunk_path.name
    assert fp32.window_trunk_path == fp32.trunk_path == int8.trunk_path
    windows = np.stack([far_meeting[s : s + 5 * RATE]
                        for s in range(0, far_meeting.size - 5 * RATE + 1, 2 * RATE)])
    activity = fp32.segment(windows)
    exact, quantised = _embeddings(fp32, windows, activity), _embeddings(int8, windows, activity)
    heard = ~np.isnan(exact[:, 0])
    assert heard.sum() >= 20
    assert np.array_equal(heard, ~np.isnan(quantised[:, 0]))
    a, b = exact[heard], quantised[heard]
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    assert cos.mean() > 0.97 and cos.min() > 0.85, (cos.mean(), cos.min())
    # and each int8 embedding is nearest its own float one among all the windows' speakers
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    assert np.mean(np.argmax(unit(b) @ unit(a).T, axis=1) == np.arange(len(a))) > 0.9


def test_voiceprints_come_from_the_float_trunk_whatever_the_windows_run_on(
    both: tuple[LiveModels, LiveModels], far_meeting: np.ndarray
) -> None:
    int8, fp32 = both
    clip = far_meeting[: 6 * RATE]
    assert np.array_equal(int8.voiceprint(clip), fp32.voiceprint(clip))


def test_an_unknown_precision_is_refused() -> None:
    with pytest.raises(ValueError, match="precision must be one of int8, fp32"):
        LiveModels(precision="int4")  # type: ignore[arg-type]


def test_a_calibration_from_another_export_is_refused_not_half_quantised(
    both: tuple[LiveModels, LiveModels], tmp_path: Path
) -> None:
    table = json.loads(INT8_CALIBRATION.read_text())
    dropped = sorted(table["data"])[0]
    del table["data"][dropped]
    other = tmp_path / "calibration.json"
    other.write_text(json.dumps(table))
    target = tmp_path / "trunk.int8.onnx"
    with pytest.raises(ValueError, match="has no range for 1 of the trunk's") as caught:
        _quantize_trunk(both[1].trunk_path, target, other)
    assert dropped in str(caught.value) and "python -m diarization.quantize" in str(caught.value)
    assert not target.exists()


def test_calibration_windows_are_drawn_across_the_recordings_seeded(tmp_path: Path) -> None:
    import soundfile as sf

    rng = np.random.default_rng(1)
    paths = []
    for k in range(3):
        path = tmp_path / f"r{k}.wav"
        sf.write(path, (rng.standard_normal(20 * RATE) * 0.01 + 0.3 * k).astype(np.float32), RATE, subtype="FLOAT")
        paths.append(path)
    first = quantize.calibration_windows(paths, count=10)
    assert first.shape == (10, 5 * RATE)
    assert np.array_equal(first, quantize.calibration_windows(paths, count=10))
    assert len({round(float(w.mean()) / 0.3) for w in first}) >= 2
    every = quantize.calibration_windows(paths, count=18)  # 6 windows of 5 s every 3 s per 20 s
    assert sorted(round(float(w.mean()) / 0.3) for w in every) == [0] * 6 + [1] * 6 + [2] * 6
    with pytest.raises(ValueError, match="need 100 windows"):
        quantize.calibration_windows(paths, count=100)
    sf.write(tmp_path / "r8k.wav", np.zeros(8000 * 10, np.float32), 8000)
    with pytest.raises(ValueError, match="8000 Hz"):
        quantize.calibration_windows([tmp_path / "r8k.wav"])
