"""The room hears when its realtime model is away and when it is back (`assistant_status`,
`ON_AGENT_STATUS`), over real sockets: `chorus serve` with the realtime channel on the local
OpenAI Realtime server, driven by the real `openai` client, whose key is revoked and restored."""

from __future__ import annotations

import pytest

from realtime.testing.openai_server import OpenAIRealtimeServer
from server.auth import issue_token
from server.client import EventFeed
from server.protocol import AssistantStatusMessage
from server.testing.harness import SECRET, eventually, running_server

pytestmark = pytest.mark.asyncio

ROOM = "standup"
BOUND_S = 60.0


def statuses(feed: EventFeed) -> list[AssistantStatusMessage]:
    return [m for m in feed.received if isinstance(m, AssistantStatusMessage)]


async def test_the_room_hears_when_its_assistant_is_away_and_when_it_is_back() -> None:
    """The model's key is revoked while the room is open: its reconnect is refused (HTTP 401),
    and the room's feed hears once that the assistant is unavailable, with who refused and the
    status, never the provider's words (which quote the key); the session tries again (5 s
    later), and once the key is good again the feed hears it is back. `/metrics` counts the
    outage."""
    async with OpenAIRealtimeServer(api_key="sk-test") as model:
        config = {"realtime": {"provider": "openai", "base_url": model.base_url,
                               "api_key": "sk-test"}}  # fmt: skip
        async with running_server(config) as srv:
            feed = await EventFeed.open(srv.base, ROOM, issue_token(SECRET, ROOM))
            await eventually(lambda: len(model.connections) == 1, BOUND_S, "the room's session")
            model.api_key = "sk-revoked"
            model.drop()
            await eventually(lambda: len(statuses(feed)) == 1, BOUND_S, "the assistant away")
            await eventually(lambda: model.refused.count("authorization") >= 1, BOUND_S)
            model.api_key = "sk-test"
            await eventually(lambda: len(statuses(feed)) == 2, BOUND_S, "the assistant back")
            away, back = statuses(feed)
            assert (away.status, away.reason) == ("unavailable", "openai refused the session, HTTP 401")
            assert (back.status, back.reason) == ("available", None)
            assert away.room == ROOM and away.channel == "realtime"
            _, metrics = await srv.http_get("/metrics")
            assert "chorus_assistant_outages_total 1.0" in metrics
            # the session reconnected after the refusals it counted, all of it in `/metrics`
            counts = srv.server.rooms.pipeline.realtime_counts()
            assert counts is not None and counts.reconnects == 1 and counts.refusals >= 1
            assert "chorus_realtime_reconnects_total 1.0" in metrics
            assert f"chorus_realtime_refusals_total {float(counts.refusals)}" in metrics
            assert "chorus_realtime_renewals_total 0.0" in metrics
            await feed.close()


async def test_who_joins_while_the_assistant_is_away_is_told_first() -> None:
    """A feed consumer that joins while the room's model is away hears it first, even when the
    status is older than the recent messages a new consumer is sent (`limits.history` 0 here);
    once the model is back, a new consumer hears nothing of it."""
    async with OpenAIRealtimeServer(api_key="sk-test") as model:
        config = {"realtime": {"provider": "openai", "base_url": model.base_url,
                               "api_key": "sk-test"}, "limits": {"history": 0}}  # fmt: skip
        async with running_server(config) as srv:
            token = issue_token(SECRET, ROOM)
            first = await EventFeed.open(srv.base, ROOM, token)
            await eventually(lambda: len(model.connections) == 1, BOUND_S, "the room's session")
            model.api_key = "sk-revoked"
            model.drop()
            await eventually(lambda: len(statuses(first)) == 1, BOUND_S, "the assistant away")
            late = await EventFeed.open(srv.base, ROOM, token)
            await eventually(lambda: len(statuses(late)) == 1, BOUND_S, "told on joining")
            assert statuses(late)[0].status == "unavailable"
            model.api_key = "sk-test"
            await eventually(lambda: len(statuses(first)) == 2, BOUND_S, "the assistant back")
            later = await EventFeed.open(srv.base, ROOM, token)
            await first.message("guest", "Hello?")  # a message through: the feed is live
            await eventually(lambda: any(m.type == "message" for m in later.received), BOUND_S)
            assert statuses(later) == []
            for feed in (first, late, later):
                await feed.close()
