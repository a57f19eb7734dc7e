"""The pyannote diarization stage (rule P2): pyannote.audio 4 pipelines behind the stage interface.

`PyannoteStage` implements `voice.diarization_stage.DiarizationStage` (P3) with a pyannote.audio 4
speaker-diarization pipeline, loaded through `Pipeline.from_pretrained` from either

- a Hugging Face model id (default `pyannote/speaker-diarization-community-1`, gated: it needs a
  token of an account that accepted its conditions), or
- a local directory laid out like that repository (`config.yaml` plus the model subfolders it
  names, e.g. `segmentation/pytorch_model.bin`, `embedding/pytorch_model.bin`,
  `plda/{xvec_transform.npz,plda.npz}`).

Both go through the same call, so a directory built offline (the tests build one from pyannote's
own model classes) exercises exactly the path a real checkpoint takes. `stage.source` says which
one was loaded.

Words are aligned to pyannote's `exclusive_speaker_diarization` (one speaker at a time, made for
transcription); `diarize` returns it, and `diarize_detailed` also returns the overlapping
diarization and one embedding per speaker. pyannote's labels (`SPEAKER_00` …) become enrolled
names (V8) or `Speaker A`, `Speaker B` … in order of first appearance (V3/V7).

Live audio (`feed`) runs the pipeline on a rolling window (`window_s`, every `hop_s` of new audio).
Each window's local labels are stitched onto the session's speakers first by time overlap with
what earlier windows decided over the same audio, then by cosine similarity of the window's
speaker embeddings to enrolled voiceprints and to each session speaker's centroid; only a voice
that matches nothing gets a new letter. Everything older than `commit_lag_s` before the newest
audio is frozen; the newest `commit_lag_s` is provisional and may still change on the next window.

Enrollment uses the pipeline's own speaker-embedding model (`pipeline._embedding`, the model that
feeds its clustering): an enrolled voiceprint is that model's embedding of the clip (never the
audio), matched by cosine similarity against the per-speaker centroids pyannote returns. A
pipeline without an embedding model cannot enroll (a clear error says so).

Telemetry is off: `PYANNOTE_METRICS_ENABLED=0` is forced before pyannote.audio is imported (its
metrics are read from that variable at every call). torch and pyannote.audio live in the optional
pyannote environment (`make pyannote-env`, docs/pyannote.md); they are imported only when a stage
is built, so importing this module never needs them.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
import threading
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from models.extras import MissingExtra
from voice.centroids import SpeakerCentroid, unit_or_none
from voice.diarization_stage import Audio, SpeakerSegment, SpeakerTimeline
from voice.turns import letter_label

log = logging.getLogger(__name__)

DEFAULT_PIPELINE = "pyannote/speaker-diarization-community-1"
"""The Hugging Face id loaded when no pipeline is given (gated: needs a token)."""

Vector = npt.NDArray[np.float32]

_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _telemetry_off() -> None:
    os.environ["PYANNOTE_METRICS_ENABLED"] = "0"


_telemetry_off()


def _import_pyannote() -> tuple[Any, Any]:
    """torch and pyannote.audio's Pipeline, or a clear error naming the environment to use."""
    _telemetry_off()
    try:
        import torch

        with warnings.catch_warnings():
            # Without FFmpeg, torchcodec cannot load and pyannote warns at import that it cannot
            # decode files. The stage never asks it to: it passes in-memory waveforms.
            warnings.filterwarnings("ignore", message=r"(?s).*torchcodec is not installed")
            from pyannote.audio import Pipeline
    except ImportError as exc:
        # the install hint every extra gives (models.extras), and where this one goes
        raise RuntimeError(
            f"{MissingExtra('pyannote', 'the pyannote stage')} in an environment of its own "
            "(pyannote.audio 4 needs its exact torch/torchaudio pair, not the main venv's "
            "torch): from a checkout, build it with `make pyannote-env` and run chorus with "
            f"that environment's python (see docs/pyannote.md). Import failed: {exc}"
        ) from exc
    return torch, Pipeline


