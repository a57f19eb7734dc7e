"""A meeting outlives a provider's connection (R6): OpenAI ends a session at its `expires_at`
(60 minutes), Gemini each connection after about ten (`goAway` first). The session renews the
connection ahead of that, at a moment no reply is in flight, so the provider's end never cuts a
reply off and makes the model say it again; the fresh connection holds the history, replayed.

The real `openai` and `google-genai` clients against the local servers, which end sessions the way
the services do, in seconds instead of minutes. The renewal margins are chosen so that the
renewal falls due while the reply is still playing: it must wait for the reply's end.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from realtime import (
    AnswerWhenAddressed,
    GeminiLiveSessionFactory,
    RealtimeChannel,
    SessionOptions,
)
from realtime.gemini_session import duration_seconds
from realtime.openai_session import OpenAIRealtimeSession
from realtime.session import RENEW_BEFORE_S, RealtimeSession
from realtime.testing import OpenAIRealtimeServer, events_sent
from realtime.testing.gemini_server import GeminiLiveServer
from rooms import RoomKit
from server.testing.harness import eventually
from tests.realtime_rooms import RecordingAudioSink, open_voice_room


def openai_channel(server: OpenAIRealtimeServer, renew_before_s: float | None) -> RealtimeChannel:
    def session(options: SessionOptions) -> RealtimeSession:
        return OpenAIRealtimeSession(options, model="gpt-realtime", api_key="sk-test",
                                     base_url=server.base_url, renew_before_s=renew_before_s)  # fmt: skip

    return RealtimeChannel("rt", session, assistant_name="Chorus", policy=AnswerWhenAddressed(),
                           response_timeout=None)  # fmt: skip


async def replies(kit: RoomKit) -> list[str]:
    return [e.text for e in await kit.list_events("r1") if e.source.channel_id == "rt"]


def items(server: OpenAIRealtimeServer, connection: int) -> list[tuple[str, str]]:
    return [(e["item"]["role"], e["item"]["content"][0]["text"])
            for e in events_sent(server, connection)
            if e["type"] == "conversation.item.create"]  # fmt: skip


def requests(server: OpenAIRealtimeServer) -> int:
    return sum(e["type"] == "response.create" for log in server.connections for e in log.events)


@pytest.mark.parametrize("pace", [1.0, 0.0], ids=["made as it plays", "made at once"])
async def test_R6_openai_renews_the_session_before_it_expires_and_never_mid_reply(
    pace: float,
) -> None:
    """`session.created` says the session expires in 4–5 s (`expires_at`, whole seconds); the
    session renews 3 s ahead, at 1–2 s, but a 2.5 s reply asked for at once is still playing
    then: the renewal waits for the room to have heard it, its `response.done` (made as it
    plays) or the end of its audio at real time (made at once: a truncate at a barge-in must
    reach the connection that made it). The reply arrives whole, once; the fresh connection holds
    the line and the reply, and answers the next line; the service never had to end a session (no
    `session_expired`)."""
    async with OpenAIRealtimeServer(
        replies=["A reply that takes its time.", "Yes."], session_seconds=4.0,
        reply_audio_seconds=2.5, audio_pace=pace,
    ) as server:  # fmt: skip
        rt = openai_channel(server, renew_before_s=3.0)
        kit, voice = await open_voice_room(rt)
        speaker = RecordingAudioSink("speaker")
        kit.register_channel(speaker)
        await kit.attach_channel("r1", "speaker")
        await voice.say("r1", "Speaker A", "Chorus, tell me something?")
        replayed = [("user", "Chorus, tell me something?"),  # one speaker: unlabelled (A1)
                    ("assistant", "A reply that takes its time.")]  # fmt: skip
        await eventually(lambda: len(server.connections) >= 2 and items(server, 1) == replayed,
                         30, "a renewed connection, the history replayed")  # fmt: skip
        first, second = server.connections[:2]
        assert len(first.done_at) == 1 and second.opened >= first.done_at[0]
        if pace == 0.0:  # done at once, heard 2.5 s later
            assert second.opened >= first.done_at[0] + 2.4
        assert first.reply_audio_bytes == int(2.5 * 24_000) * 2  # all of it, on the first
        await voice.say("r1", "Speaker A", "Chorus, is that all?")
        await rt.wait_idle("r1")
        assert await replies(kit) == ["A reply that takes its time.", "Yes."]
        assert requests(server) == 2  # never asked again for a reply cut off
        # past the moment the first session would have expired: the server ended none
        await asyncio.sleep(max(0.0, first.session["expires_at"] - time.time()) + 0.3)
        assert server.expired == []
        assert rt.session_for("r1").renewals >= 1
        counts = rt.session_counts()  # (`/metrics`: chorus_realtime_*)
        assert counts.renewals >= 1 and counts.reconnects >= 1 and counts.refusals == 0
        await kit.close()
        kept = rt.session_counts()  # the room's session gone, its counts kept
        assert kept.renewals >= counts.renewals and kept.reconnects >= counts.reconnects


async def test_R6_a_session_the_service_ends_is_reopened_with_the_history() -> None:
    """Renewal off (`renew_before_s=None`): the service ends the session at `expires_at` (an
    `error` `session_expired`, then close 1001), and the session reconnects as after any drop,
    the history replayed, the next line answered."""
    async with OpenAIRealtimeServer(replies=["Sure.", "Yes."], session_seconds=1.0) as server:
        kit, voice = await open_voice_room(rt := openai_channel(server, renew_before_s=None))
        await voice.say("r1", "Speaker A", "Chorus, ready?")
        await rt.wait_idle("r1")
        await server.wait_for(lambda s: s.expired == [0] and len(s.connections) == 2, 30)
        assert server.connections[0].errors[-1]["code"] == "session_expired"
        replayed = [("user", "Chorus, ready?"), ("assistant", "Sure.")]
        await eventually(lambda: items(server, 1) == replayed, 30, "the history replayed")
        await voice.say("r1", "Speaker A", "Chorus, still there?")
        await rt.wait_idle("r1")
        assert await replies(kit) == ["Sure.", "Yes."]
        assert rt.session_for("r1").renewals == 0
        await kit.close()


async def test_R6_gemini_renews_a_connection_at_go_away_once_the_reply_is_done() -> None:
    """Each Gemini connection lasts 3.5 s, with `goAway` 3 s before its end: it comes while a
    reply (its `turnComplete` 1.5 s late) is in progress; the session renews the connection
    when that reply is done, long before the server would close it, and never asks again."""
    async with GeminiLiveServer(replies=["Thursday.", "Noted."], reply_delay=1.5,
                                connection_seconds=3.5, go_away_notice_s=3.0) as server:  # fmt: skip
        rt = RealtimeChannel(
            "rt", GeminiLiveSessionFactory(api_key="gm-test", base_url=server.base_url,
                                           ssl=server.client_ssl),
            assistant_name="Chorus", policy=AnswerWhenAddressed(), response_timeout=None,
        )  # fmt: skip
        kit, voice = await open_voice_room(rt)
        await voice.say("r1", "Speaker A", "Chorus, which day?")
        await rt.wait_idle("r1")
        assert await replies(kit) == ["Thursday."]
        await eventually(lambda: len(server.connections) >= 2
                         and server.connections[1].lines == ["Chorus, which day?"],
                         30, "a renewed connection, the history replayed")  # fmt: skip
        await voice.say("r1", "Speaker A", "Chorus, noted?")
        await rt.wait_idle("r1")
        assert await replies(kit) == ["Thursday.", "Noted."]
        turns = sum(k == "client_content:turn_complete"
                    for log in server.connections for k in log.kinds)  # fmt: skip
        assert turns == 2  # each reply asked for once
        assert server.forced == [] and rt.session_for("r1").renewals >= 1
        await kit.close()


def test_R6_renewal_margin_and_notice_parsing() -> None:
    assert RENEW_BEFORE_S == 120.0
    with pytest.raises(ValueError, match="renew_before_s"):
        OpenAIRealtimeSession(api_key="sk-test", renew_before_s=-1.0)
    assert [duration_seconds(v) for v in ("49s", "0.5s", "", None, "soon", "-3s")] == [
        49.0, 0.5, 0.0, 0.0, 0.0, 0.0,
    ]  # fmt: skip
