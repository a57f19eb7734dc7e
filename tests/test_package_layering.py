"""The package layering of docs/architecture.md, checked on the source (issue 10, "Seams").

`cli` sits above everything and nothing imports it; `server` imports neither `bench` nor `cli`
(before the move `server.commands.bench` imported `bench`, whose `load` imports `server`: a cycle);
no product package imports the test-only helpers under `tests/`. Every `import` statement counts,
including those inside functions, since a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# package -> top-level packages it must never import
FORBIDDEN: dict[str, set[str]] = {
    "models": {"attribution", "rooms", "voice", "diarization", "realtime", "server", "bench", "cli"},
    "attribution": {"rooms", "voice", "diarization", "realtime", "server", "bench", "cli"},
    "rooms": {"voice", "diarization", "realtime", "server", "bench", "cli"},
    "voice": {"diarization", "realtime", "server", "bench", "cli"},
    "diarization": {"realtime", "server", "bench", "cli"},
    "realtime": {"diarization", "server", "bench", "cli"},
    "server": {"bench", "cli", "livekit_worker"},
    "livekit_worker": {"bench", "cli"},
    "bench": {"cli"},
}
PRODUCT = [*FORBIDDEN, "cli"]


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def violations(package: str, forbidden: set[str]) -> list[str]:
    found: list[str] = []
    for path in sorted((REPO / package).rglob("*.py")):
        for name in sorted(imported_packages(path) & forbidden):
            found.append(f"{path.relative_to(REPO)} imports {name}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_below_itself(package: str) -> None:
    assert violations(package, FORBIDDEN[package]) == []


@pytest.mark.parametrize("package", PRODUCT)
def test_product_never_imports_test_helpers(package: str) -> None:
    assert violations(package, {"tests"}) == []


def test_the_checker_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    module = tmp_path / "lazy.py"
    module.write_text("def f() -> None:\n    from bench.load import run\n    import cli.main\n")
    assert imported_packages(module) == {"bench", "cli"}


def test_cli_is_a_package_above_server_and_bench() -> None:
    assert (REPO / "cli" / "__init__.py").is_file()
    assert not (REPO / "server" / "cli.py").exists()
    assert not (REPO / "server" / "commands").exists()
    assert {"server", "bench"} <= set().union(
        *(imported_packages(p) for p in (REPO / "cli").rglob("*.py"))
    )


def test_load_bench_serves_this_checkout_and_an_older_one(tmp_path: Path) -> None:
    from bench.load import serve_module

    assert serve_module(REPO) == "cli.main"
    (tmp_path / "server").mkdir()
    (tmp_path / "server" / "cli.py").write_text("")
    assert serve_module(tmp_path) == "server.cli"


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of every absolute import in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_turn_assembler_is_pure() -> None:
    """Issue 26: when a turn ends is decided without asyncio, threads, the room kit or hooks;
    within voice it reads only words, runs and timelines."""
    names = imported_modules(REPO / "voice" / "assembler.py")
    assert not {n.split(".")[0] for n in names} & {"asyncio", "threading", "concurrent", "rooms",
                                                    "models", "attribution", "server"}
    assert {n for n in names if n.startswith("voice")} <= {"voice.turns", "voice.diarization_stage"}


def test_the_stage_driver_does_not_reach_into_sessions_or_rooms() -> None:
    names = imported_modules(REPO / "voice" / "stage_driver.py")
    assert not {n.split(".")[0] for n in names} & {"rooms", "models", "server"}
    assert {n for n in names if n.startswith("voice")} <= {
        "voice.assembler", "voice.audio", "voice.diarization_stage"}
