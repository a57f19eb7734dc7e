"""The diarization stage interface (rule P3): one shape for the embedded stage, the pyannote stage
and scripted stages in tests.

A stage is fed mono float32 audio and answers with a speaker timeline (who spoke when). Stages are
synchronous and CPU-bound: the voice channel calls them through `asyncio.to_thread`, so a stage
never runs on the event loop. Speaker names in a timeline are the stage's own: enrolled names
(rule V8) or `Speaker A`, `Speaker B` … for voices that match nobody (rule V7).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

Audio = npt.NDArray[np.float32]


@dataclass(frozen=True)
class SpeakerSegment:
    """One stretch of one speaker's voice, in seconds from the start of the stream or file."""

    start: float
    end: float
    speaker: str

    @property
    def duration(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class SpeakerTimeline:
    """Who spoke when. Segments may overlap (overlapped speech)."""

    segments: list[SpeakerSegment] = field(default_factory=list)

    def __iter__(self) -> Iterator[SpeakerSegment]:
        return iter(sorted(self.segments, key=lambda s: (s.start, s.end, s.speaker)))

    def __len__(self) -> int:
        return len(self.segments)

    @property
    def speakers(self) -> list[str]:
        """Speakers in order of first appearance."""
        seen: dict[str, None] = {}
        for seg in self:
            seen.setdefault(seg.speaker, None)
        return list(seen)

    def speaker_over(self, start: float, end: float) -> str | None:
        """The speaker heard longest over [start, end] (rule V5), or None if nobody overlaps it.

        A zero-length span (a word with no duration) takes the speaker of the nearest segment
        within 0.5 s.
        """
        heard: dict[str, float] = defaultdict(float)
        for seg in self.segments:
            overlap = min(end, seg.end) - max(start, seg.start)
            if overlap > 0:
                heard[seg.speaker] += overlap
        if heard:
            return max(heard.items(), key=lambda kv: (kv[1], -self._first_start(kv[0])))[0]
        mid = (start + end) / 2
        best: tuple[float, str] | None = None
        for seg in self.segments:
            gap = max(seg.start - mid, mid - seg.end, 0.0)
            if gap <= 0.5 and (best is None or gap < best[0]):
                best = (gap, seg.speaker)
        return best[1] if best else None

    def _first_start(self, speaker: str) -> float:
        return min(s.start for s in self.segments if s.speaker == speaker)

    def to_rttm(self, file_id: str) -> str:
        lines = [
            f"SPEAKER {file_id} 1 {seg.start:.3f} {seg.duration:.3f} <NA> <NA> "
            f"{seg.speaker.replace(' ', '_')} <NA> <NA>"
            for seg in self
            if seg.duration > 0
        ]
        return "\n".join(lines) + ("\n" if lines else "")

    @classmethod
    def from_rttm(cls, text: str, file_id: str | None = None) -> SpeakerTimeline:
        segments: list[SpeakerSegment] = []
        for line in text.splitlines():
            parts = line.split()
            if len(parts) < 8 or parts[0] != "SPEAKER":
                continue
            if file_id is not None and parts[1] != file_id:
                continue
            start, duration = float(parts[3]), float(parts[4])
            segments.append(SpeakerSegment(start, start + duration, parts[7]))
        return cls(segments)

    @classmethod
    def read_rttm(cls, path: str | Path, file_id: str | None = None) -> SpeakerTimeline:
        return cls.from_rttm(Path(path).read_text(), file_id)

    @classmethod
    def of(cls, segments: Iterable[SpeakerSegment]) -> SpeakerTimeline:
        return cls(list(segments))


@runtime_checkable
class DiarizationStage(Protocol):
    """Feed audio, read a speaker timeline, enroll, reset (rule P3)."""

    sample_rate: int
    """The rate the stage works at; callers resample before feeding."""

    def feed(self, audio: Audio) -> SpeakerTimeline:
        """Live mode: append audio (mono float32 at `sample_rate`) and return the timeline decided
        so far over everything fed since the last reset."""
        ...

    def diarize(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
    ) -> SpeakerTimeline:
        """Batch mode: the whole recording at once (refinement allowed). Independent of `feed`."""
        ...

    def enroll(self, name: str, audio: Audio) -> None:
        """Register a voice under `name`; later segments by that voice carry the name (V8)."""
        ...

    def forget(self, name: str) -> None:
        """Drop an enrolled voiceprint."""
        ...

    def reset(self) -> None:
        """Forget the live stream (not the enrolled voices)."""
        ...


@dataclass(frozen=True)
class StageAbilities:
    """What a live stage can do beyond `DiarizationStage` (declared, never probed). Each ability
    is a method the stage then implements (`DecidesLate`, `RecentView`, `ProvisionalView`,
    `StretchesStep`, `CatchesUp`, `Abandons`, `SpeakerPrints`, `Anchors`)."""

    decides_late: bool = False
    """It holds decisions back while fed (the embedded stage decides about a second late):
    `flush()` decides what it still holds, at the end of a stream."""
    recent_view: bool = False
    """`recent(since)`: only its decided segments that end after `since` (a long stream's whole
    timeline grows with it; the voice channel needs the part near the words it still places)."""
    provisional_view: bool = False
    """`provisional()`: who it thinks speaks on the frames heard but not decided yet (may
    change): a turn's last words need not wait for the decision when they continue the voice
    before them."""
    stretches_step: bool = False
    """`stretch(factor)`: run its windows `factor` times further apart (fewer model calls per
    second of audio, decisions a little later) while the machine cannot keep up; 1.0 is its
    normal step again (issue 31, `server.overload`)."""
    catches_up: bool = False
    """`catch_up(on)`: while on, a feed that brings more than one step of new audio because the
    stage fell behind (the embedded stage: while other streams' windows wait for its shared
    model service) runs the newest window and only as many earlier ones as keep its windows
    overlapping, not one per step: a stage behind its stream catches up at once instead of
    working through its backlog (issue 31). Off: every window is run (a replay that feeds a
    whole recording at once)."""
    abandons: bool = False
    """`abandon()`: drop the work it has queued and not started (its stream left the stage, so
    other streams need not wait for it); its feeds fail until `reset()`. Called from any thread
    while a feed may be running: it must not wait for the stage."""
    speaker_prints: bool = False
    """`speaker_prints()`: each anonymous voice's voiceprint so far and how long it spoke, with
    the id of the model that made the prints (the voice directory, issue 27, names voices by
    them). Read from the event loop: it must not wait for a running feed."""
    anchors: bool = False
    """`anchor(prints)`: known voices its clustering starts from (kept apart from the first
    window, each taking a letter when heard); any thread, applied with the next feed."""


NO_ABILITIES = StageAbilities()


@runtime_checkable
class LiveStage(DiarizationStage, Protocol):
    """A stage that declares its optional abilities (`abilities`); a stage without the attribute
    has none."""

    abilities: StageAbilities


@runtime_checkable
class DecidesLate(Protocol):
    def flush(self) -> SpeakerTimeline:
        """End of stream: decide what is still held back; the whole decided timeline."""
        ...


@runtime_checkable
class RecentView(Protocol):
    def recent(self, since: float) -> SpeakerTimeline:
        """The decided segments that end after `since` seconds."""
        ...


@runtime_checkable
class ProvisionalView(Protocol):
    def provisional(self) -> SpeakerTimeline:
        """The provisional speakers of the frames heard but not decided yet."""
        ...


@runtime_checkable
class Abandons(Protocol):
    def abandon(self) -> None:
        """Drop queued work now (any thread, never waiting for a running feed)."""
        ...


@dataclass(frozen=True)
class StagePrints:
    """A snapshot of a live stage's anonymous voices: per speaker label, a unit-length
    voiceprint (its centroid so far) and the seconds of speech decided for it; `model` names the
    embedding model (prints of two models are never compared)."""

    model: str
    prints: dict[str, Audio] = field(default_factory=dict)
    speech_s: dict[str, float] = field(default_factory=dict)


@runtime_checkable
class SpeakerPrints(Protocol):
    def speaker_prints(self) -> StagePrints:
        """The latest snapshot (never waits for a feed)."""
        ...


@runtime_checkable
class Anchors(Protocol):
    def anchor(self, prints: dict[str, Audio]) -> None:
        """Known voices by key (unit prints of the stage's model); the set replaces the last."""
        ...


@runtime_checkable
class ClipPrints(Protocol):
    """A stage that can make a voiceprint of a clip on the model its `speaker_prints` use (the
    voice directory's enrollment from a clip)."""

    @property
    def live_model(self) -> str: ...

    def live_voiceprint(self, audio: Audio) -> Audio:
        """The clip's speech's print (unit length); ValueError for too little speech."""
        ...

    def turn_voiceprint(self, audio: Audio) -> Audio:
        """A turn's print (unit length) on the same model, of its audio as it is (a turn is
        speech already: no VAD); ValueError under `voice.identify.TURN_MIN_S`."""
        ...


@runtime_checkable
class StretchesStep(Protocol):
    def stretch(self, factor: float) -> None:
        """Space the windows `factor` (>= 1) times their normal step from the next one on."""
        ...


@runtime_checkable
class CatchesUp(Protocol):
    def catch_up(self, on: bool) -> None:
        """While on, a feed behind its stream skips the windows it need not run
        (`StageAbilities.catches_up`)."""
        ...


def abilities_of(stage: DiarizationStage) -> StageAbilities:
    """The abilities `stage` declares (none when it declares nothing); a declared ability whose
    method is missing is a `TypeError` here, once, not a surprise mid-stream."""
    if not isinstance(stage, LiveStage):
        return NO_ABILITIES
    declared = stage.abilities
    if not isinstance(declared, StageAbilities):
        raise TypeError(f"{type(stage).__name__}.abilities must be a StageAbilities, "
                        f"got {type(declared).__name__}")
    needs: tuple[tuple[str, type, str], ...] = (("decides_late", DecidesLate, "flush()"),
                                                ("recent_view", RecentView, "recent(since)"),
                                                ("provisional_view", ProvisionalView,
                                                 "provisional()"),
                                                ("stretches_step", StretchesStep,
                                                 "stretch(factor)"),
                                                ("catches_up", CatchesUp, "catch_up(on)"),
                                                ("abandons", Abandons, "abandon()"),
                                                ("speaker_prints", SpeakerPrints,
                                                 "speaker_prints()"),
                                                ("anchors", Anchors, "anchor(prints)"))
    for ability, protocol, method in needs:
        if getattr(declared, ability) and not isinstance(stage, protocol):
            raise TypeError(f"{type(stage).__name__} declares {ability} but has no {method}")
    return declared


class KnownTimelineStage:
    """A stage whose whole timeline is already known: the result of a refinement pass over a whole
    recording (`stage.diarize(audio)`), handed out through the live interface.

    Transcribing a file can afford to diarize it as a whole first (batch mode clusters every voice
    with all the evidence, rule P1's refinement pass) and then take the same live path as a stream:
    the voice channel feeds this stage and reads the timeline, so word alignment (V5), hooks and
    turns are exactly those of a live room. It cannot learn voices: enroll on the stage that made
    the timeline, before the refinement pass.
    """

    def __init__(self, timeline: SpeakerTimeline, sample_rate: int = 16000) -> None:
        self.timeline = timeline
        self.sample_rate = sample_rate

    def feed(self, audio: Audio) -> SpeakerTimeline:
        return self.timeline

    def diarize(
        self,
        audio: Audio,
        *,
        num_speakers: int | None = None,
        max_speakers: int | None = None,
    ) -> SpeakerTimeline:
        return self.timeline

    def enroll(self, name: str, audio: Audio) -> None:
        raise RuntimeError("a known timeline cannot enroll voices: enroll on the stage that made it")

    def forget(self, name: str) -> None:
        raise RuntimeError("a known timeline holds no voiceprints")

    def reset(self) -> None:
        """Nothing to forget: the timeline belongs to one recording."""
