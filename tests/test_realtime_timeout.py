"""A response that never finishes is given up (R4: one response at a time, but never stuck).

The real `openai` client against the local GA-protocol server told to hang responses
(`response.created`, then never a `response.done`), and `google-genai` against the local Gemini
server told to hang a turn. Timeouts are short here (fractions of a second); the default is 60 s.
Only the hung responses are meant to time out: once a hung one's clock runs, the test lifts the
timeout for the requests after it (`lift_timeout`), since a loaded machine may take longer than a
fraction of a second to answer a healthy request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import replace

import pytest

from realtime import (
    AnswerWhenAddressed,
    GeminiLiveSessionFactory,
    RealtimeChannel,
    SessionOptions,
)
from realtime.channel import heard_text
from realtime.openai_wire import ACTIVE_RESPONSE_CODE
from realtime.session import RealtimeSession, ReplyDone, SessionEvent
from realtime.testing import OpenAIRealtimeServer, events_sent, types_sent
from realtime.testing.gemini_server import GeminiLiveServer
from rooms import RoomKit
from server.testing.harness import eventually
from tests.realtime_rooms import (
    RecordingAudioSink,
    VoiceLikeChannel,
    expected_lines,
    open_voice_room,
)


async def open_room(
    channel: RealtimeChannel,
) -> tuple[RoomKit, VoiceLikeChannel, RealtimeChannel]:
    kit, voice = await open_voice_room(channel)
    return kit, voice, channel


def openai_channel(server: OpenAIRealtimeServer, response_timeout: float | None) -> RealtimeChannel:
    return RealtimeChannel(
        "rt",
        "openai",
        assistant_name="Chorus",
        policy=AnswerWhenAddressed(),
        model="gpt-realtime",
        api_key="sk-test",
        base_url=server.base_url,
        response_timeout=response_timeout,
    )


def lift_timeout(session: RealtimeSession, seconds: float | None = None) -> None:
    """Requests written from now on get `seconds` (None: no timeout); a running clock keeps its."""
    session.options = replace(session.options, response_timeout=seconds)


async def until(predicate: Callable[[], bool], limit: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.01)


async def replies(kit: RoomKit) -> list[str]:
    return [e.text for e in await kit.list_events("r1") if e.source.channel_id == "rt"]


def error_codes(server: OpenAIRealtimeServer) -> list[str | None]:
    return [e["code"] for log in server.connections for e in log.errors]


async def test_R4_hung_response_times_out_is_cancelled_and_next_turn_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="realtime.session")
    async with OpenAIRealtimeServer() as server:
        server.hang_responses(1)
        kit, voice, rt = await open_room(openai_channel(server, 0.3))
        session = rt.session_for("r1")
        await voice.say("r1", "Speaker A", "Chorus, what time is it?")
        await server.wait_for(lambda s: len(s.hung) == 1)
        assert session.response_in_flight
        lift_timeout(session)  # the hung request's clock runs; the next one answers in its time
        # Given up after the timeout: cancelled on the wire, slot free.
        await server.wait_for(lambda s: len(s.cancelled) == 1, limit=30)
        await until(lambda: not session.response_in_flight)
        cancel = [e for e in events_sent(server) if e["type"] == "response.cancel"]
        assert cancel == [{"type": "response.cancel", "response_id": server.hung[0]}]
        warnings = [r for r in caplog.records if "did not finish within" in r.getMessage()]
        assert len(warnings) == 1 and server.hung[0] in warnings[0].getMessage()

        await voice.say("r1", "Speaker A", "Chorus, are you there?")
        await rt.wait_idle("r1")
        assert types_sent(server) == [
            "session.update",
            "conversation.item.create",
            "response.create",
            "response.cancel",
            "conversation.item.create",
            "response.create",
        ]
        assert error_codes(server) == []  # never conversation_already_has_active_response
        assert await replies(kit) == ["Reply 1"]  # the cancelled response posted nothing
        assert len(server.connections) == 1  # a cancel, not a reconnect
        await kit.close()


HELD_BEHIND_A_CANCEL = [
    "session.update",
    "conversation.item.create",
    "response.create",
    "conversation.item.create",  # the second question, its response held
    "response.cancel",
    "response.create",  # the held one, once the cancelled response is done
]


async def test_R4_request_held_behind_hung_response_goes_out_after_the_cancel() -> None:
    async with OpenAIRealtimeServer() as server:
        server.hang_responses(1)
        kit, voice, rt = await open_room(openai_channel(server, 0.3))
        await voice.say("r1", "Speaker A", "Chorus, first question?")
        await server.wait_for(lambda s: len(s.hung) == 1)
        lift_timeout(rt.session_for("r1"))  # for the held request, once it goes out
        await voice.say("r1", "Speaker A", "Chorus, second question?")  # held: one in flight
        await rt.wait_idle("r1")
        assert types_sent(server) == HELD_BEHIND_A_CANCEL
        assert error_codes(server) == []
        assert ACTIVE_RESPONSE_CODE not in error_codes(server)
        assert await replies(kit) == ["Reply 1"]
        await kit.close()


async def test_R4_an_interrupt_cancels_the_response_in_flight_and_keeps_the_held_request() -> None:
    """`RealtimeChannel.interrupt` (a phone caller talked over the reply): the response in
    flight is cancelled on the wire; a request held behind it still goes out after the cancel
    (unlike `cancel_response`); with nothing in flight it sends nothing."""
    async with OpenAIRealtimeServer() as server:
        server.hang_responses(1)
        kit, voice, rt = await open_room(openai_channel(server, None))
        assert await rt.interrupt("r1") is False  # nothing in flight: nothing to cancel
        await voice.say("r1", "Speaker A", "Chorus, first question?")
        await server.wait_for(lambda s: len(s.hung) == 1)
        await voice.say("r1", "Speaker A", "Chorus, second question?")  # held: one in flight
        assert await rt.interrupt("r1") is True
        await rt.wait_idle("r1")
        assert server.cancelled == server.hung
        assert types_sent(server) == HELD_BEHIND_A_CANCEL
        assert error_codes(server) == []
        assert await replies(kit) == ["Reply 1"]
        await kit.close()


async def open_room_with_speaker(
    server: OpenAIRealtimeServer,
) -> tuple[RoomKit, VoiceLikeChannel, RealtimeChannel, RecordingAudioSink]:
    """`open_room` on the server, with a loudspeaker (an `AudioSink`) in the room."""
    kit, voice, rt = await open_room(openai_channel(server, None))
    speaker = RecordingAudioSink("speaker")
    kit.register_channel(speaker)
    await kit.attach_channel("r1", "speaker")
    return kit, voice, rt, speaker


async def test_R4_an_interrupt_cuts_the_reply_playing_to_what_was_heard() -> None:
    """A reply whose audio is all made but still playing (30 s handed to the room's loudspeaker
    just now) is talked over: nothing is in flight to cancel, so the model is told to cut that
    reply's item at what the room heard of it (`conversation.item.truncate`, under 30 s, the
    service answering `conversation.item.truncated`); a second interrupt has nothing to cut."""
    async with OpenAIRealtimeServer(reply_audio_seconds=30.0) as server:
        kit, voice, rt, speaker = await open_room_with_speaker(server)
        await voice.say("r1", "Speaker A", "Chorus, a long story please?")
        await rt.wait_idle("r1")  # the reply is made, and posted
        assert sum(len(pcm) for _, pcm, _ in speaker.played) == 30 * 24000 * 2
        assert await rt.interrupt("r1") is True
        assert await rt.interrupt("r1") is False
        await rt.wait_idle("r1")
        await server.wait_for(lambda s: len(s.truncated) == 1)
        ((item_id, heard_ms),) = server.truncated
        assert item_id.startswith("item") and 0 <= heard_ms < 30_000
        assert server.cancelled == [] and error_codes(server) == []
        (truncate,) = [e for e in events_sent(server) if e["type"] == "conversation.item.truncate"]
        assert truncate["audio_end_ms"] == heard_ms and truncate["item_id"] == item_id
        # the room's record of it, posted whole, now says what the room heard of it
        [reply] = [e for e in await kit.list_events("r1") if e.source.channel_id == "rt"]
        assert reply.text == heard_text("Reply 1", heard_ms / 30_000) == "Reply…"
        assert reply.metadata["interrupted"] is True and reply.metadata["heard_ms"] == heard_ms
        assert [e.text for e in rt.replies_for("r1")] == ["Reply…"]
        await kit.close()


async def test_R4_the_rest_of_a_reply_talked_over_is_never_played() -> None:
    """A 20 s reply still streaming (at four times real time) is talked over: from `stop_reply`
    on, none of its audio reaches the room's loudspeaker, though the service sends more (here
    a quarter second of it, as a provider does before it hears the cancel, or one that cannot
    be told to stop); the reply is posted as interrupted; the next reply plays."""
    async with OpenAIRealtimeServer(replies=["A long story.", "Briefly."],
                                    reply_audio_seconds=20.0, audio_pace=4.0) as server:  # fmt: skip
        kit, voice, rt, speaker = await open_room_with_speaker(server)
        await voice.say("r1", "Speaker A", "Chorus, a long story please?")
        await eventually(lambda: len(speaker.played) >= 2, 60, "some of the reply")
        assert rt.stop_reply("r1") is True
        played = len(speaker.played)
        log = server.connections[-1]
        more = log.reply_audio_bytes + 5 * 2400  # five more 50 ms pieces sent
        await eventually(lambda: log.reply_audio_bytes >= more, 60, "more of the reply")
        assert await rt.interrupt("r1") is True
        await rt.wait_idle("r1")
        assert len(speaker.played) == played
        [(said, reply)] = [(e.text, e.metadata) for e in await kit.list_events("r1")
                           if e.source.channel_id == "rt"]  # fmt: skip
        assert reply["interrupted"] is True and reply["response_status"] == "cancelled"
        assert said == "A" and 0 < reply["heard_ms"] < 20_000  # posted as the room heard it
        assert len(server.truncated) == 1 and error_codes(server) == []
        assert rt.stop_reply("r1") is False  # nothing is still coming
        await voice.say("r1", "Speaker A", "Chorus, briefly?")
        await rt.wait_idle("r1")
        assert len(speaker.played) > played
        assert (await kit.list_events("r1"))[-1].metadata["interrupted"] is False
        await kit.close()


@pytest.mark.parametrize("when", ["posted, then talked over", "talked over as it streams"])
async def test_R6_a_reconnect_replays_a_reply_talked_over_as_the_room_heard_it(when: str) -> None:
    """A reply cut by a barge-in is cut in the model's context (`truncate_reply`) and in the
    room's record; the history a reconnect replays (R6) says the same, so a fresh connection does
    not take the unheard rest as said. Both ways a reply is cut: after it was posted (all its
    audio made, still playing) and before (its `response.done` comes after the cut)."""
    streaming = when == "talked over as it streams"
    async with OpenAIRealtimeServer(
        replies=["A long story, told at great length.", "Yes."],
        reply_audio_seconds=20.0 if streaming else 30.0, audio_pace=4.0 if streaming else 0.0,
    ) as server:  # fmt: skip
        kit, voice, rt, speaker = await open_room_with_speaker(server)
        await voice.say("r1", "Speaker A", "Chorus, a long story please?")
        if streaming:
            await eventually(lambda: len(speaker.played) >= 2, 60, "some of the reply")
        else:
            await rt.wait_idle("r1")
        assert await rt.interrupt("r1") is True
        await rt.wait_idle("r1")
        [heard] = [e.text for e in await kit.list_events("r1") if e.source.channel_id == "rt"]
        whole = "A long story, told at great length."
        assert heard != whole and whole.startswith(heard.rstrip("…"))
        server.drop()
        await voice.say("r1", "Speaker A", "Chorus, is that all?")
        await rt.wait_idle("r1")
        assert len(server.connections) == 2
        replayed = [e["item"] for e in events_sent(server, 1)
                    if e["type"] == "conversation.item.create"]  # fmt: skip
        said = [part["text"] for item in replayed if item["role"] == "assistant"
                for part in item["content"]]  # fmt: skip
        assert said == [heard]
        assert (await replies(kit))[-1] == "Yes."
        await kit.close()


async def test_R5_each_reply_names_the_line_it_answers_and_its_time_to_first_audio() -> None:
    """A reply is posted with the line that asked for it (`asked_by`) and the time from that
    line to the reply's first audio (`first_audio_ms`; the stand-in waits 0.2 s before each
    response): the server's reply latency adds the asking turn's own. A line asking while the
    answer to another is on its way shares that answer (the reply after it names none); a
    response that times out with no audio answers its line with nothing, so the next reply is
    timed from its own line, not from that one."""
    async with OpenAIRealtimeServer(replies=["One.", "Two.", "Four."],
                                    response_delay=0.2) as server:  # fmt: skip
        kit, voice, rt = await open_room(openai_channel(server, None))
        await voice.say("r1", "Speaker A", "Chorus, one?")
        await voice.say("r1", "Speaker B", "Chorus, two?")  # held behind the first (R4)
        await rt.wait_idle("r1")
        server.hang_responses(1)
        lift_timeout(rt.session_for("r1"), 0.3)
        await voice.say("r1", "Speaker A", "Chorus, three?")  # times out, no audio
        await rt.wait_idle("r1")
        lift_timeout(rt.session_for("r1"))
        await voice.say("r1", "Speaker B", "Chorus, four?")
        await rt.wait_idle("r1")
        asks = {e.text: e.id for e in await kit.list_events("r1") if e.source.channel_id == "voice"}
        posted = [(e.text, e.metadata.get("asked_by"), e.metadata.get("first_audio_ms"))
                  for e in await kit.list_events("r1") if e.source.channel_id == "rt"]  # fmt: skip
        assert [(text, asked) for text, asked, _ in posted] == [
            ("One.", asks["Chorus, one?"]), ("Two.", None), ("Four.", asks["Chorus, four?"]),
        ]  # fmt: skip
        assert all(ms is None or 200 <= ms < 60_000 for _, _, ms in posted)
        await kit.close()


async def test_R4_an_interrupt_after_the_reply_has_played_cuts_nothing() -> None:
    """A 0.2 s reply that has had time to play whole is not cut: an interrupt then sends
    nothing (a truncate at or past its end would be refused by the service)."""
    async with OpenAIRealtimeServer(reply_audio_seconds=0.2) as server:
        kit, voice, rt, speaker = await open_room_with_speaker(server)
        await voice.say("r1", "Speaker A", "Chorus, briefly?")
        await rt.wait_idle("r1")
        assert speaker.played
        await asyncio.sleep(0.3)  # time only makes "played whole" truer: not a race
        assert await rt.interrupt("r1") is False
        await rt.wait_idle("r1")
        assert server.truncated == [] and server.cancelled == []
        await kit.close()


async def test_R5_how_far_the_room_has_heard_a_reply_and_the_one_queued_behind_it() -> None:
    """`speaking`: the reply playing, its words heard so far (a prefix of it, never final while
    it plays). A second reply made while the first still plays is queued behind it: the room is
    still hearing the first, and hears the second from where the first ends."""
    async with OpenAIRealtimeServer(replies=["The first reply is here.", "The second one."],
                                    reply_audio_seconds=4.0) as server:  # fmt: skip
        kit, voice, rt, _ = await open_room_with_speaker(server)
        assert rt.speaking("r1") is None
        await voice.say("r1", "Speaker A", "Chorus, one?")
        await rt.wait_idle("r1")  # made and posted, at once; it plays for 4 s
        first = rt.speaking("r1")
        assert first is not None and not first.whole
        assert "The first reply is here.".startswith(first.text)
        await voice.say("r1", "Speaker A", "Chorus, two?")
        await rt.wait_idle("r1")  # the second is made too, behind the first
        now = rt.speaking("r1")
        assert now is not None and now.response_id == first.response_id and not now.whole
        await eventually(lambda: (s := rt.speaking("r1")) is not None
                         and s.response_id != first.response_id, 30, "the second reply")
        second = rt.speaking("r1")
        assert second is not None and "The second one.".startswith(second.text)
        await eventually(lambda: (s := rt.speaking("r1")) is not None and s.whole, 30, "all heard")
        assert rt.speaking("r1") == replace(second, text="The second one.", whole=True)
        assert await rt.interrupt("r1") is False  # played whole: nothing to cut
        assert rt.speaking("r1") is None
        await kit.close()


async def test_R5_a_reply_with_audio_and_no_words_is_heard_to_its_end() -> None:
    """A reply whose audio came with no transcript is posted nowhere (R5: nothing to say), but
    the room hears it to its end all the same (`speaking` says so once it has played), so no
    caption waits on it for ever."""
    async with OpenAIRealtimeServer(replies=[""], reply_audio_seconds=0.5) as server:
        kit, voice, rt, speaker = await open_room_with_speaker(server)
        await voice.say("r1", "Speaker A", "Chorus, hum?")
        await rt.wait_idle("r1")
        assert speaker.played and rt.replies_for("r1") == []
        await eventually(lambda: (s := rt.speaking("r1")) is not None and s.whole, 30, "heard")
        await kit.close()


async def test_R4_late_done_of_cancelled_response_does_not_free_the_newer_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="realtime.session")
    # The cancelled response's response.done arrives 1 s after the cancel, while the next
    # response (also hung) is in flight: that one's clock runs 5 s, so it is still in flight
    # when the late done comes, on a loaded machine too.
    async with OpenAIRealtimeServer(cancel_done_delay=1.0) as server:
        server.hang_responses(2)
        kit, voice, rt = await open_room(openai_channel(server, 0.3))
        session = rt.session_for("r1")
        await voice.say("r1", "Speaker A", "Chorus, first?")
        await server.wait_for(lambda s: len(s.cancelled) == 1, limit=30)
        lift_timeout(session, 5.0)
        await voice.say("r1", "Speaker A", "Chorus, second?")
        await server.wait_for(lambda s: len(s.hung) == 2)
        assert session.active_request == 2

        delivered: list[SessionEvent] = []
        session.add_listener(delivered.append)

        def late_dones_dropped() -> int:
            return sum("late cancelled done" in r.getMessage() for r in caplog.records)

        def first_late_done_handled() -> bool:  # dropped (right) or delivered (wrong)
            return late_dones_dropped() == 1 or any(
                isinstance(e, ReplyDone) and e.response_id == server.hung[0] for e in delivered
            )

        await until(first_late_done_handled, limit=30)
        assert server.cancelled == [server.hung[0]]  # the second has not timed out yet
        assert session.response_in_flight and session.active_request == 2
        assert all(getattr(e, "response_id", None) != server.hung[0] for e in delivered)
        # Had the late done freed the slot, this turn's response.create would go out now and
        # the server would refuse it with conversation_already_has_active_response.
        lift_timeout(session)  # the third is answered in its own time
        await voice.say("r1", "Speaker A", "Chorus, third?")
        await rt.wait_idle("r1")
        assert types_sent(server) == [
            "session.update",
            "conversation.item.create",
            "response.create",
            "response.cancel",
            "conversation.item.create",
            "response.create",
            "conversation.item.create",
            "response.cancel",
            "response.create",
        ]
        assert error_codes(server) == []
        assert server.cancelled == server.hung
        assert await replies(kit) == ["Reply 1"]  # once, for the third turn only
        await until(lambda: late_dones_dropped() == 2)  # the second's late done, after Reply 1
        assert not session.response_in_flight
        assert await replies(kit) == ["Reply 1"]
        await kit.close()


async def test_R4_no_timeout_when_disabled() -> None:
    async with OpenAIRealtimeServer() as server:
        server.hang_responses(1)
        kit, voice, rt = await open_room(openai_channel(server, None))
        session = rt.session_for("r1")
        assert session.options.response_timeout is None
        await voice.say("r1", "Speaker A", "Chorus, hello?")
        await server.wait_for(lambda s: len(s.hung) == 1)
        await asyncio.sleep(0.4)
        assert session.response_in_flight
        assert "response.cancel" not in types_sent(server)
        await kit.close()


def test_R4_response_timeout_defaults_to_60_s_and_must_be_positive() -> None:
    assert SessionOptions().response_timeout == 60.0
    assert RealtimeChannel("rt").options.response_timeout == 60.0
    for bad in (0, -1.0):
        with pytest.raises(ValueError, match="response_timeout"):
            SessionOptions(response_timeout=bad)


async def test_R4_local_server_cancel_answers_like_the_service() -> None:
    """`response.cancel` → `response.done` with status `cancelled` (reason `client_cancelled`),
    read through the SDK's own event types; nothing active → `response_cancel_not_active`."""
    from openai import AsyncOpenAI

    async with OpenAIRealtimeServer() as server:
        server.hang_responses(1)
        client = AsyncOpenAI(api_key="sk-test", base_url=server.base_url)
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await conn.response.create()
            seen: list[str] = []
            async for event in conn:
                seen.append(event.type)
                if event.type == "response.created":
                    await conn.response.cancel(response_id=event.response.id or "")
                elif event.type == "response.done":
                    assert event.response.status == "cancelled"
                    assert event.response.status_details is not None
                    assert event.response.status_details.reason == "client_cancelled"
                    assert event.response.id == server.hung[0]
                    await conn.response.cancel()
                elif event.type == "error":
                    assert event.error.code == "response_cancel_not_active"
                    break
            assert seen == ["session.created", "response.created", "response.done", "error"]


