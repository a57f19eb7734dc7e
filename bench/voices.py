"""Voices remembered across meetings (issue 27): how often the directory names a voice right.

`chorus bench voices [DIR]` (DIR: the LibriSpeech meetings fixture) runs every meeting of the
fixture through the live stage (`diarization.embedded.EmbeddedStage`, the stage `chorus serve`
gives a shared-mic stream), fed in 0.5 s chunks as fast as it answers (faster-than-real-time
replay: the same `feed` calls a live stream makes, without waiting for the wall clock). After
every feed it keeps the stage's `speaker_prints()` and the stretches of speech decided by that
feed; the identification (`voice.identify.StreamVoices`, what the server's rename hook runs on
each turn) is then replayed over them for any thresholds, cheaply. The stage's clustering is
anchored on the directory's people (`Anchors`), so each meeting is run once per directory. Each stretch
reads the name (or suggestion) its label held just after the feed that decided it; the server
names a turn when the turn is committed, which is no earlier, so the time to a first name here
is a lower bound of the server's.

Measured:

- **Thresholds** by leave-one-speaker-out over the five dev speakers and the five far-field dev
  meetings: directory = every speaker's enrollment clip (close and far prints) but the held-out
  one, who is the new voice; each meeting runs anchored on that directory, as a server's stage
  is (so 25 stage runs). `auto` minimises miss + 2 × wrong (a wrong name is
  worse than a letter) on the other folds, `suggest` then minimises (miss of named-or-suggested)
  + wrong suggestions; the held-out folds' errors are the figures to expect.
- **The voiceprint pair** (`*_vpA` / `*_vpB`, far renders, different rooms) at the chosen
  thresholds: the speakers of meeting A remembered from A (each voice's stage print, as
  `POST …/speakers/remember` keeps it, only with ≥ `min_speech_s` of speech), then meeting B;
  and the same with the enrollment clips instead. Per remembered speaker of B: the share of
  their speech time named correctly, and named-or-suggested correctly; the time from their
  first word to the first correct name; the share of all speech given a wrong name; and the
  time the speaker only B has is given any remembered name.

`--replay` (live path): each meeting goes through the models once; its other runs (the same
meeting anchored on other directories) replay the recorded window results through the stage's
clustering, aggregation and naming (`bench.window_tape`: a stage's model requests do not depend
on its anchors, and each played-back request is checked against the recorded one). The figures
are the same; the per-run seconds printed for a replayed run are the clustering's alone. With
`--set KEY=VALUE` (any `LiveSettings` field) it is a quick way to try the live clustering under
the bench's own folds.

`--path batch` measures the same for `chorus transcribe --voices` / `chorus diarize --voices`:
each meeting diarized once, whole, by the batch pipeline (`EmbeddedStage.diarize`; no anchors,
so one run per meeting serves every directory), each of its speakers printed again on the live
model from their lone speech (`diarization.directory.speaker_prints`) and the tiers run once over
the whole recording (`voice.identify.identify_once`, through the same `StreamVoices.update`):
one feed at the end, every stretch read under the name its label ended with, and with `verify`
each turn of the timeline checked (and with `claim`, claimed) as `chorus diarize --voices`
checks it (`diarization.directory.checked_timeline`). "Remembered from
meeting A" keeps each batch speaker's print of A, as `chorus voices` would from it with
≥ `min_speech_s` of lone speech. The first-name times are not a batch figure (a whole file is
named at once) and are not printed. The folds and the pair are scored at the `[voices]` defaults
(what `--voices` uses), with and without the check, and at the thresholds the batch folds chose.

`--path server` measures the pair as the issue words it, through a real `chorus serve` (its own
process: Whisper tiny.en, the embedded stage, a SQLite store, `[voices]` on at its defaults):
meeting A streamed at real-time pace by a shared-mic device and its speakers remembered through
`POST …/speakers/remember` (or, `--directory close-clips|far-clips`, enrolled through
`POST /v1/voices`), then meeting B streamed the same way; the turns are scored as they reached
the device, suggestions read from the room's feed (`bench._voices_server`). No folds there: one
server run per condition. Every path is scored by `score_shown` (stretches as shown: the
replay's feeds, the batch's one feed, the server's turns).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from voice.diarization_stage import SpeakerTimeline, StagePrints
from voice.identify import (
    IdentifySettings,
    KnownVoice,
    StreamVoices,
    TurnPrint,
    claimable,
    print_turn,
    stretch_turns,
    turn_clip,
    turn_person,
    worth_checking,
)

STEP_S = 0.5
GRID_S = 0.01
RATE = 16000
MIN_SPEECH_S = 5.0
"""What `remember` needs (`[voices] min_speech_s`)."""
WRONG_WEIGHT = 2.0

BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float32]
VERIFY_GRID: list[float | None] = [None, 0.30, 0.35, 0.40, 0.45, 0.50]
CLAIM_GRID: list[float | None] = [None, 0.40, 0.46, 0.50, 0.55, 0.60]
CLAIM_NEW_GRID: list[float | None] = [None, 0.40, 0.45, 0.50, 0.55, 0.60, 0.65]


@dataclass
class Fed:
    """What one feed left: the stage's prints after it, and the speech it decided."""

    at: float
    prints: StagePrints
    pieces: list[tuple[str, float, float]]


