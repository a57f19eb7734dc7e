"""The live stage's model results, recorded once per recording and played back (`bench voices
--replay`).

What the live stage asks of its `ModelService` for one recording does not depend on its
clustering, its anchors or its enrolled voices: each window's audio is the recording's, and
whether a window is embedded depends on the segmentation of it and of the window before
(`diarization.live.needs_embedding`) and on how many windows went unembedded, all of which the
model results themselves decide. So a bench that runs one recording anchored on many directories
(`bench voices`: 25 anchored runs of five meetings) needs the models once per recording: the
first run goes through the real service and its answers are kept, the later runs get them back,
and only the clustering, the aggregation and the naming run again. Each played-back request is
checked against the recorded one (the windows' audio, the previous window's activity, the count
of unembedded windows); a request that differs raises `TapeMismatch` instead of answering with
results of other audio.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from diarization.live import Activity, FloatArray, ModelService, WindowJob, WindowResult
from voice.diarization_stage import Audio


class TapeMismatch(RuntimeError):
    """A played-back run asked the models something its recording did not."""


@dataclass(frozen=True)
class _Asked:
    audio: tuple[str, ...]
    previous: str | None
    since_embedding: int


@dataclass
class _Answer:
    asked: _Asked
    results: list[WindowResult]


def _digest(values: np.ndarray) -> str:
    return hashlib.blake2b(np.ascontiguousarray(values).tobytes(), digest_size=16).hexdigest()


class WindowTape(ModelService):
    """A `ModelService` stand-in: `start(key)` before each run of a recording; the first run of
    a key goes through `inner` and is recorded, every later one is played back (module
    docstring). Voiceprints and the model id are `inner`'s."""

    def __init__(self, inner: ModelService) -> None:
        super().__init__(models=None)
        self.inner = inner
        self.tapes: dict[str, list[_Answer]] = {}
        self._key: str | None = None
        self._cursor = 0
        self._recording = False
        self.played = 0
        """Requests answered from a tape (not from `inner`)."""

    def start(self, key: str) -> bool:
        """The next requests are a run of recording `key`: recorded if it has no tape yet
        (True), played back from its tape otherwise (False)."""
        self._key, self._cursor = key, 0
        self._recording = key not in self.tapes
        if self._recording:
            self.tapes[key] = []
        return self._recording

    def analyse(
        self,
        jobs: Sequence[WindowJob],
        previous: Activity | None = None,
        since_embedding: int = 0,
        abandoned: threading.Event | None = None,
    ) -> list[WindowResult]:
        if self._key is None:
            raise TapeMismatch("WindowTape.start(key) names the recording before a run")
        asked = _Asked(
            tuple(_digest(job.audio) for job in jobs),
            None if previous is None else _digest(previous),
            since_embedding,
        )
        tape = self.tapes[self._key]
        if self._recording:
            results = self.inner.analyse(jobs, previous, since_embedding, abandoned)
            tape.append(_Answer(asked, [_copy(r) for r in results]))
            return results
        if self._cursor >= len(tape) or tape[self._cursor].asked != asked:
            raise TapeMismatch(
                f"run of {self._key!r} asked for something else than its recording at request "
                f"{self._cursor} (the stage's model requests depend on more than the audio?)"
            )
        answer = tape[self._cursor]
        self._cursor += 1
        self.played += 1
        return [_copy(r) for r in answer.results]

    def voiceprint(self, audio: Audio) -> FloatArray:
        return self.inner.voiceprint(audio)

    @property
    def model_id(self) -> str:
        return self.inner.model_id

    def close(self) -> None:
        self.inner.close()


def _copy(result: WindowResult) -> WindowResult:
    return WindowResult(
        result.activity.copy(), None if result.embeddings is None else result.embeddings.copy()
    )


__all__ = ["TapeMismatch", "WindowTape"]
