"""Speak policies for the realtime channel (R4, G6): the same objects that gate `AIChannel`.

They live in `rooms.policy` (so a chat model and a realtime model share one policy); this module
re-exports them so `from realtime.policy import …` keeps working.
"""

from rooms.policy import (
    AllOf,
    AnswerAlways,
    AnswerNever,
    AnswerOnly,
    AnswerWhenAddressed,
    AnswerWhenAlone,
    AnyOf,
    SpeakPolicy,
    SpeakTurn,
    addressed,
    default_policy,
)

__all__ = [
    "AllOf",
    "AnswerAlways",
    "AnswerNever",
    "AnswerOnly",
    "AnswerWhenAddressed",
    "AnswerWhenAlone",
    "AnyOf",
    "SpeakPolicy",
    "SpeakTurn",
    "addressed",
    "default_policy",
]
