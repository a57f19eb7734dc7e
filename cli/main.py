"""The `chorus` command line.

Each subcommand lives in its own module under `cli/commands/` and exposes
`register(subparsers)`; this module only discovers them, so adding a command touches one file.
A part whose pip extra is missing (`models.extras.MissingExtra`) ends any command with its one
line, `chorus COMMAND: … pip install 'chorus[EXTRA]'`, and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence

import cli.commands
from models.extras import MissingExtra


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="chorus",
        description="Voice-first realtime agent server: per-speaker turns for LLM sessions.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(cli.commands.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"cli.commands.{info.name}")
        register = getattr(module, "register", None)
        if register is not None:
            register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "0")
    parser = build_parser()
    args = parser.parse_args(argv)
    run = args.run
    try:
        code = run(args)
    except KeyboardInterrupt:
        return 130
    except MissingExtra as exc:
        print(f"chorus {args.command}: {exc}", file=sys.stderr)
        return 2
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
