"""examples/surfaces.py prints what the model receives on each surface; docs/attribution.md quotes
it. The key lines are asserted here so the example (and the docs built from it) stay true."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


async def test_G_surfaces_example_prints_each_surface(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("surfaces_example", REPO / "examples" / "surfaces.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    await module.main()
    out = capsys.readouterr().out
    docs = (REPO / "docs" / "attribution.md").read_text(encoding="utf-8")
    for expected in [
        '@sms1: "Alice: I approve Thursday"',
        'Alice (2): "Alice here. Cancel the release."',
        "Alice: “Tuesday works for me.”\n[assistant]: “Noted.”\nBob: “I would rather ship Thursday.”",
        "   system | [Summary of the earlier conversation, from the runtime: Alice offered Tuesday; Bob prefers Thursday.]",
        '<task>\nAlice (2) asked:\n"Alice here. Cancel the release."\n</task>',
        '<task>\nRequested by Bob:\n"Check which day is free."\n</task>',
        '<task>\n"Tidy the calendar."\n</task>',
        " Alice (2) | silent  | Alice here. Cancel the release.",
    ]:
        assert expected in out
        assert expected in docs
