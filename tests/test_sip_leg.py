"""A SIP leg's audio in (`server.sip.SipLeg`) without a network: a phone's silence suppression.

A phone with silence suppression stops sending RTP between talk spurts (or sends an RFC 3389
comfort-noise packet and then nothing). The leg reads each pause longer than `SILENCE_FILL_S` as
digital silence for the time the caller was quiet, so the STT hears the pause that ends a turn;
comfort noise keeps the leg from `rtp_timeout_s`; a held leg is fed nothing. The call's network
side is `tests/test_server_sip.py` (a real RTP socket)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from server.sip import JITTER_FRAMES, RTP_FRAME_S, SipLeg, SkippedTime, held_frames
from server.sockets import SILENCE_FILL_S, SocketClosed


@dataclass
class FakeCall:
    call_id: str = "call-1"
    source_addr: tuple[str, int] = ("127.0.0.1", 5060)


@dataclass
class FakeRtp:
    on_cn: Any = None


@dataclass
class FakeSession:
    codec_sample_rate: int = 8000
    on_audio: Any = None
    rtp_session: FakeRtp = field(default_factory=FakeRtp)
    clock_rate: int = 8000
    sent: list[bytes] = field(default_factory=list)
    """The reply frames the leg sent (`send_audio_pcm`)."""

    def send_audio_pcm(self, frame: bytes, timestamp: int) -> None:
        self.sent.append(frame)


FRAME = bytes(range(256)) + bytes(64)  # 20 ms at 8 kHz, 16-bit: 320 bytes, not silence


def a_leg(rtp_timeout_s: float = 60.0) -> tuple[SipLeg, FakeSession]:
    session = FakeSession()
    leg = SipLeg(FakeCall(), session, rtp_timeout_s)  # type: ignore[arg-type]
    return leg, session


async def test_a_pause_after_the_callers_words_reads_as_silence_for_the_time_it_lasted() -> None:
    leg, session = a_leg()
    for n in range(5):
        session.on_audio(FRAME, n * 160)
    assert [await leg.recv() for _ in range(5)] == [FRAME] * 5
    started = time.monotonic()
    silence = await leg.recv()  # nothing more came: the pause, once SILENCE_FILL_S long
    waited = time.monotonic() - started
    frame_bytes = int(8000 * RTP_FRAME_S) * 2
    assert silence == bytes(len(silence)) and len(silence) % frame_bytes == 0
    assert len(silence) >= int(SILENCE_FILL_S / RTP_FRAME_S) * frame_bytes - frame_bytes
    assert len(silence) <= (waited + RTP_FRAME_S) * 8000 * 2 + frame_bytes
    more = await leg.recv()  # and again while the caller stays quiet
    assert more == bytes(len(more)) and len(more) > 0
    assert leg.silence_filled_s == pytest.approx((len(silence) + len(more)) / 2 / 8000)
    session.on_audio(FRAME, 5 * 160)  # the caller talks again: the frame comes as it is
    assert await leg.recv() == FRAME


async def test_a_leg_that_never_sent_audio_is_fed_no_silence_and_times_out() -> None:
    leg, _ = a_leg(rtp_timeout_s=0.5)
    with pytest.raises(SocketClosed, match="rtp timeout"):
        await leg.recv()
    assert leg.timed_out and leg.silence_filled_s == 0


async def test_comfort_noise_keeps_the_leg_up_and_its_end_times_it_out() -> None:
    leg, session = a_leg(rtp_timeout_s=1.0)
    session.on_audio(FRAME, 0)
    assert await leg.recv() == FRAME
    noise = session.rtp_session.on_cn
    assert noise is not None
    heard = 0.0

    async def refresh() -> None:
        for _ in range(8):  # 1.6 s of comfort noise, past the 1 s timeout
            noise(60)
            await asyncio.sleep(0.2)

    refreshing = asyncio.create_task(refresh())
    while not refreshing.done():
        heard += len(await leg.recv()) / 2 / 8000
    assert not leg.timed_out and leg.comfort_noise == 8 and heard > 1.0
    with pytest.raises(SocketClosed, match="rtp timeout"):
        while True:
            await leg.recv()
    assert leg.timed_out


async def test_a_held_leg_is_fed_its_pause_for_hold_tail_s_then_nothing_until_the_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The caller speaks and puts the call on hold: the pause is fed for `HOLD_TAIL_S` more (the
    turn they ended closes), then nothing however long the hold; after the resume, the pause is
    fed from the resume, not for the hold."""
    from server import sip as sip_module

    monkeypatch.setattr(sip_module, "HOLD_TAIL_S", 0.5)
    leg, session = a_leg(rtp_timeout_s=60.0)
    session.on_audio(FRAME, 0)
    assert await leg.recv() == FRAME
    leg.hold(True)
    held = 0.0
    while held < 0.5 - SILENCE_FILL_S:  # the pause's first HOLD_TAIL_S, fed as it goes
        chunk = await leg.recv()
        assert chunk == bytes(len(chunk))
        held += len(chunk) / 2 / 8000
    with pytest.raises(TimeoutError):  # then nothing, however long the hold
        await asyncio.wait_for(leg.recv(), SILENCE_FILL_S * 3)
    assert leg.silence_filled_s <= 0.5 + RTP_FRAME_S
    leg.hold(False)
    started = time.monotonic()
    silence = await leg.recv()
    waited = time.monotonic() - started
    assert silence == bytes(len(silence))
    assert len(silence) / 2 / 8000 <= waited + RTP_FRAME_S  # from the resume, not the hold


