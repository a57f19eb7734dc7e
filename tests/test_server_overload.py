"""Issue 31, item 2: when the live diarization stage falls behind, the server degrades instead of
queueing without bound — it stretches a stream's step, then takes the streams it cannot keep up
with off the stage (their speakers from the STT, the device told), refuses new shared-mic streams
while it must, and recovers; `/healthz` and `/metrics` say so (item 3).

The policy is one pure state machine (`server.overload.OverloadPolicy`), tested here as tables of
lags over time; the server's side runs a real server whose stage is scripted: a stage that answers
only when the test lets it (a `threading.Event`), so "the stage is slow" is an event the test
controls, never a sleep."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from websockets.exceptions import ConnectionClosed

from server.auth import issue_token
from server.client import DeviceStream
from server.overload import (
    MAX_BACKOFF,
    FallBack,
    OverloadBounds,
    OverloadPolicy,
    Return,
    StreamMode,
    Stretch,
)
from server.protocol import (
    CloseCode,
    DiarizationStatusMessage,
    FeedMessage,
    StartMessage,
    TurnMessage,
)
from server.testing.harness import (
    SECRET,
    eventually,
    metric_value,
    running_server_with_local_stt,
    tone,
)
from voice.audio import AudioLog, float_to_pcm16, read_audio_16k
from voice.diarization_stage import Audio, SpeakerSegment, SpeakerTimeline, StageAbilities
from voice.stage_driver import StageDriver
from voice.testing.deepgram_server import MeetingWords

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"

BOUNDS = OverloadBounds(stretch_lag_s=1.0, stretch_factor=2.0, fallback_lag_s=2.0,
                        max_lag_s=4.0, fallback_every_s=1.0, recover_lag_s=0.5,
                        recover_after_s=10.0)


def policy(*streams: str, can_stretch: bool = True) -> OverloadPolicy:
    p = OverloadPolicy(BOUNDS)
    for i, name in enumerate(streams):
        p.joined(name, float(i), can_stretch=can_stretch)
    return p


# --------------------------------------------------------------------------- the pure policy


def test_a_lagging_stream_is_stretched_first_then_falls_back() -> None:
    p = policy("a")
    assert p.observe(10.0, {"a": 0.3}) == []
    assert p.observe(11.0, {"a": 1.2}) == [Stretch("a", 2.0)]
    assert p.mode("a") is StreamMode.STRETCHED
    assert p.observe(12.0, {"a": 1.8}) == []  # stretched, under the fallback bound
    [action] = p.observe(13.0, {"a": 2.5})
    assert isinstance(action, FallBack) and action.stream == "a" and "2.5 s behind" in action.reason
    assert p.mode("a") is StreamMode.FALLBACK and not p.admitting


def test_a_stage_that_cannot_stretch_falls_back_without_stretching() -> None:
    p = policy("a", can_stretch=False)
    assert p.observe(10.0, {"a": 1.5}) == []
    [action] = p.observe(11.0, {"a": 2.1})
    assert isinstance(action, FallBack)


def test_one_stream_at_a_time_leaves_the_stage_the_last_to_join_first() -> None:
    p = policy("old", "mid", "new")
    p.observe(10.0, {"old": 1.5, "mid": 1.5, "new": 1.5})  # all stretched
    first = p.observe(11.0, {"old": 2.5, "mid": 2.5, "new": 2.5})
    assert [a.stream for a in first] == ["new"]
    assert p.observe(11.5, {"old": 2.6, "mid": 2.6}) == []  # within fallback_every_s
    assert [a.stream for a in p.observe(12.0, {"old": 2.7, "mid": 2.7})] == ["mid"]
    assert p.mode("old") is StreamMode.STRETCHED


def test_the_share_of_streams_shed_is_the_share_the_worst_lag_is_over_the_bound() -> None:
    names = [f"s{i}" for i in range(10)]
    p = policy(*names)
    p.observe(10.0, dict.fromkeys(names, 1.5))
    out = p.observe(11.0, dict.fromkeys(names, 3.0))  # a third over the bound: 4 of 10
    assert [a.stream for a in out] == ["s9", "s8", "s7", "s6"]


def test_past_max_lag_every_stream_over_it_falls_back_at_once() -> None:
    p = policy("a", "b", "c")
    p.observe(10.0, {"a": 1.5, "b": 1.5, "c": 1.5})
    out = p.observe(11.0, {"a": 4.5, "b": 4.2, "c": 2.5})
    assert sorted(a.stream for a in out if isinstance(a, FallBack)) == ["a", "b"]
    assert p.mode("c") is StreamMode.STRETCHED


def test_a_calm_stage_unstretches_then_takes_the_fallen_back_stream_back() -> None:
    p = policy("a", "b")
    p.observe(0.0, {"a": 1.5, "b": 1.5})
    p.observe(1.0, {"a": 2.5, "b": 2.5})  # b (newest) falls back
    assert p.mode("b") is StreamMode.FALLBACK
    # b's last stage call is still out (None): no return, however calm the stage
    assert p.observe(2.0, {"a": 0.2, "b": None}) == []
    assert p.observe(12.5, {"a": 0.2, "b": None}) == [Stretch("a", 1.0)]
    assert p.observe(13.0, {"a": 0.2, "b": 0.0}) == [Return("b"), Stretch("b", 2.0)]
    assert p.mode("b") is StreamMode.STRETCHED and p.admitting
    counts = p.load().counts
    assert (counts.stretches, counts.fallbacks, counts.recoveries) == (2, 1, 1)


def test_no_return_while_a_stream_on_the_stage_lags() -> None:
    p = policy("a", "b")
    p.observe(0.0, {"a": 1.5, "b": 1.5})
    p.observe(1.0, {"a": 2.5, "b": 2.5})
    assert p.observe(20.0, {"a": 0.9, "b": 0.0}) == []  # a is over recover_lag_s
    assert p.observe(25.0, {"a": 0.1, "b": 0.0}) == []  # calm only since 25
    assert p.observe(35.0, {"a": 0.1, "b": 0.0}) == [Stretch("a", 1.0), Return("b"),
                                                      Stretch("b", 2.0)]


def test_a_stream_that_falls_back_soon_after_returning_waits_twice_as_long_each_time() -> None:
    """A stage that keeps up only while the stream is off it: each return that ends in a fallback
    sooner than the stream had waited doubles its next wait (up to `MAX_BACKOFF` times
    `recover_after_s`), so it does not flap every `recover_after_s`; a stream that stayed back as
    long as it had waited starts again from `recover_after_s`."""
    p = policy("a", can_stretch=False)
    t = 0.0

    def falls_back() -> None:
        nonlocal t
        t += 1.0
        [action] = p.observe(t, {"a": 5.0})
        assert isinstance(action, FallBack)

    def returns_after(wait: float) -> None:
        nonlocal t
        fell = t
        t = fell + wait - 0.5
        assert p.observe(t, {"a": 0.0}) == []  # not yet
        t = fell + wait
        assert p.observe(t, {"a": 0.0}) == [Return("a")]

    falls_back()
    returns_after(10.0)  # recover_after_s
    falls_back()  # 1 s after returning, sooner than the 10 s it waited
    returns_after(20.0)
    falls_back()
    returns_after(40.0)
    for wait in (80.0, 160.0, 160.0):  # up to MAX_BACKOFF times recover_after_s
        falls_back()
        returns_after(wait)
    assert MAX_BACKOFF * BOUNDS.recover_after_s == 160.0
    t += 160.0  # back as long as it had waited: the next fallback starts over
    falls_back()
    returns_after(10.0)
    assert p.load().counts.recoveries == 7


def test_a_stream_in_its_backoff_lets_another_that_fell_back_return_first() -> None:
    p = policy("a", "b", can_stretch=False)
    p.observe(1.0, {"a": 0.0, "b": 5.0})  # b falls back
    assert p.observe(11.0, {"a": 0.0, "b": 0.0}) == [Return("b")]
    p.observe(12.0, {"a": 0.0, "b": 5.0})  # and again, 1 s later: b waits 20 s now
    p.observe(13.0, {"a": 5.0, "b": 0.0})  # a falls back too: it waits 10 s
    assert p.observe(23.0, {"b": 0.0, "a": 0.0}) == [Return("a")]  # a first, b still waiting
    assert p.mode("b") is StreamMode.FALLBACK


def test_the_stage_load_says_how_far_behind_and_whether_it_admits() -> None:
    p = policy("a", "b")
    p.observe(0.0, {"a": 1.0, "b": 0.5})
    load = p.load()
    assert (load.lag_s, load.on_stage, load.admitting, load.load) == (1.0, 2, True, 0.5)
    p.observe(1.0, {"a": 1.5, "b": 2.5})
    p.observe(2.0, {"a": 1.5, "b": 2.5})
    load = p.load()
    assert (load.fallback, load.admitting, load.load) == (1, False, 1.0)
    p.left("b")  # the stream that fell back ended: the stage admits again
    assert p.admitting


def test_bounds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="recover_lag_s <= stretch_lag_s"):
        OverloadBounds(stretch_lag_s=3.0, fallback_lag_s=2.0)


# --------------------------------------------------------------------------- the driver


class GatedStage:
    """A scripted stage that answers a feed only once `gate` is set (the test's hand on its
    speed); every voice is `Speaker A`. Declares `stretches_step` and records the factors."""

    sample_rate = 16000
    abilities = StageAbilities(stretches_step=True)

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        self.fed = 0
        self.factors: list[float] = []
        self.resets = 0

    def feed(self, audio: Audio) -> SpeakerTimeline:
        self.entered.set()
        if not self.gate.wait(timeout=60):
            raise RuntimeError("the test never let the stage answer")
        self.fed += len(audio)
        return SpeakerTimeline([SpeakerSegment(0.0, self.fed / 16000, "Speaker A")])

    def stretch(self, factor: float) -> None:
        self.factors.append(factor)

    def diarize(self, audio: Audio, *, num_speakers: int | None = None,
                max_speakers: int | None = None) -> SpeakerTimeline:
        return SpeakerTimeline()

    def enroll(self, name: str, audio: Audio) -> None:
        raise NotImplementedError

    def forget(self, name: str) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        self.resets += 1
        self.fed = 0


def _driver(stage: GatedStage, log: AudioLog) -> tuple[StageDriver, list[SpeakerTimeline]]:
    views: list[SpeakerTimeline] = []
    driver = StageDriver(stage, log, step=0.2, since=lambda: 0.0,
                         on_view=lambda decided, _u, _h: views.append(decided),
                         on_handover=lambda _at, _s: None)
    return driver, views


async def test_the_driver_measures_lag_and_a_suspend_frees_whoever_waits_on_a_stuck_stage() -> None:
    stage, log = GatedStage(), AudioLog()
    driver, views = _driver(stage, log)
    stage.gate.clear()
    log.append(np.zeros(16000, np.float32))
    stuck = asyncio.create_task(driver.feed())
    await asyncio.to_thread(stage.entered.wait, 30)
    log.append(np.zeros(8000, np.float32))
    assert driver.lag == pytest.approx(1.5) and driver.in_flight
    waiting = asyncio.create_task(driver.feed())  # a second caller waits for the lock
    await asyncio.sleep(0)
    driver.suspend()
    async with asyncio.timeout(30):
        await asyncio.gather(stuck, waiting)  # both let go although the stage still runs
    assert driver.in_flight and driver.lag == 0.0 and views == []
    stage.gate.set()  # the stage answers: the driver's lock is let go then
    await eventually(lambda: not driver.in_flight, 30, "the stage's call to return")
    # back on the stage: afresh, from the audio accepted from now on, in stream time
    driver.resume()
    log.append(np.zeros(16000, np.float32))
    driver.stretch(2.0)
    await driver.feed()
    assert stage.resets == 1 and stage.factors == [2.0] and driver.step == pytest.approx(0.4)
    assert views[-1].segments == [SpeakerSegment(1.5, 2.5, "Speaker A")]
    assert driver.lag == 0.0


async def test_feeds_waiting_on_a_slow_stage_leave_the_loops_threads_free() -> None:
    """Every stream's feed waits in its own thread for the shared model service: more streams
    than the loop's default executor has threads all get their windows in (the service can
    batch them all), and `asyncio.to_thread` work (a new stream's stage, Whisper's VAD) still
    runs at once. In the default executor the first min(32, cores + 4) feeds held every thread."""
    default_threads = min(32, (os.cpu_count() or 1) + 4)
    stages = [GatedStage() for _ in range(default_threads + 2)]
    feeds = []
    for stage in stages:
        stage.gate.clear()
        log = AudioLog()
        driver, _views = _driver(stage, log)
        log.append(np.zeros(8000, np.float32))
        feeds.append(asyncio.create_task(driver.feed()))
    try:
        async with asyncio.timeout(30):
            for stage in stages:  # every feed is in its stage call at once
                await asyncio.to_thread(stage.entered.wait, 30)
            assert await asyncio.to_thread(lambda: "free") == "free"
        assert all(stage.entered.is_set() for stage in stages)
    finally:
        for stage in stages:
            stage.gate.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*feeds)


# --------------------------------------------------------------------------- over real sockets


async def _send_until(device: DeviceStream, done: asyncio.Event, chunk_s: float = 0.1) -> None:
    """Stream tone to the device's socket until `done` (the proof the test waits for)."""
    async with asyncio.timeout(60):
        while not done.is_set():
            await device.send_audio(tone(chunk_s), chunk_s=chunk_s, realtime=False)
            await asyncio.sleep(0.01)  # let the server read and answer (the bound is the event)


