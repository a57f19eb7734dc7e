"""A SIP endpoint in `chorus serve` (`[sip]`): each call is one leg of a room.

Owns what Chorus decides about a SIP call — which room (`sip:ROOM@host`, or `X-Chorus-Room`),
whether the caller may join (digest authentication against `[sip] users`, RFC 7616 with MD5),
who the leg is (the From display name, else the authenticated user; never the caller's number),
whether it is a speakerphone (`X-Chorus-Shared-Mic: true` or a user in `shared_mic_users`), and
which codec (G.722 when offered, else PCMU/PCMA) — and the leg as a `server.sockets.StreamSocket`
(`SipLeg`: decoded audio in, paced RTP out, BYE) with its `server.framing` shape (`SipFraming`),
so `server.streaming` runs it like every other stream. A leg is put on hold and resumed by
re-INVITE, and the caller talking over a reply drops the reply audio queued for it (barge-in).

The SIP and RTP wire is not written here: `aiosipua` (SIP transactions, dialogs, SDP offer/answer)
and `aiortp` (RTP, G.711/G.722, jitter buffer with reordering, PLC, RFC 4733 DTMF), the `sip`
extra; docs/phone.md says why these.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import hmac
import logging
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, cast

from server.framing import Outgoing, StreamDeclaration, StreamKind, declared_format
from server.protocol import ROOM_ID
from server.reply_audio import FRAME_SECONDS, BargeIn, ReplyBacklog, convert_reply
from server.sockets import (
    REFUSAL_WAIT_S,
    PauseFill,
    SocketClosed,
    messages_until_closed,
)

if TYPE_CHECKING:
    from aiortp.jitterbuffer import JitterBuffer, JitterFrame
    from aiortp.packet import RtpPacket
    from aiosipua import CallSession, IncomingCall, SipRequest

    from server.config import SipConfig

log = logging.getLogger("chorus.server.sip")

G722, PCMU, PCMA = 9, 0, 8
_CODEC_NAMES = {G722: "G722", PCMU: "PCMU", PCMA: "PCMA"}
NONCE_TTL_S = 300.0
PORT_ATTEMPTS = 5
"""Ports tried when one chosen free is taken before it is bound: `listen` on port 0 (UDP ports
until TCP takes the same number), and each call's RTP port."""
RTP_FRAME_S = 0.02
_DISPLAY_NAME = re.compile(r"[^\w .'-]+")


# --- who may call: digest authentication --------------------------------------------------------


class DigestCheck:
    """Server-side digest authentication (RFC 7616 / RFC 2617, MD5, `qop=auth` or none).

    A nonce is a timestamp and its HMAC under the server's secret, so it needs no state and a
    stale one (older than `NONCE_TTL_S`) is told apart from a wrong password."""

    def __init__(self, realm: str, users: dict[str, str], secret: str) -> None:
        self.realm = realm
        self.users = users
        self._key = hashlib.sha256(f"sip-nonce:{secret}".encode()).digest()

    def nonce(self, now: float | None = None) -> str:
        stamp = f"{int(now if now is not None else time.time()):x}"
        return f"{stamp}.{self._sign(stamp)}"

    def challenge(self, *, stale: bool = False) -> str:
        extra = ", stale=true" if stale else ""
        return (
            f'Digest realm="{self.realm}", nonce="{self.nonce()}", algorithm=MD5, '
            f'qop="auth"{extra}'
        )

    def _sign(self, stamp: str) -> str:
        return hmac.new(self._key, stamp.encode(), hashlib.sha256).hexdigest()[:24]

    def _nonce_state(self, nonce: str) -> str:
        stamp, _, mac = nonce.partition(".")
        if not hmac.compare_digest(mac, self._sign(stamp)):
            return "bad"
        try:
            age = time.time() - int(stamp, 16)
        except ValueError:
            return "bad"
        return "ok" if -5 <= age <= NONCE_TTL_S else "stale"

    def check(self, authorization: str | None, method: str) -> tuple[str, str | None]:
        """("ok", user), ("missing" | "stale", None): challenge; ("wrong", user or None): 403."""
        if not authorization:
            return "missing", None
        from aiosipua.headers import parse_auth

        try:
            creds = parse_auth(authorization, credentials=True)
        except Exception:
            return "wrong", None
        p = creds.params
        user = p.get("username", "")
        if creds.scheme.lower() != "digest" or p.get("realm") != self.realm:
            return "wrong", None
        state = self._nonce_state(p.get("nonce", ""))
        if state == "bad":
            return "wrong", None
        if state == "stale":
            return "stale", None
        password = self.users.get(user)
        if password is None or p.get("algorithm", "MD5").upper() != "MD5":
            return "wrong", None

        def h(text: str) -> str:
            return hashlib.md5(text.encode()).hexdigest()

        ha1 = h(f"{user}:{self.realm}:{password}")
        ha2 = h(f"{method}:{p.get('uri', '')}")
        if p.get("qop"):
            expected = h(f"{ha1}:{p.get('nonce')}:{p.get('nc')}:{p.get('cnonce')}:auth:{ha2}")
        else:
            expected = h(f"{ha1}:{p.get('nonce')}:{ha2}")
        if hmac.compare_digest(expected, p.get("response", "")):
            return "ok", user
        return "wrong", user


# --- what a call is ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SipCallPlan:
    room: str
    declaration_name: str
    participant: str
    shared_mic: bool


