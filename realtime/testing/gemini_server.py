"""A local server that speaks the Gemini Live (`BidiGenerateContent`) wire protocol over TLS.

Why TLS: `google-genai` always turns an API-key client's base URL into `wss://`, so the local
server presents a throwaway self-signed certificate made at start, and the client trusts it through
the SDK's own setting (`HttpOptions(async_client_args={"ssl": server.client_ssl})`); no part of the
SDK is patched. It parses each client message with `realtime.gemini_wire`, answers `setup` with
`setupComplete`, and answers `client_content` with `turnComplete: true` by a reply: output
transcription text, 24 kHz PCM audio in `modelTurn.inlineData`, then `turnComplete`. It logs every
client message per connection, can drop connections, and can hang a turn (`hang_turns(n)`:
no reply and no `turnComplete` for it, ever). `connection_seconds` ends every connection as the
service does (about ten minutes there): `goAway` with the time left (`go_away_notice_s`), then
the connection is closed (`forced` lists the ones it had to close). `reply_delay` holds each
reply's `turnComplete` back, so a reply is still in progress meanwhile.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import ipaddress
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from realtime.gemini_wire import (
    Blob,
    ClientMessage,
    Content,
    GoAway,
    Part,
    ServerContent,
    ServerMessage,
    Transcription,
    parse_client_message,
)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@dataclass
class GeminiConnectionLog:
    index: int
    path: str
    messages: list[ClientMessage] = field(default_factory=list)
    raw: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def kinds(self) -> list[str]:
        """Each message's kind, with the detail that matters: `client_content`,
        `client_content:turn_complete`, `realtime_input:audio`, `realtime_input:activity_end` …"""
        out: list[str] = []
        for m in self.messages:
            if m.client_content is not None:
                out.append(
                    "client_content:turn_complete"
                    if m.client_content.turn_complete and not m.client_content.turns
                    else "client_content"
                )
            elif m.realtime_input is not None:
                ri = m.realtime_input
                sub = next(
                    n
                    for n in (
                        "audio",
                        "activity_start",
                        "activity_end",
                        "text",
                        "media_chunks",
                        "audio_stream_end",
                    )
                    if getattr(ri, n) is not None
                )
                out.append(f"realtime_input:{sub}")
            else:
                out.append(m.kind)
        return out

    @property
    def lines(self) -> list[str]:
        """The text of every user turn part received as client content, in order."""
        out: list[str] = []
        for m in self.messages:
            if m.client_content is None:
                continue
            for turn in m.client_content.turns:
                if turn.role in (None, "user"):
                    out.extend(p.text for p in turn.parts if p.text is not None)
        return out


class GeminiLiveServer:
    def __init__(
        self,
        *,
        replies: Sequence[str] = (),
        reply_audio_seconds: float = 0.05,
        reply_delay: float = 0.0,
        connection_seconds: float | None = None,
        go_away_notice_s: float = 10.0,
    ) -> None:
        self.replies = list(replies)
        self.reply_audio_seconds = reply_audio_seconds
        self.reply_delay = reply_delay
        self.connection_seconds = connection_seconds
        self.go_away_notice_s = go_away_notice_s
        self.forced: list[int] = []
        """Indexes of the connections the server closed at the end of their lifetime."""
        self.connections: list[GeminiConnectionLog] = []
        self._server: Server | None = None
        self._live: dict[int, ServerConnection] = {}
        self._tmp = tempfile.TemporaryDirectory(prefix="chorus-gemini-")
        cert, key = _self_signed(Path(self._tmp.name))
        self._server_ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._server_ssl.load_cert_chain(cert, key)
        self.client_ssl = ssl.create_default_context(cafile=str(cert))
        """An SSL context that trusts this server (pass as `GeminiLiveSession(ssl=…)`)."""
        self.port = 0
        self._count = 0
        self._hang = 0
        self.hung = 0
        """How many turns were left hanging."""

    def hang_turns(self, count: int) -> None:
        """The next `count` requests (`client_content` with `turnComplete`) get no answer."""
        self._hang += count

    async def __aenter__(self) -> GeminiLiveServer:
        self._server = await serve(self._handle, "127.0.0.1", 0, ssl=self._server_ssl)
        self.port = int(next(iter(self._server.sockets)).getsockname()[1])
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)
        self._tmp.cleanup()

    @property
    def base_url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def latest(self) -> GeminiConnectionLog:
        return self.connections[-1]

    def drop(self) -> None:
        for ws in list(self._live.values()):
            ws.transport.abort()

    async def _handle(self, ws: ServerConnection) -> None:
        assert ws.request is not None
        log = GeminiConnectionLog(index=len(self.connections), path=ws.request.path)
        self.connections.append(log)
        self._live[log.index] = ws
        lifetime = (None if self.connection_seconds is None
                    else asyncio.create_task(self._lifetime(ws, log.index)))  # fmt: skip
        try:
            async for raw in ws:
                try:
                    message = parse_client_message(raw)
                except ValueError as exc:
                    log.errors.append(str(exc))
                    await ws.close(1007, f"Invalid message: {exc}"[:120])
                    return
                log.messages.append(message)
                if message.setup is not None:
                    await ws.send(ServerMessage(setup_complete={}).wire())
                elif message.client_content is not None and message.client_content.turn_complete:
                    if self._hang > 0:
                        self._hang -= 1
                        self.hung += 1
                        continue
                    await self._reply(ws)
        except ConnectionClosed:
            pass
        finally:
            self._live.pop(log.index, None)
            if lifetime is not None:
                lifetime.cancel()

    async def _lifetime(self, ws: ServerConnection, index: int) -> None:
        """`goAway` `go_away_notice_s` before `connection_seconds`, then the end."""
        assert self.connection_seconds is not None
        notice = min(self.go_away_notice_s, self.connection_seconds)
        await asyncio.sleep(self.connection_seconds - notice)
        with contextlib.suppress(ConnectionClosed):
            await ws.send(ServerMessage(go_away=GoAway(time_left=f"{notice:g}s")).wire())
            await asyncio.sleep(notice)
            self.forced.append(index)
            await ws.close(1011, "connection lifetime reached")

    async def _reply(self, ws: ServerConnection) -> None:
        self._count += 1
        text = self.replies.pop(0) if self.replies else f"Reply {self._count}"
        pcm = b"\x00\x10" * int(24_000 * self.reply_audio_seconds)
        await ws.send(
            ServerMessage(
                server_content=ServerContent(output_transcription=Transcription(text=text))
            ).wire()
        )
        await ws.send(
            ServerMessage(
                server_content=ServerContent(
                    model_turn=Content(
                        role="model",
                        parts=[
                            Part(
                                inline_data=Blob(
                                    data=base64.b64encode(pcm).decode(),
                                    mime_type="audio/pcm;rate=24000",
                                )
                            )
                        ],
                    )
                )
            ).wire()
        )
        if self.reply_delay:
            await asyncio.sleep(self.reply_delay)
        await ws.send(ServerMessage(server_content=ServerContent(generation_complete=True)).wire())
        await ws.send(ServerMessage(server_content=ServerContent(turn_complete=True)).wire())
