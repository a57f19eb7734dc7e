"""Words (voice): WER, cpWER, word speaker accuracy, invented words and RTF on recordings with a reference.

Who said which word, measured (issue 23). Each recording goes through `chorus transcribe`'s own
path (`voice.transcribe.transcribe_audio` with the embedded diarization stage, whole file
diarized first), and its committed turns are scored against the reference:

- **WER** and **cpWER** computed by MeetEval (`meeteval.wer.api.cpwer`): cpWER on the turns'
  speaker labels, WER on the same segments with every speaker made one (the words in time
  order), pooled over the recordings (errors / reference words);
- both sides normalised by the Whisper English text normaliser (the `whisper-normalizer`
  package's `EnglishTextNormalizer`: case, punctuation, numbers, British spellings);
- **word speaker accuracy**: the share of words, among those whose middle falls in exactly one
  reference segment, whose label maps to that segment's speaker (labels mapped one-to-one);
- **invented words per minute of non-speech**: hypothesis words that touch no reference segment
  widened by `--collar` (0.25 s), per minute of such time (a word Whisper stretched over a pause
  is late, not invented: it touches speech);
- **RTF**: wall time of the transcription / audio time (the model loaded before timing).

Recordings: `--set meetings-close|meetings-far|conversations-close|conversations-far` (the
fixtures beside the project, `$CHORUS_FIXTURES`), or files given with `--audio` (a `.seglst.json`
or `.stm` beside each gives words; else an `.rttm` gives speakers only). The LibriSpeech
conversations have no word reference: speaker accuracy, invented words and RTF only. `--live`
streams at real time as a live room would (`--speed`), with the stage deciding online. Prints a
table per recording and the pooled figures; `--json` writes them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.extras import require
from voice.frontend import LISTENERS

FIXTURES = Path(
    os.environ.get(
        "CHORUS_FIXTURES", str(Path(__file__).resolve().parents[2] / "shared" / "fixtures")
    )
)
SETS = {
    "meetings-close": ("librispeech-meetings", "lsmeet_dev*_close.flac"),
    "meetings-far": ("librispeech-meetings", "lsmeet_dev*_far.flac"),
    "conversations-close": ("librispeech-conversations", "lsconv_dev*_close.flac"),
    "conversations-far": ("librispeech-conversations", "lsconv_dev*_far.flac"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        choices=sorted(SETS),
        help="a fixture set (repeatable; default: meetings-close and meetings-far)",
    )
    parser.add_argument(
        "--audio",
        action="append",
        default=[],
        type=Path,
        help="a recording with a .seglst.json, .stm or .rttm beside it (repeatable)",
    )
    parser.add_argument(
        "--model", default=None, metavar="tiny.en|base|DIR", help="Whisper model (default tiny.en)"
    )
    parser.add_argument(
        "--decoding",
        choices=("batch", "pieces"),
        default=None,
        help="batch (default; chorus transcribe's): long VAD regions in Whisper's 30 s "
        "window; pieces: the live path's ≤ 4 s utterances (always with --live)",
    )
    parser.add_argument(
        "--prompt",
        choices=("on", "off"),
        default=None,
        help="batch decoding: the previous stretch's text as the prompt",
    )
    parser.add_argument(
        "--max-stretch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="batch decoding: the longest stretch decoded at once (default 30)",
    )
    parser.add_argument(
        "--live",
        action="store_true",
        help="stream at real time as a live room does (online diarization)",
    )
    parser.add_argument(
        "--front-end",
        default="none",
        metavar="none|wpe|denoise|wpe+denoise",
        help="batch: clean each recording first (voice.frontend: WPE dereverberation, "
        "spectral-gating noise suppression); its CPU time is reported apart",
    )
    parser.add_argument(
        "--front-end-for",
        choices=LISTENERS,
        default="stt",
        help="who hears the cleaned audio: the recogniser (default), the diarizer, or both",
    )
    parser.add_argument("--speed", type=float, default=1.0, help="with --live: pace (default 1)")
    parser.add_argument(
        "--second-pass",
        default=None,
        metavar="tiny.en|base|DIR|off",
        help="with --live: re-decode stretches of committed turns with this model and correct them in "
        "place (voice.second_pass); scores the first pass and the corrected turns apart",
    )
    parser.add_argument(
        "--second-pass-window",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the second pass's encoder window (the stretch padded to it; default: Whisper's 30 s)",
    )
    parser.add_argument(
        "--second-pass-stretch",
        type=float,
        default=None,
        metavar="SECONDS",
        help="the longest stretch of turns the second pass re-decodes together (default 28)",
    )
    parser.add_argument(
        "--prompt-turns",
        type=int,
        default=0,
        help="the second pass's prompt: the text of this many previous turns (default 0)",
    )
    parser.add_argument(
        "--collar",
        type=float,
        default=0.25,
        help="seconds around reference speech not counted as non-speech",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument(
        "--choose",
        nargs="+",
        type=Path,
        default=None,
        metavar="RUN.json",
        help="measure nothing: choose among earlier runs (their --json) by "
        "leave-one-file-out on cpWER, and print the held-out figures",
    )
    parser.add_argument("--no-progress", action="store_true")


@dataclass(frozen=True)
class Segment:
    speaker: str
    start: float
    end: float
    words: str


def reference_of(audio: Path) -> tuple[list[Segment], bool]:
    """The reference segments beside `audio` and whether they hold words."""
    stem = audio.with_suffix("")
    seglst = stem.with_suffix(".seglst.json")
    if seglst.is_file():
        rows = json.loads(seglst.read_text())
        return [
            Segment(r["speaker"], float(r["start_time"]), float(r["end_time"]), r["words"])
            for r in rows
        ], True
    stm = stem.with_suffix(".stm")
    if stm.is_file():
        out = []
        for line in stm.read_text().splitlines():
            parts = line.split(maxsplit=5)
            if len(parts) >= 5 and not line.startswith(";;"):
                out.append(
                    Segment(
                        parts[2],
                        float(parts[3]),
                        float(parts[4]),
                        parts[5] if len(parts) > 5 else "",
                    )
                )
        return out, True
    rttm = stem.with_suffix(".rttm")
    if rttm.is_file():
        from bench.transcription import rttm_turns

        return [
            Segment(t["speaker"], t["start"], t["end"], "") for t in rttm_turns(rttm, audio.stem)
        ], False
    raise SystemExit(f"{audio}: no .seglst.json, .stm or .rttm beside it")


def recordings(args: argparse.Namespace) -> list[Path]:
    files = list(args.audio)
    for name in args.set or ([] if files else ["meetings-close", "meetings-far"]):
        folder, pattern = SETS[name]
        found = sorted((FIXTURES / folder).glob(pattern))
        if not found:
            raise SystemExit(f"no {pattern} in {FIXTURES / folder} (set CHORUS_FIXTURES)")
        files += found
    return files


def normaliser() -> Any:
    from whisper_normalizer.english import EnglishTextNormalizer

    return EnglishTextNormalizer()


def error_rates(reference: list[Segment], turns: list[Any], session: str) -> dict[str, Any]:
    """MeetEval's cpWER on the labels, and WER with one speaker on each side."""
    from meeteval.io import SegLST
    from meeteval.wer import api

    norm = normaliser()

    def seglst(rows: list[tuple[str, float, float, str]], one: bool) -> Any:
        return SegLST(
            [
                {
                    "session_id": session,
                    "speaker": "all" if one else who,
                    "start_time": start,
                    "end_time": end,
                    "words": norm(text),
                }
                for who, start, end, text in rows
            ]
        )

    ref = [(s.speaker, s.start, s.end, s.words) for s in reference]
    hyp = [(t.speaker or t.label or "unknown", t.start, t.end, t.text) for t in turns]
    if not hyp:
        hyp = [("unknown", 0.0, 0.0, "")]
    out: dict[str, Any] = {}
    for name, one in (("wer", True), ("cpwer", False)):
        rate = api.cpwer(seglst(ref, one), seglst(hyp, one))[session]
        out[name] = {
            "errors": int(rate.errors),
            "length": int(rate.length),
            "insertions": int(rate.insertions),
            "deletions": int(rate.deletions),
            "substitutions": int(rate.substitutions),
        }
    return out


