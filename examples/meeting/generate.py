"""Generate the demo meeting: three distinct espeak-ng voices on one "microphone", with known turn
times, a little overlapped speech and room noise, plus its exact RTTM and scripted transcript.

Why generated: the demo and the voice tests need a recording whose ground truth is known exactly
(who spoke when, and what), with voices a speaker-embedding model can tell apart, and no licence
questions. The outputs (`meeting.wav`, `meeting.rttm`, `meeting.json`) are committed next to this
script, so CI and `make demo` need no espeak-ng; re-run it after changing the script:

    apt-get install -y espeak-ng sox
    python examples/meeting/generate.py            # writes into examples/meeting/

Output: 16 kHz mono PCM16 WAV. Turn times in `meeting.json`/`meeting.rttm` are the spans where
each voice's synthesized speech is non-silent (leading/trailing silence trimmed), so they are exact
by construction. Per-word times in `meeting.json` are estimates: each word's share of the turn is
proportional to the duration espeak-ng gives that word spoken alone (good to a few tenths of a
second; used by the local Deepgram test server to emit words that match the audio it receives).
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

SAMPLE_RATE = 16_000
FILE_ID = "meeting"
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Voice:
    """An espeak-ng voice: language+variant, pitch (0-99), speed (words per minute), gain, and the
    sox effects that colour it after synthesis (`timbre`; each keeps the duration: see `colour`)."""

    espeak_voice: str
    pitch: int
    speed: int
    gain: float
    timbre: tuple[str, ...] = ()


VOICES: dict[str, Voice] = {
    # Deliberately far apart: accent, variant (vocal tract), pitch and pace all differ; after
    # synthesis each gets its own colour (see `colour`): Alice shifted up 300 cents (F0 and
    # formants; 30 ms WSOLA segments, which Whisper hears more clearly than sox's 82 ms default)
    # and bright; Bob unshifted, muffled and boomy; Carol shifted down 200 cents, thin, mid-heavy.
    "Alice": Voice("en-gb+f3", pitch=72, speed=158, gain=0.85,
                   timbre=("pitch", "300", "30", "10", "10", "equalizer", "3000", "1q", "+8")),
    "Bob": Voice("en-us+m3", pitch=30, speed=150, gain=0.95,
                 timbre=("lowpass", "3000", "bass", "+6")),
    "Carol": Voice("en-gb-scotland+f5", pitch=55, speed=170, gain=0.80,
                   timbre=("pitch", "-200", "30", "10", "10", "highpass", "400",
                           "equalizer", "1200", "1q", "+8")),
}

# (speaker, text, gap before this turn in seconds; negative = overlaps the previous turn)
SCRIPT: list[tuple[str, str, float]] = [
    ("Alice", "Good morning everyone. Let's start the weekly release meeting.", 0.6),
    ("Bob", "Morning. The build is green and the installer is ready for testing.", 0.5),
    ("Carol", "Great. I still need the release notes before I can sign off.", 0.4),
    ("Alice", "Bob, can you write the release notes today?", 0.5),
    ("Bob", "Yes, I will have them done by four o'clock.", 0.3),
    ("Carol", "Thank you. What about the bug in the payment page?", -0.4),
    ("Alice", "That one is fixed. The patch went in yesterday evening.", 0.5),
    ("Bob", "I tested it on three browsers and it works everywhere.", 0.4),
    ("Carol", "Then I am happy to ship on Thursday.", 0.6),
    ("Alice", "Thursday works for me. Does anyone see a risk?", 0.4),
    ("Bob", "Only the database migration. It takes about ten minutes.", 0.5),
    ("Carol", "We should run it at night when traffic is low.", -0.5),
    ("Alice", "Agreed. Carol, please tell the support team about the window.", 0.4),
    ("Carol", "I will send them an email after this call.", 0.5),
    ("Bob", "One more thing. The mobile app needs new screenshots for the store.", 0.6),
    ("Alice", "Good point. Let's ask the design team for help.", 0.4),
    ("Carol", "I can ask them this afternoon.", 0.3),
    ("Bob", "Perfect. That is everything from my side.", 0.5),
    ("Alice", "Thank you both. See you on Thursday.", 0.4),
]


def synthesize(text: str, voice: Voice) -> npt.NDArray[np.float32]:
    """espeak-ng to a float32 array at SAMPLE_RATE (espeak-ng writes 22.05 kHz)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "say.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice.espeak_voice, "-p", str(voice.pitch), "-s", str(voice.speed),
             "-w", str(path), text],
            check=True,
            capture_output=True,
        )
        audio, rate = sf.read(path, dtype="float32", always_2d=False)
    if audio.ndim > 1:
        audio = audio.mean(axis=1)
    out = soxr.resample(audio, rate, SAMPLE_RATE, quality="HQ")
    return np.asarray(out, dtype=np.float32)


