"""`ACPAgentChannel`: an external agent, spoken to over the Agent Client Protocol, in a room (G3).

Why this shape: an ACP agent (a coding agent, a workflow bot) runs as a subprocess speaking
JSON-RPC over stdio, and keeps a *session*: what it was prompted with stays in its context. So,
like a realtime session and unlike a chat model, it cannot be handed a freshly labelled window
each time. The channel follows G3 through the engine's one implementation
(`attribution.session.SessionLabels`): every turn the room commits counts its speaker; the request
an agent is prompted with goes as sent while the room holds one speaker, and once a second speaker
is seen it opens with its sender's label (`@sms1: "Alice: approve it"`), the first labelled request
carrying the note; every later request in that session stays labelled. An instruction from the
application (a runtime system event) keeps its own text and rides the next prompt unlabelled.

A turn corrected in place (`RoomKit.update_event`: a voice turn committed early, corrected by the
final result) reaches `deliver_update`. A request still waiting for its prompt takes the corrected
words, so the agent never reads the early ones. The agent keeps a prompted request in its context
and cannot take it back, and a prompt of its own would make it answer again: so the correction
rides the next prompt, as a fixed block in Chorus's own words (`attribution.session.
correction_note`, the realtime channel's wording, counting back over requests) and then the
corrected line, rendered by the same `SessionLabels` as any request.

One subprocess per channel (`initialize` once), one ACP session per room (`session/new` on
attach). Prompts run one at a time per room, in commit order, on a worker task, so `deliver`
returns at once. The agent's `session/update` message chunks are gathered and, when the prompt
turn ends, posted as one room event of this channel (`ai_response`, `in_reply_to`, the stop
reason). `cancel(room)` (and a prompt that runs past `prompt_timeout`) sends `session/cancel`.

The room context the agent may read is offered as a resource: each prompt links
`chorus://rooms/<room>/transcript`, which the agent reads with `fs/read_text_file`. It is written
with the same labels (`Alice: "…"`, `@sms1: "…"`, the agent's own turns `[assistant]: "…"`, and a
one-to-one room `[user]: "…"`). Nothing else on the client's side is offered (no file system, no
terminal, permission requests are answered `cancelled`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, cast

from acp import PROTOCOL_VERSION, Client, RequestError, text_block
from acp.client.connection import ClientSideConnection
from acp.helpers import resource_link_block
from acp.schema import (
    AgentMessageChunk,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    ReadTextFileResponse,
    RequestPermissionResponse,
    ResourceContentBlock,
    TextContentBlock,
)
from acp.transports import spawn_stdio_transport

from attribution import Register, label_for, labelled_lines, labelling_on, neutralize_marks
from attribution.session import CorrectionWording, SessionLabels, SessionLine, correction_note
from models import RoomEvent, TextContent
from rooms.channel import Channel, RoomContext
from rooms.hooks import AgentStatusBoard
from rooms.retry import Backoff

log = logging.getLogger(__name__)

AGENT_RESTART = Backoff(first=1.0, factor=2.0, longest=60.0)
"""How an agent process that exited is started again: after 1 s, doubling, at most a minute
apart, as long as the channel lives."""


async def _exited(process: asyncio.subprocess.Process, within_s: float = 5.0) -> bool:
    """Whether `process` has exited, or does within `within_s` (a closed connection is seen a
    moment before the process is reaped)."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), within_s)
    return process.returncode is not None

AGENT_CHANNEL_TYPES = frozenset({"ai", "realtime"})
"""Channel types of agents: their turns do not prompt an agent unless `answer_agents` is set."""
TRANSCRIPT_URI = "chorus://rooms/{room}/transcript"
PromptBlock = TextContentBlock | ResourceContentBlock

CORRECTABLE_REQUESTS = 256
"""How many of a room's latest prompted requests a correction can still reach (bounds what a
session remembers of them: a correction comes seconds after its turn)."""

REQUEST_CORRECTION = CorrectionWording(
    counted="request",
    how_counted="one per prompt, corrections not counted",
    follows="block",
    replaces="request",
)
"""The block before a corrected request counts back over the requests the agent was prompted
with, one per prompt (its instructions and earlier correction blocks are no request)."""


