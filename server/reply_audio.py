"""Reply audio on the way out: the assistant's pcm16 turned into what each socket plays.

Owns converting the reply to a socket's rate and encoding (`convert_reply`) and the device's
framing of it: a device gets binary frames in the encoding and sample rate it declared in
`start`. A phone leg's `media` messages are built from the same conversion by `server.twilio`.
Codecs and resampling come from `voice.audio`, the one place audio formats are converted.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from voice.audio import float_to_pcm16, mulaw_encode, pcm16_to_float, resample

FRAME_SECONDS = 0.2
"""Reply audio is sent in 200 ms pieces: small enough to start playing at once."""

PHONE_RATE = 8000


def convert_reply(pcm16: bytes, from_rate: int, to_rate: int, encoding: str) -> bytes:
    usable = len(pcm16) - len(pcm16) % 2
    audio = pcm16_to_float(pcm16[:usable])
    audio = resample(audio, from_rate, to_rate)
    out = float_to_pcm16(audio)
    if encoding == "mulaw":
        return mulaw_encode(np.frombuffer(out, dtype="<i2"))
    return out


def device_reply_frames(
    pcm16: bytes, rate: int, device_rate: int, encoding: str
) -> Iterator[bytes]:
    """Binary frames for a device: its own rate and encoding, mono."""
    data = convert_reply(pcm16, rate, device_rate, encoding)
    step = int(device_rate * FRAME_SECONDS) * (2 if encoding == "pcm16" else 1)
    for i in range(0, len(data), step):
        yield data[i : i + step]
