"""Whisper for a whole recording (issue 23, item 1): long stretches in the standard window.

Why a connection of its own: the live connection (`voice.stt.whisper.WhisperConnection`) cuts
speech into pieces of at most 4 s, decoded with a shortened encoder window and one temperature,
so that a turn comes back within a second; on far-field speech those cuts cost about 20 points of
WER (issue 23's table). `chorus transcribe` has no latency to meet. This connection gathers the
Silero VAD's speech regions into stretches of up to `max_stretch` (30 s: Whisper's trained
window), each cut only in a pause between regions (a region longer than the window at its
quietest frame near the end), decodes each with the full encoder window and faster-whisper's
temperature fallback (the previous stretch's text as the prompt only with `batch_prompt`: it
made things worse, measured), and sends each stretch's words back as one final result. The speakers are split after, word by word, by
the voice channel against the diarization timeline, exactly as for live results.

A stretch is decoded as soon as it is closed (the next speech would not fit the window), so a
long file is transcribed while it is read and the progress shows it.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from voice.audio import STT_SAMPLE_RATE, pcm16_to_float
from voice.stt.base import RawWord
from voice.stt.whisper import Decoded, QueuedWhisperConnection

if TYPE_CHECKING:
    from voice.stt.whisper import WhisperSTT

log = logging.getLogger(__name__)

FloatAudio = npt.NDArray[np.float32]
FRAME = 512
LONG_REGION_SEARCH = 3.0
"""Seconds before the window's end searched for the quietest frame to cut a region longer than
the window at."""


@dataclass(frozen=True)
class Stretch:
    start: int
    """Sample index of its first sample (padding included)."""
    audio: FloatAudio
    final: bool = False


def speech_regions(
    probs: npt.NDArray[np.float32], threshold: float, min_silence: float
) -> tuple[list[tuple[int, int]], bool]:
    """Frames (start, end) of speech: from a frame at `threshold` to the last frame above the
    lower threshold the live connection uses, ended by `min_silence` seconds below it (the live
    connection's rule, so both paths hear the same speech), and whether the last region is still
    open (its silence not yet long enough)."""
    low = max(threshold - 0.15, threshold * 0.5)
    silence = max(1, round(min_silence * STT_SAMPLE_RATE / FRAME))
    regions: list[tuple[int, int]] = []
    start: int | None = None
    last = 0
    for i, p in enumerate(probs):
        if start is None:
            if p >= threshold:
                start, last = i, i + 1
        else:
            if p >= low:
                last = i + 1
            if i + 1 - last >= silence:
                regions.append((start, last))
                start = None
    if start is not None:
        regions.append((start, last))
    return regions, start is not None


class BatchWhisperConnection(QueuedWhisperConnection[Stretch]):
    """Audio → VAD regions → stretches of up to `max_stretch` → Whisper (30 s window) → finals."""

    def __init__(self, provider: WhisperSTT) -> None:
        from voice.vad import SpeechDetector, VadStream

        super().__init__(provider)
        self.vad = VadStream(SpeechDetector(threshold=provider.vad_threshold))
        self.kept = np.zeros(0, np.float32)
        self.first_kept = 0
        """Sample index of `kept[0]`: audio before it was decoded (or is silence)."""
        self.total = 0
        self.probs = np.zeros(0, np.float32)
        """VAD probability of each frame from frame `first_frame` on."""
        self.first_frame = 0
        self.prompt: str | None = None

    async def send_audio(self, pcm16: bytes) -> None:
        audio = pcm16_to_float(pcm16)
        self.kept = np.concatenate([self.kept, audio])
        self.total += len(audio)
        probs = await asyncio.to_thread(self.vad.accept, audio)
        self.probs = np.concatenate([self.probs, probs])
        self._close_stretches(final=False)

    def _close_stretches(self, *, final: bool) -> None:
        """Send every stretch that can no longer grow: its speech reached the window (or the
        recording ended). A stretch runs from its first region's start to the end of the last
        whole region that fits the window."""
        p = self.provider
        window = round(p.max_stretch * STT_SAMPLE_RATE / FRAME)
        while True:
            regions, last_open = speech_regions(self.probs, p.vad_threshold, p.min_silence)
            scored = len(self.probs)
            if not regions:
                if scored > window:  # a long silence: nothing of it will be decoded
                    self._forget(scored - window)
                return
            first = regions[0][0]
            if not final and scored - first <= window:
                return  # it may still grow
            whole = regions if final or not last_open else regions[:-1]
            fits = [r for r in whole if r[1] - first <= window]
            if fits:
                end = fits[-1][1]
            else:  # one region longer than the window: cut it at its quietest frame near the end
                lo = first + window - round(LONG_REGION_SEARCH * STT_SAMPLE_RATE / FRAME)
                end = lo + int(np.argmin(self.probs[lo : first + window]))
            self._send(first, end)
            self._forget(end)

    def _send(self, first: int, end: int) -> None:
        """Queue frames [first, end) (of `probs`) with the padding either side."""
        pad = round(self.provider.pad * STT_SAMPLE_RATE)
        a = max(self.first_kept, (self.first_frame + first) * FRAME - pad)
        b = min(self.total, (self.first_frame + end) * FRAME + pad)
        audio = self.kept[a - self.first_kept : b - self.first_kept].copy()
        self.queue.put_nowait(Stretch(a, audio))

    def _forget(self, frames: int) -> None:
        """Drop the first `frames` VAD frames and the audio before them (but the padding)."""
        self.probs = self.probs[frames:]
        self.first_frame += frames
        upto = max(
            self.first_kept,
            min(self.total, self.first_frame * FRAME - round(self.provider.pad * STT_SAMPLE_RATE)),
        )
        self.kept = self.kept[upto - self.first_kept :]
        self.first_kept = upto

    def voice_change(self, at: float) -> None:
        """Stretches are cut in pauses only: the words are split by speaker after decoding."""

    async def finalize(self) -> None:
        self._close_stretches(final=True)
        self.probs = np.zeros(0, np.float32)  # all of it sent: a later stretch starts afresh
        self.first_frame = self.vad.frames_done
        self.queue.put_nowait(Stretch(self.total, np.zeros(0, np.float32), final=True))

    async def decode(self, piece: Stretch) -> Decoded:
        offset = piece.start / STT_SAMPLE_RATE
        words: tuple[RawWord, ...] = ()
        if len(piece.audio):
            try:
                words = await asyncio.to_thread(
                    self.provider.transcribe_stretch, piece.audio, offset, self.prompt
                )
            except Exception:
                log.exception(
                    "whisper: transcription failed for %.1f s of audio at %.2f s",
                    len(piece.audio) / STT_SAMPLE_RATE,
                    offset,
                )
            if self.provider.batch_prompt:
                self.prompt = " ".join(w.text for w in words) or None
        return Decoded(words, offset + len(piece.audio) / STT_SAMPLE_RATE, True, piece.final)