async def test_a_slow_stage_stretches_falls_back_refuses_and_recovers_and_says_so() -> None:
    stages: list[GatedStage] = []

    def make_stage() -> GatedStage:
        stages.append(GatedStage())
        return stages[-1]

    statuses: list[DiarizationStatusMessage] = []
    degraded, recovered = asyncio.Event(), asyncio.Event()

    def seen(message: FeedMessage) -> None:
        if isinstance(message, DiarizationStatusMessage):
            statuses.append(message)
            (degraded if message.status == "degraded" else recovered).set()

    config = {
        "stt": {"diarize": False},
        "diarizer": {"stretch_lag_s": 0.5, "fallback_lag_s": 1.0, "max_lag_s": 10.0,
                     "fallback_every_s": 0.0, "recover_lag_s": 0.5, "recover_after_s": 0.0,
                     "overload_check_s": 0.0},
    }
    async with running_server_with_local_stt(config, stage_factory=make_stage) as server:
        token = issue_token(SECRET, "r1")
        device = await DeviceStream.open(server.base, "r1", token,
                                         StartMessage(participant="room-1"), on_message=seen)
        stage = None
        try:
            await eventually(lambda: bool(stages), 60, "the stream's stage")
            stage = stages[0]
            stage.gate.clear()  # the stage stops answering: its lag grows with the audio
            await _send_until(device, degraded)
            status, body = await server.http_get("/metrics")
            assert metric_value(body, "chorus_diarization_stretches_total") == 1.0
            assert metric_value(body, "chorus_diarization_fallbacks_total") == 1.0
            assert metric_value(body, "chorus_diarization_admitting") == 0.0
            assert metric_value(body, "chorus_load") == 1.0
            status, body = await server.http_get("/healthz?max_load=0.9")
            health = json.loads(body)
            assert status == 503 and health["status"] == "overloaded"
            assert health["stage"]["fallback"] == 1 and not health["stage"]["admitting"]
            # a new shared-mic stream is refused while the stage sheds streams
            other = await DeviceStream.open(server.base, "r2", issue_token(SECRET, "r2"),
                                            StartMessage(participant="room-2"))
            assert other._reader is not None
            async with asyncio.timeout(30):
                await other._reader
            assert other.ws.close_code == CloseCode.TOO_MANY_STREAMS
            assert "diarization stage cannot keep up" in (other.ws.close_reason or "")
            # a one-person stream needs no stage: still admitted
            solo = await DeviceStream.open(server.base, "r2", issue_token(SECRET, "r2"),
                                           StartMessage(participant="solo", shared_mic=False))
            # the stage answers again: the stream goes back on it, and the device hears it
            stage.gate.set()
            await _send_until(device, recovered)
            await device.send_audio(tone(0.5), realtime=False)  # heard by the stage afresh
            async with asyncio.timeout(60):
                await solo.stop()
                await device.stop()
            status, body = await server.http_get("/metrics")
        finally:
            if stage is not None:
                stage.gate.set()
            with contextlib.suppress(ConnectionClosed):
                await device.ws.close()
    assert [(m.status, m.speakers) for m in statuses] == [("degraded", "stt"),
                                                          ("recovered", "stage")]
    assert "behind" in (statuses[0].reason or "") and statuses[0].stream
    assert stage.resets >= 1 and stage.fed > 0  # back on the stage: reset, then fed afresh
    assert metric_value(body, "chorus_diarization_recoveries_total") == 1.0
    assert server.server.metrics.refused_total["diarization_overloaded"] == 1


