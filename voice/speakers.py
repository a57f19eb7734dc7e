"""Speaker labels that survive STT reconnects (rule V4): raw STT labels → session speakers by voice.

Why: a diarizing STT numbers speakers per connection. When a stream drops and reconnects, the new
connection starts again at speaker 0, so without help `Speaker A` of the first connection could
come back as `Speaker B`, or two people could swap names. The labels a new connection introduces
are matched, by CAM++ voiceprints (`voice.embedding.EmbeddingModel`), to the session's speakers: the one-to-one assignment with the
highest total similarity among speakers no other label of that connection holds; only a voice
that matches nobody becomes a new letter.

Before any voice is compared, **time** decides what it can (issue 25.11): a reconnected stream
replays the audio after the last final word, so the new connection's first words are words an
earlier connection already heard and labelled (its final words, or the interim words an early
turn was committed from). A new label whose words fall on the same audio as one session speaker's
words (`bind_by_time`: most of its overlapped time, at least `TIME_EVIDENCE_SECONDS`) is that
speaker; nothing is embedded for it. Voiceprints decide only the labels of voices the replay does
not reach. Without this, two of three voices became new letters for the rest of a meeting after
one outage (their first replayed sentence scored 0.71 and 0.73 against a 0.75 threshold), and an
early turn came back a second time under the new letter.

Shaped for many streams: in steady state nothing is embedded. Each session speaker keeps the
spans (session times) of its most recent speech; voiceprints are computed from the session's
audio log only when a reconnected stream brings a label it has not bound yet, and cached until
that speaker speaks again. On the first connection the STT's own numbering is trusted (letters in
order of first appearance, rule V3). Matching is CPU work: callers run `resolve` in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from voice.centroids import unit_or_none
from voice.turns import SpeakerLetters

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]


class VoiceEmbedder(Protocol):
    """What speaker matching needs from `voice.embedding.EmbeddingModel`: one voiceprint for a
    clip of 16 kHz mono audio."""

    def voiceprint(self, audio: FloatAudio) -> FloatAudio: ...


MIN_EMBED_SECONDS = 0.6
"""Runs shorter than this are padded with their own audio repeated (an embedding of a fraction of
a second is noise)."""


Span = tuple[float, float]
LabelledSpan = tuple[float, float, str]
"""(start, end, session label): a word an earlier connection labelled, in session time."""
AudioBetween = Callable[[float, float], FloatAudio]
HISTORY_SECONDS = 20.0
"""Seconds of each speaker's most recent speech kept (as spans) for its voiceprint."""


TIME_EVIDENCE_SECONDS = 0.25
"""Seconds of a new label's words that must fall on one speaker's earlier words to bind it by time."""
TIME_EVIDENCE_SHARE = 0.6
"""...and the share of the label's overlapped time that speaker must hold (overlapping speech,
where two earlier voices share the audio, is left to the voiceprints)."""


