"""The VoiceChannel: turns as room events (V2), hooks (V6), pipeline speakers (V5), the agent's own
voice (V9) and bad live input (V10). STT is the real Deepgram client against the local server."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest

from attribution import Register
from models import RoomEvent
from rooms import HookContext, HookResult, HookTrigger, RoomKit
from server.testing.harness import eventually
from tests.voice_helpers import (
    DecidingStage,
    ProvisionalStage,
    ScriptedStage,
    UtteranceSTT,
    stream,
    turns_of,
    voice_room,
)
from voice.audio import FrameSizeError, UnsupportedEncodingError, float_to_pcm16
from voice.channel import SpeakerChangeEvent, TranscriptionEvent, VoiceChannel
from voice.diarization_stage import SpeakerSegment, SpeakerTimeline, StageAbilities
from voice.session import GATE_LOOKBEHIND_S
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord

AUDIO = np.zeros(16000 * 4, np.float32)  # the scripted server hears the timing, not the words


def script() -> ScriptedWords:
    """Alice, Bob, Alice again: three finals, each ending its utterance."""
    return ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello"), SpokenWord("everyone", 0.5, 0.9, 0, "everyone.")],
        [SpokenWord("hi", 1.3, 1.5, 1, "Hi.")],
        [SpokenWord("how", 2.0, 2.2, 0, "How"), SpokenWord("are", 2.25, 2.4, 0, "are"),
         SpokenWord("you", 2.45, 2.7, 0, "you?")],
    ])


async def run(kit: RoomKit, channel: VoiceChannel) -> list[RoomEvent]:
    session = await channel.start_session("room", "mic-1")
    await turns_of(session, AUDIO, 16000)
    await kit.drain()
    return await kit.list_events("room")


async def test_V2_turn_events_carry_voice_metadata() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        events = await run(kit, channel)
    assert [(e.metadata["sender_name"], e.text) for e in events] == [
        ("Speaker A", "Hello everyone."), ("Speaker B", "Hi."), ("Speaker A", "How are you?")]
    first = events[0]
    assert first.metadata["speaker_label"] == "Speaker A"
    assert (first.metadata["start"], first.metadata["end"]) == (0.1, 0.9)
    assert first.metadata["source"] == "voice" and first.source.participant_id == "mic-1"
    assert first.source.channel_type == "voice"
    assert [await kit.label_for("room", e) for e in events] == ["Speaker A", "Speaker B", "Speaker A"]


async def test_V6_rename_sticks_for_later_turns_of_that_voice() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        seen: list[TranscriptionEvent] = []

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def name_alice(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            seen.append(event)
            if event.text.startswith("Hello"):  # only the first turn is recognised
                return HookResult.modify(dataclasses.replace(event, sender_name="Alice"))
            return HookResult.allow()

        events = await run(kit, channel)
    assert [e.metadata["sender_name"] for e in events] == ["Alice", "Speaker B", "Alice"]
    assert [e.metadata["speaker_label"] for e in events] == ["Speaker A", "Speaker B", "Speaker A"]
    assert seen[2].sender_name == "Alice" and seen[2].speaker == "Speaker A"  # hook sees the name
    assert [w.text for w in seen[0].words] == ["Hello", "everyone."]


async def test_V6_rename_can_be_for_one_turn_only() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), sticky_renames=False)
        kit = await voice_room(channel)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def once(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            if event.text.startswith("Hello"):
                return HookResult.modify(dataclasses.replace(event, sender_name="Alice"))
            return HookResult.allow()

        events = await run(kit, channel)
    assert [e.metadata["sender_name"] for e in events] == ["Alice", "Speaker B", "Speaker A"]


async def test_V6_hook_edits_text() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        async def fix(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            return HookResult.modify(dataclasses.replace(event, text=event.text.replace("Hi.", "Hi all.")))

        events = await run(kit, channel)
    assert [e.text for e in events] == ["Hello everyone.", "Hi all.", "How are you?"]


async def test_V6_blocked_turn_has_no_event_and_no_rank() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def drop_b(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            return HookResult.block("off the record") if event.speaker == "Speaker B" else HookResult.allow()

        events = await run(kit, channel)
        register = await kit.get_register("room")
    assert [e.metadata["sender_name"] for e in events] == ["Speaker A", "Speaker A"]
    assert isinstance(register, Register)
    assert len(register.entries) == 1  # Speaker A only: the blocked voice took no rank
    assert channel.sessions == []  # finished sessions are released


async def test_V6_participant_match_names_the_voice_through_the_participant_record() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        await kit.ensure_participant("room", "voice", "alice-id", display_name="Alice")

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def match(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            if event.text.startswith("Hello"):
                return HookResult.modify(dataclasses.replace(event, participant_id="alice-id"))
            return HookResult.allow()

        events = await run(kit, channel)
        labels = [await kit.label_for("room", e) for e in events]
    assert [e.source.participant_id for e in events] == ["alice-id", "mic-1", "alice-id"]
    assert "sender_name" not in events[0].metadata and "sender_name" not in events[2].metadata
    assert labels == ["Alice", "Speaker B", "Alice"]


async def test_V6_speaker_change_observer_and_new_speaker_flag() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        changes: list[SpeakerChangeEvent] = []

        @kit.hook(HookTrigger.ON_SPEAKER_CHANGE)
        async def heard(change: SpeakerChangeEvent, ctx: HookContext) -> None:
            changes.append(change)

        await run(kit, channel)
    assert [(c.previous_speaker, c.speaker, c.is_new_speaker) for c in changes] == [
        (None, "Speaker A", True), ("Speaker A", "Speaker B", True), ("Speaker B", "Speaker A", False)]


def ship_it_no_wait() -> ScriptedWords:
    """One final with two voices' words: Alice's "Ship it?" then Bob's "No, wait." (the STT
    gives them one speaker id: who said which is the stage's to say)."""
    return ScriptedWords([[
        SpokenWord("ship", 0.1, 0.4, 0, "Ship"), SpokenWord("it", 0.45, 0.7, 0, "it?"),
        SpokenWord("no", 0.95, 1.2, 0, "No,"), SpokenWord("wait", 1.25, 1.6, 0, "wait."),
    ]])


