"""Issue 27.2: remembered voices name a stream's anonymous voices in tiers — the name above
`auto`, a feed suggestion between `suggest` and `auto`, nothing below — one voice never takes two
names and two voices never one; a forgotten voice reads as its letter again from its next turn.
Checked on the pure `StreamVoices`, then through the server's real rename hook
(`RoomRenames.apply`) with a real `VoiceDirectory` on an in-memory store."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from rooms import HookContext, InMemoryStore, RoomKit, VoiceStore
from server.config import VoicesConfig
from server.feed import RoomFeed
from server.framing import StreamDeclaration
from server.pipeline import StreamInfo
from server.renames import RoomRenames
from server.room_state import LiveRoom, LiveStream
from server.voices import VoiceDirectory
from voice.audio import StreamFormat
from voice.diarization_stage import StagePrints
from voice.events import TranscriptionEvent
from voice.identify import (
    TURN_MAX_S,
    TURN_PART_S,
    IdentifySettings,
    KnownVoice,
    StreamVoices,
    TurnPrint,
    claimable,
    print_turn,
    turn_matches,
    turn_parts,
    turn_person,
    turn_scores,
    turn_span,
    worth_checking,
)

ROOM = "standup"
MODEL = "campplus-test"
SETTINGS = IdentifySettings(auto=0.6, suggest=0.45, min_heard_s=2.0)


_spare = iter(range(4, 64))


def near(base: np.ndarray, cosine: float) -> np.ndarray:
    """A unit vector at exactly `cosine` from `base` and orthogonal to every other vector made
    here (its remainder is on an axis of its own)."""
    other = np.zeros_like(base)
    other[next(_spare)] = 1.0
    return (cosine * base + np.sqrt(1 - cosine**2) * other).astype(np.float32)


def unit(*values: float) -> np.ndarray:
    v = np.zeros(64, dtype=np.float32)
    v[: len(values)] = values
    return v / np.linalg.norm(v)


IAN, PEGGY = unit(1, 0, 0, 0), unit(0, 1, 0, 0)
KNOWN = [KnownVoice("v-ian", "Ian", IAN[None, :]), KnownVoice("v-peggy", "Peggy", PEGGY[None, :])]


def test_tiers_name_suggest_or_leave_alone() -> None:
    state = StreamVoices()
    found = state.update(
        {"Speaker A": near(IAN, 0.8), "Speaker B": near(PEGGY, 0.5), "Speaker C": unit(0, 0, 1, 0)},
        {"Speaker A": 3.0, "Speaker B": 3.0, "Speaker C": 3.0},
        KNOWN,
        SETTINGS,
    )
    assert [(f.label, f.name, f.tier) for f in found] == [
        ("Speaker A", "Ian", "auto"),
        ("Speaker B", "Peggy", "suggest"),
    ]
    assert state.name_of("Speaker A") == "Ian"
    assert state.name_of("Speaker B") is None and state.name_of("Speaker C") is None
    # the same suggestion is not made twice
    again = state.update({"Speaker B": near(PEGGY, 0.5)}, {"Speaker B": 4.0}, KNOWN, SETTINGS)
    assert again == []


def test_a_voice_is_scored_only_once_it_spoke_long_enough() -> None:
    state = StreamVoices()
    assert state.update({"Speaker A": IAN}, {"Speaker A": 1.0}, KNOWN, SETTINGS) == []
    assert [
        f.name for f in state.update({"Speaker A": IAN}, {"Speaker A": 2.5}, KNOWN, SETTINGS)
    ] == ["Ian"]


def test_two_voices_never_take_one_name_and_a_name_stays_with_its_voice() -> None:
    state = StreamVoices()
    both = {"Speaker A": near(IAN, 0.9), "Speaker B": near(IAN, 0.7)}
    speech = {"Speaker A": 3.0, "Speaker B": 3.0}
    found = state.update(both, speech, KNOWN[:1], SETTINGS)
    assert [(f.label, f.name) for f in found] == [("Speaker A", "Ian")]
    # later, B sounds even more like Ian, and A drifts: A keeps Ian, B never takes it
    assert (
        state.update({"Speaker A": near(IAN, 0.3), "Speaker B": IAN}, speech, KNOWN[:1], SETTINGS)
        == []
    )
    assert state.name_of("Speaker A") == "Ian" and state.name_of("Speaker B") is None


def test_one_voice_never_takes_two_names() -> None:
    state = StreamVoices()
    both = unit(1, 1, 0, 0)  # cos 0.707 with Ian and with Peggy
    found = state.update({"Speaker A": both}, {"Speaker A": 3.0}, KNOWN, SETTINGS)
    assert len(found) == 1 and found[0].tier == "auto"
    assert state.update({"Speaker A": both}, {"Speaker A": 9.0}, KNOWN, SETTINGS) == []


def test_prints_of_the_best_matching_recording_count() -> None:
    ian_two_rooms = KnownVoice("v-ian", "Ian", np.stack([unit(0, 0, 1, 0), IAN]))
    state = StreamVoices()
    found = state.update(
        {"Speaker A": near(IAN, 0.7)}, {"Speaker A": 3.0}, [ian_two_rooms], SETTINGS
    )
    assert [f.name for f in found] == ["Ian"]


def test_a_turn_matches_its_person_from_the_verify_threshold_on() -> None:
    settings = IdentifySettings(auto=0.6, suggest=0.45, verify=0.4)
    ian = KNOWN[0]
    assert turn_matches(TurnPrint(near(IAN, 0.45)), ian, settings)
    assert not turn_matches(TurnPrint(near(IAN, 0.35)), ian, settings)
    assert not turn_matches(TurnPrint(PEGGY), ian, settings)
    # the best of the person's prints counts (one per meeting or clip)
    two = KnownVoice("v-ian", "Ian", np.stack([PEGGY, IAN]))
    assert turn_matches(TurnPrint(near(IAN, 0.45)), two, settings)
    # without a threshold every turn matches
    assert turn_matches(TurnPrint(PEGGY), ian, IdentifySettings())
    with pytest.raises(ValueError):
        IdentifySettings(verify=1.5)


def test_a_long_turn_must_match_its_person_on_every_part() -> None:
    """A turn holding two people, more of the named one, matches as a whole but not on the
    other person's part (`TURN_PART_S`)."""
    settings = IdentifySettings(auto=0.6, suggest=0.45, verify=0.4)
    ian = KNOWN[0]
    assert turn_matches(TurnPrint(near(IAN, 0.6), (near(IAN, 0.5), near(IAN, 0.45))), ian, settings)
    assert not turn_matches(TurnPrint(near(IAN, 0.6), (near(IAN, 0.7), PEGGY)), ian, settings)
    assert turn_matches(TurnPrint(near(IAN, 0.6), (PEGGY,)), ian, IdentifySettings())



