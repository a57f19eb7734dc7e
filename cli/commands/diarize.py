"""`chorus diarize AUDIO --rttm OUT.rttm`: who spoke when in one recording (rules P1–P4, V8).

Runs a diarization stage (embedded by default, or pyannote) on the whole file, writes RTTM (file
id = the audio file's name without extension), optionally names enrolled voices
(`--enroll NAME=clip.wav`, repeatable), draws the timeline (`--plot`, with the reference's when
`--reference` is given) and scores against the reference (DER at collar 0 and 0.25 s).
`--voices` names the voices from the voice directory (docs/voices.md) in tiers: a sure one's
name replaces its letter in the RTTM, a likely one keeps its letter and is reported
("Speaker B — maybe Ian?"); the store and thresholds are `--config`'s, as `chorus voices` reads.
With `[voices] verify` (on by default) each turn of the RTTM (a speaker's stretches in a row) is
checked as the server checks a turn (`diarization.directory.checked_timeline`): a turn that does
not sound like its speaker's person keeps the letter, and with `claim` a turn may read the name
of a person named for another speaker that it sounds like.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("diarize", help="who spoke when: write RTTM (and a plot)")
    parser.add_argument("audio", type=Path, metavar="AUDIO", help="audio file (WAV, FLAC, …)")
    parser.add_argument(
        "--rttm", type=Path, required=True, metavar="OUT.rttm", help="RTTM to write"
    )
    parser.add_argument("--diarizer", choices=["embedded", "pyannote"], default="embedded")
    parser.add_argument(
        "--num-speakers", type=int, default=None, metavar="N", help="exactly N speakers"
    )
    parser.add_argument(
        "--min-speakers", type=int, default=None, metavar="N", help="at least N (embedded)"
    )
    parser.add_argument("--max-speakers", type=int, default=None, metavar="N", help="at most N")
    parser.add_argument(
        "--clustering",
        choices=["ahc", "nme-sc"],
        default=None,
        help="embedded: how speakers are clustered and counted (default: ahc; docs/diarization.md)",
    )
    parser.add_argument(
        "--enroll",
        action="append",
        default=[],
        metavar="NAME=clip.wav",
        help="name a voice from a clip of it (repeatable)",
    )
    parser.add_argument("--plot", type=Path, default=None, metavar="timeline.png")
    parser.add_argument(
        "--reference",
        type=Path,
        default=None,
        metavar="REF.rttm",
        help="reference RTTM: drawn in the plot and scored",
    )
    parser.add_argument(
        "--voices",
        action="store_true",
        help="name voices from the voice directory (`chorus voices`): named when sure, "
        "suggested when likely ([voices] auto / suggest)",
    )
    parser.add_argument(
        "--config", default=None, metavar="chorus.toml",
        help="with --voices: the file naming the store and the [voices] thresholds",
    )
    parser.add_argument("--pipeline", default=None, help="pyannote: hub id or local directory")
    parser.add_argument(
        "--hf-token", default=None, help="pyannote: Hugging Face token for a hub id"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from cli.commands.checks import UsageError, check_count, check_writable, prepare_parent
    from diarization import load_stage
    from voice.audio import AudioError, read_audio_16k
    from voice.diarization_stage import ClipPrints, SpeakerTimeline

    try:
        check_count(args.num_speakers, "--num-speakers")
        check_count(args.max_speakers, "--max-speakers")
        check_writable(args.rttm, "--rttm")
        check_writable(args.plot, "--plot")
    except UsageError as exc:
        print(f"chorus diarize: error: {exc}", file=sys.stderr)
        return 2
    if args.reference is not None or args.plot is not None:
        from models.extras import require

        # before the diarizing, not after it (cli.main prints the hint)
        require("bench", "scoring and plotting (--reference, --plot)")
    enrollments: list[tuple[str, Path]] = []
    for item in args.enroll:
        name, sep, clip = item.partition("=")
        if not sep or not name.strip() or not clip:
            print(f"--enroll wants NAME=clip.wav, got {item!r}", file=sys.stderr)
            return 2
        enrollments.append((name.strip(), Path(clip)))
    try:
        audio = read_audio_16k(args.audio)
        clips = [(name, read_audio_16k(clip)) for name, clip in enrollments]
    except (AudioError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    directory = None
    if args.voices:
        from cli.commands.voices import DirectoryUnavailable, remembered_voices

        try:  # before the model work: a store that cannot be read stops the command now
            directory = remembered_voices(args.config)
        except DirectoryUnavailable as exc:
            print(f"chorus diarize: error: {exc}", file=sys.stderr)
            return 2
    reference = None
    file_id = args.audio.stem
    if args.reference is not None:
        if not args.reference.is_file():
            print(f"error: reference not found: {args.reference}", file=sys.stderr)
            return 2
        reference = SpeakerTimeline.read_rttm(args.reference, file_id)
        if not reference.segments:
            print(
                f"warning: {args.reference} has no turns for file id {file_id!r}", file=sys.stderr
            )
    try:
        stage = load_stage(
            args.diarizer,
            num_speakers=args.num_speakers,
            min_speakers=args.min_speakers,
            max_speakers=args.max_speakers,
            pipeline=args.pipeline,
            hf_token=args.hf_token,
            clustering=args.clustering,
        )
        for name, clip in clips:
            stage.enroll(name, clip)
        if directory is not None and not isinstance(stage, ClipPrints):
            raise ValueError(f"--voices: the {args.diarizer} stage cannot print voices on the "
                             "directory's model (use the embedded stage)")
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    duration = len(audio) / 16000
    started = time.perf_counter()
    try:
        timeline = stage.diarize(audio)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    named_lines: list[str] = []
    if directory is not None:
        from diarization.directory import TurnChecks, checked_timeline, name_speakers

        voices, thresholds = directory
        settings = thresholds.identify_settings()
        assert isinstance(stage, ClipPrints)
        anonymous = [s for s in timeline.speakers if s not in dict(clips)]
        names = name_speakers(stage, audio, timeline, voices, settings, anonymous=anonymous)
        checks = TurnChecks(stage, audio, names, voices, settings, anonymous=anonymous)
        timeline = checked_timeline(checks, timeline)  # `verify` off: every turn its name
        named_lines = names.lines() + checks.lines()
    prepare_parent(args.rttm)
    args.rttm.write_text(timeline.to_rttm(file_id))
    speakers = timeline.speakers
    print(
        f"{args.audio}: {duration:.1f} s, {len(speakers)} speaker(s): {', '.join(speakers) or 'none'}"
        f"; {elapsed:.2f} s (RTF {elapsed / max(duration, 1e-9):.3f})"
    )
    for line in named_lines:
        print(line)
    print(f"wrote {args.rttm}")
    if reference is not None:
        from diarization.scoring import score_collars

        scores = score_collars(reference, timeline, duration=duration, uri=file_id)
        print(
            "DER: " + ", ".join(f"{s.der * 100:.1f} % (collar {c:g} s)" for c, s in scores.items())
        )
    if args.plot is not None:
        from diarization.plot import plot_timelines

        prepare_parent(args.plot)
        plot_timelines(
            timeline,
            args.plot,
            reference=reference,
            duration=duration,
            title=f"{file_id} ({args.diarizer})",
        )
        print(f"wrote {args.plot}")
    return 0
