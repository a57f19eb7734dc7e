"""The server's HTTP surface: declared routes with pydantic bodies, and their errors as problems.

Owns every HTTP route of `chorus serve` (the transcript page, `/healthz`, `/metrics`, a room's
transcript, deleting a room, typed messages, the AudioSocket UUID→room map, the Teams and
WhatsApp webhooks, the voice directory (`/v1/voices`, `…/speakers/remember`), and the `426` a
plain GET of a websocket route gets) and their error shape: JSON `{"problem": …, "detail": …}`
with the problem names the metrics and the websocket close reasons use. JSON bodies are pydantic
models, so `/openapi.json` describes every route. The websockets are `server.app`'s: it builds
this app and adds its socket routes after these.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import uuid
from collections.abc import Callable, Mapping
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Header, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from models import RoomEvent
from rooms.voices import RememberedVoice
from server.audiosocket import PARTICIPANT, AudioSocketCall, AudioSocketCalls
from server.auth import Grant, RoomGrant, TokenError, TokenProblem, verify_token
from server.chat import ChatPost, ChatPosted, client_key, retry_after, typist_id
from server.ingress.base import WebhookAnswer
from server.ingress.serve import Webhooks
from server.live import LiveRooms
from server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from server.metrics import ServerMetrics
from server.protocol import ROOM_ID, error_location
from server.voices import VoiceDirectory, VoicesError
from voice.audio import AudioError, read_audio_16k
from voice.transcribe import Turn, format_turns


class Problem(BaseModel):
    """Every HTTP error: a stable problem name (the same names the metrics and close reasons use)
    and a sentence for people."""

    problem: str
    detail: str


class StageHealth(BaseModel):
    """The diarization stage's load (issue 31; docs/server.md "When the stage falls behind")."""

    lag_s: float
    """The largest lag of a stream on the stage (seconds of audio whose answer is not back)."""
    on_stage: int
    stretched: int
    fallback: int
    """Streams whose speakers come from the STT now (off the stage)."""
    admitting: bool
    """False while new shared-mic streams are refused (4429)."""


class Health(BaseModel):
    status: Literal["ok", "closing", "overloaded"]
    """`ok`; `closing` while the server drains (503); `overloaded` when `?max_load=` was given
    and the load is over it (503: a load balancer that reads only status codes stops sending
    work)."""
    rooms: int
    streams: int
    load: float
    """0..1, the largest of the stage's, the streams' and the CPU's shares (`server.load`)."""
    cpu: float
    """The process's share of its usable cores over the last second or more."""
    stage: StageHealth | None = None
    """None when no stream can use a diarization stage (STT labels, or `diarizer.kind = none`)."""


class TranscriptTurn(BaseModel):
    """One line of the room: a committed speaker turn, as `chorus transcribe --format json`
    writes it, or a typed message (`kind: "typed"`, its times where it fell among the turns);
    then what ties it to the feed's messages: the room event's id (the feed's `event_id`), the
    raw label, the stream and the participant (so a page can show the meeting so far, then the
    live feed, without showing a line twice)."""

    speaker: str | None
    text: str
    start: float
    end: float
    kind: Literal["spoken", "typed"]
    event_id: str
    label: str | None = None
    stream: str | None = None
    participant: str | None = None


class WebhookAccepted(BaseModel):
    """A provider webhook taken: how many messages became room events."""

    accepted: int


WEBHOOK_MAX_BYTES = 1024 * 1024
"""Largest provider webhook body read; a bigger one is refused (413) before it is buffered."""
CHAT_MAX_BYTES = 64 * 1024
"""Largest typed-message body read (4000 characters of text, JSON-escaped, fit in it); a bigger
one is refused (413) before it is buffered, and only once the token was checked."""