def test_a_turn_is_claimed_only_by_a_person_it_sounds_like_on_every_part() -> None:
    """Claims score the turn as checks do (`turn_scores`: the least-like part counts): Peggy's
    whole-turn match does not claim a turn one of whose parts is Ian's."""
    ian, peggy = KNOWN
    settings = IdentifySettings(auto=0.6, suggest=0.45, verify=0.4, claim=0.5)
    hers = TurnPrint(near(PEGGY, 0.7), (near(PEGGY, 0.6), near(PEGGY, 0.55)))
    mixed = TurnPrint(near(PEGGY, 0.7), (near(PEGGY, 0.6), IAN))
    assert turn_person(hers, None, [peggy], settings) is peggy
    assert turn_person(mixed, None, [peggy], settings) is None
    assert turn_scores(hers, [peggy]).tolist() == pytest.approx([0.55], abs=1e-6)
    assert turn_scores(mixed, [ian, peggy]).tolist() == pytest.approx([0.0, 0.0], abs=1e-6)


def test_a_turn_is_cut_in_parts_from_twice_the_part_length_on() -> None:
    rate = 100
    lengths = {
        seconds: [len(p) / rate for p in turn_parts(np.zeros(round(seconds * rate), np.float32), rate)]
        for seconds in (5.9, 6.0, 7.4, 7.6, 10.0)
    }
    assert TURN_PART_S == 3.0
    assert lengths == {5.9: [], 6.0: [3.0, 3.0], 7.4: [3.0, 4.4], 7.6: [3.0, 3.0, 1.6],
                       10.0: [3.0, 3.0, 4.0]}


