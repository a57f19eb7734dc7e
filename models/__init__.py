"""Data models shared by every part of Chorus.

Owns: room events, participants, inbound messages, content types, the typed voice turn
(`VoiceTurn`, the V2 metadata of a voice event) and the provider-facing AI context. Imports nothing from the rest of Chorus (pydantic only): every other package depends on
these shapes, so they stay plain data with no behaviour beyond small helpers.

Also owns the optional extras (`models.extras`: which modules each pip extra brings, and
`require`, the one check whose `MissingExtra` says in one line what to install): it sits here,
the lowest layer, so every package can check an optional part the same way.
"""

from models.ai import AIContext, AIImagePart, AIMessage, AIPart, AITextPart
from models.content import CompositeContent, Content, ImageContent, TextContent
from models.events import EventKind, EventSource, RoomEvent, Visibility
from models.messages import InboundMessage
from models.participants import Participant
from models.voice import VOICE_SOURCE, VoiceTurn

__all__ = [
    "VOICE_SOURCE",
    "AIContext",
    "AIImagePart",
    "AIMessage",
    "AIPart",
    "AITextPart",
    "CompositeContent",
    "Content",
    "EventKind",
    "EventSource",
    "ImageContent",
    "InboundMessage",
    "Participant",
    "RoomEvent",
    "TextContent",
    "Visibility",
    "VoiceTurn",
]
