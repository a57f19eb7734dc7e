"""The SIP endpoint (`[sip]`, issue 29.1) against a real SIP client: Debian's `baresip`.

baresip dials `sip:ROOM@127.0.0.1:PORT` with digest credentials, plays a WAV file into the call
(`aufile`) and dumps what it hears (`sndfile`). STT is the local Deepgram-protocol server: it
finds the received audio in the demo meeting and says the meeting's words and speakers, so a
speakerphone leg's voices come back labelled. `make system-deps` installs baresip.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from realtime.testing.openai_server import OpenAIRealtimeServer
from server.auth import issue_token
from server.client import EventFeed
from server.sip import DigestCheck
from server.testing.harness import (
    SECRET,
    RunningServer,
    answering,
    eventually,
    running_server_with_local_stt,
)
from voice.audio import read_audio_16k, resample
from voice.testing.deepgram_server import MeetingWords

pytestmark = pytest.mark.skipif(shutil.which("baresip") is None, reason="needs baresip (make system-deps)")

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
BOUND_S = 120.0
USERS = {"speakerphone": "s3cret-a", "dana": "s3cret-b"}


def phone_wav(path: Path, start: float, end: float, silence: float = 1.0, rate: int = 8000) -> Path:
    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    narrow = np.concatenate([resample(audio, 16000, rate), np.zeros(int(silence * rate), np.float32)])
    sf.write(path, narrow, rate, subtype="PCM_16")
    return path


async def hang_up_once_heard(srv: RunningServer, procs: list[asyncio.subprocess.Process],
                             seconds: float) -> list[str]:  # fmt: skip
    """SIGTERM (baresip hangs up with a BYE) once the server has read `seconds` of audio from
    all streams — counted from the audio, not from baresip's start, which a loaded machine
    delays; each one's log."""
    try:
        await eventually(
            lambda: srv.audio_read() >= seconds or all(p.returncode is not None for p in procs),
            BOUND_S, f"{seconds} s of audio",
        )  # fmt: skip
        for proc in procs:
            proc.terminate()
        outs = [await asyncio.wait_for(proc.communicate(), 60) for proc in procs]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    return [out.decode(errors="replace") for out, _ in outs]


def write_baresip_config(conf: Path, sip_port: int, user: str, password: str, wav: Path,
                         display: str | None, transport: str = "udp",
                         codec: str = "PCMU") -> None:  # fmt: skip
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "dump").mkdir(exist_ok=True)
    (conf / "config").write_text(
        "sip_listen 127.0.0.1:0\n"
        f"audio_source aufile,{wav}\n"
        "audio_player aufile,/dev/null\n"
        "module_path /usr/lib/baresip/modules\n"
        "module g711.so\nmodule g722.so\nmodule aufile.so\nmodule sndfile.so\n"
        f"snd_path {conf / 'dump'}\n"
        "module account.so\nmodule menu.so\n"
    )
    name = f'"{display}" ' if display else ""
    (conf / "accounts").write_text(
        f"{name}<sip:{user}@127.0.0.1:{sip_port};transport={transport}>;auth_pass={password};"
        f"regint=0;audio_codecs={codec}\n"
    )


async def baresip(
    conf: Path, sip_port: int, room: str, user: str, password: str, wav: Path, seconds: int,
    display: str | None = None, transport: str = "udp", codec: str = "PCMU",
) -> str:  # fmt: skip
    """One baresip call: dial, play `wav`, hang up after `seconds`; its log. What it heard is
    dumped under `conf/dump` (`sndfile`)."""
    proc = await start_baresip(conf, sip_port, room, user, password, wav, seconds, display,
                               transport, codec)  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), seconds + 60)
    return out.decode(errors="replace")


async def start_baresip(
    conf: Path, sip_port: int, room: str, user: str, password: str, wav: Path, seconds: int,
    display: str | None = None, transport: str = "udp", codec: str = "PCMU",
) -> asyncio.subprocess.Process:  # fmt: skip
    """baresip dialling `room` and playing `wav`; it quits after `seconds` (or on SIGTERM),
    hanging the call up (BYE) either way."""
    write_baresip_config(conf, sip_port, user, password, wav, display, transport, codec)
    target = f"sip:{room}@127.0.0.1:{sip_port}" + (";transport=tcp" if transport == "tcp" else "")
    return await asyncio.create_subprocess_exec(
        "baresip", "-f", str(conf), "-t", str(seconds), "-e", f"/dial {target}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip


@contextlib.asynccontextmanager
async def sip_server(**config: Any) -> AsyncIterator[RunningServer]:
    section = {
        "enabled": True, "listen": "127.0.0.1:0", "users": USERS,
        "shared_mic_users": ["speakerphone"], **config.pop("sip", {}),
    }  # fmt: skip
    words = MeetingWords.from_meeting(MEETING)
    async with running_server_with_local_stt({"sip": section, **config}, words) as srv:
        yield srv


def sip_port(srv: RunningServer) -> int:
    assert srv.server.sip is not None
    return srv.server.sip.port


async def test_the_endpoint_starts_without_an_error_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    async with sip_server() as srv:
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200  # it serves over UDP
        finally:
            caller.close()
    # aiosipua asserted on Python 3.11's datagram transport at every start (a traceback logged)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


async def test_a_speakerphone_leg_and_a_one_person_leg_are_their_own_participants(
    tmp_path: Path,
) -> None:
    async with sip_server() as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        port = sip_port(srv)
        two_voices = phone_wav(tmp_path / "two.wav", 0.6, 8.95)  # Alice, then Bob
        one_voice = phone_wav(tmp_path / "one.wav", 9.1, 12.6)  # one more voice, alone
        procs = [
            await start_baresip(tmp_path / "a", port, "standup", "speakerphone",
                                USERS["speakerphone"], two_voices, 60),
            await start_baresip(tmp_path / "b", port, "standup", "dana", USERS["dana"],
                                one_voice, 60, display="Dana Lee"),
        ]  # fmt: skip
        logs = await hang_up_once_heard(srv, procs, 8.35 + 3.5 + 0.5)  # speech 11.85 of 13.85 s
        await eventually(
            lambda: sum(m.type == "stream_stopped" for m in feed.received) == 2, BOUND_S,
            "both legs to end",
        )  # fmt: skip
        await feed.close()
    assert all("Call established" in log for log in logs), logs
    starts = {m.participant: m for m in feed.received if m.type == "stream_started"}
    assert len(starts) == 2 and {m.kind for m in starts.values()} == {"sip"}
    phone = next(m for p, m in starts.items() if p.startswith("sip-speakerphone-"))
    dana = next(m for p, m in starts.items() if p.startswith("sip-dana-"))
    phone_turns = [t for t in feed.turns if t.stream == phone.stream]
    dana_turns = [t for t in feed.turns if t.stream == dana.stream]
    assert len({t.label for t in phone_turns}) >= 2, phone_turns  # two voices, diarized
    assert "Good morning everyone" in " ".join(t.text for t in phone_turns)
    assert dana_turns and {t.speaker for t in dana_turns} == {"Dana Lee"}


async def test_a_call_hung_up_mid_utterance_keeps_what_was_said(tmp_path: Path) -> None:
    """baresip hangs up (BYE, on SIGTERM) once the server has read 1.6 s of Alice's 3.7 s of
    speech — counted from the audio, not from baresip's start, which a loaded machine delays:
    the turn so far is committed."""
    async with sip_server(stt={"diarize": False}) as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        wav = phone_wav(tmp_path / "cut.wav", 0.6, 8.95)
        proc = await start_baresip(tmp_path / "c", sip_port(srv), "standup", "dana",
                                   USERS["dana"], wav, 60, display="Dana Lee")  # fmt: skip
        (out,) = await hang_up_once_heard(srv, [proc], 1.6)
        await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S)
        await feed.close()
        assert srv.server.metrics.audio_seconds_total < 3.7, "the call outlived the utterance"
    said = " ".join(t.text for t in feed.turns)
    assert "Good morning everyone" in said, (feed.turns, out[-2000:])