async def test_music_on_hold_is_not_handed_on_and_the_callers_audio_is_after_the_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A phone holding with `a=sendonly` sends music on hold: none of it reaches the STT (the
    caller is not talking), the pause is still fed for `HOLD_TAIL_S`, and after the resume the
    caller's frames come as they are."""
    from server import sip as sip_module

    monkeypatch.setattr(sip_module, "HOLD_TAIL_S", 0.5)
    leg, session = a_leg(rtp_timeout_s=60.0)
    session.on_audio(FRAME, 0)
    assert await leg.recv() == FRAME
    leg.hold(True)
    music = bytes(range(1, 256)) + bytes(range(1, 66))  # 320 bytes, loud, not FRAME
    for n in range(1, 51):  # one second of music on hold, as it would arrive
        session.on_audio(music, n * 160)
    held = 0.0
    while held < 0.5 - SILENCE_FILL_S:  # the pause's tail is still fed, as silence
        chunk = await leg.recv()
        assert chunk == bytes(len(chunk))
        held += len(chunk) / 2 / 8000
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(leg.recv(), SILENCE_FILL_S * 3)
    assert leg.ignored_while_held_s == pytest.approx(1.0)
    leg.hold(False)
    session.on_audio(FRAME, 60 * 160)
    while (chunk := await leg.recv()) != FRAME:  # at most the pause since the resume, as silence
        assert chunk == bytes(len(chunk))


@given(
    units_per_frame=st.sampled_from([160, 320]),  # PCMU; G.722 at its RFC clock or at 16 kHz
    pauses=st.lists(st.integers(0, 400), min_size=1, max_size=12),  # frames skipped, per spurt
    spurt=st.integers(2, 30),
    start=st.integers(0, 2**32 - 1),
)
def test_the_skipped_time_is_read_from_the_timestamps_whatever_their_clock(
    units_per_frame: int, pauses: list[int], spurt: int, start: int
) -> None:
    """Spurts of `spurt` 20 ms frames, each after a pause of so many frames the phone did not
    send: what `SkippedTime` reads before each frame adds up to the pauses (the timestamp
    wrapping at 2**32 included), and nothing inside a spurt."""
    skips = SkippedTime()
    frame, now, read = 0, 0.0, []
    for pause in [0, *pauses]:
        frame += pause
        now += pause * RTP_FRAME_S
        for i in range(spurt):
            stamp = (start + frame * units_per_frame) & 0xFFFFFFFF
            read.append((i, skips.skipped(stamp, RTP_FRAME_S, now)))
            frame += 1
            now += RTP_FRAME_S
    assert all(x == 0 for i, x in read if i > 0)
    firsts = [x for i, x in read if i == 0][1:]
    assert firsts == pytest.approx([p * RTP_FRAME_S for p in pauses], abs=1e-9)


