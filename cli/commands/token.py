"""`chorus token ROOM [--grant stream|feed|chat|admin …] [--participant ID] [--ttl 3600]`: print a
room token (a JWT, HS256) signed with the server secret.

The secret comes from the same place the server reads it (`CHORUS_SECRET`, or `secret` in the
config file), so a token printed here is accepted by a server started with the same settings.
Without `--grant` the token grants stream, feed and chat (not admin); `--grant` repeated lists
exactly what it grants, e.g. `--grant feed` for a read-only page.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from server.auth import DEFAULT_GRANTS, Grant, issue_token
from server.config import ConfigError, load_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("token", help="print a room token for devices and feeds")
    parser.add_argument("room", help="the room the token grants")
    parser.add_argument("--ttl", type=int, default=3600, help="seconds the token is valid")
    parser.add_argument(
        "--grant",
        action="append",
        choices=[g.value for g in Grant],
        default=None,
        help="what the token allows (repeatable; default: "
        + ", ".join(g.value for g in DEFAULT_GRANTS)
        + ")",
    )
    parser.add_argument(
        "--participant", default=None, help="the participant the token is for (`sub`)"
    )
    parser.add_argument("--config", default=None, help="chorus.toml holding `secret`")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"chorus token: {exc}", file=sys.stderr)
        return 2
    if not config.secret:
        print(
            "chorus token: no secret: set CHORUS_SECRET or `secret` in the config file "
            "(the same one the server uses)",
            file=sys.stderr,
        )
        return 2
    try:
        print(
            issue_token(
                config.secret,
                args.room,
                args.ttl,
                grants=args.grant,
                participant=args.participant,
            )
        )
    except ValueError as exc:
        print(f"chorus token: {exc}", file=sys.stderr)
        return 2
    return 0