def room_of(invite: SipRequest) -> str | None:
    """`X-Chorus-Room`, else the request URI's user part (`sip:ROOM@host`); None if not a
    valid room id."""
    from aiosipua.headers import parse_uri

    room = invite.get_header("x-chorus-room")
    if room is None:
        try:
            room = parse_uri(invite.uri).user or ""
        except Exception:
            return None
    room = room.strip()
    return room if re.fullmatch(ROOM_ID, room) else None


def caller_name(invite: SipRequest, user: str) -> str:
    """The From display name (cleaned), else the authenticated user; a display name that is
    only a number is not used (never a raw phone number on a model-facing surface)."""
    addr = invite.from_addr
    display = (addr.display_name or "").strip().strip('"') if addr is not None else ""
    display = _DISPLAY_NAME.sub("", display).strip()[:80]
    if display and re.search(r"[^\d\s+().-]", display):
        return display
    return user


def is_shared(invite: SipRequest, user: str, shared_users: list[str]) -> bool:
    header = (invite.get_header("x-chorus-shared-mic") or "").strip().lower()
    return header in ("1", "true", "yes") or user in shared_users


# --- a leg as the server runs it -----------------------------------------------------------------


class SipFraming:
    """One SIP leg: decoded pcm16 at the codec's rate in, reply audio out at that rate."""

    kind: ClassVar[StreamKind] = "sip"

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self.stream_id: str | None = None
        self.on_dtmf: Callable[[str], None] | None = None
        self.on_reply_queued: Callable[[int], None] | None = None
        """Told how many chunks each reply was cut into (the leg's barge-in drops them)."""
        self.on_stop_reply: Callable[[], None] | None = None
        """Told when the room's reply is stopped (`SipLeg.stop_reply` drops what it queued)."""

    def declare(self, plan: SipCallPlan) -> StreamDeclaration:
        return StreamDeclaration(
            participant=plan.participant,
            name=plan.declaration_name,
            shared_mic=plan.shared_mic,
            format=declared_format(self.sample_rate, "pcm16", 1),
        )

    def audio(self, message: str | bytes) -> bytes | None:
        if isinstance(message, str):
            return b""
        return message[: len(message) - len(message) % 2]

    def answers(self) -> list[Outgoing]:
        return []

    def stop_reply(self, stopped: Outgoing) -> list[Outgoing]:
        if self.on_stop_reply is not None:
            self.on_stop_reply()
        return []

    def greeting(self, room: str, stream_id: str) -> list[Outgoing]:
        self.stream_id = stream_id
        return []

    def reply_audio(self, pcm16: bytes, sample_rate: int) -> list[Outgoing]:
        data = convert_reply(pcm16, sample_rate, self.sample_rate, "pcm16")
        step = int(self.sample_rate * FRAME_SECONDS) * 2
        chunks: list[Outgoing] = [data[i : i + step] for i in range(0, len(data), step)]
        if self.on_reply_queued is not None:
            self.on_reply_queued(len(chunks))
        return chunks


JITTER_FRAMES = 2
"""Whole frames aiortp's jitter buffer holds after a frame before handing it on (40 ms): packets
that arrive out of order by up to that much are put back in order; a packet later than that is
concealed as lost."""

HOLD_TAIL_S = 3.0
"""A leg put on hold is fed this much more of the pause it is in, so the turn its caller ended
just before the hold closes (the STT hears the pause after it); then nothing until the resume."""


class SkippedTime:
    """How much of the call a phone skipped before each frame, read from the RTP timestamps: a
    phone with silence suppression keeps its sequence numbers contiguous and moves its timestamp
    on by the time it did not send (RFC 3551 §4.1). The timestamp units per second are learnt from
    the frames themselves (the smallest step per second of audio seen), not taken from the SDP,
    because G.722 senders disagree on its clock (RFC 3551 says 8 kHz; some step 16 kHz). A step
    back, or forward by more than the wall time since the last frame (a new source, a restart),
    is a discontinuity: nothing skipped."""

    SLACK_S = 0.5
    """A skip may exceed the wall time since the last frame by this much (network jitter)."""

    def __init__(self) -> None:
        self._last: tuple[int, float, float] | None = None
        """The last frame: its timestamp, its length in seconds, when it came."""
        self._units_per_s: float | None = None

    def skipped(self, timestamp: int, seconds: float, now: float) -> float:
        """Seconds of the call the sender skipped between the last frame and this one (of
        `seconds` of audio, arriving at `now`)."""
        last, self._last = self._last, (timestamp, seconds, now)
        if last is None or last[1] <= 0:
            return 0.0
        step = (timestamp - last[0]) & 0xFFFFFFFF
        if step == 0 or step >= 0x80000000:
            return 0.0
        rate = step / last[1]
        if self._units_per_s is None or rate < self._units_per_s:
            self._units_per_s = rate
        skipped = step / self._units_per_s - last[1]
        if skipped < RTP_FRAME_S / 2 or skipped > now - last[2] + self.SLACK_S:
            return 0.0
        return skipped


