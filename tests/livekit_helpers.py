"""Helpers for the LiveKit tests: real LiveKit media objects without a server.

- `TrackPlayer`: a real `rtc.AudioSource` feeding a real `rtc.LocalAudioTrack`; the worker reads it
  through `rtc.AudioStream.from_track`, exactly as it reads a subscribed remote track. The native
  side plays the source out in real time, so a clip takes its own duration to arrive.
- `FakeRoom`: an `rtc.Room` (the real event emitter) that is never connected: tests make it emit
  the real events (`track_subscribed`, `track_unsubscribed`, `participant_disconnected`) with real
  participant and publication objects built from LiveKit's own protobuf messages.
- `RecordingLocalParticipant`: the two local-participant calls the agent makes (`stream_text`,
  `publish_track`), recorded.
- `RecordingsWords`: a Deepgram-protocol word source for several reference recordings (the demo
  meeting, a shared fixture), so the real Deepgram client is the STT.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import soundfile as sf
from livekit import rtc
from livekit.rtc._proto import handle_pb2, participant_pb2, track_pb2

from voice.testing.deepgram_server import ConnectionState, MeetingWords, SpokenWord, WordSource

MEETING_DIR = Path(__file__).resolve().parents[1] / "examples" / "meeting"
RATE = 16000


def meeting_pcm() -> npt.NDArray[np.int16]:
    audio, rate = sf.read(MEETING_DIR / "meeting.wav", dtype="int16")
    assert rate == RATE
    return np.asarray(audio, np.int16)


def clip(audio: npt.NDArray[np.int16], start: float, end: float) -> npt.NDArray[np.int16]:
    return audio[int(start * RATE) : int(end * RATE)]


# ------------------------------------------------------------------ word sources


def rttm_words(audio_path: Path, rttm_path: Path, word_seconds: float = 0.4) -> MeetingWords:
    """A reference recording whose "words" are its RTTM segments cut into `word_seconds` pieces
    named after the segment's speaker (the fixtures have speaker timelines, not transcripts)."""
    audio, rate = sf.read(audio_path, dtype="int16")
    assert rate == RATE
    words: list[SpokenWord] = []
    for line in rttm_path.read_text().splitlines():
        parts = line.split()
        if not parts or parts[0] != "SPEAKER":
            continue
        start, duration, speaker = float(parts[3]), float(parts[4]), parts[7]
        count = max(1, int(duration / word_seconds))
        for i in range(count):
            w0 = start + i * duration / count
            w1 = w0 + duration / count * 0.8
            words.append(SpokenWord(f"{speaker}w{i}", round(w0, 3), round(w1, 3), speaker))
    words.sort(key=lambda w: w.start)
    return MeetingWords(np.asarray(audio, np.int16), words, RATE)


def clip_words(source: MeetingWords, start: float, end: float) -> MeetingWords:
    """The part of a reference recording between `start` and `end` (its words with their middle
    inside, in clip time): a track that plays only that clip says no word beyond it, however
    much silence follows."""
    words = [
        SpokenWord(w.word, round(w.start - start, 3), round(w.end - start, 3), w.speaker,
                   w.punctuated_word, w.confidence)
        for w in source.words if start <= (w.start + w.end) / 2 <= end
    ]
    reference = source.reference[int(start * RATE) : int(end * RATE)]
    return MeetingWords(reference, words, RATE)


@dataclass
class RecordingsWords(WordSource):
    """Several reference recordings: each connection's words come from the one its audio is in.

    A LiveKit audio stream delivers silence until the track's source plays, so the audio a
    connection receives is located after its leading silence (exact zeros), and word times are
    shifted by that lead."""

    sources: list[MeetingWords]
    endpointing: float = 0.3
    max_final: float = 6.0
    placed: dict[int, tuple[MeetingWords, float]] = field(default_factory=dict)

    def finals_for(self, conn: ConnectionState) -> list[list[SpokenWord]] | None:
        placed = self.placed.get(conn.index)
        if placed is None:
            received = conn.audio_int16()
            voiced = np.flatnonzero(received)
            if len(voiced) == 0:
                return None
            lead = int(voiced[0])
            for source in self.sources:
                offset = source.locate(received[lead:])
                if offset is not None:
                    placed = self.placed[conn.index] = (source, (offset - lead) / RATE)
                    break
            else:
                if (len(received) - lead) / RATE >= self.sources[0].align_seconds:
                    self.placed[conn.index] = placed = (self.sources[0], float("inf"))  # no words
                return None
        source, t0 = placed
        keys: dict[object, int] = {}
        groups: list[list[SpokenWord]] = []
        for w in source.words:
            if (w.start + w.end) / 2 < t0:
                continue
            speaker = keys.setdefault(w.speaker, len(keys))  # per connection, first appearance
            word = SpokenWord(w.word, max(0.0, w.start - t0), w.end - t0, speaker,
                              w.punctuated_word, w.confidence)
            if groups and (word.start - max(x.end for x in groups[-1]) < self.endpointing
                           and word.end - groups[-1][0].start <= self.max_final):
                groups[-1].append(word)
            else:
                groups.append([word])
        return groups


