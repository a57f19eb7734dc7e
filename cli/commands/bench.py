"""`chorus bench NAME …`: runs a benchmark module from `bench/` (the same code path users run).

Every bench needs the `bench` extra (jiwer, pyannote.metrics, matplotlib); each is checked at start."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
from collections.abc import Callable
from typing import Any

import bench
from models.extras import require


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "bench", help="measure accuracy and speed (see docs/benchmarks.md)"
    )
    names = subparsers_for_benches(parser)
    parser.set_defaults(run=lambda args: _no_bench(parser, names))


def subparsers_for_benches(parser: argparse.ArgumentParser) -> list[str]:
    benches = parser.add_subparsers(dest="bench", metavar="NAME")
    names: list[str] = []
    for info in sorted(pkgutil.iter_modules(bench.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"bench.{info.name}")
        add_arguments = getattr(module, "add_arguments", None)
        run = getattr(module, "run", None)
        if add_arguments is None or run is None:
            continue
        doc = (module.__doc__ or "").strip().splitlines()
        sub = benches.add_parser(info.name, help=doc[0] if doc else None)
        add_arguments(sub)
        sub.set_defaults(run=_with_bench_extra(info.name, run))
        names.append(info.name)
    return names


def _with_bench_extra(
    name: str, run: Callable[[argparse.Namespace], int]
) -> Callable[[argparse.Namespace], int]:
    """`run` after checking the `bench` extra (WER, DER scoring, plots), so a missing one stops
    the bench at its start with the install hint rather than after the measuring."""

    def checked(args: argparse.Namespace) -> int:
        require("bench", f"the {name} bench")
        return run(args)

    return checked


def _no_bench(parser: argparse.ArgumentParser, names: list[str]) -> int:
    parser.print_help()
    return 2 if names else 1
