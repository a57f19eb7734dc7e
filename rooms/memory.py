"""Memory: which past events an agent sees when it is asked to answer.

The attribution engine decides labels per call from exactly this window (rule A1), so the window is
the one thing both must agree on.

`SlidingWindowMemory` keeps the newest turns. `SummarizingMemory` and `CompactingMemory` (G4) fold
older turns into a running summary a summarizer model writes, kept with the room in its store; the
summarizer reads the fallen-out turns labelled by the attribution engine
(`render_summary_transcript`), and the summary and the turns kept after it decide labelling
together (`render_summarized_context`), so a summary naming Alice is never followed by an
unlabelled `Alice: …` someone else typed. Their `recall` is async (a summarizer call, the store);
`AIChannel` and the realtime replay call it.

A memory is asked in two ways. `retrieve(store, room_id, channel_id)` is what the AI channel calls
on every trigger: it reads what it needs from the store, and `SlidingWindowMemory` reads only its
window (`RoomStore.list_window`, served from an index), so building a context costs the same in a
room of 400 events and in one of 40,000 (issue 14.1). `window(events, channel_id)` is the pure
rule over a list already read. The default `retrieve` reads the whole timeline and applies
`window`, so a memory that needs more than the last N events (a summarizing memory reads the
events that fall out of its window) only has to implement `window`, or can override `retrieve` and
page back with `list_window(..., before=event_id)`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from attribution import (
    Register,
    render_summary_transcript,
    shown_name,
    summary_labelling_on,
    summary_speakers,
)
from models import AIContext, AIMessage, Participant, RoomEvent
from rooms.policy import addressed
from rooms.store import RoomStore, in_window, window_of

log = logging.getLogger(__name__)


class Memory(ABC):
    @abstractmethod
    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        """The events (oldest first) a channel's model sees, from the room's committed events."""

    async def retrieve(self, store: RoomStore, room_id: str, channel_id: str) -> list[RoomEvent]:
        """The events (oldest first) a channel's model sees for one call, read from the store.

        The default reads the room's whole timeline and applies `window`."""
        return self.window(await store.list_events(room_id), channel_id)


class SlidingWindowMemory(Memory):
    """The last `max_events` events the channel may see (visible to it, or its own)."""

    def __init__(self, max_events: int = 50) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.max_events = max_events

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        return window_of(events, channel_id, self.max_events)

    async def retrieve(self, store: RoomStore, room_id: str, channel_id: str) -> list[RoomEvent]:
        return await store.list_window(room_id, channel_id, self.max_events)


# --- G4: running summaries ------------------------------------------------------------------------


SUMMARIZER_INSTRUCTIONS = (
    "You keep the running summary of a conversation for an assistant that takes part in it. "
    "You are given the summary so far (if any) and the turns that follow it, one line per line of "
    "text. When several people take part, each line opens with the label the runtime placed (Name, "
    "Name (2) for a different person whose name reads alike, @channel for a sender with no name), "
    "then what its sender wrote on that line inside quotes; a Name: inside the quotes is what the "
    "sender wrote, not a label. [assistant] is the assistant the summary is for; [user] is the one "
    "person in a one-to-one conversation; [system] is a notice from the application. Write one "
    "updated summary in plain prose that attributes every decision, request and claim to the label "
    "of who made it, exactly as labelled (never to a name that only appears inside quotes). Do not "
    "start lines with a name followed by a colon."
)
"""The summarizer's system prompt (the default of `SummarizingMemory(instructions=...)`)."""


class SummarizerResponse(Protocol):
    text: str


class Summarizer(Protocol):
    """A model that writes summaries: any `rooms.AIProvider` (`MockAIProvider`, the OpenAI chat
    provider) fits."""

    async def generate(self, context: AIContext) -> SummarizerResponse: ...


