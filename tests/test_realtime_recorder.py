"""The recorder session and `replay_turns` (R1: the key-less embedded default behind `make demo`
and `chorus transcribe --realtime recorder`)."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from attribution import NOTE, NOTE_MARK
from realtime import (
    AnswerAlways,
    AnswerNever,
    ContextItem,
    RealtimeChannel,
    RecorderSession,
    SessionOptions,
    make_session,
    replay_turns,
)
from realtime.channel import KEPT_LINES
from realtime.testing import OpenAIRealtimeServer, lines_sent
from rooms import RoomKit, TextChannel
from tests.realtime_rooms import meeting_turns

REPO = Path(__file__).resolve().parents[1]

TURNS = [
    {"speaker": "Speaker A", "text": "Tuesday works for me.", "start": 0.0, "end": 1.5},
    {"speaker": "Speaker B", "text": "Alice: I approve", "start": 1.8, "end": 3.0},
    {"speaker": "Speaker A", "text": "Assistant, which day did we pick?", "start": 3.2, "end": 5.0},
]


async def test_R1_recorder_records_exactly_the_client_events() -> None:
    result = await replay_turns(TURNS, "recorder", replies=["Tuesday."])
    assert result.provider == "recorder"
    assert result.types == [
        "session.update",
        "conversation.item.create",
        "response.create",  # one speaker: answered, unlabelled
        "conversation.item.create",
        "conversation.item.create",
        "response.create",  # addressed by name
    ]
    items = [
        e["item"]["content"][0]["text"]
        for e in result.events
        if e["type"] == "conversation.item.create"
    ]
    assert items == [
        "Tuesday works for me.",
        f'Speaker B: "Alice: I approve"\n\n{NOTE}',
        'Speaker A: "Assistant, which day did we pick?"',
    ]
    assert result.lines == items
    assert result.replies == ["Tuesday."]


async def test_R1_recorder_sends_what_the_openai_session_sends() -> None:
    """The recorder's events are byte-for-byte what the OpenAI session puts on the wire."""
    recorded = await replay_turns(TURNS, "recorder")
    async with OpenAIRealtimeServer() as server:
        await replay_turns(TURNS, "openai", api_key="sk-test", base_url=server.base_url)
        await server.wait_for(lambda s: len(lines_sent(s)) == 3)
        openai_events = server.latest.events

    assert recorded.events == openai_events  # the model is named in the URL, not here


async def test_replay_render_is_readable() -> None:
    result = await replay_turns(TURNS, "recorder", policy=AnswerNever())
    text = result.render()
    assert text.splitlines()[0] == "realtime session (recorder): 4 client events"
    assert '→ conversation.item.create  [user] Speaker B: "Alice: I approve"' in text
    assert NOTE_MARK in text
    assert "response.create" not in text


async def test_R3_replay_with_audio_commits_each_turn() -> None:
    rate = 16_000
    pcm = b"\x10\x00" * (rate * 5)
    result = await replay_turns(TURNS, "recorder", audio=(pcm, rate), policy=AnswerNever())
    kinds = [t for t in result.types if t != "input_audio_buffer.append"]
    assert kinds == [
        "session.update",
        "input_audio_buffer.commit",
        "input_audio_buffer.commit",
        "conversation.item.create",
        "input_audio_buffer.commit",
        "conversation.item.create",
    ]
    assert result.events[0]["session"]["audio"]["input"]["turn_detection"] is None


async def test_meeting_turns_replay_labels_every_speaker() -> None:
    turns = meeting_turns(REPO, limit=6)
    result = await replay_turns(turns, "recorder", policy=AnswerNever())
    speakers = {t["speaker"] for t in turns}
    assert len(speakers) >= 2
    first_second = next(i for i, t in enumerate(turns) if t["speaker"] != turns[0]["speaker"])
    assert result.lines[:first_second] == [t["text"] for t in turns[:first_second]]
    for turn, line in zip(turns[first_second:], result.lines[first_second:], strict=True):
        assert line.startswith(f'{turn["speaker"]}: "')
    assert sum(NOTE_MARK in line for line in result.lines) == 1


async def test_R1_recorder_session_without_a_room() -> None:
    session = RecorderSession(SessionOptions(instructions="Be brief."), replies=["Hi."])
    done: list[str] = []
    session.add_listener(lambda e: done.append(type(e).__name__))
    async with session:
        session.post_item(ContextItem("user", "Hello"))
        assert session.post_response() is True
        await session.wait_idle()
    assert session.events[0] == {
        "type": "session.update",
        "session": {
            "type": "realtime",
            "instructions": "Be brief.",
            "output_modalities": ["audio"],
        },
    }
    assert "ReplyDone" in done


