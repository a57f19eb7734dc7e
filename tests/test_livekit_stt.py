"""`DiarizingSTT` through livekit-agents' own STT stream API, and an `AgentSession` whose LLM
reads the attribution engine's rendering (issue 11, item 3).

The STT is the real Deepgram client against the local Deepgram-protocol server speaking the
generated meeting's script; the adapter is driven exactly as LiveKit drives an STT (`stream()`,
`push_frame`, `flush`, `end_input`, async iteration). The `AgentSession` is livekit-agents' real
session with a recording `llm.LLM` (the same role as livekit-agents' own fake LLM in its tests,
which its wheel does not ship).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
from livekit import rtc
from livekit.agents import AgentSession, llm, stt
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions
from livekit.agents.voice.io import AudioInput

from attribution import NOTE
from livekit_worker.chat_context import AttributedAgent
from livekit_worker.stt_adapter import DiarizingSTT
from rooms import HookContext, HookResult, HookTrigger
from tests.livekit_helpers import MEETING_DIR, RATE, clip, meeting_pcm
from voice.channel import TranscriptionEvent
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import (
    DeepgramTestServer,
    MeetingWords,
    ScriptedWords,
    SpokenWord,
)

SPAN = (0.0, 15.7)  # Alice, Bob, Carol, Alice: four turns, no overlap
SCRIPT = [("Alice", 0.6, 4.198), ("Bob", 4.698, 8.87), ("Carol", 9.27, 12.613),
          ("Alice", 13.113, 15.533)]


def frames(pcm: np.ndarray, rate: int = RATE, ms: int = 20) -> list[rtc.AudioFrame]:
    step = rate * ms // 1000
    return [rtc.AudioFrame(pcm[i : i + step].tobytes(), rate, 1, len(pcm[i : i + step]))
            for i in range(0, len(pcm), step)]


async def recognize(adapter: DiarizingSTT, pcm: np.ndarray, *, flush_at: float | None = None,
                    ) -> list[stt.SpeechEvent]:
    stream = adapter.stream()
    events: list[stt.SpeechEvent] = []
    try:
        for i, frame in enumerate(frames(pcm)):
            stream.push_frame(frame)
            if flush_at is not None and i == int(flush_at / 0.02):
                stream.flush()
        stream.end_input()
        async for event in stream:
            events.append(event)
    finally:
        await stream.aclose()
    return events


def finals(events: list[stt.SpeechEvent]) -> list[stt.SpeechData]:
    return [e.alternatives[0] for e in events if e.type == stt.SpeechEventType.FINAL_TRANSCRIPT]


def script_text(speaker_turn: int) -> str:
    words = MeetingWords.from_meeting(MEETING_DIR).words
    _, start, end = SCRIPT[speaker_turn]
    return " ".join(w.punctuated_word or w.word for w in words
                    if start <= (w.start + w.end) / 2 <= end)


async def test_speaker_id_changes_at_the_scripted_speaker_changes(
    deepgram: DeepgramTestServer,
) -> None:
    adapter = DiarizingSTT(DeepgramSTT("k", url=deepgram.url))
    assert adapter.capabilities.streaming and adapter.capabilities.diarization
    events = await recognize(adapter, clip(meeting_pcm(), *SPAN))
    runs = finals(events)
    assert [r.speaker_id for r in runs] == ["Speaker A", "Speaker B", "Speaker C", "Speaker A"]
    assert [r.text for r in runs] == [script_text(i) for i in range(4)]
    for run, (_, start, end) in zip(runs, SCRIPT, strict=True):  # the runs sit on the script's turns
        assert start - 0.05 <= run.start_time and run.end_time <= end + 0.05
    # one START / FINAL / END triple per speaker run
    kinds = [e.type for e in events]
    assert kinds == [stt.SpeechEventType.START_OF_SPEECH, stt.SpeechEventType.FINAL_TRANSCRIPT,
                     stt.SpeechEventType.END_OF_SPEECH] * 4


async def test_speaker_id_is_the_name_an_on_transcription_hook_gave(
    deepgram: DeepgramTestServer,
) -> None:
    adapter = DiarizingSTT(DeepgramSTT("k", url=deepgram.url))

    @adapter.kit.hook(HookTrigger.ON_TRANSCRIPTION)
    def name_alice(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
        if event.text.startswith("Good morning"):  # recognised once; the rename sticks (V6)
            return HookResult.modify(dataclasses.replace(event, sender_name="Alice"))
        return HookResult.allow()

    runs = finals(await recognize(adapter, clip(meeting_pcm(), *SPAN), flush_at=6.0))
    assert [r.speaker_id for r in runs if r.speaker_id == "Alice"] == ["Alice", "Alice"]
    assert runs[0].speaker_id == "Alice" and runs[-1].speaker_id == "Alice"
    assert "Speaker A" not in {r.speaker_id for r in runs}
    assert " ".join(r.text for r in runs) == " ".join(script_text(i) for i in range(4))


async def test_with_a_diarization_stage_the_stage_names_the_voices() -> None:
    """The STT hears one voice (every word speaker 0); the embedded stage splits the meeting."""
    import diarization.embedded  # noqa: F401  (imported on the loop's thread: see build_pipeline)
    from diarization import load_stage

    words = [w for w in MeetingWords.from_meeting(MEETING_DIR).words if w.end <= SPAN[1]]
    one_voice = ScriptedWords([
        [SpokenWord(w.word, w.start, w.end, 0, w.punctuated_word) for w in words
         if start <= (w.start + w.end) / 2 <= end]
        for _, start, end in SCRIPT
    ])
    async with DeepgramTestServer(one_voice) as server:
        adapter = DiarizingSTT(DeepgramSTT("k", url=server.url),
                               diarizer=lambda: load_stage("embedded"))
        runs = finals(await recognize(adapter, clip(meeting_pcm(), *SPAN)))
    ids = [r.speaker_id for r in runs]
    assert len(ids) == 4 and ids[0] == ids[3] and len({ids[0], ids[1], ids[2]}) == 3
    assert [r.text for r in runs] == [script_text(i) for i in range(4)]


async def test_recognize_returns_the_buffer_s_speaker_runs(deepgram: DeepgramTestServer) -> None:
    adapter = DiarizingSTT(DeepgramSTT("k", url=deepgram.url))
    event = await adapter.recognize(frames(clip(meeting_pcm(), 0.0, 9.1)))
    assert event.type == stt.SpeechEventType.FINAL_TRANSCRIPT
    assert [(a.speaker_id, a.text) for a in event.alternatives] == [
        ("Speaker A", script_text(0)), ("Speaker B", script_text(1))]


# ------------------------------------------------------------------ AgentSession


class RecordingLLM(llm.LLM[Any]):
    """An `llm.LLM` that records every chat context it is given and answers one line."""

    def __init__(self, reply: str = "Noted.") -> None:
        super().__init__()
        self.reply = reply
        self.contexts: list[llm.ChatContext] = []
        self.called = asyncio.Event()

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        **_: Any,
    ) -> llm.LLMStream:
        self.contexts.append(chat_ctx.copy())
        self.called.set()
        return _RecordedStream(self, chat_ctx=chat_ctx, tools=tools or [],
                               conn_options=conn_options)


class _RecordedStream(llm.LLMStream):
    async def _run(self) -> None:
        assert isinstance(self._llm, RecordingLLM)
        self._event_ch.send_nowait(
            llm.ChatChunk(id="reply", delta=llm.ChoiceDelta(role="assistant", content=self._llm.reply))
        )


def messages(ctx: llm.ChatContext) -> list[tuple[str, str]]:
    return [(m.role, m.text_content or "") for m in ctx.messages()]


async def reply_to(runs: list[stt.SpeechData]) -> tuple[RecordingLLM, AttributedAgent]:
    recording = RecordingLLM()
    agent = AttributedAgent(instructions="You are Chorus, in a meeting.")
    async with AgentSession(llm=recording) as session:
        await session.start(agent)
        for run in runs:
            await agent.add_speech(stt.SpeechEvent(stt.SpeechEventType.FINAL_TRANSCRIPT,
                                                   alternatives=[run]))
        await session.generate_reply()
    return recording, agent


async def test_agent_session_llm_reads_labelled_lines_for_three_speakers(
    deepgram: DeepgramTestServer,
) -> None:
    adapter = DiarizingSTT(DeepgramSTT("k", url=deepgram.url))
    runs = finals(await recognize(adapter, clip(meeting_pcm(), *SPAN)))
    recording, agent = await reply_to(runs)
    assert len(recording.contexts) == 1
    sent = messages(recording.contexts[0])
    assert sent[0] == ("system", "You are Chorus, in a meeting.")
    users = [text for role, text in sent if role == "user"]
    assert len(users) == 4
    for text, label, i in zip(users, ["Speaker A", "Speaker B", "Speaker C", "Speaker A"],
                              range(4), strict=True):
        assert text.startswith(f'{label}: "{script_text(i)}')
    assert [NOTE in text for text in users] == [False, False, False, True]  # on the trigger
    # the model's reply went back into the room as an unlabelled assistant turn
    assert [(e.source.channel_id, e.text) for e in await agent.kit.list_events(agent.room_id)][-1] \
        == ("assistant", "Noted.")


async def test_agent_session_llm_reads_bare_lines_for_one_speaker(
    deepgram: DeepgramTestServer,
) -> None:
    adapter = DiarizingSTT(DeepgramSTT("k", url=deepgram.url))
    runs = finals(await recognize(adapter, clip(meeting_pcm(), 0.0, 4.45)))
    assert [r.speaker_id for r in runs] == ["Speaker A"]
    recording, _ = await reply_to(runs)
    sent = messages(recording.contexts[0])
    assert sent == [("system", "You are Chorus, in a meeting."), ("user", script_text(0))]


class FramesInput(AudioInput):
    """The session's audio input: the given frames, then nothing more (a quiet microphone)."""

    def __init__(self, frames: list[rtc.AudioFrame]) -> None:
        super().__init__(label="meeting")
        self.frames = list(frames)

    async def __anext__(self) -> rtc.AudioFrame:
        if self.frames:
            await asyncio.sleep(0)  # let the session's tasks run between frames
            return self.frames.pop(0)
        await asyncio.Event().wait()  # a live microphone never ends by itself
        raise StopAsyncIteration


