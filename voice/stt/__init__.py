"""Speech-to-text providers behind one interface (rule S3): `voice.stt.base` owns keepalive,
reconnect and labels; each provider module speaks one protocol. `load_stt(kind)` builds one by name
(Deepgram's SDK comes with the `deepgram` extra: without it `load_stt` says what to install)."""

from __future__ import annotations

from typing import Any

from models.extras import require
from voice.stt.base import SttProvider, SttStream


def load_stt(kind: str = "whisper", **options: Any) -> SttProvider:
    """`whisper` (embedded default, offline) or `deepgram` (reads DEEPGRAM_API_KEY/DEEPGRAM_URL)."""
    if kind == "whisper":
        from voice.stt.whisper import WhisperSTT

        return WhisperSTT(**options)
    if kind == "deepgram":
        require("deepgram", "the Deepgram STT provider")
        from voice.stt.deepgram import DeepgramSTT

        return DeepgramSTT(**options)
    raise ValueError(f"unknown STT {kind!r} (choose whisper or deepgram)")


__all__ = ["SttProvider", "SttStream", "load_stt"]
