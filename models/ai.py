"""The provider boundary: the context an AI provider is asked to generate from.

Attribution ends here: what a provider receives is an `AIContext`, already labelled.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field


class AITextPart(BaseModel):
    type: Literal["text"] = "text"
    text: str


class AIImagePart(BaseModel):
    type: Literal["image"] = "image"
    url: str
    mime_type: str | None = None


AIPart = Annotated[AITextPart | AIImagePart, Field(discriminator="type")]


class AIMessage(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str | list[AIPart]


class AIContext(BaseModel):
    messages: list[AIMessage]
    system_prompt: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
