"""`chorus serve [--host 127.0.0.1] [--port 8765] [--config chorus.toml]`: run the server.

Loads the configuration (defaults < file < environment), settles the secret, opens the store
rooms are kept in (`[store] url`: SQLite in the user's data directory by default, so a restart
continues every room), loads the models once, and serves until interrupted. Without a secret the server starts only when every address
it listens on is loopback; it then makes a secret for this run and prints it so `chorus token`
can be pointed at it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import logging
import re
import signal
import socket
import sys
from typing import Any

from models.extras import MissingExtra
from rooms import OpenedStore, RoomKit
from rooms import open_kit as rooms_open_kit
from server.auth import check_secret, generate_secret
from server.config import ConfigError, ServerConfig, load_config

log = logging.getLogger("chorus.server")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the server for room devices and phone bridges"
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="port to listen on (0: any free)")
    parser.add_argument("--config", default=None, help="chorus.toml (see docs/server.md)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING …")
    parser.set_defaults(run=run)


def is_loopback_only(host: str) -> bool:
    """True when every address `host` resolves to is a loopback address."""
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    addresses = {info[4][0] for info in infos}
    return bool(addresses) and all(
        ipaddress.ip_address(str(a).split("%")[0]).is_loopback for a in addresses
    )


def settle_secret(config: ServerConfig, host: str) -> str:
    """The configured secret; a fresh one on loopback; otherwise a clear refusal."""
    if config.secret:
        check_secret(config.secret)
        return config.secret
    if not is_loopback_only(host):
        raise ConfigError(
            f"refusing to listen on {host!r} without a secret: set CHORUS_SECRET or `secret` in "
            "the config file (only a loopback-only server may run without one)"
        )
    secret = generate_secret()
    print(
        "chorus serve: no secret configured; listening on loopback only, so made one for this run:\n"
        f"  export CHORUS_SECRET={secret}\n"
        "  (then `chorus token ROOM` prints tokens this server accepts)",
        file=sys.stderr,
        flush=True,
    )
    return secret


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from server.pipeline import require_extras

    try:
        config = load_config(args.config)
        require_extras(config)  # a missing extra fails here, before the store opens
        secret = settle_secret(config, args.host)
    except (ConfigError, ValueError, MissingExtra) as exc:
        print(f"chorus serve: {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(config, secret, args.host, args.port))


async def open_kit(config: ServerConfig) -> tuple[RoomKit, OpenedStore]:
    """The server's kit on the configured store (`[store] url`, SQLite by default)."""
    return await rooms_open_kit(config.store.resolved_url())


def settle_heap() -> int:
    """Take what is alive once the models are loaded (modules, weights, the server itself: about
    330,000 objects, all living as long as the process) out of the garbage collector's reach,
    and return how many.

    Why: a full collection walks every tracked object, about 0.14 s here with the loop stopped
    for every stream; and CPython runs one only when the objects that survived since the last
    grow past a quarter of that long-lived count, so the small cyclic garbage each finished
    stream leaves (about 1.4 MB a meeting) piled up for dozens of meetings between collections.
    Frozen, they are neither walked nor counted: full collections come often and cost a few ms.
    (`gc.freeze`, as large Python servers do after start-up.)"""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def _shown_url(url: str) -> str:
    """A store URL without its password, for the log."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", url)


async def _serve(config: ServerConfig, secret: str, host: str, port: int) -> int:
    try:
        kit, opened = await open_kit(config)
    except Exception as exc:  # a file that cannot be created, a database that is not there
        print(f"chorus serve: cannot open the store {_shown_url(config.store.resolved_url())}: "
              f"{exc}", file=sys.stderr, flush=True)
        return 2
    try:
        return await _serve_with(config, secret, host, port, kit, opened)
    finally:
        await opened.close()


async def _serve_with(
    config: ServerConfig, secret: str, host: str, port: int, kit: RoomKit, opened: OpenedStore
) -> int:
    from server.app import ChorusServer
    from server.pipeline import build_pipeline

    pipeline = await build_pipeline(config)
    server = ChorusServer(config, pipeline, secret, kit=kit)
    await server.start(host, port)
    settle_heap()
    print(f"chorus serve: rooms are kept in {_shown_url(opened.url)}", file=sys.stderr, flush=True)
    print(f"chorus serve: listening on http://{host}:{server.port}/", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    print("chorus serve: shutting down", file=sys.stderr, flush=True)
    await server.stop()
    return 0