@dataclass(frozen=True)
class PipelineSource:
    """Where a pipeline came from: a local directory, a Hugging Face id, or an object given."""

    kind: Literal["local", "hub", "object"]
    location: str

    def __str__(self) -> str:
        if self.kind == "local":
            return f"local directory {self.location}"
        if self.kind == "hub":
            return f"Hugging Face hub id {self.location} (downloaded, or from the local HF cache)"
        return f"pipeline object {self.location}"


def resolve_source(pipeline: str | os.PathLike[str]) -> PipelineSource:
    """Decide whether `pipeline` names a local directory (or config.yaml) or a hub id.

    An existing path is local. A string that looks like a path (absolute, `./`, `../`, `~`) but
    does not exist is an error, never a hub lookup. Anything else is a hub id (`owner/name`).
    """
    text = os.fspath(pipeline)
    if not text.strip():
        raise ValueError("pipeline must be a Hugging Face id or a local directory, got ''")
    path = Path(text).expanduser()
    if path.exists():
        if path.is_dir() and not (path / "config.yaml").is_file():
            raise FileNotFoundError(
                f"no config.yaml in {path}: a local pyannote pipeline directory holds config.yaml "
                "and the model subfolders it names (e.g. segmentation/, embedding/, plda/)"
            )
        return PipelineSource("local", str(path.resolve()))
    if isinstance(pipeline, os.PathLike) or text.startswith(("/", "./", "../", "~", ".\\")):
        raise FileNotFoundError(f"pipeline directory {text} does not exist")
    if text.count("/") != 1:
        raise ValueError(
            f"{text!r} is neither an existing directory nor a Hugging Face id of the form "
            "owner/name"
        )
    return PipelineSource("hub", text)


@dataclass
class PyannoteDiarization:
    """One pipeline run, with the stage's speaker names."""

    exclusive: SpeakerTimeline
    """pyannote's exclusive_speaker_diarization: one speaker at a time; words align to this (P2)."""
    overlapping: SpeakerTimeline
    """pyannote's speaker_diarization: overlapped speech kept (for DER with overlap scored)."""
    embeddings: dict[str, Vector] = field(default_factory=dict)
    """One embedding per speaker (pyannote's cluster centroids), L2-normalised."""


@dataclass
class _Run:
    """A pipeline run in pyannote's own labels, times in seconds from the stream/file start."""

    exclusive: list[tuple[float, float, str]]
    overlapping: list[tuple[float, float, str]]
    embeddings: dict[str, Vector]

    def labels_in_order(self) -> list[str]:
        seen: dict[str, None] = {}
        for _, _, label in sorted(self.exclusive) + sorted(self.overlapping):
            seen.setdefault(label, None)
        return list(seen)


def _mono(audio: Audio | npt.NDArray[Any], what: str) -> Audio:
    samples = np.asarray(audio)
    if samples.ndim == 2 and 1 in samples.shape:
        samples = samples.reshape(-1)
    if samples.ndim != 1:
        raise ValueError(f"{what}: expected mono audio (one dimension), got shape {samples.shape}")
    if not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"{what}: expected float samples in [-1, 1], got dtype {samples.dtype}")
    samples = samples.astype(np.float32, copy=False)
    if samples.size and not np.all(np.isfinite(samples)):
        raise ValueError(f"{what}: audio holds NaN or infinite samples")
    return samples


def _merge(segments: Iterable[SpeakerSegment], gap: float = 1e-3) -> list[SpeakerSegment]:
    """Sort, drop empty segments, and join touching segments of one speaker."""
    merged: list[SpeakerSegment] = []
    for seg in sorted(segments, key=lambda s: (s.start, s.end)):
        if seg.end - seg.start <= 1e-6:
            continue
        if merged and merged[-1].speaker == seg.speaker and seg.start - merged[-1].end <= gap:
            last = merged.pop()
            seg = SpeakerSegment(last.start, max(last.end, seg.end), seg.speaker)
        merged.append(seg)
    return merged


def _clip(
    segments: Iterable[tuple[float, float, str]], start: float, end: float
) -> list[tuple[float, float, str]]:
    out = []
    for s, e, label in segments:
        s, e = max(s, start), min(e, end)
        if e > s:
            out.append((s, e, label))
    return out


