"""Issue 10 (early commit) over real sockets: a turn committed early from interim words and then
corrected in place by the final result reaches the device and the room's feed again, as a `turn`
with the same `event_id` and `corrected: true`, and counts once in `/metrics`."""

from __future__ import annotations

import asyncio

import numpy as np

from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import FeedMessage, StartMessage, TurnMessage
from server.testing.harness import SECRET, metric_value, running_server_with_local_stt
from voice.audio import float_to_pcm16
from voice.testing.deepgram_server import ScriptedWords, SpokenWord

SILENCE = float_to_pcm16(np.zeros(16000 * 5, np.float32))



class Turns:
    """The `turn` messages one reader got, in arrival order; a test waits for the n-th."""

    def __init__(self) -> None:
        self.turns: list[TurnMessage] = []
        self._arrived = asyncio.Condition()

    async def __call__(self, message: FeedMessage) -> None:
        if isinstance(message, TurnMessage):
            async with self._arrived:
                self.turns.append(message)
                self._arrived.notify_all()

    async def reach(self, n: int, within_s: float = 60.0) -> None:
        async with self._arrived:
            await asyncio.wait_for(self._arrived.wait_for(lambda: len(self.turns) >= n), within_s)


async def test_a_corrected_early_turn_reaches_the_device_and_the_feed_again() -> None:
    words = ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello.")],
        [SpokenWord("hi", 1.0, 1.2, 1, "Hi.")],
        [SpokenWord("right", 2.0, 2.3, 0, "Right."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")],
    ])
    device_seen, feed_seen = Turns(), Turns()
    async with running_server_with_local_stt({}, words) as server:
        assert server.stt_server is not None
        server.stt_server.interim_every = 1000.0  # no interims but the one the test sends
        feed = await EventFeed.open(server.base, "r1", issue_token(SECRET, "r1", grants=("feed",)),
                                    on_message=feed_seen)
        device = await DeviceStream.open(
            server.base, "r1", issue_token(SECRET, "r1"),
            StartMessage(participant="room-1", sample_rate=16000, shared_mic=True),
            on_message=device_seen,
        )
        await device.send_audio(SILENCE[: 2 * 16000 * 18 // 10], realtime=False)  # 1.8 s
        await device_seen.reach(2)  # "Hello." and "Hi." are final
        wrong = [SpokenWord("write", 2.0, 2.3, 0, "Write."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")]
        interim = server.stt_server._results("r", wrong, is_final=False, speech_final=False,
                                             from_finalize=False, start=2.0, duration=0.7)
        await server.stt_server.send_raw(interim.model_dump_json(exclude_none=True))
        await device_seen.reach(3)  # "Write." committed early, from the interim
        await device.send_audio(SILENCE[2 * 16000 * 18 // 10 :], realtime=False)
        async with asyncio.timeout(60):
            await device.stop()
        await feed_seen.reach(5)
        status, body = await server.http_get("/metrics")
        await feed.close()
    turns = device_seen.turns
    assert [(m.text, m.corrected) for m in feed_seen.turns] == [(m.text, m.corrected) for m in turns]
    assert [(m.text, m.corrected) for m in turns] == [
        ("Hello.", False), ("Hi.", False), ("Write.", False), ("Right.", True), ("Yes.", False)]
    assert turns[3].event_id == turns[2].event_id and turns[3].speaker == turns[2].speaker
    # what the device shows: each turn once, in its latest version
    assert [m.text for m in device.turns] == ["Hello.", "Hi.", "Right.", "Yes."]
    assert [m.text for m in feed.turns] == ["Hello.", "Hi.", "Right.", "Yes."]
    assert status == 200
    assert metric_value(body, "chorus_turns_total") == 4.0
    assert metric_value(body, "chorus_turn_corrections_total") == 1.0
