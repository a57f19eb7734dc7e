"""Someone talking over the assistant's reply (barge-in), through the running server: a Twilio
caller, and a room's device (the page) that stopped the reply itself and says so.

The reply comes from the local OpenAI-Realtime-protocol server (6 s of audio), the words from
the local Deepgram-protocol server, the leg is the server's own Twilio client. What is checked
is what a phone bridge owes its caller: the reply still playing is cleared (`clear`, Twilio's
message for dropping what it has buffered), the model stops the response it is still making
(`response.cancel`) and keeps only what was heard of it (`conversation.item.truncate`), and
what the caller said over it reaches the STT
(a phone leg is gated while a reply plays, V9, and its own barge-in lifts the gate at once with
the half second it held: `StreamDeclaration.echo_gate`), while a phone that sends the reply back
is not heard: under the barge-in floor, or over it and no louder than an echo of the reply can be
(the double-talk check). The SIP leg's barge-in is `tests/test_server_sip.py`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from realtime.testing.openai_server import OpenAIRealtimeServer
from server.auth import issue_token
from server.client import DeviceStream, TwilioLeg
from server.pipeline import VoicePipeline
from server.protocol import (
    FeedMessage,
    ReplyMessage,
    ReplyStoppedMessage,
    StartedMessage,
    StartMessage,
)
from server.testing.harness import (
    SECRET,
    RunningServer,
    answering,
    eventually,
    running_server_with_local_stt,
)
from voice.audio import float_to_pcm16, level_dbfs, mulaw_encode, read_audio_16k, resample
from voice.channel import VoiceChannel
from voice.testing.deepgram_server import ConnectionState, MeetingWords

pytestmark = pytest.mark.asyncio

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
ROOM = "standup"
BOUND_S = 120.0


def excerpt(start: float, end: float, silence: float = 0.0) -> np.ndarray:
    """An excerpt of the meeting (16 kHz), then `silence`."""
    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    return np.concatenate([audio, np.zeros(int(silence * 16000), np.float32)])


def phone_audio(start: float, end: float, silence: float = 0.0, gain_db: float = 0.0) -> bytes:
    """An excerpt of the meeting as a phone line carries it (8 kHz µ-law), then `silence`;
    `gain_db` louder."""
    louder = (excerpt(start, end, silence) * 10 ** (gain_db / 20)).astype(np.float32)
    narrow = resample(louder, 16000, 8000)
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


def voiced_s(connection: ConnectionState) -> float:
    """Seconds of the audio an STT connection received that are not silence (V9 silences with
    zeros)."""
    return int(np.count_nonzero(np.frombuffer(bytes(connection.audio), "<i2"))) / 16000


class Desk:
    """A device in the room that plays the reply: what it received before the room's
    `reply_stopped`, and the audio that came after it (none should)."""

    def __init__(self, voice: VoiceChannel) -> None:
        self.voice = voice
        """The server's voice channel (in this process): its playback window silences the desk."""
        self.stream: DeviceStream | None = None
        self.stopped: list[ReplyStoppedMessage] = []
        self.audio_at_stop = 0
        self.silenced_after_stop_s: float | None = None

    def on_message(self, message: FeedMessage) -> None:
        if isinstance(message, ReplyStoppedMessage) and self.stream is not None:
            self.stopped.append(message)
            self.audio_at_stop = len(self.stream.audio_received)
            now = asyncio.get_running_loop().time()
            self.silenced_after_stop_s = self.voice.playing_until(ROOM) - now

    @property
    def audio_after_stop(self) -> int:
        assert self.stream is not None
        return len(self.stream.audio_received) - self.audio_at_stop


