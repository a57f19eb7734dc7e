"""Issue 27.3: the voice directory over HTTP on a real server — remember a room's speaker (the
room's `admin` grant; refused below `voices.min_speech_s`), enroll from a clip, list and forget
(a server-wide admin token only: `chorus token '*' --grant admin`), never an embedding in any
answer; forgetting in a running room turns that voice's next turn back into its letter."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
from collections.abc import AsyncIterator
from typing import Any, ClassVar

import httpx
import numpy as np
import pytest
import soundfile as sf

from rooms import RoomKit
from server.auth import Grant, issue_token
from server.client import DeviceStream, EventFeed
from server.protocol import RenamedMessage, StartMessage
from server.testing.harness import (
    SECRET,
    RunningServer,
    eventually,
    running_server_with_local_stt,
    tone,
)
from voice.diarization_stage import (
    Audio,
    SpeakerSegment,
    SpeakerTimeline,
    StageAbilities,
    StagePrints,
)
from voice.identify import TURN_MIN_S
from voice.testing.deepgram_server import ScriptedWords, SpokenWord

ROOM = "voices-room"
MODEL = "scripted-prints"
IAN = np.eye(8, dtype=np.float32)[0]


class PrintedStage:
    """A scripted stage: every voice is `Speaker A`, whose print and speech are what the test
    says (`heard`); clips print as `IAN` when they hold a second or more of audio."""

    sample_rate = 16000
    abilities = StageAbilities(speaker_prints=True, anchors=True)
    heard: StagePrints = StagePrints(MODEL)
    made: ClassVar[list[PrintedStage]] = []
    turn_print: ClassVar[Audio] = IAN
    """What a turn's audio prints as (the directory's per-turn check, `[voices] verify`)."""
    turn_seconds: ClassVar[list[float]] = []

    def __init__(self) -> None:
        self.fed = 0
        self.anchors: list[dict[str, Audio]] = []
        PrintedStage.made.append(self)

    def anchor(self, prints: dict[str, Audio]) -> None:
        self.anchors.append(prints)

    def feed(self, audio: Audio) -> SpeakerTimeline:
        self.fed += len(audio)
        return SpeakerTimeline([SpeakerSegment(0.0, self.fed / 16000, "Speaker A")])

    def speaker_prints(self) -> StagePrints:
        return PrintedStage.heard

    @property
    def live_model(self) -> str:
        return MODEL

    def live_voiceprint(self, audio: Audio) -> Audio:
        if len(audio) < 16000:
            raise ValueError("enrollment audio holds 0.5 s of speech; at least 1 s is needed")
        return IAN

    def turn_voiceprint(self, audio: Audio) -> Audio:
        PrintedStage.turn_seconds.append(len(audio) / 16000)
        return PrintedStage.turn_print

    def diarize(
        self, audio: Audio, *, num_speakers: int | None = None, max_speakers: int | None = None
    ) -> SpeakerTimeline:
        return SpeakerTimeline()

    def enroll(self, name: str, audio: Audio) -> None:
        raise NotImplementedError

    def forget(self, name: str) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        self.fed = 0


WORDS = ScriptedWords(
    [
        [SpokenWord("first", 0.3, 0.8)],
        [SpokenWord("second", 3.0, 3.5)],
        [SpokenWord("third", 6.0, 6.5)],
    ]
)


@contextlib.asynccontextmanager
async def directory_server(
    enabled: bool = True, kit: RoomKit | None = None, words: ScriptedWords = WORDS, **voices: Any
) -> AsyncIterator[tuple[RunningServer, httpx.AsyncClient]]:
    """A server whose shared-mic streams run on `PrintedStage` and hear `words`, its directory
    `enabled` with `[voices]` `voices`, on `kit`'s store (memory by default)."""
    PrintedStage.heard = StagePrints(MODEL)
    PrintedStage.made.clear()
    PrintedStage.turn_print = IAN
    PrintedStage.turn_seconds.clear()
    config: dict[str, Any] = {
        "stt": {"diarize": False}, "voices": {"enabled": enabled, **voices}
    }
    async with running_server_with_local_stt(
        config, words, stage_factory=PrintedStage, kit=kit
    ) as srv:
        async with httpx.AsyncClient(base_url=srv.http_base, timeout=30) as http:
            yield srv, http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


SERVER_ADMIN = bearer(issue_token(SECRET, "*", grants=[Grant.ADMIN]))
ROOM_ADMIN = bearer(issue_token(SECRET, ROOM, grants=[Grant.ADMIN]))


async def spoken(device: DeviceStream, feed: EventFeed, seconds: float, why: str) -> str | None:
    """One more turn of `seconds` of audio from the device: the name it reached the feed under."""
    n = len(feed.turns) + 1
    await device.send_audio(tone(seconds), realtime=False)
    await eventually(lambda: len(feed.turns) == n, 60, why)
    return feed.turns[-1].speaker


