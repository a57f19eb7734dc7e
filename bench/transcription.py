"""Transcription (voice): word error rate, real-time factor and turn latency on a scripted recording.

Same code path users run (`voice.transcribe.transcribe_audio`: a room, a VoiceChannel, one
session fed PCM16 frames). Two passes over the recording:

1. as fast as the STT takes it: WER against the script (jiwer, lower-cased, punctuation removed)
   and the real-time factor (wall time / audio time);
2. paced at real time (`--speed 1`): the latency from the end of each turn's speech (its last
   word's end, as streamed) to its room event; p50 and p95 over the turns.

`--stt whisper` (default) measures the embedded default; `--stt deepgram --local-deepgram` the
streaming path (early commit from interim results on; `--no-early-commit` for the old wait).
`--latency-only` skips the fast pass, `--max-utterance` sets Whisper's utterance cap.
`--reference RTTM` scores the words' speakers against a reference timeline (any recording with
an RTTM, such as the LibriSpeech conversations in ../shared/fixtures; no WER without a script).

Default input: the generated demo meeting (`examples/meeting/`). Prints a table; `--json` writes
the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from models.extras import require
from voice.assembler import TurnPolicy

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--audio", type=Path, default=MEETING / "meeting.wav")
    parser.add_argument("--script", type=Path, default=None,
                        help="scripted turns (JSON with a `turns` list of {speaker, text, start, "
                             "end}; default: the demo meeting's, with the demo meeting)")
    parser.add_argument("--reference", type=Path, default=None, metavar="RTTM",
                        help="speaker accuracy of the words against this RTTM instead of the "
                             "script (a recording with no script: no WER)")
    parser.add_argument("--stt", choices=("whisper", "deepgram"), default="whisper")
    parser.add_argument("--whisper-model", default=None)
    parser.add_argument("--max-utterance", type=float, default=None,
                        help="Whisper: cap on one VAD utterance in seconds (default: the provider's, 4)")
    parser.add_argument("--local-deepgram", action="store_true",
                        help="with --stt deepgram: start the local Deepgram-protocol server, which "
                             "replays the script's words from the audio it receives (measures the "
                             "streaming path's latency; its WER is 0 by construction)")
    parser.add_argument("--pipeline-speakers", action="store_true",
                        help="speakers from a diarization stage; adds speaker-attributed accuracy")
    parser.add_argument("--diarizer", choices=("embedded", "pyannote"), default="embedded")
    parser.add_argument("--refine-speakers", action="store_true",
                        help="with --pipeline-speakers: diarize the whole file first, as "
                             "`chorus transcribe` does for a file (no live latency to measure)")
    parser.add_argument("--speed", type=float, default=1.0,
                        help="pace of the latency pass, as a multiple of real time (default 1)")
    parser.add_argument("--skip-latency", action="store_true", help="only the fast pass")
    parser.add_argument("--latency-only", action="store_true", help="only the real-time pass")
    parser.add_argument("--config", type=Path, default=None, metavar="chorus.toml",
                        help="the turn rules from this file's [voice] section (as `chorus serve` "
                             "reads them); the flags below override them")
    parser.add_argument("--speaker-wait", type=float, default=None,
                        help="pipeline speakers: seconds a word waits for the stage to place it "
                             "(default: [voice] speaker_wait, 2)")
    parser.add_argument("--no-early-commit", action="store_true",
                        help="streaming STT: wait for final results before committing a turn "
                             "(the behaviour before early commit from interim results)")
    parser.add_argument("--encoder-window", type=float, default=None, metavar="SECONDS",
                        help="Whisper: seconds of audio the encoder hears per utterance "
                             "(default 10; 30 is faster-whisper's own window)")
    parser.add_argument("--no-provisional-speakers", action="store_true",
                        help="pipeline speakers: every word waits for the stage's decided speaker "
                             "(the behaviour before provisional speakers)")
    parser.add_argument("--no-voice-change-cuts", action="store_true",
                        help="Whisper with pipeline speakers: do not end an utterance where the "
                             "stage decided the voice changes (wait for a pause or the cap)")
    parser.add_argument("--no-provisional-changes", action="store_true",
                        help="pipeline speakers: a turn waits for the stage to decide the next "
                             "voice's first word (the behaviour before a provisional voice change "
                             "closed it)")
    parser.add_argument("--live-set", action="append", default=[], metavar="KEY=VALUE",
                        help="with the embedded stage: override one of its live settings "
                             "(diarization.live.LiveSettings; repeatable), e.g. "
                             "context_ramp_s=0 for the aggregation before issue 10's weighing")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--no-progress", action="store_true")


def normalized(text: str) -> str:
    text = text.lower().replace("-", " ")
    return " ".join(re.sub(r"[^\w' ]", " ", text).split())


def word_error_rate(reference: str, hypothesis: str) -> dict[str, float]:
    require("bench", "the word error rate")
    import jiwer

    out = jiwer.process_words(normalized(reference), normalized(hypothesis))
    return {"wer": float(out.wer), "substitutions": float(out.substitutions),
            "deletions": float(out.deletions), "insertions": float(out.insertions),
            "reference_words": float(len(normalized(reference).split()))}


def speaker_accuracy(turns: list[Any], script: list[dict[str, Any]]) -> dict[str, float] | None:
    """Share of words whose speaker label maps to the script speaker of the turn they fall in
    (labels mapped to script speakers one-to-one, the mapping that maximises matches). Words in
    overlapped speech or between turns are not counted. None when no word carries a speaker."""
    from scipy.optimize import linear_sum_assignment

    pairs: list[tuple[str, str]] = []
    for turn in turns:
        for w in turn.words:
            if w.speaker is None:
                continue
            mid = (w.start + w.end) / 2
            said = [t["speaker"] for t in script if t["start"] <= mid <= t["end"]]
            if len(said) == 1:
                pairs.append((w.speaker, said[0]))
    if not pairs:
        return None
    hyp = sorted({h for h, _ in pairs})
    ref = sorted({r for _, r in pairs})
    counts = np.zeros((len(hyp), len(ref)))
    for h, r in pairs:
        counts[hyp.index(h), ref.index(r)] += 1
    rows, cols = linear_sum_assignment(-counts)
    matched = float(counts[rows, cols].sum())
    return {"speaker_accuracy": matched / len(pairs), "speaker_words": float(len(pairs)),
            "speaker_labels": float(len(hyp))}


def rttm_turns(path: Path, file_id: str) -> list[dict[str, Any]]:
    """An RTTM's segments of one recording as scripted turns ({speaker, start, end}), for
    `speaker_accuracy` (a word in overlapped speech lies in two and is not counted)."""
    from voice.diarization_stage import SpeakerTimeline

    timeline = SpeakerTimeline.from_rttm(path.read_text(), file_id)
    if not timeline.segments:
        raise ValueError(f"{path} holds no segment of {file_id!r}")
    return [{"speaker": s.speaker, "start": s.start, "end": s.end} for s in timeline]


SLOWEST_KEPT = 5
"""Turns with the largest latency named in the JSON (where a tail comes from)."""


def _embedded_stage(args: argparse.Namespace) -> Any:
    """The embedded stage with `--live-set` overrides of its live settings."""
    from bench.diarization_live import settings_with
    from diarization.embedded import EmbeddedStage

    if args.diarizer != "embedded":
        raise SystemExit("--live-set is for the embedded stage")
    try:
        return EmbeddedStage(live=settings_with(args.live_set))
    except ValueError as exc:
        raise SystemExit(f"--live-set: {exc}") from exc


def _local_deepgram(audio_dir: Path) -> str:
    """Start the local Deepgram-protocol server on its own loop (a daemon thread); its URL."""
    from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords, ThreadedServer

    return ThreadedServer(DeepgramTestServer(MeetingWords.from_meeting(audio_dir))).url


def _stt(args: argparse.Namespace) -> Any:
    if args.stt == "deepgram":
        import os

        from voice.stt import load_stt

        if args.local_deepgram:
            return load_stt("deepgram", api_key="local", url=_local_deepgram(args.audio.parent))
        return load_stt("deepgram", api_key=os.environ.get("DEEPGRAM_API_KEY"),
                        url=os.environ.get("DEEPGRAM_URL"))
    from voice.stt.whisper import WhisperSTT

    options: dict[str, Any] = {}
    if args.max_utterance is not None:
        options["max_utterance"] = args.max_utterance
    if args.encoder_window is not None:
        options["encoder_window"] = args.encoder_window
    if args.no_voice_change_cuts:
        options["cut_at_voice_changes"] = False
    stt = WhisperSTT(args.whisper_model, **options)
    stt.model()  # load before timing: the RTF measures transcription, not the model load
    return stt


def _policy(args: argparse.Namespace) -> TurnPolicy:
    """The turn rules: `--config`'s `[voice]` (the defaults without one), the flags' overrides."""
    from server.config import load_config

    base = load_config(args.config).voice.policy()
    return TurnPolicy(early_commit=base.early_commit and not args.no_early_commit,
                      provisional_speakers=base.provisional_speakers and not args.no_provisional_speakers,
                      provisional_changes=base.provisional_changes and not args.no_provisional_changes,
                      speaker_wait=base.speaker_wait if args.speaker_wait is None else args.speaker_wait)


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from voice.audio import read_audio
    from voice.transcribe import transcribe_audio

    audio, rate = read_audio(args.audio)
    script_path = args.script
    if script_path is None and args.audio.resolve() == (MEETING / "meeting.wav").resolve():
        script_path = MEETING / "meeting.json"
    script = json.loads(script_path.read_text()) if script_path is not None else None
    reference = " ".join(t["text"] for t in script["turns"]) if script is not None else None
    speakers = (rttm_turns(args.reference, args.audio.stem) if args.reference is not None
                else script["turns"] if script is not None else None)
    duration = len(audio) / rate
    live = not (args.skip_latency or args.refine_speakers)
    passes = ([] if args.latency_only and live else [("fast", None)]) + (
        [("real-time", args.speed)] if live else [])
    figures: dict[str, Any] = {"audio": str(args.audio), "duration_s": round(duration, 2),
                               "stt": args.stt}
    load_started = time.perf_counter()
    stt = _stt(args)
    figures["model_load_s"] = round(time.perf_counter() - load_started, 2)
    for name, speed in passes:
        bar = tqdm(total=round(duration, 1), unit="s", desc=f"{name} pass", file=sys.stderr,
                   disable=args.no_progress, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}]")

        def progress(seconds: float, bar: Any = bar) -> None:
            done = round(min(seconds, duration), 1)
            if done > bar.n:
                bar.update(done - bar.n)

        diarizer = None
        if args.pipeline_speakers and args.live_set:
            diarizer = _embedded_stage(args)
        elif args.pipeline_speakers:
            from diarization import load_stage  # type: ignore[attr-defined,unused-ignore]

            diarizer = load_stage(args.diarizer)
        result = asyncio.run(transcribe_audio(audio, rate, stt=stt, speed=speed, progress=progress,
                                              pipeline_speakers=args.pipeline_speakers,
                                              diarizer=diarizer,
                                              refine_speakers=args.refine_speakers,
                                              policy=_policy(args)))
        bar.close()
        hypothesis = " ".join(t.text for t in result.turns)
        entry: dict[str, Any] = {"turns": len(result.turns), "wall_s": round(result.elapsed, 2),
                                 "real_time_factor": round(result.real_time_factor, 3),
                                 "early_corrections": result.corrections}
        if reference is not None:
            entry.update({k: round(v, 4)
                          for k, v in word_error_rate(reference, hypothesis).items()})
        attributed = speaker_accuracy(result.turns, speakers) if speakers is not None else None
        if attributed is not None:
            entry.update({k: round(v, 4) for k, v in attributed.items()})
        if speed:
            timed = [t for t in result.turns if t.latency is not None]
            latencies = np.array([t.latency for t in timed])
            entry["latency_p50_s"] = round(float(np.percentile(latencies, 50)), 3)
            entry["latency_p95_s"] = round(float(np.percentile(latencies, 95)), 3)
            entry["latency_max_s"] = round(float(latencies.max()), 3)
            entry["speed"] = speed
            entry["slowest_turns"] = [
                {"latency_s": round(lat, 3), "start": round(t.start, 2), "end": round(t.end, 2),
                 "speaker": t.speaker, "text": t.text[:120]}
                for lat, t in sorted(zip(latencies.tolist(), timed, strict=True),
                                     key=lambda pair: -pair[0])[:SLOWEST_KEPT]]
        figures[name] = entry
    print(f"Transcription bench: {args.audio.name} ({duration:.1f} s), STT {stt.describe()}"
          + (", pipeline speakers" if args.pipeline_speakers else ""))
    print(f"{'pass':<10} {'turns':>5} {'WER':>7} {'RTF':>7} {'p50 lat':>8} {'p95 lat':>8} "
          f"{'spk acc':>8}")
    for name, _ in passes:
        e = figures[name]
        wer = f"{e['wer']:>7.3f}" if "wer" in e else f"{'—':>7}"
        p50 = f"{e['latency_p50_s']:.2f} s" if "latency_p50_s" in e else "—"
        p95 = f"{e['latency_p95_s']:.2f} s" if "latency_p95_s" in e else "—"
        acc = f"{e['speaker_accuracy']:.3f}" if "speaker_accuracy" in e else "—"
        print(f"{name:<10} {e['turns']:>5} {wer} {e['real_time_factor']:>7.3f} "
              f"{p50:>8} {p95:>8} {acc:>8}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0