async def test_V5_pipeline_speakers_split_one_utterance_into_two_turns() -> None:
    one_utterance = ship_it_no_wait()  # the STT labels nobody apart: one speaker id throughout
    stage = ScriptedStage(SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                           SpeakerSegment(0.85, 2.0, "Bob")]))
    async with DeepgramTestServer(one_utterance) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage)
        kit = await voice_room(channel)
        events = await run(kit, channel)
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No, wait.")]
    assert stage.fed > 0


class HoldingStage(ScriptedStage):
    """A stage that decides nothing while fed and everything at `flush()` (the embedded live
    stage holds its last second back until the stream ends)."""

    abilities = StageAbilities(decides_late=True)

    def feed(self, audio: np.ndarray) -> SpeakerTimeline:
        self.fed += len(audio)
        return SpeakerTimeline([])

    def flush(self) -> SpeakerTimeline:
        return self.timeline


async def test_V5_the_end_of_a_stream_waits_for_what_the_stage_still_holds() -> None:
    """At the end of a stream the stage decides what it held back before the last words are
    given a speaker: they never fall back to the stream's owner."""
    one_utterance = ship_it_no_wait()
    stage = HoldingStage(SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                          SpeakerSegment(0.85, 1.7, "Bob")]))
    async with DeepgramTestServer(one_utterance) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage, speaker_wait=30.0)
        kit = await voice_room(channel)
        events = await run(kit, channel)
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No, wait.")]


async def test_V5_words_wait_for_a_stage_that_decides_late() -> None:
    one_utterance = ship_it_no_wait()
    stage = ScriptedStage(SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                           SpeakerSegment(0.85, 1.7, "Bob")]), lag=1.0)
    async with DeepgramTestServer(one_utterance) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage, speaker_wait=2.0)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await stream(session, AUDIO, 16000, speed=8.0)  # the final comes before Bob is decided
        await session.finish()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No, wait.")]


