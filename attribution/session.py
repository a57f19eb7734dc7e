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
        text = render_line(event, participants, register)
        if not self.note_sent:
            text = f"{text}\n\n{NOTE}"
            self.note_sent = True
        return SessionLine(label=label, text=text, labelled=True)
