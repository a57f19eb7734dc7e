"""G3: labels for a session that keeps what it was sent (a realtime session, an external agent).

A chat model is handed a fresh window each call, so A1 decides labelling per call. A session
keeps every line or request it was sent, so the decision cannot be taken back: nothing is
labelled while the room holds one speaker (the text goes as sent, A2); the first line or request
after a second speaker appears is labelled and carries the note (E1); every later one in that
session stays labelled. An instruction from the application (a runtime system event) keeps its
own text and is never labelled.

`SessionLabels` is that state machine, one per session. It is plain data and pure functions over
the engine (`label_for`, `render_line`), so every surface that keeps a session — the realtime
channel, the ACP agent channel — labels the same way from one implementation.

A session cannot take back what it holds either, so a turn corrected in place after it was sent (a
voice turn committed early, then corrected by the final result) is told to it: `correction_note`
is the fixed text that says which earlier item was wrong, in Chorus's own words, before the
corrected line rendered like any other. One wording for every surface, each naming what it
counts (`CorrectionWording`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attribution.register import Register, label_for
from attribution.render import NOTE, render_line
from attribution.speakers import Participants
from models import RoomEvent


@dataclass(frozen=True)
class SessionLine:
    """What a session is sent for one turn: its `label` (`""` for a system event) and `text`."""

    label: str
    text: str
    labelled: bool
    carries_note: bool = False
    """`text` ends with the note (the session's first labelled line, E1)."""

    @property
    def text_without_note(self) -> str:
        """The line as the session reads it once the note is given: what a correction compares."""
        return self.text.removesuffix(f"\n\n{NOTE}") if self.carries_note else self.text

    def with_note(self) -> SessionLine:
        """This line carrying the note (a line standing in for one that carried it keeps it)."""
        if self.carries_note:
            return self
        return SessionLine(self.label, f"{self.text}\n\n{NOTE}", self.labelled, carries_note=True)


@dataclass
class SessionLabels:
    """The G3 state of one session: who the room holds, whether labelling is on, note sent."""

    speakers: set[str] = field(default_factory=set)
    labelling: bool = False
    note_sent: bool = False

    def count(self, label: str) -> None:
        """A speaker the room holds (a past turn seen on attach, or a turn not sent to the
        session). Labelling switches on with the second, for the next line rendered."""
        if label:
            self.speakers.add(label)
        if not self.labelling and len(self.speakers) >= 2:
            self.labelling = True

    def count_event(
        self, event: RoomEvent, participants: Participants, register: Register
    ) -> str:
        """Count the speaker of `event` (system events are no speaker); its label."""
        if event.kind == "system":
            return ""
        label = label_for(event, participants, register)
        self.count(label)
        return label

    def render(
        self, event: RoomEvent, participants: Participants, register: Register
    ) -> SessionLine:
        """The text the session is sent for `event`, counting its speaker first (G3).

        A system event keeps its own text. Otherwise: the text as sent while the room holds one
        speaker; once two are seen, `Label: "line"` lines (C1, C2), the first carrying the note.
        """
        if event.kind == "system":
            return SessionLine(label="", text=event.text, labelled=False)
        label = self.count_event(event, participants, register)
        if not self.labelling:
            return SessionLine(label=label, text=event.text, labelled=False)
        line = SessionLine(label=label, text=render_line(event, participants, register), labelled=True)
        if not self.note_sent:
            self.note_sent = True
            return line.with_note()
        return line


@dataclass(frozen=True)
class CorrectionWording:
    """What a session surface calls the items a correction counts back over, for
    `correction_note`: the realtime channel counts transcript lines, the ACP channel requests."""

    counted: str
    """What is counted back: `transcript line`, `request`."""
    how_counted: str
    """Said in brackets after a count beyond the last: `your own replies not counted`."""
    follows: str
    """What the corrected version is sent as, right after the note: `line`, `block`."""
    replaces: str
    """What the corrected version stands in for: `line`, `request`."""


def correction_note(back: int, wording: CorrectionWording) -> str:
    """The fixed text sent before a corrected turn: the `back`-th `counted` item before it (1: the
    last one) was transcribed wrong, and the next one is what was said instead.

    Its words are Chorus's own: nothing a speaker said is ever quoted in it. The corrected line
    that follows is rendered by `SessionLabels.render` like every other, so a correction can
    change who said it, and its words still cannot claim a name.
    """
    where = (
        f"the last {wording.counted} before this note"
        if back == 1
        else f"{wording.counted} {back} counting back from this note ({wording.how_counted})"
    )
    return (
        f"Correction from the speech-to-text service: {where} was transcribed wrong. "
        f"The next {wording.follows} is what was said instead; "
        f"read it in that {wording.replaces}'s place."
    )