async def test_a_wrong_password_is_refused_and_nothing_joins(tmp_path: Path) -> None:
    async with sip_server() as srv:
        wav = phone_wav(tmp_path / "x.wav", 0.6, 2.0)
        log = await baresip(tmp_path / "w", sip_port(srv), "standup", "dana", "wrong", wav, 4)
        bad_room = await baresip(tmp_path / "r", sip_port(srv), "no%2Fslash", "dana",
                                 USERS["dana"], wav, 4)  # fmt: skip
        assert srv.server.sip is not None
        refused = srv.server.sip.refused
        assert refused.get(403, 0) >= 1 and refused.get(401, 0) >= 1, (refused, log)
        assert refused.get(404, 0) >= 1, bad_room
        assert "Call established" not in log
        assert srv.server.metrics.streams_total["sip"] == 0


async def test_a_reply_reaches_the_caller_as_audio(tmp_path: Path) -> None:
    async with OpenAIRealtimeServer(replies=["Hello Dana."], reply_audio_seconds=1.5) as model:
        config = answering(model.base_url, "Dana Lee")
        async with sip_server(**config) as srv:
            feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
            wav = phone_wav(tmp_path / "d.wav", 0.6, 4.3, silence=5.0)
            await baresip(tmp_path / "d", sip_port(srv), "standup", "dana", USERS["dana"], wav,
                          10, display="Dana Lee")  # fmt: skip
            await feed.close()
    assert any(m.type == "reply" for m in feed.received)
    heard = sorted((tmp_path / "d" / "dump").glob("*dec*.wav"))
    assert heard, list((tmp_path / "d" / "dump").iterdir())
    audio, rate = sf.read(heard[0], dtype="int16")
    loud = np.abs(audio.astype(np.int32)) > 500
    assert loud.sum() / rate >= 0.5, "the reply was not heard"  # 1.5 s of reply, some quiet


def test_digest_check_reads_a_right_wrong_and_stale_answer() -> None:
    import hashlib

    check = DigestCheck("chorus", {"dana": "pw"}, "secret")
    nonce = check.nonce()

    def answer(pw: str, nonce: str) -> str:
        h = lambda s: hashlib.md5(s.encode()).hexdigest()  # noqa: E731
        ha1, ha2 = h(f"dana:chorus:{pw}"), h("INVITE:sip:r@h")
        resp = h(f"{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}")
        return (f'Digest username="dana", realm="chorus", nonce="{nonce}", uri="sip:r@h", '
                f'response="{resp}", qop=auth, nc=00000001, cnonce="c0ffee"')  # fmt: skip

    assert check.check(answer("pw", nonce), "INVITE") == ("ok", "dana")
    assert check.check(answer("no", nonce), "INVITE")[0] == "wrong"
    assert check.check(answer("pw", check.nonce(now=1.0)), "INVITE")[0] == "stale"
    assert check.check(answer("pw", "1.forged"), "INVITE")[0] == "wrong"
    assert check.check(None, "INVITE")[0] == "missing"


# --- limits and bad input, with a minimal SIP client written here --------------------------------

SIPP_BAD_SDP = Path(__file__).resolve().parent / "data" / "sipp" / "bad_sdp.xml"


