"""Applying the turn assembler's decisions to the room (rules V2, V6): hooks, metadata, posts and
in-place corrections.

The `TurnAssembler` decides *when* a turn ends; a session's `TurnWriter` makes it a room event:
it runs the `ON_TRANSCRIPTION` chain over each `Commit` (a hook may rename, edit, match a
participant or block), keeps sticky renames and matches per raw label, stamps V2 metadata, posts
the event (`kit.post_event`) and emits `ON_SPEAKER_CHANGE` when the voice changes; a `Revise`
updates the committed event in place (`kit.update_event`, `corrected: true`), keeping a hook's
edit of the text. It tells the assembler which commits were posted (a blocked turn is never
revised, and never reopened). With a live second pass (`voice.second_pass`, the channel's
`second_pass`), posted and revised turns are gathered into stretches (turns less than `gap` apart,
spanning at most `max_stretch`), each stretch is handed to it with its audio when the next turn
falls outside it, after `hold` seconds with no new turn, or at the session's end, and what it
re-decodes replaces each turn in place the same way (metadata `second_pass: true` besides
`corrected: true`), unless the turn changed meanwhile or a hook had edited its text.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict, deque
from dataclasses import replace
from typing import TYPE_CHECKING

from models import TextContent, VoiceTurn
from rooms import HookContext, HookTrigger
from voice.assembler import Commit, Decision, Revise, TurnAssembler
from voice.events import CommittedTurn, SpeakerChangeEvent, TranscriptionEvent
from voice.second_pass import SecondPassJob
from voice.turns import SpeakerTurn, Word, join_words

if TYPE_CHECKING:
    from voice.session import VoiceSession

log = logging.getLogger(__name__)

KEPT_PER_SESSION = 100
"""Blocked turns (and skipped-frame reasons) a session keeps (the newest)."""
KEPT_BY_KEY = 256
"""Committed turns a session can still correct in place (early commit, reopen)."""

_NOBODY = object()


class TurnWriter:
    """One session's committed turns and the hooks' memory of its voices."""

    def __init__(self, session: VoiceSession, assembler: TurnAssembler,
                 kept_turns: int | None) -> None:
        self.session = session
        self.assembler = assembler
        self.kept_turns = kept_turns
        self.turns: list[CommittedTurn] = []
        """The committed turns, oldest first: the latest `kept_turns` (all with None)."""
        self._by_key: OrderedDict[int, CommittedTurn] = OrderedDict()
        self.blocked: deque[TranscriptionEvent] = deque(maxlen=KEPT_PER_SESSION)
        """The latest turns a hook blocked (bounded: a blocking hook may block every turn)."""
        self.names: dict[str, str] = {}
        """Sticky renames: raw label → the name a hook gave it (V6)."""
        self.matches: dict[str, str] = {}
        """Sticky participant matches: raw label → participant id (V6)."""
        self.heard: set[str | None] = set()
        self.last_speaker: str | object | None = _NOBODY
        self.corrections = 0
        """Early-committed turns the final results corrected (and turns reopened because the
        voice went on after an early end)."""
        self.second_pass_corrections = 0
        """Committed turns the live second pass corrected in place."""
        self._stretch: list[int] = []
        """Keys of the committed turns waiting to go to the second pass together."""
        self._stretch_timer: asyncio.TimerHandle | None = None

    async def apply(self, decisions: list[Decision]) -> None:
        for decision in decisions:
            try:
                if isinstance(decision, Commit):
                    committed = await self.commit(decision.turn)
                    if committed is not None:
                        self._remember(decision.key, committed)
                        self.assembler.posted(decision.key)
                        self._second_pass(decision.key, committed)
                else:
                    await self._revise(decision)
            except Exception:
                # Fail closed: a hook that raises may have been the one that blocks this turn.
                log.exception("voice session %s: a turn was dropped because committing it failed",
                              self.session.id)

    def _remember(self, key: int, turn: CommittedTurn) -> None:
        self._by_key[key] = turn
        while len(self._by_key) > KEPT_BY_KEY:
            self._by_key.popitem(last=False)

    async def _revise(self, revise: Revise) -> None:
        turn = self._by_key.get(revise.key)
        if turn is None:
            return  # blocked by a hook, or failed: nothing was shown to correct
        words = revise.words
        text = join_words(w.text for w in words)
        if revise.reason == "went_on":
            before = turn.transcription
            if before.text != join_words(w.text for w in before.words):
                # a hook edited the turn's text: keep the edit, add the words that followed
                text = join_words([before.text, *(w.text for w in words[len(before.words):])])
            log.info("voice session %s: the voice went on after an early end: %r -> %r",
                     self.session.id, before.text, text)
            # its end moved: the turn as finally shown arrived now (latency counts from here)
            if await self._update(revise.key, turn, text, words, settled_now=True):
                self.corrections += 1
                self._second_pass(revise.key, self._by_key[revise.key])
            return
        self.corrections += 1
        log.info("voice session %s: the final result corrected an early turn: %r -> %r",
                 self.session.id, turn.text, text)
        if await self._update(revise.key, turn, text, words,
                              unconfirmed=revise.reason == "unconfirmed"):
            self._second_pass(revise.key, self._by_key[revise.key])

    # -- the live second pass (issue 23) ----------------------------------------------------

    def _second_pass(self, key: int, turn: CommittedTurn) -> None:
        """Add a posted (or revised) turn to the stretch waiting for the channel's second pass:
        a turn that starts more than `gap` after the stretch's end, or would make it span more
        than `max_stretch`, sends the stretch off first; `hold` seconds with no new turn send it
        off as it is."""
        second = self.session.channel.second_pass
        if second is None or not turn.transcription.words:
            return
        if key not in self._stretch:
            span = self._stretch_span()
            if span is not None and (turn.start - span[1] > second.gap
                                     or max(span[1], turn.end) - min(span[0], turn.start)
                                     > second.max_stretch):
                self.flush_second_pass()
            self._stretch.append(key)
        if self._stretch_timer is not None:
            self._stretch_timer.cancel()
        self._stretch_timer = asyncio.get_running_loop().call_later(
            second.hold, self.flush_second_pass)

    def _stretch_span(self) -> tuple[float, float] | None:
        turns = [t for k in self._stretch if (t := self._by_key.get(k)) is not None]
        if not turns:
            return None
        return min(t.start for t in turns), max(t.end for t in turns)

    def flush_second_pass(self) -> None:
        """Hand the waiting stretch (the latest version of each of its turns) and its audio to
        the second pass now (the session's end; `hold` seconds of quiet)."""
        keys = self._stretch
        self.drop_second_pass()
        second = self.session.channel.second_pass
        turns = sorted(((k, t) for k in keys if (t := self._by_key.get(k)) is not None
                        and t.transcription.words), key=lambda kt: kt[1].start)
        if second is None or not turns:
            return
        lo, hi = min(t.start for _, t in turns), max(t.end for _, t in turns)
        held = self.session.audio
        first = max(round(max(0.0, lo - second.pad) * held.sample_rate), held.first)
        audio = held.samples(first, round((hi + second.pad) * held.sample_rate))
        if not len(audio):
            return  # the session's audio is gone (it ended)
        prompt = None
        if second.prompt_turns:
            stretch = {id(t) for _, t in turns}
            before = [t.text for t in self.turns if id(t) not in stretch and t.end <= lo]
            prompt = " ".join(before[-second.prompt_turns:]) or None

        async def heard(redecoded: tuple[tuple[Word, ...], ...]) -> list[str]:
            async with self.session._lock:
                return [await self._second_pass_heard(key, turn, words)
                        for (key, turn), words in zip(turns, redecoded, strict=True)]

        second.submit(SecondPassJob(self.session.id, audio, first / held.sample_rate,
                                    tuple(t.transcription.words for _, t in turns), prompt, heard))

    def drop_second_pass(self) -> None:
        """Forget the waiting stretch (the session stops without its second pass)."""
        if self._stretch_timer is not None:
            self._stretch_timer.cancel()
            self._stretch_timer = None
        self._stretch = []

    async def _second_pass_heard(self, key: int, turn: CommittedTurn,
                                 words: tuple[Word, ...]) -> str:
        """The second pass re-decoded `turn` (with its stretch): replace it in place if its words
        differ (under the session's lock)."""
        if self._by_key.get(key) is not turn:
            return "stale"  # revised meanwhile: the newer version has its own job
        if turn.text != join_words(w.text for w in turn.transcription.words):
            return "skipped_edited"  # a hook's edit stands
        text = join_words(w.text for w in words)
        if not text or text == turn.text:
            return "same"
        log.info("voice session %s: the second pass corrected a turn: %r -> %r",
                 self.session.id, turn.text, text)
        if not await self._update(key, turn, text, words, second_pass=True):
            return "stale"
        self.second_pass_corrections += 1
        return "corrected"

    async def _update(self, key: int, turn: CommittedTurn, text: str, words: tuple[Word, ...], *,
                      unconfirmed: bool = False, settled_now: bool = False,
                      second_pass: bool = False) -> bool:
        """Replace a committed turn in place (`kit.update_event`, metadata `corrected: true`
        and the words' times) with `text` and `words`; every channel of the room is told.
        `settled_now`: the turn as finally shown arrived now (its end moved), so its
        `committed_at` becomes now. False when the room dropped the event meanwhile."""
        session = self.session
        metadata = dict(turn.event.metadata)
        metadata["corrected"] = True
        if unconfirmed:
            metadata["unconfirmed"] = True
        if second_pass:
            metadata["second_pass"] = True
        else:
            metadata.pop("second_pass", None)  # these words are the first pass's again
        metadata.update(VoiceTurn(turn.transcription.speaker, words[0].start, words[-1].end,
                                  session.id).metadata())
        try:
            updated = await session.channel.require_kit().update_event(
                session.room_id, turn.event.id, content=TextContent(body=text), metadata=metadata)
        except KeyError:  # the room dropped it meanwhile
            return False
        transcription = replace(turn.transcription, text=text, words=words,
                                start=words[0].start, end=words[-1].end)
        committed_at = asyncio.get_running_loop().time() if settled_now else turn.committed_at
        fixed = CommittedTurn(updated, transcription, committed_at)
        self._by_key[key] = fixed
        self.turns = [fixed if t is turn else t for t in self.turns]
        return True

    async def commit(self, run: SpeakerTurn) -> CommittedTurn | None:
        """Run the `ON_TRANSCRIPTION` hooks over one turn and post it (V2 metadata); None when a
        hook or a `BEFORE_BROADCAST` hook blocked it."""
        session = self.session
        kit = session.channel.require_kit()
        label = run.speaker
        text = join_words(w.text for w in run.words)
        if not text:
            return None
        sender = self.names.get(label, label) if label is not None else None
        participant = self.matches.get(label, session.participant_id) if label else session.participant_id
        proposed = TranscriptionEvent(text, label, sender, run.start, run.end, run.words,
                                      participant, session)
        ctx = HookContext(session.room_id, session.channel.channel_id, kit,
                          participant_id=session.participant_id,
                          extra={"voice_session_id": session.id})
        result = await kit.run_hooks(HookTrigger.ON_TRANSCRIPTION, proposed, ctx)
        if result.blocked:
            self.blocked.append(proposed)
            log.info("voice session %s: turn blocked by a hook (%s)", session.id, result.reason)
            return None
        final = result.value if isinstance(result.value, TranscriptionEvent) else proposed
        if label is not None and session.channel.sticky_renames:
            if final.sender_name and final.sender_name != proposed.sender_name:
                self.names[label] = final.sender_name
            if final.participant_id and final.participant_id != proposed.participant_id:
                self.matches[label] = final.participant_id
        metadata = VoiceTurn(label, final.start, final.end, session.id).metadata()
        # A hook that matched the voice to a participant without naming it lets the room's
        # participant record name the turn (attribution B2); otherwise the name is stamped (B1).
        name = final.sender_name
        matched_only = final.participant_id != session.participant_id and name == label
        if name and not matched_only:
            metadata["sender_name"] = name
        event = await kit.post_event(session.room_id, session.channel.channel_id,
                                     TextContent(body=final.text),
                                     participant_id=final.participant_id, metadata=metadata)
        if event is None:  # a BEFORE_BROADCAST hook blocked it
            self.blocked.append(final)
            return None
        committed = CommittedTurn(event, final, asyncio.get_running_loop().time())
        self.turns.append(committed)
        if self.kept_turns is not None and len(self.turns) > self.kept_turns:
            del self.turns[: len(self.turns) - self.kept_turns]
        previous = self.last_speaker
        if previous is _NOBODY or previous != label:
            change = SpeakerChangeEvent(
                speaker=label, sender_name=final.sender_name,
                previous_speaker=None if previous is _NOBODY else previous,  # type: ignore[arg-type]
                is_new_speaker=label not in self.heard, start=final.start,
                participant_id=final.participant_id, session=session,
            )
            kit.emit(HookTrigger.ON_SPEAKER_CHANGE, change, ctx)
        self.heard.add(label)
        self.last_speaker = label
        return committed


__all__ = ["KEPT_PER_SESSION", "TurnWriter"]
