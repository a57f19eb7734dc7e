"""Channels: how events get into and out of a room.

A channel is registered once with the hub and attached to any number of rooms. The hub calls
`deliver` for each committed event from *another* channel that the channel may see, in commit
order per room. Transports (text, voice, phone) produce events; agent channels (AI, realtime)
answer them.
"""

from __future__ import annotations

from abc import ABC
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from models import InboundMessage, Participant, RoomEvent, TextContent, VoiceTurn

if TYPE_CHECKING:
    from rooms.kit import InboundResult, RoomKit


@dataclass(frozen=True)
class RoomContext:
    """What a channel may look at while an event is delivered to it."""

    room_id: str
    kit: RoomKit

    async def participants(self) -> list[Participant]:
        return await self.kit.get_participants(self.room_id)

    async def events(self) -> list[RoomEvent]:
        return await self.kit.list_events(self.room_id)


class Channel(ABC):  # noqa: B024 - every method has a working default
    channel_type: ClassVar[str] = "custom"
    inline_delivery: ClassVar[bool] = True
    """Delivered by the room's own deliverer, before the commit returns (a transport, the server's
    output, a channel whose `deliver` only hands the event to its own queue). False: the channel
    gets its events through its own bounded queue per room and worker task (a chat model that
    takes seconds), so it never holds the commit or another channel (`rooms.kit`)."""
    settles_commits: ClassVar[bool] = False
    """`RoomKit.post_event` from this channel also waits until the queued channels took the event
    (a host's or a test's channel that wants the room's answers when its post returns)."""

    def __init__(self, channel_id: str) -> None:
        self.channel_id = channel_id
        self.kit: RoomKit | None = None

    def bind(self, kit: RoomKit) -> None:
        if self.kit is not None and self.kit is not kit:
            raise RuntimeError(f"channel {self.channel_id!r} is already registered with another RoomKit")
        self.kit = kit

    def require_kit(self) -> RoomKit:
        if self.kit is None:
            raise RuntimeError(f"channel {self.channel_id!r} is not registered with a RoomKit")
        return self.kit

    async def on_attach(self, room_id: str) -> None:  # noqa: B027 - optional
        """Called once when the channel is attached to a room."""

    async def on_detach(self, room_id: str) -> None:  # noqa: B027 - optional
        """Called once the room is gone (`RoomKit.delete_room`) or let go of while its stored
        data stays (`RoomKit.release_room`, an idle room a server evicts): drop what the channel
        keeps for it in memory (sessions, buffers). `on_attach` comes again if the room returns."""

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:  # noqa: B027 - optional
        """Called for each committed event from another channel this channel may see."""

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:  # noqa: B027 - optional
        """Called when an event `deliver` handed over was replaced in place (`RoomKit.update_event`:
        a voice turn committed early from interim words, corrected by the final result). `event`
        is the new version, with the same id. Default: nothing (a channel that forwarded the old
        version and cannot take it back, like a realtime model's conversation, keeps it)."""

    async def close(self) -> None:  # noqa: B027 - optional
        """Release connections and tasks."""


@runtime_checkable
class AudioSink(Protocol):
    """A channel that can play audio into a room (the voice channel's loudspeaker)."""

    async def play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None: ...


@runtime_checkable
class TurnAudioSource(Protocol):
    """A channel that can hand out the audio of the voice turns it posted (the voice channel).

    A channel that needs a turn's audio (the realtime channel in audio mode, R3) asks the channel
    that posted the turn (`event.source.channel_id`) when the turn is delivered, instead of being
    fed every frame ahead of time: only turn audio is ever converted, once, to the rate the asker
    wants. Reading at delivery time is safe for an `inline_delivery` channel (the realtime channel
    is one): `RoomKit.post_event` returns only after the inline channels had the event, so a source
    that keeps a stream's audio until its last `post_event` returned has every turn's audio when
    asked. A queued channel must not count on it.
    """

    def turn_audio(self, turn: VoiceTurn, sample_rate: int) -> bytes | None:
        """The samples of `turn` (`start`…`end` of stream `turn.voice_session_id`) as 16-bit
        little-endian mono PCM at `sample_rate`; None when the source no longer holds them (the
        stream ended, or the span fell out of what it keeps)."""
        ...


class TextChannel(Channel):
    """A transport channel for hosts, webhooks and tests that feed `process_inbound` themselves.

    Whatever the room delivers to it is kept in `delivered` (and passed to `on_deliver`); a
    replaced event (`RoomKit.update_event`) takes its old version's place there. What it posts
    settles: `post_event` from it returns once the queued channels (a chat model) took the event.
    """

    channel_type: ClassVar[str] = "text"
    settles_commits: ClassVar[bool] = True

    def __init__(
        self,
        channel_id: str,
        on_deliver: Callable[[RoomEvent], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(channel_id)
        self.delivered: list[RoomEvent] = []
        self._on_deliver = on_deliver

    async def send(
        self,
        sender_id: str,
        text: str,
        *,
        room_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> InboundResult:
        return await self.require_kit().process_inbound(
            InboundMessage(
                channel_id=self.channel_id,
                sender_id=sender_id,
                content=TextContent(body=text),
                metadata=metadata or {},
                room_id=room_id,
            )
        )

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        self.delivered.append(event)
        if self._on_deliver is not None:
            await self._on_deliver(event)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        """A replaced event takes the old version's place in `delivered`."""
        self.delivered = [event if e.id == event.id else e for e in self.delivered]