class RawCaller:
    """Just enough of a SIP UA to send INVITEs (answering a digest challenge), ACK, BYE and
    RTP by hand: for what a well-behaved client like baresip would never do."""

    def __init__(self, server_port: int) -> None:
        import socket
        import uuid

        self.server = ("127.0.0.1", server_port)
        self.sip = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sip.bind(("127.0.0.1", 0))
        self.sip.setblocking(False)
        self.rtp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.rtp.bind(("127.0.0.1", 0))
        self.port = self.sip.getsockname()[1]
        self.rtp_port = self.rtp.getsockname()[1]
        self.call_id = uuid.uuid4().hex
        self.cseq = 0
        self.received: list[str] = []
        self.to_tag = ""
        self.answer_port = 0

    def close(self) -> None:
        self.sip.close()
        self.rtp.close()

    def request(self, method: str, room: str, headers: dict[str, str] | None = None,
                body: str = "") -> None:  # fmt: skip
        self.cseq += 1
        lines = [
            f"{method} sip:{room}@127.0.0.1:{self.server[1]} SIP/2.0",
            f"Via: SIP/2.0/UDP 127.0.0.1:{self.port};branch=z9hG4bK{self.call_id[:8]}{self.cseq}",
            f"From: <sip:dana@127.0.0.1:{self.port}>;tag=t{self.call_id[:6]}",
            f"To: <sip:{room}@127.0.0.1:{self.server[1]}>{self.to_tag}",
            f"Call-ID: {self.call_id}",
            f"CSeq: {self.cseq} {method}",
            f"Contact: <sip:dana@127.0.0.1:{self.port}>",
            "Max-Forwards: 70",
            *(f"{k}: {v}" for k, v in (headers or {}).items()),
        ]
        if body and not any(k.lower() == "content-type" for k in headers or {}):
            lines.append("Content-Type: application/sdp")
        lines += [f"Content-Length: {len(body)}", "", body]
        self.sip.sendto("\r\n".join(lines).encode(), self.server)

    def sdp(self, direction: str | None = None, host: str = "127.0.0.1") -> str:
        return (f"v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nc=IN IP4 {host}\r\nt=0 0\r\n"
                f"m=audio {self.rtp_port} RTP/AVP 0 101\r\na=rtpmap:0 PCMU/8000\r\n"
                "a=rtpmap:101 telephone-event/8000\r\n"
                + (f"a={direction}\r\n" if direction else ""))  # fmt: skip

    async def reinvite(self, room: str, direction: str | None, host: str = "127.0.0.1") -> str:
        """A re-INVITE in the dialog with this SDP direction; its 200's body (ACKed)."""
        self.request("INVITE", room, body=self.sdp(direction, host))
        assert await self.status() == 200, self.last
        self.request("ACK", room)
        return self.last.split("\r\n\r\n", 1)[1]

    def send_dtmf(self, digit: int, payload_type: int, seq0: int) -> None:
        """One RFC 4733 telephone-event: a start packet (marker), two more, three end packets."""
        import struct as _struct

        stamp = seq0 * 160
        for n in range(6):
            end = n >= 3
            duration = 160 * (min(n, 3) + 1)
            header = _struct.pack(">BBHII", 0x80, payload_type | (0x80 if n == 0 else 0),
                                  (seq0 + n) & 0xFFFF, stamp, 0x1234)  # fmt: skip
            event = _struct.pack(">BBH", digit, (0x80 if end else 0) | 10, duration)
            self.rtp.sendto(header + event, ("127.0.0.1", self.answer_port))

    def rtp_received(self) -> int:
        """RTP packets that came in on the caller's RTP socket since the last call."""
        count = 0
        self.rtp.setblocking(False)
        while True:
            try:
                self.rtp.recv(2048)
            except BlockingIOError:
                return count
            count += 1

    async def until(self, predicate: Any, within_s: float = 30.0) -> str:
        """The first message received (now or later) that `predicate` accepts."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        seen = 0
        while True:
            for message in self.received[seen:]:
                if predicate(message):
                    return message
            seen = len(self.received)
            if loop.time() > deadline:
                raise TimeoutError(f"no such SIP message; got {self.received}")
            with contextlib.suppress(TimeoutError):
                data = await asyncio.wait_for(loop.sock_recv(self.sip, 65535), 0.2)
                self.received.append(data.decode(errors="replace"))

    async def status(self, within_s: float = BOUND_S) -> int:
        """The next final response's status (100 Trying read past)."""
        def final(m: str) -> bool:
            return m.startswith("SIP/2.0 ") and not m.startswith("SIP/2.0 1")
        message = await self.until(final, within_s)
        self.received.remove(message)
        self.last = message
        return int(message.split(" ", 2)[1])

    def header(self, name: str) -> str:
        for line in self.last.split("\r\n"):
            if line.lower().startswith(name.lower() + ":"):
                return line.split(":", 1)[1].strip()
        return ""

    async def invite(self, room: str, password: str, headers: dict[str, str] | None = None) -> int:
        """INVITE, answer the 401 with digest credentials; the final status. On 200: ACKed."""
        import hashlib
        import re as _re

        self.request("INVITE", room, headers, self.sdp())
        status = await self.status()
        if status != 401:
            return status
        self.request("ACK", room)
        nonce = _re.search(r'nonce="([^"]+)"', self.header("WWW-Authenticate"))
        assert nonce is not None
        uri = f"sip:{room}@127.0.0.1:{self.server[1]}"
        h = lambda s: hashlib.md5(s.encode()).hexdigest()  # noqa: E731
        ha1, ha2 = h(f"dana:chorus:{password}"), h(f"INVITE:{uri}")
        response = h(f"{ha1}:{nonce.group(1)}:00000001:abcdef:auth:{ha2}")
        auth = (f'Digest username="dana", realm="chorus", nonce="{nonce.group(1)}", '
                f'uri="{uri}", response="{response}", qop=auth, nc=00000001, cnonce="abcdef"')  # fmt: skip
        self.request("INVITE", room, {**(headers or {}), "Authorization": auth}, self.sdp())
        status = await self.status()
        if status == 200:
            tag = _re.search(r";tag=([^;>\s]+)", self.header("To"))
            self.to_tag = f";tag={tag.group(1)}" if tag else ""
            port = _re.search(r"m=audio (\d+)", self.last)
            self.answer_port = int(port.group(1)) if port else 0
            self.request("ACK", room)
        return status

    def send_rtp(self, mulaw: bytes, sock: Any = None, seq0: int = 0) -> None:
        """PCMU audio as 20 ms RTP packets, all at once (the jitter buffer keeps the order)."""
        import struct as _struct

        for n, i in enumerate(range(0, len(mulaw), 160)):
            header = _struct.pack(">BBHII", 0x80, 0, (seq0 + n) & 0xFFFF, (seq0 + n) * 160, 0x1234)
            (sock or self.rtp).sendto(header + mulaw[i : i + 160], ("127.0.0.1", self.answer_port))


def pcmu(start: float, end: float, silence: float = 0.6) -> bytes:
    from voice.audio import float_to_pcm16, mulaw_encode

    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    narrow = np.concatenate([resample(audio, 16000, 8000), np.zeros(int(silence * 8000), np.float32)])
    return mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))


async def test_malformed_sip_and_sdp_get_an_error_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async with sip_server() as srv:
        port = sip_port(srv)
        if shutil.which("sipp") is not None:  # SIPp: an INVITE whose SDP does not parse
            proc = await asyncio.create_subprocess_exec(
                "sipp", f"127.0.0.1:{port}", "-sf", str(SIPP_BAD_SDP), "-s", "standup", "-m", "1",
                "-i", "127.0.0.1", "-p", "0", "-timeout", "30s", "-nostdin",
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL, cwd=tmp_path,
            )  # fmt: skip (cwd: SIPp writes its error log there)
            assert await asyncio.wait_for(proc.wait(), 60) == 0, "SIPp did not get its 400"
        caller = RawCaller(port)
        try:
            caller.sip.sendto(b"\x00\xffnot sip at all", caller.server)  # dropped, no crash
            caller.request("INVITE", "standup", body="v=0\r\nnonsense\r\n")  # no audio offer
            assert await caller.status() == 401  # authentication comes first
            caller.close()
            caller = RawCaller(port)
            assert await caller.invite("standup", USERS["dana"]) == 200  # still serving
            assert srv.server.sip is not None and srv.server.sip.refused.get(401, 0) >= 2
        finally:
            caller.close()


async def test_a_request_requiring_an_unsupported_extension_gets_420_naming_it() -> None:
    """RFC 3261 §8.2.2.3: an INVITE whose `Require` names an option tag the endpoint does not
    support (`precondition`, `timer`) is refused 420 Bad Extension with those tags in
    `Unsupported`, and no call is set up; `100rel` is supported (no provisional response but
    100 Trying is ever sent), and a caller that retries without the extension gets its call.
    OPTIONS (a PBX's keepalive) is answered 200 with the methods allowed."""
    async with sip_server() as srv:
        caller = RawCaller(sip_port(srv))
        try:
            caller.request("INVITE", "standup", {"Require": "precondition, 100rel",
                                                 "Supported": "timer"}, caller.sdp())
            assert await caller.status() == 420
            assert caller.header("Unsupported") == "precondition"
            caller.request("ACK", "standup")
            caller.request("INVITE", "standup", {"Require": "timer"}, caller.sdp())
            assert await caller.status() == 420 and caller.header("Unsupported") == "timer"
            caller.request("ACK", "standup")
            assert srv.server.sip is not None and srv.server.sip.refused.get(420) == 2
            assert srv.server.sip.legs == {}
            caller.request("INVITE", "standup", {"Require": "100rel"}, caller.sdp())
            assert await caller.status() == 401  # taken: the usual challenge
            caller.request("ACK", "standup")
            assert await caller.invite("standup", USERS["dana"], {"Require": "100rel"}) == 200
            caller.request("OPTIONS", "standup")  # a trunk's keepalive
            assert await caller.status() == 200
            assert {"INVITE", "BYE", "INFO", "OPTIONS"} <= {
                m.strip() for m in caller.header("Allow").split(",")}
        finally:
            caller.close()


