"""One LiveKit room as a Chorus room: remote audio tracks in, per-speaker turns and replies out.

`ChorusRoomAgent` is what a `chorus agent` job runs (`livekit_worker.worker` builds it from the
config and the job's `rtc.Room`). It owns, for one LiveKit room:

- a Chorus `RoomKit` room named after the LiveKit room, with one shared `VoiceChannel` (one-person
  participants, and shared microphones whose speakers come from the STT) and, when speakers come
  from the diarization stage, one `VoiceChannel` with its own stage per shared-mic track (a live
  stage follows one stream, as in `chorus serve`);
- one voice session per subscribed remote audio track (`rtc.AudioStream.from_track`, 16 kHz mono
  PCM16 frames straight into `VoiceSession.push`); a track unsubscribed or a participant leaving
  stops reading and `finish()`es the session, which commits the turn in progress once;
- naming (`livekit_worker.participants`): a one-person participant's turns carry no stamped name
  (an `ON_TRANSCRIPTION` hook clears the STT label first, so the room's participant record, the
  LiveKit name, names them, and a rejoining identity keeps it); a shared mic's turns keep their
  speaker labels (STT or stage), which application hooks may rename;
- output: every committed voice turn is published back to the LiveKit room, in commit order, as
  a text stream on `lk.transcription` with the speaker's identity as sender and the attributes
  LiveKit's client components read (`lk.transcribed_track_id`, `lk.transcription_final`,
  `lk.segment_id`) plus the attribution label (`chorus.speaker`); a turn corrected in place is
  published again under the same `lk.segment_id`; the realtime channel (from
  config) gets the labelled lines exactly as in `chorus serve`, and its reply audio, which it
  hands to the room's voice channels (`rooms.AudioSink`, so the playback gate applies), is
  published as the agent's own audio track. In audio mode (`realtime.audio = true`) the realtime
  channel reads each turn's audio from the voice channel that posted it (the track's session, as
  it accepted the audio after the gate) when the turn is delivered: nothing is pushed per frame.
  Each of the model's replies is captioned as the agent (`lk.transcription`, sent as the agent,
  naming the reply track, one segment per response): growing with the words heard while it
  plays, then final as the room keeps it (whole, or cut where someone talked over it);
- the text assistants of the config (`[chat]`'s chat model, `[agent]`'s ACP agent) attached to
  the room as in `chorus serve`: they read the labelled turns, and what they answer is published
  on `lk.chat` (the room's text chat) as the agent;
- the room lives in the configured `[store]`: a later job for the same LiveKit room takes it up
  where it was (its turns, participants and labels), as `chorus serve` does after a restart;
- with `[voices] enabled` (`voices`), the voice directory of that store names each shared-mic
  track's anonymous voices as `chorus serve` names a shared-mic stream's: the same
  `server.voices.VoiceDirectory` (its stage anchored on the directory's people from the first
  window, the tiers on every turn through an `ON_TRANSCRIPTION` hook), one track's session as
  one stream; a suggestion (tier `suggest`) is published as a text stream on
  `chorus.speaker_suggestion` whose text is the feed's `speaker_suggestion` message (JSON), sent
  as the shared mic's identity. The directory is read when the job starts, and again whenever
  another process on the store changes it (`VoiceDirectory.watch`, within `[voices] refresh_s`):
  a person forgotten meanwhile is named no more, from the next turn of the running tracks too.
- overload (issue 31), as in `chorus serve`: the `[diarizer]` overload policy
  (`server.overload.OverloadPolicy`, applied by the same `server.stage_guard.StageGuard`) watches
  every shared-mic track on a stage: a track whose stage falls behind has its step stretched,
  then leaves the stage (its turns take the STT's labels, or its one participant) and comes back
  once the stage keeps up. A shared-mic track subscribed while the policy does not admit is not
  refused (a job cannot turn a track away) but degraded: it runs without a stage until the
  policy admits again (no track in fallback), then its session ends (the turn in progress is
  committed) and a new one starts on a stage, one such track per `recover_after_s`. Each
  change is published as a text stream on `chorus.diarization` whose text is the feed's
  `diarization_status` message (JSON, `server.stage_guard.status_message`), sent as the
  track's participant, with `lk.transcribed_track_id`, `chorus.diarization` (`degraded` /
  `recovered`), `chorus.speakers` (`stt` / `stage`) and, when degraded, `chorus.reason` and
  `chorus.lag_s`.

The LiveKit side is reached only through `rtc.Room` events and two local-participant calls
(`stream_text`, `publish_track`), typed by `LocalParticipantLike`, so tests drive it with real
tracks and a recording local participant (no LiveKit server is obtainable here).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import math
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from livekit import rtc

from livekit_worker.config import LiveKitConfig
from livekit_worker.participants import Speaker, echo_cancelled, speaker_of
from models import EventSource, RoomEvent, TextContent
from realtime import RealtimeChannel
from rooms import (
    AgentStatus,
    Channel,
    HookContext,
    HookResult,
    HookTrigger,
    RoomContext,
    RoomKit,
    VoiceStore,
)
from server.config import DiarizerConfig, VoicesConfig
from server.overload import (
    DiarizationDegraded,
    DiarizationRecovered,
    DiarizationStatus,
    OverloadPolicy,
)
from server.pipeline import VoiceStreamAudio, stop_room_reply
from server.protocol import AssistantStatusMessage, SpeakerSuggestionMessage, dump
from server.reply_audio import BargeIn, ReplyEnvelope, echo_cancelled_barge_in
from server.stage_guard import StageGuard, status_message
from server.voices import Unnamed, VoiceDirectory
from voice.assembler import TurnPolicy
from voice.audio import STT_SAMPLE_RATE, resample
from voice.channel import TranscriptionEvent, VoiceChannel, VoiceSession
from voice.diarization_stage import Anchors, DiarizationStage
from voice.second_pass import SecondPass
from voice.stt.base import SttProvider

log = logging.getLogger(__name__)

TOPIC_TRANSCRIPTION = "lk.transcription"
TOPIC_SUGGESTION = "chorus.speaker_suggestion"
"""Suggestions of the voice directory (tier `suggest`): the text is the `speaker_suggestion`
message of `chorus serve`'s feed (`server.protocol.SpeakerSuggestionMessage`, JSON)."""
TOPIC_DIARIZATION = "chorus.diarization"
"""A shared-mic track left the diarization stage or came back (issue 31): the text is the
`diarization_status` message of `chorus serve`'s feed (`server.protocol.DiarizationStatusMessage`,
JSON); the `ATTRIBUTE_DIARIZATION`, `ATTRIBUTE_SPEAKERS`, `ATTRIBUTE_REASON` and `ATTRIBUTE_LAG`
attributes say the same for clients that read attributes only."""
ATTRIBUTE_DIARIZATION = "chorus.diarization"
"""`degraded` (the track's speakers come from the STT) or `recovered` (from the stage again)."""
ATTRIBUTE_SPEAKERS = "chorus.speakers"
"""Where the track's speakers come from now: `stt` or `stage`."""
ATTRIBUTE_REASON = "chorus.reason"
ATTRIBUTE_LAG = "chorus.lag_s"
"""How far behind its audio the stage was, in seconds (`degraded` only)."""
NOT_ADMITTED = "the diarization stage cannot keep up: no room for another shared-mic track"
"""The reason a shared-mic track subscribed while the stage sheds load runs without one."""
TOPIC_ASSISTANT = "chorus.assistant"
"""A model of the room is away or back (`ON_AGENT_STATUS`): the text is the
`assistant_status` message of `chorus serve`'s feed (`server.protocol.AssistantStatusMessage`,
JSON), sent as the agent; `ATTRIBUTE_ASSISTANT` (and `ATTRIBUTE_REASON`) say the same."""
ATTRIBUTE_ASSISTANT = "chorus.assistant"
"""`unavailable` (what is said waits for the model) or `available` (it answers again)."""
TOPIC_CHAT = "lk.chat"
"""The room's text chat (livekit-agents `TOPIC_CHAT`): the chat model's and the ACP agent's
replies are published there, as the agent."""
ATTRIBUTE_TRACK_ID = "lk.transcribed_track_id"
ATTRIBUTE_FINAL = "lk.transcription_final"
ATTRIBUTE_SEGMENT_ID = "lk.segment_id"
"""The names livekit-agents (`livekit.agents.types`) and LiveKit's client components use."""
ATTRIBUTE_INTERRUPTED = "chorus.interrupted"
"""On the agent's own final caption: `true` when someone talked over the reply and the caption
holds what the room heard of it."""
ATTRIBUTE_EVENT_ID = "chorus.event_id"
"""On the agent's own final caption: the reply's event in the Chorus room."""
CAPTION_STEP_S = 0.25
"""How often the agent's caption grows while its reply plays (the words heard so far)."""
KEPT_CAPTIONS = 16
"""Replies whose caption state the agent remembers (the latest ones)."""


