"""Audio I/O and codecs (rules V1, V10): every bad input gets an error naming the problem."""

from __future__ import annotations

import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import example, given, settings
from hypothesis import strategies as st

from voice.audio import (
    AudioError,
    ClippedAudioError,
    EmptyAudioError,
    FrameDecoder,
    FrameSizeError,
    InvalidSamplesError,
    NotAudioError,
    SampleRateError,
    StreamFormat,
    TruncatedAudioError,
    UnsupportedEncodingError,
    float_to_pcm16,
    level_dbfs,
    mulaw_decode,
    mulaw_encode,
    normalize_level,
    pcm16_to_float,
    read_audio,
    resample,
)


def wav_bytes(audio: np.ndarray, rate: int = 16000, subtype: str = "PCM_16") -> bytes:
    buf = io.BytesIO()
    sf.write(buf, audio, rate, format="WAV", subtype=subtype)
    return buf.getvalue()


def tone(seconds: float = 0.5, rate: int = 16000, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amp * np.sin(2 * np.pi * 440 * t)).astype(np.float32)


# ------------------------------------------------------------------ codecs (hypothesis)


@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=400))
def test_V1_pcm16_round_trip_is_exact(samples: list[int]) -> None:
    ints = np.array(samples, dtype=np.int16)
    assert float_to_pcm16(pcm16_to_float(ints.tobytes())) == ints.tobytes()


@given(st.lists(st.integers(-32768, 32767), min_size=1, max_size=400))
def test_V1_mulaw_round_trip_within_quantisation_error(samples: list[int]) -> None:
    x = np.array(samples, dtype=np.int16)
    y = mulaw_decode(mulaw_encode(x)).astype(np.int64)
    err = np.abs(y - x.astype(np.int64))
    # G.711 segments: the step grows with the magnitude, about 1/16 of it at most.
    assert np.all(err <= (np.abs(x.astype(np.int64)) + 132) / 16)


@given(st.binary(min_size=1, max_size=300))
def test_V1_mulaw_codes_survive_decode_encode(codes: bytes) -> None:
    again = mulaw_encode(mulaw_decode(codes))
    # 0x7F is "negative zero": it decodes to 0, which encodes as 0xFF.
    assert again == codes.replace(b"\x7f", b"\xff")


@settings(max_examples=30)
@given(st.lists(st.integers(1, 700), min_size=1, max_size=12))
def test_V1_frames_of_any_size_decode_like_one_frame(cuts: list[int]) -> None:
    audio = tone(0.3, rate=8000)
    pcm = float_to_pcm16(audio)
    fmt = StreamFormat(sample_rate=8000)
    whole = FrameDecoder(fmt)
    ref = np.concatenate([whole.decode(pcm), whole.flush()])
    parts = FrameDecoder(fmt)
    out, pos = [], 0
    for cut in cuts:
        out.append(parts.decode(pcm[pos : pos + cut]))
        pos += cut
    out.append(parts.decode(pcm[pos:]))
    out.append(parts.flush())
    got = np.concatenate(out)
    assert len(got) == len(ref)
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_V1_stereo_and_mulaw_frames_decode_to_16k_mono() -> None:
    audio = tone(1.0, rate=8000)
    stereo = np.stack([audio, audio], axis=1)
    dec = FrameDecoder(StreamFormat(sample_rate=8000, channels=2))
    out = np.concatenate([dec.decode(float_to_pcm16(stereo.reshape(-1))), dec.flush()])
    assert abs(len(out) - 16000) <= 2
    mu = FrameDecoder(StreamFormat(sample_rate=8000, encoding="mulaw"))
    ints = np.frombuffer(float_to_pcm16(audio), dtype="<i2")
    got = np.concatenate([mu.decode(mulaw_encode(ints)), mu.flush()])
    assert abs(len(got) - 16000) <= 2
    assert abs(level_dbfs(got) - level_dbfs(resample(audio, 8000, 16000))) < 0.5


def test_level_normalisation_reaches_target_without_clipping() -> None:
    quiet = tone(1.0, amp=0.01)
    out = normalize_level(quiet, target_dbfs=-20.0)
    assert abs(level_dbfs(out) - -20.0) < 0.1
    assert float(np.max(np.abs(normalize_level(tone(1.0, amp=0.9), target_dbfs=0.0)))) <= 0.99 + 1e-6


def test_read_audio_reads_wav_and_flac(tmp_path: Path) -> None:
    path = tmp_path / "a.flac"
    sf.write(path, tone(), 22050, format="FLAC")
    audio, rate = read_audio(path)
    assert rate == 22050 and len(audio) == len(tone())
    audio, rate = read_audio(wav_bytes(tone()))
    assert rate == 16000


# ------------------------------------------------------------------ V10: one test per bad input


def test_V10_not_audio(tmp_path: Path) -> None:
    path = tmp_path / "notes.wav"
    path.write_text("these are meeting notes, not a recording\n" * 10)
    with pytest.raises(NotAudioError, match="not audio"):
        read_audio(path)


