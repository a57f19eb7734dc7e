"""The network server behind `chorus serve`: one ASGI app (FastAPI on Starlette) on uvicorn.

Owns the sockets, their tokens, their limits and the drain. One app, one event loop, served by
uvicorn with its `websockets` implementation:

- `/v1/rooms/{room}/stream?token=…`  a conference-room device (`server.device` framing)
- `/v1/twilio`                        a phone bridge leg (`server.twilio`: Media Streams framing)
- `[sip] listen` (UDP+TCP)             a SIP call (`server.sip`): digest auth, room from the URI
- `[audiosocket] listen` (TCP)         an Asterisk AudioSocket call (`server.audiosocket`), its
                                      room from the UUID map (`PUT /v1/audiosocket/{uuid}`)
- `/v1/rooms/{room}/events?token=…`  the live JSON feed of a room (renames and typed messages
                                      from the page)
- the HTTP routes (`server.routes`): the page, `/healthz`, `/metrics`, transcripts, room deletion,
  typed messages (`chat` grant, server.chat), the Teams and WhatsApp webhooks (server.ingress)

A stream protocol module turns its socket's messages into one `server.framing.StreamDeclaration`
plus audio; the route here checks its token and limits, then every stream runs the same way
(`server.streaming.run_stream`). Every websocket refusal is a close code from
`protocol.CloseCode` with the problem in the reason, sent before any audio is read; it only ever
ends the offending socket. Oversized messages are cut off by the websockets protocol under
uvicorn (`ws_max_size`, close code 1009) from the frame header, before the payload is buffered.
A socket is read only as fast as its handler takes messages (uvicorn's `ws_max_queue` then TCP),
so a flooding client backs up on its own connection only.
Model work never runs here: the pipeline's voice channel does it off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import warnings
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, WebSocket

from rooms import RoomKit
from server.audiosocket import (
    HANGUP,
    AudioSocketCall,
    AudioSocketCalls,
    AudioSocketFraming,
    AudioSocketOpening,
    FrameSplitter,
    audio_seconds,
)
from server.auth import Grant, RoomGrant, TokenError, TokenProblem, verify_token
from server.config import ServerConfig, split_host_port
from server.device import DeviceFraming
from server.events import serve_feed
from server.framing import Refusal, StoppedBeforeStart, check_stream_participant
from server.ingress.serve import build_webhooks
from server.live import LiveRooms, StreamLimitError
from server.load import CpuMeter, Load, load_figure
from server.metrics import ServerMetrics
from server.pipeline import Pipeline
from server.protocol import ROOM_ID, CloseCode
from server.routes import HttpRoutes, problem_response
from server.sip import SipCallPlan, SipEndpoint, SipFraming, SipLeg
from server.sockets import (
    REFUSAL_WAIT_S,
    AsciiHeadersWebSocketProtocol,
    KeepServerSend,
    Socket,
    SocketClosed,
    StreamSocket,
    TcpSocket,
)
from server.streaming import Drain, run_stream
from server.twilio import SIGNATURE_HEADER, TwilioFraming, TwilioOpening, TwilioSignatures

log = logging.getLogger("chorus.server")

Opening = TypeVar("Opening")
"""What a protocol's opening messages read into (`TwilioOpening`, `AudioSocketOpening`)."""

