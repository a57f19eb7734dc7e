"""Latency of the embedded default (issue 10): Whisper utterances are capped at 4 s, and a capped
utterance is cut at its quietest recent VAD frame rather than mid-word at the cap."""

from __future__ import annotations

import numpy as np

from voice.stt.whisper import Utterance, WhisperConnection, WhisperSTT

FRAME = 512  # samples per VAD frame at 16 kHz


def utterances(conn: WhisperConnection) -> list[Utterance]:
    out = []
    while not conn.queue.empty():
        item = conn.queue.get_nowait()
        assert item is not None
        out.append(item)
    return out


async def test_a_long_utterance_is_cut_under_the_cap_at_its_quietest_frame() -> None:
    stt = WhisperSTT(pad=0.0)
    assert stt.max_utterance == 4.0
    conn = WhisperConnection(stt)
    try:
        frames = int(6.0 * 16000 / FRAME)
        probs = np.full(frames, 0.9, np.float32)
        dip = int(3.5 * 16000 / FRAME)  # a short gap between words, within the last second
        probs[dip] = 0.3
        conn.kept = np.zeros(frames * FRAME, np.float32)
        conn.total = len(conn.kept)
        conn._advance(probs)
        first = utterances(conn)[0]
        assert first.start == 0.0
        end = first.start + len(first.audio) / 16000
        assert end == (dip * FRAME + FRAME // 2) / 16000  # at the dip, not at the 4 s cap
        assert conn.speech_start == dip * FRAME + FRAME // 2  # the rest opens the next utterance
    finally:
        await conn.abort()


async def test_without_a_quieter_frame_the_cut_is_the_latest_of_the_last_second() -> None:
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        frames = int(5.0 * 16000 / FRAME)
        conn.kept = np.zeros(frames * FRAME, np.float32)
        conn.total = len(conn.kept)
        conn._advance(np.full(frames, 0.9, np.float32))
        first = utterances(conn)[0]
        assert len(first.audio) / 16000 <= 4.0
    finally:
        await conn.abort()
