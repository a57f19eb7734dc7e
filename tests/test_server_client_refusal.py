"""`server.client.DeviceStream` against a server that refuses at once: the server may close
before the client has written `start` (a bad token is refused on connect). Opening must not
raise, and the refusal the server sent before closing must still be read (what `chorus stream`
prints). A real websockets server; the client's connect is held until the server's close is in,
so the race a loaded machine sometimes loses is lost every time here."""

from __future__ import annotations

from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as real_connect
from websockets.asyncio.server import ServerConnection, serve

import server.client
from server.client import DeviceStream
from server.protocol import StartMessage

pytestmark = pytest.mark.asyncio

REFUSAL = '{"type":"error","code":4403,"reason":"token is not a readable JWT"}'


async def test_a_stream_refused_before_start_is_written_still_reads_the_refusal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def refuse(ws: ServerConnection) -> None:
        await ws.send(REFUSAL)
        await ws.close(4403, "token is not a readable JWT")

    async def connect_after_the_close(url: str, **options: Any) -> ClientConnection:
        ws = await real_connect(url, **options)
        await ws.wait_closed()
        return ws

    monkeypatch.setattr(server.client, "connect", connect_after_the_close)
    async with serve(refuse, "127.0.0.1", 0) as srv:
        port = srv.sockets[0].getsockname()[1]
        device = await DeviceStream.open(
            f"ws://127.0.0.1:{port}", "r1", "nonsense", StartMessage(participant="p1")
        )
        await device.stop()
    [refusal] = device.received
    assert refusal.type == "error" and refusal.code == 4403
    assert device.ws.close_code == 4403
