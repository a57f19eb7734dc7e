"""Live diarization: rolling windows through segmentation-3.0 and CAM++, batched across streams.

Two parts, shaped by where the cost is:

- `ModelService` owns the models and its worker threads (`workers`, default 2: one worker's
  model calls use one core, and a 2-core server's stage needs more than one from about 16
  streams; issue 31). Streams hand it their newest windows (`analyse`, a blocking call made from
  the stream's own worker thread, never from the event loop); a free worker takes its share of
  the windows waiting in its queue (all of them when the other workers are busy, half of them
  when two are free), runs ONE segmentation call over them and ONE CAM++ trunk call over
  those that need embeddings, pools per local speaker in numpy, and answers each stream. While a
  batch runs the next one gathers, so the model cost per stream falls as streams grow (per-call
  overhead paid once per batch). A stream has one request out at a time, so its windows are
  answered in order whichever worker takes them. Counters (`calls`) say how many model calls and
  windows it served, and how much CPU its workers used.
  Memory is bounded whatever the load: a model call takes at most `model_batch` windows (a
  stream that fell behind hands over many windows at once; one call over 40 windows kept
  417 MiB, since onnxruntime's arena keeps its peak for good: the server's soak grew 33 MiB a
  minute), the sessions run without the arena, and the worker gives freed heap pages
  back (`voice.embedding.release_freed_memory`) at most once per `trim_every_s`. Per-window CPU
  is the same from 2 windows per call up (docs/benchmarks.md, "Soak").
- `LiveDiarizer` is one stream's stage (`voice.diarization_stage.DiarizationStage`): every
  `step_s` of audio it sends the last `window_s` seconds, then
  1. maps the window's local speakers onto the stream's global speakers: by CAM++ embedding
     against the speakers' centroids (diart-style incremental clustering: a constrained
     one-to-one assignment (Hungarian) on cosine distance; a local speaker farther than
     `delta_new` from every centroid opens a new speaker; a centroid absorbs embeddings of
     speakers that talked alone long enough, `rho_update`) — or, on windows that need no
     embedding, by their activity overlap with the previous window over the audio they share
     (pyannote's stitching), so CAM++ runs only every `embed_every` windows or when a voice
     appears that the previous window did not hear;
  2. adds the window's per-frame activity of each global speaker into an aggregation grid
     (segmentation frames, 16.875 ms) and decides every frame older than `latency_s` before the
     newest window's end: a speaker is active where at least half the votes of the windows that
     covered the frame said so. A window's vote on a frame weighs what it heard after the frame
     (`context_ramp_s`): at a window's right edge segmentation-3.0 often gives a new voice's
     first words to the voice before, and the windows that heard more of the new voice
     outvote it (live DER 18.9 -> 16.9 %, every leave-one-file-out fold choosing it;
     docs/benchmarks.md). Two speakers active on one frame is overlapped speech: both get it.
  Decided frames never change. A frame is decided between `latency_s` and `latency_s + step_s`
  after its audio arrived, plus the model time. Under overload the server may `stretch` the
  step (fewer windows per second of audio, issue 31) and set it back.

Enrolled voices (V8) are centroids from the start, named; other voices get `Speaker A`, `B` …
in order of creation (V7). Voiceprints are CAM++ embeddings on the same trunk and pooling.
The voice directory's people (issue 27, `anchor`) are centroids from the start too, but unnamed:
each takes the next letter when first heard, and `speaker_prints` shows each voice's centroid of
this stream's embeddings alone (never the known print it started from), which the server
compares with the directory's prints to name it.
"""

from __future__ import annotations

import bisect
import contextlib
import queue
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from diarization.live_models import LiveModels, Precision, default_live_models
from diarization.models import FRAME_DURATION
from voice.centroids import SpeakerCentroid as _Speaker
from voice.centroids import unit_or_none
from voice.diarization_stage import Audio, SpeakerSegment, SpeakerTimeline, StagePrints
from voice.embedding import fbank, release_freed_memory
from voice.turns import letter_label

FloatArray = npt.NDArray[np.float32]
Activity = npt.NDArray[np.uint8]

SAMPLE_RATE = 16_000
FRAME_SAMPLES = 270
"""segmentation-3.0's frame step in samples (16.875 ms): the aggregation grid."""
FRAME_OFFSET_S = FRAME_DURATION / 2 - FRAME_SAMPLES / SAMPLE_RATE / 2
"""Grid cell k spans [k, k + 1) frame steps after this offset (frames are centred in their
receptive field)."""
LOCAL_SPEAKERS = 3
CONTEXT_FLOOR = 0.05
"""The weight of a vote cast with no right context at all (`LiveSettings.context_ramp_s`)."""
_NO_VOTES = 1e-6
"""Divides a cell's votes when no window covered it (its votes are 0: it stays inactive)."""
FBANK_SHIFT = 160
FBANK_LENGTH = 400


