"""Far-field front ends (issue 23, item 4): a whole recording cleaned before the recogniser hears it.

Two maintained single-channel methods, each behind its extra, each measured before it is used
anywhere (`chorus bench words --front-end …`, docs/benchmarks.md):

- `wpe`: weighted prediction error dereverberation (Nakatani et al. 2010) from `nara-wpe`
  (`pip install 'chorus[dereverb]'`): in the STFT domain each frequency's late reverberation is
  predicted from the frames `delay` and more before and subtracted, the filter re-estimated
  `iterations` times; the direct sound and early reflections stay.
- `denoise`: spectral gating from `noisereduce` (`pip install 'chorus[denoise]'`), non-stationary
  (the noise floor tracked over time), so a fan that changes or a door does not need a profile.

Both take and give mono float32 at any rate, the same length. They are whole-file (batch) tools:
WPE's filter is estimated over the recording, and neither is used on the live path.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from models.extras import require

FloatAudio = npt.NDArray[np.float32]

FRONT_ENDS = ("none", "wpe", "denoise", "wpe+denoise")
"""The names `front_end` takes (`+`: one after the other, in that order)."""
LISTENERS = ("stt", "diarizer", "both")
"""Who may hear the cleaned recording (`for_`): the recogniser, the diarizer, or both."""
_EXTRA = {"wpe": ("dereverb", "the WPE front end"),
          "denoise": ("denoise", "the noise-suppression front end")}
"""Each step's extra, and what needs it (`models.extras.require`)."""


def dereverberate(audio: FloatAudio, sample_rate: int, *, taps: int = 10, delay: int = 3,
                  iterations: int = 3, stft_size: int = 512, stft_shift: int = 128) -> FloatAudio:
    """`audio` with its late reverberation removed (WPE, `nara-wpe`; one channel). `taps` and
    `delay` are in STFT frames of `stft_shift` samples (at 16 kHz: 8 ms a frame, the filter
    looking 24–104 ms back); the defaults are nara-wpe's own examples'."""
    require(*_EXTRA["wpe"])
    from nara_wpe.utils import istft, stft
    from nara_wpe.wpe import wpe

    x = np.asarray(audio, np.float64)
    if not len(x):
        return np.zeros(0, np.float32)
    spectrum = stft(x[None, :], size=stft_size, shift=stft_shift)  # (1, frames, bins)
    cleaned = wpe(spectrum.transpose(2, 0, 1), taps=taps, delay=delay, iterations=iterations,
                  statistics_mode="full").transpose(1, 2, 0)
    out = istft(cleaned, size=stft_size, shift=stft_shift)[0][: len(x)]
    if len(out) < len(x):
        out = np.pad(out, (0, len(x) - len(out)))
    return np.asarray(out, np.float32)


def denoise(audio: FloatAudio, sample_rate: int) -> FloatAudio:
    """`audio` with stationary and slowly changing noise gated out (`noisereduce`, non-stationary
    mode; one thread)."""
    require(*_EXTRA["denoise"])
    import noisereduce

    x = np.asarray(audio, np.float32)
    if not len(x):
        return x
    out = noisereduce.reduce_noise(y=x, sr=sample_rate, stationary=False, n_jobs=1)
    return np.asarray(out, np.float32)[: len(x)]


_STEPS: dict[str, Callable[[FloatAudio, int], FloatAudio]] = {
    "wpe": dereverberate,
    "denoise": denoise,
}


def check_front_end(name: str) -> None:
    """Raise `ValueError` for an unknown name, `MissingExtra` for a step whose extra is missing
    (at a command's start, before any audio is read)."""
    if name not in FRONT_ENDS:
        raise ValueError(f"unknown front end {name!r}: one of {', '.join(FRONT_ENDS)}")
    for step in name.split("+"):
        if step != "none":
            require(*_EXTRA[step])


def apply_front_end(name: str, audio: FloatAudio, sample_rate: int) -> FloatAudio:
    """`audio` through the front end `name` (`FRONT_ENDS`; `none`: unchanged). Model-free but
    CPU-bound: call it off the event loop."""
    check_front_end(name)
    if name == "none":
        return audio
    for step in name.split("+"):
        audio = _STEPS[step](audio, sample_rate)
    return audio


def front_end_audio(name: str, for_: str, audio: FloatAudio,
                    sample_rate: int) -> tuple[FloatAudio, FloatAudio]:
    """(what the recogniser hears, what the diarizer hears): `audio` through the front end
    `name` for the listeners `for_` names (`LISTENERS`), the recording itself for the other."""
    if for_ not in LISTENERS:
        raise ValueError(f"unknown listener {for_!r}: one of {', '.join(LISTENERS)}")
    cleaned = apply_front_end(name, audio, sample_rate)
    return (cleaned if for_ in ("stt", "both") else audio,
            cleaned if for_ in ("diarizer", "both") else audio)


__all__ = ["FRONT_ENDS", "LISTENERS", "apply_front_end", "check_front_end", "denoise",
           "dereverberate", "front_end_audio"]