def colour(audio: npt.NDArray[np.float32], voice: Voice) -> npt.NDArray[np.float32]:
    """Apply the voice's sox effects, sample for sample the same length.

    espeak-ng's voices share one formant synthesizer, so to a speaker-embedding model trained on
    real speech they sound alike: without this step the CAM++ centroids of the three voices (mean
    of per-turn voiceprints) were at cosine Alice-Bob 0.73, Alice-Carol 0.52, Bob-Carol 0.42, and
    the embedded diarizer heard two voices. A pitch shift (`pitch`: formants and F0 move together,
    as with a shorter or longer vocal tract; duration kept) and spectral colouring set them apart
    (0.42, 0.28, 0.58). The result is cut or padded to the input's length, so each turn's span,
    hence `meeting.rttm`, is exactly what the trimmed synthesis gave; within a turn, sox's `pitch`
    (30 ms segments) moves the speech by under 5 ms (envelope cross-correlation).

    Stronger shifts separate the voices further but cost Whisper words: a shift on Bob as well
    (-450 cents, all pairs at cosine <= 0.29) took tiny.en's WER on the meeting from 0.19 to 0.39.
    """
    if not voice.timbre or audio.size == 0:
        return audio
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
        sf.write(src, audio, SAMPLE_RATE, subtype="FLOAT")
        subprocess.run(["sox", str(src), "-e", "floating-point", str(dst), *voice.timbre],
                       check=True, capture_output=True)
        out, rate = sf.read(dst, dtype="float32", always_2d=False)
    if rate != SAMPLE_RATE or out.ndim != 1:
        raise RuntimeError(f"sox changed the format ({rate} Hz, {out.ndim} dims): {voice.timbre}")
    fitted = np.zeros(len(audio), dtype=np.float32)
    fitted[: min(len(out), len(audio))] = out[: len(audio)]
    return fitted


def trim(audio: npt.NDArray[np.float32], threshold: float = 1e-3) -> npt.NDArray[np.float32]:
    """Drop leading and trailing silence (espeak-ng pads its output)."""
    loud = np.flatnonzero(np.abs(audio) > threshold)
    if loud.size == 0:
        return audio[:0]
    return audio[loud[0] : loud[-1] + 1]


def word_times(text: str, voice: Voice, start: float, end: float) -> list[dict[str, object]]:
    """Estimated per-word spans: each word's share of [start, end] follows its solo duration."""
    words = text.split()
    solo = [max(len(trim(synthesize(w, voice))), 1) for w in words]
    total = float(sum(solo))
    out: list[dict[str, object]] = []
    t = start
    for w, n in zip(words, solo, strict=True):
        span = (end - start) * n / total
        bare = re.sub(r"[^\w']", "", w).lower()
        out.append({"word": bare, "punctuated_word": w, "start": round(t, 3),
                    "end": round(t + span, 3)})
        t += span
    return out


def room_noise(n: int, rng: np.random.Generator, level_db: float) -> npt.NDArray[np.float32]:
    """Low-frequency-heavy noise (ventilation hum + hiss) at `level_db` dBFS RMS."""
    white = rng.standard_normal(n)
    brown = np.cumsum(white)
    brown -= np.convolve(brown, np.ones(1601) / 1601, mode="same")  # remove drift
    hum = np.sin(2 * np.pi * 50 * np.arange(n) / SAMPLE_RATE)
    noise = brown / (np.std(brown) + 1e-9) + 0.3 * white + 0.2 * hum
    noise /= np.sqrt(np.mean(noise**2)) + 1e-9
    return (noise * 10 ** (level_db / 20)).astype(np.float32)


def build(out_dir: Path, seed: int = 7) -> dict[str, object]:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            raise SystemExit(f"{tool} is not installed (apt-get install -y espeak-ng sox)")
    rng = np.random.default_rng(seed)
    pieces: list[tuple[float, npt.NDArray[np.float32]]] = []
    turns: list[dict[str, object]] = []
    cursor = 0.0
    for speaker, text, gap in SCRIPT:
        voice = VOICES[speaker]
        audio = colour(trim(synthesize(text, voice)), voice) * voice.gain
        start = max(0.0, cursor + gap)
        end = start + len(audio) / SAMPLE_RATE
        pieces.append((start, audio))
        turns.append({
            "speaker": speaker,
            "text": text,
            "start": round(start, 3),
            "end": round(end, 3),
            "words": word_times(text, voice, round(start, 3), round(end, 3)),
        })
        cursor = end
    total = cursor + 1.0
    mix = np.zeros(round(total * SAMPLE_RATE), dtype=np.float32)
    for start, audio in pieces:
        i = round(start * SAMPLE_RATE)
        mix[i : i + len(audio)] += audio
    mix += room_noise(len(mix), rng, level_db=-48.0)
    peak = float(np.max(np.abs(mix)))
    if peak > 0.95:
        mix *= 0.95 / peak
    out_dir.mkdir(parents=True, exist_ok=True)
    sf.write(out_dir / "meeting.wav", mix, SAMPLE_RATE, subtype="PCM_16")
    rttm = "".join(
        f"SPEAKER {FILE_ID} 1 {t['start']:.3f} {float(t['end']) - float(t['start']):.3f} "  # type: ignore[arg-type]
        f"<NA> <NA> {t['speaker']} <NA> <NA>\n"
        for t in turns
    )
    (out_dir / "meeting.rttm").write_text(rttm)
    doc: dict[str, object] = {
        "file_id": FILE_ID,
        "sample_rate": SAMPLE_RATE,
        "duration": round(len(mix) / SAMPLE_RATE, 3),
        "voices": {name: {"espeak_voice": v.espeak_voice, "pitch": v.pitch, "speed": v.speed,
                          "sox_effects": " ".join(v.timbre)}
                   for name, v in VOICES.items()},
        "word_times": "estimated (each word's share of its turn follows its solo duration)",
        "turns": turns,
    }
    (out_dir / "meeting.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=HERE, help="output directory")
    parser.add_argument("--seed", type=int, default=7, help="room-noise seed")
    args = parser.parse_args()
    doc = build(args.out, seed=args.seed)
    turns = doc["turns"]
    assert isinstance(turns, list)
    overlaps = sum(1 for a, b in itertools.pairwise(turns) if b["start"] < a["end"])
    print(f"wrote {args.out}/meeting.wav ({doc['duration']} s, {len(turns)} turns, "
          f"{overlaps} overlaps), meeting.rttm, meeting.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
