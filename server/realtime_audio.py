"""Audio mode (rule R3) on the server: every stream's audio handed to the room's realtime channel.

Owns `RealtimeAudioTap`, one per stream when `realtime.audio = true`. It pushes to
`RealtimeChannel.push_audio(room, pcm16, 16000, stream_id=<voice_session_id>)` exactly the
samples the stream's `VoiceSession` accepted — read back from the session's `AudioLog`, after
the session decoded them with `voice.audio.FrameDecoder` (pcm16 or µ-law, any rate and channel
count, resampled to 16 kHz) and after the V9 playback gate — in the same order. So stream time 0
at the channel is the session's first sample, the point the turns' `start`/`end` count from, and
a turn's span cuts the audio the STT heard for it.

Why it is shaped so:
- The audio path never waits for it. A frame's push only sets an event; the tap's own task copies
  what the session accepted since the last push, at most every `interval` seconds, so a slow or
  failing realtime side costs the audio path nothing and never touches another stream.
- A turn never reaches the channel before its audio: the pipeline's `ON_TRANSCRIPTION` hook calls
  `sync()` for the turn's stream just before the turn is committed (this matters at the end of a
  stream, where the decoder's last samples and the last turns come in one call).
- The clock is never broken. A push that fails (the room's realtime session is not attached yet,
  say) is retried later from the same sample; audio the session's log no longer holds is bridged
  with silence up to `MAX_GAP_S`. Past that the stream's audio is switched off for the realtime
  side (its turns go as text lines) rather than misattributed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

import numpy as np

from realtime import RealtimeChannel
from voice.audio import STT_SAMPLE_RATE, AudioLog, float_to_pcm16

log = logging.getLogger(__name__)

PUSH_INTERVAL_S = 0.1
"""The tap pushes at most this often (frames in between are pushed together)."""
RETRY_S = 1.0
"""After a failed push, wait this long before trying again."""
MAX_GAP_S = 30.0
"""Audio the session's log dropped before it was pushed is bridged with silence up to this much."""


class TappedSession(Protocol):
    """What the tap reads of a `voice.channel.VoiceSession`."""

    room_id: str
    id: str
    audio: AudioLog
    """The samples the session accepted (16 kHz mono float32), by session sample index."""


class RealtimeAudioTap:
    """The audio of one `VoiceSession`, pushed to the room's `RealtimeChannel` (audio mode)."""

    def __init__(
        self,
        channel: RealtimeChannel,
        session: TappedSession,
        *,
        interval: float = PUSH_INTERVAL_S,
        retry_s: float = RETRY_S,
    ) -> None:
        self.channel = channel
        self.session = session
        self.room_id = session.room_id
        self.stream_id = session.id
        self.interval = interval
        self.retry_s = retry_s
        self.pushed = 0
        """Session samples handed to the channel so far (the channel's stream position)."""
        self.failures = 0
        self.off = False
        """The stream's audio could not be kept on the session's clock: no more pushes."""
        self._retry_at = 0.0
        self._failing = False
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = asyncio.get_running_loop().create_task(
            self._run(), name=f"realtime-audio-{self.stream_id}"
        )

    def notify(self) -> None:
        """The session accepted audio (called on the audio path: never blocks)."""
        self._wake.set()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                await self.sync()
            except Exception:  # never let the tap die silently; the next wake tries again
                log.exception("realtime audio of stream %s failed", self.stream_id)
            await asyncio.sleep(self.interval)

    async def sync(self) -> None:
        """Push everything the session accepted since the last push (never raises)."""
        async with self._lock:  # the task and the turn hook may both call it: push each sample once
            await self._sync()

    async def _sync(self) -> None:
        if self.off:
            return
        audio = self.session.audio
        total = audio.total
        if total <= self.pushed or time.monotonic() < self._retry_at:
            return
        gap = max(0, audio.first - self.pushed)
        if gap > MAX_GAP_S * STT_SAMPLE_RATE:
            self.off = True
            log.error(
                "stream %s: %.0f s of audio never reached the realtime channel; its audio is "
                "off for the realtime model from now on (its turns go as text lines)",
                self.stream_id,
                gap / STT_SAMPLE_RATE,
            )
            return
        samples: np.ndarray[Any, Any] = audio.samples(self.pushed, total)
        if gap:
            samples = np.concatenate([np.zeros(gap, np.float32), samples])
        try:
            await self.channel.push_audio(
                self.room_id, float_to_pcm16(samples), STT_SAMPLE_RATE, stream_id=self.stream_id
            )
        except Exception as exc:
            self.failures += 1
            self._retry_at = time.monotonic() + self.retry_s
            if not self._failing:
                log.warning(
                    "stream %s: could not push audio to the realtime channel (%s); retrying",
                    self.stream_id,
                    exc,
                )
            self._failing = True
            return
        if self._failing:
            log.info("stream %s: realtime audio flows again", self.stream_id)
            self._failing = False
        self.pushed = total

    async def close(self) -> None:
        """End of stream (after its last turns were committed): stop, and let the channel
        forget the stream's leftover audio (what no turn claimed)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.channel.forget_stream(self.room_id, self.stream_id)


class DropWarningThrottle(logging.Filter):
    """Lets `RealtimeChannel`'s "dropped … of audio no turn claimed" warning through at most once
    per `every` seconds per process: a stream that is silent for longer than the channel holds
    audio would otherwise log it on every push."""

    def __init__(self, every: float = 60.0) -> None:
        super().__init__()
        self.every = every
        self._last = -float("inf")
        self.suppressed = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "no turn claimed" not in str(record.msg):
            return True
        now = time.monotonic()
        if now - self._last < self.every:
            self.suppressed += 1
            return False
        self._last = now
        return True


_THROTTLE = DropWarningThrottle()


def throttle_drop_warnings() -> None:
    """Install the throttle on the realtime channel's logger (once)."""
    logger = logging.getLogger("realtime.channel")
    if _THROTTLE not in logger.filters:
        logger.addFilter(_THROTTLE)
