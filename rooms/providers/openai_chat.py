"""An `AIProvider` for the OpenAI Chat Completions API (and any server that speaks it).

Why here: the `AIChannel` hands every provider the same `AIContext`, already labelled by the
attribution engine; this module only maps it onto the Chat Completions wire format through the
real `openai` client and reads the reply back. Labels stay in the text (F3): no per-message `name`
fields, the `user` role is never renamed. `base_url` (or `OPENAI_BASE_URL`) points it at a proxy,
a compatible server (vLLM, llama.cpp, Ollama) or a local test server.
"""

from __future__ import annotations

import os
from typing import Any

from openai import AsyncOpenAI

from models import AIContext, AIImagePart, AIMessage, AITextPart
from rooms.ai import AIProvider, AIResponse

DEFAULT_MODEL = "gpt-4o-mini"


def chat_messages(context: AIContext) -> list[dict[str, Any]]:
    """The `messages` array for a context: the system prompt first, then each message in order."""
    messages: list[dict[str, Any]] = []
    if context.system_prompt:
        messages.append({"role": "system", "content": context.system_prompt})
    for message in context.messages:
        messages.append(_chat_message(message))
    return messages


def _chat_message(message: AIMessage) -> dict[str, Any]:
    if isinstance(message.content, str):
        return {"role": message.role, "content": message.content}
    if message.role != "user":  # only user turns take image parts; others read as text
        text = "".join(p.text for p in message.content if isinstance(p, AITextPart))
        return {"role": message.role, "content": text}
    parts: list[dict[str, Any]] = []
    for part in message.content:
        if isinstance(part, AITextPart):
            parts.append({"type": "text", "text": part.text})
        elif isinstance(part, AIImagePart):
            parts.append({"type": "image_url", "image_url": {"url": part.url}})
    return {"role": message.role, "content": parts}


class OpenAIChatProvider(AIProvider):
    """`OpenAIChatProvider(model="gpt-4o-mini", base_url=None, api_key=None, **params)`.

    `params` (temperature, max_completion_tokens, …) are passed to every request.
    """

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        client: AsyncOpenAI | None = None,
        timeout: float = 60.0,
        max_retries: int = 2,
        **params: Any,
    ) -> None:
        if client is None:
            key = api_key or os.environ.get("OPENAI_API_KEY")
            if not key:
                raise ValueError(
                    "OpenAIChatProvider needs an API key: pass api_key= or set OPENAI_API_KEY"
                )
            client = AsyncOpenAI(
                api_key=key,
                base_url=base_url or os.environ.get("OPENAI_BASE_URL") or None,
                timeout=timeout,
                max_retries=max_retries,
            )
        self.client = client
        self.model = model
        self.params = params

    async def generate(self, context: AIContext) -> AIResponse:
        completion = await self.client.chat.completions.create(
            model=self.model,
            messages=chat_messages(context),  # type: ignore[arg-type]
            **self.params,
        )
        if not completion.choices:
            return AIResponse(text="", metadata={"model": completion.model, "finish_reason": None})
        choice = completion.choices[0]
        metadata: dict[str, Any] = {
            "model": completion.model,
            "finish_reason": choice.finish_reason,
            "completion_id": completion.id,
        }
        if completion.usage is not None:
            metadata["usage"] = completion.usage.model_dump(exclude_none=True)
        return AIResponse(text=choice.message.content or "", metadata=metadata)