def held_frames(buffer: JitterBuffer) -> list[JitterFrame]:
    """The whole frames an aiortp `JitterBuffer` still holds, oldest first, as `JitterFrame`s
    (each with the packets confirmed lost before it): what it would hand on only once later
    packets came. Packets of one timestamp make one frame; an empty slot before a held packet is
    a lost packet; a non-media slot (RFC 4733, RFC 3389) is neither. (aiortp has no public way to
    read them: this reads its buffer's slots, for the version range the `sip` extra pins.)"""
    from aiortp.jitterbuffer import _NON_MEDIA, JitterFrame

    origin = buffer._origin
    if origin is None:
        return []
    slots = [(n, buffer._packets[(origin + n) % buffer.capacity]) for n in range(buffer.capacity)]
    frames: list[JitterFrame] = []
    packets: list[RtpPacket] = []
    lost = 0
    previous = -1

    def frame_of_packets() -> None:
        nonlocal packets, lost
        frames.append(JitterFrame(b"".join(p.payload for p in packets), packets[0].timestamp, lost))
        packets, lost = [], 0

    for n, packet in ((n, p) for n, p in slots if p is not None):
        gap = n - previous - 1
        previous = n
        if packets and (gap or packet is _NON_MEDIA or packet.timestamp != packets[0].timestamp):
            frame_of_packets()
        lost += gap
        if packet is not _NON_MEDIA:
            packets.append(packet)
    if packets:
        frame_of_packets()
    return frames


