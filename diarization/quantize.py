"""The int8 live trunk's calibration: activation ranges measured on recordings, written as JSON.

The live stage runs CAM++'s trunk quantised to int8 (`diarization.live_models`, issue 31).
Static quantisation needs the range of every activation the quantised operators see, and those
come from running the float trunk on real speech. They are measured here once, on recordings
like the ones the stage hears (the shared AMI and LibriSpeech far-field renders by default), and
the numbers, not the audio, are kept in `campplus_trunk_int8_calibration.json` beside the module,
so a fresh install builds the same int8 graph without any recording. Run it again when the export
or onnxruntime's graph optimisations rename the trunk's tensors (the build refuses a table that
does not cover them):

    python -m diarization.quantize ../shared/fixtures/ami ../shared/fixtures/librispeech-meetings
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from diarization.live_models import (
    INT8_CALIBRATION,
    QUANTIZED_OPS,
    float_trunk,
    prepared_for_quantization,
)
from voice.embedding import fbank

SAMPLE_RATE = 16_000
WINDOW_S = 5.0
HOP_S = 3.0
WINDOWS = 48
SEED = 0

FloatArray = npt.NDArray[np.float32]


def calibration_windows(paths: Sequence[Path], count: int = WINDOWS, seed: int = SEED) -> FloatArray:
    """`count` windows of WINDOW_S seconds, every HOP_S seconds of the 16 kHz recordings `paths`,
    drawn at random (seeded) so every recording can contribute."""
    import soundfile as sf

    window, hop = round(WINDOW_S * SAMPLE_RATE), round(HOP_S * SAMPLE_RATE)
    windows: list[FloatArray] = []
    for path in paths:
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
        if rate != SAMPLE_RATE:
            raise ValueError(f"{path}: {rate} Hz; the calibration takes 16 kHz recordings")
        mono = audio[:, 0]
        windows.extend(mono[s : s + window] for s in range(0, mono.size - window + 1, hop))
    if len(windows) < count:
        raise ValueError(f"need {count} windows of {WINDOW_S:g} s, the recordings give {len(windows)}")
    order = np.random.default_rng(seed).permutation(len(windows))[:count]
    return np.stack([windows[i] for i in order])


def calibrate(paths: Sequence[Path], target: Path = INT8_CALIBRATION) -> Path:
    """Measure the trunk's activation ranges (MinMax) on windows of `paths`; write them to
    `target` (onnxruntime's calibration-cache JSON)."""
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    windows = calibration_windows(paths)
    trunk = float_trunk()

    class Windows(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._feeds = self._each()

        @staticmethod
        def _each() -> Iterator[dict[str, FloatArray]]:
            for w in windows:
                feats = fbank(w)
                yield {"feats": (feats - feats.mean(axis=0, keepdims=True))[None]}

        def get_next(self) -> dict[str, FloatArray] | None:
            return next(self._feeds, None)

    target.unlink(missing_ok=True)  # quantize_static writes the cache only when it computes it
    with tempfile.TemporaryDirectory(prefix="chorus-calibrate-") as tmp:
        pre = Path(tmp) / "trunk.pre.onnx"
        prepared_for_quantization(trunk, pre)
        quantize_static(
            str(pre), str(Path(tmp) / "trunk.int8.onnx"), Windows(), quant_format=QuantFormat.QDQ,
            per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=QUANTIZED_OPS, calibration_cache_path=str(target),
        )
    return target


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diarization.quantize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", type=Path, help="folders of 16 kHz WAV/FLAC recordings")
    parser.add_argument("--out", type=Path, default=INT8_CALIBRATION)
    args = parser.parse_args(argv)
    paths = sorted(p for d in args.dirs for p in d.iterdir()
                   if p.suffix.lower() in (".wav", ".flac") and not p.name.startswith("enroll_"))
    try:
        out = calibrate(paths, args.out)
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({WINDOWS} windows of {WINDOW_S:g} s from {len(paths)} recordings)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
