"""Speaker labels that survive STT reconnects (rule V4): raw STT labels → session speakers by voice.

Why: a diarizing STT numbers speakers per connection. When a stream drops and reconnects, the new
connection starts again at speaker 0, so without help `Speaker A` of the first connection could
come back as `Speaker B`, or two people could swap names. The session keeps a voiceprint centroid
for each of its speakers (GE2E embeddings of the runs they spoke); a label the new connection
introduces is matched to the closest centroid not already claimed on that connection, and only a
voice that matches nobody becomes a new letter.

On the first connection the STT's own numbering is trusted (letters in order of first appearance,
rule V3). Matching is CPU work: callers run `resolve` in a worker thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import numpy.typing as npt

from voice.turns import SpeakerLetters

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]


class VoiceEmbedder(Protocol):
    """What speaker matching needs from `voice.embedding.SpeakerEmbedder`."""

    def embed(self, audio: FloatAudio) -> FloatAudio: ...


MIN_EMBED_SECONDS = 0.6
"""Runs shorter than this are padded with their own audio repeated; GE2E wants about 1.6 s."""


@dataclass
class SpeakerContinuity:
    """Session speakers across STT connections (generations)."""

    embedder: VoiceEmbedder | Callable[[], VoiceEmbedder] | None = None
    threshold: float = 0.70
    """Cosine similarity a new label's voice needs with a known speaker's centroid to take it."""
    letters: SpeakerLetters = field(default_factory=SpeakerLetters)
    centroids: dict[str, FloatAudio] = field(default_factory=dict)
    weights: dict[str, float] = field(default_factory=dict)
    decisions: list[tuple[int, object, str, float | None]] = field(default_factory=list)
    """(generation, raw label, session label, similarity or None): how each label was bound."""

    def _embedder(self) -> VoiceEmbedder | None:
        found = self.embedder
        if found is None:
            return None
        if not hasattr(found, "embed"):  # a loader: build the embedder on first use
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
        vec = np.asarray(embedder.embed(audio), np.float32)
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else None

    def resolve(self, generation: int, runs: Mapping[object, FloatAudio]) -> dict[object, str]:
        """Session labels for the raw labels of one final result; `runs` holds each raw label's
        audio in that result (all its words). Updates the centroids. Blocking: run in a thread."""
        out: dict[object, str] = {}
        embeddings = {raw: self._embed(audio) for raw, audio in runs.items()}
        for raw, vec in embeddings.items():
            key = (generation, raw)
            label = self.letters.get(key)
            if label is None:
                label = self._bind_new(generation, raw, vec)
            out[raw] = label
            if vec is not None:
                weight = len(runs[raw]) / 16000
                self._update(label, vec, weight)
        return out

    def _bind_new(self, generation: int, raw: object, vec: FloatAudio | None) -> str:
        key = (generation, raw)
        if generation == 0 or vec is None or not self.centroids:
            label = self.letters.label(key)
            self.decisions.append((generation, raw, label, None))
            return label
        claimed = {lab for key, lab in self.letters.labels.items()
                   if isinstance(key, tuple) and key[0] == generation}
        scores = {lab: float(vec @ c) for lab, c in self.centroids.items() if lab not in claimed}
        best = max(scores.items(), key=lambda kv: kv[1]) if scores else None
        if best is not None and best[1] >= self.threshold:
            label = self.letters.bind(key, best[0])
            self.decisions.append((generation, raw, label, best[1]))
            log.info("reconnect: STT label %s of connection %d is %s by voice (cosine %.2f)",
                     raw, generation, label, best[1])
            return label
        label = self.letters.bind(key, self.letters.new_label())
        self.decisions.append((generation, raw, label, best[1] if best else None))
        log.info("reconnect: STT label %s of connection %d matches nobody (best %s): new %s",
                 raw, generation, f"{best[1]:.2f}" if best else "none", label)
        return label

    def _update(self, label: str, vec: FloatAudio, weight: float) -> None:
        old = self.centroids.get(label)
        w_old = self.weights.get(label, 0.0)
        merged = vec * weight if old is None else old * w_old + vec * weight
        norm = float(np.linalg.norm(merged))
        self.centroids[label] = (merged / norm).astype(np.float32) if norm > 0 else vec
        self.weights[label] = min(w_old + weight, 60.0)
