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
    assert how[1][1] is not None and how[1][1] < speakers.threshold  # Carol resembles nobody enough
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


def test_V4_a_reconnect_binds_by_time_the_voices_whose_replayed_words_were_labelled() -> None:
    """Issue 25.11: the new connection's first words are the replayed audio an earlier connection
    already labelled (its finals, or the interim words an early turn came from). Those labels are
    bound by time, with no embedder at all; a label on audio nobody labelled is left unbound."""
    speakers = SpeakerContinuity(embedder=None)
    speakers.resolve(0, {0: turn("Alice"), 1: turn("Bob")}, audio)
    bob, alice = turn("Bob"), turn("Alice")
    heard = [(s, e, "Speaker B") for s, e in bob] + [(s, e, "Speaker A") for s, e in alice[-2:]]
    # the new connection numbers Bob 0 and Alice 1; raw 2 speaks on audio nobody labelled
    speakers.bind_by_time(1, {0: bob[:3], 1: alice[-2:], 2: turn("Carol")}, heard)
    assert speakers.letters.get((1, 0)) == "Speaker B"
    assert speakers.letters.get((1, 1)) == "Speaker A"
    assert speakers.letters.get((1, 2)) is None
    assert speakers.embedded == 0


def test_V4_time_binds_one_label_per_speaker_and_leaves_shared_audio_to_the_voices() -> None:
    speakers = SpeakerContinuity(embedder=None)
    speakers.resolve(0, {0: turn("Alice"), 1: turn("Bob")}, audio)
    span = turn("Alice")[0]
    both = [(*span, "Speaker A"), (*span, "Speaker B")]  # two voices over the same audio
    speakers.bind_by_time(1, {0: [span]}, both)
    assert speakers.letters.get((1, 0)) is None  # 50/50: not evidence of either
    alone = [(*span, "Speaker A")]
    speakers.bind_by_time(1, {0: [span], 1: [span]}, alone)
    assert [speakers.letters.get((1, raw)) for raw in (0, 1)].count("Speaker A") == 1
    short = turn("Bob")[0]
    speakers.bind_by_time(2, {0: [(short[0], short[0] + 0.1)]}, [(*short, "Speaker B")])
    assert speakers.letters.get((2, 0)) is None  # 0.1 s of shared audio is not enough


class GatedEmbedder:
    """A voiceprint that waits for the test: a match in its worker thread the test holds open."""

    def __init__(self) -> None:
        import threading

        self.entered = threading.Event()
        self.release = threading.Event()
        self.model = default_embedding_model()

    def voiceprint(self, clip: np.ndarray) -> np.ndarray:
        self.entered.set()
        assert self.release.wait(60)
        return self.model.voiceprint(clip)


async def test_V4_a_result_read_while_voices_are_matched_waits_for_the_match() -> None:
    """Issue 25.11: a reconnect's voice match runs in a worker thread; the connection it served
    may drop meanwhile (its receiver cancelled) while the thread goes on changing the speakers.
    The next result waits for it. Before, it bound labels at the same time: the thread raised
    "dictionary changed size during iteration" and its voices took phantom letters."""
    import asyncio

    from voice.audio import AudioLog
    from voice.stt.base import RawResult, RawWord, ResultReader, SttProvider

    class Diarizing(SttProvider):
        name = "test"
        diarizes = True

        async def connect(self):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    log = AudioLog()
    log.append(DEMO.audio[: 30 * DEMO.sample_rate])
    embedder = GatedEmbedder()
    reader = ResultReader(Diarizing(), SpeakerContinuity(embedder=embedder), log)

    def said(spans: list[Span], speaker: int) -> tuple[RawWord, ...]:
        return tuple(RawWord("w", s, e, 1.0, speaker) for s, e in spans)

    try:
        await reader.read(0, RawResult(said(turn("Alice"), 0) + said(turn("Bob"), 1), True), 0.0)
        # connection 1 brings a voice the session must match by voice: the thread waits on the test
        matching = asyncio.create_task(reader.read(1, RawResult(said(turn("Bob", 1), 0), True), 0.0))
        await asyncio.to_thread(embedder.entered.wait, 60)
        first = reader._matching
        matching.cancel()  # the connection dropped
        later = asyncio.create_task(reader.read(2, RawResult(said(turn("Alice", 2), 5), True), 0.0))
        for _ in range(5):
            await asyncio.sleep(0)
        # it waits for the match in flight: no second match, no label bound meanwhile
        assert not later.done() and reader._matching is first
        assert reader.speakers.letters.get((2, 5)) is None
        embedder.release.set()
        transcript = await asyncio.wait_for(later, 60)
        assert {w.speaker for w in transcript.words} == {"Speaker A"}
        assert reader.speakers.letters.get((1, 0)) == "Speaker B"
    finally:
        embedder.release.set()  # never leave the worker thread waiting