def test_a_turn_is_printed_whole_and_in_parts_or_not_at_all() -> None:
    rate = 100
    heard: list[int] = []

    def voiceprint(audio: np.ndarray) -> np.ndarray:
        heard.append(len(audio))
        if len(audio) < 200:
            raise ValueError("too little speech")
        return IAN

    made = print_turn(np.zeros(700, np.float32), rate, voiceprint)
    assert made is not None and len(made.parts) == 2 and heard == [700, 300, 400]
    assert print_turn(np.zeros(49, np.float32), rate, voiceprint) is None  # under TURN_MIN_S
    assert print_turn(np.zeros(150, np.float32), rate, voiceprint) is None  # the model refuses


def test_a_turn_reads_its_voices_person_or_claims_a_person_named_for_another_voice() -> None:
    ian, peggy = KNOWN
    settings = IdentifySettings(auto=0.6, suggest=0.45, verify=0.4, claim=0.5)
    assert turn_person(TurnPrint(near(IAN, 0.45)), ian, [peggy], settings) is ian
    assert turn_person(TurnPrint(near(PEGGY, 0.55)), ian, [peggy], settings) is peggy  # claimed
    assert turn_person(TurnPrint(near(PEGGY, 0.45)), ian, [peggy], settings) is None  # under `claim`
    assert turn_person(TurnPrint(near(PEGGY, 0.55)), None, [peggy], settings) is peggy  # an unnamed voice
    assert turn_person(TurnPrint(near(PEGGY, 0.55)), None, [], settings) is None  # Peggy not named here
    # a turn too short to print (no print) cannot show it is anyone: its voice's letter
    assert turn_person(None, ian, [peggy], settings, [peggy]) is None
    unclaimed = IdentifySettings(auto=0.6, suggest=0.45, verify=0.4)
    assert turn_person(TurnPrint(near(PEGGY, 0.9)), ian, [peggy], unclaimed) is None
    with pytest.raises(ValueError):
        IdentifySettings(claim=2.5)


def test_a_turn_claims_a_person_named_for_no_voice_only_from_claim_new_on() -> None:
    """`claim_new`: a remembered person the stream has named for no voice (`absent`) is claimed
    at or above its own threshold; the higher score wins over a person named for another voice;
    the voice's own person is never claimed from the absent."""
    ian, peggy = KNOWN
    omar = KnownVoice("v-omar", "Omar", unit(0, 0, 0, 1)[None, :])
    settings = IdentifySettings(verify=0.4, claim=0.5, claim_new=0.6)
    assert turn_person(TurnPrint(near(PEGGY, 0.65)), None, [], settings, [peggy]) is peggy
    assert turn_person(TurnPrint(near(PEGGY, 0.55)), None, [], settings, [peggy]) is None
    assert turn_person(TurnPrint(near(PEGGY, 0.9)), None, [], dataclasses.replace(
        settings, claim_new=None), [peggy]) is None
    both = TurnPrint(unit(0, 0.6, 0, 0.8))  # Peggy 0.6, Omar 0.8
    assert turn_person(both, None, [peggy], settings, [omar]) is omar
    assert turn_person(TurnPrint(unit(0, 0.8, 0, 0.6)), None, [peggy], settings, [omar]) is peggy
    assert turn_person(TurnPrint(near(IAN, 0.3)), ian, [], settings, [ian]) is None
    people = {p.id: p for p in (ian, peggy, omar)}
    assert claimable("Speaker A", {"Speaker A": "v-ian"}, {"v-peggy"}, people) == ([], [omar])
    assert claimable("Speaker B", {"Speaker A": "v-ian"}, {"v-peggy"}, people) == ([ian], [omar])
    assert worth_checking(None, [], settings, [omar])
    assert not worth_checking(None, [], dataclasses.replace(settings, claim_new=None), [omar])
    with pytest.raises(ValueError):
        IdentifySettings(claim_new=2.5)


def test_a_turn_is_checked_only_when_it_has_a_person_to_match_or_to_claim() -> None:
    """`worth_checking`, the one guard of the server's, batch's and the bench's checks."""
    ian, peggy = KNOWN
    checked = IdentifySettings(verify=0.4, claim=0.5)
    assert worth_checking(ian, [], checked)  # its voice's person
    assert worth_checking(None, [peggy], checked)  # someone to claim
    assert not worth_checking(None, [], checked)
    assert not worth_checking(None, [peggy], IdentifySettings(verify=0.4))  # claims off
    assert not worth_checking(ian, [peggy], IdentifySettings())  # verify off: nothing is checked


