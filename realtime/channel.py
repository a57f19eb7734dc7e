"""`RealtimeChannel`: a realtime speech model taking part in a room.

Why this shape: a speech-to-speech model keeps what it was sent (a session), so unlike a chat
model it cannot be handed a freshly rendered window each call. The channel therefore turns each
room event from another channel into one context item as it is committed, labelled by the
attribution engine exactly as chat history is (R2, G1), and follows G3: nothing is labelled while
the room holds one speaker (the model receives the text as sent, A2); the first line after a
second speaker appears is labelled and carries the note, and every later line in that session
stays labelled. Whether the model is asked to answer is the speak policy's decision (R4, G6),
made on the turn's label, never on its text's claims. Replies come back as room events of this
channel (never prefixed) and as audio handed to every `AudioSink` attached to the room (R5).

Audio mode (R3): the model's own turn detection is off; when the voice channel's turn event
arrives (with its `start`/`end` and `voice_session_id`), the channel asks the channel that posted
it for that turn's audio (`rooms.TurnAudioSource`, at the session's input rate), appends it,
commits it, adds the labelled item naming the speaker, then asks for a response if the policy
allows — so the model hears the voice *and* knows whose it was. Nothing is pushed ahead and
nothing is held here: audio no turn claims is never copied or converted, and a stream's turns
can only take that stream's samples. A turn whose audio is no longer held (its stream ended
before the turn was delivered, or its source keeps no audio) goes to the model as its text line.

One session per room; order, reconnect with replay (R6) and one-response-at-a-time live in
`realtime.session.RealtimeSession`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

from attribution import Register
from attribution.session import CorrectionWording, SessionLabels, SessionLine, correction_note
from models import Participant, RoomEvent, TextContent, VoiceTurn
from realtime.policy import SpeakPolicy, SpeakTurn, default_policy
from realtime.providers import make_session, require_provider
from realtime.session import (
    ContextItem,
    RealtimeSession,
    ReplyAudio,
    ReplyDone,
    ReplyTranscript,
    SessionCounts,
    SessionError,
    SessionEvent,
    SessionOptions,
    SessionReconnected,
)
from rooms import AgentStatusBoard, AudioSink, Channel, RoomContext, TurnAudioSource

log = logging.getLogger(__name__)

SessionMaker = Callable[[SessionOptions], RealtimeSession]
AGENT_CHANNEL_TYPES = frozenset({"ai", "realtime"})


KEPT_LINES = 1000
"""How many of a room's latest context lines and replies the channel keeps for `lines_for` and
`replies_for`. There is a line per turn, so a room that runs for days would otherwise hold every
one in memory; they are a record for tests, replays and the demo, not what the model holds (the
session keeps that)."""


TRUNCATE_MARGIN_MS = 100
"""A reply heard to within this much of its end is taken as heard whole: the service refuses a
truncate past the audio it holds for the item, which can be a little shorter than what was
received (others measured a steady 85 ms)."""


@dataclass
class _Playing:
    """The reply audio the room's sinks were handed most recently: what an interruption cuts."""

    response_id: str
    item_id: str | None
    """The provider's item (OpenAI), which `truncate_reply` names; None where it has none."""
    started: float
    """Loop time it started playing: its first audio, or the end of the reply before it."""
    seconds: float = 0.0
    """Its audio handed out so far."""
    made: float = 0.0
    """Its audio received so far, handed out or dropped (`stop_reply`): what the provider
    holds of it."""
    posted: RoomEvent | None = None
    """The room event it was posted as, once its `ReplyDone` came."""
    done: bool = False
    """Its `ReplyDone` came (posted or not: a reply with no transcript is not)."""

    def heard_share(self, heard_ms: int) -> float:
        return heard_ms / 1000 / self.made if self.made else 1.0

    def heard_ms(self, now: float) -> int:
        """How much of it the room has heard by `now` (sinks play it at real time)."""
        return int(1000 * min(self.seconds, max(0.0, now - self.started)))


