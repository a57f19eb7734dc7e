"""Issue 23 (item 3) over real sockets: with `[stt] second_pass`, a turn the first pass misheard is
re-decoded whole by the real Whisper and corrected in place on every surface of the server: the
device and the feed get it again as a `turn` with the same `event_id` and `corrected: true`, the
realtime session is told (a correction note and the corrected line), and `/metrics` counts it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from realtime import RealtimeChannel
from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import StartMessage
from server.testing.harness import SECRET, eventually, running_server_with_local_stt
from voice.audio import float_to_pcm16, read_audio
from voice.testing.deepgram_server import ScriptedWords, SpokenWord

MEETING = "lsmeet_dev01_2spk_close"


def outcomes(metrics: str) -> dict[str, float]:
    return {s.labels["outcome"]: s.value
            for family in text_string_to_metric_families(metrics)
            for s in family.samples if s.name == "chorus_second_pass_total"}


async def test_a_turn_the_second_pass_mends_reaches_the_device_the_feed_and_the_model_again(
    shared_fixtures: Path,
) -> None:
    folder = shared_fixtures / "librispeech-meetings"
    ref = json.loads((folder / f"{MEETING}.seglst.json").read_text())[0]
    audio, rate = read_audio(folder / f"{MEETING}.flac")
    assert rate == 16000
    clip = audio[: int((ref["end_time"] + 1.5) * rate)]
    wrong = ["and", "third", "he", "is", "same", "as", "thou", "sickest"]
    span = ref["end_time"] - ref["start_time"]
    spoken = [SpokenWord(w, ref["start_time"] + i * span / len(wrong),
                         ref["start_time"] + (i + 0.8) * span / len(wrong), 0, w)
              for i, w in enumerate(wrong)]
    config = {"stt": {"diarize": False, "second_pass": "tiny.en"},
              "realtime": {"provider": "recorder"}}
    async with running_server_with_local_stt(config, ScriptedWords([spoken])) as server:
        feed = await EventFeed.open(server.base, "r1", issue_token(SECRET, "r1", grants=("feed",)))
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"),
            StartMessage(participant="room-1", sample_rate=16000, shared_mic=True))
        await device.send_audio(float_to_pcm16(clip), realtime=False)
        async with asyncio.timeout(120):
            await device.stop()  # the stream's end waits for its turns' second passes
        await eventually(lambda: len([m for m in feed.received if m.type == "turn"]) >= 2, 60,
                         "the corrected turn on the feed")
        status, metrics = await server.http_get("/metrics")
        channel = server.server.rooms.pipeline.realtime  # type: ignore[attr-defined]
        assert isinstance(channel, RealtimeChannel)
        lines = channel.lines_for("r1")
        await feed.close()
    turns = [m for m in feed.received if m.type == "turn"]
    first, fixed = turns
    assert first.text == " ".join(wrong) and not first.corrected
    assert fixed.corrected and fixed.event_id == first.event_id
    assert "seekest" in fixed.text.lower() and "happiness" in fixed.text.lower()
    assert [m.text for m in device.turns] == [fixed.text]  # the device shows the latest version
    assert [(m.text, m.corrected) for m in device.received if m.type == "turn"] == [
        (first.text, False), (fixed.text, True)]
    assert status == 200 and outcomes(metrics)["corrected"] == 1.0
    assert any("happiness" in line for line in lines), lines  # the model read the correction
