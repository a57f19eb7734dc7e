"""`chorus voices list|add NAME CLIP|forget ID [--config chorus.toml]`: the voice directory
(issue 27, docs/voices.md) on the command line, against the server's store (`[store] url`).

`list` prints each remembered person (id, name, prints, created, last heard; never a print's
vector); `add` keeps a print of CLIP's speech under NAME, made on the live stage's model (the
one a running server compares with); `forget` deletes the person and every print. The
directory is opened alone (`rooms.open_directory`): a SQLite file's voice tables work beside a
`chorus serve` or `chorus agent` holding the file, and a running process on the store (SQLite
or Postgres) sees a change made here within `[voices] refresh_s` (docs/voices.md).

`remembered_voices` is how `chorus transcribe --voices` and `chorus diarize --voices` read the
same directory: the same config file, the same store, read only.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rooms import open_directory
from rooms.voices import RememberedVoice, pack_vector
from server.config import ConfigError, VoicesConfig, load_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("voices", help="list, add or forget remembered voices")
    parser.add_argument("--config", default=None, help="chorus.toml naming the store")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    actions.add_parser("list", help="every remembered person (never a voiceprint)")
    add = actions.add_parser("add", help="remember NAME's voice from a clip of their speech")
    add.add_argument("name")
    add.add_argument("clip", help="audio of NAME alone (a few seconds of speech)")
    forget = actions.add_parser("forget", help="delete a person and every print of theirs")
    forget.add_argument("id")
    parser.set_defaults(run=run)


def _when(at: float | None) -> str:
    if at is None:
        return "never"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def clip_print(clip: str) -> tuple[str, list[float]]:
    """(model id, print) of a clip's speech on the live stage's model."""
    from diarization.embedded import EmbeddedStage
    from voice.audio import read_audio_16k

    stage = EmbeddedStage()
    vector = stage.live_voiceprint(read_audio_16k(clip))
    return stage.live_model, [float(x) for x in vector]


async def _run(args: argparse.Namespace, url: str) -> int:
    printed: tuple[str, list[float]] | None = None
    if args.action == "add":  # the model first: a bad clip never opens the store
        printed = await asyncio.to_thread(clip_print, args.clip)
    opened = await open_directory(url)
    try:
        store = opened.store
        if args.action == "list":
            for voice in await store.list_voices():
                print(
                    f"{voice.id}\t{voice.name}\t{len(voice.prints)} prints\t"
                    f"created {_when(voice.created)}\theard {_when(voice.last_heard)}"
                )
        elif args.action == "add":
            assert printed is not None
            model, vector = printed
            voice = await store.remember_print(args.name, model, pack_vector(vector), "clip")
            print(f"{voice.id}\t{voice.name}\t{len(voice.prints)} prints")
        elif not await store.forget_voice(args.id):
            print(f"chorus voices: no voice {args.id!r}", file=sys.stderr)
            return 1
        else:
            print(f"forgot {args.id}")
        return 0
    finally:
        await opened.close()


class DirectoryUnavailable(Exception):
    """The directory cannot be read: one line saying why (the commands print it, exit 2)."""


def remembered_voices(config_path: str | Path | None) -> tuple[list[RememberedVoice], VoicesConfig]:
    """Every remembered person of the store `chorus voices` uses (`[store] url` of the config
    file, or its default), read only, and the `[voices]` thresholds of that file."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        raise DirectoryUnavailable(str(exc)) from exc
    url = config.store.resolved_url()

    async def read() -> list[RememberedVoice]:
        opened = await open_directory(url)
        try:
            return await opened.store.list_voices()
        finally:
            await opened.close()

    try:
        return asyncio.run(read()), config.voices
    except (ValueError, OSError) as exc:
        raise DirectoryUnavailable(f"cannot read the voice directory at {url}: {exc}") from exc


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"chorus voices: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(args, config.store.resolved_url()))
    except (ValueError, FileNotFoundError) as exc:
        print(f"chorus voices: {exc}", file=sys.stderr)
        return 2