def heard_words(text: str, share: float) -> tuple[str, bool]:
    """The words of `text` a listener has heard once `share` of its audio played: its words in
    proportion to their characters (speech keeps a roughly steady rate of them), up to the end
    of the word the play position is in; and whether that is short of the whole text (False
    once the position is in its last word). An estimate, as a voice agent's transcript
    synchronisation is: the provider's transcript carries no times."""
    if share >= 1.0:
        return text, False
    cut = round(len(text) * max(0.0, share))
    end = next((i for i in range(cut, len(text)) if text[i].isspace()), -1)
    if end < 0:
        return text, False
    return text[:end].rstrip(), True


def heard_text(text: str, share: float) -> str:
    """What the room heard of a reply whose audio was cut after `share` of it (`heard_words`),
    with `…` where it was cut; the whole text when the cut falls in its last word."""
    words, short = heard_words(text, share)
    return words + "…" if short else words


@dataclass(frozen=True)
class SpokenReply:
    """The reply playing to the room, as far as the room has heard it (`RealtimeChannel.speaking`)."""

    response_id: str
    text: str
    """Its words heard so far (`heard_words` of its transcript so far); the whole reply once
    `whole`."""
    whole: bool
    """The reply is complete (its `ReplyDone` came) and all of its audio has played."""


@dataclass
class _RoomState:
    session: RealtimeSession
    labels: SessionLabels = field(default_factory=SessionLabels)
    """G3: who the room holds, whether this session's lines are labelled, note sent."""
    replies: deque[RoomEvent] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))
    """The latest `KEPT_LINES` replies this channel posted for the room, in order."""
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_LINES))
    """The latest `KEPT_LINES` context lines sent for this room, as sent (labelled or plain)."""
    transcript_lines: int = 0
    """User lines (turns and messages) sent so far: what a correction counts back over."""
    sent_as: OrderedDict[str, tuple[int, str]] = field(default_factory=OrderedDict)
    """Event id → (its number among the transcript lines, the text it was sent as, without the
    note), for the latest `CORRECTABLE_LINES` events (a correction comes seconds after its turn)."""
    playing: _Playing | None = None
    """The latest reply's audio: what `interrupt` cuts (in the model's context where the
    provider names its item, and in the room's record)."""
    audio_of: str | None = None
    """The response whose audio the room's sinks were handed last, until it is done."""
    stopped: deque[str] = field(default_factory=lambda: deque(maxlen=KEPT_STOPPED))
    """Responses the room talked over (`stop_reply`): the rest of their audio is dropped."""
    heard: OrderedDict[str, tuple[int, float]] = field(default_factory=OrderedDict)
    """Response id → (ms, share of its audio) the room heard, for a response interrupted before
    its `ReplyDone` (its reply is posted as heard); forgotten at its `ReplyDone`."""
    said: OrderedDict[str, str] = field(default_factory=OrderedDict)
    """Response id → its transcript so far (`ReplyTranscript` deltas), until its `ReplyDone`."""
    before: _Playing | None = None
    """The reply `playing` replaced: still playing until `playing` starts (queued behind it)."""
    asked: tuple[str, float] | None = None
    """(event id, loop time it reached the channel) of the oldest line that asked for an answer
    not heard yet: the next reply's first audio answers it."""
    answered: OrderedDict[str, tuple[str, int]] = field(default_factory=OrderedDict)
    """Response id → (the event it answers, ms from that event to the reply's first audio),
    until its `ReplyDone` posts the reply with them (`asked_by`, `first_audio_ms`)."""


UNAVAILABLE_CODES = frozenset({"session_refused", "session_unreachable", "session_failed"})
"""The session's errors that make the room's model unavailable: until it reconnects, or, for
`session_failed` (a reconnect budget spent: `reconnect_forever=False`), for good."""


def unavailable_reason(provider: str, error: SessionError) -> str:
    """Why the model is away, fit for the room: who, and the HTTP status or close code where one
    was given; never the provider's words (an API error can quote part of a key)."""
    if error.code == "session_unreachable":
        return f"{provider} cannot be reached"
    if error.code == "session_failed":
        return f"{provider} session gave up reconnecting"
    status = re.search(r"\bHTTP (\d{3})\b", error.message)
    return f"{provider} refused the session" + (f", HTTP {status.group(1)}" if status else "")


