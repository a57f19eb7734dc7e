"""What every chat ingress shares: conversations, their rooms, reply clients, webhook answers.

A provider module (Teams, WhatsApp) only parses its wire format into `InboundItem`s and speaks
its reply API; this module owns the rest once. Each provider conversation is one room and one
`ConversationChannel` (so a reply goes back to the conversation it came from): a group chat is
attached to its room as a *group binding* (every sender in it routes there), a one-to-one chat
as a plain binding. Every person's message carries `metadata["sender_name"]` as the provider
names them (B1), so the attribution engine labels it `Alice: "…"` like any other turn.

Webhook handlers are plain async functions over (headers, raw body) returning a
`WebhookAnswer`: bad signatures and malformed bodies are refused with a 4xx before anything in
any room changes, so an HTTP framework only has to route to them.

Providers retry a webhook until they get a 2xx (and a replayed signed body verifies again), so a
message is committed once: an item with the provider's message id (`InboundItem.message_id`)
becomes the event whose id is a digest of (provider, conversation, message id), and the kit does
not commit an event id its room already holds (checked in the store under the room lock: after a
restart, across processes sharing a Postgres store, and for copies that arrive together). A
duplicate is answered 200 like any other, with nothing committed, no reply and no model call.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, TypeVar

from pydantic import BaseModel, ValidationError

from models import InboundMessage, RoomEvent, TextContent
from rooms import Channel, RoomContext, RoomKit

log = logging.getLogger(__name__)

AGENT_CHANNEL_TYPES = frozenset({"ai", "realtime"})


class IngressError(Exception):
    """A request the ingress refuses: `status` (4xx) and a message saying why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


M = TypeVar("M", bound=BaseModel)


def parse_body(model: type[M], body: bytes | str, what: str) -> M:
    """`body` as the provider's JSON shape `model`; `IngressError(400)` naming the first field
    that does not fit (or that the body is not JSON)."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":
            raise IngressError(400, "body is not JSON") from exc
        where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "body"
        raise IngressError(400, f"not {what}: {where}: {errors[0]['msg']}") from exc


@dataclass(frozen=True)
class WebhookAnswer:
    """What the HTTP layer answers a provider's webhook call with."""

    status: int
    body: dict[str, Any]
    events: tuple[RoomEvent, ...] = ()
    """The room events the call committed (none when it was refused)."""
    duplicates: int = 0
    """Messages of the call their room already held (a provider's retry): not committed again."""


@dataclass(frozen=True)
class Conversation:
    """A provider conversation: where a message came from and where replies go."""

    provider: str
    conversation_id: str
    group: bool
    reply_to: dict[str, str] = field(default_factory=dict, compare=False)
    """What the reply client needs besides the id (Teams: `service_url`; WhatsApp:
    `phone_number_id`, `to`)."""

    @property
    def key(self) -> str:
        """A short stable id for channel and room ids (the conversation id is long and may
        hold characters room ids cannot)."""
        digest = hashlib.sha256(f"{self.provider}\x00{self.conversation_id}".encode()).hexdigest()
        return f"{self.provider}-{digest[:12]}"


@dataclass(frozen=True)
class InboundItem:
    """One parsed provider message: who, in which conversation, what, and what else to keep."""

    conversation: Conversation
    sender_id: str
    sender_name: str | None
    text: str
    metadata: dict[str, Any] = field(default_factory=dict)
    message_id: str | None = None
    """The provider's id of this message in its conversation, the same in every retry of it (the
    dedupe key); `None` commits it every time it arrives."""

    def event_id(self) -> str | None:
        """The id its room event gets: a digest of (provider, conversation, message id)."""
        if self.message_id is None:
            return None
        conversation = self.conversation
        key = f"{conversation.provider}\x00{conversation.conversation_id}\x00{self.message_id}"
        return f"{conversation.provider}-{hashlib.sha256(key.encode()).hexdigest()[:32]}"


@dataclass(frozen=True)
class Accepted:
    """What `Ingress.accept` did with a call's items."""

    events: list[RoomEvent] = field(default_factory=list)
    """The events committed, in order."""
    duplicates: int = 0
    """Items whose message their room already held: not committed again."""


class ReplyClient(Protocol):
    """Sends an agent's reply back into a provider conversation (tests use a local server)."""

    async def send_text(self, conversation: Conversation, text: str) -> None: ...


MAX_PENDING_REPLIES = 64
"""Replies waiting for one conversation's provider at most; past it (the provider's API is down
or slower than the agents answer), the oldest waiting reply is dropped, logged and counted."""


