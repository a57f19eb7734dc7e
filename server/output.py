"""What the server says: every room's committed turns, replies and speaker changes, fanned out to
the room's feed and its streams, and each stream's STT status told to its device (a phone
leg's to the room's feed: its caller has no message channel).

Owns the server's own channel in every room (`ServerOutput`): the kit delivers every committed
event to it in commit order, and as an `AudioSink` it receives the assistant's reply audio (R5),
which each stream gets in its own framing. It also speaks for the `ON_SPEAKER_CHANGE` hook
(`speaker_changed`, a typed `voice.channel.SpeakerChangeEvent`) and for each stream's STT status
(`stt_status`, the per-stream callback the stream was opened with) and its diarization status
(`diarization_status`: off the stage and back, issue 31). It never awaits a client:
messages go to the feed's and the streams' bounded queues, and a full one drops the message
(counted). Which rooms and streams exist is the registry's (`server.live`); this only reads it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import Any, ClassVar

from models import RoomEvent, VoiceTurn
from rooms import AgentStatus, Channel, HookContext, RoomContext, TurnAudioSource
from server.excerpts import EXCERPT_RATE, EXCERPT_SECONDS
from server.framing import Outgoing
from server.metrics import ServerMetrics
from server.overload import DiarizationDegraded, DiarizationStatus
from server.protocol import (
    AssistantStatusMessage,
    ChatMessage,
    ReplyMessage,
    SpeakerChangeMessage,
    SttStatusMessage,
    TurnMessage,
    dump,
)
from server.room_state import LiveRoom, LiveStream
from server.stage_guard import status_message
from server.voices import Suggest
from voice.channel import SpeakerChangeEvent
from voice.introductions import name_from_introduction
from voice.stt.base import AudioLost, SttDegraded, SttRecovered, SttRefused, SttStatus

log = logging.getLogger(__name__)

KEPT_TURN_LATENCIES = 64
"""How many of a room's latest turns keep their latency for a reply to them to add to."""