class SipLeg:
    """One accepted call as a `StreamSocket`: the caller's decoded audio (from aiortp's jitter
    buffer) as messages until a BYE, a CANCEL or `rtp_timeout_s` without RTP (audio or RFC 3389
    comfort noise); a pause in the caller's audio longer than `server.sockets.SILENCE_FILL_S`
    reads as digital silence (`silence_filled_s`); binary messages sent go out as RTP 20 ms
    frames paced at real time; `close` sends BYE (unless the caller hung up) and closes the RTP
    session.

    On hold (a re-INVITE with `a=sendonly`, `a=inactive` or `c=0.0.0.0`: `hold(True)`) no RTP
    timeout hangs up, no reply audio is sent (it is dropped) and the caller's RTP audio (music on
    hold) is not handed on; `hold(False)` resumes, the RTP
    timeout counting from then. Barge-in (`server.reply_audio.BargeIn`: the caller talking while
    reply audio is queued for them) drops all of it (the frame being sent included); a reply
    queued afterwards plays."""

    def __init__(
        self, call: IncomingCall, session: CallSession, rtp_timeout_s: float, max_queued: int = 500
    ) -> None:
        self.call = call
        self.session = session
        self.room = ""
        self.remote = call.source_addr[0]
        self.closed_cleanly = False
        self.timed_out = False
        self.dropped_frames = 0
        self.held = False
        self.idle_while_held = 0
        """RTP timeouts that passed while the leg was on hold (no hang-up for them)."""
        self.dropped_while_held = 0
        """Reply RTP frames not sent because the leg was on hold."""
        self.ignored_while_held_s = 0.0
        """Seconds of the caller's RTP audio not handed on because the leg was on hold (a phone
        holding with `a=sendonly` may send music on hold)."""
        self.cleared_s = 0.0
        """Seconds of reply audio dropped by barge-in."""
        self._backlog = ReplyBacklog()
        self._cuts = 0
        """Times the reply queued for the caller was dropped (their barge-in, or the room's)."""
        self.heard_s = 0.0
        """Seconds of the caller's audio handed on by the jitter buffer (lost packets concealed)."""
        self.comfort_noise = 0
        """RFC 3389 comfort-noise packets received (they keep the leg from `rtp_timeout_s`)."""
        self.barge = BargeIn()
        """The caller talking over the reply queued for them (`_barge_in` drops it)."""
        self._quiet_from = time.monotonic()
        """Since when no RTP has come (or the last resume, or the last timeout counted on hold)."""
        self._held_at = 0.0
        self._draining = False
        self._pauses = PauseFill()
        """The caller's pauses fed as silence, on the wall clock and, when the caller talks
        again, from the RTP timestamps (`SkippedTime`)."""
        self._skips = SkippedTime()
        self._rtp_timeout_s = rtp_timeout_s
        self._audio: asyncio.Queue[bytes | None] = asyncio.Queue(max_queued)
        self._hung_up = False
        self._closed = False
        self._due = 0.0
        self._timestamp = 0
        session.on_audio = self._on_audio
        rtp = getattr(session, "rtp_session", None)
        if rtp is not None:
            rtp.on_cn = self._on_comfort_noise

    @property
    def silence_filled_s(self) -> float:
        """Seconds of silence fed for pauses in the caller's audio (`SILENCE_FILL_S`), on hold
        only for its first `HOLD_TAIL_S`."""
        return self._pauses.filled_s

    def _on_comfort_noise(self, level: int) -> None:
        self.comfort_noise += 1
        self._quiet_from = time.monotonic()

    def _on_audio(self, pcm: bytes, timestamp: int) -> None:
        now = time.monotonic()
        self._quiet_from = now
        rate = self.session.codec_sample_rate
        seconds = len(pcm) / 2 / rate
        if self.held:  # music on hold, or the caller's hold announcement: not the caller talking
            self.ignored_while_held_s += seconds
            return
        if not self._draining:  # drained frames are audio from before the pause, not heard now
            self._pauses.heard(now)
        self.heard_s += seconds
        skipped = self._skips.skipped(timestamp, seconds, now)
        owed = self._pauses.owed(skipped) if skipped else 0.0
        if owed:  # the rest of a pause shorter than SILENCE_FILL_S, or its part after the last fill
            self._put(self._silence(owed))
        if self.barge.heard(pcm, rate, playing=self._backlog.waiting):
            self._barge_in()
        self._put(pcm)

    def _put(self, pcm: bytes) -> None:
        try:
            self._audio.put_nowait(pcm)
        except asyncio.QueueFull:
            self.dropped_frames += 1

    def reply_queued(self, chunks: int) -> None:
        self._backlog.queued(chunks)

    @property
    def barge_ins(self) -> int:
        """Times the caller talked over the reply queued for them."""
        return self.barge.count

    def _barge_in(self) -> None:
        """The caller speaks over the reply: every reply chunk queued so far is dropped."""
        dropped = self._cut()
        log.info("sip leg %s: barge-in, %d reply chunks dropped", self.call.call_id,
                 dropped)  # fmt: skip

    def stop_reply(self) -> None:
        """Someone else in the room talked over the reply: what is queued of it is dropped."""
        self._cut()

    def _cut(self) -> int:
        self._cuts += 1
        self.barge.reply_dropped()
        return self._backlog.cut()

    def hold(self, held: bool) -> None:
        """On hold or resumed; a re-INVITE that leaves it as it was (a session refresh, a media
        move) changes nothing here."""
        if held == self.held:
            return
        log.info("sip leg %s: %s", self.call.call_id, "on hold" if held else "resumed")
        self.held = held
        now = time.monotonic()
        self._quiet_from = now  # the timeout counts from a hold or a resume
        self._skips = SkippedTime()  # a hold's time is not fed, past its first HOLD_TAIL_S
        if held:
            self._held_at = now
        else:
            self._pauses.resume(now)

    def drain_jitter(self) -> bool:
        """Hand on the frames aiortp's jitter buffer still holds (the `JITTER_FRAMES` after the
        newest it handed on), through the same path as every frame; True if there were any. The
        buffer lets a frame go only once later packets come: a phone with silence suppression
        sends them only when the caller talks again, and after a hang-up none come, so without
        this the last 40 ms of each talk spurt reached the STT after the pause (the start of
        the next utterance) or never."""
        rtp = getattr(self.session, "rtp_session", None)
        buffer = getattr(rtp, "_jitter_buffer", None)
        deliver = getattr(rtp, "_deliver_audio_frame", None)
        if buffer is None or deliver is None:
            return False
        frames = held_frames(buffer)
        if not frames:
            return False
        buffer.reset()  # the next packet starts it again
        self._draining = True
        try:
            for frame in frames:
                deliver(frame)
        finally:
            self._draining = False
        return True

    def hung_up(self) -> None:
        """The caller sent BYE (or CANCEL): the stream ends after what it already sent."""
        self._hung_up = True
        self.drain_jitter()
        with contextlib.suppress(asyncio.QueueFull):
            self._audio.put_nowait(None)

    async def recv(self) -> bytes:
        if self._closed:
            raise SocketClosed("closed")
        while True:
            now = time.monotonic()
            due = self._quiet_from + self._rtp_timeout_s
            fill = self._pauses.due()
            if fill is not None and (not self.held or fill <= self._held_at + HOLD_TAIL_S):
                due = min(due, fill)
            try:
                item = await asyncio.wait_for(self._audio.get(), max(due - now, 0.005))
                break
            except TimeoutError:
                pass
            now = time.monotonic()
            if now - self._quiet_from >= self._rtp_timeout_s:
                if self.held:  # no hang-up on hold: counted, and the next timeout counts from now
                    self.idle_while_held += 1
                    self._quiet_from = now
                    continue
                self.timed_out = True
                self.closed_cleanly = True
                log.info("sip leg %s: no RTP for %.0f s, hanging up", self.call.call_id,
                         self._rtp_timeout_s)  # fmt: skip
                raise SocketClosed("rtp timeout")
            if self.drain_jitter():  # the caller's last frames come before the pause's silence
                continue
            silence = self._pauses.take(min(now, self._held_at + HOLD_TAIL_S) if self.held else now)
            if silence:
                return self._silence(silence)
        if item is None:
            self.closed_cleanly = True
            raise SocketClosed("caller hung up")
        return item

    def _silence(self, seconds: float) -> bytes:
        """`seconds` (whole 20 ms frames) of silence at the codec's rate."""
        frames = round(seconds / RTP_FRAME_S)
        return bytes(frames * int(self.session.codec_sample_rate * RTP_FRAME_S) * 2)

    def messages(self) -> AsyncIterator[str | bytes]:
        return messages_until_closed(self)

    async def send(self, message: str | bytes) -> None:
        if isinstance(message, str):
            return
        if self._closed:
            raise SocketClosed("closed")
        rate = self.session.codec_sample_rate
        if not self._backlog.sending():
            self.cleared_s += len(message) / 2 / rate
            return
        self.barge.reply_out(message, rate)  # (it goes out at real time from now)
        cuts = self._cuts
        clock = self.session.clock_rate
        step = int(rate * RTP_FRAME_S) * 2
        loop = asyncio.get_running_loop()
        for i in range(0, len(message), step):
            if self._cuts != cuts:  # dropped while this chunk was being sent
                self.cleared_s += (len(message) - i) / 2 / rate
                return
            if self.held:
                self.dropped_while_held += 1
                continue
            frame = message[i : i + step]
            if len(frame) < step:
                frame = frame + bytes(step - len(frame))
            now = loop.time()
            self._due = max(self._due, now)
            wait = self._due - 0.06 - now
            if wait > 0:
                await asyncio.sleep(wait)
            if self._closed:
                raise SocketClosed("closed")
            self.session.send_audio_pcm(frame, self._timestamp)
            self._timestamp = (self._timestamp + int(clock * RTP_FRAME_S)) & 0xFFFFFFFF
            self._due += RTP_FRAME_S

    async def close(self, code: int, reason: str = "", *, within_s: float = REFUSAL_WAIT_S) -> None:
        if self._closed:
            return
        self._closed = True
        if not self._hung_up:
            with contextlib.suppress(Exception):
                _hangup(self.call)  # BYE
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.session.close(), within_s)

    async def refuse(self, code: int, reason: str) -> None:
        await self.close(code, reason)