class TextWriterLike(Protocol):
    async def write(self, text: str) -> None: ...

    async def aclose(self, *, reason: str = "", attributes: dict[str, str] | None = None) -> None: ...


class LocalParticipantLike(Protocol):
    """The two calls the agent makes on `rtc.LocalParticipant`."""

    async def stream_text(
        self,
        *,
        topic: str = "",
        attributes: dict[str, str] | None = None,
        sender_identity: str | None = None,
    ) -> TextWriterLike: ...

    async def publish_track(self, track: rtc.LocalTrack, options: rtc.TrackPublishOptions) -> Any: ...


@dataclass
class PublishedTranscription:
    """One turn as published on `lk.transcription` (kept for inspection and tests)."""

    text: str
    sender_identity: str
    attributes: dict[str, str]
    topic: str = TOPIC_TRANSCRIPTION


@dataclass
class _Feed:
    """One subscribed remote audio track and its voice session."""

    track_sid: str
    speaker: Speaker
    session: VoiceSession
    stream: rtc.AudioStream
    release: Callable[[], None] | None = None
    task: asyncio.Task[None] | None = None
    participant: rtc.Participant | None = None
    unstaged: bool = False
    """A shared mic that opened without a stage while the policy did not admit: it moves onto
    one once the policy admits again (`ChorusRoomAgent._move_to_stage`)."""
    moving: bool = False
    barge: BargeIn | None = None
    """Talking over the agent's reply stops it (`ChorusRoomAgent._barge_in`): a SIP caller's,
    a person's own microphone, a shared mic published with echo cancellation; None for another
    shared mic (gated while the reply plays, V9)."""


REPLY_CAPTURE_S = 0.5
"""The most reply audio handed to the track in one capture: half its source's queue (1 s)."""


def _barge_in_rule(
    speaker: Speaker, reply: ReplyEnvelope, cancels_echo: bool
) -> BargeIn | None:
    """A phone's (`BARGE_IN_S`, its double-talk check against the agent's `reply` track), a
    person's own microphone's (`ECHO_CANCELLED_BARGE_IN_S`: a browser's echo cancellation leaves
    more in it than a phone line); a shared mic's the same when its track was published with
    echo cancellation (`cancels_echo`; it is still silenced while the reply plays, and heard
    again at the barge-in, as the page), else none: its speaker plays the reply into it as loud
    as a person, so it is only silenced while the reply plays."""
    if speaker.sip:  # its track comes at 16 kHz, its line was a phone's
        return BargeIn(narrowband=True, reply=reply)
    if speaker.shared_mic and not cancels_echo:
        return None
    return echo_cancelled_barge_in()


class _TranscriptionOut(Channel):
    """Attached to the Chorus room: hears committed turns in commit order and queues them for
    publishing (deliver must return quickly; one pump keeps the order)."""

    channel_type: ClassVar[str] = "livekit"

    def __init__(self, agent: ChorusRoomAgent) -> None:
        super().__init__("livekit")
        self.agent = agent

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        if self.agent.speaks(event):
            self.agent.spoken_reply(event)
        elif event.metadata.get("source") == "voice" or (
            event.kind == "message" and event.source.channel_id in self.agent.assistant_ids
        ):
            self.agent._queue.put_nowait(event)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        """A corrected turn (an early turn the final result changed), and the agent's spoken
        reply cut to what the room heard of it (a barge-in after it was posted), are published
        again with the same `lk.segment_id`: LiveKit's clients show a segment's latest text in
        its place. A chat model's or ACP agent's reply is not: `lk.chat` has no place to put a
        change but a second message."""
        if event.metadata.get("source") == "voice" or self.agent.speaks(event):
            await self.deliver(event, ctx)


