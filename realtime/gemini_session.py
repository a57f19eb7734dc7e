"""Gemini Live through `google-genai` (`client.aio.live.connect`).

Only the wire loop lives here; the base class owns order, reconnect and one response at a time.
Mapping onto the same operations as OpenAI Realtime:

- a context item → `send_client_content(turns=Content(role=…, parts=[Part(text=…)]),
  turn_complete=False)` (added to the conversation in order, no answer);
- asking for a response → `send_client_content(turn_complete=True)`;
- audio mode (R3) → the model's own activity detection is disabled in the setup
  (`realtime_input_config.automatic_activity_detection.disabled`), each diarized turn's audio is
  sent between `activity_start` and `activity_end` (16 kHz PCM) — Gemini's "commit" — followed by
  the labelled item. (Gemini may begin answering at `activity_end` on its own; the channel's
  `turn_complete` then only confirms it. OpenAI has no such behaviour: `commit` never answers.)
- replies: `output_transcription` text (or text parts) are the transcript, `inline_data` audio
  parts (24 kHz PCM) the audio, `turn_complete` ends the reply.
- a connection's end: the service ends each connection after about ten minutes, sending `goAway`
  with the time left first; the base class opens a fresh one before then, at a moment with no
  reply in flight, with the history replayed (R6, `RealtimeSession.renew_before_s`). (Session
  resumption, which would keep the model's own context instead, is not used: without its
  Vertex-only `transparent` mode the client cannot tell which of its messages a handle holds.)
- a response that times out (`response_timeout`, R4): `BidiGenerateContent` has no message that
  cancels a generation (an interruption only comes from new user activity, which would itself be
  a turn). The session therefore closes the connection and opens a fresh one with the history
  replayed (R6): the abandoned turn cannot answer late on a connection that no longer exists.

`base_url` reaches a proxy or the local server (`realtime.testing.GeminiLiveServer`); `ssl` is an
`ssl.SSLContext` trusting that endpoint's certificate (the SDK's `async_client_args["ssl"]`).
"""

from __future__ import annotations

import base64
import contextlib
import os
import ssl as ssl_module
from collections.abc import AsyncIterator
from typing import Any

from google import genai
from google.genai import errors as genai_errors
from google.genai import types
from websockets.exceptions import ConnectionClosed

from realtime.session import (
    ContextItem,
    RealtimeSession,
    ReplyAudio,
    ReplyDone,
    ReplyStarted,
    ReplyTranscript,
    SessionDropped,
    SessionError,
    SessionEvent,
    SessionOptions,
    connect_error,
)

DEFAULT_MODEL = "gemini-live-2.5-flash-preview"
INPUT_SAMPLE_RATE = 16_000
OUTPUT_SAMPLE_RATE = 24_000


def _rate_of(mime_type: str | None) -> int:
    for piece in (mime_type or "").split(";"):
        key, _, value = piece.strip().partition("=")
        if key == "rate" and value.isdigit():
            return int(value)
    return OUTPUT_SAMPLE_RATE


def duration_seconds(value: str | None) -> float:
    """A protobuf `Duration` as JSON (`"49s"`, `"0.5s"`) in seconds; 0 when absent or not one
    (a `goAway` then renews at the next moment no reply is in flight)."""
    if value and value.endswith("s"):
        with contextlib.suppress(ValueError):
            return max(0.0, float(value[:-1]))
    return 0.0