async def test_a_twilio_caller_talking_over_a_reply_clears_it_and_is_heard() -> None:
    """...and the reply stops for the whole room: another caller's Twilio is sent `clear`, a
    device in the room hears `reply_stopped` (naming Dana's stream) and none of the reply
    after it."""
    # a 20 s reply made at four times real time: still being made when Dana talks, and ahead of
    # what has played, so the model is told both to stop and to keep only what was heard
    async with OpenAIRealtimeServer(replies=["A long answer."], reply_audio_seconds=20.0,
                                    audio_pace=4.0) as model:  # fmt: skip
        config = answering(model.base_url, "Dana")
        words = MeetingWords.from_meeting(MEETING)
        async with running_server_with_local_stt(config, words) as srv:
            token = issue_token(SECRET, ROOM)
            dana = await TwilioLeg.open(srv.base, {"room": ROOM, "token": token, "name": "Dana"})
            erin = await TwilioLeg.open(srv.base, {"room": ROOM, "token": token, "name": "Erin"})
            assert isinstance(srv.server.pipeline, VoicePipeline)
            desk = Desk(srv.server.pipeline.shared_voice)
            desk.stream = await DeviceStream.open(srv.base, ROOM, token, StartMessage(
                participant="desk", name="Desk", sample_rate=16000, shared_mic=False),
                on_message=desk.on_message)  # fmt: skip
            try:
                # "Good morning everyone." and 3 s of quiet: the stand-in's words run on by
                # time, so its final needs the quiet past the script's next words to close the
                # turn; the model answers Dana
                await dana.send_mulaw(phone_audio(0.6, 2.0, 3.0), realtime=False)

                def events(kind: str) -> list[dict[str, object]]:
                    return [m for m in dana.received if m.get("event") == kind]

                await eventually(lambda: len(events("media")) >= 5, BOUND_S, "the reply's audio")
                assert events("clear") == []
                # Dana talks over it, at the pace a phone sends
                await dana.send_mulaw(phone_audio(2.0, 3.5))
                await eventually(lambda: len(events("clear")) == 1, BOUND_S, "a clear")
                assert srv.server.metrics.barge_ins_total["twilio"] == 1
                # Erin, on another phone in the room, was hearing it too: cleared as well
                await eventually(lambda: any(m.get("event") == "clear" for m in erin.received),
                                 BOUND_S, "Erin's clear")  # fmt: skip
                # her Twilio dropped what it had not played and sent every mark back at once

                def marks_received() -> set[str]:
                    return {m["mark"]["name"] for m in erin.received if m.get("event") == "mark"}

                await eventually(lambda: set(erin.marks_sent) == marks_received(), BOUND_S,
                                 "Erin's marks back")  # fmt: skip
                await eventually(lambda: len(desk.stopped) == 1, BOUND_S, "reply_stopped")
                dana_stream = srv.server.rooms.rooms[ROOM].streams
                assert desk.stopped[0].stream in dana_stream
                assert dana_stream[desk.stopped[0].stream].declaration.name == "Dana"
                # from then on the desk's microphone is silenced only for the echo of what was
                # in the air, not for the rest of the reply made so far (V9)
                assert desk.silenced_after_stop_s is not None
                assert desk.silenced_after_stop_s <= desk.voice.echo_tail
                # the model was still making the reply: it is told to stop
                await eventually(lambda: len(model.cancelled) == 1, BOUND_S, "response.cancel")
                # and its context keeps only what the room heard of the reply
                await eventually(lambda: len(model.truncated) == 1, BOUND_S, "the truncate")
                assert 0 < model.truncated[0][1] < 20_000
                assert srv.stt_server is not None

                stt = srv.stt_server  # Dana's: the only stream that sends audio
                # the 1.4 s before the reply and the 1.5 s over it, none of it silenced
                await eventually(lambda: max(map(voiced_s, stt.connections)) >= 1.4 + 1.5 - 0.2,
                                 BOUND_S, "the words over it")  # fmt: skip
                # none of the rest of the reply reached the room after it was stopped
                assert desk.audio_after_stop == 0
            finally:
                await dana.stop()
                await erin.stop()
                await desk.stream.stop()


@contextlib.asynccontextmanager
async def dana_on_the_phone(
    reply_voice: bytes | None = None,
) -> AsyncIterator[tuple[OpenAIRealtimeServer, RunningServer, TwilioLeg, ConnectionState]]:
    """Dana on a Twilio leg has said her first words (1.4 s) and the model's 6 s reply (a tone,
    or `reply_voice`) has begun to play to her: the model, the server, her leg and her STT
    connection."""
    async with OpenAIRealtimeServer(replies=["A long answer."], reply_audio_seconds=6.0,
                                    reply_voice=reply_voice) as model:  # fmt: skip
        words = MeetingWords.from_meeting(MEETING)
        async with running_server_with_local_stt(answering(model.base_url, "Dana"), words) as srv:
            token = issue_token(SECRET, ROOM)
            dana = await TwilioLeg.open(srv.base, {"room": ROOM, "token": token, "name": "Dana"})
            try:
                await dana.send_mulaw(phone_audio(0.6, 2.0, 3.0), realtime=False)
                await eventually(
                    lambda: sum(m.get("event") == "media" for m in dana.received) >= 5,
                    BOUND_S, "the reply's audio",
                )  # fmt: skip
                assert srv.stt_server is not None
                [connection] = srv.stt_server.connections
                yield model, srv, dana, connection
            finally:
                await dana.stop()


