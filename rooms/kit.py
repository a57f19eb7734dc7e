"""RoomKit: the hub that carries events between channels.

Every event enters through one path (`_commit`): under the room lock, BEFORE_BROADCAST hooks may
change or stop it, the attribution engine fixes its author record (rank, rule D3), and the store
keeps it. Then it is delivered to the other channels of the room in commit order, and
AFTER_BROADCAST observers see it.

Delivery order is kept per room by a queue with one deliverer at a time. An event committed while
the room is delivering (a reply posted from inside `deliver`) joins the queue and is delivered
right after the current one, by the same deliverer; any other caller waits until its own event has
been delivered to the room's inline channels.

Why two kinds of channel: the room deliverer is the commit's audience (the server's output, which
feeds the device and the feed, must see every turn at once and in order), so it must never wait on
a consumer that takes seconds. A channel that says `inline_delivery = False` (the chat model's
`AIChannel`) gets each event through its own bounded queue per room with its own worker task: a
slow or never-answering model holds only its own queue, never the commit, the device, the feed or
another channel. Per channel, order is commit order, and an event's update (`update_event`) goes
through the same queue after the event. A queue over `delivery_queue_limit` skips its oldest
waiting delivery (never the one in progress; an event skipped takes its waiting updates with it),
logs it and counts it in `delivery_stats()`: the channel misses that turn as a trigger, the room's
store still holds it for its memory.

Who waits: `post_event` and `update_event` return once the inline channels had the event (the
voice session's commit is never held by a chat model); a channel that `settles_commits`
(`TextChannel`, a host's or a test's) and `process_inbound` also wait until the queued channels
took it, so `await kit.process_inbound(...)` returns once the room has seen the message and
everything it set off. Nothing posted from inside a queued channel's worker waits for queued
channels (two agents answering each other cannot wait on each other). `drain()` waits until every
queue is empty.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from attribution import Register, commit_turn, label_for, register_participant
from models import (
    Content,
    EventKind,
    EventSource,
    InboundMessage,
    Participant,
    RoomEvent,
    Visibility,
)
from rooms.channel import Channel, RoomContext
from rooms.hooks import HookContext, HookFn, HookRegistry, HookResult, HookTrigger
from rooms.locks import InProcessLocks, RoomLockManager
from rooms.roster import Rosters
from rooms.store import ChannelBinding, InMemoryStore, OpenedStore, Room, RoomStore, open_store

log = logging.getLogger(__name__)

T = TypeVar("T")


class RoutingError(ValueError):
    """An inbound message cannot be placed in a room."""


@dataclass
class InboundResult:
    room_id: str
    event: RoomEvent | None
    blocked: bool = False
    reason: str | None = None
    duplicate: bool = False
    """The message named an `event_id` the room already holds: nothing was committed."""


class _AlreadyCommitted(Exception):
    """Raised under the room lock when an inbound message's event id is already in the room."""


DELIVERY_QUEUE_LIMIT = 256
"""How many deliveries may wait in one queued channel's queue for one room (`RoomKit`'s
`delivery_queue_limit`): a chat model answering every turn of a busy room falls behind by minutes
before it skips a turn."""


@dataclass
class ChannelDeliveryStats:
    """The counters of one queued channel, over all rooms (`RoomKit.delivery_stats`): what a server
    exports as metrics. `waiting` is the deliveries queued now, not yet started."""

    channel_id: str
    delivered: int = 0
    failed: int = 0
    """Deliveries whose `deliver` / `deliver_update` raised (the queue goes on)."""
    dropped: int = 0
    """Deliveries skipped because the queue was full (or the room was deleted before them)."""
    waiting: int = 0


@dataclass
class _Queued:
    event: RoomEvent
    update: bool
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _ChannelQueue:
    """One queued channel's deliveries in one room, taken in order by one worker task."""

    channel: Channel
    items: deque[_Queued] = field(default_factory=deque)
    worker: asyncio.Task[None] | None = None


