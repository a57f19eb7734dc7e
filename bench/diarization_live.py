"""`chorus bench diarization_live`: the live diarization path (`diarization.live`) on its own.

What it reports, per set of files (a folder; LibriSpeech conversations split into `-close` and
`-far` as `chorus bench diarization` does):

- live DER at collar 0 and 0.25 (missed / false alarm / confusion), speakers found vs reference,
  for the default `LiveSettings` (or `--set KEY=VALUE`);
- with `--grid KEY=V1,V2,...` (repeatable): every combination scored on every file, and the
  leave-one-file-out figure: each file scored with the combination that is best on all the OTHER
  files (DER, collar 0.25), so no setting is chosen on the file it is scored on;
- live RTF on one thread: CPU seconds (`time.process_time`, the whole process: stage and model
  service) per audio second, one stream;
- decision latency per decided speech frame: the stream audio between the frame's end and the end
  of the window that decided it, plus the wall time of the `feed` call that decided it (the model
  time), median and p90;
- CPU per stream at `--streams 1,8,24` concurrent live streams sharing one `ModelService`: each
  stream a thread feeding 0.5 s pieces as fast as it can (the service batches whatever arrives
  together), stream k playing the longest recording from k s on; process CPU seconds / (streams
  x audio seconds), with the number of model calls, and where it goes (issue 31.1): CPU seconds
  in segmentation, the CAM++ trunk and pooling (thread CPU time around each model call, in the
  service's worker), the rest of the worker (batching, which windows to embed), and the streams'
  own threads (fbank, stitching, clustering, aggregation, decisions), each per audio second per
  stream. `--stretch F` runs those streams with their step stretched F times (what the server
  does under overload, `server.overload`).

Fed 0.5 s at a time (one window per call: the windows sit at fixed sample positions, so the
frame size does not change the result; tests/test_diarization_live.py checks that).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from voice.diarization_stage import SpeakerTimeline

FIXTURES = Path(__file__).resolve().parents[1] / ".." / "shared" / "fixtures"
DEFAULT_DIRS = ("ami", "pyannote-sample", "librispeech-conversations")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("dirs", nargs="*", type=Path, metavar="DIR",
                        help="folders of WAV/FLAC files with RTTM (and UEM) references "
                        "(default: the shared AMI, pyannote-sample and LibriSpeech fixtures)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override one LiveSettings field (repeatable)")
    parser.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2",
                        help="search these LiveSettings values by leave-one-file-out (repeatable)")
    parser.add_argument("--sets", default="",
                        help="score only these sets, comma-separated (e.g. ami,pyannote-sample,"
                        "librispeech-conversations-far); default: all")
    parser.add_argument("--streams", default="1,8,24",
                        help="concurrent stream counts for the CPU-per-stream figure ('' to skip)")
    parser.add_argument("--stream-seconds", type=float, default=30.0,
                        help="audio per stream in the CPU-per-stream runs (default 30)")
    parser.add_argument("--stretch", type=float, default=1.0, metavar="F",
                        help="the concurrent streams' step stretched F times (overload)")
    parser.add_argument("--behind", type=float, default=0.0, metavar="SECONDS",
                        help="score a stream whose stage answers this late: fed SECONDS of "
                        "audio at a time, catching up (only the windows it needs: "
                        "`LiveDiarizer.catch_up`, what a loaded server does); 0: fed one step "
                        "at a time, every window")
    parser.add_argument("--json", type=Path, default=Path("diarization-live-bench.json"))


@dataclass
class Recording:
    file_id: str
    set_name: str
    audio: Any
    reference: Any
    uem: list[tuple[float, float]] | None

    @property
    def duration(self) -> float:
        return len(self.audio) / 16000


@dataclass
class LiveRun:
    timeline: Any
    cpu_s: float
    latencies: list[float] = field(default_factory=list)


def load_recordings(dirs: list[Path]) -> list[Recording]:
    from diarization.scoring import read_uem
    from voice.audio import read_audio_16k
    from voice.diarization_stage import SpeakerTimeline

    out: list[Recording] = []
    for folder in dirs:
        if not folder.is_dir():
            raise FileNotFoundError(f"not a folder: {folder}")
        rttm_text = "\n".join(p.read_text() for p in sorted(folder.glob("*.rttm")))
        uems: dict[str, list[tuple[float, float]]] = {}
        for path in sorted(folder.glob("*.uem")):
            uems.update(read_uem(path))
        ids = {line.split()[1] for line in rttm_text.splitlines() if line.startswith("SPEAKER ")}
        for audio_path in sorted(p for p in folder.iterdir() if p.suffix in (".wav", ".flac")):
            if audio_path.stem not in ids:
                continue
            set_name = folder.resolve().name
            for suffix in ("close", "far"):
                if audio_path.stem.endswith(f"_{suffix}"):
                    set_name = f"{set_name}-{suffix}"
            out.append(Recording(
                audio_path.stem, set_name, read_audio_16k(audio_path),
                SpeakerTimeline.from_rttm(rttm_text, audio_path.stem), uems.get(audio_path.stem),
            ))
    return out


def _loaded_service() -> type:
    from diarization.live import ModelService

    class Loaded(ModelService):
        """As if other streams' windows were always waiting (`--behind`: a loaded server)."""

        @property
        def contended(self) -> bool:
            return True

    return Loaded


