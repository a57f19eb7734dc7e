"""Local servers that speak the providers' real wire formats, for tests and offline demos.

`openai_server.OpenAIRealtimeServer` speaks the OpenAI Realtime GA protocol and is reached through
the `openai` client's base URL; `gemini_server.GeminiLiveServer` speaks the Gemini Live
(`BidiGenerateContent`) protocol and is reached through `google-genai`'s `http_options.base_url`.
Both parse what they receive with the same typed wire models the client code uses.
"""

from realtime.testing.openai_server import (
    OpenAIRealtimeServer,
    events_sent,
    lines_sent,
    types_sent,
)

__all__ = ["OpenAIRealtimeServer", "events_sent", "lines_sent", "types_sent"]
