"""The live second pass (issue 23, item 3): stretches of committed turns re-decoded whole in the
background and each turn corrected in place, never blocking the first pass, skipped when behind.

The first pass here is the real Deepgram client against the local Deepgram-protocol server
(scripted words); the second pass is a scripted recogniser where the test is about what happens to
its words, and the real Whisper where it is about the words."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import threading
from pathlib import Path
from typing import ClassVar

import numpy as np
import numpy.typing as npt
import pytest

from models import RoomEvent
from rooms import Channel, HookContext, HookResult, HookTrigger, RoomContext, RoomKit
from tests.voice_helpers import stream, turns_of, voice_room
from voice.audio import read_audio
from voice.channel import CommittedTurn, TranscriptionEvent, VoiceChannel
from voice.second_pass import SecondPass, SecondPassJob, assign_words, chunk_bounds
from voice.stt.base import RawWord
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord
from voice.turns import Word

FloatAudio = npt.NDArray[np.float32]
AUDIO = np.full(16000 * 4, 0.01, np.float32)


def script() -> ScriptedWords:
    return ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello"), SpokenWord("everyone", 0.5, 0.9, 0, "everyone.")],
        [SpokenWord("hi", 1.3, 1.5, 1, "Hi.")],
    ])


class Scripted:
    """A second-pass recogniser that hears what the test says was said, by where the audio is."""

    def __init__(self, said: dict[float, list[tuple[str, float, float]]]) -> None:
        self.said = said
        """First-pass turn start → the words (text, start, end) re-decoding it gives."""
        self.heard: list[tuple[float, float, str | None]] = []

    def redecode(self, audio: FloatAudio, offset: float, prompt: str | None = None) -> tuple[RawWord, ...]:
        self.heard.append((offset, offset + len(audio) / 16000, prompt))
        for start, words in self.said.items():
            if offset <= start < offset + len(audio) / 16000:
                return tuple(RawWord(t, s, e) for t, s, e in words)
        return ()

    def describe(self) -> str:
        return "scripted"


class Updates(Channel):
    """A channel of the room that records what it is told (as the realtime, chat, ACP and
    LiveKit channels are told): new events and events corrected in place."""

    channel_type: ClassVar[str] = "recorder"

    def __init__(self) -> None:
        super().__init__("updates")
        self.delivered: list[str] = []
        self.updated: list[RoomEvent] = []

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        self.delivered.append(event.text)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        self.updated.append(event)


async def room_with(channel: VoiceChannel) -> tuple[RoomKit, Updates]:
    kit = await voice_room(channel)
    updates = Updates()
    kit.register_channel(updates)
    await kit.attach_channel("room", updates.channel_id)
    return kit, updates


async def test_a_turn_the_second_pass_hears_differently_is_corrected_in_place_everywhere() -> None:
    second = SecondPass(Scripted({0.1: [("Hello", 0.12, 0.4), ("everybody.", 0.5, 0.92)]}))
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), second_pass=second)
        kit, updates = await room_with(channel)
        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, AUDIO, 16000)  # finish() waits for the second passes
        await kit.drain()
        events = await kit.list_events("room")
    await second.aclose()
    assert [t.text for t in turns] == ["Hello everybody.", "Hi."]
    assert [e.text for e in events] == ["Hello everybody.", "Hi."]
    assert updates.delivered == ["Hello everyone.", "Hi."]  # the first pass, at once
    [fixed] = updates.updated
    assert fixed.id == events[0].id and fixed.text == "Hello everybody."
    assert fixed.metadata["corrected"] is True and fixed.metadata["second_pass"] is True
    assert fixed.metadata["sender_name"] == "Speaker A"  # who spoke never changes
    assert (fixed.metadata["start"], fixed.metadata["end"]) == (0.12, 0.92)
    assert turns[0].transcription.words[0].speaker == "Speaker A"
    assert "second_pass" not in events[1].metadata
    assert session.second_pass_corrections == 1
    assert second.stats.as_dict() == {"corrected": 1, "same": 1, "skipped_behind": 0,
                                      "skipped_edited": 0, "stale": 0, "failed": 0}


async def second_passed(second: SecondPass) -> list[CommittedTurn]:
    """The scripted meeting's turns through the real Deepgram client, then `second`."""
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), second_pass=second)
        await room_with(channel)
        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, AUDIO, 16000)
    await second.aclose()
    return turns