def test_a_long_turn_is_printed_from_its_middle_ten_seconds() -> None:
    assert turn_span(2.0, 9.0) == (2.0, 9.0)
    assert turn_span(0.0, TURN_MAX_S) == (0.0, TURN_MAX_S)
    assert turn_span(10.0, 40.0) == (20.0, 30.0)


def test_thresholds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="suggest <= auto"):
        IdentifySettings(auto=0.4, suggest=0.5)
    with pytest.raises(ValueError, match="suggest <= auto"):
        VoicesConfig(auto=0.4, suggest=0.5)


# -- through the server's rename hook --------------------------------------------------------


class StageAudio:
    """A stream's audio session as the directory sees it: only its stage's prints."""

    session_id = "device-1"

    def __init__(self) -> None:
        self.prints = StagePrints(MODEL)
        self.turn_print: np.ndarray | None = None
        """The print of the next turn (None: no printer, as when the stream's audio log no
        longer holds the turn: not checked)."""
        self.short = False
        """The next turn is too short to print (the printer gives None)."""

    async def push(self, frame: bytes) -> None: ...

    async def finish(self) -> None: ...

    def speaker_prints(self) -> StagePrints | None:
        return self.prints

    def turn_printer(self, start: float, end: float) -> Callable[[], TurnPrint | None] | None:
        """The print of the turn's audio: `turn_print` (None from it: a turn too short to
        print, `short`); None without a print (`turn_print` None)."""
        if self.turn_print is None:
            return None
        made = None if self.short else TurnPrint(self.turn_print)
        return lambda: made


class Room:
    def __init__(
        self, kit: RoomKit, store: VoiceStore, config: VoicesConfig | None = None
    ) -> None:
        self.kit = kit
        self.live = LiveRoom(ROOM, RoomFeed(queue_size=64, history=64))
        self.sessions: dict[str, LiveStream] = {}
        self.renames = RoomRenames(kit, {ROOM: self.live}, self.sessions)
        self.voices = VoiceDirectory(
            store, config or VoicesConfig(enabled=True), self.renames.suggest
        )
        self.renames.voices = self.voices
        declaration = StreamDeclaration("desk", None, True, StreamFormat(16000, "pcm16", 1))
        self.stream = LiveStream(
            StreamInfo(ROOM, "device-1", declaration), "device", lambda pcm, rate: []
        )
        self.audio = StageAudio()
        self.stream.audio = self.audio
        self.live.streams[self.stream.id] = self.stream
        self.sessions[self.stream.id] = self.stream
        self.sticky: dict[str, str] = {}
        """What the voice session's turn writer keeps (sticky renames, V6)."""

    async def turn(self, label: str) -> str | None:
        """One committed turn of `label`: its name after the hook, kept sticky as a session
        keeps a hook's rename."""
        session: Any = SimpleNamespace(id=self.stream.id)
        sender = self.sticky.get(label, label)
        value = TranscriptionEvent(
            text="We ship on Friday.",
            speaker=label,
            sender_name=sender,
            start=0.0,
            end=3.0,
            words=(),
            participant_id="desk",
            session=session,
        )
        result = await self.renames.apply(value, HookContext(ROOM, "voice-diarized", self.kit))
        if result is not None and isinstance(result.value, TranscriptionEvent):
            final = result.value.sender_name
            if final and final != sender:
                self.sticky[label] = final
            return final
        return sender

    def hears(self, **voices: tuple[np.ndarray, float]) -> None:
        labels = {k.replace("_", " "): v for k, v in voices.items()}
        self.audio.prints = StagePrints(
            MODEL, {k: v[0] for k, v in labels.items()}, {k: v[1] for k, v in labels.items()}
        )

    def feed_messages(self, type_: str) -> list[dict[str, Any]]:
        return [m for m in map(json.loads, self.live.feed.history) if m["type"] == type_]


async def room_with(*people: tuple[str, np.ndarray], config: VoicesConfig | None = None) -> Room:
    store = InMemoryStore()
    for name, vector in people:
        await store.remember_print(name, MODEL, vector.astype("<f4").tobytes(), "clip")
    room = Room(RoomKit(store=store), store, config)
    await room.voices.load()
    return room