def live_run(recording: Recording, settings: Any, service: Any, behind: float = 0.0) -> LiveRun:
    """One stream through the live stage, fed one step at a time; or `behind` seconds at a
    time, catching up (a server whose model service answers that late)."""
    from diarization.live import LiveDiarizer

    stage = LiveDiarizer(service, settings)
    stage.record_delays = True
    stage.catch_up(behind > 0)
    piece = round((behind or settings.step_s) * 16000)
    latencies: list[float] = []
    cpu0 = time.process_time()
    for start in range(0, len(recording.audio), piece):
        before = len(stage.decision_delays)
        t0 = time.perf_counter()
        stage.feed(recording.audio[start : start + piece])
        wall = time.perf_counter() - t0
        latencies += [d + wall for d in stage.decision_delays[before:]]
    timeline = stage.flush()
    return LiveRun(timeline, time.process_time() - cpu0, latencies)


def score_run(recording: Recording, run: LiveRun) -> dict[float, Any]:
    from diarization.scoring import score_collars

    return score_collars(recording.reference, run.timeline, uem=recording.uem,
                         duration=recording.duration, uri=recording.file_id)


def speaker_changes(timeline: SpeakerTimeline) -> int:
    """How often the voice changes along a timeline: segments (in time order) whose speaker is
    not the one of the segment before. Hypothesis over reference says how choppy the decided
    turns are (a voice flickering between two labels word by word scores high even where DER,
    which counts time, barely moves)."""
    speakers = [s.speaker for s in timeline]
    return sum(1 for a, b in itertools.pairwise(speakers) if a != b)


def settings_with(items: list[str]) -> Any:
    """The live defaults (`diarization.live.LiveSettings`) with `KEY=VALUE` overrides; a
    ValueError names an unknown key or a bad value."""
    from diarization.live import LiveSettings

    base = LiveSettings()
    overrides: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        overrides[key] = parse_value(base, key, value)
    return replace(base, **overrides)


def parse_value(settings: Any, key: str, value: str) -> Any:
    kinds = {f.name: f.type for f in fields(settings)}
    if key not in kinds:
        raise ValueError(f"unknown live setting {key!r}; choose from {', '.join(kinds)}")
    return int(value) if kinds[key] in ("int", int) else float(value)


class ModelClock:
    """Thread CPU seconds spent inside each model call (segment, trunk, pool) of one
    `LiveModels`, wrapped in place."""

    def __init__(self, models: Any) -> None:
        self.seconds: dict[str, float] = {"segmentation": 0.0, "trunk": 0.0, "pool": 0.0}
        for name, key in (("segment", "segmentation"), ("trunk", "trunk"), ("pool", "pool")):
            setattr(models, name, self._timed(getattr(models, name), key))

    def _timed(self, call: Any, key: str) -> Any:
        def timed(*args: Any) -> Any:
            began = time.thread_time()
            try:
                return call(*args)
            finally:
                self.seconds[key] += time.thread_time() - began

        return timed

    def reset(self) -> None:
        for key in self.seconds:
            self.seconds[key] = 0.0


