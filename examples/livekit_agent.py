"""A LiveKit `AgentSession` with Chorus inside: a diarizing STT and an attributed chat context.

Two pieces from `livekit_worker`, usable in any LiveKit agent:

- `DiarizingSTT(WhisperSTT(), diarizer=…)`: a `livekit.agents.stt.STT` whose stream emits one
  final transcript per speaker run with `SpeechData.speaker_id` set (the embedded diarization
  stage names the voices of one shared microphone; local Whisper transcribes, no key needed);
- `AttributedAgent`: an `Agent` whose LLM reads the conversation as the attribution engine renders
  it (`Alice: "…"` lines once several people speak, the note on the newest turn).

Offline (no LiveKit server, no key): `.venv/bin/python examples/livekit_agent.py` streams the
first 25 s of the generated meeting through the STT exactly as LiveKit would (`push_frame`,
`end_input`, async iteration), prints each speaker run, hands the runs to an `AgentSession` and
prints the chat context its LLM is given (a printing LLM stands in for a model).

In a LiveKit room (needs a server, `LIVEKIT_URL`/`LIVEKIT_API_KEY`/`LIVEKIT_API_SECRET`, and a
LiveKit Inference model): `.venv/bin/python -m livekit.agents start examples/livekit_agent.py --dev`
runs the module's `server`, whose session listens to the room with the same two pieces.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from livekit import agents, rtc
from livekit.agents import AgentSession, llm, stt
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions

from diarization import load_stage
from livekit_worker import AttributedAgent, DiarizingSTT
from voice.stt.whisper import WhisperSTT

MEETING = Path(__file__).resolve().parent / "meeting" / "meeting.wav"
INSTRUCTIONS = "You are Chorus, the meeting's assistant. Answer briefly."


def diarizing_stt(whisper: WhisperSTT | None = None) -> DiarizingSTT:
    import diarization.embedded  # noqa: F401  (imported on the loop's thread, not in a worker)

    return DiarizingSTT(whisper or WhisperSTT(), diarizer=lambda: load_stage("embedded"))


# ------------------------------------------------------------------ in a LiveKit room

server = agents.AgentServer()


@server.rtc_session(agent_name="chorus-example")
async def entrypoint(ctx: agents.JobContext) -> None:
    from livekit.agents import inference

    session: AgentSession[None] = AgentSession(
        stt=diarizing_stt(), llm=inference.LLM("openai/gpt-4.1-mini"), turn_detection="stt"
    )
    await session.start(agent=AttributedAgent(instructions=INSTRUCTIONS), room=ctx.room)


# ------------------------------------------------------------------ offline


class PrintingLLM(llm.LLM[Any]):
    """Prints the chat context it is handed and answers "Noted." (a stand-in for a model)."""

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        **_: Any,
    ) -> llm.LLMStream:
        print("\n=== the chat context the LLM is given")
        for message in chat_ctx.messages():
            for line in (message.text_content or "").splitlines() or [""]:
                print(f"{message.role:>9} | {line}")
        return _Noted(self, chat_ctx=chat_ctx, tools=tools or [], conn_options=conn_options)


class _Noted(llm.LLMStream):
    async def _run(self) -> None:
        self._event_ch.send_nowait(
            llm.ChatChunk(id="noted", delta=llm.ChoiceDelta(role="assistant", content="Noted."))
        )


async def offline(seconds: float = 25.0) -> None:
    audio, rate = sf.read(MEETING, dtype="int16")
    pcm = np.asarray(audio[: int(seconds * rate)], np.int16)
    whisper = WhisperSTT()
    await whisper.load()
    adapter = diarizing_stt(whisper)
    stream = adapter.stream()
    step = rate // 50
    for start in range(0, len(pcm), step):
        chunk = pcm[start : start + step]
        stream.push_frame(rtc.AudioFrame(chunk.tobytes(), rate, 1, len(chunk)))
    stream.end_input()
    runs: list[stt.SpeechEvent] = []
    print(f"=== speaker runs of the first {seconds:.0f} s of {MEETING.name}")
    async for event in stream:
        if event.type == stt.SpeechEventType.FINAL_TRANSCRIPT:
            data = event.alternatives[0]
            print(f"{data.start_time:6.1f}–{data.end_time:5.1f}  {data.speaker_id}: {data.text}")
            runs.append(event)
    await stream.aclose()

    agent = AttributedAgent(instructions=INSTRUCTIONS)
    async with AgentSession(llm=PrintingLLM()) as session:
        await session.start(agent)
        for event in runs:
            await agent.add_speech(event)
        await session.generate_reply()
    await whisper.aclose()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        sys.exit("run in a room with: python -m livekit.agents start examples/livekit_agent.py --dev")
    asyncio.run(offline())
