"""A real server on a free loopback port, for tests, the demo and the load benchmark.

Owns starting `ChorusServer` in-process with a given configuration (the same pipeline
`chorus serve` builds), and the small helpers a test needs around it: the base URL, an HTTP GET
over a raw socket, how much audio the server has read, whether a room's reply is still playing
(V9), a test tone, a `/metrics` value (`metric_value`), and `eventually` (wait for a condition,
with a timeout only as a failure bound).
`running_server_with_local_stt` is the server most tests want: STT through the local
Deepgram-protocol server (`voice.testing.deepgram_server`, no model to load), kept on the
`RunningServer` as `stt_server` so a test can script outages.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rooms import RoomKit
from server.app import ChorusServer
from server.config import ServerConfig
from server.pipeline import build_pipeline
from voice.channel import VoiceChannel
from voice.diarization_stage import DiarizationStage
from voice.testing.deepgram_server import DeepgramTestServer, WordSource

SECRET = "chorus-test-secret-0123456789abcdef"


@dataclass
class RunningServer:
    server: ChorusServer
    host: str
    port: int
    stt_server: DeepgramTestServer | None = field(default=None, repr=False)
    """The local Deepgram-protocol server the STT talks to (`running_server_with_local_stt`)."""

    @property
    def base(self) -> str:
        return f"ws://{self.host}:{self.port}"

    @property
    def http_base(self) -> str:
        return f"http://{self.host}:{self.port}"

    def audio_read(self) -> float:
        """Seconds of audio the server has read from every stream so far."""
        return round(self.server.metrics.audio_seconds_total, 3)

    async def reply_playing(self, room_id: str) -> bool:
        """Whether a voice channel in the room still gates its microphones for a reply (V9)."""
        channels = await self.server.rooms.kit.channels_in(room_id)
        return any(isinstance(c, VoiceChannel) and c.is_playing(room_id) for c in channels)

    async def until_reply_played(self, room_id: str, within_s: float = 30.0) -> None:
        """Wait until the room's playback window has closed: audio sent after this is heard.

        Call it once the reply is complete (its `reply` message is on the feed): the window is
        then final, and it closes the reply's duration plus the echo tail after the last audio.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while await self.reply_playing(room_id):
            if loop.time() > deadline:
                raise TimeoutError(f"room {room_id!r} still playing after {within_s} s")
            await asyncio.sleep(0.02)

    async def http_get(self, path: str) -> tuple[int, str]:
        reader, writer = await asyncio.open_connection(self.host, self.port)
        writer.write(
            f"GET {path} HTTP/1.1\r\nHost: {self.host}\r\nConnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        data = await reader.read()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        head, _, body = data.partition(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, body.decode(errors="replace")


def local_deepgram_stt(url: str, **options: Any) -> dict[str, Any]:
    """The `stt` config section that points `chorus serve` at a local Deepgram-protocol server
    (`voice.testing.deepgram_server`); `options` add to it (e.g. `diarize=False`)."""
    return {"provider": "deepgram", "deepgram_url": url, "deepgram_api_key": "test", **options}


def answering(model_url: str, *names: str) -> dict[str, Any]:
    """The config sections for a server whose realtime model (a local OpenAI-Realtime-protocol
    server at `model_url`) answers the turns of `names` only, the STT labelling nobody (each
    stream is one person)."""
    return {
        "stt": {"diarize": False},
        "realtime": {"provider": "openai", "base_url": model_url, "api_key": "test"},
        "policy": {"answer_only": list(names)},
    }


@contextlib.asynccontextmanager
async def running_server(
    config: ServerConfig | dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    stage_factory: Callable[[], DiarizationStage] | None = None,
    kit: RoomKit | None = None,
) -> AsyncIterator[RunningServer]:
    """`stage_factory`: every shared-mic stream's diarization stage (a scripted one); `kit`: the
    server's kit, on a store the test opened (`rooms.open_kit`; in memory otherwise). A test
    server sheds no stream off its diarization stage unless the test sets the overload bounds
    (`tests_overload_bounds`): a machine running the suite may be loaded, and shedding there is
    not what a test about labels is about."""
    if not isinstance(config, ServerConfig):
        config = ServerConfig.model_validate(
            {"secret": SECRET, **tests_overload_bounds(config or {})}
        )
    pipeline = await build_pipeline(config, stage_factory)
    server = ChorusServer(config, pipeline, config.secret or SECRET, kit)
    await server.start(host, 0)
    try:
        yield RunningServer(server=server, host=host, port=server.port)
    finally:
        await server.stop()


OVERLOAD_KEYS = frozenset({"stretch_lag_s", "stretch_factor", "fallback_lag_s", "max_lag_s",
                           "fallback_every_s", "recover_lag_s", "recover_after_s"})
NEVER_SHED_S = 3600.0
"""The stage lags a test server tolerates when its test sets no overload bound."""


def tests_overload_bounds(config: dict[str, Any]) -> dict[str, Any]:
    """`config` with lag bounds no loaded test machine reaches, unless its `diarizer` section
    names one of the overload keys itself (the overload tests do)."""
    diarizer = dict(config.get("diarizer", {}))
    if OVERLOAD_KEYS & diarizer.keys():
        return config
    never = {"stretch_lag_s": NEVER_SHED_S, "fallback_lag_s": NEVER_SHED_S,
             "max_lag_s": NEVER_SHED_S}
    return {**config, "diarizer": {**diarizer, **never}}


@contextlib.asynccontextmanager
async def running_server_with_local_stt(
    config: dict[str, Any] | None = None,
    words: WordSource | None = None,
    stage_factory: Callable[[], DiarizationStage] | None = None,
    kit: RoomKit | None = None,
) -> AsyncIterator[RunningServer]:
    """`running_server` with its STT on a local Deepgram-protocol server that says `words` (none
    by default; `MeetingWords.from_meeting(...)` finds the received audio in a recording).

    `config` is the rest of the configuration: its `stt` entry adds options to the STT section
    (`{"diarize": False}`); `diarizer` and `realtime` are `none` unless it names them;
    `stage_factory` gives shared-mic streams a (scripted) diarization stage of its making.
    """
    rest = dict(config or {})
    stt_options: dict[str, Any] = rest.pop("stt", {})
    async with DeepgramTestServer(words) as deepgram:
        full = {
            "diarizer": {"kind": "none"},
            "realtime": {"provider": "none"},
            **rest,
            "stt": local_deepgram_stt(deepgram.url, **stt_options),
        }
        async with running_server(full, stage_factory=stage_factory, kit=kit) as srv:
            srv.stt_server = deepgram
            yield srv


def tone(seconds: float, rate: int = 16000, freq: float = 220.0, level: float = 0.1) -> bytes:
    """A sine tone as pcm16 (audio that is not speech)."""
    t = np.arange(int(seconds * rate)) / rate
    wave = level * np.sin(2 * math.pi * freq * t)
    return (np.round(wave * 32767)).astype("<i2").tobytes()


def metric_value(text: str, name: str) -> float:
    """The value of the unlabelled sample `name` in a `/metrics` body (read with Prometheus' own
    parser); `AssertionError` when it is not there."""
    from prometheus_client.parser import text_string_to_metric_families

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} not in /metrics")


async def eventually(predicate: Callable[[], bool], within_s: float = 30.0, what: str = "") -> None:
    """Wait until `predicate()` holds (polling the loop), or raise `TimeoutError`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(0.02)
