"""`chorus transcribe AUDIO`: a recording → per-speaker turns, through the live VoiceChannel path.

Whisper decodes the file in long stretches of speech (`--decoding batch`, the default: no live
latency to meet, so none of the live path's short pieces); the words are then split by speaker.

Speakers come from the STT's own labels (Deepgram) or, with `--pipeline-speakers`, from a
diarization stage (`--diarizer embedded|pyannote`). `--rename "Speaker A=Alice"` renames a voice
(an ON_TRANSCRIPTION hook, as an application would). `--realtime openai|gemini|recorder` then
replays the turns into a realtime session and prints what the model was sent.
`--voices` (with `--pipeline-speakers`) names the voices from the voice directory
(docs/voices.md): a sure one's name replaces its letter on its turns, a likely one keeps its
letter with the suggestion in the JSON and on stderr ("Speaker B — maybe Ian?"). With
`[voices] verify` (on by default) each turn is checked on its own audio as the server checks it
(`diarization.directory.TurnChecks`): a turn that does not sound like its speaker's person reads
the letter, and with `claim` a turn may read the name of a person named for another speaker.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from voice.frontend import LISTENERS
from voice.transcribe import FORMATS


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "transcribe",
        help="transcribe a recording into per-speaker turns",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    parser.add_argument("audio", type=Path, help="audio file (WAV, FLAC, OGG; any rate, any channels)")
    parser.add_argument("--stt", choices=("whisper", "deepgram"), default="whisper",
                        help="speech-to-text: local Whisper tiny.en (default, offline) or Deepgram "
                             "streaming (DEEPGRAM_API_KEY; optional DEEPGRAM_URL)")
    parser.add_argument("--format", choices=FORMATS, default="text", help="output format")
    parser.add_argument("--rename", action="append", default=[], metavar="LABEL=NAME",
                        help='rename a voice, e.g. --rename "Speaker A=Alice" (repeatable)')
    parser.add_argument("--pipeline-speakers", action="store_true",
                        help="take speakers from a diarization stage instead of the STT")
    parser.add_argument("--diarizer", choices=("embedded", "pyannote"), default="embedded",
                        help="diarization stage for --pipeline-speakers (default: embedded)")
    parser.add_argument("--live-diarization", action="store_true",
                        help="with --pipeline-speakers: decide speakers as a live stream would "
                             "(online, never revised) instead of diarizing the whole file first")
    parser.add_argument("--num-speakers", type=int, default=None,
                        help="number of speakers, when known (diarization stage)")
    parser.add_argument("--min-speakers", type=int, default=None,
                        help="at least this many speakers (embedded diarization stage)")
    parser.add_argument("--max-speakers", type=int, default=None,
                        help="at most this many speakers (diarization stage)")
    parser.add_argument("--enroll", action="append", default=[], metavar="NAME=clip.wav",
                        help="with --pipeline-speakers: name a voice from a clip of it, so its "
                             "turns carry the name from the first one (repeatable)")
    parser.add_argument("--voices", action="store_true",
                        help="with --pipeline-speakers: name voices from the voice directory "
                             "(`chorus voices`; the store and [voices] thresholds of --config): "
                             "named when sure, suggested when likely")
    parser.add_argument("--model", "--whisper-model", dest="whisper_model", default=None,
                        metavar="tiny.en|base|DIR",
                        help="Whisper model: tiny.en (shipped), base (multilingual; the "
                             "whisper-base extra) or a faster-whisper model directory; never "
                             "downloaded (default: base where installed, else tiny.en)")
    parser.add_argument("--decoding", choices=("batch", "pieces"), default="batch",
                        help="Whisper: batch (default) decodes long stretches of speech in "
                             "Whisper's 30 s window, for accuracy; pieces decodes the live path's "
                             "short utterances (what a live stream gets)")
    parser.add_argument("--language", default=None,
                        help="language a multilingual Whisper model decodes (default en; auto: "
                             "detected per utterance)")
    parser.add_argument("--realtime", choices=("openai", "gemini", "recorder"), default=None,
                        help="replay the turns into a realtime session and print what it was sent")
    parser.add_argument("--front-end", default="none", metavar="none|wpe|denoise|wpe+denoise",
                        help="clean the recording first (voice.frontend: WPE dereverberation "
                             "with the dereverb extra, noise suppression with the denoise extra; "
                             "default none, see docs/benchmarks.md for what each does to WER)")
    parser.add_argument("--front-end-for", choices=LISTENERS, default="stt",
                        help="who hears the cleaned recording (default: the recogniser)")
    parser.add_argument("--output", "-o", type=Path, default=None, help="write here instead of stdout")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--config", type=Path, default=None, metavar="chorus.toml",
                        help="the turn rules from this file's [voice] section, as `chorus serve` "
                             "reads them (CHORUS_VOICE_* variables too); with --voices, its "
                             "[store] and [voices] too")
    parser.set_defaults(run=run)


def _stt(args: argparse.Namespace) -> Any:
    from voice.stt import load_stt

    if args.stt == "deepgram":  # without the `deepgram` extra: MissingExtra, its one line
        return load_stt("deepgram", api_key=os.environ.get("DEEPGRAM_API_KEY"),
                        url=os.environ.get("DEEPGRAM_URL"))
    from voice.stt.whisper import WhisperSTT
    from voice.stt.whisper_models import default_batch_model

    model = args.whisper_model or (default_batch_model() if args.decoding == "batch" else None)
    return WhisperSTT(model, language=args.language or "en", batch=args.decoding == "batch")


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from cli.commands.checks import UsageError, check_count, check_writable, prepare_parent
    from cli.commands.voices import DirectoryUnavailable, remembered_voices
    from diarization.directory import DirectoryNames, TurnChecks, name_speakers
    from server.config import ConfigError, load_config
    from voice.audio import AudioError, read_audio
    from voice.diarization_stage import ClipPrints, SpeakerTimeline
    from voice.frontend import check_front_end, front_end_audio
    from voice.transcribe import format_turns, parse_renames, transcribe_audio

    try:
        check_count(args.num_speakers, "--num-speakers")
        check_writable(args.output, "--output")
    except UsageError as exc:
        print(f"chorus transcribe: error: {exc}", file=sys.stderr)
        return 2
    try:
        policy = load_config(args.config).voice.policy()
    except ConfigError as exc:
        print(f"chorus transcribe: error: {exc}", file=sys.stderr)
        return 2
    directory: tuple[list[Any], Any] | None = None
    try:
        renames = parse_renames(args.rename)
        if args.realtime:
            from realtime.providers import require_provider

            require_provider(args.realtime)  # before the transcription, not after it
        check_front_end(args.front_end)
        audio, rate = read_audio(args.audio)
        stt = _stt(args)
        diarizer = None
        if args.enroll and not args.pipeline_speakers:
            raise ValueError("--enroll names voices for the diarization stage: add --pipeline-speakers")
        if args.voices and not args.pipeline_speakers:
            raise ValueError("--voices names the diarization stage's voices: add --pipeline-speakers")
        if args.voices and args.live_diarization:
            raise ValueError("--voices names the voices of the whole file's diarization: "
                             "drop --live-diarization")
        if args.voices:
            directory = remembered_voices(args.config)  # before the models: fail early
        if args.pipeline_speakers:
            from diarization import enroll_voices, load_stage, parse_enrollments

            clips = parse_enrollments(args.enroll)
            diarizer = load_stage(
                args.diarizer,
                num_speakers=args.num_speakers,
                min_speakers=args.min_speakers,
                max_speakers=args.max_speakers,
            )
            enroll_voices(diarizer, clips)
            if args.voices and not isinstance(diarizer, ClipPrints):
                raise ValueError(f"--voices: the {args.diarizer} stage cannot print voices on "
                                 "the directory's model (use the embedded stage)")
    except DirectoryUnavailable as exc:
        print(f"chorus transcribe: error: {exc}", file=sys.stderr)
        return 2
    except (AudioError, FileNotFoundError, ImportError, ValueError, RuntimeError) as exc:
        print(f"chorus transcribe: error: {exc}", file=sys.stderr)
        return 2
    duration = len(audio) / rate
    bar = tqdm(total=round(duration, 1), unit="s", desc="transcribing", file=sys.stderr,
               disable=args.no_progress, bar_format="{l_bar}{bar}| {n:.1f}/{total:.1f} s [{elapsed}]")

    def progress(seconds: float) -> None:
        done = round(min(seconds, duration), 1)
        if done > bar.n:
            bar.update(done - bar.n)

    if args.front_end != "none":
        print(f"chorus transcribe: front end {args.front_end} ({duration:.0f} s of audio)…",
              file=sys.stderr)
    heard, diarized = front_end_audio(args.front_end, args.front_end_for, audio, rate)
    found: list[DirectoryNames] = []
    checks: list[TurnChecks] = []
    name_voices: Callable[[SpeakerTimeline, Any], dict[str, str]] | None = None
    name_turn: Callable[[str, float, float], str] | None = None
    if directory is not None:
        voices, thresholds = directory
        settings = thresholds.identify_settings()
        enrolled = set(clips)
        printer = diarizer

        def from_directory(timeline: SpeakerTimeline, whole: Any) -> dict[str, str]:
            assert isinstance(printer, ClipPrints)
            anonymous = [s for s in timeline.speakers if s not in enrolled]
            names = name_speakers(printer, whole, timeline, voices, settings, anonymous=anonymous)
            found.append(names)
            checks.append(TurnChecks(printer, whole, names, voices, settings, anonymous=anonymous))
            return names.named

        def checked(label: str, start: float, end: float) -> str:
            return checks[-1].reads(label, [(start, end)]) if checks else label

        name_voices = from_directory
        name_turn = checked if settings.verify is not None else None

    try:
        result = asyncio.run(transcribe_audio(
            heard, rate, stt=stt, pipeline_speakers=args.pipeline_speakers, diarizer=diarizer,
            renames=renames, progress=progress, refine_speakers=not args.live_diarization,
            policy=policy, diarizer_audio=diarized, name_speakers=name_voices,
            name_turn=name_turn))
    except (ConnectionError, OSError) as exc:
        bar.close()
        print(f"chorus transcribe: error: {args.stt}: {exc}", file=sys.stderr)
        return 1
    bar.close()
    for error in result.errors:
        print(f"chorus transcribe: error: {error}", file=sys.stderr)
    turns = result.turns
    for names in found:  # the letter stays; the suggestion rides its turns (JSON) and stderr
        turns = [dataclasses.replace(t, suggestion=names.suggested.get(t.label or ""))
                 if t.speaker == t.label else t for t in turns]
        for line in names.lines():
            print(f"chorus transcribe: {line}", file=sys.stderr)
    for check in checks:
        for line in check.lines():
            print(f"chorus transcribe: {line}", file=sys.stderr)
    text = format_turns(turns, args.format, file_id=args.audio.stem)
    if args.output is not None:
        prepare_parent(args.output)
        args.output.write_text(text)
    else:
        sys.stdout.write(text)
    print(f"{len(result.turns)} turns from {duration:.1f} s of audio in {result.elapsed:.1f} s "
          f"(real-time factor {result.real_time_factor:.3f}, {result.stt})", file=sys.stderr)
    if args.realtime:
        from realtime import replay_turns  # type: ignore[attr-defined,unused-ignore]

        replayed: Any = replay_turns([t.as_json() for t in turns], provider=args.realtime)
        if inspect.isawaitable(replayed):
            replayed = asyncio.run(_await(replayed))
        print(replayed)
    return 1 if result.errors else 0


async def _await(awaitable: Any) -> Any:
    return await awaitable
