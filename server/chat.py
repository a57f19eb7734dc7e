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
"""

from __future__ import annotations

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