@dataclass
class _Request:
    event: RoomEvent
    line: SessionLine
    """What the agent will be prompted with; a correction before the prompt replaces it."""
    epoch: int = 0
    """The agent process `line` was rendered for (`ACPAgentChannel.restarts` then): a request
    queued before a restart is rendered again for the fresh session (G3: its note)."""


@dataclass(frozen=True)
class _SentRequest:
    number: int
    """Its place among the requests the session was prompted with (1: the first)."""
    text: str
    """The words the agent holds for it, without the note: as prompted, or as last corrected."""


@dataclass(frozen=True)
class _Correction:
    number: int
    """The corrected request's place among the requests the session was prompted with."""
    line: SessionLine


@dataclass
class _RoomSession:
    room_id: str
    session_id: str
    labels: SessionLabels = field(default_factory=SessionLabels)
    queue: asyncio.Queue[_Request | str] = field(default_factory=asyncio.Queue)
    """Requests (and application instructions, as text) in commit order."""
    waiting: dict[str, _Request] = field(default_factory=dict)
    """The requests still in `queue`, by event id: a correction replaces their line."""
    requests_sent: int = 0
    sent: OrderedDict[str, _SentRequest] = field(default_factory=OrderedDict)
    """The latest `CORRECTABLE_REQUESTS` prompted requests, by event id."""
    corrections: dict[str, _Correction] = field(default_factory=dict)
    """Corrections of prompted requests, by event id, in the order they came: they ride the
    next prompt (a later correction of the same request takes its place)."""
    worker: asyncio.Task[None] | None = None
    chunks: list[str] = field(default_factory=list)
    """The agent's message chunks of the prompt turn in flight."""
    in_flight: bool = False
    streaming: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the prompt turn in flight has streamed its first message chunk."""
    prompts: list[list[PromptBlock]] = field(default_factory=list)
    """Every prompt sent in this session, as sent."""
    replies: list[RoomEvent] = field(default_factory=list)


class _ChorusClient:
    """The client side of the connection: streams replies, serves the room transcript."""

    def __init__(self, channel: ACPAgentChannel) -> None:
        self.channel = channel

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        state = self.channel._by_session.get(session_id)
        if state is None:
            return
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            if state.in_flight:
                state.chunks.append(update.content.text)
                state.streaming.set()

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        state = self.channel._by_session.get(session_id)
        if state is None or path != self.channel.transcript_uri(state.room_id):
            raise RequestError.resource_not_found(path)
        text = await self.channel.transcript(state.room_id)
        if line is not None or limit is not None:
            lines = text.split("\n")
            first = max(0, (line or 1) - 1)
            lines = lines[first : first + limit if limit is not None else None]
            text = "\n".join(lines)
        return ReadTextFileResponse(content=text)

    async def request_permission(
        self, session_id: str, tool_call: Any, options: Any, **kwargs: Any
    ) -> RequestPermissionResponse:
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


class ACPAgentChannel(Channel):
    """`ACPAgentChannel("agent1", ["my-agent", "--acp"])`: an ACP agent subprocess in rooms.

    - `command`: the agent's executable and arguments (run with `env` added to a trimmed
      environment, in `cwd`, which is also the session's working directory).
    - `should_prompt`: which turns the agent is prompted with (default: every message from a
      channel that is not an agent; `answer_agents=True` includes agents).
    - `prompt_timeout`: seconds a prompt turn may run before it is cancelled (`None`: no bound).
    - `transcript_events`: how many of the room's latest turns the transcript resource holds.

    Its channel type is `ai`: other agent channels recognise its replies as an agent's and do
    not answer them (two agents would loop).
    """

    channel_type: ClassVar[str] = "ai"

    def __init__(
        self,
        channel_id: str,
        command: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | Path | None = None,
        should_prompt: Callable[[RoomEvent], bool] | None = None,
        answer_agents: bool = False,
        prompt_timeout: float | None = 300.0,
        cancel_grace: float = 10.0,
        transcript_events: int = 50,
        restart_backoff: Backoff = AGENT_RESTART,
    ) -> None:
        super().__init__(channel_id)
        if not command:
            raise ValueError("command must name the agent's executable")
        self.command = list(command)
        self.env = dict(env or {})
        self.cwd = str(Path(cwd or os.getcwd()).resolve())
        self.answer_agents = answer_agents
        self._should_prompt = should_prompt
        self.prompt_timeout = prompt_timeout
        self.cancel_grace = cancel_grace
        self.transcript_events = transcript_events
        self._connection: ClientSideConnection | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._start_lock = asyncio.Lock()
        self._rooms: dict[str, _RoomSession] = {}
        self._by_session: dict[str, _RoomSession] = {}
        self.agent_info: Implementation | None = None
        self.restart_backoff = restart_backoff
        """How an agent process that exited is started again (`AGENT_RESTART`)."""
        self.restarts = 0
        """Times the agent process exited and was started again."""
        self._up = asyncio.Event()  # the agent process is running (prompts wait for it)
        self._watcher: asyncio.Task[None] | None = None
        self._restarter: asyncio.Task[None] | None = None
        self._closing = False
        self._status = AgentStatusBoard(channel_id)  # the rooms told the agent is away

    # ------------------------------------------------------------------ the agent process

    async def _connect(self) -> ClientSideConnection:
        if self._connection is not None:
            return self._connection
        stack = contextlib.AsyncExitStack()
        try:
            reader, writer, process = await stack.enter_async_context(
                spawn_stdio_transport(self.command[0], *self.command[1:], env=self.env, cwd=self.cwd)
            )
            if process.stderr is not None:  # a pipe nobody reads would stall a chatty agent
                drain = asyncio.create_task(self._log_stderr(process.stderr))
                stack.callback(drain.cancel)
            # The client implements only what it offers; the library answers the rest
            # `method not found`.
            connection = ClientSideConnection(cast(Client, _ChorusClient(self)), writer, reader)
            stack.push_async_callback(connection.close)
            response = await connection.initialize(
                protocol_version=PROTOCOL_VERSION,
                client_capabilities=ClientCapabilities(
                    fs=FileSystemCapabilities(read_text_file=True, write_text_file=False),
                    terminal=False,
                ),
                client_info=Implementation(name="chorus", title="Chorus", version="0.1"),
            )
        except BaseException:
            await stack.aclose()
            raise
        self.agent_info = response.agent_info
        self._stack, self._connection, self._process = stack, connection, process
        self._watcher = asyncio.create_task(self._watch(process),
                                            name=f"acp-{self.channel_id}-watch")  # fmt: skip
        return connection

    async def _watch(self, process: asyncio.subprocess.Process) -> None:
        """The agent process exits (it crashed, or was killed): every room's session with it is
        gone. The rooms hear that their agent is away (`ON_AGENT_STATUS`), and it is started
        again (`restart_backoff`), a fresh session per room; what waits to be prompted waits for
        it, and a prompt the agent died in is prompted again on the fresh session."""
        code = await process.wait()
        if self._closing or process is not self._process:
            return
        log.warning("agent %s exited with code %s; starting it again", self.channel_id, code)
        self._up.clear()
        stack, self._stack, self._connection, self._process = self._stack, None, None, None
        if stack is not None:
            with contextlib.suppress(Exception):
                await stack.aclose()
        self._tell(False, f"the agent exited with code {code}")
        self._restarter = asyncio.create_task(self._restart(),
                                              name=f"acp-{self.channel_id}-restart")  # fmt: skip

    async def _restart(self) -> None:
        attempt = 0
        while not self._closing:
            attempt += 1
            await asyncio.sleep(self.restart_backoff.delay(attempt))
            try:
                async with self._start_lock:
                    connection = await self._connect()
                    for state in list(self._rooms.values()):
                        await self._fresh_session(connection, state)
            except Exception as exc:
                if self.restart_backoff.exhausted(attempt):
                    log.error("agent %s could not be started again (%s); giving up",
                              self.channel_id, exc)  # fmt: skip
                    return
                log.warning("agent %s: start %d failed (%s); trying again", self.channel_id,
                            attempt, exc)  # fmt: skip
                continue
            self.restarts += 1
            self._up.set()  # (only now: every room holds its fresh session)
            log.info("agent %s started again (restart %d)", self.channel_id, self.restarts)
            self._tell(True)
            return

    async def _fresh_session(self, connection: ClientSideConnection, state: _RoomSession) -> None:
        """A new ACP session for the room on a restarted agent: it holds nothing of the old one,
        so the room's labelling starts again (G3; who already spoke counts) and no correction
        can reach a request of the old session."""
        created = await connection.new_session(cwd=self.cwd, mcp_servers=[])
        self._by_session.pop(state.session_id, None)
        state.session_id = created.session_id
        self._by_session[state.session_id] = state
        state.labels = SessionLabels()
        for spoken in await self.require_kit().past_labels(state.room_id, self._counts):
            state.labels.count(spoken)
        state.requests_sent = 0
        state.sent.clear()
        state.corrections.clear()

    def _tell(self, available: bool, reason: str | None = None) -> None:
        """Every attached room's `ON_AGENT_STATUS` observers hear whether the agent runs."""
        kit = self.kit
        if kit is None:
            return
        for room_id in list(self._rooms):
            self._status.tell(kit, room_id, available, reason)

    async def _log_stderr(self, stderr: asyncio.StreamReader) -> None:
        while line := await stderr.readline():
            log.info("agent %s: %s", self.channel_id, line.decode(errors="replace").rstrip())

    @property
    def process(self) -> asyncio.subprocess.Process | None:
        """The agent subprocess, once started."""
        return self._process

    # ------------------------------------------------------------------ rooms and sessions

    async def on_attach(self, room_id: str) -> None:
        if self._restarter is not None and not self._restarter.done():
            await self._up.wait()  # the agent is being started again: not a second one
        async with self._start_lock:
            if room_id in self._rooms:
                return
            connection = await self._connect()
            self._up.set()
            created = await connection.new_session(cwd=self.cwd, mcp_servers=[])
            state = _RoomSession(room_id=room_id, session_id=created.session_id)
            # who already spoke (G3 counts the room)
            for spoken in await self.require_kit().past_labels(room_id, self._counts):
                state.labels.count(spoken)
            state.worker = asyncio.create_task(
                self._prompt_loop(state), name=f"acp-{self.channel_id}-{room_id}"
            )
            self._rooms[room_id] = state
            self._by_session[state.session_id] = state

    async def on_detach(self, room_id: str) -> None:
        state = self._rooms.pop(room_id, None)
        if state is not None:
            await self._end_session(state)

    async def _end_session(self, state: _RoomSession) -> None:
        if state.in_flight and self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.cancel(session_id=state.session_id)
        if state.worker is not None:
            state.worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await state.worker
        self._by_session.pop(state.session_id, None)

    async def close(self) -> None:
        self._closing = True
        for task in (self._restarter, self._watcher):
            if task is not None and task is not asyncio.current_task():
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
        for state in list(self._rooms.values()):
            await self._end_session(state)
        self._rooms.clear()
        stack, self._stack, self._connection, self._process = self._stack, None, None, None
        if stack is not None:
            await stack.aclose()

    def session_id(self, room_id: str) -> str:
        """The ACP session id of the room (attach the channel first)."""
        return self._state(room_id).session_id

    def prompts_for(self, room_id: str) -> list[list[PromptBlock]]:
        """Every prompt this channel sent in the room's session, as sent."""
        return [list(p) for p in self._state(room_id).prompts]

    def replies_for(self, room_id: str) -> list[RoomEvent]:
        """The agent's replies this channel posted into the room, in order."""
        return list(self._state(room_id).replies)

    def _state(self, room_id: str) -> _RoomSession:
        try:
            return self._rooms[room_id]
        except KeyError:
            raise KeyError(
                f"channel {self.channel_id!r} is not attached to room {room_id!r}"
            ) from None

    async def wait_idle(self, room_id: str) -> None:
        """Wait until every queued request of the room was prompted and answered (tests)."""
        await self._state(room_id).queue.join()

    async def wait_streaming(self, room_id: str) -> None:
        """Wait until the room's prompt turn in flight has streamed a message chunk (tests)."""
        await self._state(room_id).streaming.wait()

    async def cancel(self, room_id: str) -> bool:
        """Send `session/cancel` for the room's prompt in flight; False when none is."""
        state = self._state(room_id)
        if not state.in_flight or self._connection is None:
            return False
        await self._connection.cancel(session_id=state.session_id)
        return True

    # ------------------------------------------------------------------ room events → prompts

    def _counts(self, event: RoomEvent) -> bool:
        return (
            event.kind != "system"
            and event.source.channel_id != self.channel_id
            and event.visible_to(self.channel_id)
        )

    def should_prompt(self, event: RoomEvent) -> bool:
        if event.kind != "message":
            return False
        if event.source.channel_type in AGENT_CHANNEL_TYPES and not self.answer_agents:
            return False
        return self._should_prompt(event) if self._should_prompt is not None else True

    async def deliver(self, event: RoomEvent, ctx: RoomContext) -> None:
        state = self._rooms.get(ctx.room_id)
        if state is None:
            await self.on_attach(ctx.room_id)
            state = self._state(ctx.room_id)
        if event.kind == "system":
            # An instruction from the application keeps its own text and is not labelled (G3).
            state.queue.put_nowait(event.text)
            return
        participants = await ctx.participants()
        register = await ctx.kit.get_register(ctx.room_id) or Register.new()
        if self.should_prompt(event):
            request = _Request(event=event, line=state.labels.render(event, participants, register),
                               epoch=self.restarts)  # fmt: skip
            state.waiting[event.id] = request
            state.queue.put_nowait(request)
        else:
            state.labels.count_event(event, participants, register)

    async def deliver_update(self, event: RoomEvent, ctx: RoomContext) -> None:
        """A turn of the room was corrected in place (an early voice turn the final result
        changed: other words, or another voice). Rendered by the session's labels exactly as a
        new request (so a correction can change who said it, never let the words claim a name):

        - a request not prompted yet is prompted with the corrected line (keeping the note if it
          carried it);
        - a prompted request's correction rides the next prompt: the fixed block, then the line.
          Nothing rides when the line reads as the agent holds it (only the turn's times
          changed, or a later correction put the words back before the next prompt), for a
          request older than the latest `CORRECTABLE_REQUESTS`, or for a turn that never
          prompted the agent (its speaker is counted, G3). No prompt turn of its own: the agent
          answered the request, or not, when it came.
        """
        state = self._rooms.get(ctx.room_id)
        if state is None or not self._counts(event):
            return
        participants = await ctx.participants()
        register = await ctx.kit.get_register(ctx.room_id) or Register.new()
        waiting = state.waiting.get(event.id)
        if waiting is not None:
            line = state.labels.render(event, participants, register)
            waiting.event = event
            waiting.line = line.with_note() if waiting.line.carries_note else line
            return
        sent = state.sent.get(event.id)
        if sent is None:
            state.labels.count_event(event, participants, register)
            return
        line = state.labels.render(event, participants, register)
        replaced = state.corrections.pop(event.id, None)
        if line.text_without_note == sent.text:
            return
        if replaced is not None and replaced.line.carries_note:
            line = line.with_note()
        state.corrections[event.id] = _Correction(number=sent.number, line=line)

    @staticmethod
    def _take_corrections(state: _RoomSession) -> list[PromptBlock]:
        """The blocks of the corrections waiting for this prompt, each counted back from its own
        block over the requests prompted before it; the agent holds their lines from now on."""
        blocks: list[PromptBlock] = []
        for event_id, fix in state.corrections.items():
            back = state.requests_sent - fix.number + 1
            blocks.append(text_block(correction_note(back, REQUEST_CORRECTION)))
            blocks.append(text_block(fix.line.text))
            if event_id in state.sent:
                state.sent[event_id] = _SentRequest(fix.number, fix.line.text_without_note)
        state.corrections.clear()
        return blocks

    @staticmethod
    def _remember_sent(state: _RoomSession, request: _Request) -> None:
        state.requests_sent += 1
        event_id = request.event.id
        state.sent[event_id] = _SentRequest(state.requests_sent, request.line.text_without_note)
        while len(state.sent) > CORRECTABLE_REQUESTS:
            state.sent.popitem(last=False)

    async def _prompt_loop(self, state: _RoomSession) -> None:
        instructions: list[str] = []
        while True:
            item = await state.queue.get()
            try:
                if isinstance(item, str):
                    instructions.append(item)
                    continue
                state.waiting.pop(item.event.id, None)
                await self._prompt_request(state, item, instructions)
                instructions = []
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("agent %s: prompt in room %s failed", self.channel_id, state.room_id)
            finally:
                state.queue.task_done()

    async def _prompt_request(
        self, state: _RoomSession, item: _Request, instructions: list[str]
    ) -> None:
        """Prompt the agent with `item` (after the instructions that came before it and the
        corrections waiting), once the agent runs; again, once, on a fresh session when the
        agent process died under the prompt."""
        for attempt in (1, 2):
            await self._up.wait()
            process = self._process
            if item.epoch != self.restarts:  # rendered for a session that is gone
                kit = self.require_kit()
                participants = await kit.get_participants(state.room_id)
                register = await kit.get_register(state.room_id) or Register.new()
                item.line, item.epoch = state.labels.render(item.event, participants,
                                                            register), self.restarts  # fmt: skip
            blocks: list[PromptBlock] = [text_block(text) for text in instructions]
            blocks.extend(self._take_corrections(state))
            blocks.append(text_block(item.line.text))
            self._remember_sent(state, item)
            blocks.append(
                resource_link_block(
                    "room-transcript",
                    self.transcript_uri(state.room_id),
                    mime_type="text/plain",
                    description="The room's latest turns, labelled as in this prompt.",
                )
            )
            try:
                await self._prompt(state, item.event, blocks)
                return
            except ConnectionError:  # the connection closed under the prompt
                if attempt == 2 or process is None or not await _exited(process):
                    raise
                log.warning("agent %s died during a prompt in room %s; it is prompted again "
                            "once the agent runs", self.channel_id, state.room_id)  # fmt: skip

    async def _prompt(self, state: _RoomSession, trigger: RoomEvent, blocks: list[PromptBlock]) -> None:
        connection = self._connection
        if connection is None:
            raise RuntimeError(f"agent {self.channel_id!r} is not running")
        state.prompts.append(blocks)
        state.chunks = []
        state.streaming.clear()
        state.in_flight = True
        try:
            turn = asyncio.ensure_future(
                connection.prompt(session_id=state.session_id, prompt=list(blocks))
            )
            try:
                response = await asyncio.wait_for(asyncio.shield(turn), self.prompt_timeout)
            except TimeoutError:
                log.warning("agent %s: prompt ran past %s s, cancelling", self.channel_id, self.prompt_timeout)
                await connection.cancel(session_id=state.session_id)
                response = await asyncio.wait_for(turn, self.cancel_grace)
        finally:
            state.in_flight = False
        text = "".join(state.chunks)
        state.chunks = []
        if not text.strip():
            return
        posted = await self.require_kit().post_event(
            state.room_id,
            self.channel_id,
            TextContent(body=text),
            metadata={
                "ai_response": True,
                "in_reply_to": trigger.id,
                "acp_session_id": state.session_id,
                "acp_stop_reason": response.stop_reason,
            },
        )
        if posted is not None:
            state.replies.append(posted)

    # ------------------------------------------------------------------ the room as a resource

    def transcript_uri(self, room_id: str) -> str:
        return TRANSCRIPT_URI.format(room=room_id)

    async def transcript(self, room_id: str) -> str:
        """The room's latest turns as the agent may read them, one `Label: "line"` per line.

        Labelled when the session is (G3) or when the turns shown hold two speakers (A1): people
        by their labels, a nameless sender as `@channel`, another agent as `@its-channel`, this
        agent's own turns `[assistant]`; a one-to-one room reads `[user]` / `[assistant]`. A
        runtime system event keeps its own text.
        """
        state = self._rooms.get(room_id)
        kit = self.require_kit()
        # the latest events it may see (visible to it, or its own), read as a window
        events = await kit.store.list_window(room_id, self.channel_id, self.transcript_events)
        participants = await kit.get_participants(room_id)
        register = await kit.get_register(room_id) or Register.new()
        labelled = (state is not None and state.labels.labelling) or labelling_on(
            events, participants, self.channel_id, register=register
        )
        lines: list[str] = []
        for event in events:
            if event.kind == "system":
                lines.append(event.text)
            elif event.source.channel_id == self.channel_id:
                lines.append(labelled_lines("[assistant]", event.text))
            elif labelled:
                label = label_for(event, participants, register)
                lines.append(labelled_lines(label, neutralize_marks(event.text)))
            else:
                lines.append(labelled_lines("[user]", neutralize_marks(event.text)))
        return "\n".join(lines)
