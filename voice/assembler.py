"""When a speaker's turn ends: the turn assembler, one pure, synchronous place (rules V3, V5).

Words go in (final words, interim words with speaker hints), with what the diarization stage
knows in pipeline mode (its decided timeline, its provisional view of the frames it has not
decided, the handovers it decided); decisions come out: `Commit` (post this run of one voice as
a turn) and `Revise` (correct a committed turn in place). No asyncio, no room kit, no hooks: the
`VoiceSession` applies the decisions (hooks, metadata, `post_event` / `update_event`) and tells
the assembler which commits became room events (`posted`), because a hook may block a turn.

The rules, each a method below and a table of cases in `tests/test_turn_assembler.py`:
- **Runs (V3, V5).** A turn is a run of consecutive words with one speaker
  (`voice.turns.speaker_runs`). The last run stays open until the voice changes, the STT marks the
  end of speech, or the stream is flushed (`advance(force=True)`): a sentence split over two
  finals is one turn, one final holding two voices is two.
- **Placing words (V5, pipeline mode).** A final word takes the stage's decided speaker; a word
  the stage has not decided waits until the stage has heard `TurnPolicy.speaker_wait` seconds
  past it, unless its provisional speaker continues the voice before it
  (`TurnPolicy.provisional_speakers`: a turn's last words would otherwise wait a second).
- **Early commit (streaming STT, `TurnPolicy.early_commit`).** An interim result whose speaker
  hints change voice commits the runs that change closes at once; the final covering them
  confirms them (nothing sent) or corrects them (`Revise`). With pipeline speakers the hints are
  the stage's *decided* speakers of the interim words (`decided_hints`); undecided words close
  nothing.
- **Closing on a provisional change (`TurnPolicy.provisional_changes`, pipeline mode).** The
  waiting run is committed as soon as the stage's provisional view hears another voice on the next
  word; if the decision then gives that word the run's voice, the turn is reopened and the run
  that goes on revises it in place (`Revise(reason="went_on")`), never a second turn.
- **Closing at a decided handover (pipeline mode).** A run whose voice the stage decided handed
  over to another right after its last word is committed then, not when the next voice's words
  arrive.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from voice.diarization_stage import SpeakerTimeline
from voice.turns import MIN_WORD_EVIDENCE, SpeakerTurn, Word, assign_speakers, speaker_runs


@dataclass(frozen=True)
class TurnPolicy:
    """The turn rules' settings (the `[voice]` section of `chorus.toml`, shared by `chorus
    serve`, `chorus transcribe`, `chorus agent` and the benches)."""

    early_commit: bool = True
    """Commit a turn as soon as an interim result shows the next voice (streaming STT)."""
    provisional_speakers: bool = True
    """Pipeline speakers: a word the stage has not decided yet takes the stage's provisional
    speaker at once when that continues the voice before it (latency)."""
    provisional_changes: bool = True
    """Pipeline speakers: a turn is committed as soon as the stage's provisional view hears
    another voice on the next word (reopened in place if the decision says the voice went on),
    instead of when the stage has decided that word (latency)."""
    speaker_wait: float = 2.0
    """Pipeline speakers: seconds of audio past a word the stage must have heard before a word it
    has not placed is given whatever speaker it knows."""

    def __post_init__(self) -> None:
        if not self.speaker_wait >= 0:
            raise ValueError(f"speaker_wait must be >= 0 seconds, got {self.speaker_wait!r}")


@dataclass(frozen=True)
class Commit:
    """Post `turn` as a new room event. `key` names it in later decisions and in `posted`."""

    key: int
    turn: SpeakerTurn


@dataclass(frozen=True)
class Revise:
    """Correct the committed turn `key` in place with `words`.

    `reason`: `final` (the final result disagreed with an early turn's interim words),
    `unconfirmed` (the final heard none of the early turn's words: they are kept, marked), or
    `went_on` (a turn closed early whose voice went on: `words` is the whole turn now, and it
    arrived as finally shown only now)."""

    key: int
    words: tuple[Word, ...]
    reason: Literal["final", "unconfirmed", "went_on"]


Decision = Commit | Revise

SAME_TIME = 0.05
"""Seconds within which an interim word and a final word are the same word."""
HANDOVER_REACH = 1.5
"""Seconds before a decided handover within which a run's last word must end for the handover
to close it (its voice's last words; an older run is some other turn's)."""
CHANGE_MAX_GAP = 0.3
"""Seconds between one voice's end and the next one's start that make a change inside one
utterance (a longer pause ends the utterance anyway)."""
_REMEMBERED = 64
"""Committed runs the assembler remembers by key (a reopened turn is the latest one)."""


@dataclass
class _Early:
    """A turn committed from interim words (early commit), until a final confirms it."""

    turn: SpeakerTurn
    key: int
    final_lead: int = 0
    """How many of the turn's first words were final already (the pending run it continued)."""
    confirmed: list[Word] = field(default_factory=list)
    """The final words over its interim words' span so far."""

    @property
    def interim_words(self) -> tuple[Word, ...]:
        return self.turn.words[self.final_lead :]

    @property
    def start(self) -> float:
        return self.interim_words[0].start

    @property
    def end(self) -> float:
        return self.turn.end


_NOBODY = object()


class TurnAssembler:
    """One stream's turn rules. `pipeline=True`: final words are placed by the stage's timeline
    (V5); otherwise their speakers are the STT's (V3). Every method is synchronous and returns
    the decisions it made, in the order they must be applied."""

    def __init__(self, policy: TurnPolicy | None = None, *, pipeline: bool = False) -> None:
        self.policy = policy or TurnPolicy()
        self.pipeline = pipeline
        self._pending: list[Word] = []
        """Final words with speakers, waiting for their run to end."""
        self._unplaced: list[Word] = []
        """Final words waiting for the diarization stage (pipeline mode)."""
        self._end_of_speech = False
        self._early: list[_Early] = []
        """Turns committed from interim words, waiting for the final that confirms them."""
        self._closed_early: tuple[int, ...] | None = None
        """The commits of the last provisional close, while the change is not decided."""
        self._reopened: int | None = None
        """A turn closed early whose voice went on: its run's commit revises it in place."""
        self._runs: OrderedDict[int, SpeakerTurn] = OrderedDict()
        self._next_key = 0
        self._last_posted: int | None = None
        self._last_speaker: str | object | None = _NOBODY
        self._decided = SpeakerTimeline()
        self._undecided = SpeakerTimeline()
        self._heard = 0.0
        self._handovers: deque[tuple[float, str]] = deque(maxlen=8)
        self._out: list[Decision] = []

    # -- what the session asks ---------------------------------------------------------------

    @property
    def unplaced(self) -> bool:
        """Final words wait for the stage to place them (pipeline mode)."""
        return bool(self._unplaced)

    @property
    def first_unplaced_start(self) -> float | None:
        return self._unplaced[0].start if self._unplaced else None

    @property
    def waiting_on_stage(self) -> bool:
        """A new stage decision may move something on: words to place, or a waiting run that a
        decided handover may end."""
        return bool(self._unplaced) or bool(self._pending and self._handovers)

    @property
    def wants_decided_hints(self) -> bool:
        """An interim result can close turns only from the stage's decisions (pipeline mode,
        early commit on, no final words waiting): the session feeds the stage first."""
        return self.pipeline and self.policy.early_commit and not self._unplaced

    # -- what goes in ------------------------------------------------------------------------

    def stage_heard(self, decided: SpeakerTimeline, undecided: SpeakerTimeline,
                    heard: float) -> None:
        """The stage's latest view: its decided timeline (segments near the words still to
        place), its provisional speakers of frames not decided yet, and how many seconds of the
        stream it has heard."""
        self._decided = decided
        self._undecided = undecided
        self._heard = heard

    def speakers_from_stage(self, on: bool) -> None:
        """Switch where final words' speakers come from: the stage's timeline (pipeline mode)
        or the STT's own labels (None when it gives none: the stream's one speaker). A server
        whose stage cannot keep up switches a stream off it and back (issue 31); words waiting
        for the stage go on with the STT's labels at the next `advance`."""
        self.pipeline = on
        if not on:
            self._handovers.clear()
            self._closed_early = None

    def handover(self, at: float, speaker: str) -> None:
        """The stage decided that `speaker`'s voice ended at `at` while another goes on."""
        self._handovers.append((at, speaker))

    def posted(self, key: int) -> None:
        """The session posted commit `key` as a room event (not blocked by a hook, no error)."""
        self._last_posted = key
        run = self._runs.get(key)
        if run is not None:
            self._last_speaker = run.speaker

    def interim(self, words: tuple[Word, ...], hints: tuple[str | None, ...], *,
                final_until: float) -> list[Decision]:
        """An interim result: with a voice change in its hints (STT labels) or in the stage's
        decided speakers of its words (pipeline mode), commit the runs that change closes."""
        if not self.policy.early_commit:
            return []
        if not self.pipeline:
            if hints:
                self._commit_early(words, hints, final_until)
        elif not self._unplaced:
            words, hints = decided_hints(words, self._decided)
            if words:
                self._commit_early(words, hints, final_until)
        return self._take()

    def final(self, words: tuple[Word, ...], *, speech_final: bool) -> list[Decision]:
        """A final result: its words over early turns confirm or correct them (STT labels; in
        pipeline mode once placed), the rest wait to be placed or for their run to end. Call
        `advance` next (after feeding the stage, in pipeline mode)."""
        if self._early and not self.pipeline:
            words = self._settle(words)
        self._unplaced.extend(words)
        self._end_of_speech = speech_final
        return self._take()

    def end_of_speech(self) -> None:
        """The STT marked the end of speech (`UtteranceEnd`): call `advance` next."""
        self._end_of_speech = True

    def advance(self, *, force: bool = False) -> list[Decision]:
        """Move final words on: give them speakers (pipeline mode) and commit finished runs.
        `force` (flush, end of stream) places whatever is known and closes the last run."""
        if not self.pipeline:
            self._pending.extend(self._unplaced)
            self._unplaced = []
        elif self._unplaced:
            self._place(force)
        if self.pipeline and self._handovers and not self._unplaced and not force:
            self._close_at_handover()
        done = not self._unplaced and (self._end_of_speech or force)
        self._emit_pending(force=done)
        if done:
            self._end_of_speech = False
        return self._take()

    # -- placing words (V5) --------------------------------------------------------------------

    def _place(self, force: bool) -> None:
        ready = 0
        timeline = self._decided
        both: SpeakerTimeline | None = None  # built once, when a word first needs it
        for w in self._unplaced:
            placed = overlapped(self._decided, w)
            if not placed and not force and self._heard < w.end + self.policy.speaker_wait:
                both = both or self._with_provisional()
                if both is None or not self._continues_voice(both, w, ready):
                    break
                timeline = both
            ready += 1
        if ready < len(self._unplaced) and not force:
            # a word with no duration takes the speaker of the word after it (V5): it waits
            # with that word
            while ready and no_duration(self._unplaced[ready - 1]):
                ready -= 1
        if ready:
            assigned = assign_speakers(self._unplaced[:ready], timeline)
            self._unplaced = self._unplaced[ready:]
            if self._early:  # final words over early turns confirm or correct them
                assigned = list(self._settle(tuple(assigned)))
            if assigned:
                self._reopen_if_voice_went_on(assigned[0])
            self._pending.extend(assigned)
        if self._unplaced and not force:
            self._close_on_voice_change()

    def _with_provisional(self) -> SpeakerTimeline | None:
        """The decided timeline plus the stage's provisional speakers of the frames it has not
        decided yet, or None (`provisional_speakers` off, or nothing provisional)."""
        if not self.policy.provisional_speakers or not self._undecided.segments:
            return None
        return SpeakerTimeline(self._decided.segments + self._undecided.segments)

    def _continues_voice(self, both: SpeakerTimeline, word: Word, ready: int) -> bool:
        """Whether a word the stage has not decided yet may go on at once with its provisional
        speaker (`both`: decided + provisional): when that is the voice of the word before it.
        A voice change, or nothing heard over the word yet, waits."""
        if not overlapped(both, word) or no_duration(word):
            return False
        previous: str | None
        if ready:
            before = self._unplaced[ready - 1]
            previous = both.speaker_over(before.start, before.end)
        elif self._pending:
            previous = self._pending[-1].speaker
        else:
            last = self._last_speaker
            previous = None if last is _NOBODY else last  # type: ignore[assignment]
        return previous is not None and both.speaker_over(word.start, word.end) == previous

    # -- early commit from interim results -------------------------------------------------------

    def _commit_early(self, words: Sequence[Word], hints: Sequence[str | None],
                      final_until: float) -> None:
        """An interim shows where voices change: commit what that change closes, now."""
        done_until = max((p.end for p in self._early), default=final_until)
        done_until = max(done_until, final_until)  # replayed after a reconnect: final
        if self._pending:
            done_until = max(done_until, self._pending[-1].end)
        fresh = [replace(w, speaker=h) for w, h in zip(words, hints, strict=False)
                 if w.end > done_until + SAME_TIME]
        if not fresh:
            return
        runs = speaker_runs(fresh)
        first = runs[0].speaker
        if self._pending:
            last = self._pending[-1].speaker
            if first is not None and first != last:
                self._emit_pending(force=True)  # the final run ended where this voice began
        closed = runs[:-1]
        if not closed or any(r.speaker is None for r in closed):
            return  # no change yet, or a voice not bound yet: wait for the final
        if self._pending:
            # the pending final words continue the first closed run: one turn
            self._emit_pending(force=False)
            lead = list(self._pending)
            self._pending = []
        else:
            lead = []
        for i, run in enumerate(closed):
            before = tuple(lead) if i == 0 else ()
            turn = SpeakerTurn(run.speaker, before + run.words)
            self._early.append(_Early(turn, self._commit(turn), len(before)))

    def _settle(self, words: tuple[Word, ...]) -> tuple[Word, ...]:
        rest, self._early, revised = settle(self._early, words)
        self._out += revised
        return rest

    # -- closing a waiting run ---------------------------------------------------------------------

    def _close_on_voice_change(self) -> None:
        """The run waiting for its end is committed as soon as the stage's provisional view hears
        another voice on the next word, instead of when the stage has decided that word (0.9-1.4 s
        of audio after it). The run's own words already have their speakers; only where it ends
        is provisional: if the decision then gives the next word the run's voice after all, the
        turn is reopened (`_reopen_if_voice_went_on`)."""
        if not (self.policy.provisional_changes and self._pending and self._unplaced):
            return
        both = self._with_provisional()
        word = self._unplaced[0]
        if both is None or no_duration(word) or not overlapped(both, word):
            return
        voice = both.speaker_over(word.start, word.end)
        if voice is None or voice == self._pending[-1].speaker:
            return
        before = len(self._out)
        self._emit_pending(force=True)
        keys = tuple(d.key for d in self._out[before:] if isinstance(d, Commit))
        if keys:
            self._closed_early = keys

    def _reopen_if_voice_went_on(self, first: Word) -> None:
        """The stage decided the word after a turn closed early: if it is the turn's voice and
        nothing was posted since, the turn goes on; its words go back to the head of the waiting
        run, and committing that run revises the turn in place instead of posting a second turn
        of the same voice."""
        closed, self._closed_early = self._closed_early, None
        if closed is None or self._pending or self._last_posted not in closed:
            return
        run = self._runs.get(self._last_posted)
        if run is None or first.speaker != run.speaker:
            return  # the change was real
        self._pending = list(run.words)
        self._reopened = self._last_posted

    def _close_at_handover(self) -> None:
        """The waiting run is over when the stage decided its voice handed over to another right
        after its last word: a piece of an utterance cut at that handover is not the end of
        speech, and the run must not wait for the next piece's words to learn it."""
        if not self._pending:
            return
        last = self._pending[-1]
        # a handover the waiting run already outlasts closes neither it nor a later run (runs
        # end later and later): forget it, so a stream does not re-check it every step
        while self._handovers and self._handovers[0][0] + CHANGE_MAX_GAP < last.end:
            self._handovers.popleft()
        if any(voice == last.speaker and last.end >= at - HANDOVER_REACH
               for at, voice in self._handovers):
            self._emit_pending(force=True)

    def _emit_pending(self, *, force: bool) -> None:
        runs = speaker_runs(self._pending)
        if not runs:
            return
        done = runs if force else runs[:-1]
        self._pending = [] if force else list(runs[-1].words)
        for run in done:
            if self._reopened is not None:
                key, self._reopened = self._reopened, None
                self._runs[key] = run
                self._out.append(Revise(key, run.words, "went_on"))
                continue
            self._commit(run)

    def _commit(self, turn: SpeakerTurn) -> int:
        key = self._next_key
        self._next_key += 1
        self._runs[key] = turn
        while len(self._runs) > _REMEMBERED:
            self._runs.popitem(last=False)
        self._out.append(Commit(key, turn))
        return key

    def _take(self) -> list[Decision]:
        out, self._out = self._out, []
        return out


def settle(early: list[_Early], words: tuple[Word, ...],
           ) -> tuple[tuple[Word, ...], list[_Early], list[Revise]]:
    """Final words arrived: those over early-committed turns confirm or correct them (the
    revisions), the rest go on as usual. Returns (the rest, the early turns still waiting, the
    revisions)."""
    rest: list[Word] = []
    for w in words:
        mid = (w.start + w.end) / 2
        owner = next((p for p in early
                      if p.start - SAME_TIME <= mid <= p.end + SAME_TIME
                      and (w.speaker is None or w.speaker == p.turn.speaker)), None)
        if owner is None:
            rest.append(w)  # not said in an early turn: a turn of its own, as usual
        else:
            owner.confirmed.append(w)
    final_end = max((w.end for w in words), default=0.0)
    settled = [p for p in early if p.end <= final_end + SAME_TIME]
    revised = [r for r in (correction(p, tuple(p.confirmed)) for p in settled) if r is not None]
    return tuple(rest), [p for p in early if p not in settled], revised


def correction(early: _Early, confirmed: tuple[Word, ...]) -> Revise | None:
    """What the final words over an early turn's interim words change: nothing when they agree
    (same words, same voices), else a revision."""
    said = [(w.text, w.speaker) for w in early.interim_words]
    if [(w.text, w.speaker) for w in confirmed] == said:
        return None
    if not confirmed:
        # The final heard none of it (interim words it dropped): keep the text, say so.
        return Revise(early.key, early.turn.words, "unconfirmed")
    final = early.turn.words[: early.final_lead] + confirmed  # the lead was final already
    return Revise(early.key, final, "final")


def decided_hints(words: tuple[Word, ...], timeline: SpeakerTimeline,
              ) -> tuple[tuple[Word, ...], tuple[str | None, ...]]:
    """Pipeline mode: the interim words up to the last one the stage's decided timeline
    places, with the decided speaker of each (None for a word it has not placed). Words
    after the last placed one are left out: not decided is not a change of voice, so only
    a run followed by another decided voice is closed early. Provisional speakers are not
    used here: they change as more windows vote, and an early turn they closed would be
    split from its own voice's next words."""
    speakers = assign_speakers(words, timeline)
    hints = tuple(s.speaker if overlapped(timeline, w) or no_duration(w) else None
                  for w, s in zip(words, speakers, strict=True))
    last = max((i for i, (w, h) in enumerate(zip(words, hints, strict=True))
                if h is not None and not no_duration(w)), default=-1)
    return words[: last + 1], hints[: last + 1]


def no_duration(word: Word) -> bool:
    return word.end - word.start < MIN_WORD_EVIDENCE


def overlapped(timeline: SpeakerTimeline, word: Word) -> bool:
    """Whether the stage has decided a segment that overlaps the word (not merely one nearby)."""
    if word.end <= word.start:
        return timeline.speaker_over(word.start, word.end) is not None
    return any(min(word.end, s.end) > max(word.start, s.start) for s in timeline.segments)


__all__ = ["Commit", "Decision", "Revise", "TurnAssembler", "TurnPolicy"]