# ------------------------------------------------------------------ LiveKit objects


def remote_participant(
    identity: str,
    name: str = "",
    *,
    kind: int = rtc.ParticipantKind.PARTICIPANT_KIND_STANDARD,
    attributes: dict[str, str] | None = None,
) -> rtc.RemoteParticipant:
    info = participant_pb2.ParticipantInfo(
        sid=f"PA_{identity}", identity=identity, name=name, kind=kind,  # type: ignore[arg-type]
        attributes=attributes or {},
    )
    owned = participant_pb2.OwnedParticipant(handle=handle_pb2.FfiOwnedHandle(id=0), info=info)
    return rtc.RemoteParticipant(owned)


def remote_publication(
    sid: str, name: str = "microphone", features: tuple[int, ...] = ()
) -> rtc.RemoteTrackPublication:
    """An audio track's publication; `features`: LiveKit's `AudioTrackFeature`s the client set
    (`TF_ECHO_CANCELLATION`, …)."""
    info = track_pb2.TrackPublicationInfo(
        sid=sid, name=name, kind=track_pb2.TrackKind.KIND_AUDIO,
        source=track_pb2.TrackSource.SOURCE_MICROPHONE,
        audio_features=features,  # type: ignore[arg-type]
    )
    owned = track_pb2.OwnedTrackPublication(handle=handle_pb2.FfiOwnedHandle(id=0), info=info)
    return rtc.RemoteTrackPublication(owned)


class TrackPlayer:
    """A real audio source and track; `play` queues PCM16 (16 kHz mono) for real-time playout."""

    def __init__(self, name: str = "mic") -> None:
        self.source = rtc.AudioSource(RATE, 1, queue_size_ms=120_000)
        self.track = rtc.LocalAudioTrack.create_audio_track(name, self.source)

    async def play(self, pcm: npt.NDArray[np.int16]) -> None:
        """Queue the whole clip in one capture, padded to whole 10 ms frames. Queued 10 ms at a
        time, a stall of the event loop between two captures (a loaded machine) let the native
        side run dry and play silence into the middle of the clip; the Deepgram-protocol stand-in
        then found no recording in the audio and sent no words at all."""
        step = RATE // 100
        pcm = np.pad(pcm, (0, -len(pcm) % step))
        await self.source.capture_frame(rtc.AudioFrame(pcm.tobytes(), RATE, 1, len(pcm)))

    async def played(self) -> None:
        await self.source.wait_for_playout()

    async def aclose(self) -> None:
        await self.source.aclose()


@dataclass
class RecordedWriter:
    topic: str
    attributes: dict[str, str]
    sender_identity: str | None
    chunks: list[str] = field(default_factory=list)
    closed: bool = False

    async def write(self, text: str) -> None:
        assert not self.closed
        self.chunks.append(text)

    async def aclose(self, *, reason: str = "", attributes: dict[str, str] | None = None) -> None:
        self.closed = True

    @property
    def text(self) -> str:
        return "".join(self.chunks)


class RecordingLocalParticipant:
    """Records what the agent publishes (text streams, tracks)."""

    identity = "agent-chorus"

    def __init__(self) -> None:
        self.streams: list[RecordedWriter] = []
        self.tracks: list[tuple[rtc.LocalTrack, rtc.TrackPublishOptions]] = []

    async def stream_text(
        self,
        *,
        topic: str = "",
        attributes: dict[str, str] | None = None,
        sender_identity: str | None = None,
    ) -> RecordedWriter:
        writer = RecordedWriter(topic, dict(attributes or {}), sender_identity)
        self.streams.append(writer)
        return writer

    async def publish_track(
        self, track: rtc.LocalTrack, options: rtc.TrackPublishOptions
    ) -> rtc.LocalTrackPublication:
        """Recorded, and answered as LiveKit does: the track's publication (sid `TR_<name>`)."""
        self.tracks.append((track, options))
        info = track_pb2.TrackPublicationInfo(
            sid=f"TR_{track.name}", name=track.name, kind=track_pb2.TrackKind.KIND_AUDIO,
            source=options.source,
        )
        owned = track_pb2.OwnedTrackPublication(handle=handle_pb2.FfiOwnedHandle(id=0), info=info)
        return rtc.LocalTrackPublication(owned)