@dataclass
class _SessionInfo:
    speaker: Speaker
    track_sid: str


class _TrackStream:
    """One shared-mic track's session as the voice directory sees a stream
    (`server.voices.DirectoryStream`): its id, its room, its stage's prints."""

    def __init__(self, session: VoiceSession, room_id: str) -> None:
        self.id = session.id
        self.room_id = room_id
        self.audio = VoiceStreamAudio(session, release=None)


@dataclass(frozen=True)
class _Suggestion:
    """A suggestion to publish (in order with the turns)."""

    message: SpeakerSuggestionMessage
    session_id: str | None


@dataclass(frozen=True)
class _Caption:
    """The agent's caption of a reply to publish (in order with the turns): the words heard so
    far (`event` None), or the reply as the room keeps it, final."""

    response_id: str
    text: str
    event: RoomEvent | None = None


@dataclass(frozen=True)
class _Status:
    """A track's diarization status to publish (in order with the turns)."""

    session_id: str
    status: DiarizationStatus


class ChorusRoomAgent:
    """`ChorusRoomAgent(room, room_name, stt=…, livekit=LiveKitConfig(), realtime=…)`.

    - `stage_factory`: builds a diarization stage for each shared-mic track when its speakers
      come from the stage (None: shared mics take the STT's labels).
    - `local`: where transcriptions and the reply track are published (default: the room's
      local participant, once connected).
    - `assistants`: text channels that answer in the room (`[chat]`'s chat model, `[agent]`'s ACP
      agent); they read the room's turns as in `chorus serve`, and their replies are published
      on `lk.chat` as the agent.
    - `second_pass`: the live second pass (`voice.second_pass`, `[stt] second_pass`): a turn it
      corrects is republished as a caption under the same segment id, as early-commit
      corrections are.
    - `kit`: the kit on the configured `[store]` (default: one in memory). A room the store
      already holds (an earlier job for the same LiveKit room) is taken up where it was.
    - `voices`: `[voices]`; when `enabled`, the voice directory of the kit's store names the
      shared-mic tracks' voices (module docstring).
    - `diarizer`: `[diarizer]`, for its overload keys (`overload_bounds()`, `overload_check_s`):
      what the job does when a shared-mic track's stage falls behind (module docstring;
      default: the defaults).
    """

    def __init__(
        self,
        room: rtc.Room,
        room_name: str,
        *,
        stt: SttProvider,
        livekit: LiveKitConfig | None = None,
        realtime: RealtimeChannel | None = None,
        stage_factory: Callable[[], DiarizationStage] | None = None,
        policy: TurnPolicy | None = None,
        local: LocalParticipantLike | None = None,
        kit: RoomKit | None = None,
        assistants: Sequence[Channel] = (),
        second_pass: SecondPass | None = None,
        voices: VoicesConfig | None = None,
        diarizer: DiarizerConfig | None = None,
    ) -> None:
        self.room = room
        self.room_name = room_name
        self.config = livekit or LiveKitConfig()
        self.stt = stt
        self.kit = kit or RoomKit()
        self.second_pass = second_pass
        """Re-decodes committed turns and corrects them in place (the captions republish the
        correction); the agent closes it."""
        self.voice = VoiceChannel("voice", stt=stt, pipeline_speakers=False, policy=policy,
                                  on_play=self._play, second_pass=second_pass)
        self.diarized = VoiceChannel("voice-diarized", stt=stt, pipeline_speakers=True,
                                     stage_per_session=True, catch_up=True, policy=policy,
                                     second_pass=second_pass)
        """Shared-mic tracks, each session with a diarization stage of its own (pooled); a
        track whose stage fell behind skips its backlog's windows (`catch_up`). It gates its
        sessions while a reply plays; the reply reaches the track through `voice` alone (both
        are the room's audio sinks, and the room has one reply track)."""
        self.realtime = realtime
        self.assistants = list(assistants)
        self.assistant_ids = frozenset(c.channel_id for c in self.assistants)
        self.stage_factory = stage_factory
        self._local = local
        self._out = _TranscriptionOut(self)
        self._queue: asyncio.Queue[
            RoomEvent | _Suggestion | _Status | _Caption | AgentStatus | None] = (
            asyncio.Queue())
        self.published: list[PublishedTranscription] = []
        self._feeds: dict[str, _Feed] = {}
        self._track_locks: dict[str, asyncio.Lock] = {}
        self._sessions: dict[str, _SessionInfo] = {}
        """voice_session_id → who and which track (for naming and publishing)."""
        self.voices_config = voices if voices is not None and voices.enabled else None
        self.directory: VoiceDirectory | None = None
        """The voice directory (`[voices] enabled`), read from the store at `start`."""
        self._directory_streams: dict[str, _TrackStream] = {}
        """voice_session_id → the shared-mic track's stream, as the directory names it."""
        self._pool: list[DiarizationStage] = []
        """Idle stages, reset before the next shared-mic track."""
        overload = diarizer or DiarizerConfig()
        self.overload = OverloadPolicy(overload.overload_bounds())
        """When a shared-mic track's stage step is stretched, the track taken off its stage and
        put back, and new shared-mic tracks run without one (`server.overload`)."""
        self.stage_guard = StageGuard(self.overload, check_s=overload.overload_check_s,
                                      tell=self._diarization_status)
        """Applies `overload` to the tracks on a stage, as `chorus serve`'s pipeline does."""
        self._diarized_attached = False
        self._last_staged = -math.inf
        """When an unstaged track last moved onto a stage (one per `recover_after_s`)."""
        self._serial = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._pump: asyncio.Task[None] | None = None
        self._reply_pump: asyncio.Task[None] | None = None
        self._reply_queue: asyncio.Queue[bytes | None] = asyncio.Queue()
        self._reply_cut = 0
        """Barge-ins so far: the reply loop stops the reply it is queueing when this moves."""
        self.reply_envelope = ReplyEnvelope()
        """The reply track's level as it plays: what a SIP caller's echo of it can be at most."""
        self.reply_queued_s = 0.0
        """Seconds of reply audio queued for the reply track (a barge-in may drop some)."""
        self.barge_ins = 0
        """Someone (a SIP caller, or a person on their own microphone) talked over the agent's
        reply, which was stopped."""
        self.reply_source = rtc.AudioSource(self.config.reply_sample_rate, 1, queue_size_ms=1000)
        self.reply_track = rtc.LocalAudioTrack.create_audio_track(
            self.config.reply_track_name, self.reply_source
        )
        self.reply_track_sid: str | None = None
        """The reply track's publication sid, once published: what the agent's own captions
        name as their `lk.transcribed_track_id`."""
        self._caption_task: asyncio.Task[None] | None = None
        self._captioned: OrderedDict[str, str] = OrderedDict()
        """Response id → the text of its caption published last."""
        self._finals: OrderedDict[str, None] = OrderedDict()
        """Responses whose final caption is published."""
        self._deferred: dict[str, RoomEvent] = {}
        """Response id → its reply as posted, captioned final once it has played."""
        self._cutting: set[str] = set()
        """Responses talked over whose cut is not in the room's record yet."""
        self._agent_label: str | None = None
        """The agent's label in the room (`chorus.speaker` of its captions), once known."""
        self.closed = False

    # ------------------------------------------------------------------ lifecycle

    @property
    def local(self) -> LocalParticipantLike:
        if self._local is None:
            self._local = self.room.local_participant
        assert self._local is not None
        return self._local

    async def start(self) -> None:
        """Create the Chorus room, publish the reply track, follow the room's events and take
        the audio tracks already subscribed. A start that fails stops what it started (the voice
        directory's watcher, the publishing pumps, the track operations) before the error goes
        on: nobody calls `aclose` on an agent that never started (`run_job`)."""
        try:
            await self._start()
        except BaseException:
            await self._undo_start()
            raise

    async def _undo_start(self) -> None:
        """What a failed `start` started, stopped; the kit, the STT and the second pass stay
        their owners' (`run_job` closes the store it opened)."""
        self._unfollow_room()
        tasks = [t for t in (self._pump, self._reply_pump, *self._tasks) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pump = self._reply_pump = None
        for track_sid in list(self._feeds):
            with contextlib.suppress(Exception):
                await self.close_track(track_sid)
        if self.directory is not None:
            with contextlib.suppress(Exception):
                await self.directory.close()

    async def _start(self) -> None:
        kit = self.kit
        if self.voices_config is not None:
            store = kit.store
            if not isinstance(store, VoiceStore):
                raise ValueError(
                    f"voices.enabled: the {type(store).__name__} store cannot keep voices")
            self.directory = VoiceDirectory(store, self.voices_config, self._suggest,
                                            on_change=self._directory_changed)
            await self.directory.load()
            self.directory.start()  # what other processes change, while the job runs
        if await kit.get_room(self.room_name) is None:
            with contextlib.suppress(ValueError):  # another job on the store made it meanwhile
                await kit.create_room(room_id=self.room_name)
        kit.register_channel(self.voice)
        kit.register_channel(self._out)
        await kit.attach_channel(self.room_name, self.voice.channel_id)
        if self.realtime is not None:
            kit.register_channel(self.realtime)
            await kit.attach_channel(self.room_name, self.realtime.channel_id)
        for assistant in self.assistants:
            kit.register_channel(assistant)
            await kit.attach_channel(self.room_name, assistant.channel_id)
        await kit.attach_channel(self.room_name, self._out.channel_id)
        kit.hooks.add(HookTrigger.ON_TRANSCRIPTION, self._name_one_person, priority=-1000,
                      name="livekit-one-person")
        kit.hooks.add(HookTrigger.ON_AGENT_STATUS, self._agent_status, name="livekit-agent-status")
        if self.directory is not None:  # before application hooks, which may rename after it
            kit.hooks.add(HookTrigger.ON_TRANSCRIPTION, self._name_from_directory,
                          priority=-900, name="livekit-voice-directory")
        self._pump = asyncio.create_task(self._publish_loop(),
                                         name=f"chorus-livekit-publish-{self.room_name}")
        self._reply_pump = asyncio.create_task(self._reply_loop(),
                                               name=f"chorus-livekit-reply-{self.room_name}")
        if self.realtime is not None:  # nothing would ever play on it otherwise
            publication = await self.local.publish_track(
                self.reply_track,
                rtc.TrackPublishOptions(source=rtc.TrackSource.SOURCE_MICROPHONE),
            )
            self.reply_track_sid = getattr(publication, "sid", None) or None
        self.room.on("track_subscribed", self._on_track_subscribed)
        self.room.on("track_unsubscribed", self._on_track_unsubscribed)
        self.room.on("participant_disconnected", self._on_participant_disconnected)
        for participant in self.room.remote_participants.values():
            for publication in participant.track_publications.values():
                track = publication.track
                if track is not None and track.kind == rtc.TrackKind.KIND_AUDIO:
                    self._spawn(self.open_track(track, publication.sid, participant))

    async def aclose(self) -> None:
        """End every session (committing what was heard), publish the last turns, close."""
        if self.closed:
            return
        self.closed = True
        self._unfollow_room()
        await asyncio.gather(*(self.close_track(sid) for sid in list(self._feeds)))
        await self.wait_idle()
        if self._caption_task is not None:
            self._caption_task.cancel()
        for response_id in list(self._deferred):  # a reply still playing: as the room keeps it
            self._reply_played(response_id)
        self._queue.put_nowait(None)
        self._reply_queue.put_nowait(None)
        for task in (self._pump, self._reply_pump):
            if task is not None:
                with contextlib.suppress(Exception):
                    await task
        if self.directory is not None:  # its "last heard" writes, before the store closes
            await self.directory.close()
        await self.kit.close()  # closes every registered channel (pooled ones included)
        if self.second_pass is not None:
            await self.second_pass.aclose()
        await self.reply_source.aclose()

    def _unfollow_room(self) -> None:
        with contextlib.suppress(Exception):
            self.room.off("track_subscribed", self._on_track_subscribed)
            self.room.off("track_unsubscribed", self._on_track_unsubscribed)
            self.room.off("participant_disconnected", self._on_participant_disconnected)

    async def wait_idle(self) -> None:
        """Wait until every track operation started so far has finished and every committed
        turn has been published."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.stage_guard.wait_idle()  # a track's fallback posts the turns that waited
        await self.kit.drain()
        await self._queue.join()

    def _spawn(self, coro: Awaitable[Any]) -> None:
        """Run a track operation from a (synchronous) room event handler; a failure is logged
        and touches no other track."""
        async def run() -> None:
            try:
                await coro
            except Exception:
                log.exception("room %s: a track operation failed", self.room_name)

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ room events

    def _on_track_subscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication,
        participant: rtc.RemoteParticipant,
    ) -> None:
        if track.kind == rtc.TrackKind.KIND_AUDIO and not self.closed:
            self._spawn(self.open_track(track, publication.sid, participant))

    def _on_track_unsubscribed(
        self, track: rtc.Track, publication: rtc.RemoteTrackPublication,
        participant: rtc.RemoteParticipant,
    ) -> None:
        self._spawn(self.close_track(publication.sid))

    def _on_participant_disconnected(self, participant: rtc.RemoteParticipant) -> None:
        for sid, feed in list(self._feeds.items()):
            if feed.speaker.identity == participant.identity:
                self._spawn(self.close_track(sid))

    def _lock(self, track_sid: str) -> asyncio.Lock:
        return self._track_locks.setdefault(track_sid, asyncio.Lock())

    # ------------------------------------------------------------------ tracks → sessions

    @property
    def diarizes_with_stage(self) -> bool:
        return self.stage_factory is not None

    async def _channel_for(
        self, on_stage: bool
    ) -> tuple[VoiceChannel, DiarizationStage | None]:
        """The channel a track's session runs on, and its stage (a shared mic diarized by a
        stage: from the pool, reset, or a new one)."""
        if not on_stage or self.stage_factory is None:
            return self.voice, None
        if self._pool:
            stage = self._pool.pop()
            stage.reset()
        else:
            stage = await asyncio.to_thread(self.stage_factory)
        if not self._diarized_attached:
            self.kit.register_channel(self.diarized)
            await self.kit.attach_channel(self.room_name, self.diarized.channel_id)
            self._diarized_attached = True
        return self.diarized, stage

    def _release(self, session: VoiceSession, stage: DiarizationStage) -> None:
        """A track's session ended: its stage goes back to the pool, unless a stage call still
        runs in its thread (a track that fell back): a reset would wait for it, so it is not
        pooled."""
        if self.stage_guard.leave(session):
            self._pool.append(stage)

    async def open_track(
        self, track: rtc.Track, track_sid: str, participant: rtc.Participant,
        *, moved: bool = False,
    ) -> VoiceSession | None:
        """Start a voice session for one audio track and read its frames until it ends
        (`moved`: a track that ran without a stage, reopened now that the policy admits)."""
        async with self._lock(track_sid):
            if track_sid in self._feeds or self.closed:
                return None
            speaker = speaker_of(participant, self.config.shared_mic_names)
            wants_stage = speaker.shared_mic and self.diarizes_with_stage
            admitted = not wants_stage or self.stage_guard.admit()
            channel, stage = await self._channel_for(wants_stage and admitted)
            await self.kit.ensure_participant(
                self.room_name, channel.channel_id, speaker.identity, display_name=speaker.name
            )
            self._serial += 1
            session_id = f"{track_sid}-{self._serial}"
            self._sessions[session_id] = _SessionInfo(speaker, track_sid)
            try:
                session = await channel.start_session(
                    self.room_name, speaker.identity, sample_rate=STT_SAMPLE_RATE,
                    encoding="pcm16", channels=1, session_id=session_id, stage=stage,
                    # V9 for a speakerphone and a phone (which may send the reply back; its
                    # barge-in lifts the gate at once, `_barge_in`); not for a person's own
                    # microphone, whose client cancels the echo
                    echo_gate=speaker.shared_mic or speaker.sip,
                )
            except BaseException:
                if stage is not None:
                    self._pool.append(stage)
                raise
            release = None
            if stage is not None:
                release = functools.partial(self._release, session, stage)
                if moved:
                    log.info("room %s: shared-mic track %s is on a diarization stage now",
                             self.room_name, track_sid)
                    self._queue.put_nowait(_Status(session.id, DiarizationRecovered()))
            elif not admitted:  # a job cannot refuse the track: it runs without a stage
                log.warning("room %s: shared-mic track %s runs without a diarization stage: %s",
                            self.room_name, track_sid, NOT_ADMITTED)
                self._queue.put_nowait(_Status(session.id, DiarizationDegraded(
                    NOT_ADMITTED, self.overload.load().lag_s)))
            stream = rtc.AudioStream.from_track(
                track=track, sample_rate=STT_SAMPLE_RATE, num_channels=1
            )
            if self.directory is not None and stage is not None:
                named = self._directory_streams[session.id] = _TrackStream(session, self.room_name)
                named.audio.anchor(self.directory.anchors_for)  # its people, from the 1st window
            feed = _Feed(track_sid, speaker, session, stream, release, participant=participant,
                         unstaged=wants_stage and not admitted,
                         barge=_barge_in_rule(speaker, self.reply_envelope,
                                              echo_cancelled(participant, track_sid)))
            if stage is not None:
                self.stage_guard.join(session)  # `release` leaves
            feed.task = asyncio.create_task(self._read(feed))
            self._feeds[track_sid] = feed
            log.info("room %s: %s track %s → voice session %s (%s)", self.room_name,
                     speaker.identity, track_sid, session.id,
                     "shared mic" if speaker.shared_mic else f"one person: {speaker.name}")
            return session

    async def _read(self, feed: _Feed) -> None:
        async for event in feed.stream:
            pcm = bytes(event.frame.data)
            if not pcm:
                continue
            with contextlib.suppress(Exception):  # logged by the session (V10); the stream goes on
                feed.session.push(pcm)
            if feed.barge is not None and feed.barge.heard(pcm, STT_SAMPLE_RATE,
                                                           playing=self.reply_playing):
                self._barge_in(feed.session)
            if feed.session.stage is not None:
                self.stage_guard.check()  # overload: at most every `overload_check_s`
            elif feed.unstaged and not feed.moving and self._may_stage_another():
                feed.moving = True
                self._last_staged = asyncio.get_running_loop().time()
                self._spawn(self._move_to_stage(feed))

    def _may_stage_another(self) -> bool:
        """Whether a track that runs without a stage may move onto one now: the policy admits
        (no track in fallback), and none moved within `recover_after_s`."""
        now = asyncio.get_running_loop().time()
        return (self.overload.admitting and not self.closed
                and now - self._last_staged >= self.overload.bounds.recover_after_s)

    async def _move_to_stage(self, feed: _Feed) -> None:
        """End the unstaged track's session (its turn in progress is committed) and open it
        again, on a stage if the policy still admits (`open_track(moved=True)`)."""
        await self.close_track(feed.track_sid)
        if self.closed or feed.participant is None:
            return
        participant = self.room.remote_participants.get(feed.participant.identity)
        if participant is None:
            return  # gone meanwhile: nothing to reopen
        publication = participant.track_publications.get(feed.track_sid)
        if publication is None or publication.track is None:
            return  # unsubscribed meanwhile: its own event found nothing to close
        await self.open_track(publication.track, feed.track_sid, participant, moved=True)

    async def close_track(self, track_sid: str) -> None:
        """Stop reading the track and end its session: the turn in progress is committed once."""
        async with self._lock(track_sid):
            feed = self._feeds.pop(track_sid, None)
            if feed is None:
                return
            await feed.stream.aclose()
            if feed.task is not None:
                feed.task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await feed.task
            try:
                await feed.session.finish()
            finally:
                if self._directory_streams.pop(feed.session.id, None) is not None:
                    stage = feed.session.stage
                    if stage is not None and isinstance(stage.stage, Anchors):
                        stage.stage.anchor({})  # back to the pool knowing nobody
                if feed.release is not None:
                    feed.release()

    @property
    def sessions(self) -> list[VoiceSession]:
        return [feed.session for feed in self._feeds.values()]

    # ------------------------------------------------------------------ naming

    def _name_one_person(self, value: object, ctx: HookContext) -> HookResult[Any] | None:
        """One person per track: whatever label the STT put on the voice, the turn is the
        participant's, named by its participant record (attribution B2)."""
        if not isinstance(value, TranscriptionEvent):
            return None
        info = self._sessions.get(str(ctx.extra.get("voice_session_id")))
        if info is None or info.speaker.shared_mic or value.sender_name is None:
            return None
        return HookResult.modify(dataclasses.replace(value, sender_name=None))

    async def _name_from_directory(
        self, value: object, ctx: HookContext
    ) -> HookResult[Any] | None:
        """A shared-mic track's voice named by the voice directory (tier auto), or its letter
        again once its person is forgotten or when the turn does not sound like them (`[voices]
        verify`), exactly as `chorus serve`'s rename hook does."""
        if not isinstance(value, TranscriptionEvent) or self.directory is None:
            return None
        stream = self._directory_streams.get(value.session.id)
        if stream is None or value.speaker is None:
            return None
        naming = await self.directory.name_turn(
            stream, value.speaker, value.sender_name, value.start, value.end
        )
        if naming is None or naming.name == value.sender_name:
            return None
        return HookResult.modify(dataclasses.replace(value, sender_name=naming.name))

    def _directory_changed(self, unnamed: list[Unnamed]) -> None:
        """The directory changed (a person remembered or forgotten by another process on the
        store): each shared-mic track's stage is anchored on the people as they are now. The
        voices a forgotten person named read as their letters from their next turn
        (`VoiceDirectory.name_for`); there are no renames here to drop."""
        directory = self.directory
        if directory is None:
            return
        for stream in list(self._directory_streams.values()):
            stream.audio.anchor(functools.partial(directory.anchors_for, stream=stream))

    def _suggest(
        self, room_id: str, label: str, name: str, source: Literal["voice", "introduction"],
        stream_id: str | None, voice_id: str | None,
    ) -> None:
        """The directory's suggestion (`server.voices.Suggest`): published in order with the
        turns, on `chorus.speaker_suggestion`."""
        message = SpeakerSuggestionMessage(room=room_id, label=label, name=name, source=source,
                                           stream=stream_id, voice=voice_id)
        self._queue.put_nowait(_Suggestion(message, stream_id))

    # ------------------------------------------------------------------ output

    async def _publish_loop(self) -> None:
        while True:
            event = await self._queue.get()
            try:
                if event is None:
                    return
                if isinstance(event, _Suggestion):
                    await self._publish_suggestion(event)
                elif isinstance(event, _Caption):
                    await self._publish_caption(event)
                elif isinstance(event, _Status):
                    await self._publish_status(event)
                elif isinstance(event, AgentStatus):
                    await self._publish_agent_status(event)
                else:
                    await self._publish(event)
            except Exception:
                log.exception("room %s: publishing a transcription failed", self.room_name)
            finally:
                self._queue.task_done()

    def speaks(self, event: RoomEvent) -> bool:
        """Whether `event` is the realtime model's spoken reply, as the room keeps it."""
        return (self.realtime is not None and event.kind == "message"
                and event.source.channel_id == self.realtime.channel_id
                and bool(event.metadata.get("ai_response")))

    async def _publish(self, event: RoomEvent) -> None:
        if event.source.channel_id in self.assistant_ids:
            await self._publish_reply(event)
            return
        info = self._sessions.get(str(event.metadata.get("voice_session_id")))
        label = await self.kit.label_for(self.room_name, event)
        identity = info.speaker.identity if info else (event.source.participant_id or "")
        attributes = {
            ATTRIBUTE_FINAL: "true",
            ATTRIBUTE_SEGMENT_ID: event.id,
            self.config.transcription_attribute: label,
        }
        if info is not None:
            attributes[ATTRIBUTE_TRACK_ID] = info.track_sid
        await self._send_text(TOPIC_TRANSCRIPTION, event.text, attributes, identity)

    async def _publish_suggestion(self, suggestion: _Suggestion) -> None:
        info = self._sessions.get(suggestion.session_id or "")
        attributes = {self.config.transcription_attribute: suggestion.message.label}
        if info is not None:
            attributes[ATTRIBUTE_TRACK_ID] = info.track_sid
        await self._send_text(TOPIC_SUGGESTION, dump(suggestion.message), attributes,
                              info.speaker.identity if info is not None else None)

    async def _diarization_status(self, session_id: str, status: DiarizationStatus) -> None:
        """The stage guard's `tell`: a track left its stage or came back; published in order
        with the turns (the turns that take the STT's labels come after it)."""
        self._queue.put_nowait(_Status(session_id, status))

    def _agent_status(self, value: object, ctx: HookContext) -> None:
        """ON_AGENT_STATUS: a model of the room is away or back; told in order with the
        captions (on `chorus.assistant`, as the agent)."""
        if isinstance(value, AgentStatus) and ctx.room_id == self.room_name:
            self._queue.put_nowait(value)

    async def _publish_agent_status(self, status: AgentStatus) -> None:
        message = AssistantStatusMessage.of(self.room_name, status)
        attributes: dict[str, str] = {ATTRIBUTE_ASSISTANT: message.status}
        if status.reason:
            attributes[ATTRIBUTE_REASON] = status.reason
        await self._send_text(TOPIC_ASSISTANT, dump(message), attributes)

    async def _publish_status(self, item: _Status) -> None:
        info = self._sessions.get(item.session_id)
        status = item.status
        attributes: dict[str, str] = {}
        if info is not None:
            attributes[ATTRIBUTE_TRACK_ID] = info.track_sid
        message = status_message(item.session_id, status)
        if isinstance(status, DiarizationDegraded):
            attributes[ATTRIBUTE_REASON] = status.reason
            attributes[ATTRIBUTE_LAG] = f"{status.lag_s:.2f}"
        attributes[ATTRIBUTE_DIARIZATION] = message.status
        attributes[ATTRIBUTE_SPEAKERS] = message.speakers
        identity = info.speaker.identity if info is not None else None
        await self._send_text(TOPIC_DIARIZATION, dump(message), attributes, identity)

    def spoken_reply(self, event: RoomEvent) -> None:
        """The realtime model's reply as the room keeps it (posted, or cut to what was heard):
        captioned final now, or, while it is still playing whole, once it has played
        (`_caption_loop`)."""
        response_id = str(event.metadata.get("response_id") or event.id)
        playing = self.realtime.speaking(self.room_name) if self.realtime is not None else None
        if (not event.metadata.get("interrupted") and playing is not None
                and playing.response_id == response_id and not playing.whole):
            self._deferred[response_id] = event
            return
        self._deferred.pop(response_id, None)
        self._queue.put_nowait(_Caption(response_id, event.text, event))

    def _reply_played(self, response_id: str) -> None:
        """A reply's audio played to its end: its posted reply, if deferred, is captioned final
        (not one being cut: its cut comes as the room's record changes)."""
        if response_id in self._cutting:
            return
        event = self._deferred.pop(response_id, None)
        if event is not None:
            self._queue.put_nowait(_Caption(response_id, event.text, event))

    async def _caption_loop(self) -> None:
        """While a reply plays, its caption grows with the words the room has heard of it
        (`RealtimeChannel.speaking`), every `CAPTION_STEP_S`; a reply that played to its end is
        captioned final as the room keeps it."""
        assert self.realtime is not None
        current: str | None = None
        while True:
            spoken = self.realtime.speaking(self.room_name)
            if current is not None and (spoken is None or spoken.response_id != current):
                self._reply_played(current)
            if spoken is None:
                return
            current = spoken.response_id
            if spoken.whole:
                self._reply_played(current)
                return
            if spoken.text and self._captioned.get(current) != spoken.text:
                self._queue.put_nowait(_Caption(current, spoken.text))
            await asyncio.sleep(CAPTION_STEP_S)

    async def _interrupted(self) -> None:
        """`RealtimeChannel.interrupt`, then the caption of the reply talked over: the room's
        record of it is cut to what was heard (captioned final as it changes), unless all of it
        had been heard (captioned whole here)."""
        assert self.realtime is not None
        spoken = self.realtime.speaking(self.room_name)
        cut = spoken.response_id if spoken is not None and not spoken.whole else None
        if cut is not None:
            self._cutting.add(cut)
        try:
            await self.realtime.interrupt(self.room_name)
        finally:
            if cut is not None:
                self._cutting.discard(cut)
                self._reply_played(cut)

    async def _agent_label_now(self) -> str:
        """The agent's label in the room: its last reply's, or, before its first, the label the
        attribution engine gives a reply of the realtime channel now."""
        if self._agent_label is None:
            assert self.realtime is not None
            probe = RoomEvent(
                room_id=self.room_name,
                source=EventSource(channel_id=self.realtime.channel_id,
                                   channel_type=self.realtime.channel_type),
                content=TextContent(body=""),
                metadata={"ai_response": True},
            )
            return await self.kit.label_for(self.room_name, probe)
        return self._agent_label

    async def _publish_caption(self, caption: _Caption) -> None:
        """The agent's caption of a reply, the way livekit-agents publishes an agent's speech:
        `lk.transcription`, sent as the agent, naming the reply track, one segment per response.
        While it plays, the words heard so far (`lk.transcription_final` `false`, each stream the
        whole caption so far: a client shows a segment's latest text); then the reply as the
        room keeps it (`true`): whole, or cut at the word the barge-in fell in (`…`,
        `chorus.interrupted`), with the room's event id (`chorus.event_id`)."""
        rid, event = caption.response_id, caption.event
        if rid in self._finals or (event is None and self._captioned.get(rid) == caption.text):
            return
        if event is not None:  # the room's latest record of it (a cut may have come since)
            event = await self.kit.store.get_event(self.room_name, event.id) or event
        text = event.text if event is not None else caption.text
        attributes = {
            ATTRIBUTE_FINAL: "true" if event is not None else "false",
            ATTRIBUTE_SEGMENT_ID: rid,
        }
        if self.reply_track_sid is not None:
            attributes[ATTRIBUTE_TRACK_ID] = self.reply_track_sid
        if event is not None:
            self._agent_label = await self.kit.label_for(self.room_name, event)
            attributes[ATTRIBUTE_EVENT_ID] = event.id
            if event.metadata.get("interrupted"):
                attributes[ATTRIBUTE_INTERRUPTED] = "true"
            self._finals[rid] = None
            while len(self._finals) > KEPT_CAPTIONS:
                self._finals.popitem(last=False)
        attributes[self.config.transcription_attribute] = await self._agent_label_now()
        self._captioned[rid] = text
        while len(self._captioned) > KEPT_CAPTIONS:
            self._captioned.popitem(last=False)
        await self._send_text(TOPIC_TRANSCRIPTION, text, attributes)

    async def _publish_reply(self, event: RoomEvent) -> None:
        """A chat model's or ACP agent's reply, as the agent, on the room's text chat."""
        attributes = {self.config.transcription_attribute: await self.kit.label_for(
            self.room_name, event)}
        await self._send_text(TOPIC_CHAT, event.text, attributes)

    async def _send_text(self, topic: str, text: str, attributes: dict[str, str],
                         sender_identity: str | None = None) -> None:
        """One text stream on `topic` (sent as `sender_identity`, the agent itself when None),
        kept in `published`."""
        writer = await self.local.stream_text(topic=topic, attributes=attributes,
                                              sender_identity=sender_identity)  # fmt: skip
        await writer.write(text)
        await writer.aclose()
        self.published.append(PublishedTranscription(text, sender_identity or "", attributes,
                                                     topic=topic))  # fmt: skip

    async def _play(self, room_id: str, pcm16: bytes, sample_rate: int) -> None:
        """The realtime channel's reply audio (already gating the voice sessions): queued for
        the reply track, so the channel's listener is not held for the audio's duration."""
        if sample_rate != self.config.reply_sample_rate:
            samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32768.0
            samples = resample(samples, sample_rate, self.config.reply_sample_rate)
            pcm16 = np.clip(np.round(samples * 32768.0), -32768, 32767).astype("<i2").tobytes()
        self.reply_queued_s += len(pcm16) / 2 / self.config.reply_sample_rate
        self._reply_queue.put_nowait(pcm16)
        if self.realtime is not None and (
            self._caption_task is None or self._caption_task.done()
        ):
            self._caption_task = asyncio.create_task(
                self._caption_loop(), name=f"chorus-livekit-caption-{self.room_name}")

    @property
    def reply_playing(self) -> bool:
        """Whether reply audio is queued for the agent's track or playing on it."""
        return self.reply_source.queued_duration > 0 or not self._reply_queue.empty()

    def _barge_in(self, session: VoiceSession) -> None:
        """Someone talked over the reply (`server.reply_audio.BargeIn`: a phone caller, or a
        person on their own microphone): what is queued
        for the reply track is dropped, the track's own buffer cleared, the room's model
        told (`RealtimeChannel.interrupt`: its response stopped, the reply cut to what was
        heard), and their session, gated while the reply played (a phone's), heard again at once
        with the half second it held (`VoiceSession.reply_stopped`)."""
        self.barge_ins += 1
        self._reply_cut += 1
        ended = False
        while not self._reply_queue.empty():
            ended = ended or self._reply_queue.get_nowait() is None
        if ended:
            self._reply_queue.put_nowait(None)
        self.reply_source.clear_queue()
        self.reply_envelope.stopped()
        log.info("room %s: a caller talked over the reply: stopped", self.room_name)
        stop_room_reply(self.room_name, self.realtime, (self.voice, self.diarized))
        session.reply_stopped()
        if self.realtime is not None:
            self._spawn(self._interrupted())

    async def _reply_loop(self) -> None:
        """Each piece of reply audio goes to the track as it comes, in captures of up to
        `REPLY_CAPTURE_S`: the native side plays a source out as soon as it holds a frame, so
        in 20 ms captures a stall of the event loop between two of them (a loaded machine) ran
        it dry and played silence into the reply. A barge-in drops what is not captured yet and
        clears what is (`_barge_in`)."""
        rate = self.config.reply_sample_rate
        step = round(REPLY_CAPTURE_S * 100) * (rate // 100)  # whole 10 ms frames
        while True:
            pcm = await self._reply_queue.get()
            if pcm is None:
                return
            cut = self._reply_cut
            samples = np.frombuffer(pcm, dtype="<i2")
            for start in range(0, len(samples), step):
                if self._reply_cut != cut:  # a barge-in: the rest of this piece is dropped
                    break
                chunk = samples[start : start + step]
                frame = rtc.AudioFrame(chunk.tobytes(), rate, 1, len(chunk))
                self.reply_envelope.played(chunk.tobytes(), rate)
                try:
                    await self.reply_source.capture_frame(frame)
                except Exception:
                    log.exception("room %s: reply audio frame dropped", self.room_name)
                    break


__all__ = [
    "ATTRIBUTE_DIARIZATION",
    "ATTRIBUTE_FINAL",
    "ATTRIBUTE_LAG",
    "ATTRIBUTE_REASON",
    "ATTRIBUTE_SEGMENT_ID",
    "ATTRIBUTE_SPEAKERS",
    "ATTRIBUTE_TRACK_ID",
    "NOT_ADMITTED",
    "TOPIC_DIARIZATION",
    "TOPIC_SUGGESTION",
    "TOPIC_TRANSCRIPTION",
    "ChorusRoomAgent",
    "LocalParticipantLike",
    "PublishedTranscription",
    "TextWriterLike",
]
