"""One connect/retry policy (issue 10, seams): the STT stream and the realtime session both retry
with `rooms.Backoff`."""

from __future__ import annotations

from realtime import RecorderSession
from rooms import Backoff
from voice.stt.base import SttStream
from voice.stt.deepgram import DeepgramSTT


async def _nothing(event: object) -> None:
    return None


def test_the_realtime_session_and_the_stt_stream_share_one_policy() -> None:
    session = RecorderSession(reconnect_delay=0.01, max_reconnect_delay=0.02)
    assert session.backoff == Backoff(first=0.01, factor=2.0, longest=0.02, attempts=None)
    bounded = RecorderSession(reconnect_forever=False, max_reconnect_attempts=3)
    assert bounded.backoff.attempts == 3
    policy = Backoff(first=0.5, longest=4.0, attempts=10)
    assert RecorderSession(backoff=policy).backoff is policy
    stream = SttStream(DeepgramSTT("k", url="ws://127.0.0.1:9"), _nothing, backoff=policy)
    assert stream.backoff is policy and isinstance(SttStream(DeepgramSTT("k"), _nothing).backoff, Backoff)
