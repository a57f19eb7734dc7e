"""The page's speakers panel (issue 27.4): each speaker's last lines and a few seconds of their
voice to tell who is who before renaming; the excerpts route behind it (grants, bounds, gone with
the room). In the real headless Chromium against the real server (STT labels from the local
Deepgram-protocol server, which says the demo meeting's words)."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import wave

import httpx
import numpy as np
import pytest

from server.auth import DEFAULT_GRANTS, Grant, issue_token
from server.client import DeviceStream, EventFeed
from server.excerpts import EXCERPT_RATE, VoiceExcerpts
from server.protocol import StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    running_server_with_local_stt,
)
from tests.test_server_page import MEETING, find_chromium, headless_page, meeting_pcm, wait_for
from voice.testing.deepgram_server import MeetingWords, SpokenWord

ROOM = "panel-room"
ROWS = "[...document.querySelectorAll('#speaker-list .speaker')]"


def pcm_of(seconds: float, value: int = 1000) -> bytes:
    return np.full(int(seconds * EXCERPT_RATE), value, "<i2").tobytes()


def test_excerpts_keep_each_speakers_newest_seconds_and_a_bounded_number_of_speakers() -> None:
    book = VoiceExcerpts(seconds=2.0, max_speakers=2)
    book.take(("s1", "Speaker A"), pcm_of(1.5, 1))
    book.take(("s1", "Speaker A"), pcm_of(1.5, 2))
    kept = np.frombuffer(book.pcm16(("s1", "Speaker A")) or b"", "<i2")
    assert len(kept) == 2 * EXCERPT_RATE  # the newest two seconds: half a second of the first
    assert (kept[: EXCERPT_RATE // 2] == 1).all() and (kept[EXCERPT_RATE // 2 :] == 2).all()
    book.take(("s1", "Speaker A"), pcm_of(5.0, 3))  # one turn longer than the limit: its tail
    assert book.seconds(("s1", "Speaker A")) == 2.0
    book.take(("s1", "Speaker B"), pcm_of(1.0))
    book.take(("s2", None), pcm_of(1.0))  # a third speaker: the least recently heard leaves
    assert book.pcm16(("s1", "Speaker A")) is None and len(book) == 2
    book.take(("s2", None), b"\x01")  # under one sample: nothing
    assert book.seconds(("s2", None)) == 1.0
    with wave.open(io.BytesIO(book.wav(("s2", None)) or b""), "rb") as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (EXCERPT_RATE, 1, 2)
        assert w.getnframes() == EXCERPT_RATE
    assert book.wav(("nobody", "Speaker Z")) is None


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (make test installs it)"
)
async def test_page_panel_shows_last_lines_and_plays_a_voice_before_a_rename(
    server: RunningServer,
) -> None:
    token = issue_token(SECRET, ROOM)
    feed = await EventFeed.open(server.base, ROOM, token)
    async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
        await wait_for(page, f"document.getElementById('status').textContent === 'live: {ROOM}'")
        device = await DeviceStream.open(
            server.base, ROOM, token, StartMessage(participant="room-7", shared_mic=True)
        )
        await device.send_audio(meeting_pcm(0.0, 13.0), chunk_s=0.5, realtime=False)
        await eventually(lambda: len({t.label for t in feed.turns}) >= 2, 30, "two voices")
        await wait_for(page, f"{ROWS}.length >= 2", 30)
        turn = feed.turns[0]
        assert turn.label is not None and turn.stream is not None
        # the panel shows each speaker's last lines under its name
        last = [t.text for t in feed.turns if t.label == turn.label][-2:]
        await wait_for(
            page,
            f"{ROWS}.some(r => r.dataset.label === {turn.label!r}"
            f" && [...r.querySelectorAll('.lines div')].map(d => d.textContent).join('|')"
            f" === {'|'.join(f'“{t}”' for t in last)!r})",
        )
        # ▶ fetches the last seconds of that voice from the live room (a real click)
        row = f"#speaker-list .speaker[data-label={turn.label!r}] button.excerpt"
        await page.click(row)
        await wait_for(
            page,
            f"Number(({ROWS}.find(r => r.dataset.label === {turn.label!r}) || {{dataset: {{}}}})"
            ".dataset.excerptBytes || 0) > 44 + 32000",
        )
        # then a rename from the same row, as the existing rename does
        await page.evaluate(
            f"{ROWS}.find(r => r.dataset.label === {turn.label!r})"
            ".querySelector('button.rename').click()"
        )
        await page.evaluate(
            "(() => { const i = document.querySelector('.rename-input'); i.value = 'Alice';"
            " i.form.querySelector('button[type=submit]').click(); })()"
        )
        await wait_for(
            page,
            f"{ROWS}.some(r => r.dataset.label === {turn.label!r}"
            " && r.querySelector('.name').textContent === 'Alice'"
            " && r.querySelectorAll('.lines div').length > 0)",
        )

        # the route itself: a WAV of at most four seconds of that voice, not silence
        url = f"{server.http_base}/v1/rooms/{ROOM}/speakers/excerpt"
        async with httpx.AsyncClient() as http:
            got = await http.get(
                url, params={"token": token, "stream": turn.stream, "label": turn.label}
            )
            assert got.status_code == 200 and got.headers["content-type"] == "audio/wav"
            with wave.open(io.BytesIO(got.content), "rb") as w:
                assert 0.5 < w.getnframes() / w.getframerate() <= 4.0
                samples = np.frombuffer(w.readframes(w.getnframes()), "<i2")
            assert np.abs(samples).max() > 1000
            other_room = issue_token(SECRET, "another-room")
            refused = await http.get(
                url, params={"token": other_room, "stream": turn.stream, "label": turn.label}
            )
            assert refused.status_code == 403
            unknown = await http.get(
                url, params={"token": token, "stream": turn.stream, "label": "Speaker Z"}
            )
            assert unknown.status_code == 404
            await device.stop()
    await feed.close()
    # gone with the room
    async with httpx.AsyncClient() as http:
        admin = issue_token(SECRET, ROOM, grants=frozenset({Grant.ADMIN}))
        await eventually_deleted(http, f"{server.http_base}/v1/rooms/{ROOM}", admin)
        gone = await http.get(
            url, params={"token": token, "stream": turn.stream, "label": turn.label}
        )
        assert gone.status_code == 404


async def eventually_deleted(http: httpx.AsyncClient, url: str, token: str) -> None:
    """DELETE the room once its stream and feed have closed (409 until then)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (answer := await http.delete(url, params={"token": token})).status_code == 409:
        assert loop.time() < deadline, "the room stayed in use"
        await asyncio.sleep(0.05)
    assert answer.status_code == 200, answer.text