@dataclass
class Meeting:
    name: str
    duration: float
    reference: dict[str, BoolArray]
    fed: list[Fed] = field(default_factory=list)
    seconds: float = 0.0
    """Wall-clock seconds the stage took."""
    printer: Callable[[Sequence[tuple[float, float]]], TurnPrint | None] | None = None
    """The print of the meeting's audio over some spans (a turn's stretches), as the server
    prints a turn (`TurnPrints`); None: turns are not checked (`--path batch`)."""

    @property
    def speakers(self) -> list[str]:
        return sorted(self.reference)

    @property
    def speech(self) -> BoolArray:
        out: BoolArray = np.logical_or.reduce(list(self.reference.values()))
        return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    fixtures = Path(os.environ.get("CHORUS_FIXTURES", "../shared/fixtures"))
    parser.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=fixtures / "librispeech-meetings",
        help="the LibriSpeech meetings fixture (manifest.json, RTTMs, clips)",
    )
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument(
        "--render",
        choices=("far", "close"),
        default="far",
        help="the meetings' render: far (a table microphone in a room, default) or close",
    )
    parser.add_argument(
        "--path",
        choices=("live", "batch", "server"),
        default="live",
        help="live: the live stage fed in 0.5 s steps, as `chorus serve` (default); batch: the "
        "whole file diarized, then named once, as `chorus transcribe|diarize --voices`; server: "
        "the voiceprint pair only, streamed at real-time pace through a `chorus serve` of this "
        "checkout (Whisper tiny.en, the embedded stage), its turns scored as they arrived",
    )
    parser.add_argument(
        "--directory",
        choices=("remembered", "close-clips", "far-clips"),
        default="remembered",
        help="with --path server: the directory meeting B is named from: the speakers of meeting "
        "A remembered from its room (`POST …/speakers/remember`, default), or A's speakers "
        "enrolled from their close or far clips (`POST /v1/voices`; meeting A is not streamed)",
    )
    parser.add_argument(
        "--voices-set",
        action="append",
        default=[],
        metavar="KEY=NUMBER",
        help="with --path server: one `[voices]` setting of the server (repeatable; e.g. "
        "verify=-1: no turn is checked, auto=0.46; default: the [voices] defaults)",
    )
    parser.add_argument(
        "--stt-model",
        default=None,
        metavar="tiny.en|base|DIR",
        help="with --path server: the server's `[stt] model` (its live Whisper; default: the "
        "embedded default, tiny.en)",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="with --path server: stream only the first SECONDS of each meeting (a quick check; "
        "default: the whole meetings)",
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="live: each meeting through the models once; its other (anchored) runs replay the "
        "recorded window results through the clustering (bench.window_tape: the same figures, "
        "about five times faster)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="live: override one LiveSettings field of the stage (repeatable; a clustering trial)",
    )


def _frames(t: float) -> int:
    return round(t / GRID_S)


def _reference(rttm: Path, duration: float) -> dict[str, BoolArray]:
    n = _frames(duration) + 1
    out: dict[str, BoolArray] = {}
    for seg in SpeakerTimeline.read_rttm(rttm):
        grid = out.setdefault(seg.speaker, np.zeros(n, dtype=bool))
        grid[_frames(seg.start) : _frames(seg.end)] = True
    return out


def _delta(
    before: dict[tuple[str, float], float], timeline: SpeakerTimeline
) -> list[tuple[str, float, float]]:
    """The speech `timeline` decided that `before` (each run's end by (speaker, start)) had not."""
    pieces: list[tuple[str, float, float]] = []
    for seg in timeline.segments:
        key = (seg.speaker, round(seg.start, 4))
        old = before.get(key, seg.start)
        if seg.end > old:
            pieces.append((seg.speaker, old, seg.end))
        before[key] = seg.end
    return pieces


