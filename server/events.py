"""The event feed socket (`/v1/rooms/{room}/events`): a room's feed out, the page's requests in.

Owns one feed consumer's socket once the server has checked its token and subscribed it: every
message the room publishes goes out in order; `rename` requests and typed `message` requests
(the token's `chat` grant, and its participant if it names one; typed as `server.chat.typist_id`
says, within the chat rate limit: over it the feed is refused with 4429) come in and go to the
room.
The feed ends when the consumer falls behind (`CloseCode.FEED_TOO_SLOW`: the room never waits
for it) or when the server drains: once the streams have flushed their last turns, it sends what
it still holds and the server closes it with 4503.
"""

from __future__ import annotations

import asyncio

from pydantic import ValidationError

from server.auth import Grant, RoomGrant, TokenProblem
from server.chat import client_key, typist_id
from server.feed import FeedConsumer
from server.framing import Refusal, check_participant
from server.live import LiveRooms
from server.protocol import CloseCode, FeedRequest, MessageRequest, parse_feed_request
from server.sockets import Socket


async def serve_feed(
    ws: Socket,
    rooms: LiveRooms,
    room: str,
    grant: RoomGrant,
    consumer: FeedConsumer,
    closing: asyncio.Event,
) -> bool:
    """Run the feed until it ends; True when `closing` ended it (the caller closes with 4503).
    Refuses a consumer that fell behind, and a request that does not parse or is not allowed."""

    async def send_all() -> None:
        while True:
            text = await consumer.queue.get()
            await ws.send(text)

    async def read_requests() -> None:
        async for message in ws.messages():
            try:
                request = parse_feed_request(message)
            except ValidationError as exc:
                raise Refusal(CloseCode.BAD_MESSAGE, "bad feed request", "bad_message") from exc
            await _take(request, rooms, room, grant, ws.remote)

    async def drained() -> None:
        await closing.wait()  # after the streams flushed their last turns
        while not consumer.queue.empty():
            await ws.send(consumer.queue.get_nowait())

    tasks = [
        asyncio.create_task(send_all()),
        asyncio.create_task(read_requests()),
        asyncio.create_task(consumer.dropped_event.wait()),
        asyncio.create_task(drained()),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if consumer.dropped:
        raise Refusal(CloseCode.FEED_TOO_SLOW, "event feed consumer fell behind", "feed_too_slow")
    for task in done:
        failure = task.exception()
        if failure is not None:
            raise failure
    return tasks[3] in done


async def _take(
    request: FeedRequest, rooms: LiveRooms, room: str, grant: RoomGrant, address: str
) -> None:
    if isinstance(request, MessageRequest):
        if not grant.allows(Grant.CHAT):
            raise Refusal(
                CloseCode.TOKEN_INVALID,
                "token has no chat grant",
                f"token_{TokenProblem.NOT_GRANTED.value}",
            )
        wait_s = rooms.chat_limit.take(room, client_key(grant, address))
        if wait_s > 0:
            raise Refusal(
                CloseCode.TOO_MANY_STREAMS, rooms.chat_limit.refusal(wait_s), "too_many_messages"
            )
        check_participant(grant, request.participant)
        await rooms.post_message(
            room, typist_id(grant, request.participant), request.name, request.text
        )
    else:
        rooms.rename(room, request.label, request.name, request.stream)
