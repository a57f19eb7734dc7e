"""The embedded diarization stage (rule P1): offline on one CPU core, with enrollment (V8) and
clustering of unknown voices (V7).

- `diarize(audio)` (batch, whole files): the pipeline in `diarization.batch` (pyannote's
  segmentation-3.0 and 3D-Speaker's CAM++ on onnxruntime: sliding 10 s windows, one embedding per
  window and local speaker, centroid-linkage clustering, frame-level reconstruction with overlap).
- `feed(audio)` (live): `diarization.live.LiveDiarizer` on the same two models: a 5 s window every
  0.5 s, segmented and (when needed) embedded by the process-wide `ModelService`, which batches
  the windows of every live stream into one segmentation call and one CAM++ call; incremental
  clustering with stable labels; overlapped speech gets both speakers; frames are decided about
  1 s after they arrive and never revised.

Speaker names: an enrolled name when a cluster's centroid is close enough to that voiceprint
(each name used once per recording), otherwise `Speaker A`, `Speaker B` … in order of first
appearance. Voiceprints are embeddings only; no audio is kept after `enroll` returns.
Model work is synchronous and CPU-bound: every model runs with one thread.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from diarization import batch
from diarization.batch import BatchSettings
from diarization.live import LiveDiarizer, LiveSettings, ModelService
from diarization.models import (
    SegmentationModel,
    default_embedding_model,
    default_segmentation_model,
)
from voice.diarization_stage import (
    Audio,
    SpeakerSegment,
    SpeakerTimeline,
    StageAbilities,
    StagePrints,
)
from voice.embedding import SpeakerEmbedding
from voice.turns import letter_label
from voice.vad import FRAME, FRAME_SECONDS, SpeechDetector, speech_regions

SAMPLE_RATE = 16000


FloatArray = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Settings:
    """The voice-activity numbers of enrollment (Silero, 32 ms frames: an enrollment clip's
    speech is found before it is embedded; the batch and live pipelines need no VAD, the
    segmentation model finds the speech)."""

    vad_threshold: float = 0.1
    normalize: bool = False  # level normalisation before the VAD did not help on AMI (measured)
    min_speech: float = 0.2  # speech regions shorter than this (s) are dropped
    max_gap: float = 0.8  # pauses up to this long inside a turn are bridged


def speech_mask(probs: FloatArray, settings: Settings) -> npt.NDArray[np.bool_]:
    """Per 32 ms frame: is it speech (regions with hysteresis, gaps bridged, blips dropped)."""
    mask = np.zeros(len(probs), bool)
    for r in speech_regions(
        probs,
        threshold=settings.vad_threshold,
        min_speech=settings.min_speech,
        max_gap=settings.max_gap,
    ):
        mask[round(r.start / FRAME_SECONDS) : round(r.end / FRAME_SECONDS)] = True
    return mask


class EmbeddedStage:
    """The embedded stage. Implements `voice.diarization_stage.DiarizationStage` (P3)."""

    sample_rate = SAMPLE_RATE
    abilities = StageAbilities(decides_late=True, recent_view=True, provisional_view=True,
                               stretches_step=True, catches_up=True, abandons=True,
                               speaker_prints=True, anchors=True)
    """`voice.diarization_stage.LiveStage`: the live stream decides about a second late
    (`flush`), can hand over its recent segments (`recent`) and its provisional view, and can
    stretch its step under load (`stretch`), skip the windows of a backlog (`catch_up`) and
    drop its queued windows when the server takes its stream off the stage (`abandon`), and
    show its anonymous voices' prints (`speaker_prints`, issue 27)."""

    def __init__(
        self,
        *,
        settings: Settings | None = None,
        live: LiveSettings | None = None,
        num_speakers: int | None = None,
        min_speakers: int | None = None,
        max_speakers: int | None = None,
        batch_settings: BatchSettings | None = None,
        segmentation: SegmentationModel | None = None,
        embedding: SpeakerEmbedding | None = None,
        batch_enroll_threshold: float = 0.5,
        service: ModelService | None = None,
    ) -> None:
        """`live` / `service`: the live path's settings and the model service it shares with
        every other live stream (default: the process-wide one)."""
        self.settings = settings or Settings()
        self.live = live or LiveSettings()
        self.batch = batch_settings or BatchSettings()
        self.num_speakers = num_speakers
        self.min_speakers = min_speakers
        self.max_speakers = max_speakers
        self.batch_enroll_threshold = batch_enroll_threshold
        self.segmentation = segmentation or default_segmentation_model()
        self.embedding = embedding or default_embedding_model()
        self._campplus_prints: dict[str, FloatArray] = {}
        self._stream = LiveDiarizer(service, self.live, max_speakers=num_speakers or max_speakers)
        self.detector = SpeechDetector(
            threshold=self.settings.vad_threshold,
            normalize=self.settings.normalize,
            min_speech=self.settings.min_speech,
            max_gap=self.settings.max_gap,
        )
        self._lock = threading.Lock()

    # -- enrollment (V8) ---------------------------------------------------------------------

    @property
    def enrolled(self) -> dict[str, FloatArray]:
        """Enrolled voiceprints (192-d CAM++ embeddings of the clip's speech; never audio)."""
        with self._lock:
            return dict(self._campplus_prints)

    def enroll(self, name: str, audio: Audio) -> None:
        """Name a voice (V8) for `diarize` and for the live stream, from a clip of its speech."""
        name = name.strip()
        if not name:
            raise ValueError("an enrolled voice needs a name")
        speech = self._speech_of(audio)
        campplus = self.embedding.voiceprint(speech)
        self._stream.enroll(name, speech)
        with self._lock:
            self._campplus_prints[name] = campplus

    def forget(self, name: str) -> None:
        with self._lock:
            if name not in self._campplus_prints:
                raise KeyError(f"no enrolled voice named {name!r}")
            del self._campplus_prints[name]
        self._stream.forget(name)

    def voiceprint(self, audio: Audio) -> FloatArray:
        """The voiceprint of a clip: CAM++'s embedding of its speech (L2-normalised, 192-d)."""
        return self.embedding.voiceprint(self._speech_of(audio))

    def _speech_of(self, audio: Audio) -> FloatArray:
        """The speech of an enrollment clip (VAD), joined; at least 1 s of it."""
        wav = _checked(audio)
        if len(wav) < SAMPLE_RATE // 2:
            raise ValueError("enrollment audio is shorter than 0.5 s; give a few seconds of speech")
        mask = speech_mask(self.detector.probabilities(wav), self.settings)
        samples = np.repeat(mask, FRAME)[: len(wav)]
        speech = wav[: len(samples)][samples]
        if len(speech) < SAMPLE_RATE:
            raise ValueError(
                f"enrollment audio holds {len(speech) / SAMPLE_RATE:.1f} s of speech; at least 1 s is needed"
            )
        return speech

    # -- batch -------------------------------------------------------------------------------

    def diarize(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
        min_speakers: int | None = None,
    ) -> SpeakerTimeline:
        """The whole recording (batch pipeline, `diarization.batch`): overlapped speech gets two
        speakers. `num_speakers` fixes the count; `min_speakers`/`max_speakers` bound it."""
        wav = _checked(audio)
        num = num_speakers if num_speakers is not None else self.num_speakers
        low = min_speakers if min_speakers is not None else self.min_speakers
        cap = max_speakers if max_speakers is not None else self.max_speakers
        for label, value in (("num_speakers", num), ("min_speakers", low), ("max_speakers", cap)):
            if value is not None and value < 1:
                raise ValueError(f"{label} must be at least 1")
        if low is not None and cap is not None and low > cap:
            raise ValueError(f"min_speakers ({low}) is more than max_speakers ({cap})")
        analysis = batch.analyse(wav, self.segmentation, self.embedding, self.batch)
        clustering = batch.cluster_analysis(
            analysis, self.batch, num_speakers=num, min_speakers=low, max_speakers=cap
        )
        if self.batch.vbx:
            vectors = batch.xvectors(wav, analysis, self.embedding, self.batch)
            clustering = batch.vbx_refine(analysis, clustering, vectors, self.batch)
        ids = [str(k) for k in range(len(clustering.centroids))]
        segments = sorted(batch.reconstruct(analysis, clustering, ids), key=lambda g: g.start)
        order = [int(k) for k in dict.fromkeys(g.speaker for g in segments)]
        names = self._names_for(clustering.centroids, order)
        return SpeakerTimeline(
            [SpeakerSegment(g.start, g.end, names[int(g.speaker)]) for g in segments]
        )

    def _names_for(self, cents: FloatArray, order: list[int]) -> list[str]:
        """Enrolled names for clusters whose centroid is close enough to a voiceprint (closest
        pairs first, each name once per recording, so a voice that was not enrolled never takes
        an enrolled name just because it is the nearest); `Speaker A`, `B` … for the others in
        order of first appearance (V7)."""
        names: list[str | None] = [None] * len(cents)
        with self._lock:
            prints = list(self._campplus_prints.items())
        if prints and len(cents):
            sims = cents @ np.stack([p for _, p in prints]).T
            pairs = sorted(
                ((float(sims[i, j]), i, j) for i in range(len(cents)) for j in range(len(prints))),
                reverse=True,
            )
            used_clusters: set[int] = set()
            used_prints: set[int] = set()
            for sim, i, j in pairs:
                if sim < self.batch_enroll_threshold:
                    break
                if i in used_clusters or j in used_prints:
                    continue
                names[i] = prints[j][0]
                used_clusters.add(i)
                used_prints.add(j)
        order = order + [k for k in range(len(cents)) if k not in order]
        letter = 0
        for k in order:
            if names[k] is None:
                names[k] = letter_label(letter)
                letter += 1
        return [n if n is not None else "" for n in names]

    # -- live --------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the live stream (not the enrolled voices)."""
        self._stream.reset()

    def feed(self, audio: Audio) -> SpeakerTimeline:
        """Live mode (`diarization.live`): the timeline decided so far; decisions never change."""
        return self._stream.feed(_checked(audio, allow_empty=True))

    def abandon(self) -> None:
        """Live: skip the windows queued on the model service (`LiveDiarizer.abandon`)."""
        self._stream.abandon()

    def stretch(self, factor: float) -> None:
        """Live: windows `factor` times `live.step_s` apart from the next one on (overload)."""
        self._stream.stretch(factor)

    def catch_up(self, on: bool) -> None:
        """Live: a feed behind its stream runs only the windows it needs (overload)."""
        self._stream.catch_up(on)

    def flush(self) -> SpeakerTimeline:
        """End of the stream: decide what the windows fed so far can decide."""
        return self._stream.flush()

    def recent(self, since: float) -> SpeakerTimeline:
        """The live stream's decided segments that end after `since` (`LiveDiarizer.recent`)."""
        return self._stream.recent(since)

    def provisional(self) -> SpeakerTimeline:
        """Who the live stream's windows say speaks on the frames not decided yet (may change;
        `LiveDiarizer.provisional`)."""
        return self._stream.provisional()

    def speaker_prints(self) -> StagePrints:
        """The live stream's anonymous voices: prints and speech so far (`LiveDiarizer`)."""
        return self._stream.speaker_prints()

    def anchor(self, prints: dict[str, FloatArray]) -> None:
        """Known voices the live clustering starts from (`LiveDiarizer.anchor`; any thread)."""
        self._stream.anchor(prints)

    def live_voiceprint(self, audio: Audio) -> FloatArray:
        """A clip's voiceprint on the live path's model (its speech, VAD; what the voice
        directory keeps and compares with `speaker_prints`)."""
        return self._stream.service.voiceprint(self._speech_of(audio))

    def turn_voiceprint(self, audio: Audio) -> FloatArray:
        """A committed turn's print on the live path's model, its audio as it is (the voice
        directory's per-turn check, `voice.identify.turn_matches`)."""
        return self._stream.service.voiceprint(_checked(audio))

    @property
    def live_model(self) -> str:
        """The id of the model `live_voiceprint` and `speaker_prints` use."""
        return self._stream.service.model_id

    @property
    def live_speakers(self) -> list[str]:
        """Speakers known to the live stream (enrolled first, then `Speaker A` …)."""
        return self._stream.speakers


def _checked(audio: Audio, *, allow_empty: bool = False) -> FloatArray:
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D float32 at 16 kHz), got shape {wav.shape}")
    if not allow_empty and len(wav) == 0:
        raise ValueError("empty audio")
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio holds NaN or infinite samples")
    return wav
