"""The HTTP surface (issue 13.1, 13.3): declared routes, JSON problems, `/openapi.json`, and
`/metrics` as Prometheus' own parser reads it — over real HTTP."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server.auth import issue_token
from server.client import DeviceStream
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    local_deepgram_stt,
    running_server,
)
from voice.audio import float_to_pcm16, read_audio_16k

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"


def meeting_pcm16(seconds: float) -> bytes:
    return float_to_pcm16(read_audio_16k(MEETING / "meeting.wav")[: int(seconds * 16000)])


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


async def test_metrics_parse_with_prometheus_parser_and_count_what_happened(
    server: RunningServer,
) -> None:
    status, body = await server.http_get("/metrics")
    assert status == 200
    before = _samples(body)
    assert before[("chorus_turns_total", ())] == 0
    assert before[("chorus_streams", (("kind", "device"),))] == 0
    assert before[("chorus_turn_latency_seconds_count", ())] == 0
    token = issue_token(SECRET, "m1")
    device = await DeviceStream.open(
        server.base, "m1", token, StartMessage(participant="d", shared_mic=False)
    )
    await device.send_audio(meeting_pcm16(8.0), realtime=False)
    await eventually(lambda: server.server.metrics.turns_total >= 1, 30, "a turn")
    _, during = await server.http_get("/metrics")
    now = _samples(during)
    assert now[("chorus_streams", (("kind", "device"),))] == 1
    assert now[("chorus_streams_total", (("kind", "device"),))] == 1
    assert now[("chorus_rooms", ())] == 1
    assert now[("chorus_audio_seconds_total", ())] == pytest.approx(8.0)
    assert now[("chorus_turns_total", ())] >= 1
    assert now[("chorus_turn_latency_seconds_count", ())] >= 1
    assert now[("chorus_turn_latency_seconds_bucket", (("le", "+Inf"),))] >= 1
    async with asyncio.timeout(30):
        await device.stop()
    await server.http_get("/v1/rooms/m1/stream")  # not a websocket upgrade: refused over HTTP
    _, after = await server.http_get("/metrics")
    assert _samples(after)[("chorus_streams", (("kind", "device"),))] == 0


async def test_two_servers_keep_their_own_metrics() -> None:
    """A registry per server: a second server in the process starts from zero."""
    config = {
        "stt": local_deepgram_stt("ws://127.0.0.1:9"),
        "diarizer": {"kind": "none"},
        "realtime": {"provider": "none"},
    }
    async with running_server(config) as a, running_server(config) as b:
        a.server.metrics.turns_total = 5
        a.server.metrics.turn_latency.observe(0.4)
        _, text_a = await a.http_get("/metrics")
        _, text_b = await b.http_get("/metrics")
    assert _samples(text_a)[("chorus_turns_total", ())] == 5
    assert _samples(text_a)[("chorus_turn_latency_seconds_count", ())] == 1
    assert _samples(text_b)[("chorus_turns_total", ())] == 0
    assert _samples(text_b)[("chorus_turn_latency_seconds_count", ())] == 0


async def test_openapi_lists_every_http_route_with_models(server: RunningServer) -> None:
    status, body = await server.http_get("/openapi.json")
    assert status == 200
    spec = json.loads(body)
    paths = spec["paths"]
    for route in ("/", "/healthz", "/metrics"):
        assert "get" in paths[route], route
    health = paths["/healthz"]["get"]["responses"]["200"]["content"]["application/json"]
    assert health["schema"]["$ref"].endswith("/Health")
    assert {"Health", "Problem"} <= set(spec["components"]["schemas"])


async def test_http_errors_are_json_problems(server: RunningServer) -> None:
    status, body = await server.http_get("/nope")
    assert status == 404 and json.loads(body) == {"problem": "not_found", "detail": "Not Found"}
    status, body = await server.http_get("/v1/rooms/r1/stream")
    assert status == 426 and json.loads(body)["problem"] == "upgrade_required"
    status, body = await server.http_get("/healthz")
    health = json.loads(body)
    assert status == 200 and {k: health[k] for k in ("status", "rooms", "streams")} == {
        "status": "ok", "rooms": 0, "streams": 0}
    assert 0 <= health["cpu"] <= health["load"] <= 1
