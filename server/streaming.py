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
import math
from collections.abc import Awaitable

from server.framing import Refusal, StreamDeclaration, StreamFraming, format_refusal
from server.live import LiveRooms, StreamLimitError
from server.overload import StageOverloadedError
from server.protocol import CloseCode
from server.room_state import LiveStream, StreamTooFastError
from server.sockets import REFUSAL_WAIT_S, SocketClosed, StreamSocket
from voice.audio import AudioError
from voice.stt.base import SttRefusedError

log = logging.getLogger("chorus.server")

CLOSE_MARGIN_S = REFUSAL_WAIT_S
"""The part of the drain deadline kept for a stream's last turns to go out and its 4503."""


class Drain:
    """Shutdown as every stream sees it: `started` is set when the server drains, and each
    stream must be closed by `deadline` (loop time): its flush is cut off `CLOSE_MARGIN_S`
    before it, so its last turns and its 4503 still go out in time."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.deadline = math.inf

    def begin(self, within_s: float) -> None:
        self.deadline = asyncio.get_running_loop().time() + within_s
        self.started.set()

    def left(self) -> float:
        """Seconds to the deadline (inf before a drain)."""
        return self.deadline - asyncio.get_running_loop().time()

    def flush_left(self) -> float:
        """Seconds a draining stream may still spend on its flush."""
        left = self.left()
        return max(0.0, left - min(CLOSE_MARGIN_S, left / 2))


async def run_stream(
    ws: StreamSocket,
    rooms: LiveRooms,
    room: str,
    framing: StreamFraming,
    declaration: StreamDeclaration,
    drain: Drain,
) -> None:
    """Open the declared stream in `room`, greet the socket, then pump audio in and messages
    out until the stream stops or the server drains; refusals are raised as `Refusal`."""
    try:
        stream = await rooms.open_stream(
            room,
            kind=framing.kind,
            declaration=declaration,
            reply_audio=framing.reply_audio,
            stop_reply=framing.stop_reply,
        )
    except StreamLimitError as exc:
        raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "too_many_streams") from exc
    except StageOverloadedError as exc:  # issue 31: the stage already sheds streams
        raise Refusal(CloseCode.TOO_MANY_STREAMS, str(exc), "diarization_overloaded") from exc
    except AudioError as exc:  # a declared format the voice channel cannot take (V10)
        raise format_refusal(exc) from exc
    except SttRefusedError as exc:  # the STT refused the server's key: told, never retried
        log.error("room %s: the STT refused a new stream: %s", room, exc)
        raise Refusal(
            CloseCode.INTERNAL_ERROR, f"stream could not start: {exc}", "stt_refused"
        ) from exc
    except ConnectionError as exc:  # no STT connection within `stt.start_timeout_s`
        log.error("room %s: no STT connection for a new stream: %s", room, exc)
        raise Refusal(
            CloseCode.INTERNAL_ERROR,
            "stream could not start: the STT connection did not complete",
            "stt_unavailable",
        ) from exc
    except Exception as exc:  # the STT or model behind the stream is unavailable
        log.exception("could not open a %s stream in room %s", framing.kind, room)
        raise Refusal(CloseCode.INTERNAL_ERROR, "stream could not start", "pipeline_error") from exc
    for message in framing.greeting(room, stream.id):
        stream.send(message)
    log.info(
        "%s stream %s opened in room %s for %s",
        framing.kind, stream.id, room, declaration.participant,
    )
    await _pump(ws, rooms, stream, _read_audio(ws, rooms, stream, framing), drain)


async def _read_audio(
    ws: StreamSocket, rooms: LiveRooms, stream: LiveStream, framing: StreamFraming
) -> None:
    """Audio out of each message, into the room, until the framing says the stream ended."""
    async for message in ws.messages():
        audio = framing.audio(message)
        for answer in framing.answers():
            stream.send(answer)
        if audio is None:
            return
        if audio:
            await rooms.push_audio(stream, audio)


async def _pump(
    ws: StreamSocket,
    rooms: LiveRooms,
    stream: LiveStream,
    reader: Awaitable[None],
    drain: Drain,
) -> None:
    """Run the reader and the writer of one stream; always flush and close the stream.

    A drain (shutdown) stops the reader where it is; the stream is then flushed like a
    `stop`, its last turns are sent, and the device hears `4503` instead of `1000`, all before
    the drain's deadline (issue 25.15). While it drains, its socket is still read (and the audio
    dropped), so the websocket's pings are answered and a device that keeps sending is never
    stuck behind a full queue until its keepalive gives up."""
    writer = asyncio.create_task(_write(ws, stream))
    reading = asyncio.ensure_future(reader)
    draining = asyncio.create_task(drain.started.wait())
    discarding: asyncio.Task[None] | None = None
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
        if drained:
            discarding = asyncio.create_task(_discard(ws))
            try:
                # flushes the last turns into the outbox, cut off at the drain's deadline
                await asyncio.wait_for(rooms.close_stream(stream), drain.flush_left())
            except TimeoutError:
                log.warning("stream %s: its flush was cut off at the drain deadline", stream.id)
        else:
            await rooms.close_stream(stream)  # flushes the last turns into the outbox
        if closed_cleanly:
            outbox_wait = min(5.0, max(0.1, drain.left() - 1.0)) if drained else 5.0
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stream.outbox.join(), outbox_wait)
        writer.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await writer
    try:
        if too_fast is not None:
            raise Refusal(CloseCode.TOO_MANY_STREAMS, str(too_fast), "stream_too_fast")
        if drained:
            within = max(0.1, min(REFUSAL_WAIT_S, drain.left()))
            await ws.close(CloseCode.SHUTTING_DOWN, "server is shutting down", within_s=within)
        else:
            await ws.close(CloseCode.NORMAL, "stream stopped")
    finally:
        if discarding is not None:
            discarding.cancel()
            await asyncio.gather(discarding, return_exceptions=True)


async def _discard(ws: StreamSocket) -> None:
    """Read and drop what a draining stream's peer still sends, until it goes."""
    with contextlib.suppress(SocketClosed):
        async for _ in ws.messages():
            pass


async def _write(ws: StreamSocket, stream: LiveStream) -> None:
    while True:
        message = await stream.outbox.get()
        try:
            await ws.send(message)
        except SocketClosed:
            return
        finally:
            stream.outbox.task_done()
