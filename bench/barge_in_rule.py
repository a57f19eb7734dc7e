"""The barge-in rule alone, on the fixture rooms: how soon it hears someone start talking, and
whether the room's own sound (noise, reverberation, a far microphone's hiss) ever sets it off.

`chorus bench barge_in_rule` runs `server.reply_audio.BargeIn` (Silero VAD: `--holds` of speech
at the server's level floor, and the server's hold at each of `--floors`) and, beside it, the
level gates it replaced (60 ms at −35 dBFS, the phones' rule before; 240 ms at an RMS of 0.02,
the page's rule and the devices' before) on every recording of the fixture sets that has a
reference (RTTM), as if a reply were playing all along, in 20 ms frames:
- wide band: the recording at 16 kHz (a device, a LiveKit participant);
- phone band: 8 kHz through G.711 µ-law and back (a SIP, Twilio or AudioSocket caller).

Two kinds of moment, both from the reference:
- **onsets**: where someone starts talking after at least 0.5 s in which nobody did (a person
  talking over a reply they were listening to). The rule hears from 0.3 s before; **delay** is
  from the reference onset to the frame the barge-in completes on; **missed**: none within 2 s.
  The reference marks whole utterances, so a delay includes the utterance's own lead-in.
- **quiet**: every stretch of 1 s or more that nobody talks in, from 0.2 s after a turn to 0.1 s
  before the next, each as a reply of its own; **fires**: barge-ins there, each one a reply cut
  off by the room itself.

The hold (`--holds`, at the server's floor) is chosen leave-one-set-out (a set is a fixture
folder): for each set, the shortest hold with no fire in the quiet of the other sets (both
bands), scored on the set left out. The level floor is not chosen here: it guards against what
no fixture holds, a phone's residual echo of the reply (speech to a VAD, tens of dB under the
reply), and the `--floors` rows (at the server's hold) measure what each floor costs in onsets.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float32]

FRAME_S = 0.02
QUIET_BEFORE_S = 0.5
"""An onset counts when nobody talked for this long before it."""
LEAD_S = 0.3
"""The rule hears this much of the quiet before an onset."""
LIMIT_S = 2.0
"""An onset the rule has not heard by then is missed."""
QUIET_MIN_S = 1.0
AFTER_TURN_S = 0.2
BEFORE_TURN_S = 0.1
PHONE_LEVEL_DBFS = -35.0
PHONE_LEVEL_HOLD = 3
PAGE_LEVEL = 0.02
PAGE_HOLD = 12
DEFAULT_HOLDS = (0.064, 0.096, 0.128, 0.16, 0.256)
DEFAULT_FLOORS = (-160.0, -60.0, -55.0, -50.0, -45.0, -40.0)
BANDS = ("wide", "phone")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fixtures = Path(os.environ.get("CHORUS_FIXTURES", "../shared/fixtures"))
    parser.add_argument(
        "dirs", nargs="*", type=Path,
        default=[fixtures / name for name in ("ami", "pyannote-sample",
                                              "librispeech-conversations", "librispeech-meetings")],
        help="fixture folders (audio with an RTTM beside it, or an RTTM in the folder naming the "
        "file; default: AMI, pyannote's sample, the LibriSpeech conversations and meetings)",
    )  # fmt: skip
    parser.add_argument(
        "--holds", type=float, nargs="+", default=list(DEFAULT_HOLDS),
        help="speech holds of the VAD rule to score, in seconds",
    )  # fmt: skip
    parser.add_argument(
        "--floors", type=float, nargs="+", default=list(DEFAULT_FLOORS),
        help="level floors of the VAD rule to score at the server's hold, in dBFS (the first, "
        "far below any audio, stands for no floor)",
    )  # fmt: skip
    parser.add_argument("--json", type=Path, help="write the figures here")


@dataclass
class Score:
    """One rule on some recordings."""

    delays: list[float] = field(default_factory=list)
    """Per onset, seconds (math.inf: missed)."""
    early: int = 0
    """Onsets the rule fired on before they began (in the quiet before)."""
    quiet_s: float = 0.0
    fires: int = 0

    def add(self, other: Score) -> None:
        self.delays += other.delays
        self.early += other.early
        self.quiet_s += other.quiet_s
        self.fires += other.fires

    def row(self) -> dict[str, Any]:
        heard = [d for d in self.delays if math.isfinite(d)]
        return {
            "onsets": len(self.delays),
            "delay_p50_ms": _ms(heard, 50), "delay_p90_ms": _ms(heard, 90),
            "missed": (len(self.delays) - len(heard)) / len(self.delays) if self.delays else 0.0,
            "early": self.early,
            "quiet_s": self.quiet_s, "fires": self.fires,
            "fires_per_min": 60 * self.fires / self.quiet_s if self.quiet_s else 0.0,
        }  # fmt: skip


def _ms(values: list[float], q: float) -> float | None:
    return round(1000 * float(np.percentile(values, q))) if values else None


Rule = Callable[[], Callable[[bytes, int], bool]]
"""A fresh rule (a reply starts): a callable told each 20 ms frame (pcm16, rate), True when it
completes a barge-in."""


def vad_rule(hold_s: float, floor_dbfs: float | None = None) -> Rule:
    from server.reply_audio import BARGE_IN_FLOOR_DBFS, BargeIn

    floor = BARGE_IN_FLOOR_DBFS if floor_dbfs is None else floor_dbfs

    def fresh() -> Callable[[bytes, int], bool]:
        barge = BargeIn(hold_s, floor)
        return lambda pcm, rate: barge.heard(pcm, rate, playing=True)

    return fresh


def level_rule(threshold_dbfs: float, hold_frames: int) -> Rule:
    from voice.audio import level_dbfs, pcm16_to_float

    def fresh() -> Callable[[bytes, int], bool]:
        run = 0

        def heard(pcm: bytes, rate: int) -> bool:
            nonlocal run
            loud = level_dbfs(pcm16_to_float(pcm)) >= threshold_dbfs
            run = run + 1 if loud else 0
            if run >= hold_frames:
                run = 0
                return True
            return False

        return heard

    return fresh


def floor_name(floor_dbfs: float) -> str:
    from server.reply_audio import BARGE_IN_S

    return f"vad {round(BARGE_IN_S * 1000)} ms ≥ {floor_dbfs:g} dBFS".replace("-", "−")


def rules(holds: Iterable[float], floors: Iterable[float] = ()) -> dict[str, Rule]:
    """The level gates, the VAD rule at each hold (the server's floor), and the VAD rule at the
    server's hold at each floor."""
    from server.reply_audio import BARGE_IN_S

    out = {
        "level −35 dBFS 60 ms (phones before)": level_rule(PHONE_LEVEL_DBFS, PHONE_LEVEL_HOLD),
        "level 0.02 240 ms (the page; devices before)": level_rule(
            20 * math.log10(PAGE_LEVEL), PAGE_HOLD),
    }  # fmt: skip
    for hold in holds:
        out[f"vad {round(hold * 1000)} ms"] = vad_rule(hold)
    for floor in floors:
        out[floor_name(floor)] = vad_rule(BARGE_IN_S, floor)
    return out


def band_audio(audio16k: FloatArray, band: str) -> tuple[bytes, int]:
    """The recording as a leg of `band` hears it: pcm16 and its rate."""
    from voice.audio import float_to_pcm16, mulaw_decode, mulaw_encode, resample

    if band == "wide":
        return float_to_pcm16(audio16k), 16000
    narrow = np.frombuffer(float_to_pcm16(resample(audio16k, 16000, 8000)), "<i2")
    return mulaw_decode(mulaw_encode(narrow)).tobytes(), 8000


def moments(spans: list[tuple[float, float]], duration: float
            ) -> tuple[list[float], list[tuple[float, float]]]:  # fmt: skip
    """Onsets after `QUIET_BEFORE_S` of nobody talking, and the quiet stretches to score."""
    onsets: list[float] = []
    quiet: list[tuple[float, float]] = []
    reach = 0.0
    for start, end in sorted(spans):
        if start - reach >= QUIET_BEFORE_S and start >= QUIET_BEFORE_S:
            onsets.append(start)
        if start - reach >= QUIET_MIN_S and reach > 0.0:
            quiet.append((reach + AFTER_TURN_S, start - BEFORE_TURN_S))
        reach = max(reach, end)
    if duration - reach >= QUIET_MIN_S and reach > 0.0:
        quiet.append((reach + AFTER_TURN_S, duration - BEFORE_TURN_S))
    return onsets, quiet


def score_file(pcm: bytes, rate: int, onsets: list[float], quiet: list[tuple[float, float]],
               rule: Rule) -> Score:  # fmt: skip
    step = int(rate * FRAME_S) * 2
    total = len(pcm) // step
    score = Score()

    def frames(a: float, b: float) -> Iterable[tuple[int, bytes]]:
        for i in range(max(0, round(a / FRAME_S)), min(total, round(b / FRAME_S))):
            yield i, pcm[i * step : (i + 1) * step]

    for onset in onsets:
        heard = rule()
        delay = math.inf
        for i, frame in frames(onset - LEAD_S, onset + LIMIT_S):
            if heard(frame, rate):
                t = (i + 1) * FRAME_S
                if t < onset:
                    score.early += 1
                    continue
                delay = t - onset
                break
        score.delays.append(delay)
    for a, b in quiet:
        heard = rule()
        score.quiet_s += b - a
        score.fires += sum(heard(frame, rate) for _, frame in frames(a, b))
    return score


@dataclass
class Recording:
    name: str
    group: str
    """Its fixture folder: the unit of leave-one-set-out."""
    render: str
    """close, far, or "" (a recording of one render)."""
    onsets: list[float]
    quiet: list[tuple[float, float]]
    scores: dict[str, dict[str, Score]] = field(default_factory=dict)
    """band → rule → score."""


def load_recordings(dirs: list[Path]) -> list[Recording]:
    import soundfile as sf

    from voice.diarization_stage import SpeakerTimeline

    out: list[Recording] = []
    for folder in dirs:
        if not folder.is_dir():
            raise SystemExit(f"not a folder: {folder}")
        shared = sorted(folder.glob("*.rttm"))
        for audio in sorted(p for p in folder.iterdir() if p.suffix in (".wav", ".flac")):
            own = audio.with_suffix(".rttm")
            texts = [own.read_text()] if own.is_file() else [p.read_text() for p in shared]
            spans = [(s.start, s.end) for text in texts
                     for s in SpeakerTimeline.from_rttm(text, audio.stem)]  # fmt: skip
            if not spans:
                continue
            render = next((r for r in ("close", "far") if audio.stem.endswith(f"_{r}")), "")
            onsets, quiet = moments(spans, float(sf.info(str(audio)).duration))
            out.append(Recording(str(audio), folder.name, render, onsets, quiet))
    return out


def choose_hold(recordings: list[Recording], vad_names: list[str]) -> str:
    """The shortest hold with no fire in the quiet of `recordings` (both bands); else the one
    with the fewest fires."""
    fires = {name: sum(r.scores[b][name].fires for r in recordings for b in BANDS)
             for name in vad_names}  # fmt: skip
    clean = [name for name in vad_names if fires[name] == 0]
    return clean[0] if clean else min(vad_names, key=lambda n: fires[n])


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from voice.audio import read_audio_16k

    recordings = load_recordings(list(args.dirs))
    if not recordings:
        print("no recording with a reference to score", file=sys.stderr)
        return 2
    holds = sorted(args.holds)
    floors = sorted(args.floors)
    table = rules(holds, floors)
    hold_names = [f"vad {round(hold * 1000)} ms" for hold in holds]
    for rec in tqdm(recordings, desc="recordings", unit="file", file=sys.stderr):
        audio = read_audio_16k(rec.name)
        for band in BANDS:
            pcm, rate = band_audio(audio, band)
            rec.scores[band] = {name: score_file(pcm, rate, rec.onsets, rec.quiet, rule)
                                for name, rule in table.items()}  # fmt: skip

    groups: dict[str, list[Recording]] = {}
    for rec in recordings:
        key = f"{rec.group}-{rec.render}" if rec.render else rec.group
        groups.setdefault(key, []).append(rec)
    report: dict[str, Any] = {"holds": holds, "floors": floors, "sets": {}}
    print("\n| set | rule | band | onsets | delay p50 | delay p90 | missed | quiet (s) | fires "
          "| fires per min |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, members in [*sorted(groups.items()), ("all", recordings)]:
        for band in BANDS:
            for name in table:
                total = Score()
                for rec in members:
                    total.add(rec.scores[band][name])
                row = total.row()
                report["sets"].setdefault(key, {}).setdefault(band, {})[name] = row
                print(_line(key, name, band, row))

    by_folder: dict[str, list[Recording]] = {}
    for rec in recordings:
        by_folder.setdefault(rec.group, []).append(rec)
    choices: list[tuple[str, Callable[[list[Recording], list[str]], str], list[str]]] = [
        ("hold", choose_hold, hold_names)]
    for what, choose, names in choices:
        print(f"\nLeave one set out (the {what} chosen on the other sets, scored on the set):\n")
        print("| set left out | rule chosen | band | onsets | delay p50 | delay p90 | missed "
              "| quiet (s) | fires | fires per min |\n"
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
        pooled = {band: Score() for band in BANDS}
        folds = report.setdefault("cross_validation", {}).setdefault(what, [])
        for folder, members in sorted(by_folder.items()):
            others = [r for r in recordings if r.group != folder]
            chosen = choose(others, names) if others else names[0]
            for band in BANDS:
                total = Score()
                for rec in members:
                    total.add(rec.scores[band][chosen])
                pooled[band].add(total)
                row = total.row()
                folds.append({"set": folder, "rule": chosen, "band": band, **row})
                print(_line(folder, chosen, band, row))
        for band in BANDS:
            row = pooled[band].row()
            report.setdefault("cross_validated", {}).setdefault(what, {})[band] = row
            print(_line("all (each set as left out)", "", band, row))
        report.setdefault("chosen_on_all", {})[what] = choose(recordings, names)
        print(f"\nthe {what} chosen on every set: {report['chosen_on_all'][what]}")
    if args.json:
        report["recordings"] = [
            {"name": r.name, "set": r.group, "render": r.render, "onsets": len(r.onsets),
             "quiet_s": sum(b - a for a, b in r.quiet),
             "scores": {band: {n: {**s.row(), "delays": [d if math.isfinite(d) else None
                                                          for d in s.delays]}
                               for n, s in by.items()}
                        for band, by in r.scores.items()}}
            for r in recordings
        ]  # fmt: skip
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    return 0


def _line(key: str, name: str, band: str, row: dict[str, Any]) -> str:
    def ms(v: float | None) -> str:
        return "—" if v is None else f"{v} ms"

    return (f"| {key} | {name} | {band} | {row['onsets']} | {ms(row['delay_p50_ms'])} "
            f"| {ms(row['delay_p90_ms'])} | {100 * row['missed']:.1f} % | {row['quiet_s']:.0f} "
            f"| {row['fires']} | {row['fires_per_min']:.1f} |")  # fmt: skip
