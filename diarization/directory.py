"""A whole recording's speakers named from the voice directory, in tiers (issue 27.2, batch).

`chorus transcribe --voices` and `chorus diarize --voices` diarize a file in batch
(`diarization.batch`: the whole-network CAM++ export) and then ask the directory who its voices
are. The directory's prints come from another model, the live trunk and pooling
(`diarization.live_models`, model id = the trunk file's stem, stored with each print), so the
batch pipeline's own embeddings are never compared with them: each batch speaker's print is made
here again on the model the directory's prints came from (the stage's `ClipPrints`:
`live_model`, `live_voiceprint`), from that speaker's speech in the timeline where nobody else
speaks, in pieces of at most `PIECE_S` (each VAD-trimmed, the pieces' prints averaged by length,
as a live voice's centroid averages its windows). Only people with prints of that model are
compared; a speaker with less than `IdentifySettings.min_heard_s` of such speech is not scored.

The tiers are the live ones (`voice.identify.identify_once`, the same function and thresholds
`chorus serve` runs on each turn): `auto` names the speaker, `suggest` leaves its letter and
reports the name, below is anonymous; one voice never takes two names, two voices never one.
Nothing of a print leaves this module: the result holds labels, names and scores only.

Then each turn is checked as the server checks it (`TurnChecks`, with `[voices] verify` and
`claim`: `voice.identify.turn_person` on the turn's own print, on the same model): a turn of a
named speaker that does not sound like the person reads the speaker's letter, and a turn that
reads no name of its speaker's may read the name of a person named for another speaker of the
recording that it sounds like (`claim`), or of a remembered person named for none (`claim_new`).
`chorus transcribe --voices` checks its word turns;
`chorus diarize --voices` checks the timeline's turns (`checked_timeline`: a label's stretches
in a row, `voice.identify.stretch_turns`), which is what `chorus bench voices --path batch`
measures.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from rooms.voices import RememberedVoice
from voice.audio import split_audio
from voice.centroids import unit_or_none
from voice.diarization_stage import ClipPrints, SpeakerSegment, SpeakerTimeline, StagePrints
from voice.identify import (
    IdentifySettings,
    TurnPrint,
    claimable,
    identify_once,
    known_voices,
    print_turn,
    stretch_turns,
    turn_clip,
    turn_person,
    worth_checking,
)

FloatArray = npt.NDArray[np.float32]

SAMPLE_RATE = 16000
GRID_S = 0.01
PIECE_S = 10.0
"""A speaker's lone speech is printed in pieces of at most this long (CAM++'s pooling over much
longer stretches blurs more than it adds)."""
MIN_PIECE_S = 1.0
"""A shorter last piece joins the one before it (the VAD needs a second of speech)."""


@dataclass(frozen=True)
class DirectoryNames:
    """What the directory said of one recording's speakers (no print, no vector)."""

    model: str
    """The embedding model the speakers were printed with (the only prints compared)."""
    named: dict[str, str] = field(default_factory=dict)
    """label → name (tier auto: the name replaces the letter)."""
    suggested: dict[str, str] = field(default_factory=dict)
    """label → name (tier suggest: the letter stays)."""
    scores: dict[str, float] = field(default_factory=dict)
    """label → the score of its name or suggestion."""
    voice_ids: dict[str, str] = field(default_factory=dict)
    """label → the directory id of the person it is named after (the labels of `named`)."""
    speech_s: dict[str, float] = field(default_factory=dict)
    """label → seconds of its lone speech (what was printed)."""
    people: int = 0
    """People of the directory with prints of `model` (compared)."""
    other_model: int = 0
    """People whose prints all come from other models (not compared)."""

    def lines(self) -> list[str]:
        """One line per name and suggestion, as the commands print them (one line saying so
        when there is nothing else to say)."""
        out = [f"{label} → {name} (voice directory)" for label, name in self.named.items()]
        out += [f"{label} — maybe {name}? (voice directory)"
                for label, name in self.suggested.items()]
        if self.other_model:
            out.append(f"{self.other_model} remembered voice(s) have prints of another model "
                       "only: not compared (remember them again)")
        return out or [f"voice directory: no voice named ({self.people} remembered voice(s) "
                       "compared)"]


