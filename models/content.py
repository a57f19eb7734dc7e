"""What a room event carries: text, an image, or a list of both (a multimodal turn, rule C5)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class TextContent(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["text"] = "text"
    body: str


class ImageContent(BaseModel):
    model_config = ConfigDict(frozen=True)

    type: Literal["image"] = "image"
    url: str
    mime_type: str | None = None
    caption: str | None = None


class CompositeContent(BaseModel):
    """A multimodal turn: text and image parts in order."""

    model_config = ConfigDict(frozen=True)

    type: Literal["composite"] = "composite"
    parts: list[Annotated[TextContent | ImageContent, Field(discriminator="type")]]


Content = Annotated[TextContent | ImageContent | CompositeContent, Field(discriminator="type")]
