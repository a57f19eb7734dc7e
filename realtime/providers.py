"""Realtime providers by name: `make_session("openai" | "gemini" | "recorder", options, **kw)`.

Adding a provider is one module with a `RealtimeSession` subclass and one line here.
"""

from __future__ import annotations

from typing import Any

from realtime.session import RealtimeSession, SessionOptions

PROVIDERS = ("recorder", "openai", "gemini")


def make_session(
    provider: str, options: SessionOptions | None = None, **kwargs: Any
) -> RealtimeSession:
    """A new session for `provider`; `kwargs` go to its constructor (model, api_key, base_url …).

    Options left at `None` take the provider's defaults, so one configuration section can serve
    every provider; the recorder ignores connection options (it connects nowhere).
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
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
