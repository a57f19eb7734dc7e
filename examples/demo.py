"""`make demo`: the main job end to end, on the embedded default (no key, no network).

Starts `chorus serve`'s server on a free loopback port (local Whisper `tiny.en`, the embedded
diarizer, the recorder realtime session), connects a conference-room device to it over a
websocket and streams the generated meeting (`examples/meeting/meeting.wav`, three voices, 66 s)
at real-time pace, exactly as a room device would. While it plays, the live labelled transcript is
printed as the server sends it; at the end, what the recorder realtime session received — the
labelled lines a speech model would be sent — and the meeting's script for comparison.

Run: `make demo`, or `.venv/bin/python examples/demo.py [--fast]` (`--fast`: no real-time pace,
and the server's per-stream rate cap lifted for it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from realtime import RealtimeChannel  # noqa: E402
from server.auth import issue_token  # noqa: E402
from server.client import DeviceStream  # noqa: E402
from server.config import ServerConfig  # noqa: E402
from server.pipeline import VoicePipeline  # noqa: E402
from server.protocol import FeedMessage, StartMessage  # noqa: E402
from server.testing.harness import running_server  # noqa: E402
from voice.audio import float_to_pcm16, read_audio_16k  # noqa: E402

MEETING = REPO / "examples" / "meeting"
ROOM = "demo-room"
SECRET = "chorus-demo-secret-0123456789abcdef"
COLOURS = ["\033[31m", "\033[32m", "\033[34m", "\033[35m", "\033[36m", "\033[33m"]
RESET = "\033[0m"


def _colour(speaker: str, seen: dict[str, str], tty: bool) -> str:
    if not tty:
        return speaker
    colour = seen.setdefault(speaker, COLOURS[len(seen) % len(COLOURS)])
    return f"{colour}{speaker}{RESET}"


async def main(fast: bool) -> int:
    # the embedded default: whisper, embedded, recorder. `--fast` streams a file faster than real
    # time, which the server's per-stream rate cap (limits.max_stream_rate, 2x) exists to refuse
    # from a live device, so this run lifts it.
    limits = {"max_stream_rate": 1000.0} if fast else {}
    config = ServerConfig.model_validate({"secret": SECRET, "limits": limits})
    audio = float_to_pcm16(read_audio_16k(MEETING / "meeting.wav"))
    script = json.loads((MEETING / "meeting.json").read_text())
    tty = sys.stdout.isatty()
    seen: dict[str, str] = {}
    print("Starting the server (local Whisper tiny.en, embedded diarizer, recorder session)…")
    began = time.monotonic()
    async with running_server(config) as server:
        print(
            f"  listening on {server.http_base}/ ({time.monotonic() - began:.1f} s to load models)"
        )
        token = issue_token(SECRET, ROOM, ttl_s=600)
        print(f"  transcript page: {server.http_base}/?room={ROOM}&token={token}\n")

        def show(message: FeedMessage) -> None:
            if message.type == "turn":
                who = _colour(message.speaker, seen, tty)
                print(
                    f"  [{message.start:5.1f}–{message.end:5.1f}] {who}: {message.text}", flush=True
                )
            elif message.type == "reply":
                print(f"  assistant: {message.text}", flush=True)

        device = await DeviceStream.open(
            server.base,
            ROOM,
            token,
            StartMessage(
                participant="room-1", name="Meeting room", sample_rate=16000, shared_mic=True
            ),
            on_message=show,
        )
        pace = "as fast as the socket takes it" if fast else "at real-time pace"
        print(f"Streaming the meeting ({len(audio) / 32000:.0f} s) as a room device, {pace}:\n")
        await device.send_audio(audio, chunk_s=0.1, realtime=not fast)
        async with asyncio.timeout(120):
            await device.stop()
        turns = device.turns
        pipeline = server.server.rooms.pipeline
        realtime = pipeline.realtime if isinstance(pipeline, VoicePipeline) else None
        lines = realtime.lines_for(ROOM) if isinstance(realtime, RealtimeChannel) else []
        await _print_recorder(realtime, lines)
        print("\nThe meeting's script (for comparison):")
        for turn in script["turns"]:
            print(f"  [{turn['start']:5.1f}–{turn['end']:5.1f}] {turn['speaker']}: {turn['text']}")
        speakers = sorted({t.speaker for t in turns})
        print(
            f"\n{len(turns)} turns from {len(speakers)} speakers ({', '.join(speakers)}) in "
            f"{time.monotonic() - began:.0f} s; {len(lines)} lines reached the realtime session."
        )
        return 0 if turns and lines else 1


async def _print_recorder(realtime: Any, lines: list[str]) -> None:
    print("\nWhat the recorder realtime session received (the lines a speech model is sent):")
    if realtime is None:
        print("  (no realtime session configured)")
        return
    session = realtime.session_for(ROOM)
    await realtime.wait_idle(ROOM)
    events = getattr(session, "events", [])
    kinds: dict[str, int] = {}
    for event in events:
        kinds[event.get("type", "?")] = kinds.get(event.get("type", "?"), 0) + 1
    for line in lines:
        head, _, note = line.partition("\n\n")
        print(f"  {head}")
        if note:
            print(f"    (+ the attribution note, sent once: {note[:70]}…)")
    print(f"  client events recorded: {', '.join(f'{k} ×{n}' for k, n in kinds.items())}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="stream without real-time pacing")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    sys.exit(asyncio.run(main(args.fast)))