class FakeRoom(rtc.Room):
    """A never-connected `rtc.Room` that emits the real events with real objects."""

    def __init__(self, name: str, local: RecordingLocalParticipant) -> None:
        super().__init__()
        self._info.name = name
        self.fake_local = local

    @property
    def local_participant(self) -> Any:
        return self.fake_local

    def join(self, participant: rtc.RemoteParticipant) -> None:
        self._remote_participants[participant.identity] = participant
        self.emit("participant_connected", participant)

    def subscribe(
        self, participant: rtc.RemoteParticipant, track: rtc.Track, sid: str,
        features: tuple[int, ...] = (),
    ) -> rtc.RemoteTrackPublication:
        publication = remote_publication(sid, features=features)
        publication._track = track
        participant._track_publications[sid] = publication
        self.emit("track_subscribed", track, publication, participant)
        return publication

    def unsubscribe(self, participant: rtc.RemoteParticipant, sid: str) -> None:
        publication = participant._track_publications.pop(sid)
        track = publication.track
        publication._track = None
        self.emit("track_unsubscribed", track, publication, participant)

    def leave(self, participant: rtc.RemoteParticipant) -> None:
        self._remote_participants.pop(participant.identity, None)
        participant._track_publications.clear()
        self.emit("participant_disconnected", participant)


async def until(predicate: Any, limit: float = 60.0, step: float = 0.05) -> None:
    """Wait for a condition the system reaches by itself (a failure bound, not a pacing sleep)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not predicate():
        if loop.time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(step)


# ------------------------------------------------------------------ the worker protocol


class FakeLiveKitServer:
    """The agent-worker side of a LiveKit server (`/agent`), speaking LiveKit's own protobuf
    messages (`livekit.protocol.agent`): it checks the worker's JWT, answers its registration,
    and can offer it a job (an `AvailabilityRequest`, as an explicit dispatch does). No media:
    no room can be joined through it."""

    def __init__(self, api_key: str, api_secret: str) -> None:
        self.api_key = api_key
        self.api_secret = api_secret
        self.registrations: asyncio.Queue[Any] = asyncio.Queue()
        self.answers: asyncio.Queue[Any] = asyncio.Queue()
        self.status: list[Any] = []
        self.tokens: list[dict[str, Any]] = []
        self._ws: Any = None
        self._server: Any = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    async def __aenter__(self) -> FakeLiveKitServer:
        from websockets.asyncio.server import serve

        self._server = await serve(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        await self._server.wait_closed()

    async def _handle(self, ws: Any) -> None:
        import jwt
        from livekit.protocol import agent

        if ws.request.path.split("?")[0] != "/agent":
            await ws.close(1008, "not the agent endpoint")
            return
        bearer = ws.request.headers.get("Authorization", "").removeprefix("Bearer ")
        claims = jwt.decode(bearer, self.api_secret, algorithms=["HS256"])
        self.tokens.append(claims)
        self._ws = ws
        async for raw in ws:
            message = agent.WorkerMessage()
            message.ParseFromString(raw)
            kind = message.WhichOneof("message")
            if kind == "register":
                reply = agent.ServerMessage()
                reply.register.worker_id = "AW_test"
                reply.register.server_info.version = "1.9.0"
                await ws.send(reply.SerializeToString())
                await self.registrations.put(message.register)
            elif kind == "availability":
                await self.answers.put(message.availability)
            elif kind == "update_worker":
                self.status.append(message.update_worker)

    async def offer(self, room: str, agent_name: str, job_id: str = "AJ_1") -> Any:
        """Offer the worker a job for `room` (explicit dispatch to `agent_name`); its answer."""
        from livekit.protocol import agent, models

        request = agent.ServerMessage()
        request.availability.job.CopyFrom(agent.Job(
            id=job_id, type=agent.JobType.JT_ROOM, room=models.Room(name=room, sid="RM_1"),
            agent_name=agent_name,
        ))
        await self._ws.send(request.SerializeToString())
        return await self.answers.get()