SUPPORTED_OPTIONS = frozenset({"100rel"})
"""The SIP option tags a request may require of this endpoint. `100rel` (RFC 3262) holds
without anything to do: the endpoint sends no provisional response but 100 Trying, which is
never sent reliably. Session timers are off (no `Session-Expires` in an answer), so `timer` is
not one; nor is `precondition` (RFC 3312) or any other."""


def unsupported_options(request: SipRequest) -> list[str]:
    """The option tags of `request`'s `Require` headers this endpoint does not support, in their
    order, for a 420 Bad Extension (RFC 3261 §8.2.2.3: not for ACK or CANCEL)."""
    if request.method.upper() in ("ACK", "CANCEL"):
        return []
    tags = (t.strip() for value in request.headers.get("require") for t in value.split(","))
    return list(dict.fromkeys(t for t in tags if t and t.lower() not in SUPPORTED_OPTIONS))


# --- the endpoint -------------------------------------------------------------------------------

OnLeg = Callable[[SipLeg, SipFraming, SipCallPlan], Awaitable[None]]


class SipEndpoint:
    """The UAS on `[sip] listen` (UDP, and TCP on the same port): INVITEs checked and answered
    here, re-INVITEs hold or resume a leg, each accepted call handed to `on_leg` (the server runs
    it as a stream). `admit()` says whether the server takes
    another call now: None, or the SIP status and reason to refuse it with."""

    def __init__(
        self,
        config: SipConfig,
        secret: str,
        on_leg: OnLeg,
        admit: Callable[[str], tuple[int, str] | None],
    ) -> None:
        from models.extras import require

        require("sip", "the SIP endpoint ([sip] enabled)")
        self.config = config
        self.auth = DigestCheck(config.realm, dict(config.users), secret)
        self._on_leg = on_leg
        self._admit = admit
        self._uas: Any = None
        self._transport: Any = None
        self._tcp_uas: Any = None
        self._tcp_transport: Any = None
        self.legs: dict[str, SipLeg] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.refused: dict[int, int] = {}
        self.calls_by_codec: dict[str, int] = {}
        """Calls answered, by the codec chosen (`PCMU`, `PCMA`, `G722`)."""
        self.tcp_closed: dict[str, int] = {}
        """TCP connections the endpoint closed, by why: `over_cap`, `idle`, `slow`."""

    async def start(self) -> None:
        """Listen on `[sip] listen` over UDP, and over TCP on the same port."""
        from aiosipua import SipUAS

        from server.config import split_host_port

        host, port = split_host_port(self.config.listen)

        endpoint = self

        class ChorusUAS(SipUAS):
            """A request the library cannot take (a malformed SDP raises in its parser) is
            answered 400 instead of going unanswered; the endpoint keeps serving. An in-dialog
            INFO carrying a DTMF digit (`info_digit`) is the leg's digit, as RFC 4733's are."""

            def __init__(self, *args: Any, **kwargs: Any) -> None:
                super().__init__(*args, **kwargs)
                self._handlers["INFO"] = self._handle_info

            def _handle_info(self, request: SipRequest, addr: tuple[str, int]) -> None:
                call = self._calls.get(request.call_id or "")
                if call is None:
                    self._send_error(request, 481, "Call/Transaction Does Not Exist")
                    return
                if not self._validate_in_dialog(call.dialog, request):
                    return
                kind = request.headers.get_first("content-type") or ""
                body = bytes(request.body or b"")
                digit = info_digit(kind, body)
                if body and digit is None:  # an empty INFO (a keepalive) is simply answered
                    self._send_error(request, 415, "Unsupported Media Type")
                    return
                if digit is not None:
                    endpoint._on_info_digit(call.call_id, digit)
                response = call.dialog.create_response(request, 200, "OK")
                self.transport.send_reply(response)

            def _handle_request(self, request: SipRequest, addr: tuple[str, int]) -> None:
                unsupported = unsupported_options(request)
                if unsupported:  # RFC 3261 §8.2.2.3: refused, the options named
                    log.info("sip: %s from %s requires %s", request.method, addr[0],
                             ", ".join(unsupported))  # fmt: skip
                    endpoint.refused[420] = endpoint.refused.get(420, 0) + 1
                    self._send_error(request, 420, "Bad Extension",
                                     extra_headers={"Unsupported": ", ".join(unsupported)})
                    return
                try:
                    super()._handle_request(request, addr)
                except Exception:
                    log.info("sip: malformed %s from %s", request.method, addr[0])
                    with contextlib.suppress(Exception):
                        self._send_error(request, 400, "Bad Request (malformed message)")

        attempts = PORT_ATTEMPTS if port == 0 else 1
        for attempt in range(attempts):
            self._transport = _udp_transport((host, port))
            self._uas = ChorusUAS(self._transport, user_agent="chorus")
            await self._serve(self._uas)
            udp = self._transport._udp_transport
            if udp is not None:  # port 0: the one the system chose, for Via and Contact
                self._transport.local_addr = udp.get_extra_info("sockname")[:2]
            self._tcp_transport = _tcp_transport(
                self._transport.local_addr, self.config.max_tcp_connections,
                self.config.tcp_idle_s, self._carries_call, self.tcp_closed,
            )  # fmt: skip
            self._tcp_uas = ChorusUAS(self._tcp_transport, user_agent="chorus")
            try:
                await self._serve(self._tcp_uas)
                return
            except OSError as exc:
                # port 0: the UDP port the system chose can be taken for TCP (an outgoing
                # connection's port); give it back and take another
                if exc.errno != errno.EADDRINUSE or attempt == attempts - 1:
                    raise
                log.info("sip: tcp port %d taken, choosing another", self.port)
                await self._uas.stop()

    def _carries_call(self, addr: tuple[str, int]) -> bool:
        """Whether a call of this endpoint came in over the connection from `addr`."""
        return any(tuple(leg.call.source_addr) == addr for leg in self.legs.values())

    async def _serve(self, uas: Any) -> None:
        uas.on_invite = self._on_invite
        uas.on_reinvite = self._on_reinvite
        uas.on_bye = self._on_bye
        uas.on_cancel = self._on_cancel
        await uas.start()

    @property
    def port(self) -> int:
        return int(self._transport.local_addr[1])

    async def stop(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(task), 5)
        for uas in (self._uas, self._tcp_uas):
            if uas is not None:
                await uas.stop()

    def _reject(self, call: IncomingCall, status: int, reason: str,
                headers: dict[str, str] | None = None) -> None:  # fmt: skip
        self.refused[status] = self.refused.get(status, 0) + 1
        log.info("sip: refused INVITE from %s: %d %s", call.source_addr[0], status, reason)
        call._send_response(status, reason, extra_headers=headers)
        call.dialog.terminate()

    def _on_invite(self, call: IncomingCall) -> None:
        invite = call.invite
        room = room_of(invite)
        if room is None:
            self._reject(call, 404, "Not Found (not a valid room id)")
            return
        verdict, user = self.auth.check(invite.get_header("authorization"), "INVITE")
        if verdict in ("missing", "stale"):
            self._reject(
                call, 401, "Unauthorized",
                {"WWW-Authenticate": self.auth.challenge(stale=verdict == "stale")},
            )  # fmt: skip
            return
        if verdict != "ok" or user is None:
            self._reject(call, 403, "Forbidden")
            return
        refusal = self._admit(room)
        if refusal is not None:
            self._reject(call, *refusal)
            return
        offer = call.sdp_offer
        if offer is None or offer.audio is None:
            self._reject(call, 488, "Not Acceptable Here (no audio offer)")
            return
        offered = {c.payload_type for c in offer.audio.codecs}
        codecs = [G722] if G722 in offered and _has_g722() else [PCMU, PCMA]
        try:
            from aiosipua import CallSession

            # aiortp's jitter buffer, set for a recogniser rather than a loudspeaker: a lost
            # packet is concealed as soon as a later one shows it lost (`skip_audio_gaps`), and
            # a frame waits for two after it (40 ms), enough to put packets that arrive out of
            # order back in order. With aiortp's defaults (no skip, four frames), one lost packet
            # held every later frame until the buffer overflowed (16 packets), which then dropped
            # the four frames before it, and left the stream 300 ms behind the call from then on
            # and each talk spurt's last frames waiting for the next (docs/phone.md)
            def new_session() -> CallSession:
                return CallSession(
                    self.config.media_host, _free_udp_port(self.config.media_host), offer,
                    supported_codecs=codecs, symmetric_rtp=True, jitter_prefetch=JITTER_FRAMES,
                    skip_audio_gaps=True,
                )  # fmt: skip

            session = new_session()
        except Exception:
            self._reject(call, 488, "Not Acceptable Here (no common codec)")
            return
        plan = SipCallPlan(
            room=room,
            declaration_name=caller_name(invite, user),
            participant=f"sip-{user}-{hashlib.sha256(call.call_id.encode()).hexdigest()[:8]}",
            shared_mic=is_shared(invite, user, list(self.config.shared_mic_users)),
        )
        task = asyncio.get_running_loop().create_task(
            self._answer(call, session, plan, new_session)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(
        self, call: IncomingCall, session: CallSession, plan: SipCallPlan,
        new_session: Callable[[], CallSession],
    ) -> None:  # fmt: skip
        for attempt in range(PORT_ATTEMPTS):
            try:
                await session.start()
                break
            except Exception as exc:
                # the RTP port was free when chosen and taken before it was bound (the answer,
                # which names it, is not sent yet): another port
                taken = isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE
                if taken and attempt < PORT_ATTEMPTS - 1:
                    session = new_session()
                    continue
                log.exception("sip: could not open RTP for %s", call.call_id)
            self._reject(call, 500, "Server Internal Error")
            return
        _only_from_negotiated(session, call.source_addr[0])
        leg = SipLeg(call, session, self.config.rtp_timeout_s)
        leg.room = plan.room
        framing = SipFraming(session.codec_sample_rate)
        framing.on_reply_queued = leg.reply_queued
        framing.on_stop_reply = leg.stop_reply
        session.on_dtmf = lambda digit, duration: (
            framing.on_dtmf(digit) if framing.on_dtmf is not None else None
        )
        call.accept(session.sdp_answer)
        codec = _CODEC_NAMES.get(session.chosen_payload_type, str(session.chosen_payload_type))
        self.calls_by_codec[codec] = self.calls_by_codec.get(codec, 0) + 1
        self.legs[call.call_id] = leg
        try:
            await self._on_leg(leg, framing, plan)
        finally:
            self.legs.pop(call.call_id, None)
            await leg.close(1000)

    def _on_reinvite(self, call: IncomingCall) -> None:
        """A re-INVITE in an established call: hold (`a=sendonly`, `a=inactive`, or the old
        `c=0.0.0.0`) or resume (`sendrecv`), answered 200 with our SDP in the matching
        direction (RFC 3264 §8.4); an offer with another RTP address moves the call's media
        there (a transfer, a phone that changed network), when the re-INVITE comes from the
        host the call's INVITE came from. A re-INVITE that is not for a running leg gets 481;
        one without an audio offer keeps the media as it is."""
        leg = self.legs.get(call.call_id)
        if leg is None:
            call._send_response(481, "Call/Transaction Does Not Exist")
            return
        offer = call.sdp_offer
        direction = "sendrecv"
        if offer is not None and offer.audio is not None:
            audio = offer.audio
            conn = audio.connection or offer.connection
            direction = audio.direction
            if conn is not None and conn.address == "0.0.0.0" and direction == "sendrecv":
                direction = "sendonly"  # RFC 2543 hold
            leg.hold(direction in ("sendonly", "inactive"))
            moved = offer.rtp_address
            if (moved is not None and moved[0] != "0.0.0.0" and moved != leg.session.remote_addr
                    and call.source_addr[0] == leg.remote):  # fmt: skip
                log.info("sip leg %s: media moved to %s:%d", leg.call.call_id, *moved)
                leg.session.update_remote(moved)
        answer = _answer_with_direction(leg.session.sdp_answer, _ANSWER_DIRECTION[direction])
        call.accept(answer)

    def _on_info_digit(self, call_id: str, digit: str) -> None:
        leg = self.legs.get(call_id)
        if leg is not None and leg.session.on_dtmf is not None:
            leg.session.on_dtmf(digit, 0)

    def _on_bye(self, call: IncomingCall, request: SipRequest) -> None:
        leg = self.legs.get(call.call_id)
        if leg is not None:
            leg.hung_up()

    def _on_cancel(self, request: SipRequest, addr: tuple[str, int]) -> None:
        leg = self.legs.get(request.call_id or "")
        if leg is not None:
            leg.hung_up()


_ANSWER_DIRECTION = {
    "sendrecv": "sendrecv", "sendonly": "recvonly", "recvonly": "sendonly", "inactive": "inactive",
}  # fmt: skip
_DIRECTIONS = ("sendrecv", "sendonly", "recvonly", "inactive")


def _answer_with_direction(answer: Any, direction: str) -> Any:
    """A copy of the call's SDP answer with its audio direction set and its version bumped."""
    import copy

    sdp = copy.deepcopy(answer)
    sdp.origin.session_version = str(int(sdp.origin.session_version or "0") + 1)
    for media in sdp.media:
        for name in _DIRECTIONS:
            media.attributes.pop(name, None)
        media.attributes[direction] = []
    return sdp


def _hangup(call: IncomingCall) -> None:
    """BYE, with a Via naming the call's own transport (aiosipua's `hangup` always says UDP)."""
    from aiosipua import DialogState

    transport = call.transport
    if not getattr(transport, "reliable", False):
        call.hangup()
        return
    if call.dialog.state != DialogState.CONFIRMED or transport is None:
        return
    host, port = transport.local_addr
    bye = call.dialog.create_request("BYE", via_host=host, via_port=port, via_transport="TCP")
    call.dialog.terminate()
    transport.send(bye, call.source_addr)


def _udp_transport(local_addr: tuple[str, int]) -> Any:
    """aiosipua's UDP transport, without its `connection_made` assertion that the transport is
    an `asyncio.DatagramTransport`: Python 3.11's selector datagram transport is not one (3.12's
    is), so every start logged an AssertionError traceback (the transport worked: `start` keeps
    it)."""
    from aiosipua.transport import UdpSipTransport, _UdpProtocol

    class Protocol(_UdpProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self._owner._udp_transport = transport  # type: ignore[assignment]

    class Udp(UdpSipTransport):
        async def start(self) -> None:
            loop = asyncio.get_running_loop()
            transport, _ = await loop.create_datagram_endpoint(
                lambda: Protocol(self), local_addr=self.local_addr
            )
            self._udp_transport = transport

    return Udp(local_addr=local_addr)


class _FirstLine:
    """A stream reader whose next line is one already read: `_read_sip_message` reads a
    message from it whole, after the wait for that message's first line was timed apart."""

    def __init__(self, first: bytes, reader: asyncio.StreamReader) -> None:
        self._first: bytes | None = first
        self._reader = reader

    async def readline(self) -> bytes:
        if self._first is not None:
            line, self._first = self._first, None
            return line
        return await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)


def _tcp_transport(
    local_addr: tuple[str, int],
    max_connections: int,
    idle_s: float,
    carries_call: Callable[[tuple[str, int]], bool],
    closed: dict[str, int],
) -> Any:
    """aiosipua's TCP transport, answering on the connection each request came in on: the
    request's top Via gets `received` and `rport` from the connection (aiosipua routes by Via,
    and a TCP client's Via names its listening port, not the connection's).

    Bounded, where the library is not: at most `max_connections` open at once (one more is
    closed when accepted); a connection that starts no message for `idle_s` is closed unless
    `carries_call(addr)` (a call's BYE comes over it, minutes later); a message left unfinished
    for `idle_s` closes it whatever it carries (a slow sender holds nothing open). Each close is
    counted in `closed` by why: `over_cap`, `idle`, `slow`. aiosipua bounds a message's
    headers and body itself."""
    from aiosipua import SipMessage, SipRequest
    from aiosipua.headers import parse_via, stringify_via
    from aiosipua.transport import TcpSipTransport, _read_sip_message

    def close_for(why: str, addr: tuple[str, int]) -> None:
        closed[why] = closed.get(why, 0) + 1
        log.info("sip: closed a TCP connection from %s (%s)", addr[0], why.replace("_", " "))

    class ConnectionTcpTransport(TcpSipTransport):
        async def _handle_connection(
            self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
        ) -> None:
            peer = writer.get_extra_info("peername")
            addr = (str(peer[0]), int(peer[1])) if peer else ("0.0.0.0", 0)
            if len(self._connections) >= max_connections:
                close_for("over_cap", addr)
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 5)
                return
            self._connections[addr] = (reader, writer)
            try:
                while True:
                    try:
                        async with asyncio.timeout(idle_s):
                            first = await reader.readline()
                    except TimeoutError:
                        if carries_call(addr):
                            continue
                        close_for("idle", addr)
                        break
                    if not first:
                        break
                    try:
                        async with asyncio.timeout(idle_s):
                            data = await _read_sip_message(cast("asyncio.StreamReader", _FirstLine(first, reader)))
                    except TimeoutError:
                        close_for("slow", addr)
                        break
                    if data is None:
                        break
                    self._dispatch(data, addr)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                pass
            finally:
                self._connections.pop(addr, None)
                writer.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(writer.wait_closed(), 5)

        def _dispatch(self, data: bytes, addr: tuple[str, int]) -> None:
            try:
                message = SipMessage.parse(data)
            except Exception:
                log.info("sip: unparsable message over TCP from %s", addr[0])
                return
            if isinstance(message, SipRequest):
                vias = message.headers.get("via")
                if vias:
                    via = parse_via(vias[0])
                    via.params["received"] = addr[0]
                    via.params["rport"] = str(addr[1])
                    message.headers.remove("Via")
                    for value in [stringify_via(via), *vias[1:]]:
                        message.headers.append("Via", value)
            if self.on_message is not None:
                try:
                    self.on_message(message, addr)
                except Exception:
                    log.exception("sip: error handling a TCP message from %s", addr[0])

    return ConnectionTcpTransport(local_addr=local_addr)


