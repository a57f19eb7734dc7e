"""Delegation: an agent channel hands a task to another agent channel, and the result comes back
to the room (rule G5).

Why this shape: the worker must know whose request it serves, in the same labels the room uses,
and must not read another agent's wording as a person's own words. So the task is rendered by the
attribution engine as a `<task>` block (`render_task_block`) headed by who asked — `Alice asked:`
when a person's request is forwarded as they wrote it, `Requested by Alice (2):` when the
delegating agent wrote the task for them, no header for a worker's own input — and the worker
reads that block alone (not the room), so nothing else in its input names anyone. The worker's
answer is posted into the room as an ordinary event of the worker's channel, so every other
channel (people, the delegating agent, a realtime session) sees it as that agent's turn.

A worker is anything with a `channel_id` registered with the kit and an async `perform_task(block,
room_id=...)` returning text: `AIChannel` is one; an external agent channel can be another.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attribution import render_task_block
from models import RoomEvent, TextContent

if TYPE_CHECKING:
    from rooms.kit import RoomKit


@runtime_checkable
class TaskWorker(Protocol):
    """An agent channel that can carry out a task block and answer with text."""

    channel_id: str

    async def perform_task(self, block: str, *, room_id: str) -> str: ...


@dataclass(frozen=True)
class Delegation:
    """What one delegation did: the block the worker read and the room event of its result
    (None when the worker answered nothing or a hook blocked the result)."""

    block: str
    result: RoomEvent | None


async def delegate_task(
    kit: RoomKit,
    room_id: str,
    worker: TaskWorker,
    *,
    request: RoomEvent | None = None,
    task: str | None = None,
    delegated_by: str | None = None,
    metadata: dict[str, Any] | None = None,
) -> Delegation:
    """Hand a task to `worker` and post its result into the room as the worker's event.

    - `request` alone: a person's request (a committed room event) forwarded as they wrote it —
      the block reads `Alice asked:` and the request's text.
    - `task` and `request`: a task the delegating agent wrote for that request's sender — the block
      reads `Requested by Alice (2):` and the agent's words.
    - `task` alone: the worker's own input — a block that names no one.

    The result event carries `task_result: True`, `delegated_by` (the delegating channel) and
    `in_reply_to` (the request's id), plus `metadata`.
    """
    if request is None and task is None:
        raise ValueError("delegate_task needs a request, a task, or both")
    if request is not None and request.room_id != room_id:
        raise ValueError(f"request {request.id!r} is not an event of room {room_id!r}")
    if request is not None and task is None and not request.text.strip():
        raise ValueError(f"request {request.id!r} has no text to forward")
    kit.get_channel(worker.channel_id)  # the worker must be a registered channel
    requester = await kit.label_for(room_id, request) if request is not None else None
    if task is None:
        assert request is not None
        block = render_task_block(request.text, requester)
    else:
        block = render_task_block(task, requester, written_by_agent=requester is not None)
    text = await worker.perform_task(block, room_id=room_id)
    if not text.strip():
        return Delegation(block=block, result=None)
    result_metadata: dict[str, Any] = {
        **(metadata or {}),
        "task_result": True,
        "delegated_by": delegated_by,
    }
    if request is not None:
        result_metadata["in_reply_to"] = request.id
    event = await kit.post_event(
        room_id, worker.channel_id, TextContent(body=text), metadata=result_metadata
    )
    return Delegation(block=block, result=event)
