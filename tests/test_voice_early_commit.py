"""Latency on the streaming path (issue 10): a turn that ends where the next voice starts is
committed from the interim result that shows the change, not from the final that closes the next
voice's words; a final that disagrees corrects the early turn in place."""

from __future__ import annotations

import asyncio

import numpy as np

from rooms import HookContext, HookTrigger
from tests.voice_helpers import DecidingStage, stream, voice_room
from voice.channel import TranscriptionEvent, VoiceChannel
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord

AUDIO = np.zeros(16000 * 5, np.float32)


def script(third: list[SpokenWord]) -> ScriptedWords:
    return ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello.")],
        [SpokenWord("hi", 1.0, 1.2, 1, "Hi.")],
        third,
    ])


class Broadcasts:
    """Counts room events as they are committed (an AFTER_BROADCAST observer) and lets a test
    wait for the n-th."""

    def __init__(self) -> None:
        self.count = 0
        self._changed = asyncio.Condition()

    async def __call__(self, event: object, ctx: HookContext) -> None:
        async with self._changed:
            self.count += 1
            self._changed.notify_all()

    async def reach(self, count: int, within: float = 20.0) -> None:
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: self.count >= count), within)


async def test_a_turn_closed_by_the_next_voice_is_committed_before_its_final() -> None:
    third = [SpokenWord("so", 2.0, 2.3, 0, "So"), SpokenWord("thursday", 2.35, 2.8, 0, "Thursday?"),
             SpokenWord("yes", 2.9, 3.2, 1, "Yes,"), SpokenWord("thursday", 3.25, 3.7, 1, "Thursday.")]
    final_until_at_commit: dict[str, float] = {}
    async with DeepgramTestServer(script(third), interim_every=0.1) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def seen(event: TranscriptionEvent, ctx: HookContext) -> None:
            final_until_at_commit[event.text] = session.stt.final_until

        await stream(session, AUDIO, 16000)
        await session.finish()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [
        ("Speaker A", "Hello."), ("Speaker B", "Hi."),
        ("Speaker A", "So Thursday?"), ("Speaker B", "Yes, Thursday."),
    ]
    # A's turn went out while its words were still interim (no final past 1.2 s yet)
    assert final_until_at_commit["So Thursday?"] == 1.2
    assert session.corrections == 0 and not any(e.metadata.get("corrected") for e in events)