@dataclass(frozen=True)
class LiveSettings:
    """The live pipeline's numbers. `delta_new` and `embed_every` were chosen by leave-one-file-out
    over the AMI excerpts + pyannote sample and the LibriSpeech far renders; the window, step and
    latency are the issue's starting point, with the latency set so that p90 decision latency
    stays under 1.5 s (docs/benchmarks.md, "Live diarization")."""

    window_s: float = 5.0
    step_s: float = 0.5
    latency_s: float = 0.9
    """Frames are decided once the newest window ends this long after them (>= step_s)."""
    delta_new: float = 0.7
    """Cosine distance to every centroid above which a local speaker is a new voice (0.6 until
    2026-12-06; with the int8 trunk 16 of the 18 leave-one-file-out folds chose 0.7, and the
    voice directory's held-out folds name more and no new voice more: docs/benchmarks.md)."""
    rho_update: float = 0.2
    """Share of the window a local speaker must fill alone for its embedding to join a centroid."""
    new_min_alone_s: float = 0.0
    """A voice far from every centroid opens a new speaker only if it talks alone this long in
    the window (a short or overlapped stretch gives an unreliable embedding: it joins the nearest
    speaker instead)."""
    min_active_s: float = 0.3
    """A local speaker heard less than this in a window is embedded/assigned only if stitching
    by overlap finds it (too little speech for a reliable embedding)."""
    embed_every: int = 2
    """Windows between embeddings when overlap stitching accounts for every local speaker."""
    max_speakers: int = 20
    context_ramp_s: float = 2.0
    """How a window's vote on a frame is weighed by the audio it heard after the frame: in full
    from this many seconds of right context, less (linearly, down to `CONTEXT_FLOOR`) the nearer
    the frame is to the window's end, where the segmentation model has not yet heard how the
    voice goes on. 0: every covering window votes alike."""

    def __post_init__(self) -> None:
        if not (0 < self.step_s <= self.window_s):
            raise ValueError(f"need 0 < step_s <= window_s, got {self.step_s}, {self.window_s}")
        if not (self.step_s <= self.latency_s <= self.window_s):
            raise ValueError(
                f"need step_s <= latency_s <= window_s, got latency_s={self.latency_s}"
            )
        if self.embed_every < 1 or self.max_speakers < 1:
            raise ValueError("embed_every and max_speakers must be at least 1")
        if round(self.window_s * SAMPLE_RATE) < SAMPLE_RATE:
            raise ValueError("window_s must be at least 1 s")
        if self.context_ramp_s < 0:
            raise ValueError(f"context_ramp_s must be >= 0, got {self.context_ramp_s}")


# --------------------------------------------------------------------------- the model service


@dataclass
class WindowJob:
    """One window of one stream, and what the worker needs to decide whether to embed it."""

    audio: FloatArray
    features: FloatArray | None
    """The window's CAM++ fbank frames (not mean-normalised), cut from the stream's running
    features (computed once per 10 ms of audio, not once per window); None: computed here."""
    embed_every: int
    """Embed at least every this many windows of the stream."""
    min_frames: int
    shift_frames: int
    """Frames between this window's start and the previous window's (for overlap stitching)."""


@dataclass
class WindowResult:
    activity: Activity
    """(frames, 3) local-speaker activity in {0, 1}."""
    embeddings: FloatArray | None
    """(3, 192) per local speaker (NaN rows: inactive or too short), or None: not embedded."""


@dataclass
class ServiceCalls:
    """What the service did: model calls, windows served, CPU seconds of its worker thread."""

    segmentation_calls: int = 0
    embedding_calls: int = 0
    windows: int = 0
    embedded_windows: int = 0
    batches: int = 0
    cpu_s: float = 0.0
    trims: int = 0
    """Heap trims (`voice.embedding.release_freed_memory`) after a round."""
    trim_cpu_s: float = 0.0


class WindowsAbandoned(RuntimeError):
    """The stream abandoned its queued windows (`LiveDiarizer.abandon`): nothing computed."""


@dataclass
class _Request:
    jobs: list[WindowJob]
    previous: Activity | None
    since_embedding: int
    abandoned: threading.Event | None = None
    """Set by the stream when it leaves the stage: the worker skips the request."""
    done: threading.Event = field(default_factory=threading.Event)
    results: list[WindowResult] = field(default_factory=list)
    error: BaseException | None = None


def stitch(previous: Activity, current: Activity, shift: int, min_frames: int) -> dict[int, int]:
    """Match the current window's local speakers to the previous window's by their activity over
    the frames both windows cover (the current window starts `shift` frames later): one-to-one,
    each match covering at least half of BOTH speakers' shared activity and `min_frames` (a voice
    that the previous window merged into another speaker's stretch is not a continuation)."""
    shared = min(previous.shape[0] - shift, current.shape[0])
    if shared <= 0:
        return {}
    prev = previous[shift : shift + shared].astype(np.float32)
    cur = current[:shared].astype(np.float32)
    overlap = cur.T @ prev  # (current local, previous local)
    from scipy.optimize import linear_sum_assignment

    rows, cols = linear_sum_assignment(-overlap)
    active_cur = cur.sum(axis=0)
    active_prev = prev.sum(axis=0)
    return {
        int(r): int(c)
        for r, c in zip(rows, cols, strict=True)
        if overlap[r, c] >= max(min_frames, 0.5 * active_cur[r], 0.5 * active_prev[c])
    }


def needs_embedding(
    previous: Activity | None, current: Activity, shift: int, min_frames: int
) -> bool:
    """Whether overlap stitching leaves an active local speaker of `current` unaccounted for."""
    active = [j for j in range(current.shape[1]) if current[:, j].sum() >= min_frames]
    if not active:
        return False
    if previous is None:
        return True
    matched = stitch(previous, current, shift, min_frames)
    return any(j not in matched for j in active)