def _overlap(
    a: Sequence[tuple[float, float, str]], b: Sequence[SpeakerSegment]
) -> dict[tuple[str, str], float]:
    seconds: dict[tuple[str, str], float] = {}
    for s1, e1, label in a:
        for seg in b:
            o = min(e1, seg.end) - max(s1, seg.start)
            if o > 0:
                key = (label, seg.speaker)
                seconds[key] = seconds.get(key, 0.0) + o
    return seconds


def _assign(
    score: npt.NDArray[np.float64], minimum: npt.NDArray[np.float64]
) -> list[tuple[int, int]]:
    """One-to-one pairs (row, col) maximising `score`, keeping pairs with score >= minimum[row]."""
    if score.size == 0:
        return []
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-score)
    return [
        (int(r), int(c))
        for r, c in zip(rows, cols, strict=True)
        if score[r, c] >= minimum[r] and np.isfinite(score[r, c])
    ]


class PyannoteStage:
    """A pyannote.audio 4 pipeline as a diarization stage (P2, P3). See the module docstring."""

    sample_rate: int = 16_000

    # live state, set by reset()
    _buffer: Audio
    _buffer_start: int
    _fed: int
    _processed: int
    _commit_until: float
    _committed: list[SpeakerSegment]
    _tail: list[SpeakerSegment]
    _voices: dict[str, SpeakerCentroid]
    _letters: int

    def __init__(
        self,
        pipeline: str | os.PathLike[str] | Any | None = None,
        *,
        hf_token: str | None = None,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
        device: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        window_s: float = 10.0,
        hop_s: float = 2.0,
        commit_lag_s: float = 1.0,
        link_threshold: float = 0.5,
        enroll_threshold: float = 0.5,
        threads: int | None = None,
    ) -> None:
        """Load the pipeline.

        `pipeline`: a local directory (or its config.yaml), a Hugging Face id (default
        `pyannote/speaker-diarization-community-1`, with `hf_token` or the token huggingface_hub
        finds in HF_TOKEN / its login), or an already loaded pyannote Pipeline (shared between
        streams; calls to it are serialised). `num_speakers` / `max_speakers` are the defaults of
        `diarize` and bound each live window. `device`: "cpu", "cuda", … (default: cuda when
        available). Live mode: a `window_s` window every `hop_s` of new audio, frozen up to
        `commit_lag_s` before the newest audio. `link_threshold` / `enroll_threshold`: cosine
        similarities above which a window's speaker is the same as a session speaker / an
        enrolled voice (untuned defaults: no real weights are reachable here, docs/pyannote.md).
        `threads` (on the CPU): torch's intra-op threads for the whole process
        (`torch.set_num_threads`); None leaves torch's own setting (one per core). A server
        sets 1 (`[diarizer] torch_threads`): its streams share the cores, and once they are busy
        torch's OpenMP threads wait on descheduled peers — a rolling-window test took over 300 s
        with two threads and both cores busy, 16 s with one (docs/pyannote.md).
        """
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if num_speakers is not None and num_speakers < 1:
            raise ValueError(f"num_speakers must be >= 1, got {num_speakers}")
        if max_speakers is not None and max_speakers < 1:
            raise ValueError(f"max_speakers must be >= 1, got {max_speakers}")
        if hop_s <= 0 or commit_lag_s < 0 or window_s < hop_s + commit_lag_s + 1.0:
            raise ValueError(
                "live windows need hop_s > 0, commit_lag_s >= 0 and "
                f"window_s >= hop_s + commit_lag_s + 1 (got window_s={window_s}, hop_s={hop_s}, "
                f"commit_lag_s={commit_lag_s})"
            )
        torch, pipeline_class = _import_pyannote()
        self._torch = torch
        self.num_speakers = num_speakers
        self.max_speakers = max_speakers
        self.window_s = float(window_s)
        self.hop_s = float(hop_s)
        self.commit_lag_s = float(commit_lag_s)
        self.link_threshold = float(link_threshold)
        self.enroll_threshold = float(enroll_threshold)

        self.device = str(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if threads is not None and self.device == "cpu":
            # Before anything runs: torch keeps the number process-wide, and each thread takes
            # it up at its first parallel op (a thread that ran one already keeps its own).
            torch.set_num_threads(threads)
        if pipeline is not None and not isinstance(pipeline, (str, os.PathLike)):
            self.source = PipelineSource("object", type(pipeline).__name__)
            self.pipeline: Any = pipeline
        else:
            self.source = resolve_source(pipeline if pipeline is not None else DEFAULT_PIPELINE)
            self.pipeline = self._load(pipeline_class, self.source, hf_token, cache_dir)
        if hasattr(self.pipeline, "legacy"):
            self.pipeline.legacy = False  # we need DiarizeOutput, not a bare Annotation

        self.pipeline.to(torch.device(self.device))
        with _LOCKS_GUARD:
            self._lock = _LOCKS.setdefault(id(self.pipeline), threading.Lock())
        log.info("pyannote pipeline loaded from %s on %s", self.source, self.device)

        self._enrolled: dict[str, Vector] = {}
        self.reset()

    @staticmethod
    def _load(
        pipeline_class: Any,
        source: PipelineSource,
        hf_token: str | None,
        cache_dir: str | os.PathLike[str] | None,
    ) -> Any:
        try:
            if source.kind == "local":
                loaded = pipeline_class.from_pretrained(source.location)
            else:
                loaded = pipeline_class.from_pretrained(
                    source.location, token=hf_token, cache_dir=cache_dir
                )
        except Exception as exc:
            if source.kind == "hub":
                raise RuntimeError(
                    f"could not load the pyannote pipeline {source.location!r} from the Hugging "
                    f"Face hub ({type(exc).__name__}: {exc}). Accept its conditions at "
                    f"hf.co/{source.location} and pass hf_token= (or set HF_TOKEN); with no "
                    "network (HF_HUB_OFFLINE=1) it must already be in the HF cache, or pass a "
                    "local directory holding config.yaml and its models (docs/pyannote.md)"
                ) from exc
            raise RuntimeError(
                f"could not load the pyannote pipeline from {source}: {type(exc).__name__}: {exc}"
            ) from exc
        if loaded is None:
            raise RuntimeError(f"pyannote returned no pipeline for {source}")
        return loaded

    # ----------------------------------------------------------------------------- batch mode

    def diarize(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
    ) -> SpeakerTimeline:
        """The whole recording at once: pyannote's exclusive diarization, with stage names."""
        return self.diarize_detailed(
            audio, num_speakers=num_speakers, max_speakers=max_speakers
        ).exclusive

    def diarize_detailed(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
        hook: Callable[..., Any] | None = None,
    ) -> PyannoteDiarization:
        """Like `diarize`, with the overlapping diarization and the speaker embeddings too.

        `hook` is passed to the pipeline (pyannote calls it after each step, with progress).
        """
        samples = _mono(audio, "diarize")
        num = num_speakers if num_speakers is not None else self.num_speakers
        top = max_speakers if max_speakers is not None else self.max_speakers
        run = self._run(samples, 0.0, num_speakers=num, max_speakers=top, hook=hook)
        names = self._name_batch(run)
        return PyannoteDiarization(
            exclusive=SpeakerTimeline(
                _merge(SpeakerSegment(s, e, names[label]) for s, e, label in run.exclusive)
            ),
            overlapping=SpeakerTimeline(
                [SpeakerSegment(s, e, names[label]) for s, e, label in sorted(run.overlapping)]
            ),
            embeddings={names[label]: vec for label, vec in run.embeddings.items()},
        )

    def _name_batch(self, run: _Run) -> dict[str, str]:
        """Enrolled names where a speaker's centroid matches a voiceprint, else letters."""
        labels = run.labels_in_order()
        names = self._match_enrolled(labels, run.embeddings, set())
        letters = 0
        for label in labels:
            if label not in names:
                names[label] = letter_label(letters)
                letters += 1
        return names

    def _match_enrolled(
        self, labels: list[str], embeddings: dict[str, Vector], taken: set[str]
    ) -> dict[str, str]:
        voiceprints = [(n, v) for n, v in self._enrolled.items() if n not in taken]
        rows = [label for label in labels if label in embeddings]
        if not voiceprints or not rows:
            return {}
        score = np.array(
            [[float(embeddings[label] @ vec) for _, vec in voiceprints] for label in rows]
        )
        minimum = np.full(len(rows), self.enroll_threshold)
        return {rows[r]: voiceprints[c][0] for r, c in _assign(score, minimum)}

    def _run(
        self,
        samples: Audio,
        offset: float,
        *,
        num_speakers: int | None,
        max_speakers: int | None,
        hook: Callable[..., Any] | None = None,
    ) -> _Run:
        if samples.size == 0:
            return _Run([], [], {})
        torch = self._torch
        waveform = torch.from_numpy(np.ascontiguousarray(samples))[None]
        file = {"waveform": waveform, "sample_rate": self.sample_rate, "uri": "chorus"}
        kwargs: dict[str, Any] = {}
        if num_speakers is not None:
            kwargs["num_speakers"] = num_speakers
        if max_speakers is not None:
            kwargs["max_speakers"] = max_speakers
        if hook is not None:
            kwargs["hook"] = hook
        with self._lock:
            output = self.pipeline(file, **kwargs)
        exclusive = getattr(output, "exclusive_speaker_diarization", None)
        overlapping = getattr(output, "speaker_diarization", None)
        if exclusive is None or overlapping is None:
            raise TypeError(
                f"the pipeline returned {type(output).__name__}; the pyannote stage needs a "
                "pyannote.audio 4 speaker-diarization pipeline (DiarizeOutput with "
                "exclusive_speaker_diarization)"
            )
        duration = samples.size / self.sample_rate

        def turns(annotation: Any) -> list[tuple[float, float, str]]:
            out = []
            for segment, _, label in annotation.itertracks(yield_label=True):
                s = max(0.0, float(segment.start))
                e = min(duration, float(segment.end))
                if e > s:
                    out.append((offset + s, offset + e, str(label)))
            return out

        embeddings: dict[str, Vector] = {}
        raw = getattr(output, "speaker_embeddings", None)
        if raw is not None:
            for label, row in zip(overlapping.labels(), np.asarray(raw), strict=False):
                vec = unit_or_none(row)
                if vec is not None:
                    embeddings[str(label)] = vec
        return _Run(turns(exclusive), turns(overlapping), embeddings)

    # ------------------------------------------------------------------------------ live mode

    def feed(self, audio: Audio) -> SpeakerTimeline:
        """Append audio; the timeline decided so far (frozen part plus the provisional tail).

        The pipeline runs once per `hop_s` of new audio, on the `window_s` ending there; a large
        chunk is worked through hop by hop, so no audio is skipped.
        """
        samples = _mono(audio, "feed")
        if samples.size:
            self._buffer = np.concatenate([self._buffer, samples])
            self._fed += samples.size
        hop = round(self.hop_s * self.sample_rate)
        while self._fed - self._processed >= hop:
            self._live_step(self._processed + hop)
        return SpeakerTimeline(_merge(self._committed + self._tail))

    def _live_step(self, end_sample: int) -> None:
        width = round(self.window_s * self.sample_rate)
        start_sample = max(0, end_sample - width)
        window = self._buffer[start_sample - self._buffer_start : end_sample - self._buffer_start]
        start, end = start_sample / self.sample_rate, end_sample / self.sample_rate
        top = self.max_speakers if self.max_speakers is not None else self.num_speakers
        run = self._run(window, start, num_speakers=None, max_speakers=top)
        self._processed = end_sample
        names = self._link(run, start)

        new_commit = max(self._commit_until, end - self.commit_lag_s)
        fresh = _clip(run.exclusive, self._commit_until, end)  # what this window may still decide
        named = [(s, e, names[label]) for s, e, label in fresh]
        frozen = [SpeakerSegment(*t) for t in _clip(named, self._commit_until, new_commit)]
        self._committed = _merge(self._committed + frozen)
        self._tail = _merge(SpeakerSegment(*t) for t in _clip(named, new_commit, end))
        self._commit_until = new_commit

        # keep only what the next window can still reach
        keep_from = max(0, end_sample - width)
        if keep_from > self._buffer_start:
            self._buffer = self._buffer[keep_from - self._buffer_start :]
            self._buffer_start = keep_from

    def _link(self, run: _Run, start: float) -> dict[str, str]:
        """Map the window's labels onto session speakers: overlap, then voice, else new.

        Only labels heard in the part of the window that is not frozen yet are named (a label
        heard only in overlapped speech, or only in the frozen past, would never show and must
        not use up a letter).
        """
        fresh = _clip(run.exclusive, self._commit_until, math.inf)
        visible = {label for _, _, label in fresh}
        labels = [label for label in run.labels_in_order() if label in visible]
        names: dict[str, str] = {}
        decided = [s for s in self._committed + self._tail if s.end > start]
        if decided and labels:
            shared_end = max(s.end for s in decided)
            local = _clip(run.exclusive, start, shared_end)
            seconds = _overlap(local, decided)
            voices = list(dict.fromkeys(s.speaker for s in decided))
            score = np.array([[seconds.get((lb, v), 0.0) for v in voices] for lb in labels])
            own = {lb: sum(e - s for s, e, x in local if x == lb) for lb in labels}
            minimum = np.array([max(0.2, 0.3 * own[lb]) for lb in labels])
            for r, c in _assign(score, minimum):
                names[labels[r]] = voices[c]

        taken = set(names.values())
        rest = [lb for lb in labels if lb not in names]
        for label, name in self._match_enrolled(rest, run.embeddings, taken).items():
            names[label] = name
            taken.add(name)
        rest = [lb for lb in labels if lb not in names and lb in run.embeddings]
        candidates = [
            (n, v.centroid)
            for n, v in self._voices.items()
            if n not in taken and not v.enrolled and v.centroid is not None
        ]
        if rest and candidates:
            score = np.array(
                [[float(run.embeddings[lb] @ c) for _, c in candidates] for lb in rest]
            )
            for r, c in _assign(score, np.full(len(rest), self.link_threshold)):
                names[rest[r]] = candidates[c][0]

        for label in labels:
            if label not in names:
                names[label] = letter_label(self._letters)
                self._letters += 1
            name = names[label]
            voice = self._voices.setdefault(
                name, SpeakerCentroid(name, enrolled=name in self._enrolled)
            )
            voice.add(run.embeddings.get(label))
        return names

    # ----------------------------------------------------------------- enrollment and reset

    def enroll(self, name: str, audio: Audio) -> None:
        """Register `name`'s voiceprint: the pipeline embedding model's embedding of `audio`."""
        if not name or not name.strip():
            raise ValueError("enroll: the name must not be empty")
        samples = _mono(audio, f"enroll {name!r}")
        model = getattr(self.pipeline, "_embedding", None)
        if model is None:
            raise RuntimeError(
                f"the pipeline loaded from {self.source} exposes no speaker-embedding model "
                "(pipeline._embedding), so it cannot enroll voices"
            )
        torch = self._torch
        waveform = torch.from_numpy(np.ascontiguousarray(samples))[None, None]
        rate = int(getattr(model, "sample_rate", self.sample_rate))
        if rate != self.sample_rate:
            torchaudio = importlib.import_module("torchaudio")
            waveform = torchaudio.functional.resample(waveform, self.sample_rate, rate)
        minimum = int(getattr(model, "min_num_samples", 0))
        if waveform.shape[-1] < max(minimum, 1):
            raise ValueError(
                f"enroll {name!r}: the clip is too short for the embedding model "
                f"({waveform.shape[-1]} samples, needs {minimum})"
            )
        with self._lock:
            embedding = model(waveform)
        vector = unit_or_none(np.asarray(embedding)[0])
        if vector is None:
            raise ValueError(f"enroll {name!r}: the embedding model gave no usable embedding")
        self._enrolled[name] = vector

    def forget(self, name: str) -> None:
        """Drop an enrolled voiceprint; later segments of that voice get a letter again."""
        if name not in self._enrolled:
            raise KeyError(f"no enrolled voice named {name!r}")
        del self._enrolled[name]
        voice = self._voices.get(name)
        if voice is not None and voice.enrolled:
            del self._voices[name]

    @property
    def enrolled(self) -> list[str]:
        return list(self._enrolled)

    def reset(self) -> None:
        """Forget the live stream (not the enrolled voices)."""
        self._buffer = np.zeros(0, dtype=np.float32)
        self._buffer_start = 0
        self._fed = 0
        self._processed = 0
        self._commit_until = 0.0
        self._committed = []
        self._tail = []
        self._voices = {}
        self._letters = 0