async def test_rtp_from_an_address_the_call_did_not_negotiate_is_dropped() -> None:
    import socket

    from server import sip as sip_module

    async with sip_server() as srv:
        caller = RawCaller(sip_port(srv))
        stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        stranger.bind(("127.0.0.1", 0))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            before = sip_module.dropped_rtp[0]
            caller.send_rtp(pcmu(0.6, 1.6, 0), sock=stranger)  # another port: not the SDP's
            await eventually(lambda: sip_module.dropped_rtp[0] - before >= 50, BOUND_S, "drops")
            assert srv.audio_read() == 0
            caller.send_rtp(pcmu(0.6, 1.6, 0), seq0=100)  # the negotiated address: heard
            await eventually(lambda: srv.audio_read() >= 0.5, BOUND_S, "the caller's audio")
            caller.request("BYE", "standup")
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
        finally:
            stranger.close()
            caller.close()


async def test_a_re_invite_that_moves_the_media_is_followed() -> None:
    """A transfer or a phone that changed network: the re-INVITE offers another RTP port. The
    leg hears the new one from then on, replies go there, and the old port is dropped."""
    import socket

    from server import sip as sip_module

    async with sip_server(sip={"rtp_timeout_s": 60.0}) as srv:
        caller = RawCaller(sip_port(srv))
        moved = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        moved.bind(("127.0.0.1", 0))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            caller.send_rtp(pcmu(0.6, 1.1, 0))
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            leg = only_leg(srv)
            await eventually(lambda: leg.heard_s >= 0.4, BOUND_S, "audio from the first port")
            old, caller.rtp, caller.rtp_port = caller.rtp, moved, moved.getsockname()[1]
            assert "a=sendrecv" in await caller.reinvite("standup", None)
            assert leg.session.remote_addr == ("127.0.0.1", caller.rtp_port)
            heard, before = leg.heard_s, sip_module.dropped_rtp[0]
            caller.send_rtp(pcmu(1.1, 1.6, 0), sock=old, seq0=100)  # the old port: dropped
            await eventually(lambda: sip_module.dropped_rtp[0] - before >= 20, BOUND_S, "drops")
            caller.send_rtp(pcmu(1.1, 1.6, 0), seq0=200)  # the new one: heard
            await eventually(lambda: leg.heard_s >= heard + 0.4, BOUND_S, "audio from the new port")
            await leg.send(bytes(3200))  # a reply chunk goes to the new port
            moved.setblocking(False)

            def reply_heard() -> bool:
                try:
                    return len(moved.recv(2048)) > 12
                except BlockingIOError:
                    return False

            await eventually(reply_heard, BOUND_S, "the reply's RTP at the new port")
            caller.rtp = old  # closed with the caller
            caller.request("BYE", "standup")
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
        finally:
            moved.close()
            caller.close()


async def test_a_caller_that_never_sends_audio_is_hung_up_and_calls_are_capped() -> None:
    config = {"sip": {"rtp_timeout_s": 1.0, "max_calls_per_room": 1, "max_calls": 2}}
    async with sip_server(**config) as srv:
        silent, second, third, fourth = (RawCaller(sip_port(srv)) for _ in range(4))
        try:
            assert await silent.invite("standup", USERS["dana"]) == 200
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            assert await second.invite("standup", USERS["dana"]) == 486  # one call per room
            assert await third.invite("other", USERS["dana"]) == 200
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 2, BOUND_S)
            assert await fourth.invite("third", USERS["dana"]) == 503  # two calls in all
            # no RTP for rtp_timeout_s: the server hangs the silent leg up with a BYE
            await silent.until(lambda m: m.startswith("BYE "))
        finally:
            for caller in (silent, second, third, fourth):
                caller.close()


async def test_a_drain_says_bye_to_every_leg_after_its_last_turns() -> None:
    async with sip_server(sip={"rtp_timeout_s": 60.0}, stt={"diarize": False}) as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            caller.send_rtp(pcmu(0.6, 2.0, 0))  # "Good morning everyone." and no pause
            await eventually(lambda: srv.audio_read() >= 1.3, BOUND_S, "audio")
            stopping = asyncio.create_task(srv.server.stop())
            await caller.until(lambda m: m.startswith("BYE "), BOUND_S)
            await asyncio.wait_for(stopping, BOUND_S)
        finally:
            caller.close()
            await feed.close()
    assert "Good morning everyone" in " ".join(t.text for t in feed.turns)


# --- a phone's silence suppression (no RTP, or RFC 3389 comfort noise, between talk spurts) -------


def comfort_noise_packet(seq: int, timestamp: int, level: int = 60) -> bytes:
    """An RFC 3389 comfort-noise packet (payload type 13): the noise level in -dBov, no spectrum."""
    import struct as _struct

    return _struct.pack(">BBHIIB", 0x80, 13, seq & 0xFFFF, timestamp, 0x1234, level)


async def test_a_phone_that_stops_sending_between_talk_spurts_gets_its_turn_while_the_call_is_up() -> None:
    """The caller's phone sends its words and then, as a phone with silence suppression does, one
    comfort-noise packet and no RTP at all. The leg feeds the pause as silence, so the turn comes
    while the call is up (before, it waited for the caller's next words or for `rtp_timeout_s`
    to hang the leg up); comfort noise keeps the leg from the RTP timeout, and the timeout
    still hangs up a leg that sends nothing at all."""
    async with sip_server(sip={"rtp_timeout_s": 4.0}, stt={"diarize": False}) as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            speech = pcmu(0.6, 2.0, 0)  # "Good morning everyone." and no quiet after it
            caller.send_rtp(speech)
            seq = len(speech) // 160
            caller.rtp.sendto(comfort_noise_packet(seq, seq * 160), ("127.0.0.1", caller.answer_port))
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            leg = only_leg(srv)
            await eventually(lambda: leg.comfort_noise == 1, BOUND_S, "the comfort-noise packet")

            def said() -> bool:
                return any("Good morning everyone" in t.text for t in feed.turns)

            # comfort noise refreshed as the phone would (RFC 3389: every few seconds), until the
            # turn has come and the phone has been silent for longer than the RTP timeout
            last_word, refresh = time.monotonic(), 0
            while not said() or time.monotonic() - last_word < 4.0 + 1.0:
                refresh += 1
                caller.rtp.sendto(comfort_noise_packet(seq + refresh, (seq + refresh) * 160),
                                  ("127.0.0.1", caller.answer_port))  # fmt: skip
                await asyncio.sleep(0.5)
                assert time.monotonic() - last_word < BOUND_S, "no turn while the phone was silent"
            assert not leg.timed_out and srv.server.metrics.streams_active["sip"] == 1
            assert leg.silence_filled_s > 0
            # the phone sends nothing more: the RTP timeout hangs the leg up
            await caller.until(lambda m: m.startswith("BYE "), BOUND_S)
            assert leg.timed_out
        finally:
            caller.close()
            await feed.close()


