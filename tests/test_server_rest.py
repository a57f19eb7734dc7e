"""REST routes over real HTTP: a room's transcript in every `chorus transcribe` format, and room
deletion with the `admin` grant (issue 13, declared once on the app with pydantic models)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from server.auth import Grant, issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
)
from voice.audio import float_to_pcm16, read_audio_16k
from voice.transcribe import FORMATS, Turn, format_turns

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "rest-room"


async def _stream_meeting(server: RunningServer, room: str, seconds: float) -> EventFeed:
    """Stream the first `seconds` of the demo meeting into `room`; the feed saw every turn."""
    token = issue_token(SECRET, room)
    feed = await EventFeed.open(server.base, room, token)
    device = await DeviceStream.open(server.base, room, token, StartMessage(participant="dev"))
    audio = read_audio_16k(MEETING / "meeting.wav")[: int(seconds * 16000)]
    await device.send_audio(float_to_pcm16(audio), chunk_s=0.5, realtime=False)
    async with asyncio.timeout(60):
        await device.stop()
    await eventually(
        lambda: any(m.type == "stream_stopped" for m in feed.received), 30, "stream_stopped"
    )
    return feed


async def test_transcript_in_every_format_is_what_chorus_transcribe_writes(
    server: RunningServer, http: httpx.AsyncClient
) -> None:
    feed = await _stream_meeting(server, ROOM, 13.0)
    await feed.close()
    assert len(feed.turns) >= 2
    expected = [Turn(speaker=t.speaker, text=t.text, start=t.start, end=t.end) for t in feed.turns]
    headers = {"Authorization": f"Bearer {issue_token(SECRET, ROOM, grants=[Grant.FEED])}"}
    response = await http.get(f"/v1/rooms/{ROOM}/transcript", headers=headers)
    assert response.status_code == 200
    lines = response.json()
    assert [{k: t[k] for k in ("speaker", "text", "start", "end", "kind")} for t in lines] == [
        t.as_json() for t in expected
    ]
    # each line names its room event, label and stream: the feed's turns, one for one
    assert [(t["event_id"], t["label"], t["stream"]) for t in lines] == [
        (t.event_id, t.label, t.stream) for t in feed.turns
    ]
    for fmt in FORMATS:
        if fmt == "json":
            continue  # checked above: the same lines, with their events' ids
        response = await http.get(f"/v1/rooms/{ROOM}/transcript?format={fmt}", headers=headers)
        assert response.status_code == 200, fmt
        assert response.text == format_turns(expected, fmt, file_id=ROOM), fmt
    assert "text/vtt" in (await http.get(
        f"/v1/rooms/{ROOM}/transcript?format=vtt", headers=headers)).headers["content-type"]  # fmt: skip


async def test_transcript_refusals_are_json_problems(
    server: RunningServer, http: httpx.AsyncClient
) -> None:
    feed = await EventFeed.open(server.base, ROOM, issue_token(SECRET, ROOM))  # makes the room
    url = f"/v1/rooms/{ROOM}/transcript"
    cases = [
        (url, 401, "token_missing"),
        (f"{url}?token=nonsense", 401, "token_malformed"),
        (f"{url}?token={issue_token(SECRET, 'elsewhere')}", 403, "token_wrong_room"),
        (f"{url}?token={issue_token(SECRET, ROOM, grants=['stream'])}", 403, "token_not_granted"),
        (f"{url}?token={issue_token('z' * 32, ROOM)}", 401, "token_bad_signature"),
        (f"{url}?format=docx&token={issue_token(SECRET, ROOM)}", 422, "bad_request"),
        (f"/v1/rooms/nobody/transcript?token={issue_token(SECRET, 'nobody')}", 404, "unknown_room"),
    ]
    for path, status, problem in cases:
        response = await http.get(path)
        assert (response.status_code, response.json()["problem"]) == (status, problem), path
    assert (await http.get(f"{url}?token={issue_token(SECRET, ROOM)}")).json() == []
    await feed.close()


async def test_delete_room_needs_admin_and_an_idle_room(
    server: RunningServer, http: httpx.AsyncClient
) -> None:
    feed = await _stream_meeting(server, ROOM, 6.0)
    kit = server.server.rooms.kit
    assert await kit.list_events(ROOM)
    url = f"/v1/rooms/{ROOM}"
    user = issue_token(SECRET, ROOM)
    response = await http.delete(url, headers={"Authorization": f"Bearer {user}"})
    assert (response.status_code, response.json()["problem"]) == (403, "token_not_granted")
    admin = issue_token(SECRET, ROOM, grants=[Grant.ADMIN])
    response = await http.delete(f"{url}?token={admin}")  # the feed is still connected
    assert (response.status_code, response.json()["problem"]) == (409, "room_in_use")
    await feed.close()
    await eventually(lambda: not server.server.rooms.rooms[ROOM].feed.consumers, 30, "feed gone")
    response = await http.delete(f"{url}?token={admin}")
    assert response.status_code == 200 and response.json() == {"room": ROOM, "deleted": True}
    assert ROOM not in server.server.rooms.rooms
    assert await kit.get_room(ROOM) is None and await kit.list_events(ROOM) == []
    response = await http.delete(f"{url}?token={admin}")
    assert (response.status_code, response.json()["problem"]) == (404, "unknown_room")
    # the id can be used again: a new, empty room
    again = await EventFeed.open(server.base, ROOM, user)
    transcript = await http.get(f"{url}/transcript?token={user}")
    assert transcript.status_code == 200 and transcript.json() == []
    await again.close()


async def test_openapi_describes_the_rest_routes(http: httpx.AsyncClient) -> None:
    spec = (await http.get("/openapi.json")).json()
    transcript = spec["paths"]["/v1/rooms/{room}/transcript"]["get"]
    assert {p["name"] for p in transcript["parameters"]} >= {"room", "format", "token"}
    assert {"401", "403", "200"} <= set(transcript["responses"])
    delete = spec["paths"]["/v1/rooms/{room}"]["delete"]
    assert delete["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/RoomDeleted"
    )
    assert "409" in delete["responses"]


async def test_the_transcript_reads_a_renamed_voice_by_its_new_name_in_every_line(
    server: RunningServer, http: httpx.AsyncClient
) -> None:
    """A voice renamed after its turns were committed (the page's Rename) reads its new name in
    the whole transcript, as the page relabels it: every format, the exports' source."""
    feed = await _stream_meeting(server, ROOM, 13.0)
    first = feed.turns[0]
    assert first.label == "Speaker A" and first.stream is not None
    await feed.rename("Speaker A", "Alice", first.stream)
    await eventually(lambda: any(m.type == "renamed" for m in feed.received), 10, "renamed")
    await feed.close()
    token = issue_token(SECRET, ROOM, grants=[Grant.FEED])
    lines = (await http.get(f"/v1/rooms/{ROOM}/transcript?token={token}")).json()
    names = {t.label: t.speaker for t in feed.turns}
    assert names["Speaker A"] == "Speaker A"  # the feed named the turns before the rename
    assert [(t["label"], t["speaker"]) for t in lines] == [
        (t.label, "Alice" if t.label == "Speaker A" else t.speaker) for t in feed.turns
    ]
    srt = (await http.get(f"/v1/rooms/{ROOM}/transcript?format=srt&token={token}")).text
    assert "Alice: Good morning everyone." in srt and "Speaker A" not in srt
    markdown = (await http.get(f"/v1/rooms/{ROOM}/transcript?format=markdown&token={token}")).text
    title, blank, item, *_ = markdown.splitlines()
    assert (title, blank) == (f"# Transcript: {ROOM}", "")
    assert item.startswith("- **Alice** (00:00.") and item.endswith(f"): {first.text}")