async def test_V5_a_word_without_duration_waits_for_the_word_it_touches() -> None:
    # Whisper gives some onsets no duration: "Good" at 0.95-0.95 belongs to Bob's "morning", not
    # to Alice, whose segment the stage decided first and which ends right there.
    words = ScriptedWords([[
        SpokenWord("meeting", 0.3, 0.7, 0, "meeting."), SpokenWord("good", 0.95, 0.95, 0, "Good"),
        SpokenWord("morning", 0.95, 1.4, 0, "morning."),
    ]])
    stage = ScriptedStage(SpeakerTimeline([SpeakerSegment(0.0, 0.95, "Alice"),
                                           SpeakerSegment(0.95, 2.0, "Bob")]), lag=1.0)
    async with DeepgramTestServer(words) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage, speaker_wait=2.0)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await stream(session, AUDIO, 16000, speed=8.0)
        await session.finish()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "meeting."),
                                                                   ("Bob", "Good morning.")]


@pytest.mark.parametrize("provisional", [True, False])
async def test_V5_a_turn_s_last_words_take_the_continuing_voice_before_the_stage_decides(
    provisional: bool,
) -> None:
    """Issue 10 (latency): a turn's last words need not wait for the stage's decision when its
    provisional frames continue the voice before them; a change of voice still waits for it."""
    words = ship_it_no_wait()
    stage = ProvisionalStage(SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                              SpeakerSegment(0.85, 2.0, "Bob")]), lag=1.0)
    async with DeepgramTestServer(words) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage, speaker_wait=30.0, provisional_speakers=provisional)
        kit = await voice_room(channel)
        both = asyncio.Event()

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def count(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            if event.sender_name == "Bob":
                both.set()
            return HookResult.allow()

        session = await channel.start_session("room", "mic-1")
        # 2.2 s of audio: the final (1.6 s + 0.3 s endpointing) comes, and the stage has decided
        # Bob's first word (0.95 + 1.0 s) but not his last (1.6 + 1.0 s)
        await stream(session, AUDIO[: int(2.2 * 16000)], 16000, speed=8.0)
        committed = asyncio.create_task(both.wait())
        done, _ = await asyncio.wait([committed], timeout=30.0 if provisional else 3.0)
        committed.cancel()
        await session.finish()  # the stream ends: what the stage decides now commits the rest
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No, wait.")]
    # with provisional speakers both turns were out before the stream ended; without, Bob's
    # waited for the stage to decide his last word
    assert bool(done) is provisional
    assert stage.fed == int(2.2 * 16000)


class RecentStage(ScriptedStage):
    """A stage that can hand over only its segments ending after a time (the embedded live
    stage's `recent`); it records what the channel asked for and how much it handed over."""

    abilities = StageAbilities(recent_view=True)

    def __init__(self, timeline: SpeakerTimeline) -> None:
        super().__init__(timeline)
        self.asked: list[tuple[float, int]] = []

    def recent(self, since: float) -> SpeakerTimeline:
        heard = self.fed / 16000
        segments = [s for s in self.timeline.segments if s.start < heard and s.end > since]
        self.asked.append((since, len(segments)))
        return SpeakerTimeline(segments)


async def test_V5_the_channel_holds_only_the_recent_timeline_of_a_long_stream() -> None:
    """Issue 10 (cost that grows with the stream): every waiting word searched the stage's whole
    timeline, milliseconds per word after a few hours. The channel asks a stage that can answer
    it for the segments after its earliest word still to place, and places words as before."""
    earlier = [SpeakerSegment(t, t + 0.9, "Carol" if int(t) % 2 else "Dave")
               for t in np.arange(0.0, 19.0, 1.0)]
    stage = RecentStage(SpeakerTimeline([*earlier, SpeakerSegment(20.0, 20.85, "Alice"),
                                         SpeakerSegment(20.85, 22.0, "Bob")]))
    words = ScriptedWords([[SpokenWord(w.word, w.start + 20.0, w.end + 20.0, 0, w.punctuated_word)
                            for w in ship_it_no_wait().finals[0]]])
    async with DeepgramTestServer(words) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), pipeline_speakers=True,
                               diarizer=stage)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        await stream(session, np.zeros(16000 * 23, np.float32), 16000, speed=20.0)
        await eventually(lambda: session.stt.final_until > 21.0, what="the words' final")
        await turns_of(session, np.zeros(16000 * 2, np.float32), 16000, speed=20.0)  # fed on
        await kit.drain()
        events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No, wait.")]
    # once the words came: asked from the first word (20.1 s) less the 10 s kept, so the
    # stream's first 10 s (10 of its 21 segments) were no longer handed over
    late = [(since, n) for since, n in stage.asked if since > 0]
    assert late and all(since >= 20.1 - 10.0 - 1e-6 for since, _ in late)
    assert max(n for _, n in late) <= 11


