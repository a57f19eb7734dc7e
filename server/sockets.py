"""One accepted websocket as the server's handlers use it, and the ASGI plumbing it needs.

Owns `Socket` (text/bytes messages in and out, one `SocketClosed` for a peer that is gone, the
token it presented, a close and a refusal that cut off a peer that does not take them within a
bound, and `abort`), the outermost ASGI layer that keeps uvicorn's own `send` reachable for that
abort, and keeping room tokens out of uvicorn's request-line logs. The protocol code above it
reads like the protocol. `StreamSocket` is what a stream's handlers need of any socket, and
`TcpSocket` is a framed TCP connection that offers it (Asterisk AudioSocket): the protocol
module cuts the byte stream into messages, and the socket paces the audio it sends at real time.
`PauseFill` is the one rule for a call whose audio stops between talk spurts (a phone's silence
suppression): the SIP leg and `TcpSocket` feed its pauses to the stream as silence.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import json
import logging
import re
import time
import warnings
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Protocol

from fastapi import WebSocket
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocketDisconnect, WebSocketState
from websockets.datastructures import Headers

with warnings.catch_warnings():
    # uvicorn flags its legacy-websockets protocol as deprecated at import; it is the
    # implementation `chorus serve` runs on purpose (per-message backpressure)
    warnings.simplefilter("ignore")
    from uvicorn.protocols.websockets.websockets_impl import WebSocketProtocol
    from websockets.legacy.server import HTTPResponse

from server.protocol import ErrorMessage, dump

SILENCE_FILL_S = 0.2
"""No audio from a call for this long (a phone's silence suppression: RFC 3389 comfort noise or
simply nothing until the caller talks again; Asterisk's `AudioSocket()` forwards only voice
frames): its stream is fed digital silence for the time since the call's last audio, and again
every `SILENCE_FILL_S`, so the STT hears the pause that ends a turn, as it does from a phone that
keeps sending audio. A network stall longer than this feeds that much silence before the late
audio."""
PAUSE_FRAME_S = 0.02
"""Silence is fed in whole 20 ms frames."""


class PauseFill:
    """How much silence a call's pause owes its stream (`SILENCE_FILL_S`), on the wall clock.

    `heard(now)` at each piece of the call's audio; `due()` is when the next silence is owed
    (None before the call's first audio: a call that never sends audio costs the STT nothing);
    `take(now)` is the silence owed now, in whole frames. Where the wire says how long a pause
    really was (RTP timestamps), `owed(skipped)` is what is still owed of it once the call
    talks again: the pause less what the wall clock fed and the wire has not shown yet.
    `resume(now)` after a time that is not to be fed (a SIP hold)."""

    def __init__(self) -> None:
        self.heard_until: float | None = None
        """Where the stream's audio reaches in the call's time: its last audio, or the silence
        fed after it."""
        self.filled_s = 0.0
        """Seconds of silence fed in all."""
        self._ahead = 0.0

    def heard(self, now: float) -> None:
        self.heard_until = now

    def due(self) -> float | None:
        return None if self.heard_until is None else self.heard_until + SILENCE_FILL_S

    def take(self, now: float) -> float:
        if self.heard_until is None or now - self.heard_until < SILENCE_FILL_S:
            return 0.0
        seconds = int((now - self.heard_until) / PAUSE_FRAME_S + 1e-6) * PAUSE_FRAME_S
        self.heard_until += seconds
        self.filled_s += seconds
        self._ahead += seconds
        return seconds

    def owed(self, skipped: float) -> float:
        frames = int((skipped - self._ahead) / PAUSE_FRAME_S + 0.5)
        self._ahead = max(0.0, self._ahead - skipped)
        seconds = max(0, frames) * PAUSE_FRAME_S
        self.filled_s += seconds
        return seconds

    def resume(self, now: float) -> None:
        self._ahead = 0.0
        if self.heard_until is not None:
            self.heard_until = max(self.heard_until, now)


REFUSAL_WAIT_S = 3.0
"""How long a refused peer gets to take the error and the close frame before it is cut off."""
MAX_REASON_BYTES = 123
"""A close frame's reason is at most 123 bytes of UTF-8 (RFC 6455 §5.5: 125 with the code)."""


def close_reason(reason: str) -> str:
    """`reason` cut to `MAX_REASON_BYTES` of UTF-8 without splitting a character: the one cut
    every close frame (and the `error` message before it) goes through."""
    data = reason.encode("utf-8", "replace")[:MAX_REASON_BYTES]
    return data.decode("utf-8", "ignore")  # drops only a character the cut split


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


class SocketClosed(Exception):
    """The peer went away without a clean close (or the socket broke under us)."""


class StreamSocket(Protocol):
    """What a stream's handlers (`server.app`, `server.streaming`) use of a socket."""

    remote: str

    async def recv(self) -> str | bytes: ...

    def messages(self) -> AsyncIterator[str | bytes]: ...

    async def send(self, message: str | bytes) -> None: ...

    async def close(
        self, code: int, reason: str = "", *, within_s: float = REFUSAL_WAIT_S
    ) -> None: ...

    async def refuse(self, code: int, reason: str) -> None: ...


class _Receiving(Protocol):
    closed_cleanly: bool

    async def recv(self) -> str | bytes: ...


async def messages_until_closed(socket: _Receiving) -> AsyncIterator[str | bytes]:
    """`socket.recv()` until the peer closes cleanly (`closed_cleanly`); a broken connection
    raises `SocketClosed`. Every `StreamSocket`'s `messages` (websocket, TCP, SIP leg)."""
    while True:
        try:
            yield await socket.recv()
        except SocketClosed:
            if socket.closed_cleanly:
                return
            raise


class Socket:
    """One accepted websocket, as the route handlers use it: `recv`, `send`, `close`.

    A thin layer over Starlette's `WebSocket` that speaks in text/bytes messages and one
    exception for a peer that is gone, so the protocol code reads like the protocol."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws
        self.remote = ws.client.host if ws.client is not None else "?"
        self.closed_cleanly = False

    def token(self) -> str | None:
        """The room token the client presented: `?token=`, else `Authorization: Bearer …`."""
        token = self.ws.query_params.get("token")
        if token:
            return token
        auth = self.ws.headers.get("authorization", "")
        if auth.lower().startswith("bearer "):
            return auth[7:].strip()
        return None

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

    def messages(self) -> AsyncIterator[str | bytes]:
        return messages_until_closed(self)

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
                    await self.ws.close(code, close_reason(reason))
        except TimeoutError:
            self.abort()

    async def refuse(self, code: int, reason: str) -> None:
        """Say why (an `error` message), then close with `code`, all within `REFUSAL_WAIT_S`; a
        peer that does not read is cut off."""
        reason = close_reason(reason)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REFUSAL_WAIT_S
        try:
            async with asyncio.timeout_at(deadline):
                await self.send(dump(ErrorMessage(code=int(code), reason=reason)))
        except (TimeoutError, SocketClosed):
            self.abort()
            return
        await self.close(code, reason, within_s=max(0.1, deadline - loop.time()))

    def abort(self) -> None:
        """Drop the TCP connection now (a peer that stopped reading cannot take a close frame).

        ASGI has no message for this; uvicorn's protocol object (the owner of the server's own
        `send` callable, kept in the scope by `KeepServerSend`) holds the transport."""
        owner = getattr(self.ws.scope.get(SERVER_SEND_KEY), "__self__", None)
        transport = getattr(owner, "transport", None)
        if isinstance(transport, asyncio.BaseTransport) and hasattr(transport, "abort"):
            transport.abort()


SERVER_SEND_KEY = "chorus.server_send"

_BAD_HEADER_BODY = json.dumps(
    {"problem": "bad_request", "detail": "the request line or a header is not ASCII text"}
).encode()


class AsciiHeadersWebSocketProtocol(WebSocketProtocol):
    """uvicorn's `websockets` protocol, answering `400` to an upgrade whose request line or a
    header holds a non-ASCII byte. The handshake reads such bytes as surrogates, which uvicorn
    cannot turn into ASGI headers: it answered `500` and logged a traceback per request."""

    async def process_request(
        self, path: str, request_headers: Headers
    ) -> HTTPResponse | None:
        if not path.isascii() or not all(
            name.isascii() and value.isascii() for name, value in request_headers.raw_items()
        ):
            headers = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
            return http.HTTPStatus.BAD_REQUEST, headers, _BAD_HEADER_BODY
        return await super().process_request(path, request_headers)


class KeepServerSend:
    """Outermost ASGI layer: keeps the server's own `send` in the scope (the framework wraps
    the one handlers see), so a socket whose peer stopped reading can be cut off (`abort`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope[SERVER_SEND_KEY] = send
        await self.app(scope, receive, send)


class MessageSplitter(Protocol):
    """A protocol's cut of a TCP byte stream into whole messages."""

    def feed(self, data: bytes) -> list[bytes]: ...


class TcpSocket:
    """One accepted TCP connection of a framed protocol, as a `StreamSocket`.

    `splitter` cuts what arrives into messages; binary messages sent are audio and go out paced
    at real time (`seconds_of` says how long each plays; the socket keeps `lead_s` ahead), so
    the peer can play each as it comes; text (the room's turns) has no place on such a wire and
    is dropped. A close (or a refusal) sends `goodbye` and closes the connection; a peer that
    does not take it within the bound is cut off.

    Once `fill_pauses(silence)` is called (`silence(seconds)`: that much silence as the call's
    own messages), a pause in what the peer sends reads as silence (`PauseFill`), and while it
    lasts a 20 ms silence goes back to the peer whenever nothing was sent for `KEEPALIVE_S`:
    Asterisk's `AudioSocket()` ends a call after 2 s with nothing from either side."""

    KEEPALIVE_S = 1.0

    READ_BYTES = 65536

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        splitter: MessageSplitter,
        *,
        seconds_of: Callable[[bytes], float],
        goodbye: bytes,
        lead_s: float = 0.1,
    ) -> None:
        self.reader = reader
        self.writer = writer
        peer = writer.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        self.closed_cleanly = False
        self._splitter = splitter
        self._seconds_of = seconds_of
        self._goodbye = goodbye
        self._lead_s = lead_s
        self._ready: deque[bytes] = deque()
        self._due = 0.0
        self._closed = False
        self._silence: Callable[[float], list[bytes]] | None = None
        self.pauses = PauseFill()
        """The peer's pauses fed as silence (after `fill_pauses`)."""
        self.keepalives = 0
        """Silences sent to keep the peer's side of the call from its idle timeout."""
        self._sent_at = 0.0
        self.before_send: Callable[[bytes], bool] | None = None
        """Asked before each audio message goes out; False drops it (a barge-in)."""

    def push_back(self, message: bytes) -> None:
        """`message` is the next one `recv` returns (a message read before the stream opened)."""
        self._ready.appendleft(message)

    def fill_pauses(self, silence: Callable[[float], list[bytes]]) -> None:
        """From now on, pauses read as `silence(seconds)` (the call's own audio messages)."""
        self._silence = silence
        self.pauses.heard(time.monotonic())

    async def recv(self) -> bytes:
        while not self._ready:
            if self._closed:
                raise SocketClosed("already closed")
            due = self.pauses.due() if self._silence is not None else None
            try:
                read = self.reader.read(self.READ_BYTES)
                if due is None:
                    data = await read
                else:
                    data = await asyncio.wait_for(read, max(due - time.monotonic(), 0.005))
            except TimeoutError:
                self._fill_pause()
                continue
            except (ConnectionError, OSError) as exc:
                raise SocketClosed(str(exc)) from exc
            if not data:
                self.closed_cleanly = True  # the peer closed its side (TCP has no close code)
                raise SocketClosed("peer closed")
            self.pauses.heard(time.monotonic())
            self._ready.extend(self._splitter.feed(data))
        return self._ready.popleft()

    def _fill_pause(self) -> None:
        assert self._silence is not None
        if self.writer.is_closing():  # a keepalive found the peer gone
            raise SocketClosed("peer gone")
        now = time.monotonic()
        self._ready.extend(self._silence(self.pauses.take(now)))
        if now - self._sent_at >= self.KEEPALIVE_S and not self.writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError):
                self.writer.write(b"".join(self._silence(PAUSE_FRAME_S)))
                self._sent_at = now
                self.keepalives += 1

    def messages(self) -> AsyncIterator[str | bytes]:
        return messages_until_closed(self)

    async def send(self, message: str | bytes) -> None:
        if isinstance(message, str):
            return
        if self._closed or self.writer.is_closing():
            raise SocketClosed("closed")
        if self.before_send is not None and not self.before_send(message):
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._due = max(self._due, now)
        wait = self._due - self._lead_s - now
        if wait > 0:
            await asyncio.sleep(wait)
        try:
            self.writer.write(message)
            await self.writer.drain()
        except (ConnectionError, OSError) as exc:
            raise SocketClosed(str(exc)) from exc
        self._sent_at = time.monotonic()
        self._due += self._seconds_of(message)

    async def close(self, code: int, reason: str = "", *, within_s: float = REFUSAL_WAIT_S) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            async with asyncio.timeout(within_s):
                with contextlib.suppress(ConnectionError, OSError):
                    self.writer.write(self._goodbye)
                    await self.writer.drain()
                self.writer.close()
                with contextlib.suppress(ConnectionError, OSError):
                    await self.writer.wait_closed()
        except TimeoutError:
            self.abort()

    async def refuse(self, code: int, reason: str) -> None:
        """A framed peer has no message for a reason: it is logged by the server; the call
        hears `goodbye`."""
        await self.close(code, reason)

    def abort(self) -> None:
        self._closed = True
        self.writer.transport.abort()
