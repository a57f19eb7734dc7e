"""Diarization: who spoke when (rules P1–P4, V7, V8).

Owns the diarization models (segmentation-3.0 and CAM++ on onnxruntime), the batch pipeline, the
diarization stages (the embedded stage, and the lazily imported pyannote
stage), enrollment of voices, and scoring (DER, RTTM, UEM). May import models, rooms and voice;
nothing below it imports diarization.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from voice.diarization_stage import DiarizationStage, SpeakerSegment, SpeakerTimeline

STAGE_KINDS = ("embedded", "pyannote")

__all__ = [
    "STAGE_KINDS",
    "DiarizationStage",
    "SpeakerSegment",
    "SpeakerTimeline",
    "enroll_voices",
    "load_stage",
    "parse_enrollments",
]


def parse_enrollments(items: list[str]) -> dict[str, Path]:
    """`NAME=clip.wav` items (from `--enroll`) as {name: clip path}; a malformed item, a repeated
    name or a missing file is a ValueError that names it."""
    out: dict[str, Path] = {}
    for item in items:
        name, sep, clip = item.partition("=")
        name = name.strip()
        if not sep or not name or not clip.strip():
            raise ValueError(f"--enroll wants NAME=clip.wav, got {item!r}")
        if name in out:
            raise ValueError(f"--enroll names {name!r} twice")
        path = Path(clip.strip()).expanduser()
        if not path.is_file():
            raise ValueError(f"--enroll {name}: no such file {path}")
        out[name] = path
    return out


def enroll_voices(stage: DiarizationStage, clips: Mapping[str, Path | Any]) -> None:
    """Enroll every {name: clip} on `stage` (V8): a clip is a path (read and resampled to the
    stage's rate) or mono float32 audio at that rate. Errors name the voice."""
    from voice.audio import read_audio_16k

    for name, clip in clips.items():
        audio = read_audio_16k(clip) if isinstance(clip, (str, Path)) else clip
        try:
            stage.enroll(name, audio)
        except ValueError as exc:
            raise ValueError(f"enrolling {name!r}: {exc}") from exc


def load_stage(
    kind: str = "embedded",
    *,
    num_speakers: int | None = None,
    max_speakers: int | None = None,
    min_speakers: int | None = None,
    pipeline: Any = None,
    hf_token: str | None = None,
    clustering: str | None = None,
    threads: int | None = None,
) -> DiarizationStage:
    """A diarization stage by kind: `embedded` (offline, CPU; P1) or `pyannote` (P2; needs the
    optional pyannote environment; `pipeline` is a Hugging Face id, a local directory or a
    pipeline object, `hf_token` the token for a hub id). `clustering`: the embedded stage's
    batch clustering method (`diarization.batch.CLUSTERING_METHODS`; default its settings').
    `threads`: the pyannote stage's torch threads on the CPU (`PyannoteStage`; None: torch's
    own setting)."""
    if kind == "embedded":
        if pipeline is not None or hf_token is not None or threads is not None:
            raise ValueError(
                "the embedded stage takes no pipeline, hf_token or threads (those are for pyannote)"
            )
        from diarization.batch import BatchSettings
        from diarization.embedded import EmbeddedStage

        batch_settings = BatchSettings()
        if clustering is not None:
            batch_settings = batch_settings.but(clustering=clustering)
        return EmbeddedStage(
            num_speakers=num_speakers,
            min_speakers=min_speakers,
            max_speakers=max_speakers,
            batch_settings=batch_settings,
        )
    if kind == "pyannote":
        if min_speakers is not None:
            raise ValueError("min_speakers is an option of the embedded stage only")
        if clustering is not None:
            raise ValueError("clustering is an option of the embedded stage only")
        try:
            from diarization.pyannote_stage import PyannoteStage  # type: ignore[import-not-found,unused-ignore]
        except ImportError as exc:
            raise RuntimeError(
                "the pyannote stage needs the optional pyannote environment "
                f"(pyannote.audio 4; see docs/diarization.md): {exc}"
            ) from exc
        stage: DiarizationStage = PyannoteStage(
            pipeline=pipeline,
            hf_token=hf_token,
            num_speakers=num_speakers,
            max_speakers=max_speakers,
            threads=threads,
        )
        return stage
    raise ValueError(f"unknown diarizer {kind!r}; choose one of {', '.join(STAGE_KINDS)}")