def test_V5_pipeline_speakers_without_a_stage_is_refused() -> None:
    with pytest.raises(ValueError, match="pipeline_speakers=True needs a diarization stage"):
        VoiceChannel(stt=DeepgramSTT("k", url="ws://127.0.0.1:1"), pipeline_speakers=True)


async def test_V9_audio_arriving_while_the_agent_speaks_is_not_transcribed() -> None:
    async with DeepgramTestServer(ScriptedWords([])) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), echo_tail=0.0)
        kit = await voice_room(channel)
        session = await channel.start_session("room", "mic-1")
        loud = (0.2 * np.sin(np.arange(16000) / 5)).astype(np.float32)
        # a 2 s reply: the mic's quarter second lands inside it, however loaded the machine
        await channel.play("room", float_to_pcm16(np.zeros(32000, np.float32)), 16000)
        await stream(session, loud[:4000], 16000)  # the room mic hears the reply: gated
        await eventually(lambda: not channel.is_playing("room"), 30, "the reply to end")
        await stream(session, loud[:4000], 16000)  # after the reply: heard
        await session.finish()
        heard = np.frombuffer(bytes(server.connections[0].audio), dtype="<i2")
    assert isinstance(channel, __import__("rooms").AudioSink)
    assert session.gated_seconds == pytest.approx(0.25)
    assert not heard[:4000].any() and heard[4000:8000].any()
    assert channel.played == [("room", 64000, 16000)]
    del kit


async def test_V9_an_ungated_stream_is_heard_while_the_agent_speaks() -> None:
    """V9 gates a microphone the reply plays into (a speakerphone; the server's phone legs too).
    A stream whose device cancels the reply's echo itself (a device declaring `echo_cancelled`)
    is opened with `echo_gate=False` and heard over the reply, while the room's speakerphone
    stays gated."""
    async with DeepgramTestServer(ScriptedWords([])) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), echo_tail=0.0)
        kit = await voice_room(channel)
        speakerphone = await channel.start_session("room", "mic-1")
        phone = await channel.start_session("room", "caller-1", echo_gate=False)
        loud = (0.2 * np.sin(np.arange(16000) / 5)).astype(np.float32)
        await channel.play("room", float_to_pcm16(np.zeros(320000, np.float32)), 16000)  # 20 s
        await stream(speakerphone, loud[:4000], 16000)
        await stream(phone, loud[:4000], 16000)  # the caller talks over the reply
        assert channel.is_playing("room")  # both quarter seconds landed inside the reply
        await speakerphone.finish()
        await phone.finish()
        heard = {c.index: np.frombuffer(bytes(c.audio), dtype="<i2") for c in server.connections}
    assert speakerphone.gated_seconds == pytest.approx(0.25) and phone.gated_seconds == 0
    assert not heard[0][:4000].any() and heard[1][:4000].any()
    del kit


