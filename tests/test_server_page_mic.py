"""The page as a conference-room device, in headless Chromium (Playwright, the system's Chromium)
against the real server: its microphone is Chromium's fake capture device playing the demo
meeting (`--use-file-for-fake-audio-capture`, looped), captured through the page's AudioWorklet
and streamed over the device protocol; the assistant's reply audio comes back to the page and is
scheduled for playback; a reload shows the meeting so far once; the exports are the transcript
route's. Also the worklet's frames checked against the protocol, in the browser.

STT is the local Deepgram-protocol server (it finds the audio it receives in the meeting and
says the meeting's words, with its speakers); the realtime session is the local OpenAI Realtime
server, answering the configured person (`policy.answer_only`) with a reply that has audio.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.async_api import Page, async_playwright

from realtime.testing.openai_server import OpenAIRealtimeServer
from server.auth import issue_token
from server.device import DeviceFraming
from server.protocol import BargeInRuleMessage, StartMessage, parse_device_message
from server.testing.harness import SECRET, RunningServer, local_deepgram_stt, running_server
from tests.test_server_page import find_chromium, wait_for
from voice.audio import float_to_pcm16
from voice.testing.deepgram_server import DeepgramTestServer, MeetingWords

pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.slow,
    pytest.mark.skipif(
        find_chromium() is None, reason="chromium is not installed (make test installs it)"
    ),
]

REPO = Path(__file__).resolve().parents[1]
MEETING = REPO / "examples" / "meeting"
DOCS = REPO / "docs"
ROOM = "meeting-room"
BOUND_S = 90.0
"""Every wait's failure bound (a loaded machine is slow); a passing run never waits for it."""
TURNS = "[...document.querySelectorAll('#turns .turn')]"
SPOKEN = f"{TURNS}.filter(t => !t.classList.contains('typed') && !t.classList.contains('reply'))"


@contextlib.asynccontextmanager
async def chromium(fake_microphone: Path | None = None) -> AsyncIterator[Any]:
    """A throwaway headless Chromium; with `fake_microphone`, getUserMedia is granted at once
    and captures that WAV (looped)."""
    executable = find_chromium()
    assert executable is not None
    args = ["--no-sandbox", "--autoplay-policy=no-user-gesture-required"]
    if fake_microphone is not None:
        args += [
            "--use-fake-ui-for-media-stream",
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={fake_microphone}",
        ]
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=executable, headless=True, args=args
        )
        try:
            yield browser
        finally:
            await browser.close()


def captured_meeting() -> MeetingWords:
    """The meeting's words, found in audio that went through Chromium's capture (resampled
    twice: its first quarter second of room noise may not be found, the next is)."""
    return dataclasses.replace(MeetingWords.from_meeting(MEETING), search_seconds=3.0)


@contextlib.asynccontextmanager
async def meeting_server() -> AsyncIterator[RunningServer]:
    """STT labels the meeting's voices (Speaker A, B, C); the session answers Speaker B."""
    async with (
        DeepgramTestServer(captured_meeting()) as deepgram,
        OpenAIRealtimeServer(replies=["Noted, thank you."] * 20, reply_audio_seconds=1.0) as model,
        running_server({
            "stt": local_deepgram_stt(deepgram.url, diarize=True),
            "diarizer": {"kind": "none"},
            "realtime": {"provider": "openai", "base_url": model.base_url, "api_key": "test"},
            "policy": {"answer_only": ["Speaker B"]},
        }) as server,
    ):  # fmt: skip
        server.stt_server = deepgram
        yield server


async def live(page: Page) -> None:
    await wait_for(page, f"document.getElementById('status').textContent === 'live: {ROOM}'")


async def shown_turns(page: Page) -> list[list[str]]:
    return list(await page.evaluate(
        f"{SPOKEN}.map(t => [t.dataset.eventId, t.querySelector('.who').textContent,"
        " t.querySelector('.text').textContent])"
    ))  # fmt: skip


