"""`replay_turns`: stream a list of speaker turns into a realtime session, exactly as a room would.

Why: `chorus transcribe AUDIO --realtime openai|gemini|recorder` and `make demo` show what a
realtime model receives from a meeting. Rather than re-implementing the labelling, this builds a
small room — a voice-like channel posting each turn with the voice channel's metadata
(`sender_name`, `speaker_label`, `start`, `end`, `source="voice"`) and a `RealtimeChannel` — so
the session receives the very client events the room's realtime channel sends in production.
With a recording (audio mode), that voice-like channel also holds it and answers the realtime
channel's request for each turn's audio (`rooms.TurnAudioSource`), as the voice channel does live.

With a summarizing memory (`memory=SummarizingMemory(...)` or `CompactingMemory(...)`, G4), a long
meeting is not streamed whole: every turn is committed to the room first, the memory folds the
older ones into a running summary (its summarizer reads them labelled, G4), and the session then
receives the summary as an application instruction (`[Summary of the earlier conversation, from
the runtime: …]`, not labelled, G3) followed by the turns kept verbatim, labelled as live. Labelling
counts every turn the room holds, summarized or kept, so a summary naming Alice is never followed by
a bare `Alice: …`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attribution import Register, render_summary
from models import TextContent, VoiceTurn
from realtime.channel import RealtimeChannel
from realtime.policy import SpeakPolicy
from realtime.session import SentEvent
from rooms import Channel, RoomContext, RoomKit, SummarizingMemory
from voice.audio import float_to_pcm16, pcm16_to_float, resample


class _TurnChannel(Channel):
    """Posts turns the way the voice channel does (V2); plays nothing, hears nothing.

    With a recording (audio mode, R3) it is the turns' `rooms.TurnAudioSource`, as the voice
    channel is in a live room: the realtime channel asks it for each turn's span of the recording
    when the turn is delivered, at the session's input rate."""

    channel_type: ClassVar[str] = "voice"

    def __init__(self, channel_id: str, recording: tuple[bytes, int] | None = None) -> None:
        super().__init__(channel_id)
        self.recording = recording

    def turn_audio(self, turn: VoiceTurn, sample_rate: int) -> bytes | None:
        if self.recording is None:
            return None
        pcm, rate = self.recording
        begin = min(len(pcm) // 2, max(0, round(turn.start * rate)))
        end = min(len(pcm) // 2, max(begin, round(turn.end * rate)))
        span = pcm[begin * 2 : end * 2]
        if not span:
            return None
        if rate == sample_rate:
            return span
        return float_to_pcm16(resample(pcm16_to_float(span), rate, sample_rate))


@dataclass
class ReplayResult:
    provider: str
    sent: list[SentEvent]
    lines: list[str]
    """The context lines the channel sent (labelled, or plain in a one-speaker room): its
    `lines_for`, the newest `KEPT_LINES`."""
    replies: list[str] = field(default_factory=list)
    """The model's replies, as posted into the room."""

    @property
    def events(self) -> list[dict[str, Any]]:
        """The client events sent, in order (wire JSON objects)."""
        return [s.event for s in self.sent]

    @property
    def types(self) -> list[str]:
        return [s.type for s in self.sent]

    def render(self) -> str:
        """A human-readable account of what the model was sent, one client event per line."""
        out = [f"realtime session ({self.provider}): {len(self.sent)} client events"]
        connection = 0
        appends: list[int] = []  # consecutive appends (one turn's audio) read as one line

        def flush() -> None:
            if appends:
                count = f" ×{len(appends)}" if len(appends) > 1 else ""
                out.append(f"→ input_audio_buffer.append{count}  ({sum(appends)} bytes of audio)")
                appends.clear()

        for sent in self.sent:
            if sent.connection != connection:
                flush()
                connection = sent.connection
                out.append(f"-- reconnected (connection {connection}); the session is replayed --")
            if sent.type == "input_audio_buffer.append":
                size = sent.event.get("audio_bytes")
                appends.append(int(size) if isinstance(size, int)
                               else len(str(sent.event.get("audio", ""))) * 3 // 4)
                continue
            flush()
            out.append(_render_event(sent.event))
        flush()
        if self.replies:
            out.append("replies posted into the room:")
            out.extend(f"  {reply}" for reply in self.replies)
        return "\n".join(out)

    def __str__(self) -> str:
        return self.render()


def _indent(text: str, prefix: str) -> str:
    lines = text.split("\n")
    return "\n".join([lines[0], *((prefix + line) if line else "" for line in lines[1:])])


def _render_event(event: Mapping[str, Any]) -> str:
    kind = str(event.get("type") or next(iter(event), "?"))
    if kind == "session.update":
        session = event.get("session") or {}
        bits = []
        if session.get("instructions"):
            bits.append(f"instructions={json.dumps(session['instructions'])}")
        audio_in = (session.get("audio") or {}).get("input") or {}
        if "turn_detection" in audio_in and audio_in["turn_detection"] is None:
            bits.append("turn detection off")
        if session.get("output_modalities"):
            bits.append("output=" + "+".join(session["output_modalities"]))
        return f"→ session.update  {', '.join(bits)}".rstrip()
    if kind == "conversation.item.create":
        item = event.get("item") or {}
        text = "".join(p.get("text", "") for p in item.get("content") or [])
        head = f"→ conversation.item.create  [{item.get('role')}] "
        return head + _indent(text, " " * len(head))
    if kind in ("client_content", "realtime_input", "setup"):
        return f"→ {kind}  {json.dumps(event[kind], ensure_ascii=False)[:200]}"
    return f"→ {kind}"


def _turn_posts(turns: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Each turn with text as the voice channel would post it: its text and metadata (V2)."""
    posts: list[tuple[str, dict[str, Any]]] = []
    for number, turn in enumerate(turns):
        speaker = str(turn.get("speaker") or "").strip()
        text = str(turn.get("text") or "")
        if not text.strip():
            continue
        metadata: dict[str, Any] = {"source": "voice", "voice_session_id": "replay"}
        if speaker:
            metadata["sender_name"] = speaker
            metadata["speaker_label"] = speaker
        for key in ("start", "end"):
            if isinstance(turn.get(key), int | float):
                metadata[key] = float(turn[key])
        metadata["turn_index"] = number
        posts.append((text, metadata))
    return posts


async def _fold(
    memory: SummarizingMemory, posts: list[tuple[str, dict[str, Any]]], channel_id: str
) -> tuple[int, str | None]:
    """G4: how many of the oldest turns the memory folds, and the summary it makes of them.

    Worked out in a scratch room holding the same turns in the same order (so the same labels and
    ranks); the summarizer is called there, once."""
    kit = RoomKit()
    try:
        room = await kit.create_room()
        source = kit.register_channel(_TurnChannel("voice"))
        await kit.attach_channel(room.id, source.channel_id, group=True)
        for text, metadata in posts:
            await kit.post_event(room.id, source.channel_id, TextContent(body=text), metadata=metadata)
        events = await kit.list_events(room.id)
        recall = await memory.recall(
            events,
            channel_id,
            room_id=room.id,
            store=kit.store,
            participants=await kit.get_participants(room.id),
            register=await kit.get_register(room.id) or Register.new(),
        )
        if recall.summary is None:
            return 0, None
        return len(events) - len(recall.window), recall.summary
    finally:
        await kit.close()


async def replay_turns(
    turns: Sequence[Mapping[str, Any]],
    provider: str = "recorder",
    *,
    assistant_name: str = "Assistant",
    instructions: str | None = None,
    policy: SpeakPolicy | None = None,
    audio: tuple[bytes, int] | None = None,
    wait: bool = True,
    limit: float = 30.0,
    memory: SummarizingMemory | None = None,
    **options: Any,
) -> ReplayResult:
    """Stream `turns` (`{"speaker", "text", "start", "end"}`) into a `provider` session.

    `audio=(pcm16_mono, sample_rate)` turns on audio mode (R3): each turn's span of the recording
    is appended and committed before its labelled item. `options` go to the session (`model`,
    `api_key`, `base_url`, `replies` for the recorder …). With `wait`, each turn waits for the
    model's reply (if the policy asked for one) before the next, as a live meeting would.
    `memory` (G4, text only) folds older turns into a summary first (see the module docstring).
    """
    if memory is not None and audio is not None:
        raise ValueError("replaying with a summarizing memory is text only (no audio)")
    if audio is not None and (audio[1] <= 0 or len(audio[0]) % 2):
        raise ValueError("audio must be 16-bit mono PCM with a positive sample rate")
    posts = _turn_posts(turns)
    channel_id = "realtime"
    folded, summary = (0, None) if memory is None else await _fold(memory, posts, channel_id)
    kit = RoomKit()
    room = await kit.create_room()
    source = kit.register_channel(_TurnChannel("voice", audio))
    channel = RealtimeChannel(
        channel_id,
        provider,
        assistant_name=assistant_name,
        instructions=instructions,
        policy=policy,
        audio_mode=audio is not None,
        **options,
    )
    kit.register_channel(channel)
    await kit.attach_channel(room.id, source.channel_id, group=True)
    samples, rate = (len(audio[0]) // 2, audio[1]) if audio is not None else (0, 0)
    heard = 0.0  # seconds of the recording the turns so far covered
    attached = False

    async def attach() -> None:
        """Attach the realtime channel once the folded turns are in the room: it counts every
        speaker the room holds (G3, G4); then hand it the summary, an application instruction."""
        nonlocal attached
        notice = None
        if summary is not None:
            notice = await kit.post_event(
                room.id, source.channel_id, TextContent(body=render_summary(summary)), kind="system"
            )
        await kit.attach_channel(room.id, channel.channel_id)
        attached = True
        if notice is not None:
            await channel.deliver(notice, RoomContext(room_id=room.id, kit=kit))

    try:
        for index, (text, metadata) in enumerate(posts):
            if index == folded and not attached:
                await attach()
            if rate:
                # a turn without times covers the recording since the last one (a voice turn
                # always has both)
                end_s = metadata.get("end")
                until = samples / rate if end_s is None else min(samples / rate, float(end_s))
                metadata.setdefault("start", heard)
                metadata.setdefault("end", max(until, heard))
                heard = max(heard, min(float(metadata["end"]), samples / rate))
            await kit.post_event(
                room.id, source.channel_id, TextContent(body=text), metadata=metadata
            )
            if wait and attached:
                await channel.wait_idle(room.id, limit)
        if not attached:
            await attach()
        await channel.wait_idle(room.id, limit)
        session = channel.session_for(room.id)
        state_replies = [
            e.text
            for e in await kit.list_events(room.id)
            if e.source.channel_id == channel.channel_id
        ]
        return ReplayResult(
            provider=session.provider,
            sent=list(session.sent),
            lines=channel.lines_for(room.id),
            replies=state_replies,
        )
    finally:
        await kit.close()