async def test_a_remembered_voice_names_its_turns_and_a_likely_one_is_suggested() -> None:
    room = await room_with(("Ian", IAN), ("Peggy", PEGGY))
    room.hears(Speaker_A=(near(IAN, 0.8), 1.0))
    assert await room.turn("Speaker A") == "Speaker A"  # not heard long enough yet
    room.hears(Speaker_A=(near(IAN, 0.8), 3.0), Speaker_B=(near(PEGGY, 0.5), 3.0))
    assert await room.turn("Speaker A") == "Ian"
    assert await room.turn("Speaker B") == "Speaker B"  # keeps its letter
    [suggestion] = room.feed_messages("speaker_suggestion")
    assert suggestion == {
        "type": "speaker_suggestion",
        "room": ROOM,
        "label": "Speaker B",
        "name": "Peggy",
        "source": "voice",
        "stream": "device-1",
        "voice": suggestion["voice"],
    }
    assert "vector" not in json.dumps(list(room.live.feed.history))


async def test_a_rename_wins_over_the_directory() -> None:
    room = await room_with(("Ian", IAN))
    room.hears(Speaker_A=(IAN, 3.0))
    room.renames.rename(ROOM, "Speaker A", "Ian Smith", stream_id="device-1")
    assert await room.turn("Speaker A") == "Ian Smith"


async def test_forgetting_a_voice_in_a_running_room_turns_its_next_turn_back_into_a_letter() -> (
    None
):
    room = await room_with(("Ian", IAN), ("Peggy", PEGGY))
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(PEGGY, 3.0))
    assert (await room.turn("Speaker A"), await room.turn("Speaker B")) == ("Ian", "Peggy")
    [ian] = [v for v in await room.voices.voices() if v.name == "Ian"]
    gone, unnamed = await room.voices.forget(ian.id)
    assert gone and [(label, name) for _, label, name in unnamed] == [("Speaker A", "Ian")]
    assert await room.turn("Speaker A") == "Speaker A"
    assert await room.turn("Speaker A") == "Speaker A"  # and stays a letter
    assert await room.turn("Speaker B") == "Peggy"
    assert [v.name for v in await room.voices.voices()] == ["Peggy"]
    # a voice that sounds like Ian now is never named Ian again, nor is a turn claimed for him
    # (`claim`, `claim_new`: only the directory's people can be claimed)
    room.hears(Speaker_C=(IAN, 5.0))
    assert await room.turn("Speaker C") == "Speaker C"
    room.audio.turn_print = IAN
    assert await room.turn("Speaker C") == "Speaker C"
    assert await room.turn("Speaker B") == "Speaker B"  # Ian's words in Peggy's voice


async def test_prints_of_another_model_are_never_compared() -> None:
    store = InMemoryStore()
    await store.remember_print("Ian", "another-model", IAN.astype("<f4").tobytes(), "clip")
    room = Room(RoomKit(store=store), store)
    await room.voices.load()
    room.hears(Speaker_A=(IAN, 5.0))
    assert await room.turn("Speaker A") == "Speaker A"


async def test_a_named_voices_turn_that_does_not_sound_like_the_person_reads_its_letter() -> None:
    """`[voices] verify`: a far-field voice can hold two people; a turn of the named voice whose
    own print is someone else's reads the voice's letter, the next turn that sounds like the
    person reads the name again, and a turn too short to print reads the letter too (it cannot
    show it is the person); a turn the stream's audio no longer holds is not checked."""
    room = await room_with(("Ian", IAN), ("Peggy", PEGGY))
    room.hears(Speaker_A=(near(IAN, 0.8), 3.0))
    room.audio.turn_print = near(IAN, 0.7)
    assert await room.turn("Speaker A") == "Ian"
    room.audio.turn_print = unit(0, 0, 1, 0)  # a stranger's words inside Ian's voice
    assert await room.turn("Speaker A") == "Speaker A"
    assert room.voices.turns_unmatched == 1
    room.audio.turn_print = near(IAN, 0.5)
    assert await room.turn("Speaker A") == "Ian"
    room.audio.short = True  # too short to print: the voice's letter
    assert await room.turn("Speaker A") == "Speaker A"
    assert room.voices.turns_unmatched == 2
    room.audio.short, room.audio.turn_print = False, None  # not held by the log: not checked
    assert await room.turn("Speaker A") == "Ian"
    assert room.voices.turns_unmatched == 2
    room.audio.turn_print = PEGGY  # Peggy's words inside Ian's voice: Peggy is named for no
    assert await room.turn("Speaker A") == "Peggy"  # voice here, her turn reads her ([voices] claim_new)


