"""Speaker labels across STT reconnects (rule V4), with real CAM++ embeddings of the demo voices."""

from __future__ import annotations

import numpy as np

from tests.voice_helpers import meeting
from voice.embedding import default_embedding_model
from voice.speakers import Span, SpeakerContinuity
from voice.turns import letter_label

DEMO = meeting()


def audio(start: float, end: float) -> np.ndarray:
    return DEMO.audio[int(start * DEMO.sample_rate) : int(end * DEMO.sample_rate)]


def turn(name: str, nth: int = 0) -> list[Span]:
    t = [t for t in DEMO.turns if t["speaker"] == name][nth]
    return [(w["start"], w["end"]) for w in t["words"]]


def test_V4_known_voices_keep_their_letters_and_only_a_new_voice_takes_a_new_one() -> None:
    speakers = SpeakerContinuity(embedder=default_embedding_model())
    first = speakers.resolve(0, {0: turn("Alice"), 1: turn("Bob")}, audio)
    assert first == {0: "Speaker A", 1: "Speaker B"}
    assert speakers.embedded == 0  # nothing is embedded until a reconnect needs it
    # The new connection numbers Bob 0, Carol (never heard before) 1, Alice 2.
    second = speakers.resolve(1, {0: turn("Bob", 2), 1: turn("Carol"), 2: turn("Alice", 3)}, audio)
    assert second == {0: "Speaker B", 1: "Speaker C", 2: "Speaker A"}
    how = {raw: (label, sim) for gen, raw, label, sim in speakers.decisions if gen == 1}
    assert how[0][1] is not None and how[0][1] > 0.85  # Bob and Alice matched by voice
    assert how[2][1] is not None and how[2][1] > 0.85
    assert how[1][1] is not None and how[1][1] < 0.75  # Carol resembles nobody enough
    # Labels bound on this connection cost nothing more.
    embedded = speakers.embedded
    assert speakers.resolve(1, {0: turn("Bob", 3)}, audio) == {0: "Speaker B"}
    assert speakers.embedded == embedded


def test_V4_without_an_embedder_a_reconnect_cannot_match_and_says_so() -> None:
    speakers = SpeakerContinuity(embedder=None)
    speakers.resolve(0, {0: turn("Alice")}, audio)
    assert speakers.resolve(1, {0: turn("Alice", 1)}, audio) == {0: "Speaker B"}
    assert speakers.decisions[-1] == (1, 0, "Speaker B", None)


def test_V3_letters_run_past_z() -> None:
    assert [letter_label(i) for i in (0, 25, 26, 27)] == [
        "Speaker A", "Speaker Z", "Speaker AA", "Speaker AB"]