class ServerOutput(Channel):
    """The server's own channel in every room: sees every committed event, plays reply audio."""

    channel_type: ClassVar[str] = "server"

    def __init__(
        self,
        rooms: Mapping[str, LiveRoom],
        streams: Mapping[str, LiveStream],
        metrics: ServerMetrics,
    ) -> None:
        super().__init__("chorus-server")
        self.rooms = rooms
        """The registry's live rooms, by room id."""
        self.streams = streams
        """The registry's open streams, by the `voice_session_id` their turns carry."""
        self.metrics = metrics
        self.suggest: Suggest | None = None
        """Publishes a `speaker_suggestion` (`server.renames.RoomRenames.suggest`, set by the
        registry): what introductions suggest goes the one path every suggestion takes."""

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        await self.committed(event)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        await self.committed(event, corrected=True)

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        self.play_reply(room_id, pcm16, sample_rate)

    def _stream_of(self, metadata: dict[str, Any]) -> LiveStream | None:
        session = metadata.get("voice_session_id")
        return self.streams.get(str(session)) if session is not None else None

    async def committed(self, event: RoomEvent, *, corrected: bool = False) -> None:
        """Every committed event of every room, in commit order (from `deliver`).
        `corrected`: a voice turn replaced in place (an early turn the final result corrected):
        it goes out again as a `turn` with the same `event_id` and `corrected: true`, for the
        device and the feed to show instead of the first version; it is not counted again."""
        live = self.rooms.get(event.room_id)
        if live is None or event.kind != "message":
            return
        meta = event.metadata
        voice = meta.get("source") == "voice" or event.source.channel_type == "voice"
        reply = event.source.channel_type in ("realtime", "ai")
        if corrected and not (voice or reply):
            return  # voice turns and replies are corrected in place; nothing else is re-sent
        if voice:
            await self._turn(live, event, corrected)
        elif event.source.channel_type == "chat":
            speaker = await self.require_kit().label_for(event.room_id, event)
            live.feed.publish(
                dump(
                    ChatMessage(
                        room=event.room_id,
                        speaker=speaker,
                        text=event.text,
                        participant=event.source.participant_id,
                        channel=event.source.channel_id,
                        event_id=event.id,
                    )
                )
            )
        elif reply:
            if not corrected:
                self.metrics.replies_total += 1
                self._reply_latency(live, meta)
            text = dump(ReplyMessage(room=event.room_id, text=event.text, event_id=event.id,
                                     corrected=corrected,
                                     interrupted=bool(meta.get("interrupted"))))  # fmt: skip
            live.feed.publish(text)
            for stream in list(live.streams.values()):
                self._send(stream, text)

    def _reply_latency(self, live: LiveRoom, meta: Mapping[str, Any]) -> None:
        """A realtime reply to a voice turn: from receiving the audio up to the end of the turn
        that asked (its turn latency, kept when it was committed) to the reply's first audio
        (`first_audio_ms`, from the realtime channel), `chorus_reply_latency_seconds`."""
        asked = live.turn_latencies.pop(str(meta.get("asked_by")), None)
        first_audio_ms = meta.get("first_audio_ms")
        if asked is not None and isinstance(first_audio_ms, int | float):
            self.metrics.reply_latency.observe(asked + first_audio_ms / 1000)

    async def _turn(self, live: LiveRoom, event: RoomEvent, corrected: bool) -> None:
        """A voice turn: to the feed and to the stream it came from, its latency observed."""
        meta = event.metadata
        stream = self._stream_of(meta)
        end = float(meta.get("end", 0.0))
        speaker = meta.get("sender_name")
        if not speaker:  # no stamped name: the participant record names the turn (B2)
            speaker = await self.require_kit().label_for(event.room_id, event)
        turn = TurnMessage(
            room=event.room_id,
            speaker=str(speaker),
            text=event.text,
            start=float(meta.get("start", 0.0)),
            end=end,
            participant=event.source.participant_id,
            label=meta.get("speaker_label")
            if stream is None or stream.declaration.shared_mic
            else None,
            stream=stream.id if stream else None,
            event_id=event.id,
            corrected=corrected,
            second_pass=bool(meta.get("second_pass", False)),
        )
        if corrected:
            self.metrics.turn_corrections_total += 1
        else:
            self._keep_excerpt(live, event, turn)
            self.metrics.turns_total += 1
            latency = stream.latency_of(end) if stream is not None else None
            if latency is not None:
                self.metrics.turn_latency.observe(latency)
                live.turn_latencies[event.id] = latency  # (a reply to it adds its own)
                while len(live.turn_latencies) > KEPT_TURN_LATENCIES:
                    live.turn_latencies.popitem(last=False)
        text = dump(turn)
        live.feed.publish(text)
        if stream is not None:
            self._send(stream, text)
        self._suggest_from_introduction(live, turn)

    def _suggest_from_introduction(self, live: LiveRoom, turn: TurnMessage) -> None:
        """A shared mic's anonymous voice that introduces itself ("Hi, I'm Ian") gets a
        suggestion on the feed, once per name (`voice.introductions`; never applied by itself:
        a person confirms it with a rename)."""
        if self.suggest is None or turn.label is None or turn.speaker != turn.label:
            return
        name = name_from_introduction(turn.text)
        if name is None or (turn.stream, turn.label, name) in live.suggested:
            return
        live.suggested.add((turn.stream, turn.label, name))
        self.suggest(turn.room, turn.label, name, "introduction", turn.stream, None)

    def _keep_excerpt(self, live: LiveRoom, event: RoomEvent, turn: TurnMessage) -> None:
        """The turn's audio joins its speaker's excerpt (`server.excerpts`), read from the voice
        channel that posted it while the stream still holds it (this channel is inline)."""
        try:
            source = self.require_kit().get_channel(event.source.channel_id)
        except KeyError:
            return
        voice_turn = VoiceTurn.of(event)
        if voice_turn is None or not isinstance(source, TurnAudioSource):
            return
        # only the tail an excerpt keeps is read and converted, however long the turn
        tail = dataclasses.replace(
            voice_turn, start=max(voice_turn.start, voice_turn.end - EXCERPT_SECONDS)
        )
        pcm = source.turn_audio(tail, EXCERPT_RATE)
        if pcm:
            live.excerpts.take((turn.stream, turn.label), pcm)

    def _send(self, stream: LiveStream, message: Outgoing) -> None:
        if not stream.send(message):
            self.metrics.stream_messages_dropped_total += 1

    def play_reply(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        live = self.rooms.get(room_id)
        if live is None:
            return
        for stream in list(live.streams.values()):
            for message in stream.reply_audio(pcm16, sample_rate):
                self._send(stream, message)

    async def stt_status(self, stream: LiveStream, status: SttStatus) -> None:
        """The stream's STT connection changed state (issue 10.1): count it, and tell whoever
        can act on it. A device hears its own statuses, and the room's feed only a refusal
        (issue 25.7: final, and the operator's to fix). A phone leg (Twilio, AudioSocket, SIP)
        has no message channel to its caller, so the room's feed hears every one of its
        statuses: the operator watching the room learns that a caller's words are not being
        transcribed. Heard from the stream's own callback (`Pipeline.open_stream(on_status=…)`)."""
        if isinstance(status, SttDegraded):
            self.metrics.stt_outages_total += 1
            message = SttStatusMessage(stream="", status="degraded", reason=status.reason)
        elif isinstance(status, SttRecovered):
            self.metrics.stt_recoveries_total += 1
            message = SttStatusMessage(stream="", status="recovered")
        elif isinstance(status, SttRefused):
            self.metrics.stt_refused_total += 1
            message = SttStatusMessage(stream="", status="refused", reason=status.reason)
        elif isinstance(status, AudioLost):
            self.metrics.stt_audio_lost_seconds_total += status.seconds
            message = SttStatusMessage(
                stream="", status="audio_lost", start=status.start, end=status.end
            )
        else:
            self.metrics.stt_stream_errors_total += 1
            message = SttStatusMessage(stream="", status="ended", reason=status.message)
        if stream.audio is None or self.streams.get(stream.audio.session_id) is not stream:
            return  # not open yet (its `started` goes first), or already forgotten
        log.warning("stream %s: STT %s %s", stream.id, message.status, message.reason or "")
        text = dump(message.model_copy(update={"stream": stream.id}))
        device = stream.kind == "device"
        if not device or isinstance(status, SttRefused):
            live = self.rooms.get(stream.room_id)
            if live is not None:  # once, whichever of the two reasons holds
                live.feed.publish(text)
        if device:
            self._send(stream, text)

    async def diarization_status(self, stream: LiveStream, status: DiarizationStatus) -> None:
        """The stream left the diarization stage or came back (issue 31, `server.overload`):
        counted, told to the stream's device and to the room's feed (the page shows why the
        labels changed)."""
        if isinstance(status, DiarizationDegraded):
            self.metrics.diarization_fallbacks_total += 1
        else:
            self.metrics.diarization_recoveries_total += 1
        message = status_message(stream.id, status)
        if stream.audio is None or self.streams.get(stream.audio.session_id) is not stream:
            return
        log.warning("stream %s: diarization %s %s", stream.id, message.status,
                    message.reason or "")
        text = dump(message)
        live = self.rooms.get(stream.room_id)
        if live is not None:
            live.feed.publish(text)
        if stream.kind == "device":
            self._send(stream, text)

    def agent_status(self, value: object, ctx: HookContext) -> None:
        """ON_AGENT_STATUS: a model of the room (the realtime session, the agent, the chat
        model) is away or back. The room's feed and its devices hear it (`assistant_status`; a
        phone caller has no message channel), and `/metrics` counts the outages."""
        live = self.rooms.get(ctx.room_id)
        if live is None or not isinstance(value, AgentStatus):
            return
        if not value.available:
            self.metrics.assistant_outages_total += 1
        text = dump(AssistantStatusMessage.of(ctx.room_id, value))
        if value.available:
            live.agents_away.pop(value.channel_id, None)
        else:
            live.agents_away[value.channel_id] = text
        live.feed.publish(text)
        for stream in list(live.streams.values()):
            if stream.kind == "device":
                self._send(stream, text)

    def speaker_changed(self, value: object, ctx: HookContext) -> None:
        """ON_SPEAKER_CHANGE: a one-person stream's first turn, or a new voice on a shared mic."""
        live = self.rooms.get(ctx.room_id)
        if live is None or not isinstance(value, SpeakerChangeEvent):
            return
        stream = self.streams.get(value.session.id)
        previous = value.previous_speaker
        if stream is not None and not stream.declaration.shared_mic:
            if previous is not None:
                return  # one person per stream: only its first turn is a change
            speaker = stream.declaration.name or stream.declaration.participant
        else:
            speaker = value.sender_name or value.speaker or "?"
        message = SpeakerChangeMessage(
            room=ctx.room_id,
            speaker=speaker,
            previous=previous,
            is_new_speaker=value.is_new_speaker,
            participant=value.participant_id or ctx.participant_id,
            stream=stream.id if stream else None,
        )
        self.metrics.speaker_changes_total += 1
        text = dump(message)
        live.feed.publish(text)
        if stream is not None:
            self._send(stream, text)