async def test_V9_a_device_that_stopped_the_reply_is_heard_until_another_plays() -> None:
    """`reply_stopped()` (the device stopped the reply: someone talked over it): the stream is
    heard at once for the rest of the room's playback window, and the last `GATE_LOOKBEHIND_S`
    of what it heard while gated (the speech that made the device stop the reply) reaches the
    STT as it was; what came before that stays silenced. A reply played after it gates the
    stream again, and other streams stay gated throughout."""
    async with DeepgramTestServer(ScriptedWords([])) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url), echo_tail=0.0)
        kit = await voice_room(channel)
        desk = await channel.start_session("room", "desk")
        other = await channel.start_session("room", "mic-2")
        loud = (0.2 * np.sin(np.arange(16000) / 5)).astype(np.float32)
        reply = float_to_pcm16(np.zeros(320000, np.float32))  # 20 s
        await channel.play("room", reply, 16000)
        await stream(desk, loud, 16000)  # 1 s, gated
        desk.reply_stopped()
        await stream(desk, loud[:4000], 16000)  # heard, the window still open
        await stream(other, loud[:4000], 16000)  # gated: it did not stop anything
        await channel.play("room", reply, 16000)  # another reply: the window grows
        await stream(desk, loud[:4000], 16000)  # gated again
        assert channel.is_playing("room")
        await desk.finish()
        await other.finish()
        heard = {c.index: np.frombuffer(bytes(c.audio), dtype="<i2") for c in server.connections}
    cut = int((1.0 - GATE_LOOKBEHIND_S) * 16000)
    assert not heard[0][:cut].any()
    assert np.count_nonzero(heard[0][cut:20000]) >= 20000 - cut - 5  # (a few samples round to 0)
    assert not heard[0][20000:24000].any() and not heard[1][:4000].any()
    assert desk.gated_seconds == pytest.approx(1.0 - GATE_LOOKBEHIND_S + 0.25)
    assert other.gated_seconds == pytest.approx(0.25)
    del kit


async def test_V10_bad_live_frames_are_refused_and_other_streams_lose_nothing() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)
        with pytest.raises(UnsupportedEncodingError, match="unsupported encoding 'opus'"):
            await channel.start_session("room", "mic-0", encoding="opus")  # type: ignore[arg-type]
        bad = await channel.start_session("room", "mic-bad")
        good = await channel.start_session("room", "mic-good")
        with pytest.raises(FrameSizeError, match="absurd frame size"):
            bad.push(b"\x00" * (16000 * 2 * 11))
        await stream(bad, AUDIO[:1600], 16000)  # the bad stream itself goes on
        good_turns = await turns_of(good, AUDIO, 16000)
        await bad.finish()
    assert bad.skipped_frames and "absurd frame size" in bad.skipped_frames[0]
    assert [t.text for t in good_turns] == ["Hello everyone.", "Hi.", "How are you?"]
    del kit


async def test_V1_stereo_48k_stream_reaches_the_stt_as_16k_mono_and_may_pause() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        await voice_room(channel)
        session = await channel.start_session("room", "mic-1", sample_rate=48000, channels=2)
        tone = (0.1 * np.sin(np.arange(48000) / 7)).astype(np.float32)
        stereo = np.repeat(tone, 2)  # interleaved L R
        pcm = float_to_pcm16(stereo)
        for i in range(0, len(pcm), 1001):  # odd frame sizes split samples across frames
            session.push(pcm[i : i + 1001])
        session.pause()
        assert session.push(pcm[:4000]) == 0  # dropped while paused
        session.resume()
        await session.finish()
        received = len(server.connections[0].audio) // 2
    assert abs(received - 16000) <= 64  # one second of 16 kHz mono