def run_meeting(
    stage: Any,
    audio: npt.NDArray[np.float32],
    name: str,
    reference: Path,
    directory: Sequence[KnownVoice] = (),
) -> Meeting:
    """Feed `audio` through the live stage in `STEP_S` chunks, its clustering anchored on the
    directory's people as a server's stage is (`Anchors`: each person's unit mean print);
    what each feed left."""
    duration = len(audio) / RATE
    meeting = Meeting(name, duration, _reference(reference, duration))
    anchors = {}
    for voice in directory:
        mean = voice.prints.sum(axis=0)
        anchors[voice.id] = (mean / np.linalg.norm(mean)).astype(np.float32)
    stage.anchor(anchors)
    stage.reset()
    seen: dict[tuple[str, float], float] = {}
    step = int(STEP_S * RATE)
    began = time.perf_counter()
    for k in range(0, len(audio), step):
        timeline = stage.feed(audio[k : k + step])
        meeting.fed.append(
            Fed(min(k + step, len(audio)) / RATE, stage.speaker_prints(), _delta(seen, timeline))
        )
    timeline = stage.flush()
    meeting.fed.append(Fed(duration, stage.speaker_prints(), _delta(seen, timeline)))
    meeting.seconds = time.perf_counter() - began
    return meeting


def batch_meeting(
    stage: Any, audio: npt.NDArray[np.float32], name: str, reference: Path
) -> Meeting:
    """The whole recording through the batch pipeline, its speakers printed on the live model
    (`diarization.directory`): one feed at the end holding every stretch (module docstring)."""
    from diarization.directory import speaker_prints

    duration = len(audio) / RATE
    meeting = Meeting(name, duration, _reference(reference, duration))
    began = time.perf_counter()
    timeline = stage.diarize(audio)
    prints = speaker_prints(stage, audio, timeline)
    meeting.fed.append(Fed(duration, prints, [(s.speaker, s.start, s.end) for s in timeline]))
    meeting.seconds = time.perf_counter() - began
    return meeting