async def test_a_phone_sending_the_reply_back_is_not_heard_while_it_plays() -> None:
    """V9 on a phone leg: while the reply plays, Dana's phone sends back speech 30 dB down (a
    phone whose echo control is weak; under the barge-in floor, so nothing stops the reply):
    none of it reaches the STT, so none of it can be written as her words. What she said before
    the reply is heard; what she says after it is too."""
    async with dana_on_the_phone() as (_, srv, dana, connection):
        before = voiced_s(connection)  # her first words
        assert before >= 1.4 - 0.1
        # the reply's echo while it plays: 3 s, then the reply ends
        await dana.send_mulaw(phone_audio(4.7, 7.7, gain_db=-30.0))
        await srv.until_reply_played(ROOM)
        # her own words after it: heard
        await dana.send_mulaw(phone_audio(9.27, 10.27))
        await eventually(lambda: voiced_s(connection) >= before + 1.0 - 0.1, BOUND_S,
                         "her words")  # fmt: skip
        assert voiced_s(connection) < before + 1.0 + 0.3  # none of the echo
        assert sum(srv.server.metrics.barge_ins_total.values()) == 0


def at_level(audio: np.ndarray, dbfs: float) -> np.ndarray:
    """`audio` brought to `dbfs` (RMS)."""
    return (audio * 10 ** ((dbfs - level_dbfs(audio)) / 20)).astype(np.float32)


async def test_a_phone_echoing_the_reply_over_the_floor_does_not_stop_it() -> None:
    """A phone whose echo control is weaker still: while a spoken reply plays (−14 dBFS),
    Dana's phone sends it back 20 dB down, over the barge-in floor, and it is speech. Measured
    against the reply as it played to her (the double-talk check), it is no louder than an echo
    can be: the reply is not stopped and none of the echo reaches the STT. Without the check
    the echo stopped the reply, the gate was lifted, and it was transcribed as her words."""
    reply = at_level(excerpt(41.41, 47.41), -14.0)  # the meeting's later turns: a voice
    voice = float_to_pcm16(resample(reply, 16000, 24000))
    async with dana_on_the_phone(voice) as (model, srv, dana, connection):
        before = voiced_s(connection)
        # the reply's first 4 s coming back as it plays, 20 dB down
        echo = resample(reply[: 4 * 16000], 16000, 8000) * 10 ** (-20 / 20)
        await dana.send_mulaw(mulaw_encode(np.frombuffer(float_to_pcm16(echo), "<i2")))
        await srv.until_reply_played(ROOM)
        assert sum(srv.server.metrics.barge_ins_total.values()) == 0
        assert model.cancelled == []
        assert voiced_s(connection) < before + 0.1  # none of the echo


@contextlib.asynccontextmanager
async def dana_at_her_desk(
    audio_pace: float = 0.0, echo_cancelled: bool = False, server_barge_in: bool = False
) -> AsyncIterator[tuple[OpenAIRealtimeServer, RunningServer, DeviceStream]]:
    """A room whose model answers Dana with a 20 s reply ("A long answer.") made at `audio_pace`
    times real time (0: at once), and Dana's own device in the room (`echo_cancelled`: one
    that cancels the reply's echo itself; `server_barge_in`: one that leaves the barge-in to
    the server)."""
    async with OpenAIRealtimeServer(replies=["A long answer."], reply_audio_seconds=20.0,
                                    audio_pace=audio_pace) as model:  # fmt: skip
        words = MeetingWords.from_meeting(MEETING)
        async with running_server_with_local_stt(answering(model.base_url, "Dana"), words) as srv:
            token = issue_token(SECRET, ROOM)
            desk = await DeviceStream.open(srv.base, ROOM, token, StartMessage(
                participant="desk", name="Dana", sample_rate=16000, shared_mic=False,
                echo_cancelled=echo_cancelled, server_barge_in=server_barge_in))  # fmt: skip
            try:
                yield model, srv, desk
            finally:
                await desk.stop()


async def test_a_device_that_stopped_the_reply_is_heard_at_once_and_the_model_is_told() -> None:
    """The page stops the reply it plays when someone talks over it and sends `barge_in`: the
    device's microphone, silenced while the reply plays (V9), is heard again at once, the
    speech that made the page stop it (its first 0.3 s, sent while the reply played) included;
    the model stops its response and keeps only what was heard; counted as a device barge-in.
    A `barge_in` while nothing plays is not taken."""
    async with dana_at_her_desk(audio_pace=4.0) as (model, srv, desk):
        await desk.barge_in()  # nothing plays: not taken (not counted, nothing stops) ...

        def stops() -> list[ReplyStoppedMessage]:
            return [m for m in desk.received if isinstance(m, ReplyStoppedMessage)]

        await eventually(lambda: len(stops()) == 1, BOUND_S)  # ... but answered
        await desk.send_audio(float_to_pcm16(excerpt(0.6, 2.0, 3.0)), realtime=False)
        await eventually(lambda: len(desk.audio_received) >= 16000, BOUND_S, "the reply")
        assert srv.server.metrics.barge_ins_total["device"] == 0
        assert srv.stt_server is not None

        connection = srv.stt_server.connections[0]
        before = voiced_s(connection)
        # the page hears someone for its hold time while the reply plays, then says so
        await desk.send_audio(float_to_pcm16(excerpt(2.0, 2.3)), realtime=False)
        await desk.barge_in()
        await eventually(lambda: srv.server.metrics.barge_ins_total["device"] == 1, BOUND_S)
        # the room's reply_stopped comes back, naming this stream; no reply audio after it
        await eventually(lambda: len(stops()) == 2, BOUND_S)
        stopped = stops()[-1]
        [started] = [m for m in desk.received if isinstance(m, StartedMessage)]
        assert stopped.stream == started.stream
        audio_at_stop = len(desk.audio_received)
        await desk.send_audio(float_to_pcm16(excerpt(2.3, 3.5)), realtime=False)
        # all 1.5 s heard, though the 20 s reply's playback window is still open
        await eventually(lambda: voiced_s(connection) >= before + 1.5 - 0.05, BOUND_S, "the words")
        await eventually(lambda: len(model.cancelled) == 1, BOUND_S, "response.cancel")
        await eventually(lambda: len(model.truncated) == 1, BOUND_S, "the truncate")
        assert len(desk.audio_received) == audio_at_stop