async def test_verify_minus_one_names_every_turn_of_a_named_voice() -> None:
    store = InMemoryStore()
    await store.remember_print("Ian", MODEL, IAN.astype("<f4").tobytes(), "clip")
    room = Room(RoomKit(store=store), store, VoicesConfig(enabled=True, verify=-1.0))
    await room.voices.load()
    room.hears(Speaker_A=(IAN, 3.0))
    room.audio.turn_print = -IAN
    assert await room.turn("Speaker A") == "Ian"
    assert room.voices.turns_unmatched == 0


async def test_a_turn_that_sounds_like_a_person_named_for_another_voice_reads_their_name() -> None:
    """`[voices] claim`: the stage split a person over two voices; a turn of the other voice (named
    or not) whose own print is theirs reads their name, and only that turn: the voice's next turn
    reads its own name or letter again. With `claim` alone (`claim_new = 2`), only people named
    in the stream are claimed."""
    room = await room_with(("Ian", IAN), ("Peggy", PEGGY), ("Omar", unit(0, 0, 0, 1)),
                           config=VoicesConfig(enabled=True, claim_new=2.0))
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(PEGGY, 3.0), Speaker_C=(unit(0, 0, 1, 0), 3.0))
    room.audio.turn_print = IAN
    assert await room.turn("Speaker A") == "Ian"
    assert await room.turn("Speaker B") == "Ian"  # Ian's words in Peggy's voice
    room.audio.turn_print = PEGGY
    assert await room.turn("Speaker B") == "Peggy"
    room.audio.turn_print = near(IAN, 0.9)
    assert await room.turn("Speaker C") == "Ian"  # a voice of its own for some of Ian's speech
    room.audio.short = True  # too short to print: its letter, not the claimed name
    assert await room.turn("Speaker C") == "Speaker C"
    room.audio.short = False
    room.audio.turn_print = unit(0, 0, 0, 1)  # Omar's words: Omar is named for no voice here
    assert await room.turn("Speaker C") == "Speaker C"
    assert (room.voices.turns_unmatched, room.voices.turns_claimed) == (1, 2)


async def test_with_claim_new_a_turn_reads_a_remembered_person_no_voice_is_named_for() -> None:
    """`[voices] claim_new`: the first turn of a voice not named yet (or a turn the stage gave to
    another person's voice) whose own print is a remembered person's reads their name, when no
    voice of the stream is named for them; the voice itself stays unnamed. `claim_new = 2`:
    never. A person only suggested for a voice is not claimed (the suggest tier keeps its
    letter until someone confirms)."""
    omar = unit(0, 0, 0, 1)
    room = await room_with(("Ian", IAN), ("Omar", omar),
                           config=VoicesConfig(enabled=True, claim_new=2.0))
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(unit(0, 0, 1, 0), 3.0))
    room.audio.turn_print = omar
    assert await room.turn("Speaker B") == "Speaker B"  # never
    room = await room_with(("Ian", IAN), ("Omar", omar),
                           config=VoicesConfig(enabled=True, claim_new=0.6))
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(unit(0, 0, 1, 0), 3.0))
    room.audio.turn_print = near(omar, 0.7)
    assert await room.turn("Speaker B") == "Omar"
    room.audio.turn_print = near(omar, 0.5)  # under claim_new
    assert await room.turn("Speaker B") == "Speaker B"
    room.audio.turn_print = near(IAN, 0.7)
    assert await room.turn("Speaker A") == "Ian"  # Ian is named here: his own voice's
    assert "Speaker B" not in room.voices.state_of(room.stream).named
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(near(omar, 0.5), 3.0))  # Omar suggested for B
    room.audio.turn_print = near(omar, 0.7)
    assert await room.turn("Speaker B") == "Speaker B"
    assert list(room.voices.state_of(room.stream).suggested) == ["Speaker B"]  # ...as the feed says


async def test_claim_two_never_claims() -> None:
    store = InMemoryStore()
    for name, vector in (("Ian", IAN), ("Peggy", PEGGY)):
        await store.remember_print(name, MODEL, vector.astype("<f4").tobytes(), "clip")
    room = Room(RoomKit(store=store), store, VoicesConfig(enabled=True, claim=2.0))
    await room.voices.load()
    room.hears(Speaker_A=(IAN, 3.0), Speaker_B=(PEGGY, 3.0))
    room.audio.turn_print = IAN
    assert await room.turn("Speaker A") == "Ian"
    assert await room.turn("Speaker B") == "Speaker B"