def test_a_timestamp_step_back_or_past_the_wall_time_is_no_skip() -> None:
    skips = SkippedTime()
    assert skips.skipped(1000, RTP_FRAME_S, 0.0) == 0
    assert skips.skipped(1160, RTP_FRAME_S, 0.02) == 0
    assert skips.skipped(500, RTP_FRAME_S, 0.04) == 0  # back: a new source
    assert skips.skipped(500 + 160 * 1000, RTP_FRAME_S, 0.06) == 0  # 20 s ahead after 20 ms
    assert skips.skipped(500 + 160 * 1011, RTP_FRAME_S, 0.3) == pytest.approx(0.2)


async def test_a_pause_shorter_than_the_fill_is_fed_when_the_caller_talks_again() -> None:
    """The phone skips 100 ms (its timestamps jump by five frames): before the next frame, the
    stream gets those 100 ms of silence, so its clock keeps the call's time."""
    leg, session = a_leg()
    for n in range(3):
        session.on_audio(FRAME, n * 160)
    session.on_audio(FRAME, 8 * 160)  # frames 3-7 not sent
    read = [await leg.recv() for _ in range(5)]
    assert read[:3] == [FRAME] * 3 and read[4] == FRAME
    assert read[3] == bytes(5 * 320)
    assert leg.silence_filled_s == pytest.approx(0.1)


async def test_silence_fed_during_a_pause_is_not_fed_again_when_its_timestamps_show_it() -> None:
    leg, session = a_leg()
    session.on_audio(FRAME, 0)
    session.on_audio(FRAME, 160)
    assert [await leg.recv(), await leg.recv()] == [FRAME, FRAME]
    fed = await leg.recv()  # the pause, fed as it goes
    frames_fed = len(fed) // 320
    session.on_audio(FRAME, (2 + frames_fed + 3) * 160)  # the pause was 3 frames longer
    assert await leg.recv() == bytes(3 * 320) and await leg.recv() == FRAME


def test_the_bench_loses_the_same_packets_in_every_run_and_its_own_in_each_room() -> None:
    from bench.sip import lost_packets

    first = lost_packets(5000, 0.02, "sipbench-1-0")
    assert first == lost_packets(5000, 0.02, "sipbench-1-0")
    assert first != lost_packets(5000, 0.02, "sipbench-2-1")
    assert 50 <= len(first) <= 150 and lost_packets(5000, 0.0, "r") == set()


async def test_a_re_invite_that_changes_nothing_leaves_the_pause_as_it_was() -> None:
    """A session refresh (RFC 4028) or a media move comes as a re-INVITE with `sendrecv`: the
    pause it falls in is still fed from the caller's last frame, not from the re-INVITE."""
    leg, session = a_leg()
    session.on_audio(FRAME, 0)
    spoke = time.monotonic()
    assert await leg.recv() == FRAME
    await asyncio.sleep(SILENCE_FILL_S / 2)
    leg.hold(False)  # not held: nothing changes
    silence = await leg.recv()
    assert len(silence) / 2 / 8000 >= time.monotonic() - spoke - 2 * RTP_FRAME_S


# --- the frames aiortp's jitter buffer holds back -------------------------------------------------