async def test_turns_close_together_are_re_decoded_as_one_stretch_and_its_words_shared_out() -> None:
    # "Hello everyone." and "Hi." are 0.4 s apart: one stretch, heard once, ± 0.2 s; the word
    # heard in the padding after it ("so", 1.62-1.72 s) is nobody's in the stretch
    recogniser = Scripted({0.1: [("Hello", 0.1, 0.4), ("everyone.", 0.5, 0.95), ("Hi", 1.3, 1.42),
                                 ("there.", 1.42, 1.55), ("so", 1.62, 1.72)]})
    second = SecondPass(recogniser)
    turns = await second_passed(second)
    assert [t.text for t in turns] == ["Hello everyone.", "Hi there."]
    assert [t.transcription.words[-1].speaker for t in turns] == ["Speaker A", "Speaker B"]
    spans = [(round(a, 2), round(b, 2)) for a, b, _ in recogniser.heard]
    assert spans == [(0.0, 1.7)]  # the stretch ± 0.2 s (clamped at the start)
    assert (second.stats.same, second.stats.corrected) == (1, 1)


async def test_a_pause_longer_than_the_gap_starts_another_stretch() -> None:
    recogniser = Scripted({0.1: [("Hello", 0.1, 0.4), ("everybody.", 0.5, 0.9)],
                           1.3: [("Hi.", 1.3, 1.5)]})
    turns = await second_passed(SecondPass(recogniser, gap=0.3, pad=0.1))
    assert [t.text for t in turns] == ["Hello everybody.", "Hi."]
    spans = [(round(a, 2), round(b, 2)) for a, b, _ in recogniser.heard]
    assert spans == [(0.0, 1.0), (1.2, 1.6)]


async def test_a_room_that_goes_quiet_has_its_last_stretch_corrected_without_waiting_for_the_end(
) -> None:
    """`hold` seconds with no new turn send the stretch off while the stream goes on."""
    second = SecondPass(Scripted({0.1: [("Hello", 0.12, 0.4), ("everybody.", 0.5, 0.92)]}),
                        hold=0.05)
    corrected = asyncio.Event()

    class Told(Updates):
        async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
            await super().deliver_update(event, ctx)
            corrected.set()

    async with DeepgramTestServer(ScriptedWords(script().finals[:1])) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), second_pass=second)
        kit = await voice_room(channel)
        told = Told()
        kit.register_channel(told)
        await kit.attach_channel("room", told.channel_id)
        session = await channel.start_session("room", "mic-1")
        await stream(session, AUDIO, 16000)
        await session.flush()  # the turn is committed; the stream stays open
        async with asyncio.timeout(30):
            await corrected.wait()
        assert [e.text for e in told.updated] == ["Hello everybody."]
        assert not session.finished
        await session.finish()
    await second.aclose()