def streams_cpu(recordings: list[Recording], settings: Any, counts: list[int],
                seconds: float, stretch: float = 1.0) -> list[dict[str, Any]]:
    """Process CPU per stream per audio second with N concurrent streams on one service, and
    where it goes (`ModelClock`, the service's worker thread, the streams' threads)."""
    from diarization.live import LiveDiarizer, ModelService
    from diarization.live_models import LiveModels

    models = LiveModels()  # its own: the clock wraps its methods
    clock = ModelClock(models)
    piece = round(settings.step_s * 16000)
    # every stream hears the same kind of audio: stream k plays the longest recording from k s
    # on (wrapping), so the figures for 1, 8 and 24 streams are comparable
    source = max(recordings, key=lambda r: r.duration).audio
    length = round(seconds * 16000)
    clips = [np.take(source, np.arange(k * 16000, k * 16000 + length), mode="wrap")
             for k in range(max(counts))]
    out = []
    for n in counts:
        service = ModelService(models)
        clock.reset()
        stages = [LiveDiarizer(service, settings) for _ in range(n)]
        if stretch != 1.0:
            for stage in stages:
                stage.stretch(stretch)
        audio = clips[:n]
        errors: list[BaseException] = []

        def stream(stage: Any, clip: Any, errors: list[BaseException] = errors) -> None:
            try:
                for start in range(0, len(clip), piece):
                    stage.feed(clip[start : start + piece])
                stage.flush()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=stream, args=(s, a)) for s, a in zip(stages, audio, strict=True)]
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        service.close()
        if errors:
            raise errors[0]
        total_audio = sum(len(a) for a in audio) / 16000
        worker = service.calls.cpu_s
        per = {key: value / total_audio for key, value in clock.seconds.items()}
        out.append({
            "streams": n,
            "stretch": stretch,
            "cpu_per_audio_second_per_stream_by_part": {
                **per,
                "worker_rest": (worker - sum(clock.seconds.values())) / total_audio,
                "stream_threads": (cpu - worker) / total_audio,
            },
            "audio_seconds_per_stream": total_audio / n,
            "cpu_seconds": cpu,
            "cpu_per_audio_second_per_stream": cpu / total_audio,
            "wall_seconds": wall,
            "windows": service.calls.windows,
            "segmentation_calls": service.calls.segmentation_calls,
            "embedding_calls": service.calls.embedding_calls,
            "embedded_windows": service.calls.embedded_windows,
        })
    return out