@dataclass
class _Delivery:
    event: RoomEvent
    update: bool = False
    """A replaced event (`update_event`): channels get it through `deliver_update`."""
    done: asyncio.Event = field(default_factory=asyncio.Event)
    queued: list[_Queued] = field(default_factory=list)
    """What the queued channels were handed (a settling committer waits for them)."""


@dataclass
class _RoomDelivery:
    queue: deque[_Delivery] = field(default_factory=deque)
    deliverer: object | None = None


_current_deliverer: contextvars.ContextVar[object | None] = contextvars.ContextVar(
    "chorus_current_deliverer", default=None
)
_in_queue_worker: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "chorus_in_queue_worker", default=False
)


class RoomKit:
    def __init__(
        self,
        *,
        store: RoomStore | None = None,
        locks: RoomLockManager | None = None,
        attribution: bool = True,
        delivery_queue_limit: int = DELIVERY_QUEUE_LIMIT,
    ) -> None:
        if delivery_queue_limit < 1:
            raise ValueError("delivery_queue_limit must be at least 1")
        self.store = store or InMemoryStore()
        self.locks = locks or InProcessLocks()
        self._rosters = Rosters(self.store)
        """Each served room's participants and register, kept in memory (`rooms.roster`)."""
        self.attribution = attribution
        self.hooks = HookRegistry()
        self._channels: dict[str, Channel] = {}
        self._deliveries: dict[str, _RoomDelivery] = {}
        self.delivery_queue_limit = delivery_queue_limit
        self._queues: dict[tuple[str, str], _ChannelQueue] = {}
        self._stats: dict[str, ChannelDeliveryStats] = {}

    # ----------------------------------------------------------------- rooms and channels

    async def create_room(self, room_id: str | None = None, metadata: dict[str, Any] | None = None) -> Room:
        room = Room(id=room_id or uuid.uuid4().hex, metadata=metadata or {})
        async with self.locks.lock(room.id):
            await self.store.create_room(room)
            await self.store.put_register(room.id, Register.new().model_dump(mode="json"))
        self.hooks.emit(HookTrigger.ON_ROOM_CREATED, room, HookContext(room.id, None, self))
        return room

    async def get_room(self, room_id: str) -> Room | None:
        return await self.store.get_room(room_id)

    async def delete_room(self, room_id: str) -> None:
        """Forget a room: under the room lock its stored data goes (room, bindings, senders routed
        to it, events, participants, register) and the kit's delivery queue for it; then every
        channel that was attached hears `on_detach` (it drops its sessions and buffers for the
        room), and the room's lock entry goes unless someone holds or waits for it. A room id used
        again afterwards is a new room. Deleting a room that is not there is no error."""
        async with self.locks.lock(room_id):
            attached = await self.channels_in(room_id)
            await self.store.delete_room(room_id)
            self._rosters.forget(room_id)
            self._deliveries.pop(room_id, None)
            self._drop_queues(room_id)
        for channel in attached:
            try:
                await channel.on_detach(room_id)
            except Exception:
                log.exception("channel %s failed to let go of room %s", channel.channel_id, room_id)
        self.locks.discard(room_id)

    async def release_room(self, room_id: str) -> None:
        """Free what the kit and the channels hold for a room in memory, keeping everything the
        store holds (an idle room evicted by a server). Every attached channel hears `on_detach`
        (it drops its sessions and buffers for the room), the kit drops the room's delivery queue
        and its lock entry unless someone holds or waits for it. The room's next event, or a
        channel attached again, takes it up where it was: its turns, participants and register
        are still in the store."""
        async with self.locks.lock(room_id):
            attached = await self.channels_in(room_id)
            state = self._deliveries.get(room_id)
            if state is not None and state.deliverer is None and not state.queue:
                del self._deliveries[room_id]
            self._rosters.forget(room_id)
        for channel in attached:
            try:
                await channel.on_detach(room_id)
            except Exception:
                log.exception("channel %s failed to let go of room %s", channel.channel_id, room_id)
        self.locks.discard(room_id)

    async def _require_room(self, room_id: str) -> Room:
        room = await self.store.get_room(room_id)
        if room is None:
            raise KeyError(f"no room {room_id!r}")
        return room

    def register_channel(self, channel: Channel) -> Channel:
        if channel.channel_id in self._channels and self._channels[channel.channel_id] is not channel:
            raise ValueError(f"a channel with id {channel.channel_id!r} is already registered")
        channel.bind(self)
        self._channels[channel.channel_id] = channel
        return channel

    def unregister_channel(self, channel_id: str) -> Channel:
        """Forget a registered channel (its owner closes it). Bindings are not touched: detach
        it from its rooms first (or delete the rooms), or events there skip it."""
        try:
            return self._channels.pop(channel_id)
        except KeyError:
            raise KeyError(f"no channel {channel_id!r} is registered") from None

    def get_channel(self, channel_id: str) -> Channel:
        try:
            return self._channels[channel_id]
        except KeyError:
            raise KeyError(f"no channel {channel_id!r} is registered") from None

    async def attach_channel(self, room_id: str, channel_id: str, group: bool = False) -> ChannelBinding:
        await self._require_room(room_id)
        channel = self.get_channel(channel_id)
        binding = ChannelBinding(room_id=room_id, channel_id=channel_id, group=group)
        async with self.locks.lock(room_id):
            await self.store.add_binding(binding)
        await channel.on_attach(room_id)
        return binding

    async def channels_in(self, room_id: str) -> list[Channel]:
        return [
            self._channels[b.channel_id]
            for b in await self.store.get_bindings(room_id)
            if b.channel_id in self._channels
        ]

    # ----------------------------------------------------------------- participants

    async def ensure_participant(
        self,
        room_id: str,
        channel_id: str,
        participant_id: str,
        display_name: str | None = None,
        identity_id: str | None = None,
    ) -> Participant:
        """Bookkeeping only: no event, no hook. Returns the existing record when there is one
        (adding `channel_id` to the channels it is reached through)."""
        await self._require_room(room_id)
        async with self.locks.lock(room_id):
            # D7: a room without a register rebuilds it (in the roster) from the participants and
            # turns it has now, before the newcomer joins, so no turn's rank moves to the newcomer.
            roster = await self._rosters.get(room_id)
            existing = roster.participants.get(participant_id)
            if existing is not None:
                if channel_id not in existing.connected_via:
                    existing = existing.model_copy(
                        update={"connected_via": [*existing.connected_via, channel_id]}
                    )
                    await self._rosters.put_participant(room_id, roster, existing)
                return existing.model_copy(deep=True)
            participant = Participant(
                id=participant_id,
                display_name=display_name,
                identity_id=identity_id,
                connected_via=[channel_id],
            )
            await self._rosters.put_participant(room_id, roster, participant)
            register_participant(roster.register, participant)
            await self._rosters.put_register(room_id, roster)
            return participant.model_copy(deep=True)

    async def update_participant(self, room_id: str, participant_id: str, *, display_name: str) -> Participant:
        """Rename a participant. Earlier turns keep the name they were committed under (D3)."""
        async with self.locks.lock(room_id):
            roster = await self._rosters.get(room_id)  # the register before the rename (D7)
            existing = roster.participants.get(participant_id)
            if existing is not None:
                updated = existing.model_copy(update={"display_name": display_name})
                await self._rosters.put_participant(room_id, roster, updated)
                register_participant(roster.register, updated)
                await self._rosters.put_register(room_id, roster)
                return updated.model_copy(deep=True)
        raise KeyError(f"no participant {participant_id!r} in room {room_id!r}")

    async def get_participants(self, room_id: str) -> list[Participant]:
        return await self.store.get_participants(room_id)

    # ----------------------------------------------------------------- events

    async def process_inbound(self, message: InboundMessage) -> InboundResult:
        """Route a transport's message to its room and commit it. A message with an `event_id`
        its room already holds is not committed again (`duplicate`): checked under the room lock,
        before any hook, so concurrent copies commit once."""
        channel = self.get_channel(message.channel_id)
        room_id = await self._route(message)
        event = RoomEvent(
            **({"id": message.event_id} if message.event_id is not None else {}),
            room_id=room_id,
            source=EventSource(
                channel_id=message.channel_id,
                participant_id=message.sender_id,
                channel_type=channel.channel_type,
            ),
            content=message.content,
            metadata=dict(message.metadata),
        )
        try:
            committed, reason = await self._commit(
                event, settle=True, once=message.event_id is not None
            )
        except _AlreadyCommitted:
            return InboundResult(room_id=room_id, event=None, reason="already committed", duplicate=True)
        return InboundResult(room_id=room_id, event=committed, blocked=committed is None, reason=reason)

    async def _route(self, message: InboundMessage) -> str:
        """The default router: an explicit `room_id` wins; a group binding takes every sender on
        the channel; otherwise each new sender on a channel gets a room of their own."""
        if message.room_id is not None:
            await self._require_room(message.room_id)
            bound = {b.channel_id for b in await self.store.get_bindings(message.room_id)}
            if message.channel_id not in bound:
                await self.attach_channel(message.room_id, message.channel_id)
            return message.room_id
        groups = [b for b in await self.store.bindings_for_channel(message.channel_id) if b.group]
        if len(groups) == 1:
            return groups[0].room_id
        if len(groups) > 1:
            raise RoutingError(
                f"channel {message.channel_id!r} is a group in {len(groups)} rooms; "
                "the message must name its room_id"
            )
        known = await self.store.find_sender_room(message.channel_id, message.sender_id)
        if known is not None:
            return known
        room = await self.create_room()
        await self.attach_channel(room.id, message.channel_id)
        await self.store.set_sender_room(message.channel_id, message.sender_id, room.id)
        return room.id

    async def post_event(
        self,
        room_id: str,
        channel_id: str,
        content: Content,
        *,
        participant_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        visibility: Visibility = "all",
        kind: EventKind = "message",
    ) -> RoomEvent | None:
        """Commit an event a channel produced itself (a voice turn, an AI reply, a notice).

        Returns the stored event, or None when a BEFORE_BROADCAST hook blocked it, once the room's
        inline channels had it; when the posting channel `settles_commits`, also once the queued
        channels took it (see the module docstring)."""
        await self._require_room(room_id)
        channel = self.get_channel(channel_id)
        event = RoomEvent(
            room_id=room_id,
            source=EventSource(
                channel_id=channel_id, participant_id=participant_id, channel_type=channel.channel_type
            ),
            content=content,
            kind=kind,
            metadata=dict(metadata or {}),
            visibility=visibility,
        )
        committed, _ = await self._commit(event, settle=channel.settles_commits)
        return committed

    async def update_event(
        self,
        room_id: str,
        event_id: str,
        *,
        content: Content | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> RoomEvent:
        """Replace an event's content and/or metadata. The replaced event loses its author record
        and is ranked against the register when read (D3). The other channels of the room are
        told through `Channel.deliver_update`, in the same order as deliveries (a device that
        showed an early voice turn shows its corrected text); returns once the inline channels
        were (a queued channel gets it through its queue, after the event itself)."""
        async with self.locks.lock(room_id):
            event = await self.store.get_event(room_id, event_id)
            if event is None:
                raise KeyError(f"no event {event_id!r} in room {room_id!r}")
            new_metadata = dict(metadata if metadata is not None else event.metadata)
            new_metadata.pop("author", None)
            updated = event.model_copy(
                update={"content": content or event.content, "metadata": new_metadata}
            )
            if self.attribution and updated.kind == "message":
                # The replaced turn is ranked on read (D3), but its (possibly new) name still joins
                # the register, so no later sender can take the rank it reads with (D5).
                roster = await self._rosters.get(room_id)
                commit_turn(roster.register, updated, roster.participants)
                await self._rosters.put_register(room_id, roster)
            await self.store.replace_event(updated)
            delivery = _Delivery(updated, update=True)
            self._deliveries.setdefault(room_id, _RoomDelivery()).queue.append(delivery)
        await self._deliver_through(room_id, delivery)
        return updated

    async def list_events(self, room_id: str, limit: int | None = None) -> list[RoomEvent]:
        return await self.store.list_events(room_id, limit)

    async def get_register(self, room_id: str) -> Register | None:
        """A copy of the room's register; None while the store holds none (a room from before
        the register, D7, until its next named turn)."""
        roster = await self._rosters.get(room_id)
        return roster.register.model_copy(deep=True) if roster.stored is not None else None

    async def labeller(self, room_id: str) -> Callable[[RoomEvent], str]:
        """`label_for` with the room's participants and register as they are now, taken once:
        for labelling many events (a transcript, a channel taking a room up). The function
        reads only its own snapshot, so it may run on a worker thread, off the event loop."""
        participants, register = (await self._rosters.get(room_id)).snapshot()
        return lambda event: label_for(event, participants, register)

    async def past_labels(self, room_id: str, include: Callable[[RoomEvent], bool]) -> list[str]:
        """The labels of the room's committed events that `include` keeps, oldest first (who
        already spoke, for a channel taking the room up: G3 counts the room). Read a page at a
        time, filtered and labelled on a worker thread: a room of 200,000 turns read whole and
        labelled on the loop held every room for seconds (issue 25.9)."""
        label = await self.labeller(room_id)

        def labelled(page: list[RoomEvent]) -> list[str]:
            return [label(e) for e in page if include(e)]

        labels: list[str] = []
        async for page in self.store.pages(room_id):  # never the whole room in memory at once
            labels += await asyncio.to_thread(labelled, page)
        return labels

    async def label_for(self, room_id: str, event: RoomEvent) -> str:
        """The label the attribution engine gives a committed event in this room (on the loop,
        against the roster itself: one turn's label costs no copy of the room)."""
        roster = await self._rosters.get(room_id)
        return label_for(event, roster.participants, roster.register)

    async def _commit(
        self, event: RoomEvent, *, settle: bool = False, once: bool = False
    ) -> tuple[RoomEvent | None, str | None]:
        room_id = event.room_id
        ctx = HookContext(room_id, event.source.channel_id, self, event.source.participant_id)
        async with self.locks.lock(room_id):
            if once and await self.store.get_event(room_id, event.id) is not None:
                raise _AlreadyCommitted(event.id)
            result: HookResult[RoomEvent] = await self.hooks.run_chain(
                HookTrigger.BEFORE_BROADCAST, event, ctx
            )
            if result.blocked:
                return None, result.reason
            if result.value is not None:
                event = result.value
            if self.attribution and event.kind == "message":
                roster = await self._rosters.get(room_id)
                author = commit_turn(roster.register, event, roster.participants)
                if author:
                    event = event.model_copy(update={"metadata": {**event.metadata, "author": author}})
                await self._rosters.put_register(room_id, roster)
            await self.store.add_event(event)
            delivery = _Delivery(event)
            self._deliveries.setdefault(room_id, _RoomDelivery()).queue.append(delivery)
        delivered = await self._deliver_through(room_id, delivery)
        if settle and delivered and not _in_queue_worker.get():
            for queued in delivery.queued:
                await queued.done.wait()
        return event, None

    async def _deliver_through(self, room_id: str, delivery: _Delivery) -> bool:
        """Deliver the room's queue until `delivery` was delivered; False when committed from
        inside a delivery (the running deliverer takes it next, after this caller returns)."""
        state = self._deliveries[room_id]
        if state.deliverer is not None:
            if _current_deliverer.get() is state.deliverer:
                return False
            await delivery.done.wait()
            return True
        token = object()
        state.deliverer = token
        reset = _current_deliverer.set(token)
        try:
            while state.queue:
                current = state.queue.popleft()
                try:
                    await self._deliver(current)
                finally:
                    current.done.set()
        finally:
            state.deliverer = None
            _current_deliverer.reset(reset)
        return True

    async def _deliver(self, delivery: _Delivery) -> None:
        event, update = delivery.event, delivery.update
        ctx = RoomContext(event.room_id, self)
        for channel in await self.channels_in(event.room_id):
            if channel.channel_id == event.source.channel_id or not event.visible_to(channel.channel_id):
                continue
            if not channel.inline_delivery:
                delivery.queued.append(self._enqueue(event.room_id, channel, event, update))
                continue
            try:
                if update:
                    await channel.deliver_update(event, ctx)
                else:
                    await channel.deliver(event, ctx)
            except Exception:
                log.exception("channel %s failed to take event %s", channel.channel_id, event.id)
        if update:
            return  # AFTER_BROADCAST observers saw the event once, when it was committed
        self.hooks.emit(
            HookTrigger.AFTER_BROADCAST,
            event,
            HookContext(event.room_id, event.source.channel_id, self, event.source.participant_id),
        )

    # ----------------------------------------------------------------- queued channels

    def delivery_stats(self) -> dict[str, ChannelDeliveryStats]:
        """A snapshot of every queued channel's counters, by channel id (delivered, failed,
        dropped since the kit started; waiting now): the hook a server reads to export metrics."""
        waiting: dict[str, int] = {}
        for (_, channel_id), queue in self._queues.items():
            waiting[channel_id] = waiting.get(channel_id, 0) + len(queue.items)
        return {
            channel_id: ChannelDeliveryStats(
                channel_id,
                delivered=stats.delivered,
                failed=stats.failed,
                dropped=stats.dropped,
                waiting=waiting.get(channel_id, 0),
            )
            for channel_id, stats in self._stats.items()
        }

    def _stats_of(self, channel_id: str) -> ChannelDeliveryStats:
        stats = self._stats.get(channel_id)
        if stats is None:
            stats = self._stats[channel_id] = ChannelDeliveryStats(channel_id)
        return stats

    def _enqueue(self, room_id: str, channel: Channel, event: RoomEvent, update: bool) -> _Queued:
        key = (room_id, channel.channel_id)
        queue = self._queues.get(key)
        if queue is None or queue.channel is not channel:
            queue = self._queues[key] = _ChannelQueue(channel)
        if len(queue.items) >= self.delivery_queue_limit:
            self._skip_oldest(room_id, queue)
        item = _Queued(event, update)
        queue.items.append(item)
        if queue.worker is None:
            queue.worker = asyncio.create_task(
                self._work(key, queue), name=f"deliver-{channel.channel_id}-{room_id}"
            )
        return item

    def _skip_oldest(self, room_id: str, queue: _ChannelQueue) -> None:
        """The overflow policy: the oldest waiting delivery goes, with the waiting updates of the
        event it carried (the channel never saw that event, so it has nothing to correct)."""
        oldest = queue.items.popleft()
        skipped = [oldest]
        if not oldest.update:
            skipped += [i for i in queue.items if i.update and i.event.id == oldest.event.id]
            gone = {id(i) for i in skipped}
            queue.items = deque(i for i in queue.items if id(i) not in gone)
        for item in skipped:
            item.done.set()
        self._stats_of(queue.channel.channel_id).dropped += len(skipped)
        log.warning(
            "channel %s fell %d deliveries behind in room %s: skipped event %s",
            queue.channel.channel_id, self.delivery_queue_limit, room_id, oldest.event.id,
        )

    async def _work(self, key: tuple[str, str], queue: _ChannelQueue) -> None:
        _current_deliverer.set(None)  # this task's own context: it delivers for no room loop
        _in_queue_worker.set(True)
        room_id = key[0]
        channel = queue.channel
        stats = self._stats_of(channel.channel_id)
        try:
            while queue.items:
                item = queue.items.popleft()
                ctx = RoomContext(room_id, self)
                try:
                    if item.update:
                        await channel.deliver_update(item.event, ctx)
                    else:
                        await channel.deliver(item.event, ctx)
                except Exception:
                    stats.failed += 1
                    log.exception("channel %s failed to take event %s", channel.channel_id, item.event.id)
                else:
                    stats.delivered += 1
                finally:
                    item.done.set()
        finally:
            queue.worker = None
            for item in queue.items:  # cancelled (the room was deleted, the kit closed)
                item.done.set()
            if self._queues.get(key) is queue and not queue.items:
                del self._queues[key]

    def _drop_queues(self, room_id: str | None = None) -> None:
        """Stop the workers of a room's queues (all rooms: None); what waited is dropped."""
        current = asyncio.current_task()
        for key, queue in list(self._queues.items()):
            if room_id is not None and key[0] != room_id:
                continue
            del self._queues[key]
            self._stats_of(queue.channel.channel_id).dropped += len(queue.items)
            for item in queue.items:
                item.done.set()
            queue.items.clear()
            if queue.worker is not None and queue.worker is not current:
                queue.worker.cancel()

    # ----------------------------------------------------------------- hooks

    def hook(
        self, trigger: HookTrigger, *, priority: int = 0, name: str | None = None
    ) -> Callable[[HookFn], HookFn]:
        """Register a hook: `@kit.hook(HookTrigger.BEFORE_BROADCAST)`."""

        def decorator(fn: HookFn) -> HookFn:
            self.hooks.add(trigger, fn, priority=priority, name=name)
            return fn

        return decorator

    async def run_hooks(self, trigger: HookTrigger, value: T, ctx: HookContext) -> HookResult[T]:
        return await self.hooks.run_chain(trigger, value, ctx)

    def emit(self, trigger: HookTrigger, value: Any, ctx: HookContext) -> None:
        self.hooks.emit(trigger, value, ctx)

    async def drain(self) -> None:
        """Wait until every queued channel's queue is empty and no observer hook still runs
        (tests, shutdown); what those set off is waited for too."""
        current = asyncio.current_task()
        while True:
            workers = [
                q.worker for q in self._queues.values() if q.worker is not None and q.worker is not current
            ]
            if workers:
                await asyncio.wait(workers)
            await self.hooks.drain()
            if not any(
                q.worker is not None and q.worker is not current for q in self._queues.values()
            ):
                return

    async def close(self) -> None:
        """Stop the queued channels' workers (what they had not delivered is dropped and counted:
        a model that never answers cannot hold a shutdown), wait for observer hooks, close every
        channel."""
        self._drop_queues()
        await self.hooks.drain()
        for channel in list(self._channels.values()):
            try:
                await channel.close()
            except Exception:
                log.exception("closing channel %s failed", channel.channel_id)


async def open_kit(
    url: str, *, room: str | None = None, **options: Any
) -> tuple[RoomKit, OpenedStore]:
    """A kit on the store `url` names (`open_store`: memory, SQLite, Postgres) with that store's
    room locks; close the `OpenedStore` after the kit. `chorus serve` and `chorus agent` both
    open their `[store]` here (a `chorus agent` job for its one `room`, so jobs share a SQLite
    file room by room); `options` go to `RoomKit`."""
    opened = await open_store(url, room=room)
    return RoomKit(store=opened.store, locks=opened.locks, **options), opened