def lone_speech(timeline: SpeakerTimeline, duration_s: float) -> dict[str, list[tuple[float, float]]]:
    """Per speaker: the stretches (s) where the timeline has that speaker and nobody else."""
    n = round(duration_s / GRID_S) + 1
    grids: dict[str, npt.NDArray[np.bool_]] = {}
    for seg in timeline:
        grid = grids.setdefault(seg.speaker, np.zeros(n, dtype=bool))
        grid[round(seg.start / GRID_S) : round(seg.end / GRID_S)] = True
    if not grids:
        return {}
    count = np.sum(list(grids.values()), axis=0)
    out: dict[str, list[tuple[float, float]]] = {}
    for speaker, grid in grids.items():
        alone = np.concatenate([[False], grid & (count == 1), [False]])
        edges = np.flatnonzero(np.diff(alone.astype(np.int8)))
        out[speaker] = [(a * GRID_S, b * GRID_S) for a, b in zip(edges[::2], edges[1::2], strict=True)]
    return out


def speaker_prints(
    printer: ClipPrints,
    audio: FloatArray,
    timeline: SpeakerTimeline,
    *,
    labels: Collection[str] | None = None,
    min_speech_s: float = 0.0,
) -> StagePrints:
    """Each speaker's print on `printer`'s live model (module docstring), with its seconds of
    lone speech: speakers in `labels` only (all when None), and none under `min_speech_s`."""
    wav = np.asarray(audio, dtype=np.float32).reshape(-1)
    prints: dict[str, FloatArray] = {}
    speech_s: dict[str, float] = {}
    for speaker, spans in lone_speech(timeline, len(wav) / SAMPLE_RATE).items():
        if labels is not None and speaker not in labels:
            continue
        speech = [wav[round(a * SAMPLE_RATE) : round(b * SAMPLE_RATE)] for a, b in spans]
        joined = np.concatenate(speech) if speech else np.zeros(0, dtype=np.float32)
        seconds = len(joined) / SAMPLE_RATE
        if seconds < max(min_speech_s, MIN_PIECE_S):
            continue
        total = np.zeros(0, dtype=np.float32)
        weight = 0.0
        for piece in _pieces(joined):
            try:
                vector = np.asarray(printer.live_voiceprint(piece), dtype=np.float32)
            except ValueError:  # too little speech in it once the VAD has trimmed it
                continue
            total = vector * len(piece) if total.size == 0 else total + vector * len(piece)
            weight += len(piece)
        unit = unit_or_none(total) if weight else None
        if unit is not None:
            prints[speaker] = unit
            speech_s[speaker] = seconds
    return StagePrints(printer.live_model, prints, speech_s)


def _pieces(speech: FloatArray) -> list[FloatArray]:
    return split_audio(speech, round(PIECE_S * SAMPLE_RATE), MIN_PIECE_S * SAMPLE_RATE)


def identify_speakers(
    prints: StagePrints,
    voices: Sequence[RememberedVoice],
    settings: IdentifySettings,
    *,
    taken_names: Collection[str] = (),
) -> DirectoryNames:
    """The tiers over a recording's speaker prints (module docstring). `taken_names`: names the
    recording's speakers carry already (enrolled voices): no other voice takes them."""
    comparable = known_voices(voices, prints.model)
    known = [k for k in comparable if k.name not in taken_names]
    compared = {k.id for k in comparable}
    other = sum(1 for v in voices if v.id not in compared and v.prints)
    names = DirectoryNames(prints.model, speech_s=dict(prints.speech_s), people=len(known),
                           other_model=other)
    for found in identify_once(prints.prints, prints.speech_s, known, settings):
        target = names.named if found.tier == "auto" else names.suggested
        target[found.label] = found.name
        names.scores[found.label] = round(found.score, 3)
        if found.tier == "auto":
            names.voice_ids[found.label] = found.voice_id
    return names


def name_speakers(
    printer: ClipPrints,
    audio: FloatArray,
    timeline: SpeakerTimeline,
    voices: Sequence[RememberedVoice],
    settings: IdentifySettings,
    *,
    anonymous: Collection[str] | None = None,
) -> DirectoryNames:
    """`speaker_prints` then `identify_speakers`: only the `anonymous` labels are scored (all when
    None); the others' labels are names already, which no voice of the directory takes."""
    labels = timeline.speakers if anonymous is None else [s for s in timeline.speakers
                                                          if s in anonymous]
    taken = [s for s in timeline.speakers if s not in labels]
    prints = speaker_prints(printer, audio, timeline, labels=labels,
                            min_speech_s=settings.min_heard_s)
    return identify_speakers(prints, voices, settings, taken_names=taken)