@dataclass
class Outcome:
    """One meeting named by one directory at one pair of thresholds (speech frames)."""

    own: dict[str, int]
    """Remembered speaker → frames of their speech."""
    named: dict[str, int]
    """...named correctly."""
    named_or_suggested: dict[str, int]
    first_named: dict[str, float | None]
    """Seconds from their first speech to the first correct name (None: never)."""
    first_suggested: dict[str, float | None]
    wrong: int
    """Speech frames given a name not of a speaker talking then."""
    wrong_suggested: int
    speech: int
    strangers: dict[str, int]
    """Each speaker not in the directory → their speech frames."""
    strangers_named: dict[str, int]
    strangers_voice: dict[str, str | None]
    """Each speaker not in the directory → the name their own voice (the stage label holding
    most of their speech) ended with (None: it kept its letter)."""
    first_turn: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Remembered speaker → (speech frames of their first turn, frames of it named correctly).
    Their first turn: their speech from its first frame until someone else speaks while they do
    not (the meetings' turns are whole utterances, their pauses inside). The issue's target
    includes it when it lasts 3 s."""


@dataclass(frozen=True)
class Shown:
    """A stretch of one voice's speech as it was shown: its stage label, its span (seconds of the
    meeting), when it was shown (seconds from the meeting's start: the feed that decided it, or
    the arrival of the turn that carried it), the name it carried (tier auto) and the name
    suggested for its voice (tier suggest, when it carried none)."""

    label: str
    start: float
    end: float
    at: float
    name: str | None = None
    suggested: str | None = None


def label_grids(stretches: Iterable[tuple[str, float, float]], n: int) -> dict[str, BoolArray]:
    """Each label → the frames of an `n`-frame grid that its (label, start, end) stretches cover."""
    grids: dict[str, BoolArray] = {}
    for label, start, end in stretches:
        grids.setdefault(label, np.zeros(n, dtype=bool))[_frames(start) : _frames(end)] = True
    return grids


class TurnPrints:
    """Turns printed as the server prints them (`voice.identify.print_turn` over
    `EmbeddedStage.turn_voiceprint`: the audio as it is, a long turn's middle `TURN_MAX_S` only,
    whole and in parts, none under `TURN_MIN_S`), each once per meeting and spans (many directories' runs of one
    meeting share their turns)."""

    def __init__(self, stage: Any) -> None:
        self.stage = stage
        self._made: dict[tuple[str, tuple[tuple[float, float], ...]], TurnPrint | None] = {}

    def of(
        self, name: str, audio: FloatArray
    ) -> Callable[[Sequence[tuple[float, float]]], TurnPrint | None]:
        def printer(spans: Sequence[tuple[float, float]]) -> TurnPrint | None:
            key = (name, tuple((round(a, 3), round(b, 3)) for a, b in spans))
            if key not in self._made:
                clip = turn_clip(audio, spans, RATE)  # as the server and `--voices` print it
                self._made[key] = print_turn(clip, RATE, self.stage.turn_voiceprint)
            return self._made[key]

        return printer


def replay_turns(meeting: Meeting) -> list[list[tuple[str, float, float, int]]]:
    """The stretches every feed decided, (label, start, end, feed index), in time order and
    grouped in turns (`voice.identify.stretch_turns`, as `chorus diarize --voices` groups)."""
    pieces = [(label, t0, t1, k) for k, fed in enumerate(meeting.fed) for label, t0, t1 in fed.pieces]
    return [[pieces[k] for k in turn] for turn in stretch_turns([p[:3] for p in pieces])]


def replay_names(
    meeting: Meeting, directory: Sequence[KnownVoice], settings: IdentifySettings
) -> tuple[list[Shown], dict[str, str | None]]:
    """The identification replayed over the stage's feeds (`StreamVoices`, what the server's
    rename hook runs): each stretch under the name (or suggestion) its label held just after the
    feed that decided it; and the name each label ended with. With `settings.verify` (and a
    meeting that prints its turns) each turn is checked as the server checks it (`turn_person`,
    against the people named when its last stretch was decided): a turn of a named voice that
    does not match the person reads its letter throughout, and with `claim` a turn that reads
    no name of its voice reads the name of the person named for another voice it claims."""
    names = {v.id: v.name for v in directory}
    people = {v.id: v for v in directory}
    ids = {v.name: v.id for v in directory}
    state = StreamVoices()
    after: list[tuple[dict[str, tuple[str, str] | None], dict[str, str]]] = []
    for fed in meeting.fed:
        if fed.prints.model:
            state.update(fed.prints.prints, fed.prints.speech_s, directory, settings)
        after.append(
            (
                {k: (v.voice_id, v.name) for k, v in state.named.items()},
                {k: names[v] for k, v in state.suggested.items() if v in names},
            )
        )
    shown: list[Shown] = []
    for turn in replay_turns(meeting):
        label, last = turn[0][0], max(k for *_, k in turn)
        named = [after[k][0].get(label) for _, _, _, k in turn]
        own = next((people[n[0]] for n in named if n is not None), None)
        present, absent = claimable(
            label, {other: v[0] for other, v in after[last][0].items() if v},
            {ids[n] for n in after[last][1].values() if n in ids}, people,
        )
        reads: KnownVoice | None = own  # a turn not checked reads its voice's names as they come
        if meeting.printer is not None and worth_checking(own, present, settings, absent):
            made = meeting.printer([(t0, t1) for _, t0, t1, _ in turn])
            reads = turn_person(made, own, present, settings, absent)  # None print: its letter
        for (_, t0, t1, k), name in zip(turn, named, strict=True):
            if reads is own:  # its voice's name from the feed that named it on
                shown_name = name[1] if name else None
            else:  # claimed, or its letter
                shown_name = reads.name if reads is not None else None
            suggested = after[k][1].get(label) if shown_name is None else None
            shown.append(Shown(label, t0, t1, meeting.fed[k].at, shown_name, suggested))
    return shown, {label: state.name_of(label) for label in {s.label for s in shown}}


def name_meeting(
    meeting: Meeting, directory: Sequence[KnownVoice], settings: IdentifySettings
) -> Outcome:
    shown, final = replay_names(meeting, directory, settings)
    return score_shown(meeting.reference, shown, [v.name for v in directory], final)


def score_shown(
    ref: dict[str, BoolArray],
    shown: Sequence[Shown],
    directory: Sequence[str],
    final: dict[str, str | None],
) -> Outcome:
    """The scoring of every path (the replay, batch, the server's turns): `shown` (the stretches
    as named or suggested, any order) against the reference grids `ref`; `directory`: the
    remembered names; `final`: the name each label ended with."""
    n = len(next(iter(ref.values())))
    named = {name: np.zeros(n, dtype=bool) for name in directory}
    suggested = {name: np.zeros(n, dtype=bool) for name in directory}
    first_named: dict[str, float | None] = {name: None for name in directory}
    first_suggested: dict[str, float | None] = {name: None for name in directory}
    labels = label_grids(((s.label, s.start, s.end) for s in shown), n)
    for s in shown:
        lo, hi = _frames(s.start), min(_frames(s.end), n)
        if hi <= lo:
            continue
        target, first, name = named, first_named, s.name
        if name is None and s.suggested is not None:
            target, first, name = suggested, first_suggested, s.suggested
        if name is None or name not in target:
            continue
        target[name][lo:hi] = True
        if name in ref and ref[name][lo:hi].any():
            before = first[name]
            first[name] = s.at if before is None else min(before, s.at)
    speech: BoolArray = np.logical_or.reduce(list(ref.values()))
    own = {s: int(ref[s].sum()) for s in ref if s in named}
    start = {s: float(np.argmax(ref[s])) * GRID_S for s in own}
    anyone_named = np.logical_or.reduce([*named.values(), np.zeros(n, dtype=bool)])

    def wrong_of(grids: dict[str, BoolArray]) -> int:
        bad = np.zeros(n, dtype=bool)
        for name, grid in grids.items():
            bad |= grid & speech & ~ref.get(name, np.zeros(n, dtype=bool))
        return int(bad.sum())

    strangers = {s: int(ref[s].sum()) for s in ref if s not in named}
    first_turn: dict[str, tuple[int, int]] = {}
    for who in own:
        lo = int(np.argmax(ref[who]))
        ended = np.flatnonzero(~ref[who][lo:] & speech[lo:])  # someone else speaks, they do not
        hi = lo + (int(ended[0]) if len(ended) else n - lo)
        turn = ref[who][lo:hi]
        first_turn[who] = (int(turn.sum()), int((named[who][lo:hi] & turn).sum()))
    voice_of = {
        s: max(labels, key=lambda k: int((labels[k] & ref[s]).sum()), default=None)
        for s in strangers
    }
    return Outcome(
        own=own,
        named={s: int((named[s] & ref[s]).sum()) for s in own},
        named_or_suggested={s: int(((named[s] | suggested[s]) & ref[s]).sum()) for s in own},
        first_named={s: _after(first_named[s], start[s]) for s in own},
        first_suggested={s: _after(first_suggested[s], start[s]) for s in own},
        wrong=wrong_of(named),
        wrong_suggested=wrong_of(suggested),
        speech=int(speech.sum()),
        strangers=strangers,
        strangers_named={s: int((anyone_named & ref[s]).sum()) for s in strangers},
        strangers_voice={
            s: None if label is None else final.get(label) for s, label in voice_of.items()
        },
        first_turn=first_turn,
    )


def _after(at: float | None, start: float) -> float | None:
    return None if at is None else round(at - start, 2)


def _rates(outcomes: Iterable[Outcome]) -> tuple[float, float, float, float]:
    """(miss, wrong, miss of named-or-suggested, wrong suggestions) over outcomes, by time."""
    items = list(outcomes)
    own = sum(sum(o.own.values()) for o in items) or 1
    speech = sum(o.speech for o in items) or 1
    named = sum(sum(o.named.values()) for o in items)
    either = sum(sum(o.named_or_suggested.values()) for o in items)
    wrong = sum(o.wrong for o in items)
    wrong_s = sum(o.wrong_suggested for o in items)
    return 1 - named / own, wrong / speech, 1 - either / own, (wrong + wrong_s) / speech


def _clip_voices(
    stage: Any,
    folder: Path,
    enrollment: list[dict[str, Any]],
    kinds: Sequence[str],
    without: str | None = None,
) -> list[KnownVoice]:
    from voice.audio import read_audio_16k

    out: list[KnownVoice] = []
    for entry in enrollment:
        speaker = entry["speaker"]
        if speaker == without:
            continue
        rows = [
            stage.live_voiceprint(read_audio_16k(folder / entry[kind]["file"])) for kind in kinds
        ]
        out.append(KnownVoice(speaker, speaker, np.stack(rows).astype(np.float32)))
    return out


def one_label_each(
    reference: dict[str, BoolArray], labels: dict[str, BoolArray]
) -> dict[str, str]:
    """Each reference speaker → the stage label holding most of their speech, one label per
    speaker (as a person remembers each voice once): the largest overlaps are taken first, and
    a speaker whose every overlapping label went to someone else gets none."""
    pairs = sorted(
        (
            (int((grid & ref).sum()), speaker, label)
            for speaker, ref in reference.items()
            for label, grid in labels.items()
        ),
        key=lambda p: (-p[0], p[1], p[2]),
    )
    out: dict[str, str] = {}
    for overlap, speaker, label in pairs:
        if overlap > 0 and speaker not in out and label not in out.values():
            out[speaker] = label
    return out


def remembered_from(meeting: Meeting) -> list[KnownVoice]:
    """Each reference speaker of `meeting` as `remember` would keep them: the final print of the
    stage voice that holds most of their speech (`one_label_each`), when it spoke at least
    `MIN_SPEECH_S`."""
    n = len(meeting.speech)
    heard: dict[str, BoolArray] = {}
    for fed in meeting.fed:
        for label, t0, t1 in fed.pieces:
            heard.setdefault(label, np.zeros(n, dtype=bool))[_frames(t0) : _frames(t1)] = True
    final = meeting.fed[-1].prints
    chosen = one_label_each(
        meeting.reference, {k: g for k, g in heard.items() if k in final.prints}
    )
    return [
        KnownVoice(speaker, speaker, final.prints[label][None, :])
        for speaker, label in chosen.items()
        if final.speech_s.get(label, 0.0) >= MIN_SPEECH_S
    ]


AUTO_GRID = [round(0.30 + 0.02 * i, 2) for i in range(26)]


def _with(settings: IdentifySettings, name: str, value: float | None) -> IdentifySettings:
    """`settings` with its `verify`, `claim` or `claim_new` (`name`) at `value`."""
    if name == "verify":
        return dataclasses.replace(settings, verify=value)
    if name == "claim":
        return dataclasses.replace(settings, claim=value)
    return dataclasses.replace(settings, claim_new=value)


def _choose(
    trials: list[tuple[str, Meeting, list[KnownVoice]]],
    fixed_auto: float | None = None,
    verify_grid: Sequence[float | None] = (None,),
) -> IdentifySettings:
    """The settings minimising the module's costs over `trials`: `auto` first (turns not
    checked), then `verify` at that `auto` (miss + 2 × wrong again; unchecked on a tie), then
    `claim` at those (none on a tie), then `claim_new` (none on a tie), then `suggest`."""
    if fixed_auto is None:
        costs = {}
        for auto in AUTO_GRID:
            settings = IdentifySettings(auto=auto, suggest=auto)
            miss, wrong, _, _ = _rates(name_meeting(m, d, settings) for _, m, d in trials)
            costs[auto] = miss + WRONG_WEIGHT * wrong
        fixed_auto = min(costs, key=lambda a: (costs[a], -a))
    base = IdentifySettings(auto=fixed_auto, suggest=fixed_auto)

    def cheapest(name: str, grid: Sequence[float | None]) -> float | None:
        costs: dict[float | None, float] = {}
        for value in grid:
            settings = _with(base, name, value)
            miss, wrong, _, _ = _rates(name_meeting(m, d, settings) for _, m, d in trials)
            costs[value] = miss + WRONG_WEIGHT * wrong
        return min(grid, key=lambda v: (round(costs[v], 9), v is not None, v or 0.0))

    base = _with(base, "verify", cheapest("verify", verify_grid))
    for name, grid in (("claim", CLAIM_GRID), ("claim_new", CLAIM_NEW_GRID)):
        base = _with(base, name, cheapest(name, grid if base.verify is not None else (None,)))
    costs = {}
    for suggest in [a for a in AUTO_GRID if a <= fixed_auto]:
        settings = IdentifySettings(auto=fixed_auto, suggest=suggest)
        _, _, miss_s, wrong_s = _rates(name_meeting(m, d, settings) for _, m, d in trials)
        costs[suggest] = miss_s + wrong_s
    return dataclasses.replace(base, suggest=min(costs, key=lambda s: (costs[s], -s)))


def _fold_at(
    test: list[tuple[str, Meeting, list[KnownVoice]]], held: str, settings: IdentifySettings
) -> dict[str, Any]:
    """A held-out fold's errors at `settings` (the figures of the fold table)."""
    outcomes = [name_meeting(m, d, settings) for _, m, d in test]
    miss, wrong, miss_s, wrong_s = _rates(outcomes)
    stranger = sum(o.strangers_named.get(held, 0) for o in outcomes)
    stranger_time = sum(o.strangers.get(held, 0) for o in outcomes) or 1
    own_voice = [o.strangers_voice[held] for o in outcomes if held in o.strangers_voice]
    return {
        "miss": miss,
        "wrong": wrong,
        "miss_named_or_suggested": miss_s,
        "wrong_with_suggestions": wrong_s,
        "held_out_named": stranger / stranger_time,
        "held_out_voice_named": sum(v is not None for v in own_voice),
        "held_out_meetings": len(own_voice),
    }


