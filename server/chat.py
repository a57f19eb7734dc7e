"""Chat in `chorus serve`: people typing into a live room, next to people speaking into it.

Owns the text path into a room: `POST /v1/rooms/{room}/messages` (the room's token, a JSON body
`{"participant": "u-alice", "name": "Alice", "text": "…"}`) and the event feed's `message`
request reach the same `LiveRooms.post_message`, which records the participant (B2: the name
comes from the participant record, as for a one-person stream) and commits the text as a turn
of the room's `chat` channel. From there the room does the rest: the realtime session and the
chat model (`[chat]` in the config) read typed and spoken turns as one labelled conversation in
commit order, and the feed shows the message (`type: "message"`) between the turns around it.

`handle_message_post` is the HTTP endpoint as a plain async function over the token, the raw
body and the room, so any HTTP framework routes to it and tests call it directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ValidationError

from models import RoomEvent
from rooms import Channel, RoomContext
from server.auth import TokenError, TokenProblem, verify_token
from server.protocol import MessageRequest

if TYPE_CHECKING:
    from server.live import LiveRooms

CHAT_CHANNEL_ID = "chat"

_TOKEN_STATUS = {
    TokenProblem.MISSING: 401,
    TokenProblem.MALFORMED: 401,
    TokenProblem.BAD_SIGNATURE: 401,
    TokenProblem.EXPIRED: 401,
    TokenProblem.WRONG_ROOM: 403,
}


class ChatInput(Channel):
    """The room's chat: typed messages enter through it. It takes nothing back (the feed and
    the page show the room's replies)."""

    channel_type: ClassVar[str] = "chat"

    def __init__(self, channel_id: str = CHAT_CHANNEL_ID) -> None:
        super().__init__(channel_id)

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        return None


@dataclass(frozen=True)
class HttpAnswer:
    status: int
    body: dict[str, Any]


def bearer_token(headers: dict[str, str], query: dict[str, str] | None = None) -> str | None:
    """The token of a request: `Authorization: Bearer …`, else `?token=`."""
    for key, value in headers.items():
        if key.lower() == "authorization" and value.lower().startswith("bearer "):
            return value[7:].strip()
    return (query or {}).get("token") or None


def parse_message_body(body: bytes | str) -> MessageRequest:
    """The body of `POST /v1/rooms/{room}/messages` (ValidationError when it is not one)."""
    return MessageRequest.model_validate_json(body)


async def handle_message_post(
    rooms: LiveRooms, secret: str, room: str, token: str | None, body: bytes
) -> HttpAnswer:
    """`POST /v1/rooms/{room}/messages`: 401/403 for a token that does not open the room, 400 for
    a body that is not a message, 201 with the committed event's id; a refusal changes nothing."""
    try:
        verify_token(secret, token, room)
    except TokenError as exc:
        return HttpAnswer(_TOKEN_STATUS[exc.problem], {"error": str(exc)})
    try:
        request = parse_message_body(body)
    except ValidationError as exc:
        errors = exc.errors()
        if errors and errors[0].get("type") == "json_invalid":
            return HttpAnswer(400, {"error": "body is not JSON"})
        where = ".".join(str(p) for p in errors[0].get("loc", ())) if errors else "body"
        return HttpAnswer(400, {"error": f"bad message at {where}: {errors[0]['msg']}"})
    event = await rooms.post_message(room, request)
    if event is None:
        return HttpAnswer(409, {"error": "a hook blocked the message"})
    return HttpAnswer(201, {"event_id": event.id, "room": room})
