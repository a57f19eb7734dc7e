"""`chorus stream AUDIO|--mic --room ROOM [--url http://127.0.0.1:8765] [--token TOKEN]
[--shared-mic | --one-person NAME] [--realtime-pace | --fast]`: a file or this machine's
microphone into a running `chorus serve`, as a conference-room device; the labelled turns are
printed as they arrive.

It is a device like any other (`server.client.DeviceStream`, the device protocol of
docs/server.md): `start`, 16 kHz mono PCM16 frames, `stop`, then the last turns. A file is read
with soundfile (any format it reads) and resampled with soxr; the microphone comes through
`sounddevice` (the optional extra `mic`, which needs PortAudio). The token is `--token`, else
`CHORUS_TOKEN`, else one signed here with the server's secret (`CHORUS_SECRET` or `secret` in
`--config`, as `chorus token` does). A refusal (a bad token, a full server, a stream too fast)
ends the command with status 1 and the server's reason; a microphone that cannot be opened ends
it with status 2 and what is missing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from models.extras import MissingExtra, require

RATE = 16000
FRAME_S = 0.02
FAST_PACE = 2.0
"""`--fast` streams at twice real time: the server's default per-stream rate cap
(`limits.max_stream_rate`), which a stream above it after its burst is held to, then refused."""
MIC_EXTRA = ("mic", "chorus stream --mic (the microphone, through sounddevice)")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "stream",
        help="stream a file or the microphone into a running server and print the turns",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("audio", nargs="?", type=Path, default=None,
                        help="audio file (any format soundfile reads; any rate, any channels)")
    source.add_argument("--mic", action="store_true",
                        help="this machine's default microphone (the `mic` extra: sounddevice)")
    parser.add_argument("--url", default="http://127.0.0.1:8765", help="the server")
    parser.add_argument("--room", required=True, help="the room to stream into")
    parser.add_argument("--token", default=None,
                        help="room token with the stream grant (default: CHORUS_TOKEN, else one "
                             "signed with CHORUS_SECRET)")
    parser.add_argument("--config", default=None,
                        help="chorus.toml holding `secret` (to sign a token when none is given)")
    parser.add_argument("--participant", default=None,
                        help="the device's participant id (default: the token's, else a new one)")
    who = parser.add_mutually_exclusive_group()
    who.add_argument("--shared-mic", action="store_true", default=True,
                     help="several people at this microphone: speakers are told apart (default)")
    who.add_argument("--one-person", metavar="NAME", default=None,
                     help="one person at this microphone: every turn is NAME's")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--realtime-pace", action="store_true",
                      help="send a file at real-time pace, as a microphone would (default)")
    pace.add_argument("--fast", action="store_true",
                      help=f"send a file at {FAST_PACE:g}x real time (the server's default rate cap)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_stream(args))
    except StreamError as exc:
        print(f"chorus stream: {exc}", file=sys.stderr)
        return exc.status


class StreamError(Exception):
    """Ends the command: the message (one line) and the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def websocket_base(url: str) -> str:
    """`http://host:port` → `ws://host:port` (`https` → `wss`); a `ws(s)://` URL is kept."""
    url = url.rstrip("/")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if url.startswith(http):
            return ws + url[len(http):]
    if url.startswith(("ws://", "wss://")):
        return url
    raise StreamError(f"--url must be http(s)://host:port, not {url!r}", 2)


def token_for(args: argparse.Namespace) -> str:
    token = args.token or os.environ.get("CHORUS_TOKEN")
    if token:
        return str(token)
    from server.auth import issue_token
    from server.config import ConfigError, load_config

    try:
        secret = load_config(args.config).secret
    except ConfigError as exc:
        raise StreamError(str(exc), 2) from exc
    if not secret:
        raise StreamError("no token: pass --token (from `chorus token ROOM`), set CHORUS_TOKEN, "
                          "or set CHORUS_SECRET to the server's secret", 2)
    return issue_token(secret, args.room, 3600)


def token_participant(token: str) -> str | None:
    """The participant a token is for (its `sub`), read without checking the signature (the
    server checks it): a token for one participant streams only as that one."""
    import jwt

    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    sub = claims.get("sub")
    return sub if isinstance(sub, str) else None


def read_file(path: Path) -> bytes:
    from voice.audio import float_to_pcm16, read_audio_16k

    if not path.is_file():
        raise StreamError(f"no such file: {path}", 2)
    try:
        return float_to_pcm16(read_audio_16k(path))
    except Exception as exc:  # soundfile's own errors name the problem
        raise StreamError(f"cannot read {path}: {exc}", 2) from exc