def unchecked(settings: IdentifySettings) -> IdentifySettings:
    """`settings` with no turn checked (nor claimed)."""
    return dataclasses.replace(settings, verify=None, claim=None, claim_new=None)


def unclaimed(settings: IdentifySettings) -> IdentifySettings:
    """`settings` with turns checked but none claimed."""
    return dataclasses.replace(settings, claim=None, claim_new=None)


def _verify(v: float | None) -> str:
    return "  off" if v is None else f"{v:5.2f}"


def describe(settings: IdentifySettings) -> str:
    """The tiers and checks of `settings` as the bench prints them."""
    return (
        f"auto {settings.auto:.2f}, suggest {settings.suggest:.2f}, verify "
        f"{_verify(settings.verify).strip()}, claim {_verify(settings.claim).strip()}, "
        f"claim_new {_verify(settings.claim_new).strip()}"
    )


def _pct(x: float) -> str:
    return f"{100 * x:5.1f} %"


def _pair(
    meeting: Any,
    conditions: dict[str, list[KnownVoice]],
    settings: IdentifySettings,
    b_name: str,
    in_a: list[str],
    *,
    batch: bool,
) -> dict[str, Any]:
    """Meeting B named by each directory of `conditions` at `settings`; printed and returned."""
    out: dict[str, Any] = {}
    print(
        f"\nmeeting B ({b_name}) at {describe(settings)}; directory: "
        f"the speakers of meeting A ({', '.join(in_a)})"
    )
    for label, directory in conditions.items():
        b = meeting(b_name, directory, label)
        out[label] = pair_row(
            label, [v.id for v in directory], name_meeting(b, directory, settings), batch=batch
        )
    return out