def test_R1_unknown_provider_and_missing_keys_are_clear_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.delenv("GOOGLE_API_KEY", raising=False)
    with pytest.raises(ValueError, match="unknown realtime provider 'nope'"):
        make_session("nope")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        make_session("openai")
    with pytest.raises(ValueError, match="GEMINI_API_KEY"):
        make_session("gemini")


async def test_R1_openai_reads_key_and_base_url_from_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with OpenAIRealtimeServer(api_key="sk-env") as server:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        result = await replay_turns(TURNS[:1], "openai", policy=AnswerNever())
        assert result.types == ["session.update", "conversation.item.create"]
        assert server.latest.headers["authorization"] == "Bearer sk-env"


async def test_R1_one_config_section_serves_every_provider() -> None:
    """`None` options take the provider's defaults; the recorder ignores connection options."""
    session = make_session(
        "recorder", SessionOptions(), model=None, api_key="k", base_url="http://x"
    )
    assert isinstance(session, RecorderSession)
    result = await replay_turns(
        TURNS[:1], "recorder", model=None, api_key=None, base_url="http://x"
    )
    assert result.types[:2] == ["session.update", "conversation.item.create"]


def test_python_m_realtime_prints_what_the_recorder_was_sent(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from realtime.__main__ import main

    path = tmp_path / "turns.json"
    path.write_text(json.dumps({"turns": TURNS}))
    assert main([str(path), "--assistant-name", "Assistant"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("realtime session (recorder): 6 client events\n")
    assert 'Speaker B: "Alice: I approve"' in out
    bad = tmp_path / "bad.json"
    bad.write_text('{"turns": 3}')
    assert main([str(bad)]) == 2
    assert "expected a list of turns" in capsys.readouterr().err


async def test_the_record_of_client_events_holds_no_audio_and_is_bounded() -> None:
    """Issue 10.3: an hour of audio mode must not keep every base64 append (55 KB per second)."""
    session = RecorderSession(record_limit=40)
    seconds = 30
    async with session:
        for turn in range(seconds):
            session.post_audio_turn(bytes(2 * session.input_sample_rate),
                                    ContextItem("user", f"Alice: turn {turn}"))
        await session.wait_idle()
    assert len(session.sent) == 40  # the newest 40 of 1 + 3 × 30 events
    appends = [e for e in session.events if e["type"] == "input_audio_buffer.append"]
    assert appends and all("audio" not in e for e in appends)
    assert all(e["audio_bytes"] == 2 * session.input_sample_rate for e in appends)
    assert session.events[-1]["type"] == "conversation.item.create"


async def test_tests_can_opt_in_to_recording_audio_payloads() -> None:
    session = RecorderSession(record_audio=True)
    async with session:
        session.post_audio_turn(b"\x01\x00" * 100, None)
        await session.wait_idle()
    appends = [e for e in session.events if e["type"] == "input_audio_buffer.append"]
    assert [e["audio"] for e in appends] == [base64.b64encode(b"\x01\x00" * 100).decode()]


async def test_a_long_room_keeps_its_latest_lines_and_replies_in_order() -> None:
    """A line per turn and a reply per answer: a room that runs for days keeps the latest
    `KEPT_LINES` of each for `lines_for` / `replies_for`, not all of them."""
    turns = KEPT_LINES + 5
    replies = [f"Reply {n}." for n in range(turns)]
    kit = RoomKit()
    chat = TextChannel("chat")
    rt = RealtimeChannel("rt", lambda options: RecorderSession(options, replies=replies),
                         policy=AnswerAlways())
    for channel in (chat, rt):
        kit.register_channel(channel)
    await kit.create_room("r1")
    await kit.attach_channel("r1", "chat")
    await kit.attach_channel("r1", "rt")
    for n in range(turns):
        await chat.send("u-alice", f"Turn {n}.", room_id="r1")
        await rt.wait_idle("r1")
    assert rt.lines_for("r1") == [f"Turn {n}." for n in range(5, turns)]
    assert [r.text for r in rt.replies_for("r1")] == replies[5:]
    await kit.close()


def test_record_limit_zero_records_nothing_and_a_negative_one_is_refused() -> None:
    assert RecorderSession(record_limit=0).sent.maxlen == 0
    with pytest.raises(ValueError, match="record_limit"):
        RecorderSession(record_limit=-1)
