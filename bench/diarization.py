"""Diarization: DER (collar 0 and 0.25 s, overlap scored), speakers found and real-time factor (P4).

`chorus bench diarization DIR [DIR …] --reference REF.rttm [--reference …] [--uem UEM]` scores
every WAV in each DIR against the references (file id = WAV name without extension): DER with
pyannote.metrics and its parts (missed, false alarm, confusion), speakers found against the
reference, and real-time factor with torch and onnxruntime on one thread. `--live` also scores
the live path: the audio fed in 20 ms frames as a stream would (paced by the stream clock, not
the wall clock), with the decision latency, how long after a moment of speech was heard a
speaker was decided for it. `--cross-validate` reports the leave-one-file-out figure of the
settings search (diarization.tuning). Prints a table (with a progress bar while it runs) and
writes JSON.
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
LATENCY_GRID = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="+", type=Path, metavar="DIR", help="folders of WAV files")
    parser.add_argument(
        "--reference",
        action="append",
        type=Path,
        required=True,
        metavar="REF.rttm",
        help="reference RTTM (repeat for several)",
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
        help="embedded stage: override one recipe setting (diarization.recipe.Settings), repeatable",
    )
    parser.add_argument(
        "--live", action="store_true", help="also score the live path (20 ms frames)"
    )
    parser.add_argument(
        "--cross-validate",
        action="store_true",
        help="also run the leave-one-file-out settings search (embedded only)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
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
    duration: float
    speakers_ref: int
    speakers_found: int
    seconds: float
    batch: dict[float, Any] = field(default_factory=dict)
    live: dict[float, Any] = field(default_factory=dict)
    live_seconds: float = 0.0
    live_latencies: list[float] = field(default_factory=list)
    live_speakers: int = 0


def run(args: argparse.Namespace) -> int:
    import torch
    from tqdm import tqdm

    from diarization import load_stage
    from diarization.scoring import COLLARS, DerScore, read_uem, score_collars
    from voice.audio import read_audio_16k
    from voice.diarization_stage import SpeakerTimeline

    torch.set_num_threads(args.threads)
    references: dict[str, SpeakerTimeline] = {}
    for ref_path in args.reference:
        if not ref_path.is_file():
            print(f"reference not found: {ref_path}", file=sys.stderr)
            return 2
        text = ref_path.read_text()
        for fid in {line.split()[1] for line in text.splitlines() if line.startswith("SPEAKER ")}:
            references[fid] = SpeakerTimeline.from_rttm(text, fid)
    uems: dict[str, list[tuple[float, float]]] = {}
    for uem_path in args.uem:
        uems.update(read_uem(uem_path))
    wavs: list[Path] = []
    for folder in args.dirs:
        if not folder.is_dir():
            print(f"not a folder: {folder}", file=sys.stderr)
            return 2
        wavs += sorted(folder.glob("*.wav"))
    scored = [w for w in wavs if w.stem in references]
    for w in wavs:
        if w.stem not in references:
            print(f"skipping {w} (no reference for file id {w.stem!r})", file=sys.stderr)
    if not scored:
        print("no WAV file with a reference to score", file=sys.stderr)
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
    elif settings is not None:
        from diarization.embedded import EmbeddedStage

        stage = EmbeddedStage(settings=settings)
    else:
        stage = load_stage()
    # warm-up (first-call allocations), not timed
    stage.diarize(read_audio_16k(scored[0])[: 2 * stage.sample_rate])

    results: list[FileResult] = []
    for wav in tqdm(scored, desc=f"diarization ({args.diarizer})", unit="file", file=sys.stderr):
        mono = read_audio_16k(wav)
        duration = len(mono) / stage.sample_rate
        ref = references[wav.stem]
        num = len(ref.speakers) if args.oracle_speakers else args.num_speakers
        t0 = time.perf_counter()
        hyp = stage.diarize(mono, num_speakers=num)
        elapsed = time.perf_counter() - t0
        uem = uems.get(wav.stem)
        result = FileResult(
            wav.stem,
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

    summary: dict[str, Any] = {
        "diarizer": args.diarizer,
        "settings": args.set,
        "threads": args.threads,
        "files": [],
        "command": " ".join(["chorus", "bench", "diarization", *sys.argv[3:]])
        if len(sys.argv) > 3
        else None,
        "load_average": list(os.getloadavg()),
    }
    total_audio = sum(r.duration for r in results)
    total_time = sum(r.seconds for r in results)
    lines = [
        f"{'file':<12} {'dur':>5} {'DER@0':>6} {'DER@.25':>7} {'miss':>5} {'FA':>5} {'conf':>5}"
        f" {'spk':>5} {'RTF':>6}"
        + (f" {'live@.25':>8} {'lat50':>5} {'lat90':>5}" if args.live else "")
    ]
    for r in results:
        b0, b25 = r.batch[0.0], r.batch[0.25]
        line = (
            f"{r.file_id:<12} {r.duration:5.1f} {b0.der * 100:6.1f} {b25.der * 100:7.1f}"
            f" {b25.missed / max(b25.total, 1e-9) * 100:5.1f} {b25.false_alarm / max(b25.total, 1e-9) * 100:5.1f}"
            f" {b25.confusion / max(b25.total, 1e-9) * 100:5.1f} {r.speakers_found:>2}/{r.speakers_ref:<2}"
            f" {r.seconds / r.duration:6.3f}"
        )
        entry: dict[str, Any] = {
            "file": r.file_id,
            "duration": r.duration,
            "speakers_ref": r.speakers_ref,
            "speakers_found": r.speakers_found,
            "seconds": r.seconds,
            "rtf": r.seconds / r.duration,
            "batch": {str(c): s.as_dict() for c, s in r.batch.items()},
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
    overall = {c: DerScore.sum(r.batch[c] for r in results) for c in COLLARS}
    o0, o25 = overall[0.0], overall[0.25]
    lines.append(
        f"{'overall':<12} {total_audio:5.0f} {o0.der * 100:6.1f} {o25.der * 100:7.1f}"
        f" {o25.missed / o25.total * 100:5.1f} {o25.false_alarm / o25.total * 100:5.1f}"
        f" {o25.confusion / o25.total * 100:5.1f} {'':>5} {total_time / total_audio:6.3f}"
    )
    summary["overall"] = {str(c): s.as_dict() for c, s in overall.items()}
    summary["rtf"] = total_time / total_audio
    if args.live:
        live_overall = {c: DerScore.sum(r.live[c] for r in results) for c in COLLARS}
        all_lat = (
            np.array([x for r in results for x in r.live_latencies])
            if any(r.live_latencies for r in results)
            else np.array([np.nan])
        )
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
            from diarization.tuning import TuningFile, cross_validate

            files = [TuningFile.load(w, references[w.stem], uems.get(w.stem)) for w in scored]
            cv = cross_validate(files, progress=True)
            summary["cross_validation"] = cv.as_dict()
            lines.append(cv.describe())
    print("\n".join(lines))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2))
    print(f"wrote {args.json}")
    return 0


def parse_settings(items: list[str]) -> Any:
    """`KEY=VALUE` overrides → a `diarization.recipe.Settings` (values typed by its fields)."""
    from dataclasses import fields

    from diarization.recipe import Settings

    types = {f.name: f.type for f in fields(Settings)}
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
    return Settings().but(**changes)


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
