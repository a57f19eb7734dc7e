"""A few seconds of each speaker's voice, for the page's speakers panel (issue 27.4).

Who is "Speaker B"? The panel plays the last seconds that voice said, so whoever renames a
speaker can tell the voices apart. `VoiceExcerpts` keeps, per speaker of one live room (the
stream and the raw label the page keys a speaker by), the most recent `EXCERPT_SECONDS` of
their committed turns' audio, as 16 kHz PCM16, in memory only: it goes with the room (deleted,
or evicted when idle, `server.live`), is never written to the store, a transcript, a log or a
metric, and is bounded per speaker and in speakers per room (the least recently heard leaves).
`GET /v1/rooms/{room}/speakers/excerpt` serves it as a WAV (the `feed` grant: whoever reads the
room's words may hear its voices).
"""

from __future__ import annotations

import io
import wave
from collections import OrderedDict, deque

EXCERPT_RATE = 16_000
"""Samples per second of what is kept and served."""
EXCERPT_SECONDS = 4.0
"""Seconds of each speaker's most recent speech kept."""
MAX_SPEAKERS = 64
"""Speakers kept per room; past it, the least recently heard speaker's excerpt is dropped."""

SpeakerKey = tuple[str | None, str | None]
"""(stream id, raw speaker label): a shared mic's voices by label; a one-person stream's by its
stream, with no label. The page keys its speaker rows the same way."""

_BYTES_PER_SECOND = EXCERPT_RATE * 2


class VoiceExcerpts:
    """The last seconds of each speaker's committed speech in one room."""

    def __init__(self, seconds: float = EXCERPT_SECONDS, max_speakers: int = MAX_SPEAKERS) -> None:
        self.limit = int(seconds * EXCERPT_RATE) * 2
        self.max_speakers = max_speakers
        self._pieces: OrderedDict[SpeakerKey, deque[bytes]] = OrderedDict()

    def take(self, key: SpeakerKey, pcm16: bytes) -> None:
        """A committed turn's audio (16 kHz PCM16) of speaker `key`: its tail joins their excerpt."""
        if len(pcm16) < 2:
            return
        pcm16 = pcm16[-self.limit :] if len(pcm16) > self.limit else pcm16
        pcm16 = pcm16[: len(pcm16) - len(pcm16) % 2]
        pieces = self._pieces.pop(key, None) or deque()
        pieces.append(pcm16)
        total = sum(len(p) for p in pieces)
        while total - len(pieces[0]) >= self.limit:  # keep the newest pieces that fill the limit
            total -= len(pieces.popleft())
        self._pieces[key] = pieces  # the most recently heard last
        while len(self._pieces) > self.max_speakers:
            self._pieces.popitem(last=False)

    def pcm16(self, key: SpeakerKey) -> bytes | None:
        """The speaker's kept speech, oldest first, at most `limit` bytes; None if none."""
        pieces = self._pieces.get(key)
        if not pieces:
            return None
        joined = b"".join(pieces)
        return joined[-self.limit :]

    def wav(self, key: SpeakerKey) -> bytes | None:
        """The speaker's excerpt as a mono 16-bit WAV file; None if nothing of them is kept."""
        pcm = self.pcm16(key)
        if pcm is None:
            return None
        out = io.BytesIO()
        with wave.open(out, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(EXCERPT_RATE)
            w.writeframes(pcm)
        return out.getvalue()

    def seconds(self, key: SpeakerKey) -> float:
        pcm = self.pcm16(key)
        return 0.0 if pcm is None else len(pcm) / _BYTES_PER_SECOND

    def __len__(self) -> int:
        return len(self._pieces)