class ModelService:
    """Batches many streams' windows into one segmentation and one embedding call (module
    docstring). Thread-safe; the worker thread starts on first use and stops on `close`."""

    def __init__(
        self,
        models: LiveModels | None = None,
        *,
        max_batch: int = 64,
        model_batch: int = 8,
        trim_every_s: float = 1.0,
        workers: int = 2,
    ) -> None:
        """`max_batch`: windows gathered per round; `model_batch`: windows per model call (the
        memory bound); `trim_every_s`: least seconds between heap trims (0: after every round);
        `workers`: threads running rounds at once (module docstring)."""
        if model_batch < 1 or max_batch < 1 or workers < 1:
            raise ValueError("max_batch, model_batch and workers must be at least 1")
        self._models = models
        self.workers = workers
        self._calls_lock = threading.Lock()
        self._gathering = threading.Lock()
        self.max_batch = max_batch
        self.model_batch = model_batch
        self.trim_every_s = trim_every_s
        self._last_trim = 0.0
        self.calls = ServiceCalls()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._start_lock = threading.Lock()
        self._closed = False
        self._gate = threading.Event()
        self._gate.set()
        self._pending = 0
        self._busy = 0
        """Workers serving a round now (under `_pending_changed`)."""
        self._pending_changed = threading.Condition()

    @property
    def models(self) -> LiveModels:
        with self._start_lock:
            if self._models is None:
                self._models = default_live_models()
            return self._models

    def voiceprint(self, audio: Audio) -> FloatArray:
        """A CAM++ voiceprint on the live trunk and pooling (enrollment; runs in the caller)."""
        return self.models.voiceprint(audio)

    @property
    def model_id(self) -> str:
        """The id of the model its voiceprints come from (the exported trunk: the checkpoint's
        digest and the export version), stored with every remembered print (issue 27)."""
        return self.models.trunk_path.stem

    def analyse(
        self,
        jobs: Sequence[WindowJob],
        previous: Activity | None = None,
        since_embedding: int = 0,
        abandoned: threading.Event | None = None,
    ) -> list[WindowResult]:
        """Segment (and, where needed, embed) consecutive windows of ONE stream, batched with
        whatever other streams are asking for. Blocks until done; call off the event loop.
        `abandoned` set before the worker takes the request: `WindowsAbandoned`, nothing run
        (a stream the server took off the stage must not keep the others waiting)."""
        if not jobs:
            return []
        self._ensure_started()
        request = _Request(list(jobs), previous, since_embedding, abandoned)
        with self._pending_changed:
            self._pending += len(request.jobs)
            self._queue.put(request)
            self._pending_changed.notify_all()
        request.done.wait()
        if isinstance(request.error, WindowsAbandoned):
            raise request.error
        if request.error is not None:
            raise RuntimeError(f"live diarization model call failed: {request.error}") from request.error
        return request.results

    @property
    def contended(self) -> bool:
        """Whether windows of other streams are queued now, waiting for a worker (read by a
        stream before it hands over its own): a stream behind its stage then catches up
        (`LiveDiarizer.catch_up`) instead of adding its backlog to theirs. A stream alone (a
        device sending what it buffered, the service otherwise idle) is never contended."""
        with self._pending_changed:
            return self._pending > 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """While held, the worker starts no new batch: requests queue up and are answered
        together afterwards (gathering a burst of streams; tests use it to batch on purpose)."""
        self._gate.clear()
        try:
            yield
        finally:
            self._gate.set()

    def wait_pending(self, windows: int, timeout: float = 60.0) -> bool:
        """Wait until at least `windows` windows are queued and not yet taken by the worker."""
        with self._pending_changed:
            return self._pending_changed.wait_for(lambda: self._pending >= windows, timeout)

    def close(self) -> None:
        """Stop the workers (requests already queued are answered first)."""
        with self._start_lock:
            self._closed = True
            threads, self._threads = self._threads, []
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()

    def _ensure_started(self) -> None:
        _ = self.models  # load before the workers need it (errors surface in the caller)
        with self._start_lock:
            if self._closed:
                raise RuntimeError("the live diarization model service is closed")
            if not self._threads:
                self._threads = [
                    threading.Thread(target=self._run, name=f"chorus-live-diarization-{k}",
                                     daemon=True)
                    for k in range(self.workers)
                ]
                for thread in self._threads:
                    thread.start()

    def _run(self) -> None:
        while True:
            with self._gathering:  # one worker gathers at a time
                batch, stop = self._gather()
                with self._pending_changed:  # busy before the next worker sizes its share
                    self._busy += 1
            try:
                self._serve_kept(batch)
            finally:
                with self._pending_changed:
                    self._busy -= 1
            if stop:
                return

    def _serve_kept(self, batch: list[_Request]) -> None:
        kept = []
        for request in batch:
            if request.abandoned is not None and request.abandoned.is_set():
                request.error = WindowsAbandoned("the stream left the stage")
                request.done.set()
            else:
                kept.append(request)
        if kept:
            self._serve(kept)

    def _gather(self) -> tuple[list[_Request], bool]:
        """The next round: the first request waiting (once the gate is open), and the others
        queued behind it up to this worker's share of the windows waiting (split evenly over the
        workers not serving a round, at most `max_batch`); True when this worker is to stop.
        Taking every window waiting left the other worker idle when all streams' windows came
        due together: a burst of 24 streams' windows ran on one core (issue 31)."""
        first = self._queue.get()
        if first is None:
            return [], True
        self._gate.wait()
        with self._pending_changed:
            free = max(1, self.workers - self._busy)
            share = min(self.max_batch, -(-self._pending // free))
        batch = [first]
        windows = len(first.jobs)
        stop = False
        while windows < share:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:  # one stop per worker: this one's; the others' stay queued
                stop = True
                break
            batch.append(more)
            windows += len(more.jobs)
        with self._pending_changed:
            self._pending -= windows
        return batch, stop

    def _serve(self, batch: list[_Request]) -> None:
        started = time.thread_time()
        try:
            self._compute(batch)
        except BaseException as exc:  # every waiting stream hears of it; the worker goes on
            for request in batch:
                request.error = exc
        finally:
            with self._calls_lock:
                self.calls.cpu_s += time.thread_time() - started
                self.calls.batches += 1
            for request in batch:
                request.done.set()
        now = time.monotonic()
        with self._calls_lock:  # after answering: no stream waits on it
            trim = now - self._last_trim >= self.trim_every_s
            if trim:
                self._last_trim = now
        if trim:
            trim_started = time.thread_time()
            if release_freed_memory():
                with self._calls_lock:
                    self.calls.trims += 1
                    self.calls.trim_cpu_s += time.thread_time() - trim_started

    def _compute(self, batch: list[_Request]) -> None:
        models = self.models
        segmentation_calls = embedding_calls = 0
        by_length: dict[int, list[tuple[int, int]]] = {}
        for r, request in enumerate(batch):
            for j, job in enumerate(request.jobs):
                by_length.setdefault(job.audio.size, []).append((r, j))
        activity: dict[tuple[int, int], Activity] = {}
        for same_length in by_length.values():  # one call per window length (all streams: one)
            for items in self._model_calls(same_length):
                stacked = np.stack([batch[r].jobs[j].audio for r, j in items])
                decided = models.segment(stacked)
                segmentation_calls += 1
                for k, key in enumerate(items):
                    activity[key] = decided[k]
        # which windows to embed: decided in stream order (stitching needs the previous window)
        to_embed: list[tuple[int, int]] = []
        for r, request in enumerate(batch):
            previous = request.previous
            since = request.since_embedding
            for j, job in enumerate(request.jobs):
                current = activity[(r, j)]
                embed = since + 1 >= job.embed_every or needs_embedding(
                    previous, current, job.shift_frames, job.min_frames
                )
                if embed and current.sum() > 0:
                    to_embed.append((r, j))
                    since = 0
                else:
                    since += 1
                previous = current
        embeddings: dict[tuple[int, int], FloatArray] = {}
        groups: dict[int, list[tuple[int, int]]] = {}
        for key in to_embed:
            groups.setdefault(batch[key[0]].jobs[key[1]].audio.size, []).append(key)
        for same_length in groups.values():
            for items in self._model_calls(same_length):
                feats = [batch[r].jobs[j].features for r, j in items]
                frames = models.trunk(np.stack([
                    f if f is not None else fbank(batch[r].jobs[j].audio)
                    for f, (r, j) in zip(feats, items, strict=True)
                ]))
                embedding_calls += 1
                for k, key in enumerate(items):
                    embeddings[key] = models.pool(frames[k], _pooling_masks(activity[key]))
        with self._calls_lock:
            self.calls.segmentation_calls += segmentation_calls
            self.calls.embedding_calls += embedding_calls
            self.calls.windows += sum(len(r.jobs) for r in batch)
            self.calls.embedded_windows += len(to_embed)
        for r, request in enumerate(batch):
            request.results = [
                WindowResult(activity[(r, j)], embeddings.get((r, j)))
                for j in range(len(request.jobs))
            ]

    def _model_calls(self, items: list[tuple[int, int]]) -> Iterator[list[tuple[int, int]]]:
        """`items` in model calls of at most `model_batch` windows each."""
        for lo in range(0, len(items), self.model_batch):
            yield items[lo : lo + self.model_batch]


def _pooling_masks(activity: Activity) -> FloatArray:
    """Per local speaker: its frames without overlap (pyannote's `embedding_exclude_overlap`),
    or all its frames when too few are clean."""
    clean = activity * (activity.sum(axis=1, keepdims=True) == 1)
    masks = np.where((clean.sum(axis=0) >= 10)[:, None], clean.T, activity.T).astype(np.float32)
    return masks


def catch_up_ends(ends: Sequence[int], last_end: int, max_gap: int) -> list[int]:
    """The windows a stream that fell behind runs (`LiveDiarizer.catch_up`), of the window ends
    `ends` (ascending, one step apart) due at one feed, after a window that ended at `last_end`:
    the newest, and going back only as many as keep every window within `max_gap` samples of
    the one before it (the first one of `last_end`), each as far back as that allows. Every
    frame is still covered by a window and stitching still finds each voice in the overlap;
    what is skipped is the votes of the windows in between. With `max_gap` at least the step,
    nothing due within `max_gap` of `last_end` costs more than the newest window."""
    if not ends:
        return []
    kept = [ends[-1]]
    upto = len(ends) - 1  # candidates: ends[:upto]
    while upto > 0 and kept[-1] - last_end > max_gap:
        j = bisect.bisect_left(ends, kept[-1] - max_gap, 0, upto)
        j = min(j, upto - 1)  # none within max_gap: the nearest one still narrows the gap
        kept.append(ends[j])
        upto = j
    return kept[::-1]


# --------------------------------------------------------------------------- the stream's stage


class LiveDiarizer:
    """One stream's live diarization on a shared `ModelService` (module docstring).

    Implements the live half of `DiarizationStage` (`feed`, `enroll`, `forget`, `reset`);
    `diarize` (batch) belongs to the embedded stage, which delegates `feed` here."""

    sample_rate = SAMPLE_RATE
    _speakers: list[_Speaker]
    _previous: Activity | None
    _previous_map: dict[int, int]
    _segments: list[SpeakerSegment]
    _open: dict[int, int]
    _runs: dict[int, list[int]]

    def __init__(
        self,
        service: ModelService | None = None,
        settings: LiveSettings | None = None,
        *,
        max_speakers: int | None = None,
    ) -> None:
        self.service = service or default_service()
        self.settings = settings or LiveSettings()
        self.max_speakers = max_speakers or self.settings.max_speakers
        self._window = round(self.settings.window_s * SAMPLE_RATE)
        self._step = round(self.settings.step_s * SAMPLE_RATE)
        self._latency = round(self.settings.latency_s * SAMPLE_RATE)
        self._min_frames = max(1, round(self.settings.min_active_s * SAMPLE_RATE / FRAME_SAMPLES))
        self._enrolled: dict[str, FloatArray] = {}
        self._lock = threading.Lock()
        self._abandoned = threading.Event()
        """Set by `abandon` (any thread, no lock): queued windows are skipped until `reset`."""
        self.record_delays = False
        """When True, `decision_delays` collects, per decided speech frame, the seconds of stream
        audio between the frame's end and the end of the window that decided it (the audio-time
        part of the decision latency; add the model time for the wall-clock latency). Off by
        default: a long stream would grow the list without bound."""
        self.decision_delays: list[float] = []
        self._model_id: str | None = None
        self._prints = StagePrints("")
        self._anchors: dict[str, FloatArray] = {}
        """Known voices the clustering starts from (`anchor`), by key; applied."""
        self._anchors_next: dict[str, FloatArray] | None = None
        """Set from any thread by `anchor`; applied at the next feed, under the lock."""
        self._catch_up = False
        """`catch_up`: a feed behind the stream, the service contended, runs only the windows
        `catch_up_ends` keeps."""
        self.skipped_windows = 0
        """Windows due that a catching-up feed did not run (since the stage was made)."""
        self.reset()

    # -- enrollment ------------------------------------------------------------------------

    @property
    def enrolled(self) -> list[str]:
        return list(self._enrolled)

    def enroll(self, name: str, audio: Audio) -> None:
        name = name.strip()
        if not name:
            raise ValueError("an enrolled voice needs a name")
        voiceprint = self.service.voiceprint(audio)
        with self._lock:
            self._enrolled[name] = voiceprint
            for speaker in self._speakers:
                if speaker.enrolled and speaker.name == name:
                    speaker.total = voiceprint.copy()
                    break
            else:
                self._speakers.append(_Speaker(name, voiceprint.copy(), enrolled=True))

    def forget(self, name: str) -> None:
        with self._lock:
            if name not in self._enrolled:
                raise KeyError(f"no enrolled voice named {name!r}")
            del self._enrolled[name]
            # the stream's speaker stays (its index names decided segments and pending frames),
            # but it has no voiceprint any more: it matches nobody from now on
            for speaker in self._speakers:
                if speaker.enrolled and speaker.name == name:
                    speaker.enrolled = False
                    speaker.total = None

    def anchor(self, prints: dict[str, FloatArray]) -> None:
        """Known voices (the voice directory's people, by key: unit prints of this stage's model)
        the clustering starts from, as it starts from enrolled voices, so two known voices are
        kept apart from the first window. Unlike an enrolled voice an anchor is not named: it
        takes a letter when it is first heard, and its print in `speaker_prints` is of this
        stream's audio alone (what the voice directory compares with the person's prints). A
        key no longer given turns its speaker into a plain voice of this stream (its known print
        taken out of its centroid). Safe from any thread: applied with the next feed."""
        self._anchors_next = {key: v for key, v in ((k, unit_or_none(p)) for k, p in prints.items())
                              if v is not None}

    def _add_anchors(self, anchors: dict[str, FloatArray]) -> None:
        present = set(self._anchor_of.values())
        for key, vector in anchors.items():
            if key not in present:
                self._speakers.append(_Speaker("", vector.copy()))
                self._anchor_of[len(self._speakers) - 1] = key

    def _apply_anchors(self) -> None:
        pending, self._anchors_next = self._anchors_next, None
        if pending is None:
            return
        self._anchors = pending
        for index, key in list(self._anchor_of.items()):
            if key not in pending:  # forgotten: only this stream's audio is left of it
                del self._anchor_of[index]
                heard = self._heard.get(index)
                self._speakers[index].total = None if heard is None else heard.copy()
        self._add_anchors(pending)

    # -- live ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the stream (not the enrolled voices)."""
        with self._lock:
            self._audio = np.zeros(0, dtype=np.float32)
            self._audio_start = 0  # stream sample index of self._audio[0]
            self._abandoned.clear()
            self._fed = 0
            self._step = round(self.settings.step_s * SAMPLE_RATE)  # a stretch ends with its stream
            self._next_end = self._step
            self._last_end = 0  # end of the last window processed
            self._fbank = np.zeros((0, 80), dtype=np.float32)  # the stream's running fbank
            self._fbank_first = 0  # stream frame index of self._fbank[0]
            self._fbank_next = 0  # first stream frame not computed yet
            self._speakers = [_Speaker(n, v.copy(), enrolled=True) for n, v in self._enrolled.items()]
            self._letters = 0
            if self._anchors_next is not None:  # a new stream starts from the newest anchors
                self._anchors, self._anchors_next = self._anchors_next, None
            self._heard: dict[int, FloatArray] = {}  # speaker -> sum of this stream's embeddings
            self._anchor_of: dict[int, str] = {}  # speaker -> the anchor (known voice) it started as
            self._add_anchors(self._anchors)
            self._previous: Activity | None = None
            self._previous_map: dict[int, int] = {}
            self._since_embedding = self.settings.embed_every
            self._acc = np.zeros((0, 0), dtype=np.float32)  # (cells, speakers) activity sums
            self._count = np.zeros(0, dtype=np.float32)  # windows that covered each cell
            self._acc_base = 0  # grid cell index of _acc[0]
            self._decided_until = 0  # first undecided grid cell
            self._segments: list[SpeakerSegment] = []
            self._open: dict[int, int] = {}  # speaker -> index in _segments of its open run
            self._runs = {}  # speaker -> indices in _segments, in time order
            self._speech: dict[int, float] = {}  # speaker -> seconds decided
            self.decision_delays = []
            self._prints = StagePrints("")

    def feed(self, audio: Audio) -> SpeakerTimeline:
        samples = _checked(audio)
        with self._lock:
            if samples.size:
                self._audio = np.concatenate([self._audio, samples])
                self._fed += samples.size
            ends: list[int] = []
            end = self._next_end
            while end <= self._fed:
                ends.append(end)
                end += self._step
            if self._catch_up and len(ends) > 1 and self.service.contended:
                due = len(ends)
                ends = catch_up_ends(ends, self._last_end, self._window // 2)
                self.skipped_windows += due - len(ends)
            if ends:
                self._process(ends)
            return SpeakerTimeline(list(self._segments))

    def abandon(self) -> None:
        """The stream leaves the stage (overload): windows it has queued on the service and not
        started are skipped (its `feed` raises `WindowsAbandoned`), and so are later ones, until
        `reset`. Safe from any thread, without the stage's lock (a feed may hold it)."""
        self._abandoned.set()

    def stretch(self, factor: float) -> None:
        """Space the windows `factor` (>= 1) times `step_s` apart from the next one on, on the
        10 ms fbank grid: fewer segmentation and CAM++ calls per second of audio while the
        machine cannot keep up (each frame is still covered by `window_s / step` windows, and
        decided up to one step later); 1.0 is the normal step again."""
        if not factor >= 1.0:
            raise ValueError(f"stretch factor must be >= 1, got {factor}")
        step = max(FBANK_SHIFT, round(self.settings.step_s * factor * SAMPLE_RATE / FBANK_SHIFT)
                   * FBANK_SHIFT)
        with self._lock:  # the next window stays where it was due (its audio is kept)
            self._step = min(step, self._window)

    def catch_up(self, on: bool) -> None:
        """While on, a feed that brings several steps of new audio while other streams' windows
        wait for the model service (`ModelService.contended`: the stream fell behind because the
        service is loaded) runs only the windows `catch_up_ends` keeps: the newest, and earlier
        ones only where the gap since the last window run would pass half a window.
        The stage then falls behind by one round of the service, never by a backlog of rounds
        (issue 31: at a start of 24 streams on 2 cores the backlog put every stream 2.5 s behind
        in 3 s). A server's live stream turns it on (`voice.stage_driver`); off, every window
        due is run (a replay that feeds a whole recording at once). Kept across `reset`."""
        with self._lock:
            self._catch_up = on

    @property
    def step_s(self) -> float:
        """The step between windows now (stretched or not)."""
        return self._step / SAMPLE_RATE

    def flush(self) -> SpeakerTimeline:
        """End of stream: a last window ends at the newest sample (the audio after the last
        full step), then every frame the windows can decide is decided."""
        with self._lock:
            if self._fed > self._last_end:
                self._process([self._fed])
            self._decide(self._acc_base + self._acc.shape[0], None)
            return SpeakerTimeline(list(self._segments))

    def recent(self, since: float) -> SpeakerTimeline:
        """The decided segments that end after `since` (seconds), in time order: what a consumer
        giving speakers to words after `since` needs. `feed`'s timeline holds the whole stream
        and grows with it; searching it for every word cost milliseconds per word after a few
        hours (measured: 3.3 ms a `speaker_over` call on 8 hours). This costs what it returns:
        each speaker's runs are in time order, so each is walked back only over its recent ones."""
        with self._lock:
            picked: list[int] = []
            for runs in self._runs.values():
                for index in reversed(runs):
                    if self._segments[index].end <= since:
                        break
                    picked.append(index)
            return SpeakerTimeline([self._segments[i] for i in sorted(picked)])

    def provisional(self) -> SpeakerTimeline:
        """Who the windows heard so far say speaks on the frames not decided yet (from the last
        decided frame to the newest window's end). Unlike `feed`'s timeline these may still
        change: fewer windows have voted on them. The voice channel reads them so a turn's last
        words need not wait for the decision when they continue the voice before them."""
        with self._lock:
            if self._acc.size == 0:
                return SpeakerTimeline([])
            count = self._count
            heard = count > 0
            active = (self._acc / np.maximum(count, _NO_VOTES)[:, None] >= 0.5) & heard[:, None]
            step = FRAME_SAMPLES / SAMPLE_RATE
            segments: list[SpeakerSegment] = []
            for spk in range(active.shape[1]):
                cells = np.flatnonzero(active[:, spk])
                if cells.size == 0:
                    continue
                breaks = np.flatnonzero(np.diff(cells) > 1)
                firsts = np.concatenate([[cells[0]], cells[breaks + 1]])
                lasts = np.concatenate([cells[breaks], [cells[-1]]])
                name = self._speakers[spk].name
                for a, b in zip(firsts, lasts, strict=True):
                    t0 = FRAME_OFFSET_S + (self._acc_base + int(a)) * step
                    t1 = FRAME_OFFSET_S + (self._acc_base + int(b) + 1) * step
                    segments.append(SpeakerSegment(max(t0, 0.0), t1, name))
            return SpeakerTimeline(segments)

    @property
    def speakers(self) -> list[str]:
        return [s.name for s in self._speakers if s.name]

    def speaker_prints(self) -> StagePrints:
        """Each anonymous voice's centroid (unit length) and decided speech so far, as of the
        last feed: a snapshot replaced whole after each feed, so reading it never waits for the
        lock a running feed holds (issue 27: the voice directory names voices by them)."""
        if self._model_id is None:
            self._model_id = self.service.model_id
        snapshot = self._prints
        return StagePrints(self._model_id, snapshot.prints, snapshot.speech_s)

    def _snapshot_prints(self) -> None:
        prints: dict[str, FloatArray] = {}
        speech: dict[str, float] = {}
        for k, speaker in enumerate(self._speakers):
            heard = self._heard.get(k)
            centroid = None if heard is None else unit_or_none(heard)
            if speaker.enrolled or not speaker.name or centroid is None:
                continue
            prints[speaker.name] = centroid
            speech[speaker.name] = round(self._speech.get(k, 0.0), 3)
        self._prints = StagePrints("", prints, speech)

    def _window_audio(self, end: int) -> FloatArray:
        start = end - self._window
        lo = start - self._audio_start
        if lo >= 0:
            return self._audio[lo : lo + self._window]
        piece = self._audio[: end - self._audio_start]
        return np.concatenate([np.zeros(self._window - piece.size, dtype=np.float32), piece])

    def _window_features(self, end: int) -> FloatArray | None:
        """The fbank frames of the window ending at `end`, from the stream's running features
        (frame j covers samples [160 j, 160 j + 400), so a window's features are a slice of the
        stream's). None for a window that starts before the stream or off the 10 ms grid."""
        start = end - self._window
        if start < 0 or start % FBANK_SHIFT:
            return None
        first = start // FBANK_SHIFT
        last = (end - FBANK_LENGTH) // FBANK_SHIFT + 1  # one past the window's last frame
        if self._fbank_next < last:  # compute only the frames not computed yet
            lo = max(self._fbank_next, first)
            fresh = fbank(self._audio[lo * FBANK_SHIFT - self._audio_start : end - self._audio_start])
            if lo > self._fbank_next:  # a gap (never with regular windows): start over
                self._fbank = np.zeros((0, fresh.shape[1] if fresh.size else 80), np.float32)
                self._fbank_first = lo
            self._fbank = np.concatenate([self._fbank, fresh[: last - lo]])
            self._fbank_next = last
        drop = first - self._fbank_first  # frames before this window are never needed again
        if drop > 0:
            self._fbank = self._fbank[drop:]
            self._fbank_first = first
        out: FloatArray = self._fbank[first - self._fbank_first : last - self._fbank_first]
        return out

    def _process(self, ends: list[int]) -> None:
        self._apply_anchors()
        jobs: list[WindowJob] = []
        previous_end = self._last_end
        for end in ends:
            shift = round((end - previous_end) / FRAME_SAMPLES)
            jobs.append(WindowJob(
                self._window_audio(end), self._window_features(end), self.settings.embed_every,
                self._min_frames, shift,
            ))
            previous_end = end
        results = self.service.analyse(jobs, self._previous, self._since_embedding,
                                       self._abandoned)
        for job, end, result in zip(jobs, ends, results, strict=True):
            self._integrate(end, result, job.shift_frames)
        self._last_end = ends[-1]
        self._snapshot_prints()
        self._next_end = max(self._next_end, ends[-1] - ends[-1] % self._step + self._step)
        keep_from = self._next_end - self._window
        if keep_from > self._audio_start:
            self._audio = self._audio[keep_from - self._audio_start :]
            self._audio_start = keep_from

    # -- one window ------------------------------------------------------------------------

    def _integrate(self, end: int, result: WindowResult, shift: int) -> None:
        activity = result.activity
        stitched = (
            stitch(self._previous, activity, shift, self._min_frames)
            if self._previous is not None
            else {}
        )
        mapping: dict[int, int] = {}
        if result.embeddings is not None:
            self._since_embedding = 0
            mapping = self._assign(activity, result.embeddings, stitched)
        else:
            self._since_embedding += 1
            for local, prev_local in stitched.items():
                if prev_local in self._previous_map:
                    mapping[local] = self._previous_map[prev_local]
        self._previous = activity
        self._previous_map = mapping
        self._accumulate(end, activity, mapping)
        self._decide(self._cell_of(end - self._latency), end)

    def _assign(
        self, activity: Activity, embeddings: FloatArray, stitched: dict[int, int]
    ) -> dict[int, int]:
        """Constrained assignment of the window's local speakers to global speakers."""
        frames = activity.shape[0]
        heard = activity.sum(axis=0)
        alone = (activity * (activity.sum(axis=1, keepdims=True) == 1)).sum(axis=0)
        locals_: list[int] = []
        vectors: list[FloatArray] = []
        for j in range(activity.shape[1]):
            unit = unit_or_none(embeddings[j]) if heard[j] >= self._min_frames else None
            if unit is not None:
                locals_.append(j)
                vectors.append(unit)
        mapping: dict[int, int] = {}
        taken: set[int] = set()
        if locals_:
            centroids = [s.centroid for s in self._speakers]
            known = [k for k, c in enumerate(centroids) if c is not None]
            if known:
                cents = np.stack([c for c in centroids if c is not None])
                distance = 1.0 - np.stack(vectors) @ cents.T
                from scipy.optimize import linear_sum_assignment

                rows, cols = linear_sum_assignment(distance)
                for r, c in zip(rows, cols, strict=True):
                    if distance[r, c] < self.settings.delta_new:
                        mapping[locals_[r]] = known[c]
                        taken.add(known[c])
            new_min = self.settings.new_min_alone_s * SAMPLE_RATE / FRAME_SAMPLES
            for r, j in enumerate(locals_):
                if j in mapping:
                    continue
                unheard = sum(1 for k in self._anchor_of if not self._speakers[k].name)
                room = len(self._speakers) - unheard < self.max_speakers
                if room and (alone[j] >= new_min or not any(s.total is not None for s in self._speakers)):
                    self._speakers.append(_Speaker(letter_label(self._letters), None))
                    self._letters += 1
                    mapping[j] = len(self._speakers) - 1
                else:  # no room: the nearest speaker not already in this window
                    free = [k for k in range(len(self._speakers)) if k not in taken]
                    cents_all = [self._speakers[k].centroid for k in free]
                    scored = [
                        (float(vectors[r] @ c), k)
                        for k, c in zip(free, cents_all, strict=True)
                        if c is not None
                    ]
                    if not scored:
                        continue
                    mapping[j] = max(scored)[1]
                taken.add(mapping[j])
            for r, j in enumerate(locals_):
                # a speaker's first embedding always counts, later ones when it talks alone enough
                if j in mapping and (
                    alone[j] >= self.settings.rho_update * frames
                    or self._speakers[mapping[j]].total is None
                    or mapping[j] not in self._heard
                ):
                    self._speakers[mapping[j]].add(vectors[r])
                    k = mapping[j]
                    self._heard[k] = vectors[r].copy() if k not in self._heard else (
                        self._heard[k] + vectors[r])
        # too little speech for an embedding: keep what overlap stitching says
        for j, prev_local in stitched.items():
            if j not in mapping and prev_local in self._previous_map:
                target = self._previous_map[prev_local]
                if target not in mapping.values():
                    mapping[j] = target
        for target in mapping.values():  # an anchor heard for the first time takes a letter
            if not self._speakers[target].name:
                self._speakers[target].name = letter_label(self._letters)
                self._letters += 1
        return mapping

    # -- aggregation and decisions ---------------------------------------------------------

    @staticmethod
    def _cell_of(sample: int) -> int:
        return int(np.floor(sample / FRAME_SAMPLES))

    def _accumulate(self, end: int, activity: Activity, mapping: dict[int, int]) -> None:
        start = end - self._window
        first = round(start / FRAME_SAMPLES)
        frames = activity.shape[0]
        lo = max(first, self._decided_until)
        hi = first + frames
        if hi <= lo:
            return
        need_cells = hi - self._acc_base
        speakers = len(self._speakers)
        if need_cells > self._acc.shape[0] or speakers > self._acc.shape[1]:
            grown = np.zeros(
                (max(need_cells, self._acc.shape[0]), max(speakers, self._acc.shape[1])),
                dtype=np.float32,
            )
            grown[: self._acc.shape[0], : self._acc.shape[1]] = self._acc
            self._acc = grown
            count = np.zeros(grown.shape[0], dtype=np.float32)
            count[: self._count.size] = self._count
            self._count = count
        rows = slice(lo - self._acc_base, hi - self._acc_base)
        part = activity[lo - first : hi - first]
        weights = self._context_weights(end, lo, hi)
        self._count[rows] += weights
        for local, speaker in mapping.items():
            self._acc[rows, speaker] += part[:, local] * weights

    def _context_weights(self, end: int, lo: int, hi: int) -> FloatArray:
        """Per grid cell lo..hi: the weight of the window ending at `end` on it (settings'
        `context_ramp_s`: how much audio the window heard after the cell)."""
        ramp = self.settings.context_ramp_s
        if ramp <= 0:
            return np.ones(hi - lo, dtype=np.float32)
        step = FRAME_SAMPLES / SAMPLE_RATE
        cell_ends = FRAME_OFFSET_S + (np.arange(lo, hi, dtype=np.float32) + 1) * step
        context = end / SAMPLE_RATE - cell_ends
        weights: FloatArray = np.clip(context / ramp, CONTEXT_FLOOR, 1.0).astype(np.float32)
        return weights

    def _decide(self, until_cell: int, window_end: int | None) -> None:
        """Decide the grid cells before `until_cell` (never again revised)."""
        until_cell = min(until_cell, self._acc_base + self._acc.shape[0])
        if until_cell <= self._decided_until:
            return
        lo = self._decided_until - self._acc_base
        hi = until_cell - self._acc_base
        acc = self._acc[lo:hi]
        count = np.maximum(self._count[lo:hi], _NO_VOTES)
        active = acc / count[:, None] >= 0.5
        step = FRAME_SAMPLES / SAMPLE_RATE
        for offset in range(active.shape[0]):
            cell = self._decided_until + offset
            t0 = FRAME_OFFSET_S + cell * step
            t1 = t0 + step
            for speaker in np.flatnonzero(active[offset]):
                spk = int(speaker)
                self._speech[spk] = self._speech.get(spk, 0.0) + step
                index = self._open.get(spk)
                if index is not None and abs(self._segments[index].end - t0) < 1e-6:
                    seg = self._segments[index]
                    self._segments[index] = SpeakerSegment(seg.start, t1, seg.speaker)
                else:
                    self._segments.append(SpeakerSegment(max(t0, 0.0), t1, self._speakers[spk].name))
                    self._open[spk] = len(self._segments) - 1
                    self._runs.setdefault(spk, []).append(len(self._segments) - 1)
        if self.record_delays and window_end is not None and active.any():
            cells = self._decided_until + np.flatnonzero(active.any(axis=1))
            ends = FRAME_OFFSET_S + (cells + 1) * step
            self.decision_delays.extend((window_end / SAMPLE_RATE - ends).tolist())
        self._decided_until = until_cell
        # drop decided cells from the accumulator
        cut = until_cell - self._acc_base
        self._acc = self._acc[cut:]
        self._count = self._count[cut:]
        self._acc_base = until_cell


def _checked(audio: Audio) -> FloatArray:
    samples = np.asarray(audio)
    if samples.ndim == 2 and 1 in samples.shape:
        samples = samples.reshape(-1)
    if samples.ndim != 1:
        raise ValueError(f"expected mono audio (one dimension), got shape {samples.shape}")
    if samples.size and not np.issubdtype(samples.dtype, np.floating):
        raise ValueError(f"expected float samples in [-1, 1], got dtype {samples.dtype}")
    samples = samples.astype(np.float32, copy=False)
    if samples.size and not np.all(np.isfinite(samples)):
        raise ValueError("audio holds NaN or infinite samples")
    return samples


_DEFAULT_SERVICE: ModelService | None = None
_DEFAULT_SERVICE_LOCK = threading.Lock()


def default_service() -> ModelService:
    """The process-wide model service every live stage shares unless given another."""
    global _DEFAULT_SERVICE
    with _DEFAULT_SERVICE_LOCK:
        if _DEFAULT_SERVICE is None:
            _DEFAULT_SERVICE = ModelService(default_live_models())
        return _DEFAULT_SERVICE


def configure_default_service(*, precision: Precision = "int8", workers: int = 2) -> ModelService:
    """Make the process-wide service run the trunk at `precision` on `workers` threads (the
    server's `[diarizer] live_precision` / `live_workers`), loading its models now. A service
    made with other settings goes on serving the stages that hold it; new stages get this one."""
    global _DEFAULT_SERVICE
    models = default_live_models(precision)
    with _DEFAULT_SERVICE_LOCK:
        current = _DEFAULT_SERVICE
        if current is None or current.models is not models or current.workers != workers:
            current = _DEFAULT_SERVICE = ModelService(models, workers=workers)
        return current