# --------------------------------------------------------------------------- suggestions, remember


def introduced_meeting() -> MeetingWords:
    """The demo meeting's words, with Alice opening "Hi, I'm Ian." instead of "Good morning
    everyone." (the same audio: the STT stand-in says what the test needs)."""
    meeting = MeetingWords.from_meeting(MEETING)
    said = {"good": ("hi", "Hi,"), "morning": ("i'm", "I'm"), "everyone": ("ian", "Ian.")}
    words = [
        SpokenWord(said[w.word][0], w.start, w.end, w.speaker, said[w.word][1])
        if w.start < 2.0 and w.word in said
        else w
        for w in meeting.words
    ]
    return dataclasses.replace(meeting, words=words)


@pytest.mark.asyncio
@pytest.mark.slow
@pytest.mark.skipif(
    find_chromium() is None, reason="chromium is not installed (make test installs it)"
)
async def test_page_confirms_a_name_from_an_introduction_and_remembers_the_voice() -> None:
    config = {
        "stt": {"diarize": False},
        "diarizer": {"kind": "embedded"},
        "voices": {"enabled": True},
    }
    async with running_server_with_local_stt(config, introduced_meeting()) as server:
        token = issue_token(SECRET, ROOM, grants=[*DEFAULT_GRANTS, Grant.ADMIN])
        feed = await EventFeed.open(server.base, ROOM, token)
        async with headless_page(f"{server.http_base}/?room={ROOM}&token={token}") as page:
            await wait_for(page, "document.body.dataset.voices === 'on'")
            await wait_for(
                page, f"document.getElementById('status').textContent === 'live: {ROOM}'"
            )
            device = await DeviceStream.open(
                server.base, ROOM, token, StartMessage(participant="room-7", shared_mic=True)
            )
            await device.send_audio(meeting_pcm(0.0, 26.0), chunk_s=0.5, realtime=False)
            await eventually(
                lambda: any(m.type == "speaker_suggestion" for m in feed.received),
                60,
                "a suggestion from the introduction",
            )
            [suggestion] = [m for m in feed.received if m.type == "speaker_suggestion"]
            assert suggestion.name == "Ian" and suggestion.source == "introduction"
            label = suggestion.label
            first = next(t for t in feed.turns if t.label == label)
            assert first.speaker == label  # a suggestion renames nobody by itself
            # the panel offers it; one click confirms it (a rename)
            confirm = f"#speaker-list .speaker[data-label={label!r}] .suggestion button.confirm"
            await page.wait_for_selector(confirm, timeout=30_000)
            await page.click(confirm)
            await eventually(
                lambda: any(m.type == "renamed" and m.name == "Ian" for m in feed.received),
                10,
                "renamed to Ian",
            )
            await wait_for(
                page,
                f"{ROWS}.some(r => r.dataset.label === {label!r}"
                " && r.querySelector('.name').textContent === 'Ian'"
                " && !r.querySelector('.suggestion'))",
            )
            # then Remember keeps the voice for later meetings (the room's admin grant)
            await page.click(f"#speaker-list .speaker[data-label={label!r}] button.remember")
            await wait_for(
                page,
                f"{ROWS}.some(r => r.dataset.label === {label!r}"
                " && (r.querySelector('.excerpt-status') || {}).textContent)",
                30,
            )
            said = await page.evaluate(
                f"{ROWS}.find(r => r.dataset.label === {label!r})"
                ".querySelector('.excerpt-status').textContent"
            )
            assert said == "remembered as Ian"
            async with httpx.AsyncClient(base_url=server.http_base) as http:
                server_admin = issue_token(SECRET, "*", grants=[Grant.ADMIN])
                listed = await http.get(
                    "/v1/voices", headers={"Authorization": f"Bearer {server_admin}"}
                )
                assert [(v["name"], v["prints"] >= 1) for v in listed.json()] == [("Ian", True)]
            await device.stop()
        await feed.close()
