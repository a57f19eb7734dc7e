"""Latency of the embedded default (issue 10): Whisper utterances are capped at 4 s, and a capped
utterance is cut at its quietest recent VAD frame rather than mid-word at the cap; a voice change
the diarization stage hears ends the utterance there (at the quietest frame near it)."""

from __future__ import annotations

import numpy as np
import pytest

from voice.stt.whisper import CHANGE_PAD, Utterance, WhisperConnection, WhisperSTT

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


def speech(conn: WhisperConnection, seconds: float, dips: tuple[float, ...] = ()) -> None:
    """`seconds` of speech (by the VAD's scores) with one quiet frame at each of `dips`."""
    frames = int(seconds * 16000 / FRAME)
    probs = np.full(frames, 0.9, np.float32)
    for dip in dips:
        probs[int(dip * 16000 / FRAME)] = 0.3
    conn.kept = np.zeros(frames * FRAME, np.float32)
    conn.total = len(conn.kept)
    conn._advance(probs)


async def test_a_voice_change_ends_the_utterance_at_the_quietest_frame_near_it() -> None:
    """Issue 10 (latency): a turn that ends where another voice starts without a pause used to
    wait for the utterance's pause or its 4 s cap; the stage's change cuts it at once."""
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        speech(conn, 2.5, dips=(1.62,))
        assert utterances(conn) == []  # no pause, no cap: nothing to decode yet
        conn.voice_change(1.5)  # the stage places the change within a word or two
        (first,) = utterances(conn)
        dip = int(1.62 * 16000 / FRAME) * FRAME
        cut = dip + FRAME // 2
        assert first.start == 0.0
        assert round(len(first.audio)) == cut + round(CHANGE_PAD * 16000)  # a short tail only
        assert conn.speech_start == cut  # the next voice's words open the next utterance
    finally:
        await conn.abort()


async def test_a_voice_change_waits_for_the_frames_around_it_and_cuts_once() -> None:
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        speech(conn, 1.6, dips=(1.5,))
        conn.voice_change(1.5)  # heard up to 1.6 s: the frames after the change are not scored
        assert utterances(conn) == [] and conn.changes
        frames = int(0.6 * 16000 / FRAME)
        conn.kept = np.concatenate([conn.kept, np.zeros(frames * FRAME, np.float32)])
        conn.total += frames * FRAME
        conn._advance(np.full(frames, 0.9, np.float32))
        (first,) = utterances(conn)
        assert abs((first.start + len(first.audio) / 16000) - (1.5 + CHANGE_PAD)) < 0.05
        assert not conn.changes
    finally:
        await conn.abort()


@pytest.mark.parametrize("at", [0.2, 3.0])
async def test_a_voice_change_at_the_utterance_start_or_in_a_pause_cuts_nothing(at: float) -> None:
    conn = WhisperConnection(WhisperSTT(pad=0.0))
    try:
        speech(conn, 1.0)
        silence = int(2.5 * 16000 / FRAME)  # the pause closes the utterance
        conn.kept = np.concatenate([conn.kept, np.zeros(silence * FRAME, np.float32)])
        conn.total += silence * FRAME
        if at < 1.0:
            conn.voice_change(at)  # closer to the start than MIN_PIECE
            assert utterances(conn) == []
        conn._advance(np.full(silence, 0.01, np.float32))
        assert len(utterances(conn)) == 1  # the pause's cut, and nothing else
        conn.voice_change(at)
        assert utterances(conn) == [] and conn.speech_start is None
    finally:
        await conn.abort()


async def test_cutting_at_voice_changes_can_be_turned_off() -> None:
    conn = WhisperConnection(WhisperSTT(pad=0.0, cut_at_voice_changes=False))
    try:
        speech(conn, 2.5, dips=(1.62,))
        conn.voice_change(1.5)
        assert utterances(conn) == [] and not conn.changes
    finally:
        await conn.abort()
