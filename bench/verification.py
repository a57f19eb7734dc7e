"""Speaker verification: equal-error rate of the speaker embeddings on windows of real recordings.

`chorus bench verification DIR [DIR …]` cuts windows of each `--window` length (default 1.5 and
3 s) from the stretches where one reference speaker talks alone (each `<name>.rttm` next to the
audio and every `--reference REF.rttm`), at most `--per-speaker` windows per speaker and file
spread evenly over that speaker's windows, embeds every window with each `--embedding`
(`campplus`, `ecapa`) and scores every pair of windows *within one recording* by cosine (the
trials a diarizer faces: one room, one microphone): same speaker is a target trial, two speakers a
non-target one. With two embeddings it adds `fused`, the mean of the two cosines (the cosine of
`voice.ecapa.FusedEmbedding`'s joined vectors). Reports the EER and the cosine at it per set
(sets named as in `chorus bench diarization`) and overall, and the CPU seconds per window of each
model, as a table and JSON. Why within a recording: across recordings the channel alone tells
most pairs apart, which says nothing about telling the voices of one meeting apart.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.diarization import AUDIO_SUFFIXES, set_of

SAMPLE_RATE = 16000
GRID = 0.01  # seconds: the reference is rasterised at 10 ms to find who talks alone
EMBEDDINGS = ("campplus", "ecapa")

FloatArray = npt.NDArray[np.float32]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="folders of audio")
    parser.add_argument("--reference", action="append", type=Path, default=[], metavar="REF.rttm")
    parser.add_argument("--set-name", action="append", default=[], metavar="DIR=NAME")
    parser.add_argument(
        "--skip-set", action="append", default=[], metavar="NAME", help="leave a set out"
    )
    parser.add_argument(
        "--window",
        action="append",
        type=float,
        default=[],
        metavar="SECONDS",
        help="window length (repeatable; default 1.5 and 3)",
    )
    parser.add_argument(
        "--embedding",
        action="append",
        choices=EMBEDDINGS,
        default=[],
        help="embedding to score (repeatable; default both, and their fusion)",
    )
    parser.add_argument("--per-speaker", type=int, default=30, metavar="N")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, default=Path("verification-bench.json"), metavar="OUT")


def alone_stretches(
    segments: list[tuple[float, float, str]], duration: float
) -> dict[str, list[tuple[float, float]]]:
    """Per speaker, the (start, end) stretches where they talk and nobody else does."""
    n = int(np.ceil(duration / GRID)) + 1
    speakers = sorted({s for _, _, s in segments})
    active = np.zeros((len(speakers), n), bool)
    for start, end, speaker in segments:
        active[speakers.index(speaker), round(start / GRID) : round(end / GRID)] = True
    alone = active & (active.sum(axis=0) == 1)
    out: dict[str, list[tuple[float, float]]] = {}
    for k, speaker in enumerate(speakers):
        column = np.concatenate([[False], alone[k], [False]])
        edges = np.flatnonzero(column[1:] != column[:-1])
        out[speaker] = [(a * GRID, b * GRID) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    return out


def cut_windows(
    stretches: list[tuple[float, float]], length: float, per_speaker: int
) -> list[float]:
    """Starts of non-overlapping windows of `length` inside the stretches, at most
    `per_speaker`, spread evenly over all of them."""
    starts: list[float] = []
    for a, b in stretches:
        t = a
        while t + length <= b + 1e-9:
            starts.append(t)
            t += length
    if len(starts) > per_speaker:
        pick = np.linspace(0, len(starts) - 1, per_speaker).round().astype(int)
        starts = [starts[i] for i in pick]
    return starts


def equal_error_rate(
    scores: npt.NDArray[np.float64], targets: npt.NDArray[np.bool_]
) -> tuple[float, float]:
    """(EER, the score threshold at it): where the miss rate of target trials scored under the
    threshold meets the false-alarm rate of non-target trials scored at or over it."""
    order = np.argsort(scores, kind="stable")
    s, t = scores[order], targets[order]
    n_target, n_non = int(t.sum()), int((~t).sum())
    if n_target == 0 or n_non == 0:
        return float("nan"), float("nan")
    miss = np.concatenate([[0], np.cumsum(t)]) / n_target  # threshold just above s[i-1]
    false_alarm = 1 - np.concatenate([[0], np.cumsum(~t)]) / n_non
    i = int(np.argmin(np.abs(miss - false_alarm)))
    threshold = float(s[min(i, len(s) - 1)])
    return float((miss[i] + false_alarm[i]) / 2), threshold


def run(args: argparse.Namespace) -> int:
    import torch

    from voice.audio import read_audio_16k
    from voice.diarization_stage import SpeakerTimeline
    from voice.ecapa import EcapaModel
    from voice.embedding import EmbeddingModel

    torch.set_num_threads(args.threads)
    windows = args.window or [1.5, 3.0]
    names = list(dict.fromkeys(args.embedding)) or list(EMBEDDINGS)
    set_names = {}
    for item in args.set_name:
        folder, _, name = item.partition("=")
        set_names[Path(folder).resolve()] = name
    references: dict[str, SpeakerTimeline] = {}
    ref_paths = list(args.reference)
    files: list[Path] = []
    for folder in args.dirs:
        found = sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        files += found
        ref_paths += [p.with_suffix(".rttm") for p in found if p.with_suffix(".rttm").is_file()]
    for ref_path in ref_paths:
        text = ref_path.read_text()
        for fid in {line.split()[1] for line in text.splitlines() if line.startswith("SPEAKER ")}:
            references[fid] = SpeakerTimeline.from_rttm(text, fid)
    files = [
        f for f in files if f.stem in references and set_of(f, set_names) not in set(args.skip_set)
    ]
    models: dict[str, Any] = {}
    if "campplus" in names:
        models["campplus"] = EmbeddingModel(threads=args.threads)
    if "ecapa" in names:
        models["ecapa"] = EcapaModel(threads=args.threads)
    cpu = {(w, n): 0.0 for w in windows for n in models}
    embedded = {(w, n): 0 for w in windows for n in models}
    # per window length, per model: scores and target flags of every within-file trial, by set
    trials: dict[float, dict[str, dict[str, list[Any]]]] = {w: {} for w in windows}
    counts: dict[float, dict[str, list[int]]] = {w: {} for w in windows}
    for path in files:
        audio = read_audio_16k(path)
        ref = references[path.stem]
        segments = [(g.start, g.end, g.speaker) for g in ref.segments]
        stretches = alone_stretches(segments, len(audio) / SAMPLE_RATE)
        set_name = set_of(path, set_names)
        for length in windows:
            clips: list[FloatArray] = []
            owner: list[str] = []
            for speaker, spans in stretches.items():
                for start in cut_windows(spans, length, args.per_speaker):
                    lo = round(start * SAMPLE_RATE)
                    clip = audio[lo : lo + round(length * SAMPLE_RATE)]
                    if len(clip) == round(length * SAMPLE_RATE):
                        clips.append(clip)
                        owner.append(speaker)
            if len({*owner}) < 2:
                continue
            labels = np.array(owner)
            same = labels[:, None] == labels[None, :]
            upper = np.triu_indices(len(clips), k=1)
            cosines: dict[str, npt.NDArray[np.float64]] = {}
            for name, model in models.items():
                t0 = time.process_time()
                vectors = model.embed(clips)
                cpu[length, name] += time.process_time() - t0
                embedded[length, name] += len(clips)
                unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
                cosines[name] = (unit @ unit.T)[upper].astype(np.float64)
            if len(models) == 2:
                cosines["fused"] = (cosines["campplus"] + cosines["ecapa"]) / 2
            for name, values in cosines.items():
                bucket = trials[length].setdefault(name, {}).setdefault(set_name, [[], []])
                bucket[0].append(values)
                bucket[1].append(same[upper])
            tally = counts[length].setdefault(set_name, [0, 0, 0])
            tally[0] += len(clips)
            tally[1] += int(same[upper].sum())
            tally[2] += int((~same[upper]).sum())
        print(f"{path.stem}: done", file=sys.stderr)
    summary: dict[str, Any] = {
        "files": len(files),
        "per_speaker": args.per_speaker,
        "cpu_seconds_per_window": {
            f"{n} {w:g} s": cpu[w, n] / max(embedded[w, n], 1) for w in windows for n in models
        },
        "windows": {},
    }
    lines = ["EER % (cosine at the EER) of within-recording trials"]
    for length in windows:
        result: dict[str, Any] = {"counts": counts[length], "eer": {}}
        set_list = list(counts[length])
        lines.append(
            f"window {length:g} s: "
            + ", ".join(
                f"{s} {c[0]} windows, {c[1]} target / {c[2]} non-target trials"
                for s, c in counts[length].items()
            )
        )
        lines.append(f"  {'embedding':<10}" + "".join(f" {s:>34}" for s in [*set_list, "all"]))
        for name, by_set in trials[length].items():
            row: dict[str, Any] = {}
            cells = []
            for s in [*set_list, "all"]:
                parts = list(by_set.values()) if s == "all" else [by_set[s]]
                scores = np.concatenate([np.concatenate(p[0]) for p in parts])
                targets = np.concatenate([np.concatenate(p[1]) for p in parts])
                eer, threshold = equal_error_rate(scores, targets)
                row[s] = {"eer": eer, "threshold": threshold}
                cells.append(f"{eer * 100:6.1f} ({threshold:+.3f})")
            result["eer"][name] = row
            lines.append(f"  {name:<10}" + "".join(f" {c:>34}" for c in cells))
        summary["windows"][str(length)] = result
    lines.append(
        "CPU s per window: "
        + ", ".join(f"{n} {v:.4f}" for n, v in summary["cpu_seconds_per_window"].items())
    )
    print("\n".join(lines))
    args.json.write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.json}")
    return 0
