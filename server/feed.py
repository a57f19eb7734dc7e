"""The live event feed of one room: every turn, speaker change and reply, fanned out to the
`/events` consumers (the page, dashboards) without ever waiting on them.

Owns the fan-out and its backpressure rule: `publish` never awaits — it puts the message in each
consumer's bounded queue, and a consumer whose queue is full has fallen behind and is dropped
(closed with `CloseCode.FEED_TOO_SLOW`). Audio handling and other rooms never wait on a slow
reader. A short history lets a consumer that joins late see the turns so far.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field


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
