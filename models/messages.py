"""What a transport hands the runtime: one message from one sender on one channel."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from models.content import Content


class InboundMessage(BaseModel):
    channel_id: str
    sender_id: str
    content: Content
    metadata: dict[str, Any] = Field(default_factory=dict)
    room_id: str | None = None
    event_id: str | None = None
    """The id the committed event gets, for a transport whose messages carry ids of their own (a
    provider's message id, digested): a message whose event id its room already holds is not
    committed again (`InboundResult.duplicate`), so a retried delivery is taken once."""
