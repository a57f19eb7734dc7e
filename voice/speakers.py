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
    threshold: float = 0.75
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
        audio in that result (all its words). Updates the centroids. Blocking: run in a thread.

        The labels a reconnected stream introduces in one result are matched together: the
        one-to-one assignment to unclaimed session speakers with the highest total similarity
        (so a new voice cannot take a known speaker's letter just because it was read first)."""
        embeddings = {raw: self._embed(audio) for raw, audio in runs.items()}
        out: dict[object, str] = {}
        unbound = []
        for raw in embeddings:
            label = self.letters.get((generation, raw))
            if label is not None:
                out[raw] = label
            else:
                unbound.append(raw)
        if generation == 0 or not self.centroids:
            for raw in unbound:
                out[raw] = self.letters.label((generation, raw))
                self.decisions.append((generation, raw, out[raw], None))
        else:
            out.update(self._match(generation, {raw: embeddings[raw] for raw in unbound}))
        for raw, vec in embeddings.items():
            if vec is not None:
                self._update(out[raw], vec, len(runs[raw]) / 16000)
        return out

    def _match(self, generation: int, new: dict[object, FloatAudio | None]) -> dict[object, str]:
        from scipy.optimize import linear_sum_assignment

        claimed = {lab for key, lab in self.letters.labels.items()
                   if isinstance(key, tuple) and key[0] == generation}
        free = [lab for lab in self.centroids if lab not in claimed]
        voiced = [raw for raw, vec in new.items() if vec is not None]
        out: dict[object, str] = {}
        if free and voiced:
            sims = np.array([[float(new[raw] @ self.centroids[lab]) for lab in free]  # type: ignore[operator]
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
            best = max((float(vec @ c) for c in self.centroids.values()), default=None) \
                if vec is not None else None
            out[raw] = self.letters.bind((generation, raw), self.letters.new_label())
            self.decisions.append((generation, raw, out[raw], best))
            log.info("reconnect: STT label %s of connection %d matches nobody (best %s): new %s",
                     raw, generation, f"{best:.2f}" if best is not None else "none", out[raw])
        return out

    def _update(self, label: str, vec: FloatAudio, weight: float) -> None:
        old = self.centroids.get(label)
        w_old = self.weights.get(label, 0.0)
        merged = vec * weight if old is None else old * w_old + vec * weight
        norm = float(np.linalg.norm(merged))
        self.centroids[label] = (merged / norm).astype(np.float32) if norm > 0 else vec
        self.weights[label] = min(w_old + weight, 60.0)