def rtp_packet(seq: int, payload: bytes | None = None) -> Any:
    from aiortp.packet import RtpPacket

    return RtpPacket(payload_type=0, sequence_number=seq & 0xFFFF, timestamp=(seq * 160) & 0xFFFFFFFF,
                     ssrc=0x1234, payload=payload if payload is not None else bytes([seq % 256]) * 160)  # fmt: skip


@given(
    first=st.integers(0, 2**16 - 1),
    kept=st.lists(st.booleans(), min_size=1, max_size=40),
)
def test_held_frames_are_what_the_buffer_has_not_handed_on_in_order_with_the_losses(
    first: int, kept: list[bool]
) -> None:
    """Packets in order with some lost on the way (the first always arrives): the frames the
    buffer hands on as packets come, then `held_frames`, give every packet that came once, in
    order, and count every lost packet before the last one that came."""
    from aiortp.jitterbuffer import JitterBuffer

    kept[0] = True
    buffer = JitterBuffer(capacity=64, prefetch=JITTER_FRAMES, skip_audio_gaps=True)
    handed: list[Any] = []
    for n, came in enumerate(kept):
        if came:
            _, frame = buffer.add(rtp_packet(first + n))
            if frame is not None:
                handed.append(frame)
    held = held_frames(buffer)
    frames = handed + held
    last = max(n for n, came in enumerate(kept) if came)
    assert [f.timestamp for f in frames] == [((first + n) * 160) & 0xFFFFFFFF
                                             for n, came in enumerate(kept) if came]  # fmt: skip
    assert sum(f.lost for f in frames) == sum(not came for came in kept[: last + 1])
    assert len(held) <= JITTER_FRAMES + 1 and (held or len(handed) == sum(kept))


@dataclass
class BufferedRtp:
    """The part of aiortp's `RTPSession` a leg drains: its jitter buffer (the real one) and the
    path a frame takes from it to `on_audio` (no codec: the payload is the PCM)."""

    session: Any
    on_cn: Any = None
    _jitter_buffer: Any = None

    def __post_init__(self) -> None:
        from aiortp.jitterbuffer import JitterBuffer

        self._jitter_buffer = JitterBuffer(capacity=16, prefetch=JITTER_FRAMES, skip_audio_gaps=True)

    def receive(self, packet: Any) -> None:
        _, frame = self._jitter_buffer.add(packet)
        if frame is not None:
            self._deliver_audio_frame(frame)

    def _deliver_audio_frame(self, frame: Any) -> None:
        self.session.on_audio(frame.data, frame.timestamp)


async def test_a_talk_spurts_last_frames_come_before_its_pause_and_before_a_hang_up() -> None:
    """The jitter buffer hands a frame on only once later packets come. A phone with silence
    suppression sends none in the pause, so the spurt's last `JITTER_FRAMES` frames reached the
    STT after the pause's silence (and after a hang-up, never): they now come first."""
    session = FakeSession()
    rtp = BufferedRtp(session)
    session.rtp_session = rtp  # type: ignore[assignment]
    leg = SipLeg(FakeCall(), session, 60.0)  # type: ignore[arg-type]
    frames = [bytes([n + 1]) * 320 for n in range(10)]
    for n, frame in enumerate(frames):
        rtp.receive(rtp_packet(n, frame))
    got = [await leg.recv() for _ in range(10)]  # the first 8 as they came, then the held 2
    assert got == frames
    silence = await leg.recv()
    assert silence == bytes(len(silence))  # then the pause
    assert leg.heard_s == pytest.approx(10 * RTP_FRAME_S)
    more = [bytes([n + 21]) * 320 for n in range(5)]
    for n, frame in enumerate(more):  # the next spurt, 1 s later on the phone's clock
        rtp.receive(rtp_packet(60 + n, frame))
    leg.hung_up()  # and the caller hangs up straight after it
    tail: list[bytes] = []
    with pytest.raises(SocketClosed, match="hung up"):
        while True:
            tail.append(await leg.recv())
    assert [c for c in tail if c != bytes(len(c))] == more  # every frame, the held ones included

