"""Chat context for a LiveKit `AgentSession`'s LLM, rendered by the attribution engine.

Why: an `AgentSession` folds everything heard into `user` messages with no speaker, so a model
cannot tell Alice from Bob (livekit/agents#6795). Chorus keeps who said what in a room and renders
it once for every model (rules A–E: labelled lines only once a second speaker is in the window,
the note on the trigger turn, assistant turns unlabelled, marks neutralized). This module hands
that rendering to LiveKit:

- `to_chat_context(AIContext) -> llm.ChatContext` and `attributed_chat_context(kit, room_id, …)`
  (the room's events rendered for one call);
- `AttributedAgent`, an `Agent` that records each final speaker run its STT reports
  (`SpeechData.speaker_id`, e.g. from `DiarizingSTT`) as a turn of that speaker in its own Chorus
  room, and whose `llm_node` hands the LLM that room rendered by the attribution engine instead of
  LiveKit's speaker-less history; the model's replies are recorded as assistant turns. Tool-call
  items of LiveKit's own history are not carried into the rendered context.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any, ClassVar

from livekit import rtc
from livekit.agents import Agent, llm, stt
from livekit.agents.types import FlushSentinel
from livekit.agents.voice import ModelSettings

from attribution import Register, render_chat_context
from models import AIContext, RoomEvent, TextContent
from rooms import Channel, RoomKit

SPEECH_CHANNEL = "livekit-speech"
ASSISTANT_CHANNEL = "assistant"


class _SpeechChannel(Channel):
    """Where heard speaker runs enter the agent's room."""

    channel_type: ClassVar[str] = "livekit"


class _AssistantChannel(Channel):
    """The agent's own replies (an `ai` channel: its turns render as unlabelled assistant turns)."""

    channel_type: ClassVar[str] = "ai"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "\n".join(str(getattr(part, "text", "")) for part in content if getattr(part, "text", ""))


def to_chat_context(context: AIContext) -> llm.ChatContext:
    """An attribution `AIContext` as a LiveKit `ChatContext` (system prompt first)."""
    chat = llm.ChatContext.empty()
    if context.system_prompt:
        chat.add_message(role="system", content=context.system_prompt)
    for message in context.messages:
        chat.add_message(role=message.role, content=_text(message.content))
    return chat


async def attributed_chat_context(
    kit: RoomKit,
    room_id: str,
    *,
    ai_channel_id: str = ASSISTANT_CHANNEL,
    system_prompt: str | None = None,
    trigger: RoomEvent | None = None,
) -> llm.ChatContext:
    """The room's committed events rendered for one model call; the trigger defaults to the
    latest turn that is not the model's own."""
    events = await kit.list_events(room_id)
    if trigger is None:
        trigger = next((e for e in reversed(events) if e.source.channel_id != ai_channel_id), None)
    participants = await kit.get_participants(room_id)
    register = await kit.get_register(room_id) or Register.new()
    rendered = render_chat_context(
        events, trigger, participants, register,
        ai_channel_id=ai_channel_id, system_prompt=system_prompt,
    )
    return to_chat_context(rendered)


class AttributedAgent(Agent):
    """`AttributedAgent(instructions="…")` with `AgentSession(stt=DiarizingSTT(…), llm=…)`.

    Its LLM reads the conversation as the attribution engine renders it: bare lines while one
    person speaks, `Alice: "…"` lines (with the note on the newest turn) once several do.
    `kit`/`room_id` name the Chorus room that keeps the turns (default: a private one).
    """

    def __init__(
        self, *, instructions: str, kit: RoomKit | None = None, room_id: str = "agent",
        **options: Any,
    ) -> None:
        super().__init__(instructions=instructions, **options)
        self.kit = kit or RoomKit()
        self.room_id = room_id
        self._speech = _SpeechChannel(SPEECH_CHANNEL)
        self._assistant = _AssistantChannel(ASSISTANT_CHANNEL)
        self._ready = False
        self.rendered: list[llm.ChatContext] = []
        """Every context handed to the LLM, in order."""

    async def _ensure_room(self) -> None:
        if self._ready:
            return
        kit = self.kit
        if await kit.get_room(self.room_id) is None:
            await kit.create_room(room_id=self.room_id)
        for channel in (self._speech, self._assistant):
            if channel.kit is None:
                kit.register_channel(channel)
            await kit.attach_channel(self.room_id, channel.channel_id)
        self._ready = True

    async def add_turn(self, speaker: str | None, text: str) -> RoomEvent | None:
        """One speaker run heard (speaker None: nobody labelled it)."""
        if not text.strip():
            return None
        await self._ensure_room()
        participant = f"speaker:{speaker}" if speaker else "speaker"
        await self.kit.ensure_participant(
            self.room_id, SPEECH_CHANNEL, participant, display_name=speaker
        )
        metadata: dict[str, Any] = {"source": "livekit"}
        if speaker:
            metadata["sender_name"] = speaker
        return await self.kit.post_event(
            self.room_id, SPEECH_CHANNEL, TextContent(body=text), participant_id=participant,
            metadata=metadata,
        )

    async def add_speech(self, event: stt.SpeechEvent) -> None:
        """Record a final transcript's speaker runs (other events are ignored)."""
        if event.type != stt.SpeechEventType.FINAL_TRANSCRIPT:
            return
        for data in event.alternatives[:1]:
            await self.add_turn(data.speaker_id, data.text)

    async def add_reply(self, text: str) -> None:
        if text.strip():
            await self._ensure_room()
            await self.kit.post_event(
                self.room_id, ASSISTANT_CHANNEL, TextContent(body=text),
                metadata={"ai_response": True},
            )

    async def chat_context(self) -> llm.ChatContext:
        await self._ensure_room()
        return await attributed_chat_context(
            self.kit, self.room_id, system_prompt=str(self.instructions)
        )

    async def stt_node(
        self, audio: AsyncIterable[rtc.AudioFrame], model_settings: ModelSettings
    ) -> AsyncIterator[stt.SpeechEvent]:
        async for event in Agent.default.stt_node(self, audio, model_settings):
            if isinstance(event, stt.SpeechEvent):
                await self.add_speech(event)
            yield event

    async def llm_node(
        self,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool],
        model_settings: ModelSettings,
    ) -> AsyncIterator[llm.ChatChunk | str | FlushSentinel]:
        await self._ensure_room()
        if await self.kit.list_events(self.room_id):
            chat_ctx = await self.chat_context()
        self.rendered.append(chat_ctx)
        reply: list[str] = []
        async for chunk in Agent.default.llm_node(self, chat_ctx, tools, model_settings):
            if isinstance(chunk, str):
                reply.append(chunk)
            elif isinstance(chunk, llm.ChatChunk) and chunk.delta and chunk.delta.content:
                reply.append(chunk.delta.content)
            yield chunk
        await self.add_reply("".join(reply))