def invented_words(
    reference: list[Segment], turns: list[Any], duration: float, collar: float
) -> tuple[int, float]:
    """Hypothesis words wholly in non-speech (touching no reference segment ± collar) and the
    minutes of such non-speech."""
    spans = sorted((max(0.0, s.start - collar), min(duration, s.end + collar)) for s in reference)
    merged: list[list[float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    speech = sum(b - a for a, b in merged)
    count = 0
    for t in turns:
        for w in t.words:
            if not any(w.start <= b and a <= w.end for a, b in merged):
                count += 1
    return count, max(0.0, duration - speech) / 60.0


def score(path: Path, result: Any, collar: float) -> dict[str, Any]:
    from bench.transcription import speaker_accuracy

    reference, has_words = reference_of(path)
    entry: dict[str, Any] = {
        "audio": path.name,
        "duration_s": round(result.duration, 2),
        "turns": len(result.turns),
        "wall_s": round(result.elapsed, 2),
        "real_time_factor": round(result.real_time_factor, 3),
    }
    if has_words:
        entry.update(error_rates(reference, result.turns, path.stem))
    script = [{"speaker": s.speaker, "start": s.start, "end": s.end} for s in reference]
    accuracy = speaker_accuracy(result.turns, script)
    if accuracy is not None:
        entry["speaker_accuracy"] = round(accuracy["speaker_accuracy"], 4)
        entry["speaker_words"] = int(accuracy["speaker_words"])
    latencies = [t.latency for t in result.turns if t.latency is not None]
    if latencies:  # a paced (--live) run: end of a turn's speech to its room event
        entry["latencies_s"] = [round(x, 3) for x in latencies]
    invented, minutes = invented_words(reference, result.turns, result.duration, collar)
    entry["invented_words"] = invented
    entry["non_speech_min"] = round(minutes, 3)
    return entry


def pooled(entries: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"recordings": len(entries)}
    for name in ("wer", "cpwer"):
        scored = [e[name] for e in entries if name in e]
        if scored:
            errors = sum(s["errors"] for s in scored)
            length = sum(s["length"] for s in scored)
            out[name] = round(errors / length, 4) if length else None
    words = sum(e.get("speaker_words", 0) for e in entries)
    if words:
        out["speaker_accuracy"] = round(
            sum(
                e["speaker_accuracy"] * e["speaker_words"]
                for e in entries
                if "speaker_accuracy" in e
            )
            / words,
            4,
        )
    minutes = sum(e["non_speech_min"] for e in entries)
    out["invented_per_min"] = (
        round(sum(e["invented_words"] for e in entries) / minutes, 3) if minutes else None
    )
    latencies = [x for e in entries for x in e.get("latencies_s", [])]
    if latencies:
        import numpy as np

        out["latency_p50_s"] = round(float(np.percentile(latencies, 50)), 3)
        out["latency_p95_s"] = round(float(np.percentile(latencies, 95)), 3)
    audio = sum(e["duration_s"] for e in entries)
    out["real_time_factor"] = round(sum(e["wall_s"] for e in entries) / audio, 3) if audio else None
    return out


def by_render(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pooled figures of the close-talk and the far-field renders apart (`*_close`, `*_far`)."""
    out = {}
    for render in ("close", "far"):
        chosen = [e for e in entries if Path(e["audio"]).stem.endswith(f"_{render}")]
        if chosen and len(chosen) < len(entries):
            out[render] = pooled(chosen)
    return out


def _stt(args: argparse.Namespace) -> Any:
    from voice.stt.whisper import WhisperSTT

    options: dict[str, Any] = {
        "batch": not args.live and (args.decoding or "batch") == "batch"
    }  # chorus transcribe decodes in batch; a live stream in pieces
    if args.prompt is not None:
        options["batch_prompt"] = args.prompt == "on"
    if args.max_stretch is not None:
        options["max_stretch"] = args.max_stretch
    stt = WhisperSTT(args.model, **options)
    stt.model()  # loaded before timing
    return stt


def _second_pass_recogniser(args: argparse.Namespace) -> Any:
    """The second pass's Whisper (`--second-pass`, live only), loaded before timing; or None."""
    if not args.live or args.second_pass in (None, "off"):
        return None
    from voice.stt.whisper import WhisperSTT

    second = WhisperSTT(args.second_pass, encoder_window=args.second_pass_window,
                        instance="second-pass")
    second.model()
    return second


def leave_one_out(runs: dict[str, list[dict[str, Any]]], metric: str = "cpwer") -> dict[str, Any]:
    """For each recording: the run with the lowest pooled `metric` over the *other* recordings,
    and that run's errors on the held-out one. Only recordings every run scored take part."""
    names = sorted(
        set.intersection(
            *({e["audio"] for e in entries if metric in e} for entries in runs.values())
        )
    )
    by_run = {run: {e["audio"]: e for e in entries} for run, entries in runs.items()}

    def pooled_rate(run: str, files: list[str], name: str) -> float:
        errors = sum(int(by_run[run][f][name]["errors"]) for f in files)
        return errors / max(1, sum(int(by_run[run][f][name]["length"]) for f in files))

    held: list[dict[str, Any]] = []
    for name in names:
        others = [n for n in names if n != name]
        chosen = min(runs, key=lambda run: pooled_rate(run, others, metric))
        held.append(
            {
                "audio": name,
                "chosen": chosen,
                **{m: by_run[chosen][name][m] for m in ("wer", "cpwer")},
            }
        )
    totals = {
        m: round(sum(h[m]["errors"] for h in held) / max(1, sum(h[m]["length"] for h in held)), 4)
        for m in ("wer", "cpwer")
    }
    choices = {run: sum(1 for h in held if h["chosen"] == run) for run in runs}
    return {
        "held_out": held,
        "pooled_held_out": totals,
        "choices": choices,
        "overall": {run: round(pooled_rate(run, names, metric), 4) for run in runs},
    }


def choose(paths: list[Path]) -> int:
    runs = {}
    for path in paths:
        figures = json.loads(path.read_text())
        runs[path.stem] = figures["recordings"]
    result = leave_one_out(runs)
    for render in ("close", "far"):
        held = [h for h in result["held_out"] if Path(h["audio"]).stem.endswith(f"_{render}")]
        if held:
            result[f"held_out_{render}"] = {
                m: round(
                    sum(h[m]["errors"] for h in held) / max(1, sum(h[m]["length"] for h in held)), 4
                )
                for m in ("wer", "cpwer")
            }
    print(f"Leave-one-file-out over {len(result['held_out'])} recordings (chosen by cpWER)")
    for h in result["held_out"]:
        print(f"{h['audio']:<34} {h['chosen']:<24} WER {_rate(h, 'wer')} cpWER {_rate(h, 'cpwer')}")
    pooled_out = result["pooled_held_out"]
    print(
        f"held-out pooled: WER {pooled_out['wer']:.3f}, cpWER {pooled_out['cpwer']:.3f}; "
        f"chosen: {result['choices']}; every run on all: {result['overall']}"
    )
    for render in ("close", "far"):
        if f"held_out_{render}" in result:
            print(f"held-out pooled, {render} renders: {result[f'held_out_{render}']}")
    return 0


def run(args: argparse.Namespace) -> int:
    require("bench", "the words bench")
    if args.choose:
        return choose(args.choose)
    from diarization import load_stage  # type: ignore[attr-defined,unused-ignore]
    from voice.audio import read_audio
    from voice.frontend import check_front_end, front_end_audio
    from voice.transcribe import transcribe_audio

    check_front_end(args.front_end)
    if args.front_end != "none" and args.live:
        raise SystemExit("--front-end is for batch decoding (a whole recording), not --live")
    files = recordings(args)
    stt = _stt(args)
    second = _second_pass_recogniser(args)
    entries = []
    for path in files:
        audio, rate = read_audio(path)
        started = time.perf_counter()
        heard, diarized = front_end_audio(args.front_end, args.front_end_for, audio, rate)
        front_end_s = time.perf_counter() - started

        async def once(audio: Any = heard, rate: int = rate, diarized: Any = diarized) -> Any:
            from voice.second_pass import SecondPass

            passes = (None if second is None
                      else SecondPass(second, prompt_turns=args.prompt_turns,
                                      **({} if args.second_pass_stretch is None
                                         else {"max_stretch": args.second_pass_stretch})))
            try:
                return await transcribe_audio(
                    audio,
                    rate,
                    stt=stt,
                    pipeline_speakers=True,
                    diarizer=load_stage("embedded"),
                    refine_speakers=not args.live,
                    speed=args.speed if args.live else None,
                    second_pass=passes,
                    diarizer_audio=diarized,
                )
            finally:
                if passes is not None:
                    await passes.aclose()

        result = asyncio.run(once())
        entry = score(path, result, args.collar)
        if result.first_pass is not None:
            first = dataclasses.replace(result, turns=result.first_pass)
            entry["first_pass"] = score(path, first, args.collar)
            entry["second_pass"] = result.second_pass
        entry["total_s"] = round(time.perf_counter() - started, 2)
        if args.front_end != "none":
            entry["front_end_s"] = round(front_end_s, 2)
        entries.append(entry)
        if not args.no_progress:
            print(f"  {path.name}: {_row(entry)}", file=sys.stderr)
    figures = {
        "front_end": {"name": args.front_end, "for": args.front_end_for,
                      "cpu_s_per_audio_s": round(
                          sum(e.get("front_end_s", 0.0) for e in entries)
                          / max(1e-9, sum(e["duration_s"] for e in entries)), 3)},
        "stt": stt.describe(),
        "second_pass": None if second is None else second.describe(),
        "path": "live" if args.live else "batch",
        "recordings": entries,
        "pooled": pooled(entries),
        "by_render": by_render(entries),
    }
    print(
        f"Words bench: {len(files)} recordings, STT {stt.describe()}, "
        f"{'live at ' + str(args.speed) + '× real time' if args.live else 'chorus transcribe'}"
    )
    print(f"{'recording':<32} {'WER':>7} {'cpWER':>7} {'spk acc':>8} {'inv/min':>8} {'RTF':>6}")
    for e in entries:
        print(f"{e['audio']:<32} {_row(e)}")
    for render, of_render in figures["by_render"].items():
        print(f"{'pooled ' + render:<32} {_pooled_row(of_render)}")
    print(f"{'pooled':<32} {_pooled_row(figures['pooled'])}")
    if args.front_end != "none":
        fe = figures["front_end"]
        print(f"front end {fe['name']} (heard by: {fe['for']}): "
              f"{fe['cpu_s_per_audio_s']} CPU-s per audio s, not in the RTF column")
    if second is not None:
        firsts = [e["first_pass"] for e in entries]
        figures["first_pass"] = {"pooled": pooled(firsts), "by_render": by_render(firsts)}
        for render, of_render in figures["first_pass"]["by_render"].items():
            print(f"{'first pass, pooled ' + render:<32} {_pooled_row(of_render)}")
        print(f"{'first pass, pooled':<32} {_pooled_row(figures['first_pass']['pooled'])}")
        outcomes: dict[str, int] = {}
        for e in entries:
            for k, v in e["second_pass"].items():
                outcomes[k] = outcomes.get(k, 0) + v
        figures["second_pass_outcomes"] = outcomes
        print(f"second pass ({second.describe()}): "
              + ", ".join(f"{k} {v}" for k, v in outcomes.items()))
    if "latency_p95_s" in figures["pooled"]:
        p = figures["pooled"]
        print(
            f"turn latency (end of speech → room event): p50 {p['latency_p50_s']:.2f} s, "
            f"p95 {p['latency_p95_s']:.2f} s"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _rate(e: dict[str, Any], name: str) -> str:
    if name not in e:
        return f"{'—':>7}"
    return f"{e[name]['errors'] / max(1, e[name]['length']):>7.3f}"


def _row(e: dict[str, Any]) -> str:
    acc = f"{e['speaker_accuracy']:.3f}" if "speaker_accuracy" in e else "—"
    per_min = e["invented_words"] / e["non_speech_min"] if e["non_speech_min"] else 0.0
    return (
        f"{_rate(e, 'wer')} {_rate(e, 'cpwer')} {acc:>8} {per_min:>8.2f} "
        f"{e['real_time_factor']:>6.3f}"
    )


def _pooled_row(p: dict[str, Any]) -> str:
    def fmt(v: Any, width: int, digits: int = 3) -> str:
        return f"{v:>{width}.{digits}f}" if isinstance(v, float) else f"{'—':>{width}}"

    return (
        f"{fmt(p.get('wer'), 7)} {fmt(p.get('cpwer'), 7)} {fmt(p.get('speaker_accuracy'), 8)} "
        f"{fmt(p.get('invented_per_min'), 8, 2)} {fmt(p.get('real_time_factor'), 6)}"
    )
