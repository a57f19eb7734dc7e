"""Audio mode (R3) pulls each turn's audio from the channel that posted the turn
(`rooms.TurnAudioSource`), when the turn is delivered.

A real `VoiceChannel` (the real Deepgram client against the local Deepgram-protocol server) and
the recorder realtime session (it records the client events a model would get, payloads
included with `record_audio=True`) share one room. What must hold:

- each turn's committed audio is exactly that turn's span of what the stream's session accepted,
  resampled to the model's rate and converted to PCM16 once; audio no turn claims is never
  converted at all (the push design converted every frame: float → int16 → float → int16);
- the last turns of a stream, committed while `finish()` flushes it, still get their audio;
- a turn whose audio is gone (its session finished before the turn was delivered), a voice turn
  from a channel that holds no audio, and a source that fails all reach the model as their text
  line, and nothing else breaks;
- `replay_turns` (no voice channel: the recording is the source) cuts the same spans;
- overlapping turns (two voices at once) each get their whole span.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import voice.channel
from models import TextContent, VoiceTurn
from realtime import AnswerNever, RealtimeChannel, replay_turns
from realtime.session import SentEvent
from rooms import Channel, RoomKit, TextChannel, TurnAudioSource
from voice.audio import float_to_pcm16, pcm16_to_float, resample
from voice.channel import VoiceChannel, pcm16_frames
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord

RATE = 16_000
MODEL_RATE = 24_000  # the recorder (like OpenAI Realtime) takes 24 kHz input


def script() -> ScriptedWords:
    """Alice, Bob, Alice again. The stream below ends at 2.8 s, before the last final's
    endpointing (2.7 + 0.3 s): that turn is only committed when `finish()` flushes the STT."""
    return ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello"), SpokenWord("everyone", 0.5, 0.9, 0, "everyone.")],
        [SpokenWord("hi", 1.3, 1.5, 1, "Hi.")],
        [SpokenWord("how", 2.0, 2.2, 0, "How"), SpokenWord("are", 2.25, 2.4, 0, "are"),
         SpokenWord("you", 2.45, 2.7, 0, "you?")],
    ])


def noise(seconds: float) -> np.ndarray[Any, Any]:
    """A waveform no two spans of which look alike, exactly representable as PCM16."""
    rng = np.random.default_rng(7)
    ints = rng.integers(-12_000, 12_000, int(seconds * RATE), dtype=np.int16)
    return pcm16_to_float(ints.tobytes())


def turn_audio_sent(sent: list[SentEvent]) -> list[bytes]:
    """The audio of each committed turn, as the model received it (appends up to each commit)."""
    turns: list[bytes] = []
    pending = bytearray()
    for event in sent:
        if event.type == "input_audio_buffer.append":
            pending.extend(base64.b64decode(event.event["audio"]))
        elif event.type == "input_audio_buffer.commit":
            turns.append(bytes(pending))
            pending.clear()
    assert not pending, "audio appended but never committed"
    return turns


def expected(audio: np.ndarray[Any, Any], turn: VoiceTurn, rate: int = MODEL_RATE) -> bytes:
    """A turn's span of the stream, resampled to the model's rate (computed from the input)."""
    span = audio[round(turn.start * RATE) : round(turn.end * RATE)]
    return float_to_pcm16(resample(span, RATE, rate))


class Room:
    def __init__(self, kit: RoomKit, voice: VoiceChannel, rt: RealtimeChannel) -> None:
        self.kit, self.voice, self.rt = kit, voice, rt

    @property
    def sent(self) -> list[SentEvent]:
        return list(self.rt.session_for("r").sent)

    def items(self) -> list[str]:
        return [
            e.event["item"]["content"][0]["text"]
            for e in self.sent
            if e.type == "conversation.item.create"
        ]


async def open_room(stt_url: str) -> Room:
    kit = RoomKit()
    await kit.create_room(room_id="r")
    voice_channel = VoiceChannel("voice", stt=DeepgramSTT("k", url=stt_url))
    rt = RealtimeChannel("rt", "recorder", audio_mode=True, record_audio=True,
                         policy=AnswerNever())
    for channel in (voice_channel, rt):
        kit.register_channel(channel)
        await kit.attach_channel("r", channel.channel_id)
    return Room(kit, voice_channel, rt)


class ConversionCounter:
    """Counts the samples `voice.channel` converts float → PCM16 (the one conversion a turn's
    audio goes through)."""

    def __init__(self, real: Callable[[Any], bytes]) -> None:
        self.real = real
        self.samples = 0
        self.calls = 0

    def __call__(self, audio: Any) -> bytes:
        self.calls += 1
        self.samples += len(audio)
        return self.real(audio)


async def test_R3_each_turn_gets_exactly_its_own_span_converted_once_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    audio = noise(2.8)
    frames = pcm16_frames(audio, RATE, 0.05)
    counter = ConversionCounter(voice.channel.float_to_pcm16)
    monkeypatch.setattr(voice.channel, "float_to_pcm16", counter)
    async with DeepgramTestServer(script()) as server:
        room = await open_room(server.url)
        session = await room.voice.start_session("r", "mic-1", session_id="mic-1")
        for frame in frames:
            session.push(frame)
        before_finish = len(session.turns)
        await session.finish()
        await room.rt.wait_idle("r")
    turns = [VoiceTurn.of(t.event) for t in session.turns]
    assert [t.speaker_label for t in turns if t] == ["Speaker A", "Speaker B", "Speaker A"]
    assert before_finish < 3, "the last turn must be one that finish() committed"
    sent = turn_audio_sent(room.sent)
    assert len(sent) == 3  # every turn, the one committed while finishing included
    for turn, got in zip(turns, sent, strict=True):
        assert turn is not None
        assert got == expected(audio, turn)  # that span of what the session accepted, exactly
    # one conversion per turn, of the turn's samples only: the other ~1.1 s of the stream (the
    # pauses no turn claims) was never converted
    assert counter.calls == 3
    assert counter.samples == sum(len(got) // 2 for got in sent)
    assert counter.samples < 0.65 * len(audio) * MODEL_RATE / RATE
    await room.kit.close()


async def test_R3_a_turn_delivered_after_its_session_finished_goes_as_its_text_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The voice channel keeps a session readable until `finish()` returns, which is after its
    turns were delivered (`post_event` returns after delivery). A turn that arrives later (here:
    posted after the session finished) cannot get audio: the model gets its text line instead."""
    async with DeepgramTestServer(ScriptedWords([])) as server:
        room = await open_room(server.url)
        session = await room.voice.start_session("r", "mic-1", session_id="mic-1")
        session.push_audio(noise(1.0))
        assert room.voice.turn_audio(VoiceTurn("Speaker A", 0.0, 0.5, "mic-1"), RATE)
        await session.finish()
        late = VoiceTurn("Speaker A", 0.0, 0.5, "mic-1")
        assert room.voice.turn_audio(late, RATE) is None
        with caplog.at_level(logging.WARNING, "realtime.channel"):
            await room.kit.post_event("r", "voice", TextContent(body="Too late for audio."),
                                      metadata=late.metadata())
            await room.rt.wait_idle("r")
    types = [e.type for e in room.sent]
    assert not [t for t in types if t.startswith("input_audio_buffer")]
    assert room.items() == ["Too late for audio."]
    assert "no longer held: sent as text" in caplog.text
    await room.kit.close()


