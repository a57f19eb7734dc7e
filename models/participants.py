"""A person (or agent) known to a room.

`id` names them on the channels they are reached through (`connected_via`); `identity_id` is what an
identity resolver produced and names them on any channel (rule B2).
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class Participant(BaseModel):
    id: str
    display_name: str | None = None
    identity_id: str | None = None
    connected_via: list[str] = Field(default_factory=list)