async def test_the_page_streams_the_room_microphone_plays_the_reply_and_shows_the_meeting_so_far(
    tmp_path: Path,
) -> None:
    token = issue_token(SECRET, ROOM)
    async with meeting_server() as server, chromium(MEETING / "meeting.wav") as browser:
        page = await browser.new_page(viewport={"width": 1280, "height": 860})
        await page.goto(f"{server.http_base}/?room={ROOM}&token={token}")
        await live(page)
        # the room's processing is on by default; this run captures the file as it is
        switches = ["#echo-cancellation", "#noise-suppression", "#auto-gain"]
        assert [await page.is_checked(s) for s in switches] == [True, True, True]
        for switch in switches:
            await page.uncheck(switch)
        await page.click("#mic")
        await wait_for(page, "document.getElementById('mic-status').textContent === 'listening'",
                       BOUND_S)  # fmt: skip
        assert await page.text_content("#mic") == "Stop"
        settings = await page.evaluate(
            "chorus.mic.media.getAudioTracks()[0].getSettings()"
        )
        assert (settings["echoCancellation"], settings["noiseSuppression"],
                settings["autoGainControl"]) == (False, False, False)  # fmt: skip
        # the browser's processing is chosen at start: those switches wait while it runs
        assert [await page.is_disabled(s) for s in switches] == [True, True, True]
        assert not await page.is_disabled("#barge-in")  # this one works at once
        start = parse_device_message(json.dumps(await page.evaluate("chorus.mic.startMessage")))
        assert isinstance(start, StartMessage)
        assert (start.sample_rate, start.encoding, start.channels, start.shared_mic) == (
            16000, "pcm16", 1, True)  # fmt: skip
        assert not start.server_barge_in  # echo cancellation off: the page's own rule decides

        # labelled turns of at least two voices, and the assistant's reply to Speaker B
        await wait_for(page, f"new Set({SPOKEN}.map(t => t.dataset.speaker)).size >= 2", BOUND_S)
        await wait_for(page, "document.querySelector('#turns .reply') !== null", BOUND_S)
        await wait_for(page, "chorus.player.secondsScheduled >= 0.9", BOUND_S)
        assert await page.evaluate("chorus.player.bytesReceived") >= 2 * 16000 * 0.9
        # the meter shows the meeting's level: speech well above the room's noise
        await wait_for(page, "Number(document.getElementById('level-bar').dataset.db) > -40",
                       BOUND_S)  # fmt: skip
        shot = await page.screenshot()
        assert len(shot) > 10_000  # a page with content, not a blank one
        picture = DOCS / "page-meeting.png"
        if os.environ.get("CHORUS_UPDATE_SCREENSHOTS") or not picture.exists():
            picture.write_bytes(shot)  # a run that asks for it remakes the docs' picture

        # the network drops the microphone's socket: the page reconnects, a new stream in the
        # same room, and its voices keep coming
        first_stream = await page.evaluate("chorus.mic.streamId")
        spoken = len(await shown_turns(page))
        dropped = [s for s in server.server._sockets if s.ws.url.path.endswith("/stream")]
        assert len(dropped) == 1
        dropped[0].abort()
        await wait_for(page, "chorus.mic.reconnects === 1"
                             " && document.getElementById('mic-status').textContent === 'listening'"
                             f" && chorus.mic.streamId !== {first_stream!r}", BOUND_S)  # fmt: skip
        second_stream = await page.evaluate("chorus.mic.streamId")
        await wait_for(page, f"{SPOKEN}.some(t => t.dataset.stream === {second_stream!r})",
                       BOUND_S)  # fmt: skip
        assert len(await shown_turns(page)) > spoken

        # the feed's socket drops too: the page reads the meeting so far again and shows no
        # line twice
        shown_before = await shown_turns(page)
        [feed_socket] = [s for s in server.server._sockets if s.ws.url.path.endswith("/events")]
        feed_socket.abort()
        await wait_for(page, "chorus.feed.reconnects === 1 && document.getElementById('status')"
                             f".textContent === 'live: {ROOM}'", BOUND_S)  # fmt: skip
        shown_after = await shown_turns(page)
        assert [i for i, _, _ in shown_after][: len(shown_before)] == [i for i, _, _ in shown_before]
        assert len({i for i, _, _ in shown_after}) == len(shown_after)

        # a typed line among the spoken ones
        await page.fill("#chat input[name=name]", "Erin")
        await page.fill("#chat input[name=text]", "Ship it on Thursday.")
        await page.click("#chat button[type=submit]")
        typed = f"{TURNS}.filter(t => t.classList.contains('typed'))"
        await wait_for(page, f"{typed}.length === 1")

        async def stored() -> dict[str, tuple[str, str]]:
            response = await page.request.get(
                f"{server.http_base}/v1/rooms/{ROOM}/transcript?token={token}"
            )
            return {t["event_id"]: (t["speaker"], t["text"]) for t in await response.json()}

        async def agreed() -> list[list[str]]:
            """The page's turns once the transcript route holds each of them as shown (a turn
            corrected between the two reads is read again)."""
            async with asyncio.timeout(BOUND_S):
                while True:
                    shown, route = await shown_turns(page), await stored()
                    if all(route.get(i) == (who, text) for i, who, text in shown):
                        return shown

        before = await agreed()
        assert len({who for _, who, _ in before}) >= 2
        assert all(who.startswith("Speaker ") for _, who, _ in before)

        # reload mid-meeting: the earlier turns are there, once each
        await page.reload()
        await live(page)
        after = await shown_turns(page)
        ids = [event_id for event_id, _, _ in after]
        assert len(ids) == len(set(ids))
        after = await agreed()
        earlier = [i for i, _, _ in before]
        assert [i for i, _, _ in after if i in set(earlier)] == earlier
        assert await page.evaluate(f"{typed}.map(t => t.querySelector('.text').textContent)") == [
            "Ship it on Thursday."
        ]

        # exports: what the transcript route says, in each format
        for fmt, ext in (("text", "txt"), ("markdown", "md"), ("srt", "srt"), ("vtt", "vtt"),
                         ("json", "json")):  # fmt: skip
            async with page.expect_download() as download_info:
                await page.click(f"#exports button[data-format={fmt}]")
            download = await download_info.value
            assert download.suggested_filename == f"{ROOM}.{ext}"
            saved = tmp_path / download.suggested_filename
            await download.save_as(saved)
            route = await page.request.get(
                f"{server.http_base}/v1/rooms/{ROOM}/transcript?format={fmt}&token={token}"
            )
            exported = saved.read_text()
            if fmt == "json":  # the route may hold turns committed since the click
                assert json.loads(exported) == (await route.json())[: len(json.loads(exported))]
            else:
                assert exported.splitlines()[:4] == (await route.text()).splitlines()[:4]
        assert "<v Speaker " in (tmp_path / f"{ROOM}.vtt").read_text()
        assert "Speaker A: " in (tmp_path / f"{ROOM}.srt").read_text()
        assert "**Erin (typed)**" in (tmp_path / f"{ROOM}.md").read_text()
        assert {t["kind"] for t in json.loads((tmp_path / f"{ROOM}.json").read_text())} == {
            "spoken", "typed"}  # fmt: skip