async def test_V10_a_failing_hook_drops_its_turn_only() -> None:
    async with DeepgramTestServer(script()) as server:
        channel = VoiceChannel(stt=DeepgramSTT("k", url=server.url))
        kit = await voice_room(channel)

        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        def broken(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            if event.speaker == "Speaker B":
                raise RuntimeError("hook bug")
            return HookResult.allow()

        events = await run(kit, channel)
    assert [e.text for e in events] == ["Hello everyone.", "How are you?"]
    assert len(server.connections) == 1  # not mistaken for a dropped STT connection


async def test_a_finished_session_frees_its_audio_without_waiting_for_the_collector() -> None:
    """Issue 10 (soak): a finished session sits in reference cycles (its STT stream calls back
    into it), so its audio log (about 5 MB a meeting) waited for a full garbage collection,
    minutes apart in a server: `chorus serve`'s RSS grew by a meeting's audio per meeting."""
    import gc
    import weakref

    channel = VoiceChannel(stt=UtteranceSTT([]))  # a local engine that hears no words
    await voice_room(channel)
    session = await channel.start_session("room", "mic-1")
    await stream(session, AUDIO, 16000, speed=0)
    held = weakref.ref(session.audio._data)
    gc.disable()
    try:
        await session.finish()
        del session
        assert held() is None
        assert channel.sessions == []
    finally:
        gc.enable()


SHIP_IT_NO = [("Ship", 0.1, 0.4), ("it?", 0.45, 0.7), ("No,", 0.95, 1.2)]
"""One utterance: Alice's "Ship it?", then the first word of the next voice at its end (as a
Whisper utterance ends where the overlapping next voice is cut off by a pause or the cap)."""


async def _first_turn_within(kit: RoomKit, seconds: float) -> bool:
    """Whether a turn is committed within `seconds` (a negative check: a turn that is
    not due may take no longer than this to fail to appear)."""
    committed = asyncio.Event()

    @kit.hook(HookTrigger.ON_TRANSCRIPTION)
    def seen(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
        committed.set()
        return HookResult.allow()

    try:
        await asyncio.wait_for(committed.wait(), seconds)
    except TimeoutError:
        return False
    return True


@pytest.mark.parametrize("on", [True, False])
async def test_V5_a_turn_ends_when_the_stage_first_hears_the_next_voice(on: bool) -> None:
    """Issue 10 (latency): a turn that ends where another voice begins is committed as soon as
    the stage's provisional view hears that voice on the next word, not when the stage has
    decided that word (0.9-1.4 s of audio after it with the embedded stage)."""
    stt = UtteranceSTT([(1.5, SHIP_IT_NO, True)])
    stage = ProvisionalStage(SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                              SpeakerSegment(0.85, 3.0, "Bob")]), lag=1.0)
    channel = VoiceChannel(stt=stt, pipeline_speakers=True, diarizer=stage, speaker_wait=30.0,
                           provisional_changes=on)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic-1")
    watching = asyncio.create_task(_first_turn_within(kit, 30.0 if on else 3.0))
    # 1.6 s of audio: the utterance is final, the stage has decided up to 0.6 s: Alice's words,
    # not Bob's "No," (0.95 s), which it hears as Bob only provisionally
    await stream(session, AUDIO[: int(1.6 * 16000)], 16000, speed=8.0)
    assert await watching is on
    await stream(session, AUDIO[int(1.6 * 16000) : int(3.0 * 16000)], 16000, speed=8.0)
    await session.finish()  # the stage has decided "No," by now: Bob's, as heard
    events = await kit.list_events("room")
    assert [(e.metadata["sender_name"], e.text) for e in events] == [("Alice", "Ship it?"),
                                                                   ("Bob", "No,")]
    assert "corrected" not in events[0].metadata