async def test_R3_any_span_reads_exactly_the_sessions_samples_there() -> None:
    """Property, over one live session: a span inside what the session holds gives exactly its
    samples (at the log's rate, untouched; at another rate, the span's length there); a span
    outside it, or empty, gives None; another stream's id gives None."""
    audio = noise(3.0)
    async with DeepgramTestServer(ScriptedWords([])) as server:
        room = await open_room(server.url)
        session = await room.voice.start_session("r", "mic-1", session_id="mic-1")
        session.push_audio(audio)
        held = float_to_pcm16(audio)

        @settings(max_examples=60, deadline=None)
        @given(start=st.floats(0.0, 3.0), length=st.floats(0.0, 3.0),
               rate=st.sampled_from([8_000, 16_000, 24_000, 48_000]))
        def check(start: float, length: float, rate: int) -> None:
            end = start + length
            got = room.voice.turn_audio(VoiceTurn("Speaker A", start, end, "mic-1"), rate)
            begin, stop = round(start * RATE), min(round(end * RATE), len(audio))
            if stop <= begin:
                assert got is None
            elif rate == RATE:
                assert got == held[begin * 2 : stop * 2]
            else:
                assert got is not None
                assert abs(len(got) // 2 - (stop - begin) * rate / RATE) <= 1

        check()
        assert room.voice.turn_audio(VoiceTurn("Speaker A", 3.5, 4.0, "mic-1"), RATE) is None
        assert room.voice.turn_audio(VoiceTurn("Speaker A", 0.0, 1.0, "mic-2"), RATE) is None
        await session.finish()
    await room.kit.close()


class FailingSource(Channel):
    """A voice-like channel whose audio cannot be read."""

    def turn_audio(self, turn: VoiceTurn, sample_rate: int) -> bytes | None:
        raise OSError("disk gone")


async def test_R3_a_voice_turn_from_a_channel_without_audio_or_a_failing_one_goes_as_text(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kit = RoomKit()
    await kit.create_room(room_id="r")
    rt = RealtimeChannel("rt", "recorder", audio_mode=True, policy=AnswerNever())
    plain = TextChannel("plain")  # posts voice metadata but is no TurnAudioSource
    failing = FailingSource("failing")
    assert isinstance(failing, TurnAudioSource) and not isinstance(plain, TurnAudioSource)
    for channel in (rt, plain, failing):
        kit.register_channel(channel)
        await kit.attach_channel("r", channel.channel_id)
    turn = VoiceTurn("Speaker A", 0.0, 1.0, "mic-1")
    with caplog.at_level(logging.WARNING, "realtime.channel"):
        await kit.post_event("r", "plain", TextContent(body="No audio here."),
                             metadata=turn.metadata())
        await kit.post_event("r", "failing", TextContent(body="Nor here."),
                             metadata=turn.metadata())
        await rt.wait_idle("r")
    sent = rt.session_for("r").sent
    assert not [e for e in sent if e.type.startswith("input_audio_buffer")]
    texts = [e.event["item"]["content"][0]["text"] for e in sent
             if e.type == "conversation.item.create"]
    assert len(texts) == 2 and "No audio here." in texts[0] and "Nor here." in texts[1]
    assert "holds no audio: sent as text" in caplog.text
    assert "disk gone" in caplog.text
    await kit.close()


async def test_R3_replay_cuts_each_turn_from_the_recording() -> None:
    """`replay_turns` has no voice channel: its turn channel is the source, over the recording."""
    audio = noise(5.0)
    pcm = float_to_pcm16(audio)
    turns: list[dict[str, Any]] = [
        {"speaker": "Speaker A", "text": "Tuesday works for me.", "start": 0.0, "end": 1.5},
        {"speaker": "Speaker B", "text": "Fine.", "start": 1.8, "end": 3.0},
        {"speaker": "Speaker A", "text": "Then Tuesday."},  # no times: the rest of the recording
    ]
    result = await replay_turns(turns, "recorder", audio=(pcm, RATE), policy=AnswerNever(),
                                record_audio=True)
    spans = [VoiceTurn("", 0.0, 1.5, ""), VoiceTurn("", 1.8, 3.0, ""), VoiceTurn("", 3.0, 5.0, "")]
    assert turn_audio_sent(result.sent) == [expected(audio, span) for span in spans]
    # at the session's own rate a turn's bytes are the recording's, untouched
    at_model_rate = float_to_pcm16(resample(audio, RATE, MODEL_RATE))
    same = await replay_turns(turns[:1], "recorder", audio=(at_model_rate, MODEL_RATE),
                              record_audio=True)
    assert turn_audio_sent(same.sent) == [at_model_rate[: round(1.5 * MODEL_RATE) * 2]]


async def test_R3_overlapping_turns_each_get_their_whole_span() -> None:
    """Two voices at once (the demo meeting has two such overlaps): each turn is cut from the
    stream by its own times, so the later turn keeps the overlap too. (A held buffer that a turn
    consumed up to its end gave the later turn only what came after the earlier one's end.)"""
    audio = noise(3.0)
    turns: list[dict[str, Any]] = [
        {"speaker": "Speaker A", "text": "I think we should", "start": 0.0, "end": 1.5},
        {"speaker": "Speaker B", "text": "No, wait.", "start": 1.2, "end": 3.0},
    ]
    result = await replay_turns(turns, "recorder", audio=(float_to_pcm16(audio), RATE),
                                policy=AnswerNever(), record_audio=True)
    spans = [VoiceTurn("", 0.0, 1.5, ""), VoiceTurn("", 1.2, 3.0, "")]
    assert turn_audio_sent(result.sent) == [expected(audio, span) for span in spans]


async def test_replay_refuses_audio_that_is_not_pcm16() -> None:
    with pytest.raises(ValueError, match="16-bit mono PCM"):
        await replay_turns([], "recorder", audio=(b"\x00\x00\x00", RATE))
    with pytest.raises(ValueError, match="positive sample rate"):
        await replay_turns([], "recorder", audio=(b"\x00\x00", 0))