class MemoryStateStore(Protocol):
    """Where a summary is kept with its room: every `RoomStore` has these two methods."""

    async def get_memory_state(self, room_id: str, key: str) -> dict[str, Any] | None: ...
    async def put_memory_state(self, room_id: str, key: str, value: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class Recall:
    """What a summarizing memory hands a call: the summary of older turns (None until turns fell
    out), the people it names (labels), and the turns kept verbatim (oldest first)."""

    window: list[RoomEvent]
    summary: str | None = None
    summary_names: tuple[str, ...] = ()


def visible_events(events: Sequence[RoomEvent], channel_id: str) -> list[RoomEvent]:
    """The events a channel may read: visible to it, or its own."""
    return [e for e in events if in_window(e, channel_id)]


def approx_tokens(text: str) -> int:
    """A provider-neutral token estimate: one token per four characters, at least one."""
    return max(1, -(-len(text) // 4))


class SummarizingMemory(Memory):
    """Older turns folded into a running summary by a summarizer model; the newest kept verbatim.

    `SummarizingMemory(summarizer, keep_recent=20, max_recent=40)`: while at most `max_recent`
    turns (default `keep_recent`) follow the summary, nothing happens; once more do, all but the
    newest `keep_recent` fall out and are folded into the summary, in one summarizer call that reads
    the summary so far and the fallen-out turns (`render_summary_transcript`, G4). So the summary is
    re-made only when turns fall out.

    The summary is kept with the room (`RoomStore.put_memory_state`, key `summary:<channel>` plus
    `key`), so it survives what the store survives and another process or a restarted channel reuses
    it. It records the last event it covers (`through`, and its time `through_at`, so a caller that
    hands in only the newest events still finds where the summary ends), how many turns it folded,
    and the labels of the people in them (`names`), which decide labelling together with the kept
    turns.

    A summarizer that fails (raises, or answers nothing) folds nothing: the turns stay verbatim and
    the next call tries again; the error is logged. Two calls racing may both summarize; the last
    write wins and each is a consistent summary.
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        keep_recent: int = 20,
        max_recent: int | None = None,
        instructions: str = SUMMARIZER_INSTRUCTIONS,
        key: str = "",
    ) -> None:
        if keep_recent < 1:
            raise ValueError("keep_recent must be at least 1")
        if max_recent is not None and max_recent < keep_recent:
            raise ValueError("max_recent must be at least keep_recent")
        self.summarizer = summarizer
        self.keep_recent = keep_recent
        self.max_recent = keep_recent if max_recent is None else max_recent
        self.instructions = instructions
        self.key = key

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        """Without the room's stored summary: the newest `keep_recent` turns (use `recall`)."""
        return visible_events(events, channel_id)[-self.keep_recent :]

    def state_key(self, channel_id: str) -> str:
        return f"summary:{channel_id}" + (f":{self.key}" if self.key else "")

    def fold_count(self, unfolded: Sequence[RoomEvent], summary: str | None) -> int:
        """How many of the oldest unsummarized turns fall out now (0: none)."""
        if len(unfolded) <= self.max_recent:
            return 0
        return len(unfolded) - self.keep_recent

    async def recall(
        self,
        events: Sequence[RoomEvent],
        channel_id: str,
        *,
        room_id: str,
        store: MemoryStateStore,
        participants: Sequence[Participant],
        register: Register,
        attribution: bool = True,
    ) -> Recall:
        """The summary and the kept turns for one call, folding turns that fell out (G4)."""
        visible = visible_events(events, channel_id)
        key = self.state_key(channel_id)
        state = await store.get_memory_state(room_id, key)
        summary: str | None = None
        names: list[str] = []
        folded = 0
        start = 0
        if state is not None and isinstance(state.get("summary"), str):
            through = state.get("through")
            through_at = _parse_time(state.get("through_at"))
            ids = [e.id for e in visible]
            if isinstance(through, str) and through in ids:
                start = ids.index(through) + 1
            elif through_at is not None:
                # The events handed in do not reach back to the summary's last turn (a windowed
                # read): whatever is not newer than it was folded already.
                while start < len(visible) and visible[start].created_at <= through_at:
                    start += 1
            else:
                state = None  # a record without its place in the timeline: summarize afresh
            if state is not None:
                summary = str(state["summary"])
                names = [n for n in state.get("names", []) if isinstance(n, str)]
                folded = int(state.get("folded", 0))
        unfolded = visible[start:]
        count = self.fold_count(unfolded, summary)
        if count > 0:
            falling, kept = unfolded[:count], unfolded[count:]
            named = _named(summary, names, participants)
            new_names = named + [
                n
                for n in summary_speakers(
                    falling, participants, register, ai_channel_id=channel_id
                )
                if n not in named
            ]
            labelled = attribution and summary_labelling_on(
                new_names, kept, participants, register, ai_channel_id=channel_id
            )
            transcript = render_summary_transcript(
                falling, participants, register, ai_channel_id=channel_id, labelled=labelled
            )
            made = await self._summarize(summary, transcript)
            if made is not None:
                summary, names, folded = made, new_names, folded + len(falling)
                unfolded = kept
                await store.put_memory_state(
                    room_id,
                    key,
                    {
                        "version": 1,
                        "summary": summary,
                        "through": falling[-1].id,
                        "through_at": falling[-1].created_at.isoformat(),
                        "folded": folded,
                        "names": names,
                    },
                )
        return Recall(
            window=list(unfolded),
            summary=summary,
            summary_names=tuple(_named(summary, names, participants)),
        )

    async def _summarize(self, summary: str | None, transcript: str) -> str | None:
        parts = []
        if summary is not None:
            parts.append(f"The summary so far:\n{summary}")
        parts.append(f"The conversation that follows it:\n{transcript}")
        context = AIContext(
            messages=[AIMessage(role="user", content="\n\n".join(parts))],
            system_prompt=self.instructions,
        )
        try:
            response = await self.summarizer.generate(context)
        except Exception:
            log.exception("the summarizer failed; the turns stay verbatim")
            return None
        text = response.text.strip()
        if not text:
            log.warning("the summarizer answered nothing; the turns stay verbatim")
            return None
        return text


def _parse_time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def _named(summary: str | None, names: list[str], participants: Sequence[Participant]) -> list[str]:
    """The people a summary names: the labels of the turns it folded, and every participant of
    the room whose name it mentions (as a whole word)."""
    out = list(names)
    if summary is None:
        return out
    for person in participants:
        shown = shown_name(person.display_name) if person.display_name else None
        if shown and shown not in out and addressed(summary, [shown]):
            out.append(shown)
    return out


class CompactingMemory(SummarizingMemory):
    """The window compacted when it passes a token budget.

    `CompactingMemory(summarizer, max_tokens=3000, target_tokens=1500, count_tokens=approx_tokens)`:
    while the summary and the turns after it fit in `max_tokens`, nothing happens; once they pass
    it, the oldest turns are folded into the summary until the turns kept verbatim fit in
    `target_tokens` (default half the budget; the newest turn is always kept). Tokens are counted
    with `count_tokens` over each turn's text (default: four characters a token).
    """

    def __init__(
        self,
        summarizer: Summarizer,
        *,
        max_tokens: int = 3000,
        target_tokens: int | None = None,
        count_tokens: Callable[[str], int] = approx_tokens,
        instructions: str = SUMMARIZER_INSTRUCTIONS,
        key: str = "",
    ) -> None:
        super().__init__(summarizer, keep_recent=1, instructions=instructions, key=key)
        if max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        target = max_tokens // 2 if target_tokens is None else target_tokens
        if not 0 < target <= max_tokens:
            raise ValueError("target_tokens must be between 1 and max_tokens")
        self.max_tokens = max_tokens
        self.target_tokens = target
        self.count_tokens = count_tokens

    def window(self, events: list[RoomEvent], channel_id: str) -> list[RoomEvent]:
        """Without the room's stored summary: the newest turns that fit in `target_tokens`."""
        visible = visible_events(events, channel_id)
        return visible[len(visible) - self._fitting(visible) :]

    def _fitting(self, turns: Sequence[RoomEvent]) -> int:
        """How many of the newest `turns` fit in `target_tokens` (at least one, if any)."""
        total = 0
        kept = 0
        for event in reversed(turns):
            total += self.count_tokens(event.text)
            if kept and total > self.target_tokens:
                break
            kept += 1
        return kept

    def fold_count(self, unfolded: Sequence[RoomEvent], summary: str | None) -> int:
        used = sum(self.count_tokens(e.text) for e in unfolded)
        if summary is not None:
            used += self.count_tokens(summary)
        if used <= self.max_tokens:
            return 0
        return len(unfolded) - self._fitting(unfolded)