async def test_words_waiting_on_a_stuck_stage_go_on_as_one_speaker_once_it_falls_back() -> None:
    """The STT labels nobody here (`diarize = false`): a stream off the stage is one speaker,
    and the words that waited for the stuck stage are not lost with it."""
    stages: list[GatedStage] = []

    def make_stage() -> GatedStage:
        stages.append(GatedStage())
        stages[-1].gate.clear()  # it never answers while the test runs
        return stages[-1]

    degraded, turned = asyncio.Event(), asyncio.Event()

    def seen(message: FeedMessage) -> None:
        if isinstance(message, DiarizationStatusMessage) and message.status == "degraded":
            degraded.set()
        if isinstance(message, TurnMessage) and degraded.is_set():
            turned.set()

    config = {"stt": {"diarize": False},
              "diarizer": {"stretch_lag_s": 1.0, "fallback_lag_s": 2.0, "max_lag_s": 4.0,
                           "fallback_every_s": 0.0, "overload_check_s": 0.0}}
    meeting = read_audio_16k(MEETING / "meeting.wav")
    try:
        async with running_server_with_local_stt(
            config, MeetingWords.from_meeting(MEETING), stage_factory=make_stage
        ) as server:
            device = await DeviceStream.open(
                server.base, "r1", issue_token(SECRET, "r1"),
                StartMessage(participant="room-1", name="Room 1"), on_message=seen)
            await device.send_audio(float_to_pcm16(meeting[: 12 * 16000]), realtime=False)
            async with asyncio.timeout(60):
                await turned.wait()
                await device.stop()
    finally:
        for stage in stages:
            stage.gate.set()
    turns = [m for m in device.received if isinstance(m, TurnMessage)]
    assert turns and {t.label for t in turns} == {None}
    assert {t.speaker for t in turns} == {"Room 1"}