def _has_g722() -> bool:
    """aiortp's G.722 needs sippy's libg722 (`aiortp[g722]`, in the `sip` extra); without it
    calls fall back to G.711."""
    import importlib.util

    return importlib.util.find_spec("G722") is not None


_INFO_SIGNALS = {"10": "*", "11": "#", "12": "A", "13": "B", "14": "C", "15": "D"}


def info_digit(content_type: str, body: bytes) -> str | None:
    """The DTMF digit of a SIP INFO (RFC 6086's legacy use, still what many PBXs and phones send
    when RFC 4733 is not negotiated): `application/dtmf-relay` (`Signal=5` and `Duration=160`
    lines) or `application/dtmf` (the digit alone); events 10-15 are * # A-D. None for another
    body or no digit."""
    kind = content_type.split(";", 1)[0].strip().lower()
    text = body.decode("ascii", "replace")
    if kind == "application/dtmf-relay":
        found = re.search(r"(?im)^\s*signal\s*=\s*(\S+)\s*$", text)
        value = found.group(1) if found else ""
    elif kind == "application/dtmf":
        value = text.strip()
    else:
        return None
    value = _INFO_SIGNALS.get(value, value).upper()
    return value if len(value) == 1 and value in "0123456789*#ABCD" else None


def _free_udp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _only_from_negotiated(session: CallSession, signalling_host: str) -> None:
    """RTP from an address the call did not negotiate is dropped: aiortp takes packets from
    anyone, so its receive callback gets a filter in front. Taken: the SDP's port from the SDP's
    host or from the host the (authenticated) INVITE came from — a client behind NAT, or one
    that offers its interface address but sends from loopback, is still heard; aiortp then
    latches replies to where the audio really comes from (symmetric RTP). The SDP's address is
    the call's current one (a re-INVITE may move it)."""
    rtp = session.rtp_session
    protocol = getattr(rtp, "_rtp_transport", None)
    receive = getattr(protocol, "_on_rtp", None)
    if protocol is None or receive is None:
        log.warning("sip: cannot filter RTP by source on this aiortp version")
        return

    def filtered(data: bytes, addr: tuple[str, int]) -> None:
        sdp_host, sdp_port = session.remote_addr
        if addr[1] == sdp_port and addr[0] in (sdp_host, signalling_host):
            receive(data, addr)
        else:
            dropped_rtp[0] += 1

    protocol._on_rtp = filtered


dropped_rtp = [0]
"""RTP packets dropped for coming from an address no call negotiated (all calls, for tests)."""