def clip(seconds: float) -> str:
    buffer = io.BytesIO()
    sf.write(buffer, np.frombuffer(tone(seconds), dtype=np.int16), 16000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def no_vectors(body: Any) -> None:
    text = json.dumps(body)
    for word in ("vector", "embedding", 'voiceprint"'):
        assert word not in text


async def test_remember_names_the_speaker_and_forgetting_turns_it_back_into_a_letter() -> None:
    async with directory_server() as (server, http):
        token = issue_token(SECRET, ROOM)
        feed = await EventFeed.open(server.base, ROOM, token)
        device = await DeviceStream.open(server.base, ROOM, token, StartMessage(participant="desk"))
        assert await spoken(device, feed, 2.0, "the first turn") == "Speaker A"

        PrintedStage.heard = StagePrints(MODEL, {"Speaker A": IAN}, {"Speaker A": 3.0})
        body = {"label": "Speaker A", "name": "Ian"}
        short = await http.post(
            f"/v1/rooms/{ROOM}/speakers/remember", json=body, headers=ROOM_ADMIN
        )
        assert short.status_code == 422 and short.json()["problem"] == "not_enough_speech"
        assert "3.0 s" in short.json()["detail"] and "5 s" in short.json()["detail"]

        PrintedStage.heard = StagePrints(MODEL, {"Speaker A": IAN}, {"Speaker A": 6.0})
        for refused, status in (
            (bearer(token), 403),  # no admin grant
            (bearer(issue_token(SECRET, "other", grants=[Grant.ADMIN])), 403),
            ({}, 401),
        ):
            answer = await http.post(
                f"/v1/rooms/{ROOM}/speakers/remember", json=body, headers=refused
            )
            assert answer.status_code == status, answer.text
        unknown = await http.post(
            f"/v1/rooms/{ROOM}/speakers/remember",
            json={"label": "Speaker Q", "name": "Ian"},
            headers=ROOM_ADMIN,
        )
        assert unknown.status_code == 404 and unknown.json()["problem"] == "unknown_speaker"

        remembered = await http.post(
            f"/v1/rooms/{ROOM}/speakers/remember", json=body, headers=ROOM_ADMIN
        )
        assert remembered.status_code == 201, remembered.text
        answer = remembered.json()
        no_vectors(answer)
        assert answer["name"] == "Ian" and answer["voice"]["prints"] == 1
        await eventually(
            lambda: any(isinstance(m, RenamedMessage) and m.name == "Ian" for m in feed.received),
            30,
            "renamed",
        )

        assert await spoken(device, feed, 2.5, "the second turn") == "Ian"

        listed = await http.get("/v1/voices", headers=SERVER_ADMIN)
        assert listed.status_code == 200
        no_vectors(listed.json())
        [ian] = listed.json()
        assert set(ian) == {"id", "name", "prints", "created", "last_heard"}
        assert ian["name"] == "Ian" and ian["prints"] == 1

        forgotten = await http.delete(f"/v1/voices/{ian['id']}", headers=SERVER_ADMIN)
        assert forgotten.status_code == 200 and forgotten.json() == {
            "id": ian["id"],
            "deleted": True,
        }
        # the running room forgot the voice
        assert await spoken(device, feed, 3.0, "the third turn") == "Speaker A"
        assert (await http.get("/v1/voices", headers=SERVER_ADMIN)).json() == []
        again = await http.delete(f"/v1/voices/{ian['id']}", headers=SERVER_ADMIN)
        assert again.status_code == 404
        async with asyncio.timeout(60):
            await device.stop()
        await feed.close()
        for message in feed.received:
            no_vectors(message.model_dump())


async def test_only_a_server_wide_admin_token_reads_or_changes_the_directory() -> None:
    async with directory_server() as (_, http):
        room_tokens = [ROOM_ADMIN, bearer(issue_token(SECRET, ROOM))]
        not_admin = bearer(issue_token(SECRET, "*", grants=[Grant.FEED]))
        for headers in [*room_tokens, not_admin]:
            for answer in (
                await http.get("/v1/voices", headers=headers),
                await http.post(
                    "/v1/voices", json={"name": "Ian", "audio": clip(2)}, headers=headers
                ),
                await http.delete("/v1/voices/voice-1", headers=headers),
            ):
                assert answer.status_code == 403, answer.text
        assert "server-wide" in (await http.get("/v1/voices", headers=ROOM_ADMIN)).text
        assert (await http.get("/v1/voices")).status_code == 401

        added = await http.post(
            "/v1/voices", json={"name": "Ian", "audio": clip(2)}, headers=SERVER_ADMIN
        )
        assert added.status_code == 201, added.text
        no_vectors(added.json())
        again = await http.post(
            "/v1/voices", json={"name": "Ian", "audio": clip(3)}, headers=SERVER_ADMIN
        )
        assert again.json()["id"] == added.json()["id"] and again.json()["prints"] == 2
        short = await http.post(
            "/v1/voices", json={"name": "Ian", "audio": clip(0.5)}, headers=SERVER_ADMIN
        )
        assert short.status_code == 422 and "speech" in short.json()["detail"]
        for bad in ("not base64!", base64.b64encode(b"not audio at all").decode()):
            answer = await http.post(
                "/v1/voices", json={"name": "Ian", "audio": bad}, headers=SERVER_ADMIN
            )
            assert answer.status_code == 422 and answer.json()["problem"] == "bad_audio"
        spec = (await http.get("/openapi.json")).json()
        assert {"/v1/voices", "/v1/voices/{voice_id}", "/v1/rooms/{room}/speakers/remember"} <= set(
            spec["paths"]
        )


async def test_every_stream_stage_starts_from_the_directory_and_hears_a_forget() -> None:
    async with directory_server() as (server, http):
        added = await http.post(
            "/v1/voices", json={"name": "Ian", "audio": clip(2)}, headers=SERVER_ADMIN
        )
        ian = added.json()["id"]
        token = issue_token(SECRET, ROOM)
        device = await DeviceStream.open(server.base, ROOM, token, StartMessage(participant="desk"))
        await device.send_audio(tone(0.5), realtime=False)
        # the first stage made printed the clip; the second is the stream's
        await eventually(lambda: len(PrintedStage.made) == 2, 60, "the stream's stage")
        stage = PrintedStage.made[-1]
        await eventually(lambda: bool(stage.anchors), 30, "anchors")
        assert list(stage.anchors[-1]) == [ian]
        assert np.allclose(stage.anchors[-1][ian], IAN)
        async with asyncio.timeout(60):
            await device.stop()
        # its stream ended: the pooled stage holds nobody's print while idle
        await eventually(lambda: stage.anchors[-1] == {}, 30, "the idle stage let go")
        again = await DeviceStream.open(server.base, ROOM, token, StartMessage(participant="desk"))
        await eventually(lambda: list(stage.anchors[-1]) == [ian], 30, "anchored again")
        assert len(PrintedStage.made) == 2  # the same stage, from the room's pool
        await http.delete(f"/v1/voices/{ian}", headers=SERVER_ADMIN)
        assert stage.anchors[-1] == {}
        async with asyncio.timeout(60):
            await again.stop()


async def test_a_turn_of_a_named_voice_that_sounds_like_someone_else_reads_its_letter() -> None:
    """`[voices] verify` through a running server: the rename hook prints each turn of a voice
    the directory named, from the stream's own audio over the turn, off the loop. A turn under
    `TURN_MIN_S` (a word, most often at a change of speaker, where the stage's voices mix)
    cannot show it is the person: it reads the letter too, unprinted."""
    words = ScriptedWords([*WORDS.finals, [SpokenWord("yes", 9.0, 9.3)]])
    async with directory_server(words=words) as (server, http):
        await http.post("/v1/voices", json={"name": "Ian", "audio": clip(2)}, headers=SERVER_ADMIN)
        PrintedStage.heard = StagePrints(MODEL, {"Speaker A": IAN}, {"Speaker A": 3.0})
        token = issue_token(SECRET, ROOM)
        feed = await EventFeed.open(server.base, ROOM, token)
        device = await DeviceStream.open(server.base, ROOM, token, StartMessage(participant="desk"))
        assert await spoken(device, feed, 2.5, "the first turn") == "Ian"
        assert PrintedStage.turn_seconds[-1] >= TURN_MIN_S  # printed from the turn's audio
        PrintedStage.turn_print = np.eye(8, dtype=np.float32)[1]  # someone else's words
        assert await spoken(device, feed, 2.5, "a turn that is not Ian's") == "Speaker A"
        metrics = (await http.get("/metrics")).text
        assert "chorus_voice_turns_unmatched_total 1.0" in metrics
        assert "chorus_voice_turns_claimed_total 0.0" in metrics  # nobody else named here
        PrintedStage.turn_print = IAN
        assert await spoken(device, feed, 2.5, "Ian again") == "Ian"
        printed = len(PrintedStage.turn_seconds)
        assert await spoken(device, feed, 2.5, "a one-word turn") == "Speaker A"
        assert len(PrintedStage.turn_seconds) == printed  # not printed: too little audio
        assert "chorus_voice_turns_unmatched_total 2.0" in (await http.get("/metrics")).text
        async with asyncio.timeout(60):
            await device.stop()
        await feed.close()


@pytest.mark.parametrize("route", ["/v1/voices"])
async def test_the_directory_is_off_unless_enabled(route: str) -> None:
    async with directory_server(enabled=False) as (_, http):
        answer = await http.get(route, headers=SERVER_ADMIN)
        assert answer.status_code == 404 and answer.json()["problem"] == "not_configured"
        remember = await http.post(
            f"/v1/rooms/{ROOM}/speakers/remember",
            json={"label": "Speaker A", "name": "Ian"},
            headers=ROOM_ADMIN,
        )
        assert remember.status_code == 404