async def test_V5_a_turn_ended_early_goes_on_in_place_when_the_voice_went_on() -> None:
    """Issue 10: the provisional view heard another voice on the next word, so the turn was
    committed; the decision then gives that word the turn's voice: the turn is reopened and
    updated in place (`corrected`), never split into two turns of one voice."""
    stt = UtteranceSTT([(1.5, SHIP_IT_NO, False), (2.0, [("wait.", 1.25, 1.6)], True)])
    stage = ProvisionalStage(SpeakerTimeline([SpeakerSegment(0.0, 3.0, "Alice")]), lag=1.0,
                             guess=SpeakerTimeline([SpeakerSegment(0.0, 0.85, "Alice"),
                                                    SpeakerSegment(0.85, 1.22, "Bob"),
                                                    SpeakerSegment(1.22, 3.0, "Alice")]))
    channel = VoiceChannel(stt=stt, pipeline_speakers=True, diarizer=stage, speaker_wait=30.0)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic-1")
    watching = asyncio.create_task(_first_turn_within(kit, 30.0))
    await stream(session, AUDIO[: int(1.6 * 16000)], 16000, speed=8.0)
    assert await watching  # closed early on the provisional "Bob"
    early = await kit.list_events("room")
    assert [e.text for e in early] == ["Ship it?"]
    await stream(session, AUDIO[int(1.6 * 16000) :], 16000, speed=8.0)
    turns = await session.finish()
    events = await kit.list_events("room")
    assert [(e.id, e.metadata["sender_name"], e.text) for e in events] == [
        (early[0].id, "Alice", "Ship it? No, wait.")]
    assert events[0].metadata["corrected"] is True
    assert events[0].metadata["end"] == 1.6
    assert [t.text for t in turns] == ["Ship it? No, wait."]
    assert session.corrections == 1


async def test_V5_the_stt_is_told_where_the_stage_decided_one_voice_gave_way_to_another() -> None:
    """Issue 10 (latency): where the stage has decided that one voice ended while another goes
    on (overlapping, or after a pause too short to end the utterance), the STT is told once, at
    the first voice's end, so Whisper can end its utterance there. A short voice inside a longer
    one (a backchannel), a long pause, and what is not decided yet are not changes."""
    stt = UtteranceSTT([])
    stage = DecidingStage(SpeakerTimeline([
        SpeakerSegment(0.0, 1.6, "Alice"), SpeakerSegment(1.3, 3.0, "Bob"),  # handover at 1.6
        SpeakerSegment(1.8, 2.2, "Alice"),  # Alice's backchannel inside Bob's turn
        SpeakerSegment(3.8, 5.0, "Alice"),  # after a 0.8 s pause: the VAD's to cut
        SpeakerSegment(4.9, 5.8, "Bob"),  # Alice's end at 5.0: decided only after 6.0 s
    ]), lag=1.0)
    channel = VoiceChannel(stt=stt, pipeline_speakers=True, diarizer=stage)
    await voice_room(channel)
    session = await channel.start_session("room", "mic-1")
    await stream(session, np.zeros(int(5.6 * 16000), np.float32), 16000, speed=8.0)
    await eventually(lambda: stage.fed == int(5.6 * 16000), 30, "the stage heard the stream")
    assert stt.voice_changes == [1.6]
    await session.finish()


async def test_V5_a_turn_cut_at_a_decided_handover_does_not_wait_for_the_next_piece() -> None:
    """Issue 10: Whisper cut its utterance where the stage decided Alice handed over to Bob (a
    piece that is not the end of speech: Bob talks on). Alice's run is the piece's last, and
    nothing follows it until Bob's piece is decoded (seconds later); the decided handover right
    after her last word closes her turn now."""
    stt = UtteranceSTT([(1.7, SHIP_IT_NO[:2], False), (9.0, [("No,", 1.7, 2.0)], True)])
    stage = DecidingStage(SpeakerTimeline([SpeakerSegment(0.0, 0.8, "Alice"),
                                           SpeakerSegment(0.8, 8.0, "Bob")]), lag=1.0)
    channel = VoiceChannel(stt=stt, pipeline_speakers=True, diarizer=stage, speaker_wait=30.0)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic-1")
    watching = asyncio.create_task(_first_turn_within(kit, 30.0))
    await stream(session, np.zeros(int(3.0 * 16000), np.float32), 16000, speed=8.0)
    assert await watching  # before Bob's piece (at 9 s of audio) was decoded
    assert stt.voice_changes == [0.8]
    assert [e.text for e in await kit.list_events("room")] == ["Ship it?"]
    await session.finish()