async def test_agent_session_hearing_audio_hands_its_llm_labelled_lines(
    deepgram: DeepgramTestServer,
) -> None:
    """The whole LiveKit path: audio input → `AttributedAgent.stt_node` → `DiarizingSTT` speaker
    runs → the agent's room → `llm_node` renders it. Each run ends a user turn (STT turn
    detection), so the LLM is called once per turn; the last call sees all four, labelled."""
    recording = RecordingLLM()
    agent = AttributedAgent(instructions="You are Chorus, in a meeting.")
    silence = np.zeros(RATE, np.int16)  # after the last word: the STT's end of speech
    pcm = np.concatenate([clip(meeting_pcm(), *SPAN), silence])
    session: AgentSession[None] = AgentSession(
        stt=DiarizingSTT(DeepgramSTT("k", url=deepgram.url)), llm=recording, turn_detection="stt")
    session.input.audio = FramesInput(frames(pcm))
    labels = ["Speaker A", "Speaker B", "Speaker C", "Speaker A"]

    def users(ctx: llm.ChatContext) -> list[str]:
        return [text for role, text in messages(ctx) if role == "user"]

    await session.start(agent)
    try:
        async with asyncio.timeout(120):  # a failure bound
            while not (recording.contexts and len(users(recording.contexts[-1])) == 4):
                recording.called.clear()
                await recording.called.wait()
    finally:
        await session.aclose()
    last = users(recording.contexts[-1])
    for text, label, i in zip(last, labels, range(4), strict=True):
        assert text.startswith(f'{label}: "{script_text(i)}')
    assert NOTE in last[-1] and not any(NOTE in text for text in last[:-1])
    heard = [e for e in await agent.kit.list_events(agent.room_id) if e.source.channel_id != "assistant"]
    assert [e.text for e in heard] == [script_text(i) for i in range(4)]