def pair_row(label: str, directory: list[str], o: Outcome, *, batch: bool) -> dict[str, Any]:
    """Meeting B's figures under one directory (`o`), printed; the pair's JSON row."""
    row: dict[str, Any] = {"directory": directory, "speakers": {}}
    print(f"  {label}: {len(directory)} voices")
    for s in sorted(o.own):
        share = o.named[s] / o.own[s]
        either = o.named_or_suggested[s] / o.own[s]
        row["speakers"][s] = {
            "named": share,
            "named_or_suggested": either,
            "first_named_after_s": None if batch else o.first_named[s],
            "first_suggested_after_s": None if batch else o.first_suggested[s],
            "speech_s": o.own[s] * GRID_S,
            "first_turn_s": o.first_turn[s][0] * GRID_S,
            "first_turn_named": o.first_turn[s][1] / max(o.first_turn[s][0], 1),
        }
        when = "" if batch else (
            f"; first name {o.first_named[s]} s after they began, first suggestion "
            f"{o.first_suggested[s]} s"
        )
        print(
            f"    {s}: named {_pct(share)} of {o.own[s] * GRID_S:.1f} s, named or "
            f"suggested {_pct(either)}{when}; their first turn ({o.first_turn[s][0] * GRID_S:.1f} s) "
            f"named {_pct(row['speakers'][s]['first_turn_named'])}"
        )
    row["wrong"] = o.wrong / o.speech
    row["wrong_suggested"] = o.wrong_suggested / o.speech
    row["strangers_named"] = {
        s: o.strangers_named[s] / max(o.strangers[s], 1) for s in o.strangers
    }
    row["strangers_voice_named"] = o.strangers_voice
    print(
        f"    wrong names {_pct(row['wrong'])} of the speech, wrong suggestions "
        f"{_pct(row['wrong_suggested'])}; speech of speakers not remembered given a "
        "name: "
        + ", ".join(
            f"{s} {_pct(v)} (their own voice: {o.strangers_voice[s] or 'its letter'})"
            for s, v in row["strangers_named"].items()
        )
    )
    return row