TWILIO_ROUTE = "/v1/twilio"

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
        self.metrics.delivery = self.rooms.kit.delivery_stats
        self.pipeline = pipeline
        self._interrupts: set[asyncio.Task[None]] = set()
        """Barge-ins being told to the room's model (`Pipeline.interrupt`)."""
        self.cpu = CpuMeter()
        """The process's CPU share (`server.load`), for the load figure."""
        self.metrics.stage_load = pipeline.stage_load
        self.metrics.second_pass = pipeline.second_pass_outcomes
        self.metrics.realtime = pipeline.realtime_counts
        self.metrics.load = self.load
        self._closing = False
        self._drain = Drain()
        """Begun on shutdown: streams stop taking audio, flush and close with 4503, all within
        `limits.drain_timeout_s`."""
        self._feeds_closing = asyncio.Event()
        """Set once the streams are flushed: feeds send what they hold and close with 4503."""
        self._uvicorn: uvicorn.Server | None = None
        self._sockets: set[StreamSocket] = set()
        self._unauthenticated_total = 0
        self._unauthenticated_by_address: dict[str, int] = {}
        self._stream_handlers: set[asyncio.Task[Any]] = set()
        self._feed_handlers: set[asyncio.Task[Any]] = set()
        self._twilio_signatures = (
            TwilioSignatures(config.twilio.auth_token, config.twilio.stream_url)
            if config.twilio.auth_token
            else None
        )
        """With `[twilio] auth_token`: only legs Twilio signed are accepted (at the upgrade)."""
        self.webhooks = build_webhooks(config, self.rooms.kit, self._open_conversation_room)
        """Teams and WhatsApp conversations (`[teams]`, `[whatsapp]`), when configured."""
        self.audiosocket_calls = AudioSocketCalls(
            config.audiosocket.map_ttl_s, config.audiosocket.max_mapped
        )
        """Where each AudioSocket call goes, by its UUID (`PUT /v1/audiosocket/{uuid}`)."""
        self._audiosocket: asyncio.Server | None = None
        self.sip = (
            SipEndpoint(config.sip, secret, self._sip_leg, self._admit_sip_call)
            if config.sip.enabled
            else None
        )
        """The SIP endpoint (`[sip] enabled`)."""
        self.app = self._build_app()

    async def _open_conversation_room(self, room_id: str) -> None:
        """A chat conversation's room: a live room like any other (pipeline channels attached)."""
        (await self.rooms.room(room_id)).touch()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, host: str, port: int) -> None:
        config = uvicorn.Config(
            KeepServerSend(self.app),
            host=host,
            port=port,
            ws=AsciiHeadersWebSocketProtocol,
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
        await self.rooms.load_voices()  # before the first stream can open
        await server.startup()
        if not server.started:
            raise OSError(f"could not listen on {host}:{port}")
        self._uvicorn = server
        listen = self.config.audiosocket.listen
        if listen is not None:
            as_host, as_port = split_host_port(listen)
            self._audiosocket = await asyncio.start_server(
                self._audiosocket_connection, as_host, as_port
            )
            log.info("audiosocket: listening on %s:%d", as_host, self.audiosocket_port)
        if self.sip is not None:
            await self.sip.start()
            log.info("sip: listening on %s (udp and tcp)", self.sip.port)
        self.rooms.start()

    @property
    def port(self) -> int:
        assert self._uvicorn is not None
        sockets = self._uvicorn.servers[0].sockets
        return int(sockets[0].getsockname()[1])

    def load(self) -> Load:
        """The server's load figure now (`server.load`): what `/healthz` and `/metrics` say."""
        stage = self.pipeline.stage_load()
        return load_figure(
            stage=stage.load if stage is not None else 0.0,
            streams=sum(self.metrics.streams_active.values()),
            max_streams=self.config.limits.max_streams,
            cpu=self.cpu.share(),
        )

    @property
    def audiosocket_port(self) -> int | None:
        """The TCP port AudioSocket calls reach (None: `[audiosocket]` is off)."""
        if self._audiosocket is None:
            return None
        return int(self._audiosocket.sockets[0].getsockname()[1])

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
        if self._audiosocket is not None:
            self._audiosocket.close()
        self._drain.begin(self.config.limits.drain_timeout_s)
        streams = [t for t in self._stream_handlers if not t.done()]
        if streams:
            await asyncio.wait(streams, timeout=max(0.0, self._drain.left()))
        self._feeds_closing.set()
        feeds = [t for t in self._feed_handlers if not t.done()]
        if feeds:
            await asyncio.wait(feeds, timeout=REFUSAL_WAIT_S * 2)
        if server is not None:
            server.force_exit = False
            await server.shutdown()
        if self.sip is not None:
            await self.sip.stop()
        await self.webhooks.close()
        await self.rooms.close()
        if self._audiosocket is not None:
            await self._audiosocket.wait_closed()

    # ------------------------------------------------------------------ the app

    def _build_app(self) -> FastAPI:
        routes = HttpRoutes(
            self.rooms,
            self.metrics,
            self.webhooks,
            self.secret,
            closing=lambda: self._closing,
            audiosocket_calls=(
                self.audiosocket_calls if self.config.audiosocket.listen is not None else None
            ),
        )
        app = routes.app(("/v1/rooms/{room}/stream", "/v1/rooms/{room}/events", TWILIO_ROUTE))
        app.add_api_websocket_route("/v1/rooms/{room}/stream", self._stream_route)
        app.add_api_websocket_route("/v1/rooms/{room}/events", self._events_route)
        app.add_api_websocket_route(TWILIO_ROUTE, self._twilio_route)
        app.add_api_websocket_route("/{anything:path}", self._unknown_websocket)
        return app

    @staticmethod
    async def _unknown_websocket(websocket: WebSocket) -> None:
        await websocket.send_denial_response(
            problem_response(404, "unknown_route", "no such websocket route")
        )

    async def _stream_route(self, websocket: WebSocket, room: str) -> None:
        await self._serve_socket(websocket, room, self._device_stream)

    async def _events_route(self, websocket: WebSocket, room: str) -> None:
        await self._serve_socket(websocket, room, self._event_feed)

    async def _twilio_route(self, websocket: WebSocket) -> None:
        signatures = self._twilio_signatures
        if signatures is not None:
            if not signatures.signed(websocket.headers.get(SIGNATURE_HEADER), str(websocket.url)):
                self.metrics.refused_total["bad_twilio_signature"] += 1
                await websocket.send_denial_response(problem_response(
                    403, "bad_signature", "missing or wrong X-Twilio-Signature"
                ))
                return
            await self._serve_socket(websocket, None, self._signed_twilio_leg)
            return
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
                problem_response(404, "unknown_route", "no such websocket route (bad room id)")
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
                await handler(ws, room, ws.token())
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

    async def _refuse(self, ws: StreamSocket, refusal: Refusal) -> None:
        """Say why, close with the code; a peer that does not read is cut off (bounded)."""
        self.metrics.refused_total[refusal.metric] += 1
        log.info("refused %s: %s (%d)", ws.remote, refusal.reason, refusal.code)
        await ws.refuse(refusal.code, refusal.reason)

    def _authorize(self, token: str | None, room: str, need: Grant) -> RoomGrant:
        try:
            return verify_token(self.secret, token, room, need=need)
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

    async def _first_message(self, ws: StreamSocket, deadline: float | None = None) -> str | bytes:
        """The next message before `deadline` (loop time; default: `start_timeout_s` from now).
        A drain does not wait for a client that has not started: it is told 4503 at once."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.config.limits.start_timeout_s
        receiving = asyncio.ensure_future(ws.recv())
        draining = asyncio.ensure_future(self._drain.started.wait())
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
        """The token (in the URL) first, then `start`, then audio until `stop`."""
        grant = self._authorize(token, room, Grant.STREAM)
        self._check_capacity()
        framing = DeviceFraming()
        try:
            declaration = framing.start(await self._first_message(ws))
        except StoppedBeforeStart:
            await ws.close(CloseCode.NORMAL, "stopped before start")
            return
        check_stream_participant(grant, declaration.participant)
        framing.on_barge_in = lambda: self._device_barged_in(room, framing.stream_id)
        await run_stream(ws, self.rooms, room, framing, declaration, self._drain)

    def _device_barged_in(self, room: str, stream_id: str) -> None:
        """A device says it stopped the reply: taken only while a reply plays in the room (a
        device's word alone cannot stop the room's replies or cancel its model's responses at
        will, nor flood the room with `reply_stopped`); otherwise only that device is answered
        `reply_stopped` (it waits for the answer before it plays reply audio again)."""
        if self.pipeline.reply_playing(room):
            self._barged_in("device", room, stream_id)
        else:
            self.rooms.answer_barge_in(room, stream_id)

    # ------------------------------------------------------------------ Twilio leg

    async def _twilio_leg(self, ws: Socket, *, signed: bool = False) -> None:
        """`connected`, then `start` carrying room/token/name, then `media` until `stop`. A leg
        whose upgrade Twilio signed is not counted as waiting to authenticate."""
        self._check_capacity()
        framing = TwilioFraming()
        with contextlib.nullcontext() if signed else self._unauthenticated(ws):
            opening = await self._twilio_opening(ws, framing)
        if opening is None:
            return
        grant = self._authorize(opening.token, opening.room, Grant.STREAM)
        framing.barge_in.on_barge_in = lambda: self._barged_in(
            "twilio", opening.room, framing.stream_id
        )
        declaration = framing.declare(opening)
        check_stream_participant(grant, declaration.participant)
        await run_stream(ws, self.rooms, opening.room, framing, declaration, self._drain)

    def _barged_in(self, kind: str, room: str, stream_id: str | None) -> None:
        """Someone talked over the reply playing to them: a phone caller (the leg already
        stopped it) or a device that stopped it and says so. Counted; the reply stops for the
        whole room at once (`LiveRooms.stop_reply`: every stream, the rest of the response, the
        microphones' V9 silence), and the room's model stops the response it is still making."""
        self.metrics.barge_ins_total[kind] += 1
        self.rooms.stop_reply(room, stream_id)
        task = asyncio.get_running_loop().create_task(self.pipeline.interrupt(room))
        self._interrupts.add(task)
        task.add_done_callback(self._interrupts.discard)

    async def _signed_twilio_leg(self, ws: Socket) -> None:
        await self._twilio_leg(ws, signed=True)

    @contextlib.contextmanager
    def _unauthenticated(self, ws: StreamSocket) -> Iterator[None]:
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

    async def _twilio_opening(self, ws: Socket, framing: TwilioFraming) -> TwilioOpening | None:
        """Messages up to `start`, all within one deadline from the connection's opening (a
        `connected`, `mark` or `dtmf` never extends it); None when the leg stopped first."""
        return await self._opening(ws, framing.opening, "stopped before start")

    # ------------------------------------------------------------------ AudioSocket call

    async def _audiosocket_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One TCP connection on `[audiosocket] listen`: refused as a websocket would be (the
        reason logged and counted; the call hears a hangup), tracked for the drain."""
        ws = TcpSocket(
            reader, writer, FrameSplitter(), seconds_of=audio_seconds, goodbye=HANGUP
        )
        task = asyncio.current_task()
        assert task is not None
        self._sockets.add(ws)
        self._stream_handlers.add(task)
        try:
            await self._audiosocket_call(ws)
        except Refusal as refusal:
            await self._refuse(ws, refusal)
        except SocketClosed:
            pass
        except Exception:
            log.exception("audiosocket call from %s failed", ws.remote)
            await ws.close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            if not writer.is_closing():
                writer.close()
            self._sockets.discard(ws)
            self._stream_handlers.discard(task)

    async def _audiosocket_call(self, ws: TcpSocket) -> None:
        """The UUID, then the first audio (its kind is the call's rate), the room from the UUID
        map or `[audiosocket] default_room`, then audio until a hangup."""
        self._check_capacity()
        framing = AudioSocketFraming()
        with self._unauthenticated(ws):
            opening = await self._audiosocket_opening(ws, framing)
        if opening is None:
            return
        call = self.audiosocket_calls.take(opening.call_id) or self._default_call()
        if call is None:
            raise Refusal(
                CloseCode.TOKEN_WRONG_ROOM, "no room for this call's uuid", "unknown_call"
            )
        declaration = framing.declare(opening, call)
        framing.barge_in.on_barge_in = lambda: self._barged_in(
            "audiosocket", call.room, framing.stream_id
        )
        framing.on_dtmf = lambda digit: self.rooms.publish_dtmf(framing.stream_id or "", digit)
        ws.push_back(opening.first_audio)
        ws.fill_pauses(framing.silence)  # Asterisk forwards no frames while a DTX caller is quiet
        ws.before_send = framing.sending  # a barge-in drops the reply audio not sent yet
        await run_stream(ws, self.rooms, call.room, framing, declaration, self._drain)

    def _default_call(self) -> AudioSocketCall | None:
        section = self.config.audiosocket
        if section.default_room is None:
            return None
        return AudioSocketCall(room=section.default_room, shared_mic=section.default_shared_mic)

    async def _audiosocket_opening(
        self, ws: TcpSocket, framing: AudioSocketFraming
    ) -> AudioSocketOpening | None:
        """Frames up to the first audio, all within `limits.start_timeout_s` of the connection
        (a DTMF digit never extends it); None when the call hung up first."""
        return await self._opening(ws, framing.opening, "hung up before audio")

    async def _opening(
        self, ws: StreamSocket, opening_of: Callable[[str | bytes], Opening | None], stopped: str
    ) -> Opening | None:
        """Messages read into `opening_of` until it gives the stream's opening, all within
        `limits.start_timeout_s` of the connection (what it skips never extends it); None, with
        the socket closed saying `stopped`, when the peer stopped first."""
        deadline = asyncio.get_running_loop().time() + self.config.limits.start_timeout_s
        try:
            opening = None
            while opening is None:
                opening = opening_of(await self._first_message(ws, deadline))
        except StoppedBeforeStart:
            await ws.close(CloseCode.NORMAL, stopped)
            return None
        return opening

    # ------------------------------------------------------------------ SIP leg

    def _admit_sip_call(self, room: str) -> tuple[int, str] | None:
        """Whether another SIP call may join `room` now (None), else its SIP refusal."""
        if self._closing:
            return 503, "Service Unavailable (shutting down)"
        sip = self.config.sip
        assert self.sip is not None
        in_room = sum(1 for leg in self.sip.legs.values() if leg.room == room)
        if len(self.sip.legs) >= sip.max_calls or not self.rooms.has_capacity():
            return 503, "Service Unavailable (too many calls)"
        if in_room >= sip.max_calls_per_room:
            return 486, "Busy Here (too many calls in this room)"
        return None

    async def _sip_leg(self, leg: SipLeg, framing: SipFraming, plan: SipCallPlan) -> None:
        """An accepted SIP call, run as a stream; refusals end it with a BYE (and are counted)."""
        task = asyncio.current_task()
        assert task is not None
        self._sockets.add(leg)
        self._stream_handlers.add(task)
        framing.on_dtmf = lambda digit: self.rooms.publish_dtmf(framing.stream_id or "", digit)
        leg.barge.on_barge_in = lambda: self._barged_in("sip", plan.room, framing.stream_id)
        try:
            await run_stream(
                leg, self.rooms, plan.room, framing, framing.declare(plan), self._drain
            )
        except Refusal as refusal:
            await self._refuse(leg, refusal)
        except SocketClosed:
            pass
        except Exception:
            log.exception("sip leg %s failed", leg.call.call_id)
            await leg.close(CloseCode.INTERNAL_ERROR, "internal error")
        finally:
            self._sockets.discard(leg)
            self._stream_handlers.discard(task)

    # ------------------------------------------------------------------ event feed

    async def _event_feed(self, ws: Socket, room: str, token: str | None) -> None:
        """The token, the room's feed-consumer limit, then the feed (`server.events`)."""
        grant = self._authorize(token, room, Grant.FEED)
        if self._closing:
            raise Refusal(CloseCode.SHUTTING_DOWN, "server is shutting down", "shutting_down")
        live = await self.rooms.room(room)
        try:
            consumer = self.rooms.subscribe(live)
        except StreamLimitError as exc:
            raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "too_many_feeds") from exc
        try:
            drained = await serve_feed(ws, self.rooms, room, grant, consumer, self._feeds_closing)
        finally:
            self.rooms.unsubscribe(live, consumer)
        if drained:
            await ws.close(CloseCode.SHUTTING_DOWN, "server is shutting down")
