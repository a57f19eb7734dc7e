"""`chorus agent [--config chorus.toml] [--dev]`: run Chorus as a LiveKit Agents worker.

The worker registers with the LiveKit server named by `LIVEKIT_URL` (credentials
`LIVEKIT_API_KEY`, `LIVEKIT_API_SECRET`) under `agent_name = "chorus"` and takes one job per room
it is dispatched to (`livekit_worker`, docs/livekit.md). It reads the same config file as
`chorus serve` (every section means the same: STT, diarizer with its enrolled voices, voice, realtime,
policy, chat, agent, store) plus its `[livekit]` section. What a job would fail on is checked
before the worker registers: the file, the extras, the enrollment clips, the store. The import of
`livekit_worker` waits until the command runs, so `chorus --help` stays fast.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from livekit_worker.config import LiveKitConfig
    from rooms import OpenedStore


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "agent", help="run as a LiveKit Agents worker (one Chorus room per LiveKit room)"
    )
    parser.add_argument("--config", default=None, help="chorus.toml (see docs/livekit.md)")
    parser.add_argument(
        "--dev", action="store_true",
        help="development mode: no load threshold, verbose logs (livekit-agents devmode)",
    )
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING …")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from server.config import ConfigError

    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from models.extras import MissingExtra, require

    require("livekit", "the LiveKit Agents worker")  # cli.main prints the hint
    from livekit_worker.config import load_agent_config
    from server.pipeline import read_enrollments, require_extras

    try:
        config, livekit = load_agent_config(args.config)  # a bad file fails here, not in each job
        require_extras(config)
        read_enrollments(config)  # a clip that cannot be read
    except (ConfigError, ValueError, MissingExtra) as exc:
        print(f"chorus agent: {exc}", file=sys.stderr)
        return 2
    try:
        held = asyncio.run(_check_store(config.store.resolved_url()))
    except Exception as exc:  # a file that cannot be created, a database that is not there
        reason = " ".join(str(exc).split())  # one line (libpq's errors span two)
        print(f"chorus agent: cannot open the store: {reason}", file=sys.stderr)
        return 2
    try:
        return _register(args, livekit)
    finally:
        if held is not None:
            asyncio.run(held.close())


def _register(args: argparse.Namespace, livekit: LiveKitConfig) -> int:
    """Register the worker and serve its jobs until interrupted (the store checked and held)."""
    from livekit_worker.worker import CONFIG_ENV, missing_credentials, serve

    missing = missing_credentials()
    if missing:
        print(
            f"chorus agent: set {', '.join(missing)} (the LiveKit server and its API key; "
            "for a local server `livekit-server --dev` uses devkey / secret)",
            file=sys.stderr,
        )
        return 2
    if args.config:
        os.environ[CONFIG_ENV] = os.path.abspath(args.config)  # job processes inherit it
    print(
        f"chorus agent: registering with {os.environ['LIVEKIT_URL']} as "
        f"agent_name={livekit.agent_name!r}",
        file=sys.stderr, flush=True,
    )
    try:
        asyncio.run(serve(livekit, devmode=args.dev))
    except KeyboardInterrupt:
        return 130
    return 0


async def _check_store(url: str) -> OpenedStore | None:
    """Open the store each job will open, as the jobs do (sharing a SQLite file, each job owning
    its room); a SQLite store stays open while the worker runs, so no other process (a `chorus
    serve`) takes the file from its jobs meanwhile (`rooms.sqlite`). Other stores are closed."""
    from rooms import SQLiteStore, open_store

    opened = await open_store(url, shared=True)
    if isinstance(opened.store, SQLiteStore):
        return opened
    await opened.close()
    return None
