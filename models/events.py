"""Room events: every turn, reply and runtime notice a room holds, in the order it was committed.

Events are never rewritten by the attribution engine (rule F1); labels exist only in what is
handed to a provider. `metadata` carries what ingress stamped (`sender_name`, voice timings) and
what the runtime decided at commit time (`author`, rule D3).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.content import Content, TextContent

EventKind = Literal["message", "system"]
"""`message`: a turn by a person or an agent. `system`: a runtime notice (never a speaker, A1)."""

Visibility = Literal["all", "none"] | list[str]
"""`all`: every channel in the room; `none`: stored only; a list: only those channel ids."""


def _new_id() -> str:
    return uuid.uuid4().hex


def _now() -> datetime:
    return datetime.now(UTC)


class EventSource(BaseModel):
    model_config = ConfigDict(frozen=True)

    channel_id: str
    participant_id: str | None = None
    channel_type: str | None = None


class RoomEvent(BaseModel):
    id: str = Field(default_factory=_new_id)
    room_id: str
    source: EventSource
    content: Content
    kind: EventKind = "message"
    metadata: dict[str, Any] = Field(default_factory=dict)
    visibility: Visibility = "all"
    created_at: datetime = Field(default_factory=_now)

    def visible_to(self, channel_id: str) -> bool:
        if self.visibility == "all":
            return True
        if self.visibility == "none":
            return False
        return channel_id in self.visibility

    @property
    def text(self) -> str:
        """The event's text: the body of a text turn, the text parts of a multimodal one."""
        content = self.content
        if isinstance(content, TextContent):
            return content.body
        if content.type == "composite":
            return "\n".join(p.body for p in content.parts if isinstance(p, TextContent))
        return content.caption or ""
