"""Realtime providers by name: `make_session("openai" | "gemini" | "recorder", options, **kw)`.

Adding a provider is one module with a `RealtimeSession` subclass and one line here (two when
its SDK comes with a pip extra: `EXTRAS`). A channel opens its sessions per room, so whoever
builds one calls `require_provider` first: a missing extra then fails at start, not in a room.
"""

from __future__ import annotations

from typing import Any

from models.extras import require
from realtime.session import RealtimeSession, SessionOptions

PROVIDERS = ("recorder", "openai", "gemini")

EXTRAS = {"openai": ("openai", "the OpenAI realtime provider"),
          "gemini": ("gemini", "the Gemini Live realtime provider")}
"""Provider → (the pip extra its SDK comes with, what to call it in the install hint)."""


def require_provider(provider: str) -> None:
    """Raise `models.extras.MissingExtra` (one line: what to install) when `provider`'s SDK is
    not installed; nothing for the recorder, which needs none."""
    if provider in EXTRAS:
        require(*EXTRAS[provider])


def make_session(
    provider: str, options: SessionOptions | None = None, **kwargs: Any
) -> RealtimeSession:
    """A new session for `provider`; `kwargs` go to its constructor (model, api_key, base_url …).

    Options left at `None` take the provider's defaults, so one configuration section can serve
    every provider; the recorder ignores connection options (it connects nowhere).
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    require_provider(provider)
    if provider == "recorder":
        for name in ("api_key", "base_url", "websocket_base_url", "ssl", "client"):
            kwargs.pop(name, None)
        from realtime.recorder import RecorderSession

        return RecorderSession(options, **kwargs)
    if provider == "openai":
        from realtime.openai_session import OpenAIRealtimeSession

        return OpenAIRealtimeSession(options, **kwargs)
    if provider == "gemini":
        from realtime.gemini_session import GeminiLiveSession

        return GeminiLiveSession(options, **kwargs)
    raise ValueError(
        f"unknown realtime provider {provider!r}; choose one of {', '.join(PROVIDERS)}"
    )


class SessionFactory:
    """A provider with its settings, called once per room: `RealtimeChannel("rt",
    OpenAIRealtimeSessionFactory(base_url=…))`. `kwargs` go to the session's constructor."""

    provider: str = ""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __call__(self, options: SessionOptions) -> RealtimeSession:
        return make_session(self.provider, options, **self.kwargs)


class OpenAIRealtimeSessionFactory(SessionFactory):
    provider = "openai"


class GeminiLiveSessionFactory(SessionFactory):
    provider = "gemini"


class RecorderSessionFactory(SessionFactory):
    provider = "recorder"