async def test_a_lost_packet_is_concealed_and_holds_back_none_of_the_audio_after_it() -> None:
    """Two seconds of speech with one packet lost on the way: every other frame reaches the
    stream and the lost one is concealed, so the leg hears the whole two seconds, the last frames
    too, which the jitter buffer holds until the caller's next packets and the leg takes out of it
    when the caller pauses (`SipLeg.drain_jitter`). (With aiortp's defaults the lost packet held every later frame until the jitter buffer overflowed, which
    dropped the four frames before it; the frames after it were handed on 300 ms late, and those
    still held when the caller paused waited for the next words.)"""
    async with sip_server(sip={"rtp_timeout_s": 60.0}, stt={"diarize": False}) as srv:
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            speech = pcmu(0.6, 2.6, 0)  # 100 packets
            caller.send_rtp(speech[: 49 * 160])
            caller.send_rtp(speech[50 * 160 :], seq0=50)  # packet 49 lost
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            leg = only_leg(srv)
            # all of it, the last two frames (JITTER_FRAMES) drained from the buffer at the pause
            await eventually(lambda: leg.heard_s >= 2.0 - 1e-6, BOUND_S, "the audio after the loss")
            assert srv.server.metrics.streams_active["sip"] == 1  # while the call is up
            assert leg.dropped_frames == 0
            caller.request("BYE", "standup")
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
        finally:
            caller.close()


# --- re-INVITE (hold), DTMF, barge-in -------------------------------------------------------------


def only_leg(srv: RunningServer) -> Any:
    assert srv.server.sip is not None
    (leg,) = srv.server.sip.legs.values()
    return leg


async def test_a_re_invite_holds_the_leg_and_another_resumes_it() -> None:
    """Held (`a=sendonly`, then the old `c=0.0.0.0`): no RTP-timeout hang-up however long, no
    reply audio sent; resumed (`sendrecv`): the timeout counts again. Each answered 200 with
    our SDP in the matching direction."""
    async with sip_server(sip={"rtp_timeout_s": 1.0}) as srv:
        caller = RawCaller(sip_port(srv))
        talking = asyncio.Event()

        async def keep_talking() -> None:
            """Silence every 0.1 s while `talking` is set: the leg is never idle by accident."""
            seq = 0
            while True:
                await talking.wait()
                caller.send_rtp(b"\xff" * 160, seq0=seq)
                seq += 1
                await asyncio.sleep(0.1)

        talker = asyncio.create_task(keep_talking())
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            talking.set()
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            leg = only_leg(srv)
            answer = await caller.reinvite("standup", "sendonly")
            talking.clear()
            assert "a=recvonly" in answer and f"m=audio {caller.answer_port} " in answer, answer
            assert leg.held
            await eventually(lambda: leg.idle_while_held >= 2, BOUND_S, "two timeouts on hold")
            assert await caller.reinvite("standup", None, host="0.0.0.0")  # RFC 2543 hold
            await eventually(lambda: leg.idle_while_held >= 3, BOUND_S, "a third on hold")
            with pytest.raises(TimeoutError):  # three RTP timeouts held, and no BYE
                await caller.until(lambda m: m.startswith("BYE "), within_s=0.2)
            assert srv.server.metrics.streams_active["sip"] == 1 and leg.held
            await leg.send(bytes(3200))  # a 200 ms reply chunk while held: not sent
            assert leg.dropped_while_held == 10
            assert "a=sendrecv" in await caller.reinvite("standup", "sendrecv")
            talking.set()
            assert not leg.held
            await leg.send(bytes(3200))  # resumed: sent
            received = 0

            def heard_ten() -> bool:
                nonlocal received
                received += caller.rtp_received()
                return received >= 10

            await eventually(heard_ten, BOUND_S, "the resumed reply's RTP")
            assert received == 10  # nothing of the held chunk came
            talking.clear()
            await caller.until(lambda m: m.startswith("BYE "))  # the RTP timeout is back
        finally:
            talker.cancel()
            await asyncio.gather(talker, return_exceptions=True)
            caller.close()


async def test_a_dtmf_digit_reaches_the_feed_and_the_rooms_hooks() -> None:
    from rooms import HookTrigger

    async with sip_server() as srv:
        pressed: list[Any] = []
        srv.server.rooms.kit.hooks.add(HookTrigger.ON_DTMF, lambda m, ctx: pressed.append((m, ctx)))
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            match = re_search(r"a=rtpmap:(\d+) telephone-event", caller.last)
            caller.send_rtp(pcmu(0.6, 1.0, 0))
            caller.send_dtmf(5, int(match), seq0=100)
            await eventually(lambda: any(m.type == "dtmf" for m in feed.received), BOUND_S)
            await eventually(lambda: bool(pressed), BOUND_S, "the ON_DTMF hook")
        finally:
            caller.close()
            await feed.close()
    dtmf = next(m for m in feed.received if m.type == "dtmf")
    assert dtmf.digit == "5" and dtmf.participant.startswith("sip-dana-")
    message, ctx = pressed[0]
    assert message.digit == "5" and ctx.room_id == "standup" and ctx.participant_id == dtmf.participant


async def test_a_dtmf_digit_in_a_sip_info_reaches_the_feed() -> None:
    """Phones and PBXs that do not send RFC 4733 events send each key as an in-dialog INFO
    (`application/dtmf-relay`); an INFO with another body is refused (415), an empty one (a
    keepalive) answered."""
    async with sip_server() as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        caller = RawCaller(sip_port(srv))
        try:
            assert await caller.invite("standup", USERS["dana"]) == 200
            caller.send_rtp(pcmu(0.6, 1.0, 0))
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            relay = {"Content-Type": "application/dtmf-relay"}
            caller.request("INFO", "standup", relay, "Signal=7\r\nDuration=160\r\n")
            assert await caller.status() == 200
            caller.request("INFO", "standup", relay, "Signal=11\r\nDuration=160\r\n")  # #
            assert await caller.status() == 200
            caller.request("INFO", "standup", {"Content-Type": "text/plain"}, "hello")
            assert await caller.status() == 415
            caller.request("INFO", "standup")
            assert await caller.status() == 200
            await eventually(lambda: sum(m.type == "dtmf" for m in feed.received) >= 2, BOUND_S)
        finally:
            caller.close()
            await feed.close()
    assert [m.digit for m in feed.received if m.type == "dtmf"] == ["7", "#"]


def test_info_digits_are_read_from_both_bodies_and_nothing_else() -> None:
    from server.sip import info_digit

    assert info_digit("application/dtmf-relay", b"Signal=5\r\nDuration=160\r\n") == "5"
    assert info_digit("Application/DTMF-Relay; charset=x", b"Signal= *\nDuration= 250") == "*"
    assert info_digit("application/dtmf-relay", b"Signal=10\r\n") == "*"
    assert info_digit("application/dtmf", b"9") == "9"
    assert info_digit("application/dtmf", b"d") == "D"
    for kind, body in [("application/dtmf-relay", b"Duration=160"), ("application/dtmf", b"99"),
                       ("text/plain", b"Signal=5"), ("application/dtmf-relay", b"Signal=E")]:
        assert info_digit(kind, body) is None, (kind, body)


