"""The live event feed of one room: every turn, speaker change and reply, fanned out to the
`/events` consumers (the page, dashboards) without ever waiting on them.

Owns the fan-out and its backpressure rule: `publish` never awaits — it puts the message in each
consumer's bounded queue, and a consumer whose queue is full has fallen behind and is dropped
(closed with `CloseCode.FEED_TOO_SLOW`). Audio handling and other rooms never wait on a slow
reader. A short history lets a consumer that joins late see the turns so far.

Also owns the room's rename book (`RenameBook`): renames arrive from any `/events` socket with a
room token, so the map they fill is client input and is bounded (issue 10.3): at most
`MAX_RENAMES_PER_ROOM` distinct (stream, label) keys; a new key beyond that evicts the least
recently set one (a rename already made can be set again; the page never needs hundreds).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

MAX_RENAMES_PER_ROOM = 256
"""Distinct (stream, label) renames a room keeps."""

RenameKey = tuple[str | None, str]
"""(stream id, or None for every stream in the room; raw speaker label)."""


class RenameBook(MutableMapping[RenameKey, str]):
    """A room's renames, bounded: setting a new key when full evicts the least recently set."""

    def __init__(self, limit: int = MAX_RENAMES_PER_ROOM) -> None:
        if limit < 1:
            raise ValueError("a rename book holds at least one rename")
        self.limit = limit
        self.evicted = 0
        """Renames forgotten to stay within `limit` (a room flooded with renames)."""
        self._names: OrderedDict[RenameKey, str] = OrderedDict()

    def __getitem__(self, key: RenameKey) -> str:
        return self._names[key]

    def __setitem__(self, key: RenameKey, name: str) -> None:
        self._names[key] = name
        self._names.move_to_end(key)
        while len(self._names) > self.limit:
            forgotten, _ = self._names.popitem(last=False)
            self.evicted += 1
            if self.evicted == 1 or self.evicted % 1000 == 0:
                log.warning("a room holds more than %d renames; forgot %r (%d forgotten)",
                            self.limit, forgotten, self.evicted)

    def __delitem__(self, key: RenameKey) -> None:
        del self._names[key]

    def __iter__(self) -> Iterator[RenameKey]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


@dataclass(eq=False)
class FeedConsumer:
    """One `/events` socket: its bounded queue, and whether it was dropped for lagging."""

    queue: asyncio.Queue[str]
    id: int = field(default_factory=itertools.count().__next__)
    dropped: bool = False
    dropped_event: asyncio.Event = field(default_factory=asyncio.Event)


class RoomFeed:
    def __init__(
        self,
        queue_size: int,
        history: int,
        on_drop: Callable[[FeedConsumer], None] | None = None,
    ) -> None:
        self.queue_size = queue_size
        self.history: deque[str] = deque(maxlen=history or None) if history else deque(maxlen=0)
        self.consumers: set[FeedConsumer] = set()
        self._on_drop = on_drop

    def subscribe(self) -> FeedConsumer:
        consumer = FeedConsumer(queue=asyncio.Queue(self.queue_size))
        for text in list(self.history)[-self.queue_size :]:
            consumer.queue.put_nowait(text)
        self.consumers.add(consumer)
        return consumer

    def unsubscribe(self, consumer: FeedConsumer) -> None:
        self.consumers.discard(consumer)

    def publish(self, text: str) -> None:
        """Hand `text` to every consumer now; drop the ones that cannot take it."""
        if self.history.maxlen != 0:
            self.history.append(text)
        for consumer in list(self.consumers):
            try:
                consumer.queue.put_nowait(text)
            except asyncio.QueueFull:
                self._drop(consumer)

    def _drop(self, consumer: FeedConsumer) -> None:
        consumer.dropped = True
        consumer.dropped_event.set()
        self.consumers.discard(consumer)
        if self._on_drop is not None:
            self._on_drop(consumer)