async def test_a_hooks_edit_stands_and_a_re_decode_that_hears_nothing_keeps_the_first_pass() -> None:
    second = SecondPass(Scripted({0.1: [("Jello", 0.1, 0.4)]}))  # nothing for "Hi."
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), second_pass=second)
        kit, updates = await room_with(channel)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def redact(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            if event.text.startswith("Hello"):
                return HookResult.modify(dataclasses.replace(event, text="[greeting]"))
            return HookResult.allow()

        session = await channel.start_session("room", "mic-1")
        turns = await turns_of(session, AUDIO, 16000)
    await second.aclose()
    assert [t.text for t in turns] == ["[greeting]", "Hi."]
    assert updates.updated == []
    assert (second.stats.skipped_edited, second.stats.same) == (1, 1)


class Gated:
    """A recogniser that holds each re-decode until the test lets it go."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.go = threading.Event()

    def redecode(self, audio: FloatAudio, offset: float, prompt: str | None = None) -> tuple[RawWord, ...]:
        self.started.set()
        self.go.wait(30)
        return (RawWord("later", offset, offset + 0.2),)

    def describe(self) -> str:
        return "gated"


def job(session: str, outcomes: list[str]) -> SecondPassJob:
    async def apply(words: tuple[tuple[Word, ...], ...]) -> list[str]:
        outcomes.append(words[0][0].text if words[0] else "")
        return ["same"]

    return SecondPassJob(session, np.zeros(16000, np.float32), 0.0, ((Word("w", 0.0, 0.5),),),
                         None, apply)


async def test_when_the_second_pass_falls_behind_the_oldest_waiting_turns_are_skipped() -> None:
    gated = Gated()
    second = SecondPass(gated, max_waiting=1, max_age=5.0)
    applied: list[str] = []
    first = job("s", applied)
    second.submit(first)
    await asyncio.to_thread(gated.started.wait, 30)  # the first is being re-decoded
    old, newer, newest = job("s", applied), job("s", applied), job("t", applied)
    second.submit(old)
    second.submit(newer)  # one may wait: the older is skipped
    assert await old.done == ["skipped_behind"]
    second.submit(newest)  # another room's newer turn: `newer` is skipped
    assert await newer.done == ["skipped_behind"]
    gated.go.set()
    assert await first.done == ["same"]
    await second.settled("t")
    assert await newest.done == ["same"]
    assert applied == ["later", "later"]
    assert second.stats.skipped_behind == 2 and second.stats.same == 2
    await second.aclose()


async def test_a_turn_that_waited_past_max_age_is_skipped() -> None:
    gated = Gated()
    second = SecondPass(gated, max_waiting=4, max_age=5.0)
    applied: list[str] = []
    first, late = job("s", applied), job("s", applied)
    second.submit(first)
    await asyncio.to_thread(gated.started.wait, 30)
    second.submit(late)
    late.submitted -= 10.0
    gated.go.set()
    assert await first.done == ["same"]
    assert await late.done == ["skipped_behind"]
    await second.settled("s")
    assert applied == ["later"]
    await second.aclose()


def test_a_re_decoded_word_belongs_to_the_turn_when_its_middle_is_in_the_turns_span() -> None:
    first = (Word("a", 1.0, 1.5, speaker="Speaker B"), Word("b", 1.6, 2.0, speaker="Speaker B"))
    heard = [RawWord("x", 0.5, 0.8), RawWord("a", 0.9, 1.4), RawWord("b", 1.6, 2.05),
             RawWord("y", 2.1, 2.4)]
    [mine] = assign_words(heard, [first])
    assert [(w.text, w.speaker) for w in mine] == [("a", "Speaker B"), ("b", "Speaker B")]
    assert assign_words(heard, [()]) == ((),)


def test_a_stretchs_words_go_to_the_turn_whose_first_pass_word_is_nearest() -> None:
    a = (Word("one", 0.0, 0.4, speaker="A"), Word("two", 0.5, 0.9, speaker="A"))
    b = (Word("three", 1.4, 1.8, speaker="B"),)
    c = (Word("four", 1.7, 2.2, speaker="C"),)  # overlaps b
    heard = [RawWord("one", 0.0, 0.4), RawWord("too", 0.55, 0.95),
             RawWord("and", 1.0, 1.1),  # in the pause, nearer a's last word
             RawWord("tree", 1.35, 1.65), RawWord("for", 1.9, 2.2),
             RawWord("later", 2.5, 2.7)]  # past the stretch (and its tolerance): nobody's
    mine = assign_words(heard, [a, b, c])
    assert [[(w.text, w.speaker) for w in t] for t in mine] == [
        [("one", "A"), ("too", "A"), ("and", "A")], [("tree", "B")], [("for", "C")]]
    assert assign_words(heard, [(), ()]) == ((), ())


def test_a_long_turn_is_decoded_in_chunks_cut_in_its_widest_pause() -> None:
    words = [Word(str(i), i * 1.0, i * 1.0 + 0.8) for i in range(60)]
    words[24] = Word("24", 24.0, 24.1)  # the widest gap in the last third of the first chunk
    bounds = chunk_bounds(words, 0.0, 60.0)
    assert bounds[0] == (0.0, pytest.approx(24.55))
    assert all(b - a <= 28.0 for a, b in bounds) and bounds[-1][1] == 60.0
    assert all(x[1] == y[0] for x, y in itertools.pairwise(bounds))
    assert chunk_bounds(words[:10], 0.0, 10.0) == [(0.0, 10.0)]


@pytest.mark.parametrize("model", ["tiny.en"])
async def test_the_real_whisper_second_pass_mends_a_turn_the_first_pass_got_wrong(
    model: str, shared_fixtures: Path
) -> None:
    """Real speech (a LibriSpeech meeting's first utterance), a first pass that misheard it, and
    Whisper as the second pass: the turn is corrected to words nearer the reference."""
    from voice.stt.whisper import WhisperSTT

    name = "lsmeet_dev01_2spk_close"
    folder = shared_fixtures / "librispeech-meetings"
    ref = json.loads((folder / f"{name}.seglst.json").read_text())[0]
    audio, rate = read_audio(folder / f"{name}.flac")
    audio = audio[: int(ref["end_time"] * rate) + rate // 2]
    assert rate == 16000
    wrong = ["and", "third", "he", "is", "same", "as", "thou", "sickest"]
    span = ref["end_time"] - ref["start_time"]
    spoken = [SpokenWord(w, ref["start_time"] + i * span / len(wrong),
                         ref["start_time"] + (i + 0.8) * span / len(wrong), 0, w)
              for i, w in enumerate(wrong)]
    recogniser = WhisperSTT(model, instance="second-pass")
    second = SecondPass(recogniser)
    async with DeepgramTestServer(ScriptedWords([spoken])) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), second_pass=second)
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        [turn] = await turns_of(session, audio, rate)
    await second.aclose()

    def errors(text: str) -> int:
        """Word edits from the reference (case and punctuation aside)."""
        said = ref["words"].split()
        heard = ["".join(c for c in w.lower() if c.isalnum() or c == "'") for w in text.split()]
        row = list(range(len(heard) + 1))
        for i, r in enumerate(said, 1):
            prev, row[0] = row[0], i
            for j, h in enumerate(heard, 1):
                prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
        return row[-1]

    assert turn.event.metadata.get("second_pass") is True
    assert errors(turn.text) < errors(" ".join(wrong)) / 2, turn.text