def re_search(pattern: str, text: str) -> str:
    import re

    found = re.search(pattern, text)
    assert found is not None, text
    return found.group(1)


async def test_the_caller_speaking_over_a_reply_clears_its_queued_audio() -> None:
    """A 6 s reply is playing; the caller talks: the rest of it is dropped, not sent, and what
    they said over it is heard."""
    async with OpenAIRealtimeServer(replies=["A long answer."], reply_audio_seconds=6.0) as model:
        config = {"sip": {"rtp_timeout_s": 60.0}, **answering(model.base_url, "dana")}
        async with sip_server(**config) as srv:
            caller = RawCaller(sip_port(srv))
            try:
                assert await caller.invite("standup", USERS["dana"]) == 200
                # "Good morning everyone." then 3 s of quiet RTP, as a phone keeps sending: the turn needs the
                # STT to hear the silence after it (with 1.5 s or less of it and then no RTP at
                # all, the turn came only when rtp_timeout_s hung the leg up, a minute later)
                caller.send_rtp(pcmu(0.6, 2.0, 3.0))
                received = 0

                def hearing(packets: int) -> Any:
                    def check() -> bool:
                        nonlocal received
                        received += caller.rtp_received()
                        return received >= packets
                    return check

                await eventually(hearing(10), BOUND_S, "the reply's first RTP")
                leg = only_leg(srv)
                caller.send_rtp(pcmu(2.0, 3.5, 0), seq0=1000)  # the caller talks over it
                await eventually(lambda: leg.barge_ins >= 1, BOUND_S, "barge-in")
                assert srv.server.metrics.barge_ins_total["sip"] == leg.barge_ins
                # the rest of the 6 s reply is dropped (a reply to the new turn may follow)
                await eventually(lambda: leg.cleared_s >= 3.0, BOUND_S, "the reply dropped")
                # and what the caller said over it reached the STT: the leg's V9 gate is lifted
                # by its barge-in, with the half second it held
                assert srv.stt_server is not None

                def voiced_s() -> float:
                    pcm = np.frombuffer(bytes(srv.stt_server.connections[0].audio), "<i2")
                    return int(np.count_nonzero(pcm)) / 16000

                await eventually(lambda: voiced_s() >= 1.4 + 1.5 - 0.2, BOUND_S, "the words over it")
                # hang up: the leg ends now, not when rtp_timeout_s of silence has passed
                caller.request("BYE", "standup")
                await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
            finally:
                caller.close()
    assert leg.barge_ins >= 1


# --- SIP over TCP, G.722 ------------------------------------------------------------------------


async def test_on_port_0_a_udp_port_whose_tcp_twin_is_taken_is_given_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`listen` on port 0 takes the UDP port the system chooses and TCP on the same number; that
    number can be taken for TCP by anything else on the machine (another test's connection did
    it once, under a parallel run). The endpoint then gives the UDP port back and takes another."""
    import socket

    from server import sip as sip_module

    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    busy = taken.getsockname()[1]
    real, tried = sip_module._udp_transport, []

    def first_the_busy_port(addr: tuple[str, int]) -> Any:
        tried.append(addr)
        return real(("127.0.0.1", busy) if len(tried) == 1 else addr)

    monkeypatch.setattr(sip_module, "_udp_transport", first_the_busy_port)
    try:
        async with sip_server() as srv:
            port = sip_port(srv)
            assert len(tried) == 2 and port != busy
            _, writer = await asyncio.open_connection("127.0.0.1", port)  # its own TCP
            writer.close()
    finally:
        taken.close()


async def test_a_call_whose_rtp_port_is_taken_before_it_is_bound_gets_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each call's RTP port is one the system says is free, bound a moment later; another
    process can take it in between. The call then gets another port, and is answered."""
    import socket

    from server import sip as sip_module

    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    real, chosen = sip_module._free_udp_port, []

    def first_a_taken_port(host: str) -> int:
        chosen.append(taken.getsockname()[1] if not chosen else real(host))
        return int(chosen[-1])

    monkeypatch.setattr(sip_module, "_free_udp_port", first_a_taken_port)
    try:
        async with sip_server(sip={"rtp_timeout_s": 60.0}) as srv:
            caller = RawCaller(sip_port(srv))
            try:
                assert await caller.invite("standup", USERS["dana"]) == 200
                assert len(chosen) == 2 and caller.answer_port == chosen[1]
                caller.request("BYE", "standup")
                await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
            finally:
                caller.close()
    finally:
        taken.close()


async def test_a_call_over_tcp(tmp_path: Path) -> None:
    """baresip's account on `transport=tcp`: the INVITE, its challenge, the call and its BYE
    all over one TCP connection to the same port as UDP; the turn arrives."""
    # tcp_idle_s far below the call's length: a connection that carries a call stays open
    async with sip_server(stt={"diarize": False}, sip={"tcp_idle_s": 0.5}) as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        wav = phone_wav(tmp_path / "t.wav", 0.6, 2.6)
        proc = await start_baresip(tmp_path / "t", sip_port(srv), "standup", "dana",
                                   USERS["dana"], wav, 60, display="Dana Lee", transport="tcp")  # fmt: skip
        # the connection has been silent for well over tcp_idle_s once 1.5 s of audio is in
        await eventually(lambda: srv.audio_read() >= 1.5, BOUND_S, "1.5 s of the call's audio")
        assert srv.server.sip is not None and srv.server.sip.tcp_closed == {}, "call's TCP closed"
        (log,) = await hang_up_once_heard(srv, [proc], 2.6)  # of 3 s
        await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S)
        await feed.close()
    assert "Call established" in log, log
    assert "Good morning everyone" in " ".join(t.text for t in feed.turns), feed.turns