async def test_a_final_that_disagrees_corrects_the_early_turn_in_place() -> None:
    third = [SpokenWord("right", 2.0, 2.3, 0, "Right."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")]
    async with DeepgramTestServer(script(third), interim_every=1000.0) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        broadcasts = Broadcasts()
        kit.hook(HookTrigger.AFTER_BROADCAST)(broadcasts)
        session = await channel.start_session("room", "mic-1")
        await stream(session, AUDIO[:16000 * 18 // 10], 16000)  # 1.8 s: "Hello." and "Hi." final
        await broadcasts.reach(2)
        wrong = [SpokenWord("write", 2.0, 2.3, 0, "Write."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")]
        interim = server._results("r", wrong, is_final=False, speech_final=False,
                                  from_finalize=False, start=2.0, duration=0.7)
        await server.send_raw(interim.model_dump_json(exclude_none=True))
        await broadcasts.reach(3)  # committed from the interim
        assert [e.text for e in await kit.list_events("room")][2] == "Write."
        await stream(session, AUDIO[16000 * 18 // 10:], 16000)
        turns = await session.finish()
        events = await kit.list_events("room")
    assert [e.text for e in events] == ["Hello.", "Hi.", "Right.", "Yes."]
    assert events[2].metadata["corrected"] is True and events[2].metadata["sender_name"] == "Speaker A"
    assert [t.text for t in turns] == ["Hello.", "Hi.", "Right.", "Yes."]
    assert session.corrections == 1


async def test_early_commit_can_be_turned_off() -> None:
    third = [SpokenWord("so", 2.0, 2.3, 0, "So"), SpokenWord("yes", 2.4, 2.7, 1, "Yes.")]
    final_until_at_commit: dict[str, float] = {}
    async with DeepgramTestServer(script(third), interim_every=0.1) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), early_commit=False)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def seen(event: TranscriptionEvent, ctx: HookContext) -> None:
            final_until_at_commit[event.text] = session.stt.final_until

        await stream(session, AUDIO, 16000)
        await session.finish()
    assert final_until_at_commit["So"] == 2.7  # waited for the final holding both voices


async def test_an_early_turn_continues_the_final_words_of_its_voice_without_a_correction() -> None:
    """A final without `speech_final` leaves its last run open; the interim that shows the next
    voice closes it: the final words and the interim words of that voice are one turn."""
    two = ScriptedWords(script([SpokenWord("x", 9.0, 9.1, 0)]).finals[:2])
    async with DeepgramTestServer(two, interim_every=1000.0) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        broadcasts = Broadcasts()
        kit.hook(HookTrigger.AFTER_BROADCAST)(broadcasts)
        session = await channel.start_session("room", "mic-1")
        await stream(session, AUDIO[:16000 * 18 // 10], 16000)
        await broadcasts.reach(2)
        so = SpokenWord("so", 2.0, 2.3, 0, "So")
        thursday = SpokenWord("thursday", 2.35, 2.8, 0, "Thursday?")
        yes = SpokenWord("yes", 2.9, 3.2, 1, "Yes.")

        def results(words: list[SpokenWord], *, final: bool, speech_final: bool) -> str:
            start = words[0].start
            msg = server._results("r", words, is_final=final, speech_final=speech_final,
                                  from_finalize=False, start=start, duration=words[-1].end - start)
            return msg.model_dump_json(exclude_none=True)

        await server.send_raw(results([so], final=True, speech_final=False))
        await server.send_raw(results([thursday, yes], final=False, speech_final=False))
        await broadcasts.reach(3)  # "So Thursday?" went out from the interim
        await server.send_raw(results([thursday, yes], final=True, speech_final=True))
        await broadcasts.reach(4)
        await session.finish()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [
        ("Speaker A", "Hello."), ("Speaker B", "Hi."),
        ("Speaker A", "So Thursday?"), ("Speaker B", "Yes."),
    ]
    assert session.corrections == 0 and not any(e.metadata.get("corrected") for e in events)


# -- pipeline speakers (V5): a streaming STT's interim words with the stage's decided speakers --


def one_final_two_voices() -> ScriptedWords:
    """One final holding Alice's "Ship it?" and Bob's "No, wait." (the STT does not diarize:
    who said which is the stage's to say). The final comes once 0.3 s of audio follow 1.6 s."""
    return ScriptedWords([[
        SpokenWord("ship", 0.1, 0.4, 0, "Ship"), SpokenWord("it", 0.45, 0.7, 0, "it?"),
        SpokenWord("no", 0.95, 1.2, 0, "No,"), SpokenWord("wait", 1.25, 1.6, 0, "wait."),
    ]])


VOICES = SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"), SpeakerSegment(0.85, 2.0, "Bob")])


async def early_with_stage(lag: float) -> tuple[list[tuple[str, str]], dict[str, float], int]:
    """Stream 1.8 s (interims, no final yet), then the rest; (turns, final_until when each was
    committed, corrections)."""
    final_until_at_commit: dict[str, float] = {}
    async with DeepgramTestServer(one_final_two_voices(), interim_every=0.1) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=DecidingStage(VOICES, lag), speaker_wait=30.0)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        broadcasts = Broadcasts()
        kit.hook(HookTrigger.AFTER_BROADCAST)(broadcasts)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def seen(event: TranscriptionEvent, ctx: HookContext) -> None:
            final_until_at_commit[event.text] = session.stt.final_until

        await stream(session, AUDIO[: 16000 * 18 // 10], 16000, speed=4.0)
        if lag < 1.0:
            await broadcasts.reach(1)  # Alice's turn, from an interim: the final is not sent yet
        await stream(session, AUDIO[16000 * 18 // 10 :], 16000, speed=4.0)
        await session.finish()
        events = await kit.list_events("room")
    return ([(e.metadata["sender_name"], e.text) for e in events], final_until_at_commit,
            session.corrections)


async def test_V5_a_turn_closed_by_a_decided_voice_is_committed_from_the_interim() -> None:
    """Issue 10 (latency, streaming STT + pipeline speakers): Alice's turn is committed as soon
    as an interim shows her words followed by words the stage decided are Bob's, not when the
    final that closes Bob's words arrives (2.98 -> 1.99 s strict p95 at the device)."""
    turns, final_until, corrections = await early_with_stage(lag=0.3)
    assert turns == [("Alice", "Ship it?"), ("Bob", "No, wait.")]
    assert final_until["Ship it?"] == 0.0  # no final yet when Alice's turn went out
    assert corrections == 0


async def test_V5_words_the_stage_has_not_decided_close_no_turn_early() -> None:
    """Not decided is not a change of voice: while Bob's words are undecided (the stage 1 s
    late), Alice's turn waits for the final, as before."""
    turns, final_until, corrections = await early_with_stage(lag=1.0)
    assert turns == [("Alice", "Ship it?"), ("Bob", "No, wait.")]
    assert final_until["Ship it?"] == 1.6
    assert corrections == 0
