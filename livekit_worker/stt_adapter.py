"""`DiarizingSTT`: any Chorus STT (+ diarization stage) as a `livekit.agents.stt.STT`.

Why shaped so: LiveKit's `AgentSession` takes an `stt.STT` whose stream turns pushed frames into
`SpeechEvent`s, and its multi-speaker support is a cloud STT's `speaker_id` passed through. Chorus
already turns audio into speaker turns (`VoiceChannel` and its sessions: STT words, speaker labels
from the STT or from a diarization stage, the turn assembler's rules, `ON_TRANSCRIPTION` hooks), so the
adapter does not re-implement any of it: each stream is one `VoiceSession` in a room of its own in
the adapter's `RoomKit` (`adapter.kit`, where applications add their `ON_TRANSCRIPTION` hooks to
rename voices), and each committed turn becomes one speaker run in LiveKit's terms:
`START_OF_SPEECH`, `FINAL_TRANSCRIPT` (one `SpeechData` with `speaker_id` = the turn's attribution
label, so a rename is what LiveKit sees), `END_OF_SPEECH`. Turns arrive when Chorus commits them
(at a speaker change, the STT's end of speech, `flush()` or `end_input()`); the adapter sends no
interim results.

Frames are resampled to 16 kHz by LiveKit's own `RecognizeStream` and mixed down to mono here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
from livekit import rtc
from livekit.agents import stt
from livekit.agents.language import LanguageCode
from livekit.agents.stt import SpeechData, SpeechEvent, SpeechEventType
from livekit.agents.types import (
    DEFAULT_API_CONNECT_OPTIONS,
    NOT_GIVEN,
    APIConnectOptions,
    NotGivenOr,
)
from livekit.agents.utils import AudioBuffer

from models import RoomEvent
from rooms import Channel, RoomContext, RoomKit
from voice.audio import STT_SAMPLE_RATE
from voice.channel import VoiceChannel, VoiceSession
from voice.diarization_stage import DiarizationStage
from voice.stt.base import SttProvider

StageSource = DiarizationStage | Callable[[], DiarizationStage]


class _TurnTap(Channel):
    """Attached to every stream's room: hands each committed voice turn, in commit order, to the
    stream that owns the room."""

    channel_type: ClassVar[str] = "livekit-stt"

    def __init__(self) -> None:
        super().__init__("livekit-stt")
        self.streams: dict[str, DiarizingStream] = {}

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        stream = self.streams.get(ctx.room_id)
        if stream is not None and event.metadata.get("source") == "voice":
            label = await ctx.kit.label_for(ctx.room_id, event)
            stream._on_turn(event, label)


class DiarizingSTT(stt.STT[Any]):
    """`DiarizingSTT(WhisperSTT(), diarizer=lambda: load_stage("embedded"))`.

    - `provider`: any Chorus `SttProvider` (a diarizing one's labels are used when no stage is
      given).
    - `diarizer`: a `DiarizationStage`, or a zero-argument builder of one. A stage follows one
      stream, so give a builder when the adapter serves several streams at once.
    - `kit`: the `RoomKit` the streams' rooms live in (default: a private one); its
      `ON_TRANSCRIPTION` hooks rename voices before LiveKit sees them.
    """

    def __init__(
        self,
        provider: SttProvider,
        *,
        diarizer: StageSource | None = None,
        kit: RoomKit | None = None,
        language: str = "en",
    ) -> None:
        super().__init__(
            capabilities=stt.STTCapabilities(
                streaming=True, interim_results=False, diarization=True, offline_recognize=True
            )
        )
        self.chorus_stt = provider
        self.diarizer = diarizer
        self.kit = kit or RoomKit()
        self.language = language
        self._tap = _TurnTap()
        self.kit.register_channel(self._tap)
        self._serial = 0
        self._stage_in_use = False

    @property
    def model(self) -> str:
        return self.chorus_stt.describe()

    @property
    def provider(self) -> str:
        return "chorus"

    def _stage(self) -> DiarizationStage | None:
        if self.diarizer is None:
            return None
        if isinstance(self.diarizer, DiarizationStage):
            if self._stage_in_use:
                raise RuntimeError(
                    "this DiarizingSTT's diarization stage already serves a stream: pass "
                    "diarizer=<a function building a stage> to run several streams at once"
                )
            self._stage_in_use = True
            self.diarizer.reset()
            return self.diarizer
        return self.diarizer()

    async def _open(self, stream: DiarizingStream) -> tuple[str, VoiceChannel, VoiceSession]:
        """A room, a voice channel and a session for one stream."""
        self._serial += 1
        room_id = f"livekit-stt-{self._serial}"
        stage = self._stage()
        channel = VoiceChannel(
            f"voice-{room_id}", stt=self.chorus_stt, pipeline_speakers=stage is not None,
            diarizer=stage, catch_up=True,  # a live track: a stage behind it skips its backlog
        )
        kit = self.kit
        await kit.create_room(room_id=room_id)
        kit.register_channel(channel)
        await kit.attach_channel(room_id, channel.channel_id)
        await kit.attach_channel(room_id, self._tap.channel_id)
        self._tap.streams[room_id] = stream
        session = await channel.start_session(room_id, "livekit-stream", sample_rate=STT_SAMPLE_RATE)
        return room_id, channel, session

    async def _close(self, room_id: str, channel: VoiceChannel) -> None:
        self._tap.streams.pop(room_id, None)
        if isinstance(self.diarizer, DiarizationStage) and channel.diarizer is self.diarizer:
            self._stage_in_use = False
        with contextlib.suppress(Exception):
            await channel.close()
        with contextlib.suppress(KeyError):
            self.kit.unregister_channel(channel.channel_id)
        with contextlib.suppress(Exception):
            await self.kit.delete_room(room_id)

    def stream(
        self,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
    ) -> DiarizingStream:
        lang = language if isinstance(language, str) else self.language
        return DiarizingStream(stt=self, conn_options=conn_options, language=lang)

    async def _recognize_impl(
        self,
        buffer: AudioBuffer,
        *,
        language: NotGivenOr[str] = NOT_GIVEN,
        conn_options: APIConnectOptions,
    ) -> SpeechEvent:
        """A whole buffer: one `FINAL_TRANSCRIPT` whose alternatives are its speaker runs."""
        stream = self.stream(language=language, conn_options=conn_options)
        frame = rtc.combine_audio_frames(buffer)
        runs: list[SpeechData] = []
        try:
            stream.push_frame(frame)
            stream.end_input()
            async for event in stream:
                if event.type == SpeechEventType.FINAL_TRANSCRIPT:
                    runs.extend(event.alternatives)
        finally:
            await stream.aclose()
        if not runs:
            runs = [SpeechData(language=LanguageCode(stream.language), text="")]
        return SpeechEvent(type=SpeechEventType.FINAL_TRANSCRIPT, alternatives=runs)


class DiarizingStream(stt.RecognizeStream):
    """One audio stream through one Chorus voice session; one event triple per speaker run."""

    def __init__(
        self, *, stt: DiarizingSTT, conn_options: APIConnectOptions, language: str
    ) -> None:
        super().__init__(stt=stt, conn_options=conn_options, sample_rate=STT_SAMPLE_RATE)
        self.adapter = stt
        self.language = language
        self.session: VoiceSession | None = None
        self.runs: list[SpeechData] = []
        """Every run emitted so far, in order."""

    async def _run(self) -> None:
        room_id, channel, session = await self.adapter._open(self)
        self.session = session
        try:
            async for item in self._input_ch:
                if isinstance(item, self._FlushSentinel):
                    await session.flush()
                    continue
                samples = np.frombuffer(item.data, dtype=np.int16)
                if item.num_channels > 1:
                    samples = samples.reshape(-1, item.num_channels).mean(axis=1).astype(np.int16)
                if len(samples):
                    with contextlib.suppress(Exception):  # a bad frame is logged and skipped (V10)
                        session.push(samples.tobytes())
            await session.finish()
            await self.adapter.kit.drain()
        finally:
            if not session.finished:
                with contextlib.suppress(Exception):
                    await asyncio.shield(session.finish())
            await self.adapter._close(room_id, channel)

    def _on_turn(self, event: RoomEvent, label: str) -> None:
        start = float(event.metadata.get("start") or 0.0)
        end = float(event.metadata.get("end") or start)
        data = SpeechData(
            language=LanguageCode(self.language),
            text=event.text,
            start_time=start + self.start_time_offset,
            end_time=end + self.start_time_offset,
            speaker_id=label,
            metadata={"speaker_label": event.metadata.get("speaker_label"),
                      "chorus_event_id": event.id},
        )
        self.runs.append(data)
        send = self._event_ch.send_nowait
        send(SpeechEvent(type=SpeechEventType.START_OF_SPEECH))
        send(SpeechEvent(type=SpeechEventType.FINAL_TRANSCRIPT, alternatives=[data]))
        send(SpeechEvent(type=SpeechEventType.END_OF_SPEECH))