async def _read_body(request: Request, limit: int, what: str) -> bytes:
    """The raw body, at most `limit` bytes: refused (413) by its declared length, or as soon as
    more than `limit` bytes arrived, never buffered whole."""
    declared = request.headers.get("content-length")
    too_large = ProblemError(413, "body_too_large", f"{what} bodies are at most {limit} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > limit:
            raise too_large
    return bytes(body)


async def _webhook_body(request: Request) -> bytes:
    """The raw body (signatures cover the exact bytes), at most `WEBHOOK_MAX_BYTES`."""
    return await _read_body(request, WEBHOOK_MAX_BYTES, "webhook")


def _chat_post(body: bytes) -> ChatPost:
    """The typed message of a body already size-checked, or a 422 naming the first bad field."""
    try:
        return ChatPost.model_validate_json(body)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
        raise RequestValidationError(errors) from exc


def _webhook_answer(answer: WebhookAnswer) -> WebhookAccepted:
    if answer.status != 200:
        problem = "bad_signature" if answer.status == 401 else "bad_request"
        raise ProblemError(answer.status, problem, str(answer.body.get("error", "refused")))
    return WebhookAccepted(accepted=len(answer.events))


class AudioSocketRoute(BaseModel):
    """Where the AudioSocket call with this UUID goes (`PUT /v1/audiosocket/{uuid}`)."""

    model_config = ConfigDict(extra="forbid")

    room: str = Field(pattern=rf"^{ROOM_ID}$")
    participant: str | None = Field(default=None, pattern=rf"^{PARTICIPANT}$")
    """The call's participant id (default `call-<uuid>`)."""
    name: str | None = Field(default=None, min_length=1, max_length=80)
    """The name a one-person call's turns carry (never put a caller's number here)."""
    shared_mic: bool = False
    """A speakerphone: several voices on the call, diarized."""


class AudioSocketRouted(AudioSocketRoute):
    uuid: str


class RememberSpeaker(BaseModel):
    """`POST /v1/rooms/{room}/speakers/remember`: keep `label`'s voice as `name`'s."""

    model_config = ConfigDict(extra="forbid")

    label: str = Field(min_length=1, max_length=80)
    name: str = Field(min_length=1, max_length=80)
    stream: str | None = Field(default=None, min_length=1, max_length=64)
    """The stream whose voice it is (needed only when two open streams have the label)."""


class VoiceInfo(BaseModel):
    """A remembered person as the directory shows them: never a print's vector."""

    id: str
    name: str
    prints: int
    """How many prints are kept (one per meeting remembered or clip enrolled)."""
    created: float
    """When first remembered (unix seconds)."""
    last_heard: float | None
    """When a room last named them (unix seconds; None: never yet)."""


class SpeakerRemembered(BaseModel):
    room: str
    label: str
    name: str
    stream: str
    voice: VoiceInfo


class VoiceClip(BaseModel):
    """`POST /v1/voices`: enroll `name` from a clip of their speech."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=80)
    audio: str = Field(min_length=1)
    """A WAV (or any format `chorus transcribe` reads), base64; a few seconds of speech."""


class VoiceForgotten(BaseModel):
    id: str
    deleted: Literal[True] = True


def voice_info(voice: RememberedVoice) -> VoiceInfo:
    return VoiceInfo(id=voice.id, name=voice.name, prints=len(voice.prints),
                     created=voice.created, last_heard=voice.last_heard)


VOICE_CLIP_MAX_BYTES = 8 * 1024 * 1024
"""Largest `POST /v1/voices` body (about a minute of 48 kHz 16-bit WAV, base64)."""
SERVER_WIDE = "*"
"""The room claim of a server-wide token (`chorus token '*' --grant admin`)."""


class RoomDeleted(BaseModel):
    room: str
    deleted: Literal[True] = True


TranscriptFormat = Literal["json", "text", "markdown", "srt", "vtt", "rttm"]
_TRANSCRIPT_TYPES: dict[str, str] = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "markdown": "text/markdown; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "rttm": "text/plain; charset=utf-8",
}
_REPLIES = frozenset({"ai", "realtime", "server"})
"""Channel types whose messages are the models' (or the server's own), not the people's."""
_TOKEN_STATUS = {
    TokenProblem.WRONG_ROOM: 403,
    TokenProblem.NOT_GRANTED: 403,
    TokenProblem.WRONG_PARTICIPANT: 403,
}
"""HTTP status of a token problem (default 401: the bearer is not authenticated)."""


class ProblemError(Exception):
    """An HTTP request refused with a status and a problem name (answered as `Problem` JSON)."""

    def __init__(
        self, status: int, problem: str, detail: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.problem = problem
        self.detail = detail
        self.headers = headers or {}


ROOM_PATTERN = rf"^{ROOM_ID}$"
RoomId = Annotated[str, PathParam(pattern=ROOM_PATTERN, description="the room id")]
TokenQuery = Annotated[
    str | None, Query(description="room token (or send `Authorization: Bearer …`)")
]
AuthorizationHeader = Annotated[str | None, Header(include_in_schema=False)]
_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Token missing, malformed, badly signed or expired"},
    403: {"model": Problem, "description": "Token for another room, or without the grant"},
}


