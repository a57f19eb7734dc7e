"""The SIP endpoint (`[sip]`, issue 29.1) against a real SIP client: Debian's `baresip`.

baresip dials `sip:ROOM@127.0.0.1:PORT` with digest credentials, plays a WAV file into the call
(`aufile`) and dumps what it hears (`sndfile`). STT is the local Deepgram-protocol server: it
finds the received audio in the demo meeting and says the meeting's words and speakers, so a
speakerphone leg's voices come back labelled. `make system-deps` installs baresip.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
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
from server.testing.harness import SECRET, RunningServer, eventually, running_server_with_local_stt
from voice.audio import read_audio_16k, resample
from voice.testing.deepgram_server import MeetingWords

pytestmark = pytest.mark.skipif(shutil.which("baresip") is None, reason="needs baresip (make system-deps)")

MEETING = Path(__file__).resolve().parents[1] / "examples" / "meeting"
BOUND_S = 120.0
USERS = {"speakerphone": "s3cret-a", "dana": "s3cret-b"}


def phone_wav(path: Path, start: float, end: float, silence: float = 1.0) -> Path:
    audio = read_audio_16k(MEETING / "meeting.wav")[int(start * 16000) : int(end * 16000)]
    narrow = np.concatenate([resample(audio, 16000, 8000), np.zeros(int(silence * 8000), np.float32)])
    sf.write(path, narrow, 8000, subtype="PCM_16")
    return path


def write_baresip_config(conf: Path, sip_port: int, user: str, password: str, wav: Path,
                         display: str | None) -> None:  # fmt: skip
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "dump").mkdir(exist_ok=True)
    (conf / "config").write_text(
        "sip_listen 127.0.0.1:0\n"
        f"audio_source aufile,{wav}\n"
        "audio_player aufile,/dev/null\n"
        "module_path /usr/lib/baresip/modules\n"
        "module g711.so\nmodule aufile.so\nmodule sndfile.so\n"
        f"snd_path {conf / 'dump'}\n"
        "module account.so\nmodule menu.so\n"
    )
    name = f'"{display}" ' if display else ""
    (conf / "accounts").write_text(
        f"{name}<sip:{user}@127.0.0.1:{sip_port};transport=udp>;auth_pass={password};regint=0;"
        "audio_codecs=PCMU\n"
    )


async def baresip(
    conf: Path, sip_port: int, room: str, user: str, password: str, wav: Path, seconds: int,
    display: str | None = None,
) -> str:  # fmt: skip
    """One baresip call: dial, play `wav`, hang up after `seconds`; its log. What it heard is
    dumped under `conf/dump` (`sndfile`)."""
    write_baresip_config(conf, sip_port, user, password, wav, display)
    proc = await asyncio.create_subprocess_exec(
        "baresip", "-f", str(conf), "-t", str(seconds), "-e", f"/dial sip:{room}@127.0.0.1:{sip_port}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    out, _ = await asyncio.wait_for(proc.communicate(), seconds + 60)
    return out.decode(errors="replace")


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


async def test_a_speakerphone_leg_and_a_one_person_leg_are_their_own_participants(
    tmp_path: Path,
) -> None:
    async with sip_server() as srv:
        feed = await EventFeed.open(srv.base, "standup", issue_token(SECRET, "standup"))
        port = sip_port(srv)
        two_voices = phone_wav(tmp_path / "two.wav", 0.6, 8.95)  # Alice, then Bob
        one_voice = phone_wav(tmp_path / "one.wav", 9.1, 12.6)  # one more voice, alone
        logs = await asyncio.gather(
            baresip(tmp_path / "a", port, "standup", "speakerphone", USERS["speakerphone"],
                    two_voices, 12),
            baresip(tmp_path / "b", port, "standup", "dana", USERS["dana"], one_voice, 8,
                    display="Dana Lee"),
        )  # fmt: skip
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
        config = {
            "stt": {"diarize": False},
            "realtime": {"provider": "openai", "base_url": model.base_url, "api_key": "test"},
            "policy": {"answer_only": ["Dana Lee"]},
        }
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