async def tcp_status(port: int, request: bytes) -> bytes:
    """The final status line the endpoint answers `request` with over a TCP connection of its
    own (provisional ones such as 100 Trying skipped)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        while True:
            line = await asyncio.wait_for(reader.readline(), BOUND_S)
            if not line or (line.startswith(b"SIP/2.0 ") and not line.startswith(b"SIP/2.0 1")):
                return line
    finally:
        writer.close()


def tcp_invite(port: int) -> bytes:
    lines = [
        f"INVITE sip:standup@127.0.0.1:{port} SIP/2.0",
        "Via: SIP/2.0/TCP 127.0.0.1:5999;branch=z9hG4bKtcp1",
        "From: <sip:dana@127.0.0.1>;tag=tcp1", f"To: <sip:standup@127.0.0.1:{port}>",
        "Call-ID: tcp-limits-1", "CSeq: 1 INVITE", "Max-Forwards: 70", "Content-Length: 0", "", "",
    ]  # fmt: skip
    return "\r\n".join(lines).encode()


async def test_tcp_connections_are_capped_and_idle_or_slow_ones_closed() -> None:
    """SIP over TCP holds nothing open for nobody: past `max_tcp_connections` a connection is
    closed when accepted, one that sends nothing for `tcp_idle_s` is closed, so is one that
    leaves a message unfinished that long; a caller after them is still answered."""
    async with sip_server(sip={"max_tcp_connections": 2, "tcp_idle_s": 1.0}) as srv:
        endpoint = srv.server.sip
        assert endpoint is not None
        closed = endpoint.tcp_closed
        port = sip_port(srv)
        idle = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await eventually(lambda: len(endpoint._tcp_transport._connections) == 2, BOUND_S)
        over_reader, over_writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(over_reader.read(), BOUND_S) == b""  # closed at once
        assert closed.get("over_cap") == 1
        for reader, _ in idle:  # nothing sent for tcp_idle_s: closed by the server
            assert await asyncio.wait_for(reader.read(), BOUND_S) == b""
        assert closed.get("idle") == 2
        slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", port)
        slow_writer.write(f"INVITE sip:standup@127.0.0.1:{port} SIP/2.0\r\n".encode())
        await slow_writer.drain()  # ... and never the rest of the message
        assert await asyncio.wait_for(slow_reader.read(), BOUND_S) == b""
        assert closed.get("slow") == 1
        # the endpoint still answers over TCP: a challenge for an INVITE without credentials
        assert (await tcp_status(port, tcp_invite(port))).startswith(b"SIP/2.0 401")
        for _, writer in [*idle, (over_reader, over_writer), (slow_reader, slow_writer)]:
            writer.close()


async def test_g722_is_chosen_when_offered(tmp_path: Path) -> None:
    """baresip offers only G.722 (`audio_codecs=G722`): the leg runs at 16 kHz and is heard."""
    pytest.importorskip("G722", reason="needs sippy's G722 codec (the sip extra)")
    async with sip_server(stt={"diarize": False}) as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        wav = phone_wav(tmp_path / "g.wav", 0.6, 2.6, rate=16000)
        proc = await start_baresip(tmp_path / "g", sip_port(srv), "standup", "dana",
                                   USERS["dana"], wav, 60, display="Dana Lee", codec="G722")  # fmt: skip
        (log,) = await hang_up_once_heard(srv, [proc], 2.6)  # of 3 s
        await eventually(lambda: any(m.type == "stream_stopped" for m in feed.received), BOUND_S)
        await feed.close()
        assert srv.server.sip is not None
        assert srv.server.sip.calls_by_codec == {"G722": 1}
    assert "Call established" in log, log
    assert "Good morning everyone" in " ".join(t.text for t in feed.turns), feed.turns


async def test_the_sip_bench_caller_measures_its_turns() -> None:
    """`chorus bench sip`'s user agent (digest INVITE, RTP at real time, BYE) against the
    endpoint: its call is answered and each turn the feed gets has a latency."""
    from bench.sip import PASSWORD, USER, one_call, phone_audio

    async with sip_server(sip={"users": {**USERS, USER: PASSWORD}}, stt={"diarize": False}) as srv:
        mulaw = phone_audio(str(MEETING / "meeting.wav"), 2.6)[int(0.6 * 8000) :]
        result = await one_call(srv.base, sip_port(srv), "standup", mulaw,
                                issue_token(SECRET, "standup"))  # fmt: skip
        # the same as a phone with silence suppression: its last second is not sent
        suppressed = await one_call(srv.base, sip_port(srv), "retro", mulaw,
                                    issue_token(SECRET, "retro"), suppress=True)  # fmt: skip
    for call in (result, suppressed):
        assert call.error is None and call.turns >= 1, call
        assert len(call.latencies) == call.turns and all(x > 0 for x in call.latencies)
    assert result.comfort_noise == 0 and result.suppressed_s == 0
    assert suppressed.comfort_noise >= 1 and suppressed.suppressed_s >= 0.7


async def test_the_barge_in_bench_caller_interrupts_and_is_heard() -> None:
    """`chorus bench barge_in`'s call against the endpoint: each time the caller talks over the
    reply, it stops within the rule's time plus a few frames, and the words are heard; another
    caller in the room, listening, stops hearing it as soon (the reply stops for the room)."""
    from bench.barge_in import barge_in_call, utterances
    from bench.sip import PASSWORD, USER

    async with OpenAIRealtimeServer(reply_audio_seconds=8.0, audio_pace=4.0) as model:
        config = {"sip": {"users": {**USERS, USER: PASSWORD}}, **answering(model.base_url, "Bench")}
        async with sip_server(**config) as srv:
            audio = str(MEETING / "meeting.wav")
            result = await barge_in_call(srv.base, sip_port(srv), "standup",
                                         issue_token(SECRET, "standup"), audio,
                                         utterances(audio, 3), after=0.5,
                                         listeners=1)  # fmt: skip
    assert result.error is None, result
    others = result.others_stop_times()
    assert len(others) == 2 and all(0 <= s < 1.0 for s in others), result
    assert len(result.interruptions) == 2 and all(i.heard for i in result.interruptions)
    assert all(0 <= s < 1.0 for s in result.stop_times()) and len(result.stop_times()) == 2
    assert len(model.cancelled) >= 2 and len(model.truncated) >= 2
    # each thing said was answered: its reply's first packet came after the speech ended
    assert len(result.reply_after_s) == 3
    assert all(r is not None and 0 < r < 60 for r in result.reply_after_s), result.reply_after_s


async def test_the_barge_in_bench_device_interrupts_and_times_each_answer() -> None:
    """`chorus bench barge_in --path device`: a room's device that stops the reply as the page
    does; each time it talks over the reply, it stops, and each thing it said is answered, its
    answer timed from the end of what it said to the reply's first frame."""
    from bench.barge_in import device_barge_in, utterances

    async with OpenAIRealtimeServer(reply_audio_seconds=8.0, audio_pace=4.0) as model:
        words = MeetingWords.from_meeting(MEETING)
        async with running_server_with_local_stt(answering(model.base_url, "Bench"), words) as srv:
            audio = str(MEETING / "meeting.wav")
            result = await device_barge_in(srv.base, "standup", issue_token(SECRET, "standup"),
                                           audio, utterances(audio, 3), after=0.5)  # fmt: skip
    assert result.error is None, result
    assert len(result.stop_times()) == 2 and all(0 <= s < 1.5 for s in result.stop_times())
    assert len(result.reply_after_s) == 3
    assert all(r is not None and 0 < r < 60 for r in result.reply_after_s), result.reply_after_s


def test_a_reply_is_timed_from_the_end_of_what_it_answers() -> None:
    from bench.barge_in import reply_after

    # a reply at 1.0 s, talked over at 1.5 s (stopped at 1.56), the next reply from 3.0 s
    arrivals = [1.0, 1.02, 1.04, 1.5, 1.52, 1.54, 1.56, 3.0, 3.02]
    assert reply_after(arrivals, 0.4, 1.6) == pytest.approx(0.6)
    assert reply_after(arrivals, 2.2, None) == pytest.approx(0.8)  # not the tail of the last
    assert reply_after(arrivals, 2.2, 2.9) is None  # none before the next thing said
    assert reply_after([], 0.4, None) is None