def sine(seconds: float, rate: int) -> np.ndarray[Any, Any]:
    t = np.arange(int(seconds * rate)) / rate
    return (0.6 * np.sin(2 * np.pi * 440 * t) * np.hanning(len(t))).astype(np.float32)


RENDER = """async ([rate, samples]) => {
  const ctx = new OfflineAudioContext(1, samples.length, rate);
  const url = URL.createObjectURL(new Blob([chorus.WORKLET_SOURCE], {type: "application/javascript"}));
  await ctx.audioWorklet.addModule(url);
  const buffer = ctx.createBuffer(1, samples.length, rate);
  buffer.getChannelData(0).set(samples);
  const source = ctx.createBufferSource();
  source.buffer = buffer;
  const node = new AudioWorkletNode(ctx, "chorus-mic",
    {numberOfInputs: 1, numberOfOutputs: 1, processorOptions: {frameSamples: chorus.FRAME_SAMPLES}});
  const frames = [];
  node.port.onmessage = (ev) => frames.push(Array.from(new Uint8Array(ev.data.frame)));
  source.connect(node).connect(ctx.destination);
  source.start();
  await ctx.startRendering();
  const expected = Math.floor(samples.length * 16000 / rate / chorus.FRAME_SAMPLES);
  while (frames.length < expected) await new Promise((r) => setTimeout(r, 10));
  return frames;
}"""


async def test_the_worklets_frames_are_the_device_protocols_frames(server: RunningServer) -> None:
    """16 kHz capture: every frame is 20 ms of 16-bit little-endian mono, and the frames are
    exactly the server's own conversion of the samples (`voice.audio.float_to_pcm16`); a 48 kHz
    capture comes out at 16 kHz. The server's device framing takes each frame whole."""
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{server.http_base}/")
        signal = sine(1.0, 16000)
        frames = [bytes(f) for f in await page.evaluate(RENDER, [16000, signal.tolist()])]
        assert frames and all(len(f) == 640 for f in frames)
        assert b"".join(frames) == float_to_pcm16(signal)[: 640 * len(frames)]
        framing = DeviceFraming()
        start = await page.evaluate("chorus.startMessage()")
        framing.start(json.dumps(start))
        assert all(framing.audio(f) == f for f in frames)

        signal48 = sine(1.0, 48000)
        frames48 = [bytes(f) for f in await page.evaluate(RENDER, [48000, signal48.tolist()])]
        assert all(len(f) == 640 for f in frames48) and len(frames48) == 50
        expected = np.frombuffer(float_to_pcm16(signal48.reshape(-1, 3).mean(axis=1)), "<i2")
        got = np.frombuffer(b"".join(frames48), "<i2")
        assert np.abs(got.astype(int) - expected[: len(got)]).max() <= 1