class GeminiLiveSession(RealtimeSession):
    """`GeminiLiveSession(model=…, api_key=…, base_url=…, options=SessionOptions(...))`.

    `api_key` defaults to `GEMINI_API_KEY` / `GOOGLE_API_KEY`.
    """

    provider = "gemini"
    input_sample_rate = INPUT_SAMPLE_RATE

    def __init__(
        self,
        options: SessionOptions | None = None,
        *,
        model: str = DEFAULT_MODEL,
        api_key: str | None = None,
        base_url: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        client: genai.Client | None = None,
        **reconnect: Any,
    ) -> None:
        super().__init__(options, **reconnect)
        self.model = model
        if client is None:
            key = api_key or os.environ.get("GEMINI_API_KEY") or os.environ.get("GOOGLE_API_KEY")
            if not key:
                raise ValueError(
                    "the Gemini Live session needs an API key: pass api_key= or set "
                    "GEMINI_API_KEY (use provider='recorder' to run without one)"
                )
            http_options: dict[str, Any] = {}
            if base_url:
                http_options["base_url"] = base_url
            if ssl is not None:
                http_options["async_client_args"] = {"ssl": ssl}
            client = genai.Client(
                api_key=key,
                http_options=types.HttpOptions(**http_options) if http_options else None,
            )
        self.client = client
        self._stack: contextlib.AsyncExitStack | None = None
        self._session: Any = None
        self._responses = 0
        self._current: str | None = None
        self._current_request: int | None = None
        self._started = False
        self._transcript: list[str] = []
        self._activity_open = False

    def connect_config(self) -> types.LiveConnectConfig:
        options = self.options
        config = types.LiveConnectConfig(
            response_modalities=[
                types.Modality.AUDIO if options.output_audio else types.Modality.TEXT
            ],
        )
        if options.instructions:
            config.system_instruction = types.Content(
                role="user", parts=[types.Part(text=options.instructions)]
            )
        if options.output_audio:
            config.output_audio_transcription = types.AudioTranscriptionConfig()
        if options.audio_input:
            config.realtime_input_config = types.RealtimeInputConfig(
                automatic_activity_detection=types.AutomaticActivityDetection(disabled=True)
            )
        if options.voice:
            config.speech_config = types.SpeechConfig(
                voice_config=types.VoiceConfig(
                    prebuilt_voice_config=types.PrebuiltVoiceConfig(voice_name=options.voice)
                )
            )
        return config

    async def _connect(self) -> None:
        stack = contextlib.AsyncExitStack()
        try:
            self._session = await stack.enter_async_context(
                self.client.aio.live.connect(model=self.model, config=self.connect_config())
            )
        except Exception as exc:  # OSError, APIError, websockets' InvalidStatus, InvalidURI …
            await stack.aclose()
            raise connect_error(self.provider, exc) from exc
        self._stack = stack
        self._current = None
        self._started = False
        self._transcript = []
        self._activity_open = False

    async def _disconnect(self) -> None:
        stack, self._stack = self._stack, None
        self._session = None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def _call(self, record: dict[str, Any], method: str, **kwargs: Any) -> None:
        if self._session is None:
            raise SessionDropped("not connected")
        try:
            await getattr(self._session, method)(**kwargs)
        except (ConnectionClosed, OSError, genai_errors.APIError) as exc:
            raise SessionDropped(str(exc)) from exc
        self._record(record)

    async def _send_configure(self) -> None:
        # Gemini takes its configuration in the connect handshake (`setup`); record it so the
        # session's log reads like the OpenAI one.
        self._record({"setup": self.connect_config().model_dump(mode="json", exclude_none=True)})

    async def _send_item(self, item: ContextItem) -> None:
        role = "model" if item.role == "assistant" else "user"
        await self._call(
            {
                "client_content": {
                    "turns": [{"role": role, "parts": [{"text": item.text}]}],
                    "turn_complete": False,
                }
            },
            "send_client_content",
            turns=types.Content(role=role, parts=[types.Part(text=item.text)]),
            turn_complete=False,
        )

    async def _send_audio(self, pcm16: bytes) -> None:
        if not self._activity_open:
            await self._call(
                {"realtime_input": {"activity_start": {}}},
                "send_realtime_input",
                activity_start=types.ActivityStart(),
            )
            self._activity_open = True
        chunk = self.input_sample_rate * 2
        mime = f"audio/pcm;rate={self.input_sample_rate}"
        for start in range(0, len(pcm16), chunk):
            piece = pcm16[start : start + chunk]
            await self._call(
                {
                    "realtime_input": {
                        "audio": {
                            "data": base64.b64encode(piece).decode("ascii"),
                            "mime_type": mime,
                        }
                    }
                },
                "send_realtime_input",
                audio=types.Blob(data=piece, mime_type=mime),
            )

    async def _send_commit(self) -> None:
        if self._activity_open:
            await self._call(
                {"realtime_input": {"activity_end": {}}},
                "send_realtime_input",
                activity_end=types.ActivityEnd(),
            )
            self._activity_open = False

    async def _send_response_create(self) -> None:
        self._responses += 1
        self._current = f"gemini_resp_{self.connection_index}_{self._responses}"
        self._current_request = self.active_request
        self._started = False
        self._transcript = []
        await self._call(
            {"client_content": {"turn_complete": True}},
            "send_client_content",
            turns=None,
            turn_complete=True,
        )

    async def _abandon_response(self, response_id: str | None) -> None:
        # No cancel in the protocol: a fresh connection is the only sure stop (see the docstring).
        await self._reopen()

    async def _receive(self) -> AsyncIterator[SessionEvent]:
        session = self._session
        if session is None:
            raise SessionDropped("not connected")
        while True:
            try:
                async for message in session.receive():
                    for event in self._events_of(message):
                        yield event
            except (ConnectionClosed, OSError, genai_errors.APIError) as exc:
                if self._closing:
                    return
                raise SessionDropped(str(exc)) from exc
            except ValueError as exc:  # a message that is not JSON
                yield SessionError("malformed_server_event", str(exc))

    def _events_of(self, message: types.LiveServerMessage) -> list[SessionEvent]:
        if message.go_away is not None:
            self._connection_ends_in(duration_seconds(message.go_away.time_left))
        content = message.server_content
        if content is None:
            return []
        rid = self._current or f"gemini_resp_{self.connection_index}_unrequested"
        request = self._current_request if self._current else None
        out: list[SessionEvent] = []

        def start() -> None:
            if not self._started:
                self._started = True
                out.append(ReplyStarted(rid, request))

        if content.output_transcription is not None and content.output_transcription.text:
            start()
            self._transcript.append(content.output_transcription.text)
            out.append(ReplyTranscript(rid, content.output_transcription.text))
        if content.model_turn is not None:
            for part in content.model_turn.parts or []:
                if part.inline_data is not None and part.inline_data.data:
                    start()
                    out.append(
                        ReplyAudio(rid, part.inline_data.data, _rate_of(part.inline_data.mime_type))
                    )
                elif part.text and not self.options.output_audio:
                    start()
                    self._transcript.append(part.text)
                    out.append(ReplyTranscript(rid, part.text))
        if content.turn_complete:
            start()
            out.append(
                ReplyDone(
                    rid,
                    "".join(self._transcript).strip(),
                    "cancelled" if content.interrupted else "completed",
                    request,
                )
            )
            self._current = None
            self._current_request = None
            self._started = False
            self._transcript = []
        return out
