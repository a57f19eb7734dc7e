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

**Echo** (`--echo-losses`): the reply's speech (the demo meeting's, at −20 dBFS RMS over its
speech), played back to the rule as the caller's only sound, attenuated by each echo loss and
40 ms late: a phone or an echo-cancelled microphone returning the reply it plays. Linear
attenuation only (a real echo canceller leaves non-linear residue too). **Fires** per minute of
reply: replies stopped by their own echo.

**Through echo cancellation** (`--aec-echo-losses`): the page's case. A laptop on the meeting
table plays the reply into the room its microphone hears, and the browser's echo cancellation
takes it out. Each recording with the reply playing all along, through a small room (a direct
path and a tail decaying by 1/e every 50 ms) at each loss and 40 ms late, then through WebRTC's
audio processing (AEC3, noise suppression, a high-pass filter and automatic gain, the switches
the page turns on; the build LiveKit's `livekit` package ships, `rtc.AudioProcessingModule`),
scored as above (wide band) for the rules a page may run: the server's rule for a microphone
that cancels echo (what a page declaring `server_barge_in` gets), the page's own level rule,
and the phone rule. A linear room: a loudspeaker's distortion is not in it.

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
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    from server.reply_audio import BargeIn

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
DEFAULT_FLOORS = (-160.0, -60.0, -55.0, -50.0, -45.0, -40.0, -35.0)
DEFAULT_ECHO_LOSSES = (20.0, 30.0, 40.0, 46.0, 55.0)
REPLY_DBFS = -20.0
"""The reply's speech level (RMS over its speech) for the echo part."""
ECHO_DELAY_S = 0.04
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
    parser.add_argument(
        "--echo-losses", type=float, nargs="*", default=list(DEFAULT_ECHO_LOSSES),
        help="echo losses (dB) at which to play the reply back as the caller's only sound "
        "(none: skip the echo part)",
    )  # fmt: skip
    parser.add_argument(
        "--aec-echo-losses", type=float, nargs="*", default=[],
        help="echo losses (dB) at which the reply plays into each room and WebRTC's echo "
        "cancellation takes it out, as a browser's does (the page's case; needs the livekit "
        "extra)",
    )  # fmt: skip
    parser.add_argument(
        "--echo-criterion", type=float, default=30.0,
        help="the echo loss (dB) at which a floor must never fire (default 30: where the level "
        "gate before stopped firing)",
    )  # fmt: skip
    parser.add_argument(
        "--reply", type=Path, default=None,
        help="the reply's speech for the echo part (WAV with an RTTM beside it; default: the "
        "demo meeting)",
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


def reply_speech(path: Path | None) -> FloatArray:
    """The reply for the echo part: 16 kHz, its speech at `REPLY_DBFS` RMS."""
    from voice.audio import read_audio_16k
    from voice.diarization_stage import SpeakerTimeline

    wav = path or Path(__file__).resolve().parents[1] / "examples" / "meeting" / "meeting.wav"
    audio = read_audio_16k(wav)
    speech = np.zeros(len(audio), bool)
    for seg in SpeakerTimeline.read_rttm(wav.with_suffix(".rttm")):
        speech[int(seg.start * 16000) : int(seg.end * 16000)] = True
    rms = float(np.sqrt(np.mean(np.square(audio[speech], dtype=np.float64))))
    return (audio * (10 ** (REPLY_DBFS / 20) / rms)).astype(np.float32)


def echo_fires(rule: Rule, reply: FloatArray, loss_db: float, band: str) -> Score:
    """The reply returned as echo, `loss_db` under it and `ECHO_DELAY_S` late, as one reply's
    worth of the caller's audio: the rule's fires over it."""
    echo = np.concatenate([np.zeros(int(ECHO_DELAY_S * 16000), np.float32),
                           reply * 10 ** (-loss_db / 20)]).astype(np.float32)  # fmt: skip
    pcm, rate = band_audio(echo, band)
    return score_file(pcm, rate, [], [(0.0, len(echo) / 16000)], rule)


ECHO_DECAY_S = 0.05
"""The echo room's impulse response decays by 1/e in this long (about a 0.35 s RT60)."""


def echo_room_ir(rate: int, loss_db: float) -> npt.NDArray[np.float64]:
    """The small room a loudspeaker's sound reaches its microphone through (here, and
    `bench.barge_in`'s echoing phone): a direct path and a tail decaying by 1/e every
    `ECHO_DECAY_S`, 0.3 s long at `rate`, its energy `loss_db` under the sound's."""
    rng = np.random.default_rng(0)
    length = int(0.3 * rate)
    ir = rng.standard_normal(length) * np.exp(-np.arange(length) / (ECHO_DECAY_S * rate)) * 0.3
    ir[0] = 1.0
    scaled: npt.NDArray[np.float64] = ir / np.sqrt(np.sum(ir**2)) * 10 ** (-loss_db / 20)
    return scaled


def room_echo(far: FloatArray, loss_db: float) -> FloatArray:
    """`far` as the microphone hears it from the loudspeaker: through a small room, `loss_db`
    under it, `ECHO_DELAY_S` late."""
    echo = np.convolve(far, echo_room_ir(16000, loss_db))[: len(far)]
    late = np.concatenate([np.zeros(int(ECHO_DELAY_S * 16000)), echo])[: len(far)]
    return late.astype(np.float32)


def echo_cancelled(near: FloatArray, far: FloatArray) -> bytes:
    """`near` (16 kHz) through WebRTC's audio processing with `far` as what the loudspeaker
    plays: AEC3, noise suppression, a high-pass filter, automatic gain (the page's switches);
    pcm16."""
    try:
        from livekit import rtc
    except ImportError as exc:  # pragma: no cover - the extra is part of `make install`
        raise SystemExit("--aec-echo-losses needs the livekit extra: pip install "
                         "'chorus[livekit]'") from exc  # fmt: skip
    from voice.audio import float_to_pcm16

    apm = rtc.AudioProcessingModule(echo_cancellation=True, noise_suppression=True,
                                    high_pass_filter=True, auto_gain_control=True)  # fmt: skip
    played = np.frombuffer(float_to_pcm16(far), "<i2")
    heard = np.frombuffer(float_to_pcm16(np.clip(near, -1.0, 1.0)), "<i2")
    step = 160  # 10 ms, the only size it takes
    out = bytearray()
    for i in range(0, len(heard) - step + 1, step):
        apm.process_reverse_stream(rtc.AudioFrame(played[i : i + step].tobytes(), 16000, 1, step))
        frame = rtc.AudioFrame(heard[i : i + step].tobytes(), 16000, 1, step)
        apm.set_stream_delay_ms(round(ECHO_DELAY_S * 1000))
        apm.process_stream(frame)
        out += bytes(frame.data)
    return bytes(out)


def aec_table(recordings: list[Recording], reply: FloatArray, losses: list[float]
              ) -> dict[str, Any]:  # fmt: skip
    """Every recording with the reply playing into its room at each loss, after echo
    cancellation: the page's possible rules, pooled over the recordings."""
    from server.reply_audio import (
        BARGE_IN_FLOOR_DBFS,
        BARGE_IN_S,
        ECHO_CANCELLED_BARGE_IN_S,
        ECHO_CANCELLED_FLOOR_DBFS,
    )
    from voice.audio import read_audio_16k

    table = {
        "vad 256 ms ≥ −45 dBFS (server_barge_in)": vad_rule(ECHO_CANCELLED_BARGE_IN_S,
                                                            ECHO_CANCELLED_FLOOR_DBFS),
        "level 0.02 240 ms (the page's own)": level_rule(20 * math.log10(PAGE_LEVEL), PAGE_HOLD),
        "vad 64 ms ≥ −40 dBFS (phones)": vad_rule(BARGE_IN_S, BARGE_IN_FLOOR_DBFS),
    }  # fmt: skip
    out: dict[str, Any] = {}
    totals = {loss: {name: Score() for name in table} for loss in losses}
    for rec in recordings:
        audio = read_audio_16k(rec.name)
        far = np.resize(reply, len(audio)).astype(np.float32)  # the reply, all along
        for loss in losses:
            pcm = echo_cancelled(audio + room_echo(far, loss), far)
            for name, rule in table.items():
                totals[loss][name].add(score_file(pcm, 16000, rec.onsets, rec.quiet, rule))
    print("\nThe reply playing into each room, through echo cancellation (wide band):\n")
    print("| echo loss | rule | onsets | delay p50 | delay p90 | missed | quiet (s) | fires "
          "| fires per min |\n|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for loss in losses:
        for name, total in totals[loss].items():
            row = total.row()
            out.setdefault(f"{loss:g}", {})[name] = row
            print(_line(f"{loss:g} dB", name, "wide", row).replace("| wide ", "", 1))
    return out


def vad_name(barge: BargeIn, what: str) -> str:
    hold_ms = barge.hold_frames * 32
    return f"vad {hold_ms} ms ≥ {barge.floor_dbfs:g} dBFS ({what})".replace("-", "−")


def echo_table(losses: list[float], reply: FloatArray, floors: list[float],
               criterion_db: float) -> dict[str, Any]:  # fmt: skip
    """The level gates before and the server's two rules on the reply's echo at each loss; then,
    for each of the server's holds, the lowest of `floors` with no fire on the echo
    `criterion_db` under the reply (how the floors were chosen)."""
    from server.reply_audio import BargeIn, echo_cancelled_barge_in

    phone, mic = BargeIn(), echo_cancelled_barge_in()
    table = rules([])  # the level gates
    table[vad_name(phone, "phones now")] = vad_rule(phone.hold_s, phone.floor_dbfs)
    table[vad_name(mic, "echo_cancelled now")] = vad_rule(mic.hold_s, mic.floor_dbfs)
    print("\nEcho: the reply played back as the caller's only sound (fires per minute of reply):\n")
    print("| rule | band | " + " | ".join(f"{loss:g} dB" for loss in losses) + " |")
    print("|---|---|" + "---:|" * len(losses))
    out: dict[str, Any] = {"fires_per_min": {}, "floors": {}}
    for band in BANDS:
        for name, rule in table.items():
            row = {f"{loss:g}": echo_fires(rule, reply, loss, band).row()["fires_per_min"]
                   for loss in losses}  # fmt: skip
            out["fires_per_min"].setdefault(band, {})[name] = row
            print(f"| {name} | {band} | " + " | ".join(f"{v:.1f}" for v in row.values()) + " |")
    print(f"\nThe lowest floor with no fire on the echo {criterion_db:g} dB under the reply:\n")
    for what, barge in (("phones", phone), ("echo_cancelled", mic)):
        fires = {floor: sum(echo_fires(vad_rule(barge.hold_s, floor), reply, criterion_db, band)
                            .fires for band in BANDS) for floor in sorted(floors)}  # fmt: skip
        clean = [floor for floor, n in fires.items() if n == 0]
        chosen = clean[0] if clean else None
        out["floors"][what] = {"hold_s": barge.hold_s, "chosen": chosen,
                               "fires": {f"{k:g}": v for k, v in fires.items()}}  # fmt: skip
        print(f"- {what} ({barge.hold_frames * 32} ms): " + ", ".join(
            f"{k:g} dBFS: {v}" for k, v in fires.items()) + f"; chosen: {chosen}")
    return out


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
    print("\nLeave one set out (the hold chosen on the other sets, scored on the set):\n")
    print("| set left out | rule chosen | band | onsets | delay p50 | delay p90 | missed "
          "| quiet (s) | fires | fires per min |\n"
          "|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    pooled = {band: Score() for band in BANDS}
    folds: list[dict[str, Any]] = []
    for folder, members in sorted(by_folder.items()):
        others = [r for r in recordings if r.group != folder]
        chosen = choose_hold(others, hold_names) if others else hold_names[0]
        for band in BANDS:
            total = Score()
            for rec in members:
                total.add(rec.scores[band][chosen])
            pooled[band].add(total)
            row = total.row()
            folds.append({"set": folder, "rule": chosen, "band": band, **row})
            print(_line(folder, chosen, band, row))
    report["cross_validation"] = {"hold": folds}
    pooled_rows = {band: pooled[band].row() for band in BANDS}
    report["cross_validated"] = {"hold": pooled_rows}
    for band in BANDS:
        print(_line("all (each set as left out)", "", band, pooled_rows[band]))
    report["chosen_on_all"] = {"hold": choose_hold(recordings, hold_names)}
    print(f"\nthe hold chosen on every set: {report['chosen_on_all']['hold']}")
    if args.echo_losses:
        report["echo"] = echo_table(sorted(args.echo_losses), reply_speech(args.reply), floors,
                                    args.echo_criterion)
    if args.aec_echo_losses:
        report["aec"] = aec_table(recordings, reply_speech(args.reply),
                                  sorted(args.aec_echo_losses))
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