async def test_R4_gemini_hung_turn_times_out_reopens_and_next_turn_is_answered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="realtime.session")
    async with GeminiLiveServer(replies=["Here."]) as server:
        server.hang_turns(1)
        channel = RealtimeChannel(
            "rt",
            GeminiLiveSessionFactory(
                api_key="gm-test", base_url=server.base_url, ssl=server.client_ssl
            ),
            assistant_name="Chorus",
            policy=AnswerWhenAddressed(),
            response_timeout=0.3,
        )
        kit, voice, rt = await open_room(channel)
        session = rt.session_for("r1")
        await voice.say("r1", "Speaker A", "Chorus, first?")
        await until(lambda: server.hung == 1)
        lift_timeout(session)  # the second turn is answered in its own time
        # No cancel in Gemini's protocol: the session reopens, replaying what the model had.
        await until(lambda: len(server.connections) == 2 and not session.response_in_flight)
        assert any("did not finish within" in r.getMessage() for r in caplog.records)
        await voice.say("r1", "Speaker A", "Chorus, second?")
        await rt.wait_idle("r1")
        assert server.latest.lines == await expected_lines(kit, "r1", "rt")
        assert server.latest.kinds == [
            "setup",
            "client_content",  # replayed
            "client_content",
            "client_content:turn_complete",
        ]
        assert await replies(kit) == ["Here."]
        await kit.close()
