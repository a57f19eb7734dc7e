"""The network server behind `chorus serve`: one ASGI app (FastAPI on Starlette) on uvicorn.

Owns the sockets and the HTTP surface. One app, one event loop, served by uvicorn with its
`websockets` implementation:

- `/v1/rooms/{room}/stream?token=…`  a conference-room device (the device stream protocol)
- `/v1/twilio`                        a phone bridge leg (Twilio Media Streams framing)
- `/v1/rooms/{room}/events?token=…`  the live JSON feed of a room (renames and typed messages
                                      from the page)
- `POST /v1/rooms/{room}/messages`    chat typed into a live room (`chat` grant, server.chat)
- `POST /v1/webhooks/teams|whatsapp`  chat ingress from Teams and WhatsApp (server.ingress)
- `/`, `/healthz`, `/metrics`         declared HTTP routes (JSON bodies are pydantic models, so
                                      `/openapi.json` describes every HTTP route)

Every websocket refusal is a close code from `protocol.CloseCode` with the problem in the reason,
sent before any audio is read; it only ever ends the offending socket. HTTP errors are JSON
`{"problem": …, "detail": …}` with the same problem names. Oversized messages are cut off by the
websockets protocol under uvicorn (`ws_max_size`, close code 1009) from the frame header, before
the payload is buffered. A socket is read only as fast as its handler takes messages (uvicorn's
`ws_max_queue` then TCP), so a flooding client backs up on its own connection only.
Model work never runs here: the pipeline's voice channel does it off the loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import logging
import re
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from importlib import resources
from typing import Annotated, Any, Literal

import uvicorn
from fastapi import FastAPI, Header, Query, Request, WebSocket
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect, WebSocketState

from rooms import RoomKit
from server.auth import Grant, RoomGrant, TokenError, TokenProblem, verify_token
from server.chat import ChatPost, ChatPosted
from server.config import ServerConfig
from server.ingress.base import WebhookAnswer
from server.ingress.serve import build_webhooks
from server.live import LiveRooms, LiveStream, Outgoing, StreamLimitError, StreamTooFastError
from server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from server.metrics import ServerMetrics
from server.pipeline import Pipeline
from server.protocol import (
    CloseCode,
    ErrorMessage,
    MessageRequest,
    StartedMessage,
    StartMessage,
    StopMessage,
    TwilioConnected,
    TwilioDtmf,
    TwilioMark,
    TwilioMedia,
    TwilioStart,
    TwilioStop,
    dump,
    error_location,
    parse_device_message,
    parse_feed_request,
    parse_twilio_message,
)
from server.reply_audio import device_reply_frames, twilio_reply_messages
from voice.audio import AudioError
from voice.transcribe import Turn, format_turns

log = logging.getLogger("chorus.server")

ROOM_ID = r"[A-Za-z0-9_.:-]{1,64}"
ROOM_PATTERN = rf"^{ROOM_ID}$"
TWILIO_ROUTE = "/v1/twilio"
REFUSAL_WAIT_S = 3.0
"""How long a refused peer gets to take the error and the close frame before it is cut off."""
DRAIN_TIMEOUT_S = 30.0
"""How long shutdown waits for streams to flush their last turns before closing regardless."""

_TOKEN_CODES = {
    TokenProblem.MISSING: CloseCode.TOKEN_MISSING,
    TokenProblem.NOT_ASCII: CloseCode.TOKEN_MISSING,
    TokenProblem.MALFORMED: CloseCode.TOKEN_INVALID,
    TokenProblem.BAD_SIGNATURE: CloseCode.TOKEN_INVALID,
    TokenProblem.EXPIRED: CloseCode.TOKEN_EXPIRED,
    TokenProblem.WRONG_ROOM: CloseCode.TOKEN_WRONG_ROOM,
    TokenProblem.NOT_GRANTED: CloseCode.TOKEN_INVALID,
    TokenProblem.WRONG_PARTICIPANT: CloseCode.TOKEN_INVALID,
}


class _RedactTokens(logging.Filter):
    """uvicorn logs each websocket's request line, query included: keep tokens out of logs."""

    _TOKEN = re.compile(r"(token=)[^&\s\"]+")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            args = record.args if isinstance(record.args, tuple) else (record.args,)
            record.args = tuple(
                self._TOKEN.sub(r"\1…", a) if isinstance(a, str) else a for a in args
            )
        return True


_REDACT_TOKENS = _RedactTokens()
for _name in ("uvicorn.error", "uvicorn.access"):
    if _REDACT_TOKENS not in logging.getLogger(_name).filters:
        logging.getLogger(_name).addFilter(_REDACT_TOKENS)


