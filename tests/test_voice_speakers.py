"""Speaker labels across STT reconnects (rule V4), with real GE2E embeddings of the demo voices."""

from __future__ import annotations

import numpy as np

from tests.voice_helpers import meeting
from voice.embedding import default_embedder
from voice.speakers import SpeakerContinuity
from voice.turns import letter_label


def run_of(name: str, nth: int = 0) -> np.ndarray:
    demo = meeting()
    turns = [t for t in demo.turns if t["speaker"] == name]
    t = turns[nth]
    return demo.audio[int(t["start"] * demo.sample_rate) : int(t["end"] * demo.sample_rate)]


def test_V4_known_voices_keep_their_letters_and_only_a_new_voice_takes_a_new_one() -> None:
    speakers = SpeakerContinuity(embedder=default_embedder())
    first = speakers.resolve(0, {0: run_of("Alice"), 1: run_of("Bob")})
    assert first == {0: "Speaker A", 1: "Speaker B"}
    # The new connection numbers Bob 0, Carol (never heard before) 1, Alice 2.
    second = speakers.resolve(1, {0: run_of("Bob", 2), 1: run_of("Carol"), 2: run_of("Alice", 3)})
    assert second == {0: "Speaker B", 1: "Speaker C", 2: "Speaker A"}
    how = {raw: (label, sim) for gen, raw, label, sim in speakers.decisions if gen == 1}
    assert how[0][1] is not None and how[0][1] > 0.85  # Bob and Alice matched by voice
    assert how[2][1] is not None and how[2][1] > 0.85
    assert how[1][1] is not None and how[1][1] < 0.75  # Carol resembles nobody enough


def test_V4_without_an_embedder_a_reconnect_cannot_match_and_says_so() -> None:
    speakers = SpeakerContinuity(embedder=None)
    speakers.resolve(0, {0: run_of("Alice")})
    assert speakers.resolve(1, {0: run_of("Alice", 1)}) == {0: "Speaker B"}
    assert speakers.decisions[-1] == (1, 0, "Speaker B", None)


def test_V3_letters_run_past_z() -> None:
    assert [letter_label(i) for i in (0, 25, 26, 27)] == [
        "Speaker A", "Speaker Z", "Speaker AA", "Speaker AB"]