async def test_speech_over_the_assistant_drops_what_the_page_buffered(
    server: RunningServer,
) -> None:
    """Barge-in on the page: the level rising over the threshold while a reply plays, for the
    hold time, stops the scheduled audio and tells the server (`barge_in`, once); a level
    already high when the reply began does not. Reply audio still arriving is not played until
    the server answers `reply_stopped`; the next reply is."""
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{server.http_base}/")
        result = await page.evaluate("""() => {
          const {player, bargeIn, mic} = chorus;
          const sent = [];
          mic.socket = {readyState: WebSocket.OPEN, send: (m) => sent.push(JSON.parse(m))};
          player.context = new AudioContext({sampleRate: 16000});
          const second = new ArrayBuffer(32000);
          for (let i = 0; i < 5; i++) player.take(second.slice(0));
          const scheduled = player.sources.length, playing = player.playing();
          for (let i = 0; i < 40; i++) bargeIn.hear(0.3);      // loud before: not a barge-in
          const kept = player.sources.length;
          bargeIn.hear(0.001);                                   // quiet, then someone talks
          for (let i = 0; i < bargeIn.holdFrames; i++) bargeIn.hear(0.3);
          const left = player.sources.length, why = player.lastDrop;
          player.take(second.slice(0));  // the rest of that reply, already on its way
          const late = player.sources.length;
          player.stopped();              // the server's reply_stopped
          player.take(second.slice(0));  // the next reply
          mic.socket = null;
          return {scheduled, playing, kept, left, drops: player.drops, why, late,
                  refused: player.refused, next: player.sources.length,
                  seconds: player.secondsScheduled, sent};
        }""")
        # the reply comes again as what the room heard of it: shown in its place
        shown = await page.evaluate("""() => {
          showFeedMessage({type: "reply", room: "r", text: "A long answer.", event_id: "e1"});
          showFeedMessage({type: "reply", room: "r", text: "A…", event_id: "e1",
                           corrected: true, interrupted: true});
          return [...document.querySelectorAll("#turns .reply .text")].map(t => t.textContent);
        }""")
    assert result == {"scheduled": 5, "playing": True, "kept": 5, "left": 0, "drops": 1,
                      "why": "barge-in", "late": 0, "refused": 32000, "next": 1, "seconds": 6,
                      "sent": [{"type": "barge_in"}]}
    assert shown == ["A…"]


async def test_with_echo_cancellation_on_the_server_decides_the_barge_in(
    server: RunningServer,
) -> None:
    """The page's stream declares `server_barge_in` when the browser's echo cancellation and
    the barge-in switch are on (the server's speech rule hears quiet and far talkers the page's
    level rule misses: docs/benchmarks.md), and the page's own rule then sends nothing: it
    stops playing at the server's `reply_stopped`. With either switch off, it does not."""
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{server.http_base}/")
        start = parse_device_message(json.dumps(await page.evaluate("chorus.startMessage()")))
        assert isinstance(start, StartMessage) and start.server_barge_in
        assert start.shared_mic and not start.echo_cancelled  # still silenced while it plays
        result = await page.evaluate("""() => {
          const {player, bargeIn, mic} = chorus;
          const sent = [];
          mic.socket = {readyState: WebSocket.OPEN, send: (m) => sent.push(JSON.parse(m))};
          mic.startMessage = chorus.startMessage();
          player.context = new AudioContext({sampleRate: 16000});
          for (let i = 0; i < 5; i++) player.take(new ArrayBuffer(32000));
          bargeIn.hear(0.001);
          for (let i = 0; i < 3 * bargeIn.holdFrames; i++) bargeIn.hear(0.3);  // someone talks
          const left = player.sources.length;
          player.stopped();  // the server heard them: reply_stopped
          const after = player.sources.length;
          mic.socket = null;
          mic.startMessage = null;
          return {sent, left, after};
        }""")
        assert result == {"sent": [], "left": 5, "after": 0}
        for switch in ("#echo-cancellation", "#barge-in"):
            await page.uncheck(switch)
            start = parse_device_message(json.dumps(await page.evaluate("chorus.startMessage()")))
            assert isinstance(start, StartMessage) and not start.server_barge_in, switch
            await page.check(switch)
        # the barge-in switch turned off and on while the page streams: the server is told
        # (`barge_in_rule`), and the page's own rule steps back in while the server does not
        await page.evaluate("""() => {
          const {mic} = chorus;
          window.sent = [];
          mic.socket = {readyState: WebSocket.OPEN, chorusStarted: true,
                        send: (m) => window.sent.push(JSON.parse(m))};
          mic.startMessage = chorus.startMessage();
        }""")
        await page.uncheck("#barge-in")
        assert await page.evaluate("chorus.mic.startMessage.server_barge_in") is False
        await page.check("#barge-in")
        sent = await page.evaluate("window.sent")
        assert [parse_device_message(json.dumps(m)) for m in sent] == [
            BargeInRuleMessage(server_decides=False), BargeInRuleMessage(server_decides=True)]
        await page.evaluate("() => { chorus.mic.socket = null; chorus.mic.startMessage = null; }")