def test_V10_unsupported_encoding_in_wav() -> None:
    data = bytearray(wav_bytes(tone()))
    data[20:22] = struct.pack("<H", 2)  # format tag 2 = MS ADPCM
    with pytest.raises(UnsupportedEncodingError, match="unsupported WAV encoding MS ADPCM"):
        read_audio(bytes(data))


def test_V10_unsupported_encoding_on_a_live_stream() -> None:
    with pytest.raises(UnsupportedEncodingError, match="unsupported encoding 'opus'"):
        StreamFormat(encoding="opus")  # type: ignore[arg-type]


def test_V10_truncated_wav_header() -> None:
    with pytest.raises(TruncatedAudioError, match="truncated WAV header"):
        read_audio(wav_bytes(tone())[:30])


def test_V10_zero_length_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.wav"
    path.write_bytes(b"")
    with pytest.raises(EmptyAudioError, match="zero-length file"):
        read_audio(path)


def test_V10_zero_length_wav_data() -> None:
    with pytest.raises(EmptyAudioError, match="zero-length audio"):
        read_audio(wav_bytes(np.zeros(0, np.float32)))


def test_V10_nan_samples() -> None:
    audio = tone()
    audio[100] = np.nan
    with pytest.raises(InvalidSamplesError, match=r"1 NaN or infinite sample\(s\), the first at sample 100"):
        read_audio(wav_bytes(audio, subtype="FLOAT"))


def test_V10_clipped_samples() -> None:
    audio = np.clip(tone(amp=3.0), -1.0, 1.0)
    with pytest.raises(ClippedAudioError, match="clipped audio"):
        read_audio(wav_bytes(audio))


def test_V10_wrong_declared_sample_rate_in_wav() -> None:
    data = bytearray(wav_bytes(tone()))
    data[24:28] = struct.pack("<I", 44100)  # rate field lies; byte rate still says 16 kHz
    with pytest.raises(SampleRateError, match="wrong declared sample rate: header says 44100 Hz"):
        read_audio(bytes(data))


def test_V10_absurd_declared_sample_rate_on_a_live_stream() -> None:
    with pytest.raises(SampleRateError, match="sample rate 16 Hz is not plausible"):
        StreamFormat(sample_rate=16)
    with pytest.raises(SampleRateError, match="wrong declared sample rate for µ-law: 16000 Hz"):
        StreamFormat(sample_rate=16000, encoding="mulaw")


def test_V10_absurd_frame_size_is_refused_and_the_stream_goes_on() -> None:
    dec = FrameDecoder(StreamFormat(sample_rate=16000))
    with pytest.raises(FrameSizeError, match=r"absurd frame size: 640000 bytes \(20.0 s of audio"):
        dec.decode(b"\x00\x00" * 320000)
    assert len(dec.decode(float_to_pcm16(tone(0.1)))) == 1600


def test_V10_errors_are_audio_errors() -> None:
    for cls in (NotAudioError, UnsupportedEncodingError, TruncatedAudioError, EmptyAudioError,
                InvalidSamplesError, ClippedAudioError, SampleRateError, FrameSizeError):
        assert issubclass(cls, AudioError)


@settings(max_examples=25)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=40), st.integers(1000, 20000))
@example(sizes=[1, 1000], keep=1001)  # 1.001 s * 1000 truncated to 1000 samples once dropped one
def test_audio_log_keeps_the_recent_audio_addressed_by_session_time(sizes: list[int], keep: int) -> None:
    from voice.audio import AudioLog

    log = AudioLog(sample_rate=1000, keep_seconds=keep / 1000)
    whole = np.arange(sum(sizes), dtype=np.float32)
    pos = 0
    for n in sizes:
        log.append(whole[pos : pos + n])
        pos += n
    assert log.total == len(whole)
    assert log.first <= max(0, len(whole) - keep)  # at least `keep` samples are held
    np.testing.assert_array_equal(log.samples(log.first), whole[log.first :])
    np.testing.assert_array_equal(log.samples(0, 10), whole[log.first : 10])


def test_the_stream_resampler_is_seamless_and_restarts_on_a_new_rate() -> None:
    """One home for resampling (issue 10, seams): the frame decoder and the realtime channel."""
    from voice.audio import StreamResampler, resample

    t = np.arange(48000) / 48000
    tone = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    whole = resample(tone, 48000, 16000)
    stream = StreamResampler(16000)
    pieces = [stream.resample(tone[i : i + 4801], 48000) for i in range(0, len(tone), 4801)]
    chunked = np.concatenate([*pieces, stream.flush()])
    assert abs(len(chunked) - len(whole)) <= 1
    n = min(len(chunked), len(whole)) - 200
    assert np.max(np.abs(chunked[200:n] - whole[200:n])) < 1e-3  # no seams at chunk edges
    same = StreamResampler(16000)
    assert np.array_equal(same.resample(tone[:160], 16000), tone[:160])  # equal rates: as is
    first = same.resample(tone[:4800], 48000)
    switched = same.resample(tone[:800], 8000)  # the 48 kHz tail comes first, then 8 kHz
    assert len(first) + len(switched) >= 1600  # the whole 48 kHz chunk is out by now
    assert abs(len(first) + len(switched) + len(same.flush()) - 3200) <= 2