def _page(voices: bool) -> bytes:
    """The page; with the voice directory on, it shows each voice's Remember button."""
    page = resources.files("server").joinpath("page.html").read_bytes()
    return page.replace(b'<body data-voices="off">', b'<body data-voices="on">') if voices else page


def problem_response(
    status: int, problem: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        Problem(problem=problem, detail=detail).model_dump(),
        status_code=status,
        headers={"Cache-Control": "no-store", **(headers or {})},
    )


_HTTP_PROBLEMS = {404: "not_found", 405: "method_not_allowed", 426: "upgrade_required"}



class HttpRoutes:
    """The HTTP routes of one server; `app(websocket_paths)` builds the FastAPI app with them."""

    def __init__(
        self,
        rooms: LiveRooms,
        metrics: ServerMetrics,
        webhooks: Webhooks,
        secret: str,
        closing: Callable[[], bool],
        audiosocket_calls: AudioSocketCalls | None = None,
    ) -> None:
        self.rooms = rooms
        self.metrics = metrics
        self.webhooks = webhooks
        self.secret = secret
        self.closing = closing
        self.audiosocket_calls = audiosocket_calls
        """The AudioSocket UUID→room map (None: `[audiosocket]` is off)."""
        """Whether the server is draining (health says `closing`, messages are refused)."""
        self._page = _page(voices=rooms.voices is not None)

    def app(self, websocket_paths: tuple[str, ...]) -> FastAPI:
        """The app with every HTTP route; a plain GET of a `websocket_paths` route is a 426."""
        app = FastAPI(
            title="Chorus",
            summary="Voice-first realtime rooms: device streams, phone legs, live feeds.",
            docs_url=None,
            redoc_url=None,
            responses={404: {"model": Problem, "description": "No such route or room"}},
        )

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            problem = _HTTP_PROBLEMS.get(exc.status_code, "http_error")
            return problem_response(exc.status_code, problem, str(exc.detail))

        @app.exception_handler(ProblemError)
        async def problem_error(request: Request, exc: ProblemError) -> Response:
            return problem_response(exc.status, exc.problem, exc.detail, exc.headers)

        @app.exception_handler(RequestValidationError)
        async def bad_request(request: Request, exc: RequestValidationError) -> Response:
            where = ".".join(error_location(list(exc.errors()))) or "request"
            return problem_response(422, "bad_request", f"bad request at {where}")

        @app.get("/", response_class=HTMLResponse, summary="The live transcript page")
        async def page() -> Response:
            return HTMLResponse(self._page, headers={"Cache-Control": "no-store"})

        @app.get("/index.html", include_in_schema=False)
        async def index() -> Response:
            return HTMLResponse(self._page, headers={"Cache-Control": "no-store"})

        @app.get(
            "/healthz",
            response_model=Health,
            responses={503: {"model": Health,
                             "description": "The server is draining, or over `max_load`"}},
            summary="Liveness, rooms, streams and load",
        )
        async def healthz(
            max_load: Annotated[float | None, Query(
                ge=0, le=1, description="answer 503 `overloaded` when the load is over this")
            ] = None,
        ) -> JSONResponse:
            load = self.metrics.load()
            stage = self.metrics.stage_load()
            status: Literal["ok", "closing", "overloaded"] = "ok"
            if self.closing():
                status = "closing"
            elif max_load is not None and load.load > max_load:
                status = "overloaded"
            health = Health(
                status=status,
                rooms=len(self.rooms.rooms),
                streams=sum(self.metrics.streams_active.values()),
                load=load.load,
                cpu=load.cpu,
                stage=None if stage is None else StageHealth(
                    lag_s=round(stage.lag_s, 3), on_stage=stage.on_stage,
                    stretched=stage.stretched, fallback=stage.fallback,
                    admitting=stage.admitting,
                ),
            )
            return JSONResponse(
                health.model_dump(),
                status_code=200 if status == "ok" else 503,
                headers={"Cache-Control": "no-store"},
            )

        @app.get(
            "/metrics",
            response_class=PlainTextResponse,
            summary="Prometheus metrics (text exposition format)",
        )
        async def metrics() -> Response:
            return Response(
                self.metrics.render(len(self.rooms.rooms)),
                media_type=METRICS_CONTENT_TYPE,
                headers={"Cache-Control": "no-store"},
            )

        @app.get(
            "/v1/rooms/{room}/transcript",
            response_model=list[TranscriptTurn],
            responses={
                **_AUTH_RESPONSES,
                200: {
                    "description": "The room's committed turns and typed lines, oldest first, "
                    "named as they read now (after renames); json: a list of turns; text, "
                    "markdown, srt, vtt, rttm: as `chorus transcribe` writes them",
                    "content": {t: {} for t in set(_TRANSCRIPT_TYPES.values())},
                },
            },
            summary="The room's transcript (needs the `feed` grant)",
        )
        async def transcript(
            room: RoomId,
            format: Annotated[TranscriptFormat, Query()] = "json",
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> Response:
            self._authorize(token, authorization, room, Grant.FEED)
            kit = self.rooms.kit
            if await kit.get_room(room) is None:
                raise ProblemError(404, "unknown_room", f"no room {room!r}")
            # the room a page at a time, labelled and formatted off the event loop (issue 25.9)
            label = await kit.labeller(room)
            transcript = TranscriptBuilder(label, self.rooms.renames.current_names(room))
            async for page in kit.store.pages(room):
                await asyncio.to_thread(transcript.take, page)
            if format == "json":
                body = await asyncio.to_thread(transcript.json)
            else:
                body = await asyncio.to_thread(
                    format_turns, transcript.turns, format, file_id=room
                )
            return Response(
                body,
                media_type=_TRANSCRIPT_TYPES[format],
                headers={"Cache-Control": "no-store"},
            )

        @app.get(
            "/v1/rooms/{room}/speakers/excerpt",
            response_class=Response,
            responses={
                **_AUTH_RESPONSES,
                200: {"description": "The last seconds of the speaker's voice (mono 16 kHz "
                      "16-bit WAV)", "content": {"audio/wav": {}}},
                404: {"model": Problem,
                      "description": "Nothing of that speaker is kept in the live room"},
            },
            summary="A few seconds of one speaker's voice, to tell who is who (the `feed` grant)",
        )
        async def speaker_excerpt(
            room: RoomId,
            label: Annotated[str | None, Query(
                max_length=64, description="the raw speaker label (a shared mic's voices)")
            ] = None,
            stream: Annotated[str | None, Query(
                max_length=128, description="the stream the speaker spoke on")
            ] = None,
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> Response:
            self._authorize(token, authorization, room, Grant.FEED)
            live = self.rooms.rooms.get(room)
            wav = None if live is None else live.excerpts.wav((stream, label))
            if wav is None:
                raise ProblemError(
                    404, "no_excerpt", "no audio of that speaker is kept in this room"
                )
            return Response(wav, media_type="audio/wav", headers={"Cache-Control": "no-store"})

        @app.delete(
            "/v1/rooms/{room}",
            response_model=RoomDeleted,
            responses={
                **_AUTH_RESPONSES,
                409: {"model": Problem, "description": "A stream or feed is still connected"},
            },
            summary="Delete a room and everything stored about it (needs the `admin` grant)",
        )
        async def delete_room(
            room: RoomId, token: TokenQuery = None, authorization: AuthorizationHeader = None
        ) -> RoomDeleted:
            self._authorize(token, authorization, room, Grant.ADMIN)
            deleted = await self.rooms.delete(room)
            if deleted is None:
                raise ProblemError(
                    409, "room_in_use", "the room has an open stream or feed; close them first"
                )
            if not deleted:
                raise ProblemError(404, "unknown_room", f"no room {room!r}")
            return RoomDeleted(room=room)

        @app.put(
            "/v1/audiosocket/{call_id}",
            response_model=AudioSocketRouted,
            responses={
                **_AUTH_RESPONSES,
                404: {"model": Problem, "description": "AudioSocket is not enabled"},
            },
            summary="Send the AudioSocket call with this UUID to a room (the room's `admin` grant)",
        )
        async def route_audiosocket_call(
            call_id: uuid.UUID,
            body: AudioSocketRoute,
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> AudioSocketRouted:
            self._authorize(token, authorization, body.room, Grant.ADMIN)
            if self.audiosocket_calls is None:
                raise ProblemError(404, "not_configured", "audiosocket is not enabled")
            self.audiosocket_calls.put(
                call_id,
                AudioSocketCall(
                    room=body.room,
                    participant=body.participant,
                    name=body.name,
                    shared_mic=body.shared_mic,
                ),
            )
            return AudioSocketRouted(uuid=str(call_id), **body.model_dump())

        app.add_api_route(  # the same, as a POST: what Asterisk's CURL() sends with a body
            "/v1/audiosocket/{call_id}",
            route_audiosocket_call,
            methods=["POST"],
            response_model=AudioSocketRouted,
            include_in_schema=False,
        )

        @app.post(
            "/v1/rooms/{room}/messages",
            response_model=ChatPosted,
            status_code=201,
            responses={
                **_AUTH_RESPONSES,
                409: {"model": Problem, "description": "A hook blocked the message"},
                413: {"model": Problem, "description": f"Body over {CHAT_MAX_BYTES} bytes"},
                429: {"model": Problem, "description": "Over the chat rate limit (`limits."
                      "chat_burst`, `limits.chat_rate`); `Retry-After` says when to retry"},
                503: {"model": Problem, "description": "The server is draining"},
            },
            openapi_extra={"requestBody": {
                "required": True,
                "content": {"application/json": {"schema": ChatPost.model_json_schema()}},
            }},
            summary="Type a message into the room (needs the `chat` grant)",
        )
        async def post_message(
            room: RoomId,
            request: Request,
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> ChatPosted:
            # the token first: nothing of the body is read for a request that may not post
            grant = self._authorize(token, authorization, room, Grant.CHAT)
            address = request.client.host if request.client is not None else "?"
            wait_s = self.rooms.chat_limit.take(room, client_key(grant, address))
            if wait_s > 0:
                raise ProblemError(
                    429,
                    "too_many_messages",
                    self.rooms.chat_limit.refusal(wait_s),
                    {"Retry-After": str(retry_after(wait_s))},
                )
            body = _chat_post(await _read_body(request, CHAT_MAX_BYTES, "message"))
            if grant.participant is not None and grant.participant != body.participant:
                raise ProblemError(
                    403,
                    f"token_{TokenProblem.WRONG_PARTICIPANT.value}",
                    "token is for another participant",
                )
            if self.closing():
                raise ProblemError(503, "shutting_down", "server is shutting down")
            event = await self.rooms.post_message(
                room, typist_id(grant, body.participant), body.name, body.text
            )
            if event is None:
                raise ProblemError(409, "blocked", "a hook blocked the message")
            return ChatPosted(room=room, event_id=event.id)

        @app.post(
            "/v1/webhooks/teams",
            response_model=WebhookAccepted,
            responses={
                400: {"model": Problem, "description": "Not a Bot Framework activity"},
                401: {"model": Problem, "description": "Bot Framework token missing or rejected"},
                404: {"model": Problem, "description": "Teams is not configured"},
                413: {"model": Problem, "description": "Body over 1 MiB"},
            },
            summary="Microsoft Teams activities (Bot Framework messaging endpoint)",
        )
        async def teams_webhook(request: Request) -> WebhookAccepted:
            if self.webhooks.teams is None:
                raise ProblemError(404, "not_configured", "teams is not enabled on this server")
            answer = await self.webhooks.teams.handle(
                dict(request.headers), await _webhook_body(request)
            )
            return _webhook_answer(answer)

        @app.post(
            "/v1/webhooks/whatsapp",
            response_model=WebhookAccepted,
            responses={
                400: {"model": Problem, "description": "Not a WhatsApp Cloud API webhook"},
                401: {"model": Problem, "description": "X-Hub-Signature-256 missing or wrong"},
                404: {"model": Problem, "description": "WhatsApp is not configured"},
                413: {"model": Problem, "description": "Body over 1 MiB"},
            },
            summary="WhatsApp Cloud API webhooks (signed with the app secret)",
        )
        async def whatsapp_webhook(request: Request) -> WebhookAccepted:
            if self.webhooks.whatsapp is None:
                raise ProblemError(404, "not_configured", "whatsapp is not enabled on this server")
            answer = await self.webhooks.whatsapp.handle(
                dict(request.headers), await _webhook_body(request)
            )
            return _webhook_answer(answer)

        @app.get(
            "/v1/webhooks/whatsapp",
            response_class=PlainTextResponse,
            summary="WhatsApp webhook subscription handshake (echoes hub.challenge)",
        )
        async def whatsapp_handshake(request: Request) -> Response:
            if self.webhooks.whatsapp is None:
                raise ProblemError(404, "not_configured", "whatsapp is not enabled on this server")
            status, text = self.webhooks.whatsapp.handshake(dict(request.query_params))
            if status != 200:
                raise ProblemError(status, "handshake_refused", text)
            return PlainTextResponse(text)

        voice_responses: dict[int | str, dict[str, Any]] = {
            401: _AUTH_RESPONSES[401],
            403: {"model": Problem, "description": "Not a server-wide admin token (`chorus "
                  "token '*' --grant admin`): a room's token is refused"},
            404: {"model": Problem, "description": "The voice directory is off (`[voices] "
                  "enabled`), or no such voice"},
        }

        @app.post(
            "/v1/rooms/{room}/speakers/remember",
            response_model=SpeakerRemembered,
            status_code=201,
            responses={
                **_AUTH_RESPONSES,
                404: {"model": Problem, "description": "The directory is off, the room is not "
                      "live, or no open stream has that label"},
                409: {"model": Problem, "description": "Two open streams have that label"},
                422: {"model": Problem, "description": "Too little of the speaker's speech "
                      "(`voices.min_speech_s`)"},
            },
            summary="Rename a speaker and remember their voice (the room's `admin` grant)",
        )
        async def remember_speaker(
            room: RoomId,
            body: RememberSpeaker,
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> SpeakerRemembered:
            self._authorize(token, authorization, room, Grant.ADMIN, server_wide=True)
            voices = self._directory()
            live = self.rooms.rooms.get(room)
            if live is None:
                raise ProblemError(404, "unknown_room", f"room {room!r} has no open stream")
            try:
                voice, stream = await voices.remember(live, body.label, body.name, body.stream)
            except VoicesError as exc:
                raise ProblemError(exc.status, exc.problem, exc.detail) from exc
            self.rooms.rename(room, body.label, voice.name, stream.id)
            self.rooms.reanchor()
            return SpeakerRemembered(room=room, label=body.label, name=voice.name,
                                     stream=stream.id, voice=voice_info(voice))

        @app.get(
            "/v1/voices",
            response_model=list[VoiceInfo],
            responses=voice_responses,
            summary="The remembered voices (a server-wide `admin` token); never a voiceprint",
        )
        async def list_voices(
            token: TokenQuery = None, authorization: AuthorizationHeader = None
        ) -> list[VoiceInfo]:
            self._authorize_server(token, authorization)
            return [voice_info(v) for v in await self._directory().voices()]

        @app.post(
            "/v1/voices",
            response_model=VoiceInfo,
            status_code=201,
            responses={
                **voice_responses,
                413: {"model": Problem, "description": f"Body over {VOICE_CLIP_MAX_BYTES} bytes"},
                422: {"model": Problem, "description": "Not audio, or too little speech"},
            },
            openapi_extra={"requestBody": {
                "required": True,
                "content": {"application/json": {"schema": VoiceClip.model_json_schema()}},
            }},
            summary="Remember a voice from a clip (a server-wide `admin` token)",
        )
        async def add_voice(
            request: Request, token: TokenQuery = None, authorization: AuthorizationHeader = None
        ) -> VoiceInfo:
            self._authorize_server(token, authorization)
            voices = self._directory()
            raw = await _read_body(request, VOICE_CLIP_MAX_BYTES, "voice clip")
            try:
                body = VoiceClip.model_validate_json(raw)
            except ValidationError as exc:
                errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
                raise RequestValidationError(errors) from exc
            try:
                data = base64.b64decode(body.audio, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ProblemError(422, "bad_audio", "audio is not base64") from exc
            try:
                audio = await asyncio.to_thread(read_audio_16k, data)
            except AudioError as exc:
                raise ProblemError(422, "bad_audio", str(exc)) from exc
            try:
                model, vector = await self.rooms.pipeline.clip_voiceprint(audio)
            except LookupError as exc:
                raise ProblemError(404, "not_configured", str(exc)) from exc
            except ValueError as exc:
                raise ProblemError(422, "not_enough_speech", str(exc)) from exc
            try:
                voice = await voices.add_print(body.name, model, vector, "clip")
            except VoicesError as exc:
                raise ProblemError(exc.status, exc.problem, exc.detail) from exc
            self.rooms.reanchor()
            return voice_info(voice)

        @app.delete(
            "/v1/voices/{voice_id}",
            response_model=VoiceForgotten,
            responses=voice_responses,
            summary="Forget a voice: every print, from the store and every open room at once",
        )
        async def forget_voice(
            voice_id: Annotated[str, PathParam(pattern=r"^[A-Za-z0-9_-]{1,64}$")],
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> VoiceForgotten:
            self._authorize_server(token, authorization)
            self._directory()
            if not await self.rooms.forget_voice(voice_id):
                raise ProblemError(404, "unknown_voice", f"no voice {voice_id!r}")
            return VoiceForgotten(id=voice_id)

        for path in websocket_paths:
            app.add_api_route(path, _websocket_only, methods=["GET"], include_in_schema=False)
        return app

    def _authorize(
        self, token: str | None, authorization: str | None, room: str, need: Grant,
        *, server_wide: bool = False,
    ) -> RoomGrant:
        """The token of an HTTP request (`?token=` or `Authorization: Bearer`), or a problem.
        `server_wide`: a server-wide token (`room` claim `*`) with the grant is taken too."""
        if not token and authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        try:
            return verify_token(self.secret, token, room, need=need)
        except TokenError as exc:
            if server_wide and exc.problem is TokenProblem.WRONG_ROOM:
                return self._authorize(token, None, SERVER_WIDE, need)
            status = _TOKEN_STATUS.get(exc.problem, 401)
            raise ProblemError(status, f"token_{exc.problem.value}", str(exc)) from exc

    def _authorize_server(self, token: str | None, authorization: str | None) -> RoomGrant:
        """A server-wide admin token (`chorus token '*' --grant admin`), the only kind the
        voice directory's routes take: a room's token, even with `admin`, is refused (403)."""
        try:
            return self._authorize(token, authorization, SERVER_WIDE, Grant.ADMIN)
        except ProblemError as exc:
            if exc.problem == f"token_{TokenProblem.WRONG_ROOM.value}":
                raise ProblemError(
                    403, exc.problem, "the voice directory needs a server-wide token "
                    "(`chorus token '*' --grant admin`), not a room's") from exc
            raise

    def _directory(self) -> VoiceDirectory:
        if self.rooms.voices is None:
            raise ProblemError(404, "not_configured", "the voice directory is off "
                               "(`[voices] enabled = true` turns it on)")
        return self.rooms.voices


class TranscriptBuilder:
    """The whole meeting, in commit order, named as the feed names it now: the committed voice
    turns (a voice renamed since reads its new name, as on the page) and the people's typed lines
    (the room's chat, Teams, WhatsApp; not the models' replies), a typed line at the end of the
    last spoken turn before it. Fed a page of events at a time (`take`, on a worker thread: it
    reads only what it was given, `renamed` included: a snapshot)."""

    def __init__(
        self,
        label: Callable[[RoomEvent], str],
        renamed: Callable[[Mapping[str, Any]], str | None] = lambda meta: None,
    ) -> None:
        self.label = label
        self.renamed = renamed
        self.turns: list[Turn] = []
        self.lines: list[TranscriptTurn] = []
        self._said_until = 0.0

    def json(self) -> str:
        """The `json` format: each line with its event id, label, stream and participant."""
        return TypeAdapter(list[TranscriptTurn]).dump_json(self.lines, indent=2).decode() + "\n"

    def take(self, events: list[RoomEvent]) -> None:
        for event in events:
            meta = event.metadata
            if event.kind != "message" or event.source.channel_type in _REPLIES:
                continue
            if meta.get("source") != "voice":
                at = self._said_until
                turn = Turn(
                    speaker=self.label(event), text=event.text, start=at, end=at, typed=True
                )
            else:
                turn = Turn(
                    speaker=self.renamed(meta) or str(meta.get("sender_name") or self.label(event)),
                    text=event.text,
                    start=float(meta.get("start", 0.0)),
                    end=float(meta.get("end", 0.0)),
                    label=meta.get("speaker_label"),
                )
                self._said_until = turn.end
            self.turns.append(turn)
            session = meta.get("voice_session_id")
            self.lines.append(
                TranscriptTurn(
                    **turn.as_json(),
                    event_id=event.id,
                    label=turn.label,
                    stream=str(session) if session is not None else None,
                    participant=event.source.participant_id,
                )
            )


async def _websocket_only() -> Response:
    return problem_response(426, "upgrade_required", "this route is a websocket")
