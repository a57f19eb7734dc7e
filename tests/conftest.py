"""Shared test helpers: where the fixtures live, and the repo root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = Path(
    os.environ.get("CHORUS_FIXTURES", str(REPO.parent / "shared" / "fixtures"))
)
os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "0")

# `chorus serve` keeps rooms in SQLite under the user's data directory by default; a test server
# (in-process or a subprocess, which inherits this) keeps them in memory unless the test names a
# store, so tests neither write to the user's data nor see rooms an earlier run left there.
os.environ.setdefault("CHORUS_STORE_URL", "memory://")

pytest_plugins = ["tests.store_fixtures"]  # new_store / new_kit: every store the rooms tests run on


@pytest.fixture(scope="session")
def shared_fixtures() -> Path:
    if not SHARED_FIXTURES.is_dir():
        pytest.fail(f"shared fixtures not found at {SHARED_FIXTURES} (set CHORUS_FIXTURES)")
    return SHARED_FIXTURES
