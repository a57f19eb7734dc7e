"""Live stitching of the pyannote stage (rule P2, V7, V8) against a scripted pipeline.

pyannote numbers speakers afresh in every window (SPEAKER_00 is whoever speaks first in it), so
the stage must carry the session's names across windows. This pipeline answers the way
pyannote.audio 4's SpeakerDiarization does (a real `DiarizeOutput` of real `Annotation`s, labels
in order of appearance per window, one embedding per speaker) but from a script of who speaks
when, so the expected timeline is exact. The audio is a ramp whose sample values encode time, so
the pipeline knows where each window sits. The real pipeline is exercised in
test_pyannote_stage.py; this file pins the stitching logic.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("CHORUS_PYANNOTE_ENV") != "1":
    pytest.importorskip(
        "pyannote.audio",
        reason="pyannote.audio is not in this environment (the main venv has torch 2.13 and no "
        "pyannote); `make test-pyannote` runs these tests in the pyannote env (docs/pyannote.md)",
    )

from typing import Any

import numpy as np
from pyannote.audio.pipelines.speaker_diarization import DiarizeOutput
from pyannote.core import Annotation, Segment

from diarization.pyannote_stage import PyannoteStage

RATE = 16_000
SCALE = 100.0  # sample value = seconds / SCALE

# Who speaks when. X comes back at 27 s after 15 s away, longer than one 10 s window: only its
# voice (embedding) can link it back to its name.
SCRIPT = [
    (0.0, 4.0, "X"),
    (4.0, 9.0, "Y"),
    (9.0, 12.0, "X"),
    (12.0, 16.0, "Z"),
    (16.0, 27.0, "Y"),
    (27.0, 31.0, "X"),
]
DURATION = 32.0


def _voices() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {who: rng.standard_normal(16).astype(np.float32) for who in "XYZW"}


def _who(t: float) -> str | None:
    return next((who for s, e, who in SCRIPT if s <= t < e), None)


def ramp(start: float, end: float) -> np.ndarray:
    n0, n1 = round(start * RATE), round(end * RATE)
    return (np.arange(n0, n1, dtype=np.float64) / RATE / SCALE).astype(np.float32)


class ScriptedEmbedding:
    """Stands where pyannote keeps the pipeline's embedding model (`pipeline._embedding`)."""

    sample_rate = RATE
    min_num_samples = 1

    def __init__(self, voices: dict[str, np.ndarray]) -> None:
        self.voices = voices

    def __call__(self, waveforms: Any) -> np.ndarray:
        samples = waveforms.numpy().reshape(-1)
        who = _who(float(samples[samples.size // 2]) * SCALE)
        assert who is not None, "enrollment clip outside the script"
        return self.voices[who][None]


class ScriptedPipeline:
    def __init__(self, overlap: list[tuple[float, float, str]] | None = None) -> None:
        self.overlap = overlap or []  # speech heard only under someone else's (overlapped)
        self.voices = _voices()
        self._embedding = ScriptedEmbedding(self.voices)
        self.calls = 0

    def to(self, device: Any) -> ScriptedPipeline:
        return self

    def __call__(self, file: dict[str, Any], **kwargs: Any) -> DiarizeOutput:
        self.calls += 1
        samples = file["waveform"].numpy().reshape(-1)
        start = round(float(samples[0]) * SCALE * RATE) / RATE
        end = start + samples.size / RATE
        annotation = Annotation(uri=file["uri"])
        labels: dict[str, str] = {}
        for s, e, who in SCRIPT:
            s, e = max(s, start), min(e, end)
            if e > s:
                label = labels.setdefault(who, f"SPEAKER_{len(labels):02d}")
                annotation[Segment(s - start, e - start)] = label
        exclusive = annotation.copy()
        for s, e, who in self.overlap:
            s, e = max(s, start), min(e, end)
            if e > s:
                label = labels.setdefault(who, f"SPEAKER_{len(labels):02d}")
                annotation[Segment(s - start, e - start), "overlap"] = label
        by_label = {label: who for who, label in labels.items()}
        rng = np.random.default_rng(self.calls)
        embeddings = (
            np.stack(
                [
                    self.voices[by_label[label]] + 0.05 * rng.standard_normal(16)
                    for label in annotation.labels()
                ]
            )
            if labels
            else np.zeros((0, 16))
        )
        return DiarizeOutput(
            speaker_diarization=annotation,
            exclusive_speaker_diarization=exclusive,
            speaker_embeddings=embeddings,
        )


def _expected(names: dict[str, str], until: float) -> list[tuple[float, float, str]]:
    return [(s, min(e, until), names[who]) for s, e, who in SCRIPT if s < until]


def _feed_all(stage: PyannoteStage, frame_s: float) -> list[tuple[float, float, str]]:
    stage.reset()
    step = round(frame_s * RATE)
    audio = ramp(0.0, DURATION)
    timeline = None
    for i in range(0, audio.size, step):
        timeline = stage.feed(audio[i : i + step])
    assert timeline is not None
    return [(round(s.start, 6), round(s.end, 6), s.speaker) for s in timeline]


def test_P2_live_labels_follow_voices_across_windows() -> None:
    pipeline = ScriptedPipeline()
    stage = PyannoteStage(pipeline, device="cpu")
    assert stage.source.kind == "object"

    got = _feed_all(stage, 0.02)
    names = {"X": "Speaker A", "Y": "Speaker B", "Z": "Speaker C"}
    assert got == _expected(names, DURATION)
    assert pipeline.calls == DURATION / stage.hop_s  # one run per 2 s hop

    # Any frame size: the same decisions (windows sit at fixed sample positions).
    assert _feed_all(stage, 0.37) == got
    assert _feed_all(stage, DURATION) == got


def test_P2_live_provisional_tail_and_frozen_past() -> None:
    stage = PyannoteStage(ScriptedPipeline(), device="cpu")
    audio = ramp(0.0, 10.0)
    first = stage.feed(audio[: 6 * RATE])
    # At 6 s: frozen up to 5 s, the last second provisional but present.
    assert [(s.start, s.end, s.speaker) for s in first] == [
        (0.0, 4.0, "Speaker A"),
        (4.0, 6.0, "Speaker B"),
    ]
    assert len(stage.feed(audio[6 * RATE : 7 * RATE])) == 2  # under one hop: no new decision
    later = stage.feed(audio[7 * RATE :])
    assert [(s.start, s.end, s.speaker) for s in later] == [
        (0.0, 4.0, "Speaker A"),
        (4.0, 9.0, "Speaker B"),
        (9.0, 10.0, "Speaker A"),
    ]


def test_P2_live_enrolled_voice_takes_its_name_and_can_be_forgotten() -> None:
    stage = PyannoteStage(ScriptedPipeline(), device="cpu")
    stage.enroll("Alice", ramp(5.0, 7.0))  # Y speaks there
    assert stage.enrolled == ["Alice"]
    names = {"X": "Speaker A", "Y": "Alice", "Z": "Speaker B"}
    assert _feed_all(stage, 0.5) == _expected(names, DURATION)

    # Batch mode names the same way.
    batch = stage.diarize(ramp(0.0, DURATION))
    assert [(s.start, s.end, s.speaker) for s in batch] == _expected(names, DURATION)

    stage.forget("Alice")
    names = {"X": "Speaker A", "Y": "Speaker B", "Z": "Speaker C"}
    assert _feed_all(stage, 0.5) == _expected(names, DURATION)


def test_P2_batch_names_follow_order_of_appearance() -> None:
    stage = PyannoteStage(ScriptedPipeline(), device="cpu")
    # From 4 s on, Y speaks first: Y is Speaker A in this recording.
    timeline = stage.diarize(ramp(4.0, DURATION))
    assert timeline.speakers == ["Speaker A", "Speaker B", "Speaker C"]
    assert next(iter(timeline)).start == pytest.approx(0.0)


def test_P2_overlap_only_voice_does_not_use_up_a_letter() -> None:
    # W is heard only under Y (5-6 s): in pyannote's overlapping diarization, never in the
    # exclusive one that words align to.
    stage = PyannoteStage(ScriptedPipeline(overlap=[(5.0, 6.0, "W")]), device="cpu")
    names = {"X": "Speaker A", "Y": "Speaker B", "Z": "Speaker C"}
    assert _feed_all(stage, 0.02) == _expected(names, DURATION)

    result = stage.diarize_detailed(ramp(0.0, DURATION))
    assert result.exclusive.speakers == ["Speaker A", "Speaker B", "Speaker C"]
    assert result.overlapping.speakers == ["Speaker A", "Speaker B", "Speaker D", "Speaker C"]
    assert set(result.embeddings) == {"Speaker A", "Speaker B", "Speaker C", "Speaker D"}