def run(args: argparse.Namespace) -> int:
    if getattr(args, "path", "live") == "server":
        from bench._voices_server import run_server

        return run_server(args)
    from bench.diarization_live import settings_with
    from diarization.embedded import EmbeddedStage
    from server.config import VoicesConfig
    from voice.audio import read_audio_16k

    defaults = VoicesConfig().identify_settings()  # the [voices] defaults (`--voices`, serve)
    folder: Path = args.dir
    manifest = json.loads((folder / "manifest.json").read_text())
    batch = getattr(args, "path", "live") == "batch"
    tape = None
    if getattr(args, "replay", False) and not batch:
        from bench.window_tape import WindowTape
        from diarization.live import default_service

        tape = WindowTape(default_service())
    stage = EmbeddedStage(live=settings_with(getattr(args, "set", [])), service=tape)
    audio_of: dict[str, Any] = {}
    batched: dict[str, Meeting] = {}
    turn_prints = TurnPrints(stage)

    def meeting(name: str, directory: Sequence[KnownVoice], why: str) -> Meeting:
        if name not in audio_of:
            audio_of[name] = read_audio_16k(folder / f"{name}.flac")
        if batch:  # no anchors: one run of a meeting serves every directory
            if name not in batched:
                batched[name] = batch_meeting(stage, audio_of[name], name, folder / f"{name}.rttm")
                m = batched[name]
                m.printer = turn_prints.of(name, audio_of[name])
                print(f"  {name}: {m.duration:.0f} s through the batch pipeline and printed in "
                      f"{m.seconds:.1f} s", flush=True)
            return batched[name]
        how = "through the live stage"
        if tape is not None and not tape.start(name):
            how = "replayed through the clustering"
        m = run_meeting(stage, audio_of[name], name, folder / f"{name}.rttm", directory)
        m.printer = turn_prints.of(name, audio_of[name])
        print(f"  {name} ({why}): {m.duration:.0f} s {how} in {m.seconds:.1f} s", flush=True)
        return m

    enrollment = manifest["enrollment"]
    speakers = sorted(e["speaker"] for e in enrollment)
    render = getattr(args, "render", "far")
    far = [e["id"] for e in manifest["files"] if e["id"].endswith(f"_{render}")]
    # -- thresholds: leave one speaker out ------------------------------------------------
    directories = {
        h: _clip_voices(stage, folder, enrollment, ("close", "far"), without=h) for h in speakers
    }
    trials = [
        (h, meeting(name, directories[h], f"without {h}"), directories[h])
        for h in speakers
        for name in far
    ]
    folds: list[dict[str, Any]] = []
    for held in speakers:
        chosen = _choose([t for t in trials if t[0] != held], verify_grid=VERIFY_GRID)
        test = [t for t in trials if t[0] == held]
        folds.append(
            {
                "held_out": held,
                "auto": chosen.auto,
                "suggest": chosen.suggest,
                "verify": chosen.verify,
                "claim": chosen.claim,
                "claim_new": chosen.claim_new,
                **_fold_at(test, held, chosen),
                **(
                    {"unchecked": _fold_at(test, held, unchecked(chosen))}
                    if chosen.verify is not None else {}
                ),
                **(
                    {"unclaimed": _fold_at(test, held, unclaimed(chosen))}
                    if unclaimed(chosen) != chosen else {}
                ),
                **({"at_defaults": _fold_at(test, held, defaults),
                    "at_defaults_unchecked": _fold_at(test, held, unchecked(defaults))}
                   if batch else {}),
            }
        )
    chosen = _choose(trials, verify_grid=VERIFY_GRID)
    print(
        f"\nleave-one-speaker-out over the {render} renders (directory: the other speakers' clips, "
        "close + far prints)"
    )
    print(
        "held out  auto  suggest  verify  claim  new    miss     wrong    miss(n|s) wrong(n+s) "
        "held-out named  its own voice named   (miss, wrong: turns unchecked; checked, none "
        "claimed)"
    )
    for f in folds:
        also = [f[k] for k in ("unchecked", "unclaimed") if k in f]
        print(
            f"{f['held_out']:8}  {f['auto']:.2f}  {f['suggest']:.2f}     {_verify(f['verify'])}  "
            f"{_verify(f['claim'])}  {_verify(f['claim_new'])}  {_pct(f['miss'])}  "
            f"{_pct(f['wrong'])}  {_pct(f['miss_named_or_suggested'])}  "
            f"{_pct(f['wrong_with_suggestions'])}   {_pct(f['held_out_named'])}        "
            f"{f['held_out_voice_named']} of {f['held_out_meetings']} meetings   "
            + "; ".join(f"{_pct(x['miss'])}, {_pct(x['wrong'])}" for x in also)
        )
    if batch:
        print("the same held-out folds at the [voices] defaults (what --voices uses), "
              f"{describe(defaults)}:")
        for f in folds:
            d = f["at_defaults"]
            print(
                f"{f['held_out']:8}  {defaults.auto:.2f}  "
                f"{defaults.suggest:.2f}     {_verify(defaults.verify)}  {_verify(defaults.claim)}  "
                f"{_verify(defaults.claim_new)}  "
                f"{_pct(d['miss'])}  {_pct(d['wrong'])}  "
                f"{_pct(d['miss_named_or_suggested'])}  {_pct(d['wrong_with_suggestions'])}   "
                f"{_pct(d['held_out_named'])}        {d['held_out_voice_named']} of "
                f"{f['held_out_meetings']} meetings   "
                f"{_pct(f['at_defaults_unchecked']['miss'])}, "
                f"{_pct(f['at_defaults_unchecked']['wrong'])}"
            )
    print(
        f"chosen on every fold: {describe(chosen)} (folds: auto "
        f"{min(f['auto'] for f in folds):.2f}–{max(f['auto'] for f in folds):.2f}, median "
        f"{statistics.median(f['auto'] for f in folds):.2f})"
    )
    # -- the voiceprint pair -------------------------------------------------------------
    pair = manifest["voiceprint_pair"]
    a = meeting(pair["files"][render]["A"], (), "meeting A, nobody remembered yet")
    in_a = sorted(a.reference)
    conditions = {
        f"remembered from meeting A ({render})": remembered_from(a),
        "enrolled from close clips": [
            v for v in _clip_voices(stage, folder, enrollment, ("close",)) if v.id in in_a
        ],
        "enrolled from far clips": [
            v for v in _clip_voices(stage, folder, enrollment, ("far",)) if v.id in in_a
        ],
    }
    report: dict[str, Any] = {
        "path": "batch" if batch else "live", "auto": chosen.auto, "suggest": chosen.suggest,
        "verify": chosen.verify, "claim": chosen.claim, "claim_new": chosen.claim_new,
        "folds": folds,
        "pair": {}, "live_settings": getattr(args, "set", []), "replay": tape is not None,
    }
    b_name = pair["files"][render]["B"]
    tiers = [chosen]
    if batch and chosen != defaults:
        tiers.insert(0, defaults)  # what `--voices` uses: the [voices] defaults
        tiers.insert(0, unchecked(defaults))  # ...unchecked
        report["pair_at"] = {}
    if chosen.verify is not None:  # the same, each turn unchecked and unclaimed (what each does)
        tiers.insert(0, unchecked(chosen))
        if unclaimed(chosen) != chosen:
            tiers.insert(1, unclaimed(chosen))
        report["pair_at"] = {}
    for settings in tiers:
        pair_report = _pair(
            meeting, conditions, settings, b_name, in_a, batch=batch
        )
        if "pair_at" in report:
            report["pair_at"][
                f"{settings.auto:.2f}/{settings.suggest:.2f}/{_verify(settings.verify).strip()}"
                f"/{_verify(settings.claim).strip()}/{_verify(settings.claim_new).strip()}"
            ] = pair_report
        report["pair"] = pair_report
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0