KEPT_STOPPED = 8
"""How many stopped responses a room remembers (each is forgotten at its `ReplyDone`; this bounds
the ones whose end never came, a session that dropped)."""


CORRECTABLE_LINES = 256
"""How many of a room's latest lines a correction can still reach (bounds `sent_as`)."""


LINE_CORRECTION = CorrectionWording(
    counted="transcript line",
    how_counted="your own replies not counted",
    follows="line",
    replaces="line",
)
"""The system item sent before a corrected line counts back over the session's user lines (a
corrected line is one too). Nothing a speaker said is ever quoted in a system item: the corrected
line goes as a user line, labelled by the attribution engine like every other."""


class RealtimeChannel(Channel):
    """`RealtimeChannel("rt", provider="openai", assistant_name="Chorus", model=..., base_url=...)`.

    - `provider`: `"recorder"` (default, no key), `"openai"`, `"gemini"`, or a factory
      `Callable[[SessionOptions], RealtimeSession]`; `provider_options` go to the session. A
      provider whose SDK is not installed fails here, with the extra to install.
    - `policy`: a `SpeakPolicy`; default: answer when addressed by `assistant_name`, or always
      while the room holds a single speaker.
    - `audio_mode`: R3 (see the module docstring); `instructions`: the session's instructions.
    - `answer_agents`: also answer turns of other agent channels (off: two agents would loop).
    - `response_timeout`: seconds a requested response may take before it is cancelled and the
      next one may be asked for (R4; default 60, `None` waits forever).
    """

    channel_type: ClassVar[str] = "realtime"

    def __init__(
        self,
        channel_id: str,
        provider: str | SessionMaker = "recorder",
        *,
        assistant_name: str = "Assistant",
        instructions: str | None = None,
        policy: SpeakPolicy | None = None,
        audio_mode: bool = False,
        output_audio: bool = True,
        voice: str | None = None,
        answer_agents: bool = False,
        response_timeout: float | None = 60.0,
        **provider_options: Any,
    ) -> None:
        super().__init__(channel_id)
        if isinstance(provider, str):
            require_provider(provider)  # at start: the sessions open later, one per room
        self.provider = provider
        self.provider_options = provider_options
        self.assistant_name = assistant_name
        self.policy = policy or default_policy()
        self.audio_mode = audio_mode
        self.answer_agents = answer_agents
        self.options = SessionOptions(
            instructions=instructions,
            audio_input=audio_mode,
            output_audio=output_audio,
            voice=voice,
            response_timeout=response_timeout,
        )
        self._rooms: dict[str, _RoomState] = {}
        self._ended = SessionCounts()  # what the sessions of rooms gone went through
        self._status = AgentStatusBoard(channel_id)  # the rooms told the model is away

    # ------------------------------------------------------------------ sessions

    def session_counts(self) -> SessionCounts:
        """What every session of this channel went through, the rooms gone included
        (`chorus serve`'s `/metrics`: `chorus_realtime_*`)."""
        total = self._ended
        for state in self._rooms.values():
            total = total + state.session.counts()
        return total

    def _new_session(self) -> RealtimeSession:
        if callable(self.provider):
            return self.provider(self.options)
        return make_session(self.provider, self.options, **self.provider_options)

    def session_for(self, room_id: str) -> RealtimeSession:
        """The room's session (attach the channel first)."""
        return self._state(room_id).session

    def replies_for(self, room_id: str) -> list[RoomEvent]:
        """The model's latest `KEPT_LINES` replies this channel posted into the room, in order
        (R5; the room's events hold them all)."""
        return list(self._state(room_id).replies)

    def lines_for(self, room_id: str) -> list[str]:
        """The latest `KEPT_LINES` context lines this channel sent for the room, in order."""
        return list(self._state(room_id).lines)

    def _state(self, room_id: str) -> _RoomState:
        try:
            return self._rooms[room_id]
        except KeyError:
            raise KeyError(
                f"channel {self.channel_id!r} is not attached to room {room_id!r}"
            ) from None

    async def on_attach(self, room_id: str) -> None:
        if room_id in self._rooms:
            return
        session = self._new_session()
        state = _RoomState(session=session)
        self._rooms[room_id] = state
        session.add_listener(lambda event: self._on_session_event(room_id, event))
        # who already spoke (G3 counts the room)
        for spoken in await self.require_kit().past_labels(room_id, self._counts):
            state.labels.count(spoken)
        try:
            await session.start()
        except BaseException:
            del self._rooms[room_id]  # the next event (or attach) tries again
            raise

    async def on_detach(self, room_id: str) -> None:
        """The room is gone: close its session and forget what it was sent (a room that comes
        back gets a new session on attach)."""
        state = self._rooms.pop(room_id, None)
        self._status.away.discard(room_id)  # a room that comes back starts afresh
        if state is not None:
            try:
                await state.session.close()
            except Exception:
                log.exception("closing realtime session of room %s failed", room_id)
            self._ended = self._ended + state.session.counts()

    async def close(self) -> None:
        for state in self._rooms.values():
            try:
                await state.session.close()
            except Exception:
                log.exception("closing realtime session failed")
            self._ended = self._ended + state.session.counts()
        self._rooms.clear()

    def stop_reply(self, room_id: str) -> bool:
        """Someone in the room talked over the reply (barge-in): the rest of the response whose
        audio is still arriving is dropped here, never handed to the room's sinks, so no piece of
        it that the provider sent before it heard `interrupt` plays after the room stopped it.
        With a provider that cannot be told to stop (Gemini) this is what stops the reply.
        Synchronous, so nothing arriving meanwhile slips through; `interrupt` does it too. True
        when a response was still sending audio."""
        state = self._rooms.get(room_id)
        if state is None or state.audio_of is None:
            return False
        if state.audio_of not in state.stopped:
            state.stopped.append(state.audio_of)
        return True

    async def interrupt(self, room_id: str) -> bool:
        """Someone in the room talked over the reply playing to them (a phone caller's barge-in):
        the rest of its audio is dropped (`stop_reply`); the room's response in flight, if any, is
        cancelled (`RealtimeSession.interrupt_response`), so the model stops making audio nobody
        will hear (its reply is still posted, with what it said by then, `response_status`
        `cancelled` and `interrupted`); and the reply whose audio was playing is cut in the
        model's context to what the room heard of it (`truncate_reply`: the time since it started
        playing, at real time), so the model does not take the rest as said. True when the model
        was told either."""
        state = self._rooms.get(room_id)
        if state is None:
            return False
        self.stop_reply(room_id)
        playing, state.playing = state.playing, None
        state.before = None
        heard = playing.heard_ms(asyncio.get_running_loop().time()) if playing else 0
        cancelled = await state.session.interrupt_response()
        if playing is None:
            return cancelled
        if heard >= int(playing.made * 1000) - TRUNCATE_MARGIN_MS:
            return cancelled  # it was all heard
        await self._posted_as_heard(room_id, state, playing, heard)
        if heard <= 0 or playing.item_id is None:
            return cancelled  # nothing heard yet (a truncate at 0 is refused), or no item
        await state.session.truncate_reply(playing.item_id, heard)
        return True

    async def _posted_as_heard(
        self, room_id: str, state: _RoomState, playing: _Playing, heard_ms: int
    ) -> None:
        """The room's record of a reply cut short says what the room heard of it
        (`heard_text`), as the model's own context does after `truncate_reply` and the session's
        history a reconnect replays (`RealtimeSession.reply_heard`): a reply already
        posted is corrected in place (`RoomKit.update_event`: every channel and the feed get
        the correction); one not posted yet is posted so at its `ReplyDone`."""
        share = playing.heard_share(heard_ms)
        event = playing.posted
        if event is None:
            state.heard[playing.response_id] = (heard_ms, share)
            while len(state.heard) > KEPT_STOPPED:
                state.heard.popitem(last=False)
            return
        heard = heard_text(event.text, share)
        state.session.reply_heard(playing.response_id, heard)
        try:
            updated = await self.require_kit().update_event(
                room_id, event.id, content=TextContent(body=heard),
                metadata={**event.metadata, "interrupted": True, "heard_ms": heard_ms},
            )
        except KeyError:  # the room's events were deleted meanwhile
            return
        state.replies = deque((updated if r.id == updated.id else r for r in state.replies),
                              maxlen=KEPT_LINES)  # fmt: skip

    @staticmethod
    def _first_audio(state: _RoomState, response_id: str) -> None:
        """A reply's first audio reaches the room's sinks: it answers the oldest line that
        asked and has had no answer (`asked`), after `first_audio_ms`; its reply is posted with
        both (`asked_by`, `first_audio_ms`: the server's reply latency adds the asking turn's
        own latency, `chorus_reply_latency_seconds`). A reply no line asked for has neither."""
        if state.asked is None:
            return
        (asked_by, at), state.asked = state.asked, None
        ms = round(1000 * (asyncio.get_running_loop().time() - at))
        state.answered[response_id] = (asked_by, max(0, ms))
        while len(state.answered) > KEPT_STOPPED:
            state.answered.popitem(last=False)

    def _playing(self, room_id: str, audio: ReplyAudio) -> None:
        state = self._rooms.get(room_id)
        if state is None or not audio.sample_rate:
            return
        now = asyncio.get_running_loop().time()
        playing = state.playing
        if playing is None or (playing.response_id, playing.item_id) != (
            audio.response_id, audio.item_id
        ):
            after = playing.started + playing.seconds if playing is not None else now
            state.before = playing
            playing = state.playing = _Playing(audio.response_id, audio.item_id, max(now, after))
        playing.seconds += len(audio.pcm16) / 2 / audio.sample_rate
        playing.made += len(audio.pcm16) / 2 / audio.sample_rate
        state.session.playing_until = playing.started + playing.seconds  # (a renewal waits)

    def speaking(self, room_id: str) -> SpokenReply | None:
        """The reply whose audio the room's sinks were handed last, as far as the room has heard
        it now (sinks play at real time from its start, as `interrupt` reckons): its transcript
        so far cut at the word the play position is in. None when no reply has played since the
        last interruption."""
        state = self._rooms.get(room_id)
        playing = state.playing if state is not None else None
        if state is None or playing is None:
            return None
        now = asyncio.get_running_loop().time()
        if state.before is not None and now < playing.started:
            playing = state.before  # the reply before it is still playing
        heard = playing.heard_ms(now)
        posted = playing.posted
        text = posted.text if posted is not None else state.said.get(playing.response_id, "")
        if playing.done and heard >= int(1000 * playing.seconds):
            return SpokenReply(playing.response_id, text, whole=True)
        words, _ = heard_words(text, playing.heard_share(heard))
        return SpokenReply(playing.response_id, words, whole=False)

    async def wait_idle(self, room_id: str, limit: float = 10.0) -> None:
        """Wait until every line was written and no response is in flight (tests, replays)."""
        await self._state(room_id).session.wait_idle(limit)
        await asyncio.sleep(0)

    # ------------------------------------------------------------------ room events → session

    def _counts(self, event: RoomEvent) -> bool:
        return (
            event.kind != "system"
            and event.source.channel_id != self.channel_id
            and event.visible_to(self.channel_id)
        )

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        state = self._rooms.get(ctx.room_id)
        if state is None:
            await self.on_attach(ctx.room_id)
            state = self._state(ctx.room_id)
        session = state.session
        if session.failed is not None:
            return  # it gave up (the room was told: ON_AGENT_STATUS); the room's record keeps it
        if event.kind == "system":
            # An instruction from the application keeps its own mark and is not labelled (G3).
            state.lines.append(event.text)
            session.post_item(ContextItem("system", event.text))
            return
        participants = await ctx.participants()
        register = await ctx.kit.get_register(ctx.room_id) or Register.new()
        line = state.labels.render(event, participants, register)
        label, text = line.label, line.text
        item = ContextItem("user", text, carries_note=line.carries_note)
        voice = VoiceTurn.of(event) if self.audio_mode else None
        pcm = None if voice is None else self._turn_audio(event, voice, ctx, state)
        # an unlabelled audio turn goes as its audio alone: the model's words for it are its own
        self._remember(state, event.id, line, correctable=pcm is None or line.labelled)
        if pcm is not None:
            session.post_audio_turn(pcm, item, send_item=line.labelled)
        else:  # a typed message, or a turn whose audio is gone: its line, as text
            session.post_item(item)
        if self._should_answer(event, label, state, participants):
            session.post_response()
            if state.asked is None:  # (a line asking while one waits shares its answer)
                state.asked = (event.id, asyncio.get_running_loop().time())

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        """A turn this session was sent was corrected in place (an early voice turn the final
        result changed: other words, or another voice). The model cannot take back what it
        holds, so it is told: a fixed system note saying which earlier line was wrong, then the
        corrected line, rendered by the attribution engine exactly as a new turn would be (so a
        correction can change who said it, never let the words claim a name). Nothing when the
        line would read the same (only the turn's times changed), when the line is too old to
        reach, or for an event the session was never sent as a line it could correct. No
        response is asked for: the turn was answered, or not, when it first arrived."""
        state = self._rooms.get(ctx.room_id)
        if state is None or not self._counts(event) or state.session.failed is not None:
            return
        sent = state.sent_as.get(event.id)
        if sent is None:
            return
        number, text = sent
        participants = await ctx.participants()
        register = await ctx.kit.get_register(ctx.room_id) or Register.new()
        line = state.labels.render(event, participants, register)
        if line.text_without_note == text:
            return
        note = correction_note(state.transcript_lines - number + 1, LINE_CORRECTION)
        state.lines.append(note)
        state.session.post_item(ContextItem("system", note))
        self._remember(state, event.id, line)
        state.session.post_item(ContextItem("user", line.text, carries_note=line.carries_note))

    @staticmethod
    def _remember(
        state: _RoomState, event_id: str, line: SessionLine, *, correctable: bool = True
    ) -> None:
        state.lines.append(line.text)
        state.transcript_lines += 1
        if not correctable:
            return
        state.sent_as[event_id] = (state.transcript_lines, line.text_without_note)
        state.sent_as.move_to_end(event_id)
        while len(state.sent_as) > CORRECTABLE_LINES:
            state.sent_as.popitem(last=False)

    def _should_answer(
        self, event: RoomEvent, label: str, state: _RoomState, participants: list[Participant]
    ) -> bool:
        if event.source.channel_type in AGENT_CHANNEL_TYPES and not self.answer_agents:
            return False
        turn = SpeakTurn(
            speakers=(label,),
            text=event.text,
            assistant_name=self.assistant_name,
            room_speakers=len(state.labels.speakers),
            event=event,
        )
        return self.policy.should_answer(turn)

    # ------------------------------------------------------------------ audio (R3)

    def _turn_audio(
        self, event: RoomEvent, turn: VoiceTurn, ctx: RoomContext, state: _RoomState
    ) -> bytes | None:
        """The turn's audio at the session's input rate, from the channel that posted it."""
        try:
            source = ctx.kit.get_channel(event.source.channel_id)
        except KeyError:
            source = None
        if not isinstance(source, TurnAudioSource):
            log.warning("%s: turn %s comes from %s, which holds no audio: sent as text",
                        self.channel_id, event.id, event.source.channel_id)
            return None
        try:
            pcm = source.turn_audio(turn, state.session.input_sample_rate)
        except Exception:
            log.exception("%s: reading the audio of turn %s failed: sent as text",
                          self.channel_id, event.id)
            return None
        if not pcm:
            log.warning("%s: the audio of turn %s (stream %s) is no longer held: sent as text",
                        self.channel_id, event.id, turn.voice_session_id)
            return None
        return pcm

    # ------------------------------------------------------------------ replies (R5)

    def _agent_status(self, room_id: str, event: SessionError | SessionReconnected) -> None:
        """The session lost its provider (refused, or unreachable for `UNREACHABLE_AFTER_S`) or
        has it back: the room's `ON_AGENT_STATUS` observers hear it once per outage (the
        server's feed says so, so the room knows its model is away and its lines wait)."""
        state, kit = self._rooms.get(room_id), self.kit
        if state is None or kit is None:
            return
        if isinstance(event, SessionReconnected):
            status = self._status.tell(kit, room_id, True)
        elif event.code in UNAVAILABLE_CODES:
            reason = unavailable_reason(state.session.provider, event)
            status = self._status.tell(kit, room_id, False, reason)
        else:
            return
        if status is not None:
            log.warning("room %s: the realtime model is %s%s", room_id,
                        "back" if status.available else "unavailable",
                        f" ({status.reason})" if status.reason else "")  # fmt: skip

    async def _on_session_event(self, room_id: str, event: SessionEvent) -> None:
        kit = self.kit
        if kit is None:
            return
        if isinstance(event, SessionError | SessionReconnected):
            self._agent_status(room_id, event)
            return
        if isinstance(event, ReplyTranscript):
            state = self._rooms.get(room_id)
            if state is not None:
                state.said[event.response_id] = state.said.get(event.response_id, "") + event.delta
                while len(state.said) > KEPT_STOPPED:
                    state.said.popitem(last=False)
        elif isinstance(event, ReplyAudio):
            sinks = await kit.channels_in(room_id)
            state = self._rooms.get(room_id)
            if state is not None:  # (looked at after the await: a `stop_reply` meanwhile counts)
                if event.response_id in state.stopped:  # dropped, but the provider made it
                    if state.playing is not None and state.playing.response_id == event.response_id:
                        state.playing.made += len(event.pcm16) / 2 / max(1, event.sample_rate)
                    return
                if state.audio_of != event.response_id:  # its first audio
                    self._first_audio(state, event.response_id)
                state.audio_of = event.response_id
            self._playing(room_id, event)
            for channel in sinks:
                if channel is self or not isinstance(channel, AudioSink):
                    continue
                try:
                    await channel.play(room_id, event.pcm16, event.sample_rate)
                except Exception:
                    log.exception("audio sink %s failed", channel.channel_id)
        elif isinstance(event, ReplyDone):
            state = self._rooms.get(room_id)
            interrupted = False
            text = event.transcript
            heard_ms: dict[str, int] = {}
            answered: dict[str, str | int] = {}
            if state is not None:
                state.said.pop(event.response_id, None)
                playing = state.playing
                if playing is not None and playing.response_id != event.response_id:
                    playing = None
                if playing is not None:
                    playing.done = True
                made_audio = playing is not None or state.audio_of == event.response_id
                if state.audio_of == event.response_id:
                    state.audio_of = None
                if event.response_id in state.stopped:
                    state.stopped.remove(event.response_id)
                    interrupted = True
                answer = state.answered.pop(event.response_id, None)
                if answer is not None:
                    answered = {"asked_by": answer[0], "first_audio_ms": answer[1]}
                elif not made_audio:  # the answer came without audio (timed out, failed, text)
                    state.asked = None
                cut = state.heard.pop(event.response_id, None)
                if cut is not None:  # talked over before it was done: posted as heard
                    interrupted = True
                    heard_ms = {"heard_ms": cut[0]}
                    text = heard_text(text, cut[1])
                    state.session.reply_heard(event.response_id, text)
            if not event.transcript.strip():
                return
            posted = await kit.post_event(
                room_id,
                self.channel_id,
                TextContent(body=text),
                metadata={
                    "ai_response": True,
                    "realtime_provider": state.session.provider if state else None,
                    "response_id": event.response_id,
                    "response_status": event.status,
                    "interrupted": interrupted,
                    **heard_ms,
                    **answered,
                },
            )
            if posted is not None and state is not None:
                state.replies.append(posted)
                playing = state.playing
                if playing is not None and playing.response_id == event.response_id:
                    playing.posted = posted
