"""Room noise with clicks and coughs, made from a seed (issue 23, "no invented words"): what a
meeting microphone hears when nobody speaks. Tests and benchmarks feed it to the recogniser,
which must say nothing.

A low rumble (ventilation, about -45 dBFS) and a faint hiss, 40 clicks (pen taps, keys: short
decaying impulses at -12 dBFS) and 12 coughs (0.25-0.5 s of band-passed noise over a falling
glottal buzz, sharp onset, -10 dBFS peaks). Same seed, same samples."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from scipy.signal import butter, lfilter


def room_noise(seconds: float = 60.0, rate: int = 16000, seed: int = 23) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    b, a = butter(2, 300 / (rate / 2))
    rumble = lfilter(b, a, rng.standard_normal(n))
    rumble /= np.std(rumble)
    x = 10 ** (-45 / 20) * rumble + 10 ** (-60 / 20) * rng.standard_normal(n)
    for at in rng.integers(0, n - 64, 40):
        x[at : at + 32] += 10 ** (-12 / 20) * np.exp(-np.arange(32) / 4) * rng.choice([-1, 1])
    bb, ba = butter(2, [300 / (rate / 2), 3000 / (rate / 2)], btype="band")
    for at in rng.integers(0, n - rate, 12):
        d = int(rng.uniform(0.25, 0.5) * rate)
        t = np.arange(d) / rate
        buzz = np.sign(np.sin(2 * np.pi * rng.uniform(110, 220) * t * (1 - 0.3 * t)))
        burst = lfilter(bb, ba, rng.standard_normal(d) * (0.6 + 0.4 * buzz))
        onset = np.minimum(1.0, np.arange(d) / (0.01 * rate)) * np.exp(
            -np.arange(d) / (0.12 * rate)
        )
        x[at : at + d] += burst / np.max(np.abs(burst)) * onset * 10 ** (-10 / 20)
    out: npt.NDArray[np.float32] = np.clip(x, -1.0, 1.0).astype(np.float32)
    return out
