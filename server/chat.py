"""Chat in `chorus serve`: people typing into a live room, next to people speaking into it.

Owns the text path into a room: `POST /v1/rooms/{room}/messages` (a room token with the `chat`
grant, a JSON body `{"participant": "u-alice", "name": "Alice", "text": "…"}`) and the event
feed's `message` request reach the same `LiveRooms.post_message`, which records the participant (B2: the name
comes from the participant record, as for a one-person stream) and commits the text as a turn
of the room's `chat` channel. From there the room does the rest: the realtime session and the
chat model (`[chat]` in the config) read typed and spoken turns as one labelled conversation in
commit order, and the feed shows the message (`type: "message"`) between the turns around it.

A token that names a participant (`sub`) may type only as that participant.
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from models import RoomEvent
from rooms import Channel, RoomContext
from server.protocol import PARTICIPANT_ID

CHAT_CHANNEL_ID = "chat"


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

    participant: str = Field(pattern=PARTICIPANT_ID, description="who types (a participant id)")
    name: str | None = Field(
        default=None, min_length=1, max_length=80, description="their name, if the room has none"
    )
    text: str = Field(min_length=1, max_length=4000)


class ChatPosted(BaseModel):
    """A typed message committed to the room."""

    room: str
    event_id: str