class TurnChecks:
    """A recording's turns checked against the names `identify_speakers` gave its speakers
    (module docstring; the server's `VoiceDirectory.name_turn`, over a whole recording): `reads`
    says what one turn reads, and the counts say how often a turn did not match its speaker's
    person (`unmatched`) and how often one took another speaker's person (`claimed`). Safe to
    call from several threads (the counts are locked)."""

    def __init__(
        self,
        printer: ClipPrints,
        audio: FloatArray,
        names: DirectoryNames,
        voices: Sequence[RememberedVoice],
        settings: IdentifySettings,
        *,
        anonymous: Collection[str],
    ) -> None:
        self.printer = printer
        self.audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        self.names = names
        self.settings = settings
        self.anonymous = set(anonymous)
        self._people = {k.id: k for k in known_voices(voices, names.model)}
        by_name = {p.name: p.id for p in self._people.values()}
        self._suggested = {by_name[n] for n in names.suggested.values() if n in by_name}
        """The people suggested for a speaker (ids): never claimed (`claimable`)."""
        self.unmatched = 0
        self.claimed = 0
        self._lock = threading.Lock()

    def reads(self, label: str, spans: Sequence[tuple[float, float]]) -> str:
        """What a turn of `label` over `spans` (seconds, in time order) reads: its speaker's name
        when the turn sounds like that person, whole and in parts (or `verify` is off), a person
        named for another speaker that it claims, or `label` (its letter; also for a turn too
        short to print, under `voice.identify.TURN_MIN_S`). A label that is not anonymous (an
        enrolled name) reads itself."""
        plain = self.names.named.get(label, label)
        if label not in self.anonymous or not spans:
            return plain
        own = self._people.get(self.names.voice_ids.get(label, ""))
        present, absent = claimable(label, self.names.voice_ids, self._suggested, self._people)
        if not worth_checking(own, present, self.settings, absent):
            return plain
        person = turn_person(self._print(spans), own, present, self.settings, absent)
        if own is not None and person is own:
            return plain
        with self._lock:
            self.unmatched += own is not None
            self.claimed += person is not None
        return person.name if person is not None else label

    def _print(self, spans: Sequence[tuple[float, float]]) -> TurnPrint | None:
        clip = turn_clip(self.audio, spans, SAMPLE_RATE)
        return print_turn(clip, SAMPLE_RATE, self.printer.turn_voiceprint)

    def lines(self) -> list[str]:
        """What the checks did, as the commands print it (nothing when they did nothing)."""
        out = []
        if self.unmatched:
            out.append(f"{self.unmatched} turn(s) did not sound like their speaker's remembered "
                       "person (or were too short to tell): they read the speaker's letter (voice "
                       "directory, [voices] verify)")
        if self.claimed:
            out.append(f"{self.claimed} turn(s) sounded like a person named for another speaker "
                       "(or for none) and read that name (voice directory, [voices] claim, "
                       "claim_new)")
        return out


def checked_timeline(checks: TurnChecks, timeline: SpeakerTimeline) -> SpeakerTimeline:
    """The timeline with each turn (a label's stretches in a row, `voice.identify.stretch_turns`)
    under what it reads (`TurnChecks.reads`)."""
    segments = list(timeline)
    stretches = [(s.speaker, s.start, s.end) for s in segments]
    out: list[SpeakerSegment] = []
    for turn in stretch_turns(stretches):
        label = segments[turn[0]].speaker
        reads = checks.reads(label, [(segments[k].start, segments[k].end) for k in turn])
        out += [SpeakerSegment(segments[k].start, segments[k].end, reads) for k in turn]
    return SpeakerTimeline(sorted(out, key=lambda s: (s.start, s.end, s.speaker)))


__all__ = [
    "DirectoryNames",
    "TurnChecks",
    "checked_timeline",
    "identify_speakers",
    "lone_speech",
    "name_speakers",
    "speaker_prints",
]