def test_a_reply_stops_where_its_packets_stop_coming() -> None:
    from bench.barge_in import stop_time

    arrivals = [0.0, 0.02, 0.04, 0.06, 0.08, 0.10, 1.0, 1.02]  # a reply, a gap, the next one
    assert stop_time(arrivals, 0.05) == pytest.approx(0.05)
    assert stop_time(arrivals, 0.5) is None  # nothing was playing then


def test_the_barge_in_bench_scores_the_words_said_over_the_reply() -> None:
    """`chorus bench barge_in`'s words: what each interruption said (the meeting's script), the
    turns over it, WER after Whisper's normaliser, and whether the first word came through."""
    from types import SimpleNamespace

    from bench.barge_in import BargeInResult, Interruption, overlapping, said_in

    audio = str(MEETING / "meeting.wav")
    assert said_in(audio, [(4.698, 8.87)]) == [
        "Morning. The build is green and the installer is ready for testing."
    ]
    turns = [SimpleNamespace(start=0.0, end=1.0, text="Before."),
             SimpleNamespace(start=4.8, end=6.0, text="The build is green"),
             SimpleNamespace(start=6.0, end=9.0, text="and the installer is ready for testing.")]  # fmt: skip
    heard = overlapping(turns, 4.7, 8.9)
    assert heard == "The build is green and the installer is ready for testing."
    result = BargeInResult([Interruption(4.7, 8.9, said=said_in(audio, [(4.698, 8.87)])[0],
                                         transcribed=heard)])  # fmt: skip
    assert result.words() == {"wer": 1 / 12, "deletions": 1.0, "reference_words": 12.0,
                              "first_word": 0.0}  # fmt: skip


def test_the_bench_phone_with_weak_echo_control_sends_the_reply_back_as_a_phone_plays_it() -> None:
    """`chorus bench barge_in --echo-loss`: each reply packet comes back `loss` dB under it,
    `delay` after it arrived, and a burst of packets plays one after another (a phone's jitter
    buffer), not on top of each other."""
    import numpy as np

    from bench.barge_in import _EchoingPhone
    from voice.audio import float_to_pcm16, level_dbfs, mulaw_decode, mulaw_encode

    phone = _EchoingPhone(loss_db=20.0, delay_s=0.1)
    phone.began = 100.0
    rng = np.random.default_rng(3)
    played = (rng.standard_normal(160 * 5) * 0.1).astype(np.float32)  # five 20 ms packets
    for i in range(0, len(played), 160):  # all five at once, half a second into the call
        phone.played(mulaw_encode(np.frombuffer(float_to_pcm16(played[i : i + 160]), "<i2")), 100.5)
    echo = phone.echo(0, 8000 * 2)
    first = int(np.flatnonzero(echo)[0])
    assert first == int(0.6 * 8000), "it comes back `delay` after it arrived"
    span = echo[first : first + len(played)]
    assert abs(level_dbfs(span.astype(np.float32)) - (level_dbfs(played) - 20.0)) < 1.5
    # the five packets one after another through the room, not five on top of each other
    heard = mulaw_decode(mulaw_encode(np.frombuffer(float_to_pcm16(played), "<i2"))) / 32768
    assert np.allclose(span, np.convolve(heard, phone._ir)[: len(played)])


def test_the_barge_in_bench_speech_replies_are_the_meetings_later_turns_with_their_words() -> None:
    from bench.barge_in import REPLY_DBFS, speech_reply
    from voice.audio import level_dbfs, pcm16_to_float

    audio, words = speech_reply(str(MEETING / "meeting.wav"), 8.0)
    assert len(audio) == 8 * 24000 * 2
    assert abs(level_dbfs(pcm16_to_float(audio)) - REPLY_DBFS) < 0.5
    assert words.startswith("Agreed. Carol, please tell the support team about the window.")
    assert words.endswith("The mobile app needs new screenshots for the store.")


def test_the_barge_in_bench_counts_words_nobody_on_the_call_said() -> None:
    from types import SimpleNamespace

    from bench.barge_in import echo_turns, echo_words

    turns = [SimpleNamespace(type="turn", corrected=False, event_id=str(n), start=s, end=e, text=t)
             for n, (s, e, t) in enumerate([(0.2, 2.0, "What the caller said."),
                                            (2.1, 2.4, "its tail"),
                                            (5.0, 6.5, "A book could be written."),
                                            (9.9, 11.0, "Said over the reply.")])]  # fmt: skip
    assert echo_words(turns, [(0.0, 2.0), (10.0, 12.0)]) == "A book could be written."
    assert echo_turns(turns, [(0.0, 2.0), (10.0, 12.0)]) == [(5.0, 6.5, "A book could be written.")]
    assert echo_words(turns, [(0.0, 12.0)]) == ""


async def test_floods_of_invites_and_rtp_are_answered_and_the_server_keeps_serving() -> None:
    async with sip_server(sip={"max_calls": 4}) as srv:
        port = sip_port(srv)
        flooder, caller, other = RawCaller(port), RawCaller(port), RawCaller(port)
        try:
            # 300 INVITEs without credentials as fast as a socket sends them: each one challenged
            import uuid

            assert srv.server.sip is not None
            before = srv.server.sip.refused.get(401, 0)
            for _ in range(300):
                flooder.call_id = uuid.uuid4().hex  # 300 calls, not one call's retransmissions
                flooder.request("INVITE", "standup", body=flooder.sdp())
            # what the kernel's UDP buffer held of the flood is challenged (the rest is dropped
            # before the server sees it, as any UDP flood); a real caller behind it is answered
            await eventually(
                lambda: srv.server.sip is not None
                and srv.server.sip.refused.get(401, 0) - before >= 50,
                BOUND_S, "the flood challenged",
            )
            assert await caller.invite("standup", USERS["dana"]) == 200
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 1, BOUND_S)
            answers = []  # every answer the flood got is a challenge: none of it is a call
            with contextlib.suppress(BlockingIOError):
                while True:
                    answers.append(flooder.sip.recv(65535).split(b" ", 2)[1])
            assert answers and set(answers) == {b"100", b"401"}  # Trying, then the challenge
            # an RTP flood: 60 s of audio in one burst from the negotiated address
            caller.send_rtp(pcmu(0.6, 60.6, 0))
            # another call in another room is still answered and heard meanwhile
            assert await other.invite("other", USERS["dana"]) == 200
            other.send_rtp(pcmu(0.6, 3.0), seq0=0)
            feed = await EventFeed.open(srv.base, "other", issue_token(SECRET, "other"))
            await eventually(lambda: len(feed.turns) >= 1, 60, "a turn in the other room")
            await feed.close()
            for c in (caller, other):
                c.request("BYE", "standup" if c is caller else "other")
            await eventually(lambda: srv.server.metrics.streams_active["sip"] == 0, BOUND_S)
        finally:
            for c in (flooder, caller, other):
                c.close()
