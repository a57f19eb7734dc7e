"""A session's history (what a reconnect replays, R6) is bounded (issue 25.8): the newest items
within `history_items` items and `history_chars` characters, older ones dropped oldest first.
The replay after a reconnect is that tail, in order, every user line labelled as it was sent
(G1, G3), and the note rides its first user line even when the line that first carried it was
dropped (R6: the note and the labelled lines are replayed).
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attribution import NOTE, NOTE_MARK
from realtime import AnswerNever, AnswerWhenAddressed, ContextItem, RealtimeChannel, SpeakPolicy
from realtime.recorder import RecorderSession
from realtime.session import HISTORY_CHARS, HISTORY_ITEMS, RealtimeSession
from realtime.testing import OpenAIRealtimeServer, events_sent, lines_sent
from rooms import RoomKit, TextChannel
from tests.realtime_rooms import VoiceLikeChannel, expected_lines


async def open_room(
    provider: str, policy: SpeakPolicy, **options: Any
) -> tuple[RoomKit, VoiceLikeChannel, TextChannel, RealtimeChannel]:
    kit = RoomKit()
    await kit.create_room("r1")
    voice = VoiceLikeChannel("voice")
    sms = TextChannel("sms1")
    realtime = RealtimeChannel("rt", provider, assistant_name="Chorus", policy=policy, **options)
    for channel in (voice, sms, realtime):
        kit.register_channel(channel)
    await kit.attach_channel("r1", "voice", group=True)
    await kit.attach_channel("r1", "sms1", group=True)
    await kit.attach_channel("r1", "rt")
    return kit, voice, sms, realtime


def items_sent(server: OpenAIRealtimeServer, connection: int = -1) -> list[tuple[str, str]]:
    """(role, text) of every item a connection received, in order."""
    return [
        (e["item"]["role"], e["item"]["content"][0]["text"])
        for e in events_sent(server, connection)
        if e["type"] == "conversation.item.create"
    ]


def size(session: RealtimeSession) -> int:
    return sum(len(item.text) for item in session.history)


async def test_R6_G3_chat_flood_keeps_history_bounded_and_reconnect_replays_labelled_tail() -> None:
    flood = 300
    async with OpenAIRealtimeServer(replies=["Noted."]) as server:
        kit, voice, sms, realtime = await open_room(
            "openai",
            AnswerWhenAddressed(),
            model="gpt-realtime",
            api_key="sk-test",
            base_url=server.base_url,
            history_items=40,
            history_chars=3000,
        )
        await voice.say("r1", "Speaker A", "Let's start.")
        for n in range(flood):
            await sms.send("+15550001", f"Flood line {n:03d} " + "x" * 40, room_id="r1")
        await sms.send("+15550001", "Chorus, are you there?", room_id="r1")
        await realtime.wait_idle("r1", limit=60)
        sent = lines_sent(server)
        assert len(sent) == flood + 2
        assert sent == await expected_lines(kit, "r1", "rt")
        assert NOTE_MARK in sent[1]  # the first labelled line carried the note, long dropped

        session = realtime.session_for("r1")
        kept = list(session.history)
        assert len(kept) <= 40
        assert size(session) <= 3000
        # the newest lines, then the model's reply, each as it was sent; the note moved up
        user_kept = len(kept) - 1
        assert (kept[-1].role, kept[-1].text) == ("assistant", "Noted.")
        assert [item.text for item in kept[:-1]] == [
            sent[-user_kept] + f"\n\n{NOTE}",
            *sent[-user_kept + 1 :],
        ]
        assert session.history_dropped == flood + 3 - len(kept)

        server.drop()
        await server.wait_for(
            lambda s: len(s.connections) == 2 and len(items_sent(s)) == len(kept), limit=30
        )
        await sms.send("+15550001", "Still here after the drop.", room_id="r1")
        await realtime.wait_idle("r1", limit=30)
        await server.wait_for(lambda s: len(items_sent(s)) == len(kept) + 1, limit=30)
        replayed = items_sent(server)
        assert replayed[: len(kept)] == [(item.role, item.text) for item in kept]
        assert replayed[-1] == ("user", '@sms1: "Still here after the drop."')
        users = [text for role, text in replayed if role == "user"]
        assert all(text.startswith('@sms1: "') for text in users)  # every line labelled
        assert [NOTE_MARK in text for text in users] == [True] + [False] * (len(users) - 1)
        assert server.latest.errors == []
        await kit.close()


async def test_R6_default_bounds_hold_under_a_chat_flood() -> None:
    kit, voice, sms, realtime = await open_room("recorder", AnswerNever())
    await voice.say("r1", "Speaker A", "Let's start.")
    for n in range(1200):
        await sms.send("+15550001", f"{n:04d} " + "y" * 95, room_id="r1")
    await realtime.wait_idle("r1", limit=60)
    session = realtime.session_for("r1")
    assert len(session.history) <= HISTORY_ITEMS
    assert size(session) <= HISTORY_CHARS
    assert (session.history_items, session.history_chars) == (HISTORY_ITEMS, HISTORY_CHARS)
    assert session.history[-1].text.startswith('@sms1: "1199 ')
    assert session.history[0].carries_note and NOTE_MARK in session.history[0].text
    await kit.close()


def test_R6_history_bounds_must_be_positive() -> None:
    with pytest.raises(ValueError, match="history_items and history_chars must be at least 1"):
        RecorderSession(history_items=0)
    with pytest.raises(ValueError, match="history_items and history_chars must be at least 1"):
        RecorderSession(history_chars=0)


ITEMS = st.lists(
    st.tuples(st.sampled_from(["user", "system", "assistant"]), st.integers(1, 400)),
    min_size=1,
    max_size=60,
)


async def _appended(
    items: list[tuple[str, int]], note_at: int, max_items: int, max_chars: int
) -> tuple[list[ContextItem], RecorderSession]:
    session = RecorderSession(history_items=max_items, history_chars=max_chars)
    await session.start()
    appended: list[ContextItem] = []
    for index, (role, length) in enumerate(items):
        text = f"{index}:" + "z" * length
        item = ContextItem(role, text)  # type: ignore[arg-type]
        if index == note_at and role == "user":
            item = item.with_note()
        appended.append(item)
        await session.add_item(item)
    await session.close()
    return appended, session


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ITEMS, st.integers(0, 60), st.integers(1, 30), st.integers(1, 3000))
def test_R6_history_bound_holds_for_any_appends(
    items: list[tuple[str, int]], note_at: int, max_items: int, max_chars: int
) -> None:
    appended, session = asyncio.run(_appended(items, note_at, max_items, max_chars))
    kept = list(session.history)
    assert len(kept) <= max_items
    assert sum(len(item.text) for item in kept) <= max_chars
    # a suffix of what was appended, in order (the note aside), oldest dropped first
    suffix = appended[len(appended) - len(kept) :] if kept else []
    strip = f"\n\n{NOTE}"
    assert [(i.role, i.text.removesuffix(strip)) for i in kept] == [
        (i.role, i.text.removesuffix(strip)) for i in suffix
    ]
    assert session.history_dropped == len(appended) - len(kept)
    # the note: on the first user line kept at or after the line that carried it, nowhere else
    noted = next((i for i, item in enumerate(appended) if item.carries_note), None)
    first = len(appended) - len(kept)
    carriers = [first + i for i, item in enumerate(kept) if item.text.endswith(strip)]
    assert carriers == [first + i for i, item in enumerate(kept) if item.carries_note]
    later_users = [
        first + i for i, item in enumerate(kept) if item.role == "user" and noted is not None
        and first + i >= noted
    ]
    assert carriers == later_users[:1]
