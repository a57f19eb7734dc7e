"""The far-field front ends (issue 23, item 4; `voice.frontend`): WPE takes late reverberation
out of real speech made reverberant here (a fixed-seed room response), noise suppression takes a
noise floor out, each keeps the recording's length, and a wrong name is a clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from scipy.signal import fftconvolve, stft

from voice.audio import read_audio
from voice.frontend import FRONT_ENDS, apply_front_end, check_front_end

FloatAudio = npt.NDArray[np.float32]
RATE = 16000


def speech(shared_fixtures: Path, seconds: float = 8.0) -> FloatAudio:
    """Close-talk LibriSpeech speech (a meeting fixture's close render)."""
    audio, rate = read_audio(shared_fixtures / "librispeech-meetings" / "lsmeet_dev01_2spk_close.flac")
    assert rate == RATE
    start = int(1.0 * RATE)
    return np.asarray(audio[start : start + int(seconds * RATE)], np.float32)


def room_response(rt60: float = 0.7, seed: int = 7) -> FloatAudio:
    """A direct path and an exponentially decaying diffuse tail from 5 ms on (RT60 `rt60`)."""
    rng = np.random.default_rng(seed)
    n = int(rt60 * 1.2 * RATE)
    t = np.arange(n) / RATE
    tail = rng.standard_normal(n) * np.exp(-6.9 * t / rt60) * 0.25
    tail[: int(0.005 * RATE)] = 0.0
    tail[0] = 1.0
    return np.asarray(tail, np.float32)


def log_spectral_distance(a: FloatAudio, b: FloatAudio) -> float:
    """Mean distance (dB) between the two recordings' log power spectrograms."""
    _, _, sa = stft(a, RATE, nperseg=512, noverlap=384)
    _, _, sb = stft(b, RATE, nperseg=512, noverlap=384)
    frames = min(sa.shape[1], sb.shape[1])
    la = 10 * np.log10(np.abs(sa[:, :frames]) ** 2 + 1e-10)
    lb = 10 * np.log10(np.abs(sb[:, :frames]) ** 2 + 1e-10)
    return float(np.mean(np.sqrt(np.mean((la - lb) ** 2, axis=0))))


def test_wpe_brings_reverberant_speech_nearer_the_dry_speech(shared_fixtures: Path) -> None:
    dry = speech(shared_fixtures)
    wet = np.asarray(fftconvolve(dry, room_response())[: len(dry)], np.float32)
    cleaned = apply_front_end("wpe", wet, RATE)
    assert cleaned.dtype == np.float32 and len(cleaned) == len(wet)
    assert np.all(np.isfinite(cleaned))
    before, after = log_spectral_distance(wet, dry), log_spectral_distance(cleaned, dry)
    assert after < before - 0.5, (before, after)


def test_noise_suppression_lowers_the_noise_floor_and_keeps_the_speech(shared_fixtures: Path) -> None:
    rng = np.random.default_rng(3)
    dry = np.concatenate([np.zeros(RATE, np.float32), speech(shared_fixtures, 5.0)])
    noise = rng.standard_normal(len(dry)).astype(np.float32) * 0.01
    cleaned = apply_front_end("denoise", dry + noise, RATE)
    assert cleaned.dtype == np.float32 and len(cleaned) == len(dry)
    floor_before = float(np.mean(noise[: RATE // 2] ** 2))
    floor_after = float(np.mean(cleaned[: RATE // 2] ** 2))
    assert 10 * np.log10(floor_before / floor_after) > 6.0  # the noise-only second, 6 dB down
    speech_power = float(np.mean(dry[RATE:] ** 2))
    kept = float(np.mean(cleaned[RATE:] ** 2))
    assert kept > 0.25 * speech_power  # the speech is not gated away with it (within 6 dB)


def test_none_is_the_recording_itself_and_a_wrong_name_is_a_clear_error() -> None:
    audio = np.linspace(-0.5, 0.5, RATE, dtype=np.float32)
    assert apply_front_end("none", audio, RATE) is audio
    assert "wpe+denoise" in FRONT_ENDS
    with pytest.raises(ValueError, match="unknown front end 'reverb'"):
        check_front_end("reverb")
    assert len(apply_front_end("wpe+denoise", np.zeros(0, np.float32), RATE)) == 0
