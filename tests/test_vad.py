"""Silero VAD wrapper (P1): batch and streaming agree, threshold configurable, bad input refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from voice.diarization_stage import SpeakerTimeline
from voice.vad import (
    FRAME_SECONDS,
    FrameVadStream,
    SileroFrameModel,
    SpeechDetector,
    VadStream,
    level_gain,
)


@pytest.fixture(scope="module")
def sample(shared_fixtures: Path) -> np.ndarray:
    audio, sr = sf.read(shared_fixtures / "pyannote-sample" / "sample.wav", dtype="float32")
    assert sr == 16000
    return np.asarray(audio, np.float32)


def test_P1_streaming_equals_batch_for_any_frame_size(sample: np.ndarray) -> None:
    detector = SpeechDetector(normalize=False)
    audio = sample[:160000]
    batch = detector.probabilities(audio)
    for size in (320, 513, 7777):
        stream = VadStream(detector, gain=1.0)
        parts = [stream.accept(audio[i : i + size]) for i in range(0, len(audio), size)]
        parts.append(stream.flush())
        np.testing.assert_allclose(np.concatenate(parts), batch, atol=1e-6)


def test_P1_regions_cover_the_reference_speech(sample: np.ndarray, shared_fixtures: Path) -> None:
    reference = SpeakerTimeline.read_rttm(shared_fixtures / "pyannote-sample" / "sample.rttm")
    regions = SpeechDetector().regions(sample)
    hyp = np.zeros(int(30 / FRAME_SECONDS) + 1, bool)
    ref = np.zeros_like(hyp)
    for r in regions:
        hyp[int(r.start / FRAME_SECONDS) : int(r.end / FRAME_SECONDS)] = True
    for seg in reference:
        ref[int(seg.start / FRAME_SECONDS) : int(seg.end / FRAME_SECONDS)] = True
    assert (ref & ~hyp).sum() / ref.sum() < 0.1  # missed speech
    assert (hyp & ~ref).sum() / ref.sum() < 0.1  # false alarm
    assert regions[0].start > 5.0  # the first 6 s are silence in the reference


def test_threshold_is_configurable_and_checked(sample: np.ndarray) -> None:
    probs = SpeechDetector().probabilities(sample)
    loose = SpeechDetector(threshold=0.1).regions_from(probs)
    strict = SpeechDetector(threshold=0.9).regions_from(probs)
    assert sum(r.end - r.start for r in loose) >= sum(r.end - r.start for r in strict)
    with pytest.raises(ValueError, match="threshold"):
        SpeechDetector(threshold=1.5)


def test_level_normalisation_only_raises_quiet_audio(sample: np.ndarray) -> None:
    assert level_gain((sample * 0.01).astype(np.float32)) > 10
    assert level_gain(sample) >= 1.0
    assert level_gain(np.clip(sample * 100, -1, 1).astype(np.float32)) == 1.0


def test_silence_has_no_speech() -> None:
    assert SpeechDetector().regions(np.zeros(32000, np.float32)) == []


def test_bad_audio_is_refused(sample: np.ndarray) -> None:
    detector = SpeechDetector()
    with pytest.raises(ValueError, match="NaN"):
        detector.probabilities(np.array([0.0, np.nan], np.float32))
    with pytest.raises(ValueError, match="mono"):
        detector.probabilities(np.zeros((2, 100), np.float32))
    with pytest.raises(ValueError, match="empty"):
        detector.probabilities(np.zeros(0, np.float32))


def test_P1_the_frame_model_equals_the_sequence_model_at_16k_and_hears_8k_natively(
    sample: np.ndarray, shared_fixtures: Path
) -> None:
    """`FrameVadStream` (Silero's per-frame export, the barge-in rule's): at 16 kHz the same
    probabilities as the sequence model, whatever the pieces fed; at 8 kHz (a phone's band, no
    upsampling) speech where the reference has it and none in its quiet."""
    from voice.audio import resample

    model = SileroFrameModel()
    audio = sample[:96000]
    batch = SpeechDetector(normalize=False).probabilities(audio)
    stream = FrameVadStream(model, 16000)
    got = np.concatenate([stream.accept(audio[i : i + 333]) for i in range(0, len(audio), 333)])
    np.testing.assert_allclose(got, batch[: len(got)], atol=1e-5)
    assert len(got) == len(audio) // 512
    narrow = resample(sample, 16000, 8000)
    probs = FrameVadStream(model, 8000).accept(narrow)
    assert len(probs) == len(narrow) // 256
    reference = SpeakerTimeline.read_rttm(shared_fixtures / "pyannote-sample" / "sample.rttm")
    speech = np.zeros(len(probs), bool)
    for seg in reference:
        speech[int(seg.start / FRAME_SECONDS) : int(seg.end / FRAME_SECONDS) + 1] = True
    assert (probs[speech] >= 0.5).mean() > 0.7 and (probs[~speech] >= 0.5).mean() < 0.3
    with pytest.raises(ValueError, match="8000 or 16000"):
        FrameVadStream(model, 48000)
