"""Every declared stream runs the same way, whatever protocol it came in by.

Owns a stream's life on its socket once its protocol module has declared it (`run_stream`):
open it in its room (`server.live`, within the stream limits), send the framing's greeting, then
read audio out of each message under the rate cap while a writer sends the stream's outbox
(turns, replies, reply audio); at `stop`, a broken socket or a drain, flush the last turns, let
them go out, and close (`1000`, or `4503` on a drain). A stream over the rate cap is refused
only after its last turns went out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable

from server.framing import Refusal, StreamDeclaration, StreamFraming
from server.live import LiveRooms, StreamLimitError
from server.protocol import CloseCode
from server.room_state import LiveStream, StreamTooFastError
from server.sockets import Socket, SocketClosed
from voice.audio import AudioError
from voice.stt.base import SttRefusedError

log = logging.getLogger("chorus.server")


async def run_stream(
    ws: Socket,
    rooms: LiveRooms,
    room: str,
    framing: StreamFraming,
    declaration: StreamDeclaration,
    draining: asyncio.Event,
) -> None:
    """Open the declared stream in `room`, greet the socket, then pump audio in and messages
    out until the stream stops or `draining` is set; refusals are raised as `Refusal`."""
    try:
        stream = await rooms.open_stream(
            room, kind=framing.kind, declaration=declaration, reply_audio=framing.reply_audio
        )
    except StreamLimitError as exc:
        raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "too_many_streams") from exc
    except AudioError as exc:  # a declared format the voice channel cannot take (V10)
        raise Refusal(CloseCode.BAD_MESSAGE, str(exc)[:120], "bad_format") from exc
    except SttRefusedError as exc:  # the STT refused the server's key: told, never retried
        log.error("room %s: the STT refused a new stream: %s", room, exc)
        raise Refusal(
            CloseCode.INTERNAL_ERROR, f"stream could not start: {exc}"[:120], "stt_refused"
        ) from exc
    except Exception as exc:  # the STT or model behind the stream is unavailable
        log.exception("could not open a %s stream in room %s", framing.kind, room)
        raise Refusal(
            CloseCode.INTERNAL_ERROR, f"stream could not start: {exc}"[:120], "pipeline_error"
        ) from exc
    for message in framing.greeting(room, stream.id):
        stream.send(message)
    log.info(
        "%s stream %s opened in room %s for %s",
        framing.kind, stream.id, room, declaration.participant,
    )
    await _pump(ws, rooms, stream, _read_audio(ws, rooms, stream, framing), draining)


async def _read_audio(
    ws: Socket, rooms: LiveRooms, stream: LiveStream, framing: StreamFraming
) -> None:
    """Audio out of each message, into the room, until the framing says the stream ended."""
    async for message in ws.messages():
        audio = framing.audio(message)
        if audio is None:
            return
        if audio:
            await rooms.push_audio(stream, audio)


async def _pump(
    ws: Socket,
    rooms: LiveRooms,
    stream: LiveStream,
    reader: Awaitable[None],
    draining_event: asyncio.Event,
) -> None:
    """Run the reader and the writer of one stream; always flush and close the stream.

    A drain (shutdown) stops the reader where it is; the stream is then flushed like a
    `stop`, its last turns are sent, and the device hears `4503` instead of `1000`."""
    writer = asyncio.create_task(_write(ws, stream))
    reading = asyncio.ensure_future(reader)
    draining = asyncio.create_task(draining_event.wait())
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
        await rooms.close_stream(stream)  # flushes the last turns into the outbox
        if closed_cleanly:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stream.outbox.join(), 5)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writer
    if too_fast is not None:
        raise Refusal(CloseCode.TOO_MANY_STREAMS, str(too_fast), "stream_too_fast")
    if drained:
        await ws.close(CloseCode.SHUTTING_DOWN, "server is shutting down")
    else:
        await ws.close(CloseCode.NORMAL, "stream stopped")


async def _write(ws: Socket, stream: LiveStream) -> None:
    while True:
        message = await stream.outbox.get()
        try:
            await ws.send(message)
        except SocketClosed:
            return
        finally:
            stream.outbox.task_done()
