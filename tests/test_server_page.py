"""The transcript page at `/`, in headless Chromium (driven by Playwright, with the system's
Chromium: no browser download) against the real server: live turns per speaker in their own
colours, a rename that goes through ON_TRANSCRIPTION (V6), and a corrected turn shown in place."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.async_api import Page, async_playwright

from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
)
from voice.audio import float_to_pcm16, read_audio_16k

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")


def find_chromium() -> str | None:
    """The system Chromium (`CHORUS_CHROMIUM`, else the first on PATH); `make` installs it."""
    env = os.environ.get("CHORUS_CHROMIUM")
    if env:
        return env
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


@contextlib.asynccontextmanager
async def headless_page(url: str) -> AsyncIterator[Page]:
    """One page of a throwaway headless Chromium, opened at `url`."""
    executable = find_chromium()
    assert executable is not None
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        try:
            page = await browser.new_page(viewport={"width": 1200, "height": 900})
            await page.goto(url)
            yield page
        finally:
            await browser.close()


async def wait_for(page: Page, expression: str, within_s: float = 30.0) -> None:
    await page.wait_for_function(expression, timeout=within_s * 1000)


pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_chromium() is None, reason="chromium is not installed (make test installs it)"
    ),
]

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "page-room"
SHOTS = Path(os.environ.get("CHORUS_SCREENSHOTS", tempfile.gettempdir()))


@pytest.fixture
def server_config() -> dict[str, Any]:
    """Speakers from the embedded diarization stage, not from the STT."""
    return {"stt": {"diarize": False}, "diarizer": {"kind": "embedded"}}


def meeting_pcm(start: float, end: float) -> bytes:
    audio = read_audio_16k(MEETING / "meeting.wav")
    return float_to_pcm16(audio[int(start * 16000) : int(end * 16000)])


SPEAKER_ROWS = "[...document.querySelectorAll('#speaker-list .speaker')]"
TURNS = "[...document.querySelectorAll('#turns .turn')]"


async def test_page_shows_speakers_in_colours_and_renames_through_on_transcription(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(
            page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
        )
        device = await DeviceStream.open(
            server.base, ROOM, token, StartMessage(participant="room-7", shared_mic=True)
        )
        # Alice, Bob, Carol: their first turns
        await device.send_audio(meeting_pcm(0.0, 13.0), chunk_s=0.5, realtime=False)
        await wait_for(page, f"{SPEAKER_ROWS}.length >= 2", 30)
        await wait_for(page, f"{TURNS}.length >= 2", 30)

        rows = await page.evaluate(
            f"{SPEAKER_ROWS}.map(r => [r.dataset.label, r.querySelector('.swatch').style.background])"
        )
        colours = [c for _, c in rows]
        assert len(set(colours)) == len(colours)  # one colour per speaker
        turn_colours = await page.evaluate(
            f"{TURNS}.map(t => [t.querySelector('.who').textContent, t.style.borderLeftColor])"
        )
        by_speaker: dict[str, set[str]] = {}
        for who, colour in turn_colours:
            by_speaker.setdefault(who, set()).add(colour)
        assert all(len(c) == 1 for c in by_speaker.values())  # a speaker keeps its colour
        assert len({next(iter(c)) for c in by_speaker.values()}) == len(by_speaker)
        first_label = rows[0][0]
        assert first_label.startswith("Speaker ")
        await page.screenshot(path=SHOTS / "chorus-page-before-rename.png")

        # rename the first speaker from the page: click Rename, type, Save
        await page.evaluate(
            f"{SPEAKER_ROWS}.find(r => r.dataset.label === {first_label!r}).querySelector('button.rename').click()"
        )
        await page.evaluate(
            "(() => { const i = document.querySelector('.rename-input'); i.value = 'Alice';"
            " i.form.querySelector('button[type=submit]').click(); })()"
        )
        await eventually(lambda: any(m.type == "renamed" for m in feed.received), 10, "renamed")
        await wait_for(
            page,
            f"{SPEAKER_ROWS}.some(r => r.dataset.label === {first_label!r}"
            " && r.querySelector('.name').textContent === 'Alice')",
        )

        # the voice speaks again: the server names the new turn Alice (ON_TRANSCRIPTION path)
        await device.send_audio(meeting_pcm(13.0, 16.0), chunk_s=0.5, realtime=False)
        await device.stop()
        await eventually(
            lambda: any(t.label == first_label and t.speaker == "Alice" for t in feed.turns),
            30,
            "a turn of the renamed voice named Alice",
        )
        await wait_for(page, f"{TURNS}.some(t => t.dataset.speaker === 'Alice')", 30)
        # every turn of that voice on the page reads Alice now, old and new
        whos = await page.evaluate(
            f"{TURNS}.filter(t => t.style.borderLeftColor === {colours[0]!r})"
            ".map(t => t.querySelector('.who').textContent)"
        )
        assert whos and set(whos) == {"Alice"}
        # the room's events carry the new name: the same path an application hook takes
        events = await server.server.rooms.kit.list_events(ROOM)
        renamed = [e for e in events if e.metadata.get("sender_name") == "Alice"]
        assert renamed and all(e.metadata["speaker_label"] == first_label for e in renamed)
        shot = SHOTS / "chorus-page-after-rename.png"
        await page.screenshot(path=shot)
        assert shot.stat().st_size > 10_000
    await feed.close()


async def test_page_text_box_types_into_the_room_and_shows_the_message(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(
            page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
        )
        await page.fill("#chat input[name=name]", "Erin")
        await page.fill("#chat input[name=text]", "Ship it on Thursday.")
        await page.click("#chat button[type=submit]")
        await wait_for(page, f"{TURNS}.some(t => t.classList.contains('typed'))")
        shown = await page.evaluate(
            f"{TURNS}.filter(t => t.classList.contains('typed'))"
            ".map(t => [t.dataset.speaker, t.querySelector('.text').textContent])"
        )
        assert shown == [["Erin", "Ship it on Thursday."]]
        assert await page.evaluate("document.getElementById('chat').elements.text.value") == ""
    await eventually(lambda: any(m.type == "message" for m in feed.received), 10)
    [message] = [m for m in feed.received if m.type == "message"]
    assert (message.speaker, message.text) == ("Erin", "Ship it on Thursday.")
    events = await server.server.rooms.kit.list_events(ROOM)
    assert [e.text for e in events] == ["Ship it on Thursday."]
    await feed.close()


async def test_page_says_when_a_streams_speakers_come_from_the_stt_and_when_back(
    server: RunningServer,
) -> None:
    """Issue 31: a stream the diarization stage could not keep up with is told on the feed
    (`diarization_status`); the page says so in the meeting, and when the stage is back."""
    from server.protocol import DiarizationStatusMessage, dump

    token = issue_token(SECRET, ROOM)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(
            page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
        )
        live = await server.server.rooms.room(ROOM)
        for status, reason in (("degraded", "stage 2.3 s behind (over 2 s)"), ("recovered", None)):
            live.feed.publish(dump(DiarizationStatusMessage(
                stream="device-1", status=status, speakers="stt" if reason else "stage",
                reason=reason)))  # fmt: skip
        notices = "[...document.querySelectorAll('#turns .notice')].map(n => n.textContent)"
        await wait_for(page, f"{notices}.length >= 2")
        shown = await page.evaluate(notices)
    assert any("speech-to-text" in n and "2.3 s behind" in n for n in shown), shown
    assert any("diarization stage again" in n for n in shown), shown


async def test_page_says_when_the_assistant_is_away_and_when_it_is_back(
    server: RunningServer,
) -> None:
    """The room's realtime model lost its provider (`assistant_status`, from the
    `ON_AGENT_STATUS` hook): the page says so in the meeting, and that what is said waits for
    it; then that it is back."""
    from server.protocol import AssistantStatusMessage, dump

    token = issue_token(SECRET, ROOM)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(
            page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
        )
        live = await server.server.rooms.room(ROOM)
        for status, reason in (("unavailable", "openai refused the session, HTTP 401"),
                               ("available", None)):  # fmt: skip
            live.feed.publish(dump(AssistantStatusMessage(
                room=ROOM, channel="realtime", status=status, reason=reason)))  # fmt: skip
        notices = "[...document.querySelectorAll('#turns .notice')].map(n => n.textContent)"
        await wait_for(page, f"{notices}.length >= 2")
        shown = await page.evaluate(notices)
    assert ("the assistant is unavailable (openai refused the session, HTTP 401): what is said "
            "waits for it") in shown, shown
    assert "the assistant is back" in shown, shown


async def test_page_says_when_a_phone_legs_speech_to_text_drops_and_comes_back(
    server: RunningServer,
) -> None:
    """A phone leg's caller hears nothing of its STT status; the feed carries it
    (`stt_status`), and the page shows it in the meeting, naming the caller."""
    from server.protocol import StreamEventMessage, SttStatusMessage, dump

    token = issue_token(SECRET, ROOM)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(
            page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
        )
        live = await server.server.rooms.room(ROOM)
        leg = "audiosocket-1-ab12cd"
        live.feed.publish(dump(StreamEventMessage(type="stream_started", room=ROOM, stream=leg,
                                                  participant="call-1", name="Dana",
                                                  kind="audiosocket")))  # fmt: skip
        live.feed.publish(dump(SttStatusMessage(stream=leg, status="degraded", reason="HTTP 503")))
        live.feed.publish(dump(SttStatusMessage(stream=leg, status="recovered")))
        notices = "[...document.querySelectorAll('#turns .notice')].map(n => n.textContent)"
        await wait_for(page, f"{notices}.length >= 3")
        shown = await page.evaluate(notices)
    assert "Dana: speech-to-text degraded, holding the audio (HTTP 503)" in shown, shown
    assert "Dana: speech-to-text recovered" in shown, shown


async def test_page_shows_a_corrected_turn_in_place_of_its_early_version() -> None:
    """An early turn the final result corrected (`corrected: true`, same `event_id`) replaces
    the turn the page shows; it is not shown as one more turn."""
    from server.testing.harness import running_server_with_local_stt
    from voice.testing.deepgram_server import ScriptedWords, SpokenWord

    words = ScriptedWords([
        [SpokenWord("hello", 0.1, 0.4, 0, "Hello.")],
        [SpokenWord("hi", 1.0, 1.2, 1, "Hi.")],
        [SpokenWord("right", 2.0, 2.3, 0, "Right."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")],
    ])
    silence = float_to_pcm16(np.zeros(16000 * 5, np.float32))
    async with running_server_with_local_stt({}, words) as server:
        assert server.stt_server is not None
        server.stt_server.interim_every = 1000.0  # no interims but the one the test sends
        token = issue_token(SECRET, ROOM)
        async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
            await wait_for(
                page, "document.getElementById('status').textContent === 'live: " + ROOM + "'"
            )
            device = await DeviceStream.open(
                server.base, ROOM, token, StartMessage(participant="room-7", shared_mic=True)
            )
            await device.send_audio(silence[: 2 * 16000 * 18 // 10], realtime=False)
            await wait_for(page, f"{TURNS}.length === 2")
            wrong = [SpokenWord("write", 2.0, 2.3, 0, "Write."), SpokenWord("yes", 2.4, 2.6, 1, "Yes.")]
            interim = server.stt_server._results("r", wrong, is_final=False, speech_final=False,
                                                 from_finalize=False, start=2.0, duration=0.7)
            await server.stt_server.send_raw(interim.model_dump_json(exclude_none=True))
            await wait_for(page, f"{TURNS}.length === 3")
            await device.send_audio(silence[2 * 16000 * 18 // 10 :], realtime=False)
            await device.stop()
            await wait_for(page, f"{TURNS}.some(t => t.querySelector('.text').textContent === 'Yes.')")
            shown = await page.evaluate(
                f"{TURNS}.map(t => [t.querySelector('.who').textContent, t.querySelector('.text').textContent])"
            )
    assert shown == [["Speaker A", "Hello."], ["Speaker B", "Hi."], ["Speaker A", "Right."],
                     ["Speaker B", "Yes."]]