async def test_a_reply_talked_over_after_it_was_posted_comes_again_as_heard() -> None:
    """A 20 s reply the model made at once (posted, then still playing) is talked over: the
    room's record of it is cut to what was heard, and devices and the feed get it again as a
    `reply` with the same `event_id`, `corrected` and `interrupted`."""
    async with dana_at_her_desk() as (model, srv, desk):
        await desk.send_audio(float_to_pcm16(excerpt(0.6, 2.0, 3.0)), realtime=False)

        def replies() -> list[ReplyMessage]:
            return [m for m in desk.received if isinstance(m, ReplyMessage)]

        await eventually(lambda: len(replies()) == 1, BOUND_S, "the reply")
        [first] = replies()
        assert first.text == "A long answer." and not first.corrected
        await desk.barge_in()
        await eventually(lambda: len(replies()) == 2, BOUND_S, "the reply as heard")
        heard = replies()[1]
        assert heard.event_id == first.event_id and heard.corrected and heard.interrupted
        assert heard.text == "A…"
        await eventually(lambda: len(model.truncated) == 1, BOUND_S, "the truncate")
        assert srv.server.metrics.replies_total == 1  # the same reply, not a new one


@pytest.mark.parametrize("declared", ["echo_cancelled", "server_barge_in"])
async def test_a_device_the_server_hears_over_the_reply_is_stopped_by_its_rule(
    declared: str,
) -> None:
    """A device that declares `echo_cancelled` (a speakerphone with echo cancellation) is not
    silenced while the reply plays; one that declares `server_barge_in` (the page with the
    browser's echo cancellation on) is (V9), so what comes back of the reply under the rule's
    floor is not transcribed. On both the server hears Dana talk over the reply itself (its rule,
    `ECHO_CANCELLED_BARGE_IN_S` of speech): the reply stops (`reply_stopped`, which the page
    waits for), the model is told, and all she said is transcribed (the silenced device: the
    half second held back before the barge-in included)."""
    silenced = declared == "server_barge_in"
    async with dana_at_her_desk(audio_pace=4.0, echo_cancelled=not silenced,
                                server_barge_in=silenced) as (model, srv, desk):  # fmt: skip
        await desk.send_audio(float_to_pcm16(excerpt(0.6, 2.0, 3.0)), realtime=False)
        await eventually(lambda: len(desk.audio_received) >= 16000, BOUND_S, "the reply")
        assert srv.stt_server is not None
        connection = srv.stt_server.connections[0]
        before = voiced_s(connection)
        if silenced:  # what the echo cancellation left of the reply: speech 30 dB down, 1.5 s
            quiet = (excerpt(4.7, 6.2) * 10 ** (-30 / 20)).astype(np.float32)
            await desk.send_audio(float_to_pcm16(quiet))
            assert srv.server.metrics.barge_ins_total["device"] == 0
            assert not any(isinstance(m, ReplyStoppedMessage) for m in desk.received)
        await desk.send_audio(float_to_pcm16(excerpt(2.0, 3.5)))  # over the reply, at real time
        await eventually(lambda: srv.server.metrics.barge_ins_total["device"] == 1, BOUND_S)
        await eventually(lambda: any(isinstance(m, ReplyStoppedMessage) for m in desk.received),
                         BOUND_S, "reply_stopped")  # fmt: skip
        await eventually(lambda: voiced_s(connection) >= before + 1.5 - 0.05, BOUND_S, "the words")
        if silenced:
            assert voiced_s(connection) < before + 1.5 + 0.45  # at most the held echo's tail
        await eventually(lambda: len(model.cancelled) == 1, BOUND_S, "response.cancel")
        await eventually(lambda: len(model.truncated) == 1, BOUND_S, "the truncate")
