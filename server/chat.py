"""Chat in `chorus serve`: people typing into a live room, next to people speaking into it.

Owns the text path into a room: `POST /v1/rooms/{room}/messages` (a room token with the `chat`
grant, a JSON body `{"participant": "u-alice", "name": "Alice", "text": "…"}`) and the event
feed's `message` request reach the same `LiveRooms.post_message`, which records the participant (B2: the name
comes from the participant record, as for a one-person stream) and commits the text as a turn
of the room's `chat` channel. From there the room does the rest: the realtime session and the
chat model (`[chat]` in the config) read typed and spoken turns as one labelled conversation in
commit order, and the feed shows the message (`type: "message"`) between the turns around it.

Typed identity comes from the token, never from the body (issue 25.3). A token that names a
participant (`sub`) types only as exactly that participant (the body must name it). A token
without `sub` types in the chat-only id space: the body's `participant` is recorded as
`chat:<participant>` (`typist_id`), and no stream or phone leg may declare an id there
(`framing.check_stream_participant`), so a typed message can never reuse, name itself after or
rename a voice participant's record; a typed name that reads like theirs is ranked apart (D2).

Posts are rate-limited per room and client (`ChatRateLimit`: a token bucket, `limits.chat_burst`
at once, then `limits.chat_rate` a second; the client is the token's `sub`, else its address):
over it, HTTP answers 429 with `Retry-After`, the feed is refused with 4429.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from models import RoomEvent
from rooms import Channel, RoomContext
from server.auth import RoomGrant
from server.protocol import PARTICIPANT_ID

CHAT_CHANNEL_ID = "chat"
CHAT_ONLY_PREFIX = "chat:"
"""The chat-only id space: what a token without `sub` types as (`chat:<body participant>`)."""


def typist_id(grant: RoomGrant, participant: str) -> str:
    """The participant record a post types under: the token's `sub` (the caller has checked
    that the body names it), or for a token without one the body's id in the chat-only space."""
    if grant.participant is not None:
        return grant.participant
    return CHAT_ONLY_PREFIX + participant


def client_key(grant: RoomGrant, address: str) -> str:
    """Whose rate limit a post counts against: the token's `sub`, else the client's address."""
    if grant.participant is not None:
        return "sub:" + grant.participant
    return "addr:" + address


class ChatInput(Channel):
    """The room's chat: typed messages enter through it. It takes nothing back (the feed and
    the page show the room's replies)."""

    channel_type: ClassVar[str] = "chat"

    def __init__(self, channel_id: str = CHAT_CHANNEL_ID) -> None:
        super().__init__(channel_id)

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        return None


class ChatPost(BaseModel):
    """The body of `POST /v1/rooms/{room}/messages`."""

    model_config = ConfigDict(extra="forbid")

    participant: str = Field(
        pattern=PARTICIPANT_ID,
        description="who types: with a token naming a participant (`sub`), exactly that id; "
        "without one, an id in the chat-only space (recorded as `chat:<participant>`)",
    )
    name: str | None = Field(
        default=None, min_length=1, max_length=80, description="their name, if the room has none"
    )
    text: str = Field(min_length=1, max_length=4000)


class ChatPosted(BaseModel):
    """A typed message committed to the room."""

    room: str
    event_id: str


class ChatRateLimit:
    """Token buckets for typed messages, one per (room, client): a client may post `burst`
    messages at once, then `rate` a second. `clock` is injectable (tests); a bucket that has
    filled up again is forgotten (it holds nothing a fresh one would not), so memory follows
    the clients posting now, not every client ever seen."""

    SWEEP_AT = 1024
    """Buckets held before the full ones are swept out."""

    def __init__(
        self, burst: int, rate: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if burst < 1 or rate <= 0:
            raise ValueError("a chat rate limit needs burst >= 1 and rate > 0")
        self.burst = burst
        self.rate = rate
        self.clock = clock
        self._buckets: dict[tuple[str, str], tuple[float, float]] = {}
        """(room, client) → (tokens left, when counted)."""
        self._sweep_at = self.SWEEP_AT

    def _tokens(self, key: tuple[str, str], now: float) -> float:
        held = self._buckets.get(key)
        if held is None:
            return float(self.burst)
        tokens, since = held
        return min(float(self.burst), tokens + max(0.0, now - since) * self.rate)

    def take(self, room: str, client: str) -> float:
        """Take one message from the client's bucket in `room`: 0.0 when it may post, else
        the seconds until it may (nothing is taken then)."""
        now = self.clock()
        key = (room, client)
        tokens = self._tokens(key, now)
        if tokens < 1.0:
            self._buckets[key] = (tokens, now)
            return (1.0 - tokens) / self.rate
        self._buckets[key] = (tokens - 1.0, now)
        if len(self._buckets) > self._sweep_at:
            self._sweep(now)
        return 0.0

    def _sweep(self, now: float) -> None:
        for key in [k for k in self._buckets if self._tokens(k, now) >= self.burst]:
            del self._buckets[key]
        self._sweep_at = max(self.SWEEP_AT, 2 * len(self._buckets))

    def __len__(self) -> int:
        return len(self._buckets)

    def refusal(self, wait_s: float) -> str:
        """What a refused client is told."""
        return (
            f"too many messages: {self.burst} at once, then {self.rate:g} a second; "
            f"retry in {retry_after(wait_s)} s"
        )


def retry_after(wait_s: float) -> int:
    """Whole seconds for a `Retry-After` header (at least 1)."""
    return max(1, math.ceil(wait_s))
