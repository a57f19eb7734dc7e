"""`python -m realtime TURNS.json [--provider recorder|openai|gemini] [--audio WAV]`.

Replays a turns file (a list of `{"speaker","text","start","end"}`, or an object with `turns`,
such as `examples/meeting/meeting.json`) into a realtime session and prints what the model was
sent. With the default recorder it needs no key and no network: a demo of what a speech-to-speech
model reads from a meeting (`chorus transcribe --realtime` does the same from audio).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from realtime.providers import PROVIDERS
from realtime.replay import replay_turns


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m realtime", description=__doc__.splitlines()[0])
    parser.add_argument("turns", type=Path, help="turns JSON (a list, or an object with 'turns')")
    parser.add_argument("--provider", choices=PROVIDERS, default="recorder")
    parser.add_argument("--assistant-name", default="Chorus")
    parser.add_argument("--model", default=None)
    parser.add_argument("--audio", type=Path, default=None, help="the recording (audio mode, R3)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N turns")
    args = parser.parse_args(argv)
    try:
        data: Any = json.loads(args.turns.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        print(f"cannot read turns from {args.turns}: {exc}", file=sys.stderr)
        return 2
    turns = data.get("turns") if isinstance(data, dict) else data
    if not isinstance(turns, list) or not all(isinstance(t, dict) for t in turns):
        print(
            f"{args.turns}: expected a list of turns (objects with speaker and text)",
            file=sys.stderr,
        )
        return 2
    if args.limit is not None:
        turns = turns[: args.limit]
    audio = None
    if args.audio is not None:
        import soundfile

        samples, rate = soundfile.read(str(args.audio), dtype="int16", always_2d=True)
        audio = (samples.mean(axis=1).astype("<i2").tobytes(), int(rate))
    result = asyncio.run(
        replay_turns(
            turns, args.provider, assistant_name=args.assistant_name, audio=audio, model=args.model
        )
    )
    print(result.render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