@dataclass
class SpeakerContinuity:
    """Session speakers across STT connections (generations)."""

    embedder: VoiceEmbedder | Callable[[], VoiceEmbedder] | None = None
    threshold: float = 0.55
    """Cosine similarity a new label's voice needs with a known speaker's voiceprint to take it.
    Measured (`chorus bench reconnect_voices`, docs/benchmarks.md): at the old 0.75, 55 % of
    voices that came back after a reconnect missed their own speaker and became new letters; a
    leave-one-file-out choice over 26 recordings is 0.47–0.48, where the largest score between two
    different speakers was 0.47, so 0.55 keeps a margin: 6 % missed, no wrong name."""
    letters: SpeakerLetters = field(default_factory=SpeakerLetters)
    history: dict[str, list[Span]] = field(default_factory=dict)
    """Each session speaker's most recent speech, as session-time spans."""
    decisions: list[tuple[int, object, str, float | None]] = field(default_factory=list)
    """(generation, raw label, session label, similarity or None): each label bound in order of
    appearance (None) or by voice (its best similarity)."""
    timed: list[tuple[int, object, str, float]] = field(default_factory=list)
    """(generation, raw label, session label, seconds of shared audio): each label bound by time."""
    embedded: int = 0
    """Voiceprints computed so far (zero until a reconnect needs one)."""

    def __post_init__(self) -> None:
        self._prints: dict[str, tuple[int, FloatAudio | None]] = {}

    def _embedder(self) -> VoiceEmbedder | None:
        found = self.embedder
        if found is None:
            return None
        if not hasattr(found, "voiceprint"):  # a loader: build the embedder on first use
            found = found()
            self.embedder = found
        return cast(VoiceEmbedder, found)

    def _embed(self, audio: FloatAudio) -> FloatAudio | None:
        embedder = self._embedder()
        if embedder is None or len(audio) < 1600:
            return None
        if len(audio) < MIN_EMBED_SECONDS * 16000:
            reps = int(np.ceil(MIN_EMBED_SECONDS * 16000 / len(audio)))
            audio = np.tile(audio, reps)
        self.embedded += 1
        return unit_or_none(embedder.voiceprint(audio))

    def _voice(self, spans: list[Span], audio: AudioBetween) -> FloatAudio | None:
        pieces = [audio(a, b) for a, b in spans]
        pieces = [p for p in pieces if len(p)]
        return self._embed(np.concatenate(pieces)) if pieces else None

    def voiceprint(self, label: str, audio: AudioBetween) -> FloatAudio | None:
        """The speaker's voiceprint from its recent speech (cached until it speaks again)."""
        spans = self.history.get(label, [])
        cached = self._prints.get(label)
        if cached is not None and cached[0] == len(spans):
            return cached[1]
        vec = self._voice(spans, audio)
        self._prints[label] = (len(spans), vec)
        return vec

    def bind_by_time(self, generation: int, runs: Mapping[object, list[Span]],
                     heard: list[LabelledSpan]) -> None:
        """Bind the unbound labels of a reconnected connection (`generation` > 0) whose words
        fall on audio earlier connections labelled (`heard`), one label per session speaker,
        the pairing with the most shared time first. Cheap; runs on the loop."""
        if generation == 0 or not heard:
            return
        claimed = {lab for key, lab in self.letters.labels.items()
                   if isinstance(key, tuple) and key[0] == generation}
        shared: dict[tuple[object, str], float] = {}
        overlapped: dict[object, float] = {}
        for raw, spans in runs.items():
            if self.letters.get((generation, raw)) is not None:
                continue
            for start, end in spans:
                for h_start, h_end, label in heard:
                    both = min(end, h_end) - max(start, h_start)
                    if both > 0:
                        shared[raw, label] = shared.get((raw, label), 0.0) + both
                        overlapped[raw] = overlapped.get(raw, 0.0) + both
        bound: set[object] = set()
        for (raw, label), seconds in sorted(shared.items(), key=lambda kv: -kv[1]):
            if raw in bound or label in claimed or seconds < TIME_EVIDENCE_SECONDS:
                continue
            if seconds < TIME_EVIDENCE_SHARE * overlapped[raw]:
                continue
            self.letters.bind((generation, raw), label)
            self.timed.append((generation, raw, label, seconds))
            bound.add(raw)
            claimed.add(label)
            log.info("reconnect: STT label %s of connection %d is %s by time (%.2f s of the same "
                     "audio)", raw, generation, label, seconds)

    def needs_voices(self, generation: int, runs: Mapping[object, list[Span]]) -> bool:
        """Whether `resolve` will embed: a reconnected stream brings an unbound label."""
        return generation > 0 and bool(self.history) and any(
            self.letters.get((generation, raw)) is None for raw in runs)

    def resolve(self, generation: int, runs: Mapping[object, list[Span]],
                audio: AudioBetween) -> dict[object, str]:
        """Session labels for the raw labels of one final result. `runs` holds each raw label's
        word spans in that result (session time); `audio(start, end)` reads the session's audio.
        Blocking (embeddings, only after a reconnect): run it in a worker thread."""
        out: dict[object, str] = {}
        unbound = []
        for raw in runs:
            label = self.letters.get((generation, raw))
            if label is not None:
                out[raw] = label
            else:
                unbound.append(raw)
        if unbound and (generation == 0 or not self.history):
            for raw in unbound:
                out[raw] = self.letters.label((generation, raw))
                self.decisions.append((generation, raw, out[raw], None))
        elif unbound:
            new = {raw: self._voice(runs[raw], audio) for raw in unbound}
            out.update(self._match(generation, new, audio))
        for raw, spans in runs.items():
            self._remember(out[raw], spans)
        return out

    def _remember(self, label: str, spans: list[Span]) -> None:
        kept = self.history.setdefault(label, [])
        kept.extend(spans)
        total = 0.0
        for i in range(len(kept) - 1, -1, -1):
            total += kept[i][1] - kept[i][0]
            if total >= HISTORY_SECONDS:
                del kept[:i]
                break

    def _match(self, generation: int, new: dict[object, FloatAudio | None],
               audio: AudioBetween) -> dict[object, str]:
        from scipy.optimize import linear_sum_assignment

        claimed = {lab for key, lab in self.letters.labels.items()
                   if isinstance(key, tuple) and key[0] == generation}
        prints = {lab: self.voiceprint(lab, audio) for lab in self.history}
        known = {lab: vec for lab, vec in prints.items() if vec is not None}
        free = [lab for lab in known if lab not in claimed]
        voiced = [raw for raw, vec in new.items() if vec is not None]
        out: dict[object, str] = {}
        if free and voiced:
            sims = np.array([[float(cast(FloatAudio, new[raw]) @ known[lab]) for lab in free]
                             for raw in voiced])
            for i, j in zip(*linear_sum_assignment(-sims), strict=True):
                if sims[i, j] >= self.threshold:
                    raw, label = voiced[i], free[j]
                    out[raw] = self.letters.bind((generation, raw), label)
                    self.decisions.append((generation, raw, label, float(sims[i, j])))
                    log.info("reconnect: STT label %s of connection %d is %s by voice (cosine %.2f)",
                             raw, generation, label, sims[i, j])
        for raw, vec in new.items():
            if raw in out:
                continue
            best = max((float(vec @ c) for c in known.values()), default=None) \
                if vec is not None else None
            out[raw] = self.letters.bind((generation, raw), self.letters.new_label())
            self.decisions.append((generation, raw, out[raw], best))
            log.info("reconnect: STT label %s of connection %d matches nobody (best %s): new %s",
                     raw, generation, f"{best:.2f}" if best is not None else "none", out[raw])
        return out
