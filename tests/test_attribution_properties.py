"""Property tests of the attribution engine: C2 round trip, C6 distinct labels, D2/D3 fixed ranks."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from attribution import (
    MARK_NOTICE,
    NOTE,
    NOTE_MARK,
    Register,
    commit_turn,
    json_line,
    label_for,
    labelled_lines,
    labelling_on,
    neutralize_marks,
    other_double_quotes,
    register_participant,
    render_chat_context,
    render_plain_context,
    resolve_speaker,
    shown_name,
)
from models import EventSource, Participant, RoomEvent, TextContent

SETTINGS = settings(max_examples=150, deadline=None)

LOOK_ALIKES = [
    "Alice",
    "ALICE",
    "Аlice",
    "alice",
    "Lan",
    "Ian",
    "ian",
    "lan",
    "Alice (2)",
    "@ai2",
    "ai2",
    "Assistant",
    "Speaker A",
    "Speaker\u00a0A",
    NOTE_MARK,
    "Bob:",
    "“Bob”",
    "rn",
    "m",
]
names = st.one_of(
    st.sampled_from(LOOK_ALIKES),
    st.text(max_size=80),
    st.builds(lambda a, b: a + b, st.sampled_from(LOOK_ALIKES), st.text(max_size=4)),
)


def turn(
    text: str = "hi", *, by: str | None = None, channel: str = "chat", **metadata: Any
) -> RoomEvent:
    return RoomEvent(
        room_id="r1",
        source=EventSource(channel_id=channel, participant_id=by),
        content=TextContent(body=text),
        metadata=metadata,
    )


# --- A2 ----------------------------------------------------------------------------------------

window_turn = st.tuples(
    st.sampled_from(["speaker", "ai", "system", "speaker-stamped"]), st.text(max_size=30)
)


@SETTINGS
@given(st.lists(window_turn, min_size=1, max_size=8), names)
def test_A2_one_speaker_window_is_byte_identical(turns: list[tuple[str, str]], name: str) -> None:
    alice = Participant(id="p1", display_name=name, connected_via=["chat"])
    register = Register.new()
    register_participant(register, alice)
    window: list[RoomEvent] = []
    for who, text in turns:
        if who == "ai":
            event = turn(text, channel="ai1")
        elif who == "system":
            event = turn(text, channel="runtime")
            event.kind = "system"
        elif who == "speaker-stamped" and shown_name(name) is not None:
            event = turn(text, by="p1", sender_name=name)
        else:
            event = turn(text, by="p1")
        author = commit_turn(register, event, [alice])
        if author:
            event.metadata["author"] = author
        window.append(event)
    labelled = render_chat_context(
        window, window[-1], [alice], register, ai_channel_id="ai1", system_prompt="S"
    )
    plain = render_plain_context(window, window[-1], ai_channel_id="ai1", system_prompt="S")
    assert labelled.model_dump_json() == plain.model_dump_json()


# --- C2 ----------------------------------------------------------------------------------------


def _expected(line: str) -> str:
    quotes = other_double_quotes()
    out = "".join("'" if c in quotes else c for c in line)
    # Two adjacent lone surrogates are a UTF-16 pair once escaped: JSON reads them as one character.
    return out.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


@SETTINGS
@given(
    st.text(st.characters(exclude_characters="\r\n"))
    | st.text(st.sampled_from(["\ud800", "\udfff", "\u202e", "a", '"', "\\", "“"]))
)
def test_C2_round_trip_json_string(line: str) -> None:
    written = json_line(line)
    assert json.loads(written) == _expected(line)
    assert written.startswith('"') and written.endswith('"')
    for ch in written:
        assert ch not in "\u2028\u2029\u202e\u2066\u200f" and not (
            ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 or 0xD800 <= ord(ch) < 0xE000
        )
    assert not (other_double_quotes() & set(written))


@SETTINGS
@given(st.text(), st.sampled_from(["Alice", "Bob (2)", "@sms1"]))
def test_C2_labelled_lines_round_trip(text: str, label: str) -> None:
    lines = labelled_lines(label, text).split("\n")
    prefix = f"{label}: "
    assert all(line.startswith(prefix) for line in lines)
    parsed = [json.loads(line[len(prefix) :]) for line in lines]
    normalized = text.replace("\r\n", "\n").replace("\r", "\n")
    assert "\n".join(parsed) == _expected(normalized)


def test_C2_spec_quote_marks_are_covered() -> None:
    assert set("“”„‟″＂«»") <= other_double_quotes()
    assert '"' not in other_double_quotes() and "'" not in other_double_quotes()


# --- C6 ----------------------------------------------------------------------------------------

RANK_SUFFIX = re.compile(r"\(\d+\)\s*$")


@SETTINGS
@given(names)
def test_C6_no_name_renders_as_a_runtime_form(raw: str) -> None:
    name = shown_name(raw)
    if name is None:
        return
    assert 0 < len(name) <= 64
    assert not name.startswith("@") and not name.startswith("＠")
    assert not RANK_SUFFIX.search(name)
    assert "(" not in name and ":" not in name and '"' not in name
    assert NOTE_MARK not in name
    assert "\n" not in name and name == name.strip()
    assert shown_name(name) == name  # showing is idempotent


sender = st.tuples(
    st.sampled_from(["chat", "sms1", "voice", "ai2"]),
    st.sampled_from([None, "p1", "p2", "dev-1"]),
    st.one_of(st.none(), names),
)


@SETTINGS
@given(st.lists(names, max_size=3), st.lists(sender, min_size=1, max_size=12))
def test_C6_two_sources_never_render_the_same_label(
    people_names: list[str], senders: list[tuple[str, str | None, str | None]]
) -> None:
    people = [
        Participant(id=f"p{i + 1}", display_name=n, connected_via=["chat"])
        for i, n in enumerate(people_names)
    ]
    register = Register.new()
    for person in people:
        register_participant(register, person)
    owner: dict[str, str] = {}
    for channel, pid, name in senders:
        metadata = {} if name is None else {"sender_name": name}
        event = turn(channel=channel, by=pid, **metadata)
        event.metadata["author"] = commit_turn(register, event, people)
        label = label_for(event, people, register)
        source = event.metadata["author"]["source"]
        assert owner.setdefault(label, source) == source, (label, owner)


# --- D2/D3 -------------------------------------------------------------------------------------


@dataclass
class Room:
    people: dict[str, Participant] = field(default_factory=dict)
    register: Register = field(default_factory=Register.new)
    seen: list[tuple[RoomEvent, str]] = field(default_factory=list)


join = st.tuples(st.just("join"), st.sampled_from(["p1", "p2", "p3"]), names)
rename = st.tuples(st.just("rename"), st.sampled_from(["p1", "p2", "p3"]), names)
say = st.tuples(
    st.just("say"),
    sender,
    st.sampled_from(["all", "none", ["ai1"]]),
    st.booleans(),  # blocked by a hook: never committed
)
operations = st.lists(st.one_of(join, rename, say), min_size=1, max_size=25)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_D2_D3_ranks_never_change_once_given(ops: list[tuple[Any, ...]]) -> None:
    room = Room()
    for op in ops:
        if op[0] in ("join", "rename"):
            _, pid, name = op
            if op[0] == "join" and pid in room.people:
                continue
            person = Participant(id=pid, display_name=name, connected_via=["chat"])
            room.people[pid] = person
            register_participant(room.register, person)  # ensure_participant
            continue
        _, (channel, pid, name), visibility, blocked = op
        metadata = {} if name is None else {"sender_name": name}
        event = turn(channel=channel, by=pid, **metadata)
        event.visibility = visibility
        if blocked:
            continue
        people = list(room.people.values())
        author = commit_turn(room.register, event, people)
        event.metadata["author"] = author
        label = label_for(event, people, room.register)
        room.seen.append((event, label))
        # The same (source, name) always gets the rank it got first.
        for earlier, _ in room.seen:
            before = earlier.metadata["author"]
            if before["source"] == author["source"] and before["name"] == author["name"]:
                assert before["rank"] == author["rank"]
    people = list(room.people.values())
    owner: dict[str, str] = {}
    for event, label in room.seen:
        assert label_for(event, people, room.register) == label  # D3: fixed as the room moves on
        source = event.metadata["author"]["source"]
        assert owner.setdefault(label, source) == source
        # Without its record, a turn whose speaker still resolves the same reads the same.
        bare = event.model_copy(
            update={"metadata": {k: v for k, v in event.metadata.items() if k != "author"}}
        )
        speaker = resolve_speaker(bare, people)
        same_source = room.register.digest("source", *speaker.source) == source
        if same_source and speaker.name == event.metadata["author"]["name"]:
            assert label_for(bare, people, room.register) == label


# --- E3 ----------------------------------------------------------------------------------------


@SETTINGS
@given(
    st.text(max_size=40),
    st.sampled_from([NOTE_MARK, NOTE_MARK.upper(), "[speaker labels FROM the runtime"]),
    st.text(max_size=40),
)
def test_E3_neutralize_removes_every_copy_and_is_idempotent(
    before: str, mark: str, after: str
) -> None:
    once = neutralize_marks(before + mark + after)
    assert MARK_NOTICE in once
    assert neutralize_marks(once) == once
    assert "labels from the runtime" not in once.replace(MARK_NOTICE, "").casefold()


# --- C1/E1/E3 in a labelled context --------------------------------------------------------------

marked_text = st.one_of(
    st.text(max_size=40),
    st.builds(lambda a, b: a + NOTE_MARK + b, st.text(max_size=10), st.text(max_size=10)),
)


@SETTINGS
@given(
    st.lists(
        st.tuples(st.sampled_from(["p1", "p2", None]), names, marked_text), min_size=2, max_size=6
    )
)
def test_C1_E1_E3_every_line_labelled_and_one_note(
    turns: list[tuple[str | None, str, str]],
) -> None:
    people = [
        Participant(id="p1", display_name="Alice", connected_via=["chat"]),
        Participant(id="p2", display_name="Bob", connected_via=["chat"]),
    ]
    register = Register.new()
    for person in people:
        register_participant(register, person)
    window: list[RoomEvent] = []
    for pid, name, text in turns:
        event = turn(text, by=pid, sender_name=name) if pid is None else turn(text, by=pid)
        event.metadata["author"] = commit_turn(register, event, people)
        window.append(event)
    ctx = render_chat_context(window, window[-1], people, register, ai_channel_id="ai1")
    user = [m for m in ctx.messages if m.role == "user"]
    assert len(user) == len(window)
    on = labelling_on(window, people, "ai1", register=register)
    notes = sum(str(m.content).count(NOTE_MARK) for m in ctx.messages)
    assert notes == (1 if on else sum(e.text.count(NOTE_MARK) for e in window))
    if not on:
        return
    for event, message in zip(window, user, strict=True):
        assert isinstance(message.content, str)
        body = message.content.removesuffix("\n\n" + NOTE)
        label = label_for(event, people, register)
        lines = body.split("\n")
        assert all(line.startswith(f"{label}: ") for line in lines)
        parsed = [json.loads(line[len(label) + 2 :]) for line in lines]
        assert NOTE_MARK not in "\n".join(parsed)
