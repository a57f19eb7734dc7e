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


async def test_a_decided_voice_change_ends_the_utterance_there_and_speech_goes_on() -> None:
    """Issue 10 (latency): a turn that ends where another voice goes on without a pause used to
    wait for the utterance's end (the next pause or the 4 s cap). Told where the stage decided
    the voice changes, Whisper cuts at the quietest frame near it: the piece before is decoded
    now and is not the end of speech (the next voice's words go on in the next piece)."""
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        frames = int(3.0 * 16000 / FRAME)  # 3 s of speech: under the cap, no pause
        probs = np.full(frames, 0.9, np.float32)
        dip = int(1.6 * 16000 / FRAME)  # the handover's quietest frame, near the change
        probs[dip] = 0.5
        conn.kept = np.zeros(frames * FRAME, np.float32)
        conn.total = len(conn.kept)
        conn._advance(probs)
        assert utterances(conn) == []  # nothing closes the utterance on its own
        conn.voice_change(1.5)
        first, = utterances(conn)
        cut = dip * FRAME + FRAME // 2
        assert first.start == 0.0 and not first.speech_final
        assert len(first.audio) == cut + int(0.1 * 16000)  # and a tenth of a second after it
        assert conn.speech_start == cut  # the next voice's words open the next utterance
        conn.voice_change(0.2)  # at or before the utterance's start: nothing more to cut
        assert utterances(conn) == []
    finally:
        await conn.abort()


async def test_a_voice_change_waits_for_its_frames_and_spares_a_short_piece() -> None:
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        conn.kept = np.zeros(3 * 16000, np.float32)
        conn.total = len(conn.kept)
        conn._advance(np.full(int(1.0 * 16000 / FRAME), 0.9, np.float32))
        conn.voice_change(0.9)  # the frames 0.3 s after it are not scored yet: it waits
        assert utterances(conn) == [] and conn.changes
        conn._advance(np.full(int(0.5 * 16000 / FRAME), 0.9, np.float32))
        assert len(utterances(conn)) == 1 and not conn.changes
        conn.voice_change(conn.speech_start / 16000 + 0.2)  # under MIN_PIECE into the piece
        conn._advance(np.full(int(1.0 * 16000 / FRAME), 0.9, np.float32))
        assert utterances(conn) == []
        off = WhisperConnection(WhisperSTT(pad=0.0, cut_at_voice_changes=False))
        off.kept, off.total = conn.kept, conn.total
        off._advance(np.full(int(2.0 * 16000 / FRAME), 0.9, np.float32))
        off.voice_change(1.0)
        assert utterances(off) == []
        await off.abort()
    finally:
        await conn.abort()