class Refusal(Exception):
    """Ends one socket with a close code; nothing else is affected."""

    def __init__(self, code: CloseCode, reason: str, metric: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.metric = metric


class SocketClosed(Exception):
    """The peer went away without a clean close (or the socket broke under us)."""


class Socket:
    """One accepted websocket, as the route handlers use it: `recv`, `send`, `close`.

    A thin layer over Starlette's `WebSocket` that speaks in text/bytes messages and one
    exception for a peer that is gone, so the protocol code reads like the protocol."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.remote = ws.client.host if ws.client is not None else "?"
        self.closed_cleanly = False

    async def recv(self) -> str | bytes:
        """The next message; `SocketClosed` when the peer is gone (`closed_cleanly` tells how)."""
        if self.ws.client_state is WebSocketState.DISCONNECTED:
            raise SocketClosed("already closed")
        try:
            message = await self.ws.receive()
        except RuntimeError as exc:  # receive after the close frame
            raise SocketClosed(str(exc)) from exc
        if message["type"] == "websocket.disconnect":
            self.closed_cleanly = message.get("code", 1000) in (1000, 1001)
            raise SocketClosed(f"peer closed ({message.get('code')})")
        data = message.get("bytes")
        if data is not None:
            return bytes(data)
        return str(message.get("text") or "")

    async def messages(self) -> AsyncIterator[str | bytes]:
        """Messages until the peer closes cleanly; a broken connection raises `SocketClosed`."""
        while True:
            try:
                yield await self.recv()
            except SocketClosed:
                if self.closed_cleanly:
                    return
                raise

    async def send(self, message: str | bytes) -> None:
        try:
            if isinstance(message, bytes):
                await self.ws.send_bytes(message)
            else:
                await self.ws.send_text(message)
        except (WebSocketDisconnect, RuntimeError, OSError) as exc:
            raise SocketClosed(str(exc)) from exc

    async def close(self, code: int, reason: str = "", *, within_s: float = REFUSAL_WAIT_S) -> None:
        """Send the close frame; a peer that does not take it within `within_s` is cut off."""
        if self.ws.application_state is WebSocketState.DISCONNECTED:
            return
        try:
            async with asyncio.timeout(within_s):
                with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
                    await self.ws.close(code, reason)
        except TimeoutError:
            self.abort()

    def abort(self) -> None:
        """Drop the TCP connection now (a peer that stopped reading cannot take a close frame).

        ASGI has no message for this; uvicorn's protocol object (the owner of the server's own
        `send` callable, kept in the scope by `_KeepServerSend`) holds the transport."""
        owner = getattr(self.ws.scope.get(SERVER_SEND_KEY), "__self__", None)
        transport = getattr(owner, "transport", None)
        if isinstance(transport, asyncio.BaseTransport) and hasattr(transport, "abort"):
            transport.abort()


SERVER_SEND_KEY = "chorus.server_send"


class _KeepServerSend:
    """Outermost ASGI layer: keeps the server's own `send` in the scope (the framework wraps
    the one handlers see), so a socket whose peer stopped reading can be cut off (`abort`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope[SERVER_SEND_KEY] = send
        await self.app(scope, receive, send)


# ---------------------------------------------------------------------- HTTP models


class Problem(BaseModel):
    """Every HTTP error: a stable problem name (the same names the metrics and close reasons use)
    and a sentence for people."""

    problem: str
    detail: str


class Health(BaseModel):
    status: Literal["ok", "closing"]
    """`ok`, or `closing` while the server drains (then the status code is 503)."""
    rooms: int
    streams: int


class TranscriptTurn(BaseModel):
    """One committed speaker turn, as `chorus transcribe --format json` writes it."""

    speaker: str | None
    text: str
    start: float
    end: float


class WebhookAccepted(BaseModel):
    """A provider webhook taken: how many messages became room events."""

    accepted: int


WEBHOOK_MAX_BYTES = 1024 * 1024
"""Largest provider webhook body read; a bigger one is refused (413) before it is buffered."""


async def _webhook_body(request: Request) -> bytes:
    """The raw body (signatures cover the exact bytes), at most `WEBHOOK_MAX_BYTES`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > WEBHOOK_MAX_BYTES:
        raise ProblemError(413, "body_too_large", f"webhook bodies are at most {WEBHOOK_MAX_BYTES} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > WEBHOOK_MAX_BYTES:
            raise ProblemError(
                413, "body_too_large", f"webhook bodies are at most {WEBHOOK_MAX_BYTES} bytes"
            )
    return bytes(body)


def _webhook_answer(answer: WebhookAnswer) -> WebhookAccepted:
    if answer.status != 200:
        problem = "bad_signature" if answer.status == 401 else "bad_request"
        raise ProblemError(answer.status, problem, str(answer.body.get("error", "refused")))
    return WebhookAccepted(accepted=len(answer.events))


class RoomDeleted(BaseModel):
    room: str
    deleted: Literal[True] = True


TranscriptFormat = Literal["json", "text", "srt", "vtt", "rttm"]
_TRANSCRIPT_TYPES: dict[str, str] = {
    "json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
    "rttm": "text/plain; charset=utf-8",
}
_TOKEN_STATUS = {
    TokenProblem.WRONG_ROOM: 403,
    TokenProblem.NOT_GRANTED: 403,
    TokenProblem.WRONG_PARTICIPANT: 403,
}
"""HTTP status of a token problem (default 401: the bearer is not authenticated)."""


class ProblemError(Exception):
    """An HTTP request refused with a status and a problem name (answered as `Problem` JSON)."""

    def __init__(self, status: int, problem: str, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.problem = problem
        self.detail = detail


RoomId = Annotated[str, PathParam(pattern=ROOM_PATTERN, description="the room id")]
TokenQuery = Annotated[
    str | None, Query(description="room token (or send `Authorization: Bearer …`)")
]
AuthorizationHeader = Annotated[str | None, Header(include_in_schema=False)]
_AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "Token missing, malformed, badly signed or expired"},
    403: {"model": Problem, "description": "Token for another room, or without the grant"},
}


def _page() -> bytes:
    return resources.files("server").joinpath("page.html").read_bytes()


def _problem(status: int, problem: str, detail: str) -> JSONResponse:
    return JSONResponse(
        Problem(problem=problem, detail=detail).model_dump(),
        status_code=status,
        headers={"Cache-Control": "no-store"},
    )


_HTTP_PROBLEMS = {404: "not_found", 405: "method_not_allowed", 426: "upgrade_required"}


class ChorusServer:
    """`server = ChorusServer(config, pipeline, secret); await server.start(host, 0); …;
    await server.stop()` — `server.port` is the port it listens on, `server.app` the ASGI app."""

    def __init__(
        self, config: ServerConfig, pipeline: Pipeline, secret: str, kit: RoomKit | None = None
    ) -> None:
        self.config = config
        self.secret = secret
        self.metrics = ServerMetrics()
        self.rooms = LiveRooms(config, self.metrics, pipeline, kit)
        self._page = _page()
        self._closing = False
        self._draining = asyncio.Event()
        """Set on shutdown: streams stop reading, flush and close with 4503."""
        self._feeds_closing = asyncio.Event()
        """Set once the streams are flushed: feeds send what they hold and close with 4503."""
        self._uvicorn: uvicorn.Server | None = None
        self._sockets: set[Socket] = set()
        self._unauthenticated_total = 0
        self._unauthenticated_by_address: dict[str, int] = {}
        self._stream_handlers: set[asyncio.Task[Any]] = set()
        self._feed_handlers: set[asyncio.Task[Any]] = set()
        self.webhooks = build_webhooks(config, self.rooms.kit, self._open_conversation_room)
        """Teams and WhatsApp conversations (`[teams]`, `[whatsapp]`), when configured."""
        self.app = self._build_app()

    async def _open_conversation_room(self, room_id: str) -> None:
        """A chat conversation's room: a live room like any other (pipeline channels attached)."""
        (await self.rooms.room(room_id)).touch()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> None:
        config = uvicorn.Config(
            _KeepServerSend(self.app),
            host=host,
            port=port,
            ws="websockets",
            ws_max_size=self.config.limits.max_frame_bytes,
            ws_max_queue=32,
            ws_ping_interval=20,
            ws_ping_timeout=20,
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            headers=[("server", "chorus")],
            timeout_graceful_shutdown=10,
        )
        server = uvicorn.Server(config)
        with warnings.catch_warnings():
            # uvicorn 0.54 flags its legacy-websockets protocol as deprecated at import; it is
            # the implementation chosen on purpose (`ws="websockets"`, per-message backpressure)
            warnings.simplefilter("ignore")
            config.load()
        server.lifespan = config.lifespan_class(config)
        await server.startup()
        if not server.started:
            raise OSError(f"could not listen on {host}:{port}")
        self._uvicorn = server
        self.rooms.start()

    @property
    def port(self) -> int:
        assert self._uvicorn is not None
        sockets = self._uvicorn.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    @property
    def open_sockets(self) -> int:
        """Websockets accepted and not yet finished (every route)."""
        return len(self._sockets)

    async def stop(self) -> None:
        """Drain, then close: stop accepting, let every stream flush its STT and commit its last
        turns (sent to its device), tell devices and feeds `4503`, then close the rest."""
        if self._closing:
            return
        self._closing = True
        server = self._uvicorn
        if server is not None:
            for listener in server.servers:
                listener.close()
        self._draining.set()
        streams = [t for t in self._stream_handlers if not t.done()]
        if streams:
            await asyncio.wait(streams, timeout=DRAIN_TIMEOUT_S)
        self._feeds_closing.set()
        feeds = [t for t in self._feed_handlers if not t.done()]
        if feeds:
            await asyncio.wait(feeds, timeout=REFUSAL_WAIT_S * 2)
        if server is not None:
            server.force_exit = False
            await server.shutdown()
        await self.webhooks.close()
        await self.rooms.close()

    # ------------------------------------------------------------------ the app

    def _build_app(self) -> FastAPI:
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
            return _problem(exc.status_code, problem, str(exc.detail))

        @app.exception_handler(ProblemError)
        async def problem_error(request: Request, exc: ProblemError) -> Response:
            return _problem(exc.status, exc.problem, exc.detail)

        @app.exception_handler(RequestValidationError)
        async def bad_request(request: Request, exc: RequestValidationError) -> Response:
            where = ".".join(error_location(list(exc.errors()))) or "request"
            return _problem(422, "bad_request", f"bad request at {where}")

        @app.get("/", response_class=HTMLResponse, summary="The live transcript page")
        async def page() -> Response:
            return HTMLResponse(self._page, headers={"Cache-Control": "no-store"})

        @app.get("/index.html", include_in_schema=False)
        async def index() -> Response:
            return HTMLResponse(self._page, headers={"Cache-Control": "no-store"})

        @app.get(
            "/healthz",
            response_model=Health,
            responses={503: {"model": Health, "description": "The server is draining"}},
            summary="Liveness, rooms and streams",
        )
        async def healthz() -> JSONResponse:
            health = Health(
                status="closing" if self._closing else "ok",
                rooms=len(self.rooms.rooms),
                streams=sum(self.metrics.streams_active.values()),
            )
            return JSONResponse(
                health.model_dump(),
                status_code=503 if self._closing else 200,
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
                    "description": "The room's committed turns, oldest first (json: a list of "
                    "turns; text, srt, vtt, rttm: as `chorus transcribe` writes them)",
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
            self._authorize_http(token, authorization, room, Grant.FEED)
            turns = await self._transcript(room)
            return Response(
                format_turns(turns, format, file_id=room),
                media_type=_TRANSCRIPT_TYPES[format],
                headers={"Cache-Control": "no-store"},
            )

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
            self._authorize_http(token, authorization, room, Grant.ADMIN)
            deleted = await self.rooms.delete(room)
            if deleted is None:
                raise ProblemError(
                    409, "room_in_use", "the room has an open stream or feed; close them first"
                )
            if not deleted:
                raise ProblemError(404, "unknown_room", f"no room {room!r}")
            return RoomDeleted(room=room)

        @app.post(
            "/v1/rooms/{room}/messages",
            response_model=ChatPosted,
            status_code=201,
            responses={
                **_AUTH_RESPONSES,
                409: {"model": Problem, "description": "A hook blocked the message"},
                503: {"model": Problem, "description": "The server is draining"},
            },
            summary="Type a message into the room (needs the `chat` grant)",
        )
        async def post_message(
            room: RoomId,
            body: ChatPost,
            token: TokenQuery = None,
            authorization: AuthorizationHeader = None,
        ) -> ChatPosted:
            grant = self._authorize_http(token, authorization, room, Grant.CHAT)
            if grant.participant is not None and grant.participant != body.participant:
                raise ProblemError(
                    403,
                    f"token_{TokenProblem.WRONG_PARTICIPANT.value}",
                    "token is for another participant",
                )
            if self._closing:
                raise ProblemError(503, "shutting_down", "server is shutting down")
            event = await self.rooms.post_message(room, body.participant, body.name, body.text)
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

        for path in (
            "/v1/rooms/{room}/stream",
            "/v1/rooms/{room}/events",
            TWILIO_ROUTE,
        ):
            app.add_api_route(path, self._websocket_only, methods=["GET"], include_in_schema=False)

        app.add_api_websocket_route("/v1/rooms/{room}/stream", self._stream_route)
        app.add_api_websocket_route("/v1/rooms/{room}/events", self._events_route)
        app.add_api_websocket_route(TWILIO_ROUTE, self._twilio_route)
        app.add_api_websocket_route("/{anything:path}", self._unknown_websocket)
        return app

    @staticmethod
    async def _websocket_only() -> Response:
        return _problem(426, "upgrade_required", "this route is a websocket")

    @staticmethod
    async def _unknown_websocket(websocket: WebSocket) -> None:
        await websocket.send_denial_response(
            _problem(404, "unknown_route", "no such websocket route")
        )

    async def _stream_route(self, websocket: WebSocket, room: str) -> None:
        await self._serve_socket(websocket, room, self._device_stream)

    async def _events_route(self, websocket: WebSocket, room: str) -> None:
        await self._serve_socket(websocket, room, self._event_feed)

    async def _twilio_route(self, websocket: WebSocket) -> None:
        await self._serve_socket(websocket, None, self._twilio_leg)

    # ------------------------------------------------------------------ websocket plumbing

    async def _serve_socket(
        self,
        websocket: WebSocket,
        room: str | None,
        handler: Callable[..., Awaitable[None]],
    ) -> None:
        if room is not None and not re.fullmatch(ROOM_ID, room):
            await websocket.send_denial_response(
                _problem(404, "unknown_route", "no such websocket route (bad room id)")
            )
            return
        await websocket.accept()
        ws = Socket(websocket)
        task = asyncio.current_task()
        assert task is not None
        handlers = self._feed_handlers if handler == self._event_feed else self._stream_handlers
        self._sockets.add(ws)
        handlers.add(task)
        try:
            if room is None:
                await handler(ws)
            else:
                await handler(ws, room, self._token(websocket))
        except Refusal as refusal:
            await self._refuse(ws, refusal)
        except SocketClosed:
            pass
        except Exception:
            log.exception("socket %s failed", websocket.url.path)
            await ws.close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self._sockets.discard(ws)
            handlers.discard(task)

    async def _refuse(self, ws: Socket, refusal: Refusal) -> None:
        """Say why, close with the code; a peer that does not read is cut off (bounded)."""
        self.metrics.refused_total[refusal.metric] += 1
        log.info("refused %s: %s (%d)", ws.remote, refusal.reason, refusal.code)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REFUSAL_WAIT_S
        try:
            async with asyncio.timeout_at(deadline):
                await ws.send(dump(ErrorMessage(code=int(refusal.code), reason=refusal.reason)))
        except (TimeoutError, SocketClosed):
            ws.abort()
            return
        await ws.close(
            refusal.code, refusal.reason[:120], within_s=max(0.1, deadline - loop.time())
        )

    @staticmethod
    def _token(websocket: WebSocket) -> str | None:
        token = websocket.query_params.get("token")
        if token:
            return token
        auth = websocket.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return None

    def _authorize(self, token: str | None, room: str, need: Grant) -> RoomGrant:
        try:
            return verify_token(self.secret, token, room, need=need)
        except TokenError as exc:
            raise Refusal(
                _TOKEN_CODES[exc.problem], str(exc), f"token_{exc.problem.value}"
            ) from exc

    def _authorize_http(
        self, token: str | None, authorization: str | None, room: str, need: Grant
    ) -> RoomGrant:
        """The token of an HTTP request (`?token=` or `Authorization: Bearer`), or a problem."""
        if not token and authorization and authorization.lower().startswith("bearer "):
            token = authorization[7:].strip()
        try:
            return verify_token(self.secret, token, room, need=need)
        except TokenError as exc:
            status = _TOKEN_STATUS.get(exc.problem, 401)
            raise ProblemError(status, f"token_{exc.problem.value}", str(exc)) from exc

    async def _transcript(self, room: str) -> list[Turn]:
        """The room's committed voice turns, oldest first, named as the feed named them."""
        kit = self.rooms.kit
        if await kit.get_room(room) is None:
            raise ProblemError(404, "unknown_room", f"no room {room!r}")
        turns: list[Turn] = []
        for event in await kit.list_events(room):
            meta = event.metadata
            if event.kind != "message" or meta.get("source") != "voice":
                continue
            speaker = meta.get("sender_name") or await kit.label_for(room, event)
            turns.append(
                Turn(
                    speaker=str(speaker),
                    text=event.text,
                    start=float(meta.get("start", 0.0)),
                    end=float(meta.get("end", 0.0)),
                    label=meta.get("speaker_label"),
                )
            )
        return turns

    @staticmethod
    def _check_participant(grant: RoomGrant, participant: str) -> None:
        """A token naming a participant (`sub`) opens streams for that participant only."""
        if grant.participant is not None and grant.participant != participant:
            raise Refusal(
                CloseCode.TOKEN_INVALID,
                "token is for another participant",
                f"token_{TokenProblem.WRONG_PARTICIPANT.value}",
            )

    def _check_capacity(self) -> None:
        if self._closing:
            raise Refusal(CloseCode.SHUTTING_DOWN, "server is shutting down", "shutting_down")
        if not self.rooms.has_capacity():
            raise Refusal(
                CloseCode.TOO_MANY_STREAMS,
                "server has no room for another stream",
                "too_many_streams",
            )

    async def _first_message(self, ws: Socket, deadline: float | None = None) -> str | bytes:
        """The next message before `deadline` (loop time; default: `start_timeout_s` from now).
        A drain does not wait for a client that has not started: it is told 4503 at once."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.limits.start_timeout_s
        receiving = asyncio.ensure_future(ws.recv())
        draining = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait(
                {receiving, draining},
                timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for task in (receiving, draining):
                if not task.done():
                    task.cancel()
            await asyncio.gather(receiving, draining, return_exceptions=True)
        if receiving.done() and not receiving.cancelled():
            return receiving.result()  # a message (or SocketClosed) wins over a drain
        if draining.done() and not draining.cancelled():
            raise Refusal(CloseCode.SHUTTING_DOWN, "server is shutting down", "shutting_down")
        raise Refusal(CloseCode.START_TIMEOUT, "no start message in time", "start_timeout")

    # ------------------------------------------------------------------ device stream

    async def _device_stream(self, ws: Socket, room: str, token: str | None) -> None:
        grant = self._authorize(token, room, Grant.STREAM)
        self._check_capacity()
        first = await self._first_message(ws)
        if isinstance(first, bytes):
            raise Refusal(CloseCode.AUDIO_BEFORE_START, "audio before start", "audio_before_start")
        start = self._parse_device(first)
        if isinstance(start, StopMessage):
            await ws.close(CloseCode.NORMAL, "stopped before start")
            return
        self._check_participant(grant, start.participant)
        stream = await self._open(
            ws,
            room,
            kind="device",
            participant=start.participant,
            name=start.name,
            shared_mic=start.shared_mic,
            sample_rate=start.sample_rate,
            encoding=start.encoding,
            channels=start.channels,
        )
        await self._pump(ws, stream, self._device_frames(ws, stream))

    def _parse_device(self, text: str) -> StartMessage | StopMessage:
        try:
            return parse_device_message(text)
        except ValidationError as exc:
            errors = exc.errors()
            loc = error_location(list(errors))
            if loc[-1:] == ("encoding",):
                raise Refusal(
                    CloseCode.UNSUPPORTED_ENCODING,
                    "unsupported encoding (use pcm16 or mulaw)",
                    "unsupported_encoding",
                ) from exc
            raise _bad_message(exc) from exc

    async def _device_frames(self, ws: Socket, stream: LiveStream) -> None:
        """Read binary audio until `stop`; realign frames that split a sample."""
        width = (2 if stream.info.encoding == "pcm16" else 1) * stream.info.channels
        carry = b""
        async for message in ws.messages():
            if isinstance(message, bytes):
                data = carry + message
                cut = len(data) - len(data) % width
                carry = data[cut:]
                if cut:
                    await self.rooms.push_audio(stream, data[:cut])
                continue
            parsed = self._parse_device(message)
            if isinstance(parsed, StopMessage):
                return
            raise Refusal(CloseCode.BAD_MESSAGE, "stream already started", "bad_message")

    # ------------------------------------------------------------------ Twilio leg

    async def _twilio_leg(self, ws: Socket) -> None:
        """`connected`, then `start` carrying room/token/name, then `media` until `stop`."""
        self._check_capacity()
        with self._unauthenticated(ws):
            start = await self._twilio_start(ws)
        if start is None:
            return
        params = start.start.customParameters
        room = params.get("room", "")
        if not re.fullmatch(ROOM_ID, room):
            raise Refusal(
                CloseCode.BAD_MESSAGE, "customParameters.room missing or invalid", "bad_message"
            )
        grant = self._authorize(params.get("token"), room, Grant.STREAM)
        fmt = start.start.mediaFormat
        if fmt.encoding.lower() != "audio/x-mulaw" or fmt.channels != 1:
            raise Refusal(
                CloseCode.UNSUPPORTED_ENCODING,
                f"unsupported media format {fmt.encoding}/{fmt.channels}ch (need audio/x-mulaw mono)",
                "unsupported_encoding",
            )
        participant = params.get("participant") or f"call-{start.start.callSid}"
        if not re.fullmatch(r"[A-Za-z0-9_.:@+-]{1,64}", participant):
            raise Refusal(
                CloseCode.BAD_MESSAGE, "customParameters.participant invalid", "bad_message"
            )
        self._check_participant(grant, participant)
        name = params.get("name") or None
        shared_mic = params.get("shared_mic", "false").strip().lower() in ("1", "true", "yes")
        stream_sid = start.streamSid or start.start.streamSid
        stream = await self._open(
            ws,
            room,
            kind="twilio",
            participant=participant,
            name=name[:80] if name else None,
            shared_mic=shared_mic,
            sample_rate=fmt.sampleRate,
            encoding="mulaw",
            channels=1,
            stream_sid=stream_sid,
        )
        await self._pump(ws, stream, self._twilio_media(ws, stream))

    @contextlib.contextmanager
    def _unauthenticated(self, ws: Socket) -> Iterator[None]:
        """Count a socket that has not shown a token yet, server-wide and per client address;
        over `limits.max_unauthenticated(_per_address)` it is refused at once."""
        limits = self.config.limits
        here = self._unauthenticated_by_address.get(ws.remote, 0)
        if self._unauthenticated_total >= limits.max_unauthenticated:
            raise Refusal(
                CloseCode.TOO_MANY_STREAMS,
                "too many connections waiting to authenticate",
                "too_many_unauthenticated",
            )
        if here >= limits.max_unauthenticated_per_address:
            raise Refusal(
                CloseCode.TOO_MANY_STREAMS,
                "too many connections waiting to authenticate from this address",
                "too_many_unauthenticated",
            )
        self._unauthenticated_total += 1
        self._unauthenticated_by_address[ws.remote] = here + 1
        try:
            yield
        finally:
            self._unauthenticated_total -= 1
            left = self._unauthenticated_by_address[ws.remote] - 1
            if left:
                self._unauthenticated_by_address[ws.remote] = left
            else:
                del self._unauthenticated_by_address[ws.remote]

    async def _twilio_start(self, ws: Socket) -> TwilioStart | None:
        """Messages up to `start`, all within one deadline from the connection's opening (a
        `connected`, `mark` or `dtmf` never extends it); None when the leg stopped first."""
        start: TwilioStart | None = None
        deadline = asyncio.get_running_loop().time() + self.config.limits.start_timeout_s
        while start is None:
            message = self._parse_twilio(await self._first_message(ws, deadline))
            if isinstance(message, TwilioConnected | TwilioMark | TwilioDtmf):
                continue
            if isinstance(message, TwilioMedia):
                raise Refusal(
                    CloseCode.AUDIO_BEFORE_START, "media before start", "audio_before_start"
                )
            if isinstance(message, TwilioStop):
                await ws.close(CloseCode.NORMAL, "stopped before start")
                return None
            start = message
        return start

    def _parse_twilio(self, text: str | bytes) -> Any:
        if isinstance(text, bytes):
            raise Refusal(CloseCode.BAD_MESSAGE, "twilio frames are JSON text", "bad_message")
        try:
            return parse_twilio_message(text)
        except ValidationError as exc:
            raise _bad_message(exc) from exc

    async def _twilio_media(self, ws: Socket, stream: LiveStream) -> None:
        async for text in ws.messages():
            message = self._parse_twilio(text)
            if isinstance(message, TwilioMedia):
                if message.media.track not in ("inbound", "inbound_track"):
                    continue
                try:
                    audio = base64.b64decode(message.media.payload, validate=True)
                except (binascii.Error, ValueError) as exc:
                    raise Refusal(
                        CloseCode.BAD_MESSAGE, "media payload is not base64", "bad_message"
                    ) from exc
                if audio:
                    await self.rooms.push_audio(stream, audio)
            elif isinstance(message, TwilioStop):
                return
            elif isinstance(message, TwilioStart):
                raise Refusal(CloseCode.BAD_MESSAGE, "stream already started", "bad_message")
            # connected / mark / dtmf: nothing to do

    # ------------------------------------------------------------------ shared stream plumbing

    async def _open(
        self,
        ws: Socket,
        room: str,
        *,
        kind: str,
        participant: str,
        name: str | None,
        shared_mic: bool,
        sample_rate: int,
        encoding: str,
        channels: int,
        stream_sid: str | None = None,
    ) -> LiveStream:
        def reply_audio(pcm16: bytes, rate: int) -> list[Outgoing]:
            if stream_sid is not None:
                return list(twilio_reply_messages(stream_sid, pcm16, rate))
            return list(device_reply_frames(pcm16, rate, sample_rate, encoding))

        try:
            stream = await self.rooms.open_stream(
                room,
                kind="twilio" if kind == "twilio" else "device",
                participant=participant,
                name=name,
                shared_mic=shared_mic,
                sample_rate=sample_rate,
                encoding=encoding,
                channels=channels,
                reply_audio=reply_audio,
            )
        except StreamLimitError as exc:
            raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "too_many_streams") from exc
        except AudioError as exc:  # a declared format the voice channel cannot take (V10)
            raise Refusal(CloseCode.BAD_MESSAGE, str(exc)[:120], "bad_format") from exc
        except Exception as exc:  # the STT or model behind the stream is unavailable
            log.exception("could not open a %s stream in room %s", kind, room)
            raise Refusal(
                CloseCode.INTERNAL_ERROR, f"stream could not start: {exc}"[:120], "pipeline_error"
            ) from exc
        if stream_sid is None:
            stream.send(dump(StartedMessage(room=room, stream=stream.id, participant=participant)))
        log.info("%s stream %s opened in room %s for %s", kind, stream.id, room, participant)
        return stream

    async def _pump(self, ws: Socket, stream: LiveStream, reader: Awaitable[None]) -> None:
        """Run the reader and the writer of one stream; always flush and close the stream.

        A drain (shutdown) stops the reader where it is; the stream is then flushed like a
        `stop`, its last turns are sent, and the device hears `4503` instead of `1000`."""
        writer = asyncio.create_task(self._write(ws, stream))
        reading = asyncio.ensure_future(reader)
        draining = asyncio.create_task(self._draining.wait())
        closed_cleanly = False
        drained = False
        too_fast: StreamTooFastError | None = None
        try:
            await asyncio.wait({reading, draining}, return_when=asyncio.FIRST_COMPLETED)
            if reading.done():
                try:
                    reading.result()  # a refusal or a broken socket propagates
                except StreamTooFastError as exc:
                    too_fast = exc  # refused, but only after its last turns went out
                closed_cleanly = True
            else:
                drained = closed_cleanly = True
        finally:
            for task in (reading, draining):
                task.cancel()
            await asyncio.gather(reading, draining, return_exceptions=True)
            await self.rooms.close_stream(stream)  # flushes the last turns into the outbox
            if closed_cleanly:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._drained(stream), 5)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
        if too_fast is not None:
            raise Refusal(CloseCode.TOO_MANY_STREAMS, str(too_fast), "stream_too_fast")
        if drained:
            await ws.close(CloseCode.SHUTTING_DOWN, "server is shutting down")
        else:
            await ws.close(CloseCode.NORMAL, "stream stopped")

    @staticmethod
    async def _drained(stream: LiveStream) -> None:
        await stream.outbox.join()

    @staticmethod
    async def _write(ws: Socket, stream: LiveStream) -> None:
        while True:
            message = await stream.outbox.get()
            try:
                await ws.send(message)
            except SocketClosed:
                return
            finally:
                stream.outbox.task_done()

    # ------------------------------------------------------------------ event feed

    async def _event_feed(self, ws: Socket, room: str, token: str | None) -> None:
        grant = self._authorize(token, room, Grant.FEED)
        if self._closing:
            raise Refusal(CloseCode.SHUTTING_DOWN, "server is shutting down", "shutting_down")
        live = await self.rooms.room(room)
        try:
            consumer = self.rooms.subscribe(live)
        except StreamLimitError as exc:
            raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "too_many_feeds") from exc

        async def send_all() -> None:
            while True:
                text = await consumer.queue.get()
                await ws.send(text)

        async def read_requests() -> None:
            async for message in ws.messages():
                try:
                    request = parse_feed_request(message)
                except ValidationError as exc:
                    raise Refusal(CloseCode.BAD_MESSAGE, "bad feed request", "bad_message") from exc
                if isinstance(request, MessageRequest):
                    if not grant.allows(Grant.CHAT):
                        raise Refusal(
                            CloseCode.TOKEN_INVALID,
                            "token has no chat grant",
                            f"token_{TokenProblem.NOT_GRANTED.value}",
                        )
                    self._check_participant(grant, request.participant)
                    await self.rooms.post_message(
                        room, request.participant, request.name, request.text
                    )
                else:
                    self.rooms.rename(room, request.label, request.name, request.stream)

        async def drained() -> None:
            await self._feeds_closing.wait()  # after the streams flushed their last turns
            while not consumer.queue.empty():
                await ws.send(consumer.queue.get_nowait())

        tasks = [
            asyncio.create_task(send_all()),
            asyncio.create_task(read_requests()),
            asyncio.create_task(consumer.dropped_event.wait()),
            asyncio.create_task(drained()),
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            self.rooms.unsubscribe(live, consumer)
        if consumer.dropped:
            raise Refusal(
                CloseCode.FEED_TOO_SLOW, "event feed consumer fell behind", "feed_too_slow"
            )
        for task in done:
            failure = task.exception()
            if failure is not None:
                raise failure
        if tasks[3] in done:
            await ws.close(CloseCode.SHUTTING_DOWN, "server is shutting down")


def _bad_message(exc: ValidationError) -> Refusal:
    """The refusal for a protocol message that does not parse: not JSON, or a field that is wrong."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        return Refusal(CloseCode.BAD_MESSAGE, "message is not JSON", "bad_json")
    where = ".".join(error_location(list(errors))) or "message"
    return Refusal(
        CloseCode.BAD_MESSAGE, f"bad message at {where}: {errors[0]['msg']}"[:120], "bad_message"
    )