class ConversationChannel(Channel):
    """One provider conversation in its room: turns come in through `Ingress`, agents' replies
    go back out through the provider's `ReplyClient`, one at a time and in order, at most
    `max_pending` waiting (the oldest is dropped past it: `dropped`)."""

    channel_type: ClassVar[str] = "chat"

    def __init__(
        self,
        channel_id: str,
        conversation: Conversation,
        client: ReplyClient,
        max_pending: int = MAX_PENDING_REPLIES,
    ) -> None:
        super().__init__(channel_id)
        self.conversation = conversation
        self.client = client
        self._outbox: asyncio.Queue[str] = asyncio.Queue(maxsize=max(1, max_pending))
        self._sender: asyncio.Task[None] | None = None
        self.failures = 0
        self.dropped = 0

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        if event.kind != "message" or event.source.channel_type not in AGENT_CHANNEL_TYPES:
            return  # people's turns are already in the conversation; only agents reply
        if not event.text.strip():
            return
        if self._outbox.full():  # the provider is not keeping up: the oldest reply gives way
            self._outbox.get_nowait()
            self._outbox.task_done()
            self.dropped += 1
            log.warning("%s: %d replies waiting for the provider; the oldest is dropped",
                        self.channel_id, self._outbox.maxsize)
        self._outbox.put_nowait(event.text)
        if self._sender is None or self._sender.done():
            self._sender = asyncio.create_task(self._send_all(), name=f"reply-{self.channel_id}")

    async def _send_all(self) -> None:
        while True:
            text = await self._outbox.get()
            try:
                await self.client.send_text(self.conversation, text)
            except Exception:
                self.failures += 1
                log.exception("reply to %s failed", self.channel_id)
            finally:
                self._outbox.task_done()

    async def wait_sent(self) -> None:
        """Wait until every reply queued so far was handed to the provider (or failed)."""
        await self._outbox.join()

    async def close(self) -> None:
        if self._sender is not None:
            self._sender.cancel()
            try:
                await self._sender
            except (asyncio.CancelledError, Exception):
                pass


RoomOpener = Callable[[str], Awaitable[None]]
"""Makes sure a room id exists with the application's channels attached (the server passes its
live rooms' opener; the default creates a bare room)."""


class Ingress:
    """Conversations of one provider → rooms of a kit. `await ingress.accept(items)`."""

    def __init__(
        self,
        kit: RoomKit,
        provider: str,
        client: ReplyClient,
        *,
        open_room: RoomOpener | None = None,
        room_for: Callable[[Conversation], str] | None = None,
    ) -> None:
        self.kit = kit
        self.provider = provider
        self.client = client
        self._open_room = open_room or self._create_room
        self._room_for = room_for or (lambda conversation: conversation.key)
        self.channels: dict[str, ConversationChannel] = {}
        self._lock = asyncio.Lock()

    async def _create_room(self, room_id: str) -> None:
        if await self.kit.get_room(room_id) is None:
            await self.kit.create_room(room_id=room_id)

    async def channel_for(self, conversation: Conversation) -> tuple[ConversationChannel, str]:
        """The conversation's channel and room, created (and bound) on first use."""
        async with self._lock:
            room_id = self._room_for(conversation)
            channel = self.channels.get(conversation.key)
            if channel is None:
                channel = ConversationChannel(conversation.key, conversation, self.client)
                self.kit.register_channel(channel)
                self.channels[conversation.key] = channel
            await self._open_room(room_id)
            bound = {c.channel_id for c in await self.kit.channels_in(room_id)}
            if channel.channel_id not in bound:
                await self.kit.attach_channel(room_id, channel.channel_id, group=conversation.group)
            return channel, room_id

    async def accept(self, items: list[InboundItem]) -> Accepted:
        """Commit parsed messages to their rooms, in order; a message its room already holds
        (same provider, conversation and message id) is skipped and counted."""
        committed: list[RoomEvent] = []
        duplicates = 0
        for item in items:
            channel, room_id = await self.channel_for(item.conversation)
            metadata = {**item.metadata, "ingress": self.provider}
            if item.sender_name and item.sender_name.strip():
                metadata["sender_name"] = item.sender_name.strip()
            result = await self.kit.process_inbound(
                InboundMessage(
                    channel_id=channel.channel_id,
                    sender_id=item.sender_id,
                    content=TextContent(body=item.text),
                    metadata=metadata,
                    # a group chat routes through its group binding; a one-to-one chat names it
                    room_id=None if item.conversation.group else room_id,
                    event_id=item.event_id(),
                )
            )
            if result.duplicate:
                duplicates += 1
                log.info(
                    "%s message %r in room %s was already committed: not again",
                    self.provider, item.message_id, result.room_id,
                )
            if result.event is not None:
                committed.append(result.event)
        return Accepted(committed, duplicates)

    async def wait_sent(self) -> None:
        """Wait until every agent reply so far was handed to the provider."""
        for channel in list(self.channels.values()):
            await channel.wait_sent()

    async def close(self) -> None:
        for channel in list(self.channels.values()):
            await channel.close()
