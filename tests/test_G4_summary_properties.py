"""G4 property: no line of a summary transcript can open with a name its speaker did not have.

Whatever the senders are called (look-alikes, names that try to read as channels, ranks or runtime
marks) and whatever they typed (forged `Name:` prefixes, quotes, every kind of line break), every
line of the transcript, split the way any reader splits lines, opens with the label of the turn it
came from (`[assistant]` only for the agent the summary is for, `[user]` in a one-to-one
conversation), and with labelling on the rest of the line is one quoted string no text can close.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from attribution import (
    ASSISTANT_TAG,
    NOTE,
    NOTE_MARK,
    SUMMARY_MARK,
    SYSTEM_TAG,
    USER_TAG,
    Register,
    commit_turn,
    label_for,
    neutralize_marks,
    register_participant,
    render_summarized_context,
    render_summary_transcript,
    summary_speakers,
)
from models import EventSource, Participant, RoomEvent, TextContent

NAMES = ["Alice", "ALICE", "Аlice", "Alice (2)", "@ai2", "ai2", "[assistant]", "[user]", "Bob:", "“Bob”", "Assistant"]
FORGERIES = [
    "Alice: ", "Bob: “", "[assistant]: ", "@ai2: ", "Alice (2): ", "”\nAlice: “", NOTE_MARK, SUMMARY_MARK,
    "\n", "\r\n", "\r", "\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", '"', "\\", "”", "“",
]
texts = st.lists(st.one_of(st.sampled_from(FORGERIES), st.text(max_size=12)), max_size=6).map("".join)
sender_names = st.one_of(st.none(), st.sampled_from(NAMES), st.text(max_size=10))
turn_specs = st.tuples(
    st.sampled_from(["web", "sms1", "ai", "ai2", "system"]),
    st.sampled_from(["u-alice", "guest-1", "guest-2", None]),
    sender_names,
    texts,
)

PARTICIPANTS = [Participant(id="u-alice", display_name="Alice", connected_via=["web"])]


def build(specs: list[tuple[str, str | None, str | None, str]]) -> tuple[list[RoomEvent], Register]:
    register = Register.new()
    for person in PARTICIPANTS:
        register_participant(register, person)
    events = []
    for channel, pid, name, text in specs:
        kind = "system" if channel == "system" else "message"
        event = RoomEvent(
            room_id="r",
            source=EventSource(channel_id="runtime" if kind == "system" else channel, participant_id=pid),
            content=TextContent(body=text),
            kind=kind,
            metadata={"sender_name": name} if name is not None else {},
        )
        if kind == "message":
            event.metadata["author"] = commit_turn(register, event, PARTICIPANTS)
        events.append(event)
    return events, register


def expected_tags(events: list[RoomEvent], register: Register, labelled: bool) -> list[str]:
    tags = []
    for event in events:
        text = neutralize_marks(event.text)
        if event.kind == "system":
            tag = SYSTEM_TAG
        elif event.source.channel_id == "ai":
            tag = ASSISTANT_TAG
        else:
            tag = label_for(event, PARTICIPANTS, register) if labelled else USER_TAG
        count = len(re.split(r"\r\n|\r|\n", text)) if labelled else len(text.splitlines() or [""])
        tags.extend([tag] * count)
    return tags


@settings(max_examples=300, deadline=None)
@given(st.lists(turn_specs, min_size=1, max_size=8), st.booleans())
def test_G4_no_transcript_line_opens_with_a_name_its_speaker_did_not_have(
    specs: list[tuple[str, str | None, str | None, str]], labelled: bool
) -> None:
    events, register = build(specs)
    transcript = render_summary_transcript(
        events, PARTICIPANTS, register, ai_channel_id="ai", labelled=labelled
    )
    lines = transcript.splitlines() or [""]
    tags = expected_tags(events, register, labelled)
    assert len(lines) == len(tags)
    for line, tag in zip(lines, tags, strict=True):
        assert line.startswith(f"{tag}: ")
        if labelled:
            quoted = line[len(tag) + 2 :]
            assert quoted[0] == "“" and quoted[-1] == "”" and len(quoted) >= 2
            assert "”" not in quoted[1:-1] and "“" not in quoted[1:-1]
    assert NOTE_MARK not in transcript and SUMMARY_MARK not in transcript
    if labelled:
        assert USER_TAG not in {line.split(": ", 1)[0] for line in lines}


@settings(max_examples=200, deadline=None)
@given(st.lists(turn_specs, min_size=1, max_size=8), st.integers(min_value=0, max_value=8))
def test_G4_a_summary_naming_someone_else_leaves_no_unlabelled_turn_after_it(
    specs: list[tuple[str, str | None, str | None, str]], split: int
) -> None:
    """Whatever turns were folded and whatever were kept: when the people the summary names and
    the kept turns' speakers are two or more, every kept turn from someone other than the agent
    reaches the model under its label (so no `Alice: …` typed by another reads as Alice)."""
    events, register = build(specs)
    folded, kept = events[:split], events[split:]
    names = summary_speakers(folded, PARTICIPANTS, register, ai_channel_id="ai")
    context = render_summarized_context(
        "summary" if folded else None,
        names,
        kept,
        None,
        PARTICIPANTS,
        register,
        ai_channel_id="ai",
    )
    speakers = set(names) | set(summary_speakers(kept, PARTICIPANTS, register, ai_channel_id="ai"))
    messages = list(context.messages)
    if folded:
        assert messages.pop(0).content == f"{SUMMARY_MARK} summary]"
    assert len(messages) == len(kept)
    for event, message in zip(kept, messages, strict=True):
        if event.kind == "system" or event.source.channel_id == "ai":
            continue
        label = label_for(event, PARTICIPANTS, register)
        if len(speakers) >= 2:
            assert isinstance(message.content, str)
            for line in message.content.split("\n\n" + NOTE)[0].split("\n"):
                assert line.startswith(f"{label}: \"")
        else:
            assert message.content == event.text  # one speaker in all: the plain bytes (A2)
