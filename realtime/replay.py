"""`replay_turns`: stream a list of speaker turns into a realtime session, exactly as a room would.

Why: `chorus transcribe AUDIO --realtime openai|gemini|recorder` and `make demo` show what a
realtime model receives from a meeting. Rather than re-implementing the labelling, this builds a
small room — a voice-like channel posting each turn with the voice channel's metadata
(`sender_name`, `speaker_label`, `start`, `end`, `source="voice"`) and a `RealtimeChannel` — so
the session receives the very client events the room's realtime channel sends in production.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from models import TextContent
from realtime.channel import RealtimeChannel
from realtime.policy import SpeakPolicy
from realtime.session import SentEvent
from rooms import Channel, RoomKit


class _TurnChannel(Channel):
    """Posts turns the way the voice channel does (V2); plays nothing, hears nothing."""

    channel_type: ClassVar[str] = "voice"


@dataclass
class ReplayResult:
    provider: str
    sent: list[SentEvent]
    lines: list[str]
    """Each context line the channel sent (labelled, or plain in a one-speaker room)."""
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
    **options: Any,
) -> ReplayResult:
    """Stream `turns` (`{"speaker", "text", "start", "end"}`) into a `provider` session.

    `audio=(pcm16_mono, sample_rate)` turns on audio mode (R3): each turn's span of the recording
    is appended and committed before its labelled item. `options` go to the session (`model`,
    `api_key`, `base_url`, `replies` for the recorder …). With `wait`, each turn waits for the
    model's reply (if the policy asked for one) before the next, as a live meeting would.
    """
    kit = RoomKit()
    room = await kit.create_room()
    source = kit.register_channel(_TurnChannel("voice"))
    channel = RealtimeChannel(
        "realtime",
        provider,
        assistant_name=assistant_name,
        instructions=instructions,
        policy=policy,
        audio_mode=audio is not None,
        **options,
    )
    kit.register_channel(channel)
    await kit.attach_channel(room.id, source.channel_id, group=True)
    await kit.attach_channel(room.id, channel.channel_id)
    pcm, rate = audio if audio is not None else (b"", 0)
    pushed = 0  # samples of the recording already pushed
    try:
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
            if audio is not None and rate:
                end_s = metadata.get("end")
                upto = len(pcm) // 2 if end_s is None else min(len(pcm) // 2, round(end_s * rate))
                # a turn without times holds the audio since the last one (a typed voice turn
                # always has both)
                metadata.setdefault("start", pushed / rate)
                metadata.setdefault("end", max(upto, pushed) / rate)
                if upto > pushed:
                    await channel.push_audio(room.id, pcm[pushed * 2 : upto * 2], rate)
                    pushed = upto
            await kit.post_event(
                room.id,
                source.channel_id,
                TextContent(body=text),
                metadata={**metadata, "turn_index": number},
            )
            if wait:
                await channel.wait_idle(room.id, limit)
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
