"""Deepgram streaming STT (rule S2) through the real `deepgram-sdk` v7 async client.

Only the protocol lives here: open `listen.v1.connect` with diarization, interim results and
utterance-end detection; send binary PCM16 frames; `KeepAlive`, `Finalize` and `CloseStream` as
JSON text frames; read `Results`, `UtteranceEnd` and `Metadata`, validated against the typed wire
models shared with the local test server (`voice.stt.deepgram_wire`). Keepalive timing, reconnect
with carried-over audio and speaker-label continuity are the base stream's (`voice.stt.base`).

The server is chosen like the SDK chooses it: an environment whose `production` websocket base is
`DEEPGRAM_URL` (e.g. `ws://127.0.0.1:9000`) when set, Deepgram's production endpoint otherwise.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

from deepgram import AsyncDeepgramClient
from deepgram.core.api_error import ApiError
from deepgram.environment import DeepgramClientEnvironment

from voice.stt.base import (
    RawEvent,
    RawResult,
    RawUtteranceEnd,
    RawWord,
    SttConnection,
    SttProvider,
    SttRefusedError,
)
from voice.stt.deepgram_wire import (
    SERVER_MESSAGE,
    DeepgramMetadata,
    DeepgramResults,
    DeepgramUtteranceEnd,
)

log = logging.getLogger(__name__)

REFUSAL_STATUSES = (401, 403)
"""Handshake statuses that mean the key is bad or lacks the permission: final, never retried."""


def environment_for(url: str | None) -> DeepgramClientEnvironment:
    """The SDK environment for a server URL (`ws://host:port` or `http://host:port`)."""
    if not url:
        return DeepgramClientEnvironment.PRODUCTION
    url = url.rstrip("/")
    if url.startswith(("http://", "https://")):
        ws = "ws" + url[len("http") :]
        http = url
    elif url.startswith(("ws://", "wss://")):
        ws = url
        http = "http" + url[len("ws") :]
    else:
        raise ValueError(f"DEEPGRAM_URL must start with ws://, wss://, http:// or https://, got {url!r}")
    return DeepgramClientEnvironment(base=http, production=ws, agent=ws, agent_rest=http)


class DeepgramSTT(SttProvider):
    """Deepgram `/v1/listen` streaming with diarization (per-word speaker ids)."""

    name = "deepgram"
    diarizes = True
    answers_audio = True
    """Deepgram sends `Results` (empty ones for silence) for every few seconds of audio."""

    def __init__(
        self,
        api_key: str | None = None,
        *,
        url: str | None = None,
        model: str = "nova-3",
        language: str = "en",
        diarize: bool = True,
        diarize_model: str | None = None,
        utterance_end_ms: int = 1000,
        endpointing_ms: int = 300,
        keepalive_interval: float = 3.0,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get("DEEPGRAM_API_KEY")
        if not key:
            raise ValueError("Deepgram needs an API key: pass api_key= or set DEEPGRAM_API_KEY")
        self.api_key = key
        self.url = url if url is not None else os.environ.get("DEEPGRAM_URL")
        self.environment = environment_for(self.url)
        self.model = model
        self.language = language
        self.diarizes = diarize
        """Ask Deepgram for per-word speaker ids (`diarize=true`, or `diarize_model`); with
        False the request says `diarize=false` and speakers must come from a diarization stage."""
        if diarize_model and not diarize:
            raise ValueError("diarize_model needs diarize=True")
        self.diarize_model = diarize_model
        self.utterance_end_ms = utterance_end_ms
        self.endpointing_ms = endpointing_ms
        self.keepalive_interval = keepalive_interval
        self._client: AsyncDeepgramClient | None = None

    @property
    def client(self) -> AsyncDeepgramClient:
        """The SDK client every stream's connection (and reconnection) opens its socket from:
        built once per provider, not once per connection. Building one makes an HTTP client and
        its TLS context (about 25 ms of CPU, on the event loop), which every other stream waited
        for: 48 streams starting together spent over a second of the loop on it (issue 31)."""
        if self._client is None:
            self._client = AsyncDeepgramClient(api_key=self.api_key, environment=self.environment)
        return self._client

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "model": self.model,
            "language": self.language,
            "encoding": "linear16",
            "sample_rate": str(self.sample_rate),
            "channels": "1",
            "interim_results": "true",
            "punctuate": "true",
            "smart_format": "true",
            "utterance_end_ms": str(self.utterance_end_ms),
            "endpointing": str(self.endpointing_ms),
        }
        if not self.diarizes:
            opts["diarize"] = "false"
        elif self.diarize_model:
            opts["diarize_model"] = self.diarize_model
        else:
            opts["diarize"] = "true"
        return opts

    async def connect(self) -> SttConnection:
        stack = AsyncExitStack()
        try:
            socket = await stack.enter_async_context(
                self.client.listen.v1.connect(**self.options()))
        except ApiError as exc:
            await stack.aclose()
            if exc.status_code in REFUSAL_STATUSES:
                # the SDK's own message carries the request headers: name the status only
                raise SttRefusedError(f"HTTP {exc.status_code} from the provider "
                                      "(the API key is invalid or lacks the permission)") from None
            raise
        except BaseException:
            await stack.aclose()
            raise
        return DeepgramConnection(socket, stack)


class DeepgramConnection(SttConnection):
    def __init__(self, socket: Any, stack: AsyncExitStack) -> None:
        self.socket = socket
        self.stack = stack
        self.closed = False

    async def send_audio(self, pcm16: bytes) -> None:
        await self.socket.send_media(pcm16)

    async def keepalive(self) -> None:
        await self.socket.send_keep_alive()

    async def finalize(self) -> None:
        await self.socket.send_finalize()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        with contextlib.suppress(Exception):
            await self.socket.send_close_stream()

    async def abort(self) -> None:
        self.closed = True
        with contextlib.suppress(Exception):
            await self.stack.aclose()

    async def events(self) -> AsyncIterator[RawEvent]:
        try:
            async for message in self.socket:
                if isinstance(message, bytes):
                    continue
                data = message.model_dump() if hasattr(message, "model_dump") else message
                try:
                    parsed = SERVER_MESSAGE.validate_python(data)
                except Exception as exc:
                    log.warning("deepgram: skipping a malformed server message (%s)", exc)
                    continue
                if isinstance(parsed, DeepgramResults):
                    yield _raw_result(parsed)  # the base treats from_finalize as the answer
                elif isinstance(parsed, DeepgramUtteranceEnd):
                    yield RawUtteranceEnd(parsed.last_word_end)
                elif isinstance(parsed, DeepgramMetadata):
                    log.debug("deepgram: metadata request_id=%s duration=%.2f", parsed.request_id,
                              parsed.duration)
        finally:
            if self.closed:
                with contextlib.suppress(Exception):
                    await self.stack.aclose()


def _raw_result(msg: DeepgramResults) -> RawResult:
    alt = msg.channel.alternatives[0] if msg.channel.alternatives else None
    words = tuple(
        RawWord(
            text=w.punctuated_word or w.word,
            start=w.start,
            end=w.end,
            confidence=w.confidence,
            speaker=w.speaker,
        )
        for w in (alt.words if alt else [])
    )
    return RawResult(
        words=words,
        is_final=bool(msg.is_final),
        speech_final=bool(msg.speech_final),
        from_finalize=bool(msg.from_finalize),
        audio_end=msg.start + msg.duration if msg.is_final else None,
    )
