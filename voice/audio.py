"""Audio in and out of Chorus: WAV files, live PCM16 and 8 kHz µ-law frames, resampling, levels.

Why it is shaped so: every stage downstream (VAD, embeddings, STT) wants mono float32 at a rate of
its own choosing, while audio arrives as files, as raw PCM16 frames of any size, sample rate and
channel count, or as G.711 µ-law from a phone leg (rule V1). This module is the one place that
turns any of those into clean float32 and back, and the one place that refuses bad input with an
error naming the problem (rule V10), so no stage ever sees a NaN, a half sample or a header lie.

- `read_audio(path)` validates the container itself (RIFF/WAVE header, format tag, declared rate
  against the byte rate, data length) before soundfile decodes it; other containers soundfile
  reads (FLAC, OGG) are accepted as they are.
- `FrameDecoder` is the live path: frames of any byte length (a sample split across two frames is
  carried over), PCM16 or µ-law, mono or interleaved channels, resampled with soxr's streaming
  resampler so frame boundaries leave no clicks.
- `StreamResampler` is the one streaming resampler (soxr HQ, any input rate, flushable): the
  frame decoder uses it, and the realtime channel resamples held turn audio with it. This module
  is the one home of PCM16/µ-law codecs and resampling for every package (`realtime` and
  `server` import it rather than keep copies).
- µ-law is ITU-T G.711 (bias 0x84, 8 segments), done with numpy tables: no audioop (removed in
  Python 3.13).
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import soundfile as sf
import soxr

FloatAudio = npt.NDArray[np.float32]
Int16Audio = npt.NDArray[np.int16]
Encoding = Literal["pcm16", "mulaw"]

STT_SAMPLE_RATE = 16_000
"""The rate every model stage in voice/ works at (Whisper, Silero, GE2E, Deepgram uplink)."""
MIN_SAMPLE_RATE = 4_000
MAX_SAMPLE_RATE = 384_000
MAX_CHANNELS = 32
MAX_FRAME_SECONDS = 10.0
"""A live frame holding more than this much audio is refused (rule V10: an absurd frame size)."""
CLIP_FRACTION = 0.01
"""A file with more than this fraction of samples at full scale is refused as clipped."""

ENCODINGS: tuple[Encoding, ...] = ("pcm16", "mulaw")


class AudioError(ValueError):
    """Bad audio input (rule V10). The message names the problem and where it was found."""


class NotAudioError(AudioError):
    """The bytes are not an audio container Chorus can read."""


class UnsupportedEncodingError(AudioError):
    """Audio in an encoding Chorus does not decode (e.g. ADPCM WAV, or a live `encoding=` typo)."""


class TruncatedAudioError(AudioError):
    """A WAV header or data chunk that ends early."""


class EmptyAudioError(AudioError):
    """No samples at all."""


class InvalidSamplesError(AudioError):
    """NaN or infinite samples."""


class ClippedAudioError(AudioError):
    """Too many samples at full scale: the recording is clipped."""


class SampleRateError(AudioError):
    """A declared sample rate that is absurd or contradicts the rest of the header."""


class FrameSizeError(AudioError):
    """A live frame that is absurdly large, or a channel layout that cannot be."""


# --------------------------------------------------------------------------- conversions


def pcm16_to_float(pcm: bytes | Int16Audio) -> FloatAudio:
    """PCM16 little-endian bytes (or int16 samples) → float32 in [-1, 1)."""
    samples = np.frombuffer(pcm, dtype="<i2") if isinstance(pcm, bytes | bytearray) else pcm
    return (samples.astype(np.float32) / 32768.0).astype(np.float32)


def float_to_pcm16(audio: FloatAudio) -> bytes:
    """float32 → PCM16 little-endian bytes (clipped to full scale, rounded to nearest)."""
    ints = np.clip(np.round(np.asarray(audio, np.float64) * 32768.0), -32768, 32767)
    return ints.astype("<i2").tobytes()


_MULAW_BIAS = 0x84


def _build_mulaw_decode_table() -> Int16Audio:
    codes = np.arange(256, dtype=np.int32)
    u = ~codes & 0xFF
    sign = u & 0x80
    exponent = (u >> 4) & 0x07
    mantissa = u & 0x0F
    magnitude = (((mantissa << 3) + _MULAW_BIAS) << exponent) - _MULAW_BIAS
    return np.where(sign != 0, -magnitude, magnitude).astype(np.int16)


_MULAW_DECODE = _build_mulaw_decode_table()


def mulaw_decode(data: bytes) -> Int16Audio:
    """G.711 µ-law bytes → int16 samples."""
    return _MULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def mulaw_encode(samples: Int16Audio) -> bytes:
    """int16 samples → G.711 µ-law bytes (the reference algorithm on 14-bit magnitudes)."""
    x14 = np.asarray(samples, dtype=np.int32) >> 2
    negative = x14 < 0
    magnitude = np.minimum(np.where(negative, -x14, x14), 8159) + 33
    raw_exponent = np.floor(np.log2(magnitude)).astype(np.int32) - 5
    exponent = np.clip(raw_exponent, 0, 7)
    mantissa = (magnitude >> (exponent + 1)) & 0x0F
    code = np.where(raw_exponent > 7, 0x7F, (exponent << 4) | mantissa)
    code = np.where(negative, code ^ 0x7F, code ^ 0xFF)
    return code.astype(np.uint8).tobytes()


def resample(audio: FloatAudio, from_rate: int, to_rate: int) -> FloatAudio:
    """Resample mono float32 audio with soxr (HQ). A no-op when the rates are equal."""
    _check_rate(from_rate, "source")
    _check_rate(to_rate, "target")
    if from_rate == to_rate or len(audio) == 0:
        return np.asarray(audio, np.float32)
    return np.asarray(soxr.resample(audio, from_rate, to_rate, quality="HQ"), np.float32)


class StreamResampler:
    """Mono float32 chunks at any rate → `out_rate`, chunk by chunk (soxr's streaming resampler,
    HQ), so a live stream resamples without seams. The input rate may change between chunks:
    the old resampler's tail is emitted first and a new one starts. `flush()` emits the tail
    (its look-ahead, a few ms) at the end of a stream or before a turn is cut."""

    def __init__(self, out_rate: int) -> None:
        _check_rate(out_rate, "target")
        self.out_rate = out_rate
        self._rate = 0
        self._stream: Any = None

    def resample(self, samples: FloatAudio, rate: int) -> FloatAudio:
        if rate != self._rate:
            _check_rate(rate, "source")
            tail = self.flush()
            self._rate = rate
            if rate != self.out_rate:
                self._stream = soxr.ResampleStream(rate, self.out_rate, 1, dtype="float32",
                                                   quality="HQ")
            out = np.asarray(samples, np.float32) if self._stream is None else np.asarray(
                self._stream.resample_chunk(np.asarray(samples, np.float32)), np.float32)
            return np.concatenate([tail, out]) if len(tail) else out
        if self._stream is None:
            return np.asarray(samples, np.float32)
        return np.asarray(self._stream.resample_chunk(np.asarray(samples, np.float32)), np.float32)

    def flush(self) -> FloatAudio:
        stream, self._stream, self._rate = self._stream, None, 0
        if stream is None:
            return np.zeros(0, np.float32)
        return np.asarray(stream.resample_chunk(np.zeros(0, np.float32), last=True), np.float32)


def to_mono(audio: npt.NDArray[np.float32]) -> FloatAudio:
    """Average interleaved channels (frames × channels) into one."""
    if audio.ndim == 1:
        return audio.astype(np.float32)
    return np.asarray(audio.mean(axis=1), np.float32)


def split_audio(audio: FloatAudio, size: int, shortest: float) -> list[FloatAudio]:
    """`audio` in consecutive pieces of `size` samples; a last piece under `shortest` samples
    joins the one before it (when there is one). No audio: no piece."""
    pieces = [audio[k : k + size] for k in range(0, len(audio), size)]
    if len(pieces) > 1 and len(pieces[-1]) < shortest:
        rest = pieces.pop()  # popped first: `pieces[-2] = …pieces.pop()` stores one too early
        pieces[-1] = np.concatenate([pieces[-1], rest])
    return pieces


def level_dbfs(audio: FloatAudio) -> float:
    """RMS level in dBFS (−inf-safe: silence reads −160)."""
    if len(audio) == 0:
        return -160.0
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    return 20.0 * float(np.log10(max(rms, 1e-8)))


def normalize_level(audio: FloatAudio, target_dbfs: float = -26.0, max_gain_db: float = 30.0) -> FloatAudio:
    """Scale audio so its RMS reads `target_dbfs`, never by more than `max_gain_db`, never past
    full scale (the peak limits the gain). Far-field meeting audio is often near −40 dBFS."""
    if len(audio) == 0:
        return np.asarray(audio, np.float32)
    gain_db = min(target_dbfs - level_dbfs(audio), max_gain_db)
    peak = float(np.max(np.abs(audio)))
    gain = 10 ** (gain_db / 20)
    if peak > 0:
        gain = min(gain, 0.99 / peak)
    return (audio * gain).astype(np.float32)


def _check_rate(rate: int, what: str) -> None:
    if not isinstance(rate, int) or not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise SampleRateError(
            f"{what} sample rate {rate!r} Hz is not plausible "
            f"(expected {MIN_SAMPLE_RATE}–{MAX_SAMPLE_RATE} Hz)"
        )


def check_samples(audio: FloatAudio, where: str = "audio") -> None:
    """Refuse empty, NaN/inf and clipped audio (rule V10)."""
    if len(audio) == 0:
        raise EmptyAudioError(f"{where}: zero-length audio (no samples)")
    finite = np.isfinite(audio)
    if not bool(finite.all()):
        bad = int(np.count_nonzero(~finite))
        first = int(np.flatnonzero(~finite)[0])
        raise InvalidSamplesError(
            f"{where}: {bad} NaN or infinite sample(s), the first at sample {first}"
        )
    full = np.abs(audio) >= 0.999
    if float(full.mean()) > CLIP_FRACTION or float(np.max(np.abs(audio))) > 1.0 + 1e-6:
        raise ClippedAudioError(
            f"{where}: clipped audio ({100 * float(full.mean()):.1f}% of samples at full scale, "
            f"peak {float(np.max(np.abs(audio))):.3f}); lower the input gain"
        )


# --------------------------------------------------------------------------- files


@dataclass(frozen=True)
class WavHeader:
    format_tag: int
    channels: int
    sample_rate: int
    byte_rate: int
    block_align: int
    bits_per_sample: int
    data_bytes: int


_WAV_FORMATS = {1: "PCM", 3: "IEEE float", 6: "A-law", 7: "µ-law", 0xFFFE: "extensible"}
_WAV_FORMAT_NAMES = {2: "MS ADPCM", 0x11: "IMA ADPCM", 0x31: "GSM 6.10", 0x55: "MPEG Layer 3",
                     0x40: "G.721 ADPCM", 0x50: "MPEG"}


def parse_wav_header(data: bytes, where: str = "WAV") -> WavHeader:
    """Validate a RIFF/WAVE header: chunk layout, format tag, rate and sizes (rule V10)."""
    if len(data) < 12:
        raise TruncatedAudioError(f"{where}: truncated WAV header ({len(data)} bytes, need at least 44)")
    if data[:4] not in (b"RIFF", b"RIFX") or data[8:12] != b"WAVE":
        raise NotAudioError(f"{where}: not a RIFF/WAVE file")
    pos = 12
    fmt: tuple[int, int, int, int, int, int] | None = None
    while True:
        if pos + 8 > len(data):
            what = "no data chunk" if fmt is not None else "no fmt chunk"
            raise TruncatedAudioError(f"{where}: truncated WAV header ({what} within {len(data)} bytes)")
        chunk_id = data[pos : pos + 4]
        (size,) = struct.unpack("<I", data[pos + 4 : pos + 8])
        body = pos + 8
        if chunk_id == b"fmt ":
            if size < 16 or body + 16 > len(data):
                raise TruncatedAudioError(f"{where}: truncated WAV header (fmt chunk of {size} bytes)")
            fmt = struct.unpack("<HHIIHH", data[body : body + 16])
            if fmt[0] == 0xFFFE and size >= 26 and body + 26 <= len(data):
                # WAVE_FORMAT_EXTENSIBLE: the SubFormat GUID opens with the real format tag.
                (sub,) = struct.unpack("<H", data[body + 24 : body + 26])
                fmt = (sub, *fmt[1:])
        elif chunk_id == b"data":
            if fmt is None:
                raise NotAudioError(f"{where}: WAV data chunk before any fmt chunk")
            available = len(data) - body
            data_bytes = min(size, available)
            tag, channels, rate, byte_rate, block_align, bits = fmt
            return WavHeader(tag, channels, rate, byte_rate, block_align, bits, data_bytes)
        pos = body + size + (size & 1)


def _validate_wav(header: WavHeader, where: str) -> None:
    if header.format_tag not in _WAV_FORMATS:
        name = _WAV_FORMAT_NAMES.get(header.format_tag, f"format tag 0x{header.format_tag:04x}")
        raise UnsupportedEncodingError(
            f"{where}: unsupported WAV encoding {name} (supported: PCM, IEEE float, µ-law, A-law)"
        )
    if not 1 <= header.channels <= MAX_CHANNELS:
        raise FrameSizeError(f"{where}: WAV declares {header.channels} channels (1–{MAX_CHANNELS} allowed)")
    _check_rate(header.sample_rate, f"{where}: declared")
    if header.block_align > 0 and header.byte_rate != header.sample_rate * header.block_align:
        implied = header.byte_rate / header.block_align
        raise SampleRateError(
            f"{where}: wrong declared sample rate: header says {header.sample_rate} Hz but its byte "
            f"rate {header.byte_rate} B/s implies {implied:g} Hz"
        )
    if header.data_bytes == 0:
        raise EmptyAudioError(f"{where}: zero-length audio (the WAV data chunk is empty)")


def read_audio(source: str | Path | bytes, *, check: bool = True) -> tuple[FloatAudio, int]:
    """Read an audio file (or its bytes) as mono float32 and its sample rate.

    WAV headers are validated first; samples are then checked for NaN and clipping (rule V10)
    unless `check=False`. Raises an `AudioError` subclass naming the problem.
    """
    if isinstance(source, bytes | bytearray):
        data, where = bytes(source), "audio bytes"
    else:
        path = Path(source)
        where = str(path)
        if not path.is_file():
            raise FileNotFoundError(f"{where}: no such file")
        data = path.read_bytes()
    if len(data) == 0:
        raise EmptyAudioError(f"{where}: zero-length file")
    if data[:4] in (b"RIFF", b"RIFX") or (len(data) < 12 and b"RIFF".startswith(data[:4])):
        header = parse_wav_header(data, where)
        _validate_wav(header, where)
    try:
        samples, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
    except sf.LibsndfileError as exc:
        if data[:4] in (b"RIFF", b"RIFX"):
            raise UnsupportedEncodingError(f"{where}: cannot decode this WAV ({exc})") from exc
        raise NotAudioError(f"{where}: not audio (no format Chorus reads recognises it: {exc})") from exc
    except (RuntimeError, TypeError) as exc:
        raise NotAudioError(f"{where}: not audio ({exc})") from exc
    mono = to_mono(np.asarray(samples, np.float32))
    _check_rate(int(rate), f"{where}: declared")
    if check:
        check_samples(mono, where)
    elif len(mono) == 0:
        raise EmptyAudioError(f"{where}: zero-length audio (no samples)")
    return mono, int(rate)


def read_audio_16k(source: str | Path | bytes) -> FloatAudio:
    """`read_audio` resampled to 16 kHz (what the model stages want)."""
    audio, rate = read_audio(source)
    return resample(audio, rate, STT_SAMPLE_RATE)


def write_wav(path: str | Path, audio: FloatAudio, sample_rate: int) -> None:
    sf.write(str(path), audio, sample_rate, subtype="PCM_16")


# --------------------------------------------------------------------------- live frames


@dataclass(frozen=True)
class StreamFormat:
    """What a live stream declares: sample rate, encoding and channel count (rule V1)."""

    sample_rate: int = STT_SAMPLE_RATE
    encoding: Encoding = "pcm16"
    channels: int = 1

    def __post_init__(self) -> None:
        if self.encoding not in ENCODINGS:
            raise UnsupportedEncodingError(
                f"unsupported encoding {self.encoding!r} (supported: {', '.join(ENCODINGS)})"
            )
        _check_rate(self.sample_rate, "declared stream")
        if self.encoding == "mulaw" and self.sample_rate != 8000:
            raise SampleRateError(
                f"wrong declared sample rate for µ-law: {self.sample_rate} Hz (phone legs are 8000 Hz)"
            )
        if not isinstance(self.channels, int) or not 1 <= self.channels <= MAX_CHANNELS:
            raise FrameSizeError(f"stream declares {self.channels!r} channels (1–{MAX_CHANNELS} allowed)")

    @property
    def bytes_per_frame(self) -> int:
        """Bytes of one multi-channel sample frame."""
        return self.channels * (2 if self.encoding == "pcm16" else 1)

    @property
    def max_frame_bytes(self) -> int:
        return int(MAX_FRAME_SECONDS * self.sample_rate) * self.bytes_per_frame


class FrameDecoder:
    """Live frames of any size → mono float32 at `out_rate` (streaming soxr resampler).

    A frame that does not end on a sample boundary leaves its last bytes for the next frame. A
    frame over `MAX_FRAME_SECONDS` raises `FrameSizeError` and changes nothing (the stream goes on).
    """

    def __init__(self, fmt: StreamFormat, out_rate: int = STT_SAMPLE_RATE) -> None:
        self.format = fmt
        self.out_rate = out_rate
        self._carry = b""
        self._resampler = StreamResampler(out_rate)
        self.samples_in = 0
        """Input sample frames accepted so far (at the stream's own rate)."""

    def decode(self, frame: bytes) -> FloatAudio:
        if not isinstance(frame, bytes | bytearray | memoryview):
            raise NotAudioError(f"a live frame must be bytes, got {type(frame).__name__}")
        frame = bytes(frame)
        if len(frame) > self.format.max_frame_bytes:
            seconds = len(frame) / self.format.bytes_per_frame / self.format.sample_rate
            raise FrameSizeError(
                f"absurd frame size: {len(frame)} bytes ({seconds:.1f} s of audio at "
                f"{self.format.sample_rate} Hz) in one frame; send at most {MAX_FRAME_SECONDS:g} s per frame"
            )
        data = self._carry + frame
        usable = len(data) - len(data) % self.format.bytes_per_frame
        self._carry = data[usable:]
        data = data[:usable]
        if not data:
            return np.zeros(0, np.float32)
        if self.format.encoding == "pcm16":
            samples = pcm16_to_float(data)
        else:
            samples = pcm16_to_float(mulaw_decode(data))
        if self.format.channels > 1:
            samples = samples.reshape(-1, self.format.channels).mean(axis=1).astype(np.float32)
        self.samples_in += len(samples)
        return self._resampler.resample(samples, self.format.sample_rate)

    def skip(self, frame: bytes) -> None:
        """Drop a frame (a paused stream) but keep the byte alignment of the ones after it."""
        data = self._carry + bytes(frame)
        self._carry = data[len(data) - len(data) % self.format.bytes_per_frame :]

    def flush(self) -> FloatAudio:
        """The resampler's tail at end of stream."""
        self._carry = b""
        return self._resampler.flush()


class AudioLog:
    """The recent audio of one session (16 kHz mono float32), addressed by session time.

    The STT base replays from it after a reconnect, and speaker matching (rule V4) and the
    diarization pipeline cut runs out of it. It keeps at least the last `keep_seconds`. Appends
    are amortised O(1): one preallocated array, compacted only when it fills (a server holds one
    log per live stream, so no per-frame copy of the whole history).
    """

    def __init__(self, sample_rate: int = STT_SAMPLE_RATE, keep_seconds: float = 180.0) -> None:
        self.sample_rate = sample_rate
        self.keep = round(keep_seconds * sample_rate)  # int() would drop a sample: 1.001 s * 1000 < 1001
        self._data = np.zeros(min(self.keep, 10 * sample_rate), np.float32)
        self._used = 0  # samples of _data in use
        self.first = 0
        """Session sample index of the first sample still held."""
        self.total = 0
        """Samples appended since the session started."""

    def append(self, samples: FloatAudio) -> None:
        n = len(samples)
        if n == 0:
            return
        if self._used + n > len(self._data):
            drop = max(0, self._used + n - self.keep)
            drop = min(drop, self._used)
            if drop:
                self._data[: self._used - drop] = self._data[drop : self._used]
                self._used -= drop
                self.first += drop
            if self._used + n > len(self._data):
                bigger = np.zeros(max(2 * len(self._data), self._used + n), np.float32)
                bigger[: self._used] = self._data[: self._used]
                self._data = bigger
        self._data[self._used : self._used + n] = samples
        self._used += n
        self.total += n

    def release(self) -> None:
        """Give the held audio back (the stream has ended): `total` stays, nothing is held any
        more, and later reads return nothing. A finished session frees its audio here rather than
        when the garbage collector gets to the session (a session sits in reference cycles, and a
        server's full collections are minutes apart: about 5 MB per finished meeting waited)."""
        self.first = self.total
        self._used = 0
        self._data = np.zeros(0, np.float32)

    @property
    def seconds(self) -> float:
        return self.total / self.sample_rate

    def samples(self, start: int, end: int | None = None) -> FloatAudio:
        """Samples [start, end) by session sample index (clamped to what is held)."""
        end = self.total if end is None else min(end, self.total)
        start = max(start, self.first)
        if end <= start:
            return np.zeros(0, np.float32)
        return self._data[start - self.first : end - self.first].copy()

    def between(self, start: float, end: float) -> FloatAudio:
        """Audio between two session times in seconds."""
        return self.samples(int(start * self.sample_rate), int(np.ceil(end * self.sample_rate)))