def run(args: argparse.Namespace) -> int:
    from diarization.live import ModelService
    from diarization.live_models import default_live_models
    from diarization.scoring import DerScore

    dirs = list(args.dirs) or [FIXTURES / d for d in DEFAULT_DIRS]
    try:
        base = settings_with(args.set)
        grid_axes: list[tuple[str, list[Any]]] = []
        for item in args.grid:
            key, _, values = item.partition("=")
            grid_axes.append((key, [parse_value(base, key, v) for v in values.split(",")]))
        recordings = load_recordings(dirs)
        if args.sets:
            wanted = {x.strip() for x in args.sets.split(",") if x.strip()}
            recordings = [r for r in recordings if r.set_name in wanted]
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not recordings:
        print("no audio file with a reference to score", file=sys.stderr)
        return 2
    combos = [dict(zip([k for k, _ in grid_axes], values, strict=True))
              for values in itertools.product(*[v for _, v in grid_axes])] or [{}]
    service = (_loaded_service() if args.behind else ModelService)(default_live_models())
    lines: list[str] = []
    summary: dict[str, Any] = {
        "command": " ".join(["chorus", "bench", "diarization_live", *sys.argv[3:]]),
        "load_average": list(os.getloadavg()),
        "base_settings": {f.name: getattr(base, f.name) for f in fields(base)},
        "combos": combos,
    }
    per_combo: list[dict[str, dict[float, Any]]] = []
    changes: dict[int, float] = {}
    """Per combination: voice changes of the decided timelines per reference voice change."""
    runs_default: dict[str, LiveRun] = {}
    for c, combo in enumerate(combos):
        settings = replace(base, **combo)
        scores: dict[str, dict[float, Any]] = {}
        combo_runs: dict[str, LiveRun] = {}
        for rec in recordings:
            result = live_run(rec, settings, service, args.behind)
            scores[rec.file_id] = score_run(rec, result)
            combo_runs[rec.file_id] = result
            if c == 0:
                runs_default[rec.file_id] = result
        per_combo.append(scores)
        totals = DerScore.sum(s[0.25] for s in scores.values())
        changes[c] = (sum(speaker_changes(r.timeline) for r in combo_runs.values())
                      / max(1, sum(speaker_changes(r.reference) for r in recordings)))
        print(f"combo {combo or 'base'}: DER {totals.der * 100:.1f} % (collar 0.25, all files), "
              f"{changes[c]:.2f} voice changes per reference change", file=sys.stderr, flush=True)
    service.close()

    sets: dict[str, list[Recording]] = {}
    for rec in recordings:
        sets.setdefault(rec.set_name, []).append(rec)
    # figures of the first combination (the base settings when there is no grid)
    first = per_combo[0]
    lines.append(f"live diarization, settings {summary['base_settings']} {combos[0] or ''}")
    lines.append(f"{'set':<34} {'files':>5} {'DER@0':>6} {'DER@.25':>7} {'miss':>5} {'FA':>5} "
                 f"{'conf':>5} {'spk':>7} {'RTF':>6} {'lat50':>5} {'lat90':>5}")
    summary["sets"] = {}
    for name, members in {**sets, "overall": recordings}.items():
        s0 = DerScore.sum(first[r.file_id][0.0] for r in members)
        s25 = DerScore.sum(first[r.file_id][0.25] for r in members)
        audio = sum(r.duration for r in members)
        cpu = sum(runs_default[r.file_id].cpu_s for r in members)
        lat = np.array([x for r in members for x in runs_default[r.file_id].latencies] or [np.nan])
        found = sum(len(runs_default[r.file_id].timeline.speakers) for r in members)
        ref = sum(len(r.reference.speakers) for r in members)

        def pct(part: float, total: float = s25.total) -> str:
            return f"{part / total * 100:5.1f}" if total else "  nan"

        lines.append(
            f"{name:<34} {len(members):>5} {s0.der * 100:6.1f} {s25.der * 100:7.1f} "
            f"{pct(s25.missed)} {pct(s25.false_alarm)} {pct(s25.confusion)} {found:>3}/{ref:<3} "
            f"{cpu / audio:6.3f} {np.nanmedian(lat):5.2f} {np.nanpercentile(lat, 90):5.2f}")
        summary["sets"][name] = {
            "files": len(members), "der": {"0": s0.as_dict(), "0.25": s25.as_dict()},
            "rtf": cpu / audio, "speakers_found": found, "speakers_ref": ref,
            "latency_median": float(np.nanmedian(lat)), "latency_p90": float(np.nanpercentile(lat, 90)),
        }
    if len(combos) > 1:
        held_out: dict[str, Any] = {}
        chosen: dict[str, dict[str, Any]] = {}
        for rec in recordings:
            best = min(range(len(combos)), key=lambda c: DerScore.sum(
                per_combo[c][r.file_id][0.25] for r in recordings if r is not rec).der)
            held_out[rec.file_id] = per_combo[best][rec.file_id][0.25]
            chosen[rec.file_id] = combos[best]
        lines.append("leave-one-file-out (each file scored with the combination best on the others):")
        for name, members in {**sets, "overall": recordings}.items():
            total = DerScore.sum(held_out[r.file_id] for r in members)
            lines.append(f"  {name:<32} DER {total.der * 100:5.1f} % (collar 0.25)")
            summary.setdefault("leave_one_file_out", {})[name] = total.as_dict()
        summary["chosen_per_fold"] = chosen
        for c, combo in enumerate(combos):
            total = DerScore.sum(per_combo[c][r.file_id][0.25] for r in recordings)
            ami = [r for r in recordings if r.set_name in ("ami", "pyannote-sample")]
            ami_total = DerScore.sum(per_combo[c][r.file_id][0.25] for r in ami) if ami else None
            lines.append(f"  combo {combo}: all files {total.der * 100:5.1f} %"
                         + (f", AMI+sample {ami_total.der * 100:5.1f} %" if ami_total else "")
                         + f", {changes[c]:.2f} voice changes per reference change")
        summary["voice_changes_per_reference_change"] = [changes[c] for c in range(len(combos))]
    counts = [int(x) for x in args.streams.split(",") if x.strip()]
    if counts:
        figures = streams_cpu(recordings, base if len(combos) == 1 else replace(base, **combos[0]),
                              counts, args.stream_seconds, args.stretch)
        summary["streams"] = figures
        for f in figures:
            lines.append(
                f"{f['streams']:>3} streams: {f['cpu_per_audio_second_per_stream']:.3f} CPU-s per "
                f"audio s per stream; {f['windows']} windows in {f['segmentation_calls']} "
                f"segmentation and {f['embedding_calls']} embedding calls")
            parts = f["cpu_per_audio_second_per_stream_by_part"]
            lines.append("      by part (CPU-s per audio s per stream): " + ", ".join(
                f"{key} {value:.4f}" for key, value in parts.items()))
    print("\n".join(lines))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 0