@contextlib.asynccontextmanager
async def microphone() -> AsyncIterator[asyncio.Queue[bytes]]:
    """The default input device as 20 ms 16 kHz mono PCM16 frames, or a `StreamError` saying
    what is missing (the extra, PortAudio, an input device)."""
    require(*MIC_EXTRA)
    try:
        import sounddevice as sd
    except ImportError as exc:
        raise MissingExtra(*MIC_EXTRA) from exc
    except OSError as exc:  # the package is there, the PortAudio library is not
        raise StreamError(
            f"no microphone: {exc} (install PortAudio, e.g. `apt-get install libportaudio2`)", 2
        ) from exc
    try:
        device = sd.query_devices(kind="input")
    except Exception as exc:
        raise StreamError(f"no microphone: no input device ({exc})", 2) from exc
    loop = asyncio.get_running_loop()
    frames: asyncio.Queue[bytes] = asyncio.Queue(maxsize=500)

    def captured(data: Any, count: int, time: Any, status: Any) -> None:
        loop.call_soon_threadsafe(_offer, frames, bytes(data))

    try:
        stream = sd.RawInputStream(samplerate=RATE, channels=1, dtype="int16",
                                   blocksize=int(RATE * FRAME_S), callback=captured)
        stream.start()
    except Exception as exc:
        raise StreamError(f"no microphone: {device.get('name', 'the input device')} cannot be "
                          f"opened at 16 kHz mono ({exc})", 2) from exc
    print(f"listening on {device.get('name', 'the default microphone')} (Ctrl-C to stop)",
          file=sys.stderr)
    try:
        yield frames
    finally:
        stream.stop()
        stream.close()


def _offer(frames: asyncio.Queue[bytes], frame: bytes) -> None:
    with contextlib.suppress(asyncio.QueueFull):  # the socket is behind: drop, as a device does
        frames.put_nowait(frame)


def show(message: Any) -> None:
    """A turn as `chorus transcribe` prints it (a corrected one marked), a reply, a status."""
    from voice.transcribe import Turn, format_turns

    if message.type == "turn":
        line = format_turns([Turn(message.speaker, message.text, message.start, message.end)],
                            "text").rstrip("\n")
        print(line + ("  (corrected)" if message.corrected else ""), flush=True)
    elif message.type == "reply":
        print(f"assistant: {message.text}", flush=True)
    elif message.type == "stt_status":
        detail = f": {message.reason}" if message.reason else ""
        print(f"speech-to-text {message.status}{detail}", file=sys.stderr, flush=True)
    elif message.type == "started":
        print(f"streaming into room {message.room} as {message.participant} "
              f"(stream {message.stream})", file=sys.stderr, flush=True)


async def _stream(args: argparse.Namespace) -> int:
    from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

    from server.client import DeviceStream
    from server.protocol import StartMessage

    base = websocket_base(args.url)
    audio = None if args.mic else read_file(args.audio)
    token = token_for(args)
    participant = args.participant or token_participant(token) or f"cli-{uuid.uuid4().hex[:8]}"
    start = StartMessage(participant=participant, name=args.one_person,
                         sample_rate=RATE, shared_mic=args.one_person is None)
    async with contextlib.AsyncExitStack() as stack:
        frames = await stack.enter_async_context(microphone()) if args.mic else None
        try:
            device = await DeviceStream.open(base, args.room, token, start, on_message=show)
        except InvalidStatus as exc:
            raise StreamError(f"{args.url} refused the stream (HTTP "
                              f"{exc.response.status_code})", 1) from exc
        except (OSError, InvalidHandshake) as exc:
            raise StreamError(f"cannot connect to {args.url}: {exc}", 1) from exc
        try:
            if frames is not None:
                while True:
                    await device.ws.send(await frames.get())
            else:
                assert audio is not None
                speed = FAST_PACE if args.fast else 1.0
                await send_at(device, audio, speed)
        except (ConnectionClosed, KeyboardInterrupt, asyncio.CancelledError):
            pass
        await device.stop()
    refusal = next((m for m in device.received if m.type == "error"), None)
    if refusal is not None:
        raise StreamError(f"refused: {refusal.reason} ({refusal.code})", 1)
    code = device.ws.close_code
    if code not in (None, 1000):
        raise StreamError(f"the server closed the stream ({code} {device.ws.close_reason})", 1)
    return 0


async def send_at(device: Any, audio: bytes, speed: float) -> None:
    """Send pcm16 in 100 ms pieces at `speed` times real time (no drift)."""
    from server.client import send_paced

    await send_paced(device.ws.send, audio, bytes_per_second=int(RATE * 2 * speed),
                     chunk_s=0.1 / speed, realtime=True)
