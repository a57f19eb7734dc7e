"""The network server behind `chorus serve`: routes, auth, protocol handling and limits.

Owns the sockets. One `websockets` asyncio server on one event loop serves every route:

- `/v1/rooms/{room}/stream?token=…`  a conference-room device (the device stream protocol)
- `/v1/twilio`                        a phone bridge leg (Twilio Media Streams framing)
- `/v1/rooms/{room}/events?token=…`  the live JSON feed of a room (and renames from the page)
- `/`, `/healthz`, `/metrics`         plain HTTP through `process_request`

Every refusal is a close code from `protocol.CloseCode` with the problem in the reason, sent
before any audio is read; it only ever ends the offending socket. Oversized messages are cut off
by the websockets library itself (`max_size`, close code 1009) before they are buffered.
Model work never runs here: the pipeline's voice channel does it off the loop.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import http
import json
import logging
import re
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, urlsplit

from pydantic import ValidationError
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from rooms import RoomKit
from server.auth import TokenError, TokenProblem, verify_token
from server.config import ServerConfig
from server.live import LiveRooms, LiveStream, Outgoing, StreamLimitError
from server.metrics import ServerMetrics
from server.pipeline import Pipeline
from server.protocol import (
    CloseCode,
    ErrorMessage,
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

log = logging.getLogger("chorus.server")

ROOM_ID = r"[A-Za-z0-9_.:-]{1,64}"
STREAM_ROUTE = re.compile(rf"^/v1/rooms/(?P<room>{ROOM_ID})/stream$")
EVENTS_ROUTE = re.compile(rf"^/v1/rooms/(?P<room>{ROOM_ID})/events$")
TWILIO_ROUTE = "/v1/twilio"
REFUSAL_WAIT_S = 3.0
"""How long a refused peer gets to take the error and the close frame before it is cut off."""

_TOKEN_CODES = {
    TokenProblem.MISSING: CloseCode.TOKEN_MISSING,
    TokenProblem.MALFORMED: CloseCode.TOKEN_INVALID,
    TokenProblem.BAD_SIGNATURE: CloseCode.TOKEN_INVALID,
    TokenProblem.EXPIRED: CloseCode.TOKEN_EXPIRED,
    TokenProblem.WRONG_ROOM: CloseCode.TOKEN_WRONG_ROOM,
}


class Refusal(Exception):
    """Ends one socket with a close code; nothing else is affected."""

    def __init__(self, code: CloseCode, reason: str, metric: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason
        self.metric = metric


def _page() -> bytes:
    return resources.files("server").joinpath("page.html").read_bytes()


class ChorusServer:
    """`async with ChorusServer(config, pipeline).run(host, port) as server: ...`"""

    def __init__(
        self, config: ServerConfig, pipeline: Pipeline, secret: str, kit: RoomKit | None = None
    ) -> None:
        self.config = config
        self.secret = secret
        self.metrics = ServerMetrics()
        self.rooms = LiveRooms(config, self.metrics, pipeline, kit)
        self._server: Server | None = None
        self._page = _page()
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> Server:
        self._server = await serve(
            self._handle,
            host,
            port,
            process_request=self._process_request,
            max_size=self.config.limits.max_frame_bytes,
            max_queue=32,
            ping_interval=20,
            ping_timeout=20,
            close_timeout=5,
            server_header="chorus",
        )
        self.rooms.start()
        return self._server

    @property
    def port(self) -> int:
        assert self._server is not None
        sockets = list(self._server.sockets)
        return int(sockets[0].getsockname()[1])

    async def stop(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close(close_connections=True)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 15)
        await self.rooms.close()

    # ------------------------------------------------------------------ HTTP

    def _process_request(self, connection: ServerConnection, request: Request) -> Response | None:
        path = urlsplit(request.path).path
        upgrade = request.headers.get("Upgrade", "").lower() == "websocket"
        if STREAM_ROUTE.match(path) or EVENTS_ROUTE.match(path) or path == TWILIO_ROUTE:
            if upgrade:
                return None
            return self._respond(http.HTTPStatus.UPGRADE_REQUIRED, b"websocket route\n")
        if upgrade:
            return self._respond(http.HTTPStatus.NOT_FOUND, b"no such websocket route\n")
        if path in ("/", "/index.html"):
            return self._respond(http.HTTPStatus.OK, self._page, "text/html; charset=utf-8")
        if path == "/healthz":
            body = json.dumps(
                {
                    "status": "closing" if self._closing else "ok",
                    "rooms": len(self.rooms.rooms),
                    "streams": sum(self.metrics.streams_active.values()),
                }
            ).encode()
            status = http.HTTPStatus.SERVICE_UNAVAILABLE if self._closing else http.HTTPStatus.OK
            return self._respond(status, body, "application/json")
        if path == "/metrics":
            return self._respond(
                http.HTTPStatus.OK,
                self.metrics.render(len(self.rooms.rooms)).encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        return self._respond(http.HTTPStatus.NOT_FOUND, b"not found\n")

    @staticmethod
    def _respond(
        status: http.HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8"
    ) -> Response:
        headers = Headers()
        headers["Content-Type"] = content_type
        headers["Content-Length"] = str(len(body))
        headers["Cache-Control"] = "no-store"
        headers["Connection"] = "close"
        return Response(status.value, status.phrase, headers, body)

    # ------------------------------------------------------------------ websocket routes

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        url = urlsplit(ws.request.path)
        query = parse_qs(url.query)
        try:
            if (m := STREAM_ROUTE.match(url.path)) is not None:
                await self._device_stream(ws, m["room"], self._token(ws, query))
            elif (m := EVENTS_ROUTE.match(url.path)) is not None:
                await self._event_feed(ws, m["room"], self._token(ws, query))
            elif url.path == TWILIO_ROUTE:
                await self._twilio_leg(ws)
            else:  # process_request lets only known routes through
                raise Refusal(CloseCode.UNKNOWN_ROUTE, "no such route", "unknown_route")
        except Refusal as refusal:
            await self._refuse(ws, refusal)
        except ConnectionClosed:
            pass
        except Exception:
            log.exception("socket %s failed", url.path)
            with contextlib.suppress(Exception):
                await ws.close(CloseCode.INTERNAL_ERROR, "internal error")

    async def _refuse(self, ws: ServerConnection, refusal: Refusal) -> None:
        """Say why, close with the code; a peer that does not read is cut off (bounded)."""
        self.metrics.refused_total[refusal.metric] += 1
        log.info("refused %s: %s (%d)", ws.remote_address, refusal.reason, refusal.code)
        try:
            async with asyncio.timeout(REFUSAL_WAIT_S):
                with contextlib.suppress(ConnectionClosed):
                    await ws.send(dump(ErrorMessage(code=int(refusal.code), reason=refusal.reason)))
                await ws.close(refusal.code, refusal.reason[:120])
        except TimeoutError:
            ws.transport.abort()
        except Exception:
            ws.transport.abort()

    @staticmethod
    def _token(ws: ServerConnection, query: dict[str, list[str]]) -> str | None:
        if query.get("token"):
            return query["token"][0]
        assert ws.request is not None
        auth = ws.request.headers.get("Authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return None

    def _authorize(self, token: str | None, room: str) -> None:
        try:
            verify_token(self.secret, token, room)
        except TokenError as exc:
            raise Refusal(
                _TOKEN_CODES[exc.problem], str(exc), f"token_{exc.problem.value}"
            ) from exc

    def _check_capacity(self) -> None:
        if self._closing:
            raise Refusal(CloseCode.SHUTTING_DOWN, "server is shutting down", "shutting_down")
        if not self.rooms.has_capacity():
            raise Refusal(
                CloseCode.TOO_MANY_STREAMS,
                "server has no room for another stream",
                "too_many_streams",
            )

    async def _first_message(self, ws: ServerConnection) -> str | bytes:
        try:
            return await asyncio.wait_for(ws.recv(), self.config.limits.start_timeout_s)
        except TimeoutError as exc:
            raise Refusal(
                CloseCode.START_TIMEOUT, "no start message in time", "start_timeout"
            ) from exc

    # ------------------------------------------------------------------ device stream

    async def _device_stream(self, ws: ServerConnection, room: str, token: str | None) -> None:
        self._authorize(token, room)
        self._check_capacity()
        first = await self._first_message(ws)
        if isinstance(first, bytes):
            raise Refusal(CloseCode.AUDIO_BEFORE_START, "audio before start", "audio_before_start")
        start = self._parse_device(first)
        if isinstance(start, StopMessage):
            await ws.close(CloseCode.NORMAL, "stopped before start")
            return
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

    async def _device_frames(self, ws: ServerConnection, stream: LiveStream) -> None:
        """Read binary audio until `stop`; realign frames that split a sample."""
        width = (2 if stream.info.encoding == "pcm16" else 1) * stream.info.channels
        carry = b""
        async for message in ws:
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

    async def _twilio_leg(self, ws: ServerConnection) -> None:
        """`connected`, then `start` carrying room/token/name, then `media` until `stop`."""
        self._check_capacity()
        start: TwilioStart | None = None
        while start is None:
            message = self._parse_twilio(await self._first_message(ws))
            if isinstance(message, TwilioConnected | TwilioMark | TwilioDtmf):
                continue
            if isinstance(message, TwilioMedia):
                raise Refusal(
                    CloseCode.AUDIO_BEFORE_START, "media before start", "audio_before_start"
                )
            if isinstance(message, TwilioStop):
                await ws.close(CloseCode.NORMAL, "stopped before start")
                return
            start = message
        params = start.start.customParameters
        room = params.get("room", "")
        if not re.fullmatch(ROOM_ID, room):
            raise Refusal(
                CloseCode.BAD_MESSAGE, "customParameters.room missing or invalid", "bad_message"
            )
        self._authorize(params.get("token"), room)
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

    def _parse_twilio(self, text: str | bytes) -> Any:
        if isinstance(text, bytes):
            raise Refusal(CloseCode.BAD_MESSAGE, "twilio frames are JSON text", "bad_message")
        try:
            return parse_twilio_message(text)
        except ValidationError as exc:
            raise _bad_message(exc) from exc

    async def _twilio_media(self, ws: ServerConnection, stream: LiveStream) -> None:
        async for text in ws:
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
        ws: ServerConnection,
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

    async def _pump(self, ws: ServerConnection, stream: LiveStream, reader: Any) -> None:
        """Run the reader and the writer of one stream; always flush and close the stream."""
        writer = asyncio.create_task(self._write(ws, stream))
        closed_cleanly = False
        try:
            await reader
            closed_cleanly = True
        finally:
            await self.rooms.close_stream(stream)  # flushes the last turns into the outbox
            if closed_cleanly:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._drained(stream), 5)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer
        await ws.close(CloseCode.NORMAL, "stream stopped")

    @staticmethod
    async def _drained(stream: LiveStream) -> None:
        await stream.outbox.join()

    @staticmethod
    async def _write(ws: ServerConnection, stream: LiveStream) -> None:
        while True:
            message = await stream.outbox.get()
            try:
                await ws.send(message)
            except ConnectionClosed:
                return
            finally:
                stream.outbox.task_done()

    # ------------------------------------------------------------------ event feed

    async def _event_feed(self, ws: ServerConnection, room: str, token: str | None) -> None:
        self._authorize(token, room)
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
            async for message in ws:
                try:
                    request = parse_feed_request(message)
                except ValidationError as exc:
                    raise Refusal(CloseCode.BAD_MESSAGE, "bad feed request", "bad_message") from exc
                self.rooms.rename(room, request.label, request.name, request.stream)

        tasks = [
            asyncio.create_task(send_all()),
            asyncio.create_task(read_requests()),
            asyncio.create_task(consumer.dropped_event.wait()),
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


def _bad_message(exc: ValidationError) -> Refusal:
    """The refusal for a protocol message that does not parse: not JSON, or a field that is wrong."""
    errors = exc.errors()
    if errors and errors[0].get("type") == "json_invalid":
        return Refusal(CloseCode.BAD_MESSAGE, "message is not JSON", "bad_json")
    where = ".".join(error_location(list(errors))) or "message"
    return Refusal(
        CloseCode.BAD_MESSAGE, f"bad message at {where}: {errors[0]['msg']}"[:120], "bad_message"
    )
