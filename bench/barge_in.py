"""Barge-in on a SIP call: how soon the reply stops when the caller talks over it, and whether
what they said over it is heard.

`chorus bench barge_in` starts `chorus serve` in its own process with `[sip]` on 127.0.0.1, the
server's default STT (local Whisper tiny.en) and, for the replies, the OpenAI-Realtime-protocol
stand-in (`realtime.testing.openai_server`, in this process) making `--reply-seconds` of audio
per reply at four times real time, as a model makes audio faster than it plays. `[policy]
answer_only` is the caller, so every turn of theirs is answered. One call (`bench.sip`'s user
agent, RTP paced at real time) says the demo meeting's first turn, then, `--interruptions`
times: waits until the reply has played for `--after` seconds, and says the meeting's next
turn over it.

`--listeners N` puts N more callers in the same room first (a phone bridge): they only listen
(their phones send silence), hear every reply too, and never talk over it.

`--path device`: the caller is a room's device instead (the device protocol at real time, in
20 ms frames, `shared_mic` false), which the server silences while a reply plays (V9), and which
does what the page does: it plays the reply audio it is sent at real time, and 240 ms of its own
audio at an RMS of 0.02 or more while that plays make it drop the reply and send `barge_in`.
**Stop** is then from its first loud frame to the last reply audio the server sent it before the
reply went quiet.

`--path echo-cancelled`: the same device, declaring `echo_cancelled` (a speakerphone or app with
its own echo cancellation): the server does not silence it while a reply plays and decides the
barge-in itself (`server.reply_audio.BargeIn`, `ECHO_CANCELLED_BARGE_IN_S` of speech); the device
never sends `barge_in`, and drops what it holds at the server's `reply_stopped`. **Stop** is from
its first frame at an RMS of 0.02, as for the page. `--path server-decided`: the same device,
declaring `server_barge_in` (the page with the browser's echo cancellation on): silenced while a
reply plays, as the page, and the server decides the barge-in by the same rule.

`--echo-loss DB` makes the caller's phone one whose echo control is weak: it sends back the reply
it hears, `DB` under it, through a small room (a decaying impulse response, `--echo-delay` after
the packet arrived), mixed into whatever the caller says; after the last interruption the caller
stays quiet for a whole reply (its echo alone). `--speech-replies` makes the replies speech, with
their words as the model's transcript (an echo of a tone is nothing a recogniser writes down):
the meeting's own turns from `SPEECH_REPLY_AT` on, which the caller never says, brought to
`REPLY_DBFS`. Then also:
- **echo words**: words of the call's committed turns that overlap nothing the caller said (the
  reply's echo written down in the caller's name);
- **barge-ins**: the server's count (`chorus_barge_ins_total`), against the interruptions that
  stopped a reply: the rest are replies the echo stopped.

`--caller-gain DB` makes the caller's voice that much louder (negative: quieter) than the
recording's (about the replies' level): what the double-talk check of the barge-in rule costs a
quiet caller.

Per interruption:
- **stop**: from the caller's first frame at −35 dBFS (`TALK_DBFS`) to the last reply RTP
  packet that reached the caller before the reply went quiet (a gap of 0.2 s); the rule itself
  (`server.reply_audio.BargeIn`) needs `BARGE_IN_S` of speech by Silero VAD;
- **others' stop**: the same, from the same frame, for each listener (the reply stops for the
  whole room, or only for whoever talked);
- **heard**: whether a committed turn of the call overlaps the interruption's audio (the V9
  gate, which holds a phone leg back while a reply plays, is lifted by its barge-in);
- **words**: the committed turns overlapping the interruption against what was said (the demo
  meeting's `meeting.json`), WER after Whisper's English normaliser (`whisper_normalizer`), and
  whether its first word was transcribed;
- what the model was told: the stand-in's `response.cancel`s and `conversation.item.truncate`s.

Per thing the caller said: **reply after**, from the last frame of their speech to the first
packet (SIP) or frame (device) of the reply to it (voice to voice at the phone or the device; the
stand-in answers at once, so it is Chorus's own time), and the server's own
`chorus_reply_latency_seconds` (sum and count).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.load import DEFAULT_AUDIO, SECRET, _free_port, _process, _wait_port
from bench.sip import (
    FRAME_BYTES,
    FRAME_S,
    PASSWORD,
    USER,
    SipCaller,
    _free_udp_port,
    hang_up_and_flush,
    recorded,
)
from server.metrics import percentile

REPO = Path(__file__).resolve().parents[1]
QUIET_GAP_S = 0.2
"""A pause this long in the reply RTP the caller receives ends the reply that was playing."""
PAUSE_S = 0.8
"""Silence the caller sends after each thing they say (their turn closes)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--interruptions", type=int, default=8, help="times the caller barges in")
    parser.add_argument("--reply-seconds", type=float, default=8.0, help="audio per reply")
    parser.add_argument(
        "--after", type=float, default=0.5, help="seconds of reply heard before each barge-in"
    )
    parser.add_argument(
        "--listeners", type=int, default=0,
        help="more callers in the room, who only listen (a bridge)",
    )  # fmt: skip
    parser.add_argument("--audio", default=str(DEFAULT_AUDIO), help="the demo meeting (WAV + RTTM)")
    parser.add_argument(
        "--path", choices=("sip", "device", "echo-cancelled", "server-decided"), default="sip",
        help="the caller: a SIP call (default), a room's device that stops the reply itself (as "
        "the page with echo cancellation off), a device that declares `echo_cancelled` (the "
        "server hears it over the reply and stops it), or one that declares `server_barge_in` "
        "(the page with echo cancellation on: silenced while the reply plays, the server "
        "decides)",
    )  # fmt: skip
    parser.add_argument(
        "--server-repo", default=str(REPO),
        help="run the `chorus serve` of this checkout (an older one, side by side)",
    )  # fmt: skip
    parser.add_argument(
        "--echo-loss", type=float, default=None,
        help="the caller's phone sends the reply back this many dB under it (weak echo control)",
    )  # fmt: skip
    parser.add_argument(
        "--echo-delay", type=float, default=0.1,
        help="seconds from a reply packet's arrival to its echo in what the phone sends",
    )  # fmt: skip
    parser.add_argument(
        "--caller-gain", type=float, default=0.0,
        help="the caller's voice this many dB louder (negative: quieter)",
    )  # fmt: skip
    parser.add_argument(
        "--speech-replies", action="store_true",
        help="the replies are speech (the meeting's later turns) with their words (default: a "
        "tone)",
    )  # fmt: skip
    parser.add_argument(
        "--stt-model", default=None,
        help="the server's live Whisper model (`[stt] model`; default tiny.en), e.g. base",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="write the results here")


class _Arrivals(asyncio.DatagramProtocol):
    """The caller's RTP socket: when each packet of reply audio arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.times.append(time.monotonic())


class _EchoingPhone(_Arrivals):
    """A phone whose echo control is weak: each reply packet it plays comes back in what it sends,
    `loss_db` under the reply, through a small room (a direct path and a decaying tail), played
    `delay_s` after the packet arrived (or right after the packet before it). `echo(first,
    count)` is the echo in the call's samples from `first` (8 kHz, float), which the caller adds
    to what it says."""

    def __init__(self, loss_db: float, delay_s: float) -> None:
        import numpy as np

        from bench.barge_in_rule import echo_room_ir

        super().__init__()
        self._ir = echo_room_ir(8000, loss_db)
        self._delay = int(delay_s * 8000)
        self._echo = np.zeros(8000 * 60, np.float64)
        """The echo by the call's samples (grown as the call goes on)."""
        self._next = 0
        self.began = 0.0
        """When the call's sample 0 was sent (the caller sets it)."""

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        super().datagram_received(data, addr)
        if self.began and len(data) > 12:
            self.played(data[12:], self.times[-1])

    def played(self, mulaw: bytes, arrived: float) -> None:
        """One reply packet's µ-law payload, which arrived at `arrived` (monotonic time)."""
        import numpy as np

        from voice.audio import mulaw_decode

        samples = mulaw_decode(mulaw).astype(np.float64) / 32768
        # played out as a phone's jitter buffer does: each packet right after the one before,
        # unless it came later than that (a new reply)
        at = max(int((arrived - self.began) * 8000) + self._delay, self._next)
        self._next = at + len(samples)
        echo = np.convolve(samples, self._ir)
        end = at + len(echo)
        if end > len(self._echo):
            self._echo = np.concatenate([self._echo, np.zeros(max(end, 2 * len(self._echo))
                                                             - len(self._echo))])  # fmt: skip
        self._echo[at:end] += echo

    def echo(self, first: int, count: int) -> Any:
        import numpy as np

        echo = self._echo[first : first + count]
        return np.pad(echo, (0, count - len(echo)))  # (none yet that far into the call)


@dataclass
class Interruption:
    start: float
    """Where the interruption's audio begins in the call (seconds)."""
    end: float
    stop_s: float | None = None
    """From the caller's first loud frame to the last reply packet before the reply went quiet
    (None: no reply was playing)."""
    heard: bool = False
    others_stop_s: list[float | None] = field(default_factory=list)
    """The same for each listener, from the same frame."""
    said: str = ""
    """What the caller said over the reply (the meeting's words)."""
    transcribed: str = ""
    """The committed turns that overlap it, in order."""


@dataclass
class BargeInResult:
    interruptions: list[Interruption] = field(default_factory=list)
    cancelled: int = 0
    truncated: int = 0
    turns: int = 0
    error: str | None = None
    echo_words: str = ""
    """The words of the call's committed turns that overlap nothing the caller said."""
    echo_turns: list[tuple[float, float, str]] = field(default_factory=list)
    """Those turns: when (seconds into the call) and what."""
    barge_ins: int | None = None
    """The server's count of barge-ins (`chorus_barge_ins_total`)."""
    reply_after_s: list[float | None] = field(default_factory=list)
    """For each thing the caller said: from the end of their speech to the first packet of the
    reply to it (None: none came); voice to voice, at the phone."""
    server_reply_latency: tuple[float, int] | None = None
    """The server's own figure (`chorus_reply_latency_seconds`): (sum in seconds, count)."""

    def stop_times(self) -> list[float]:
        return [i.stop_s for i in self.interruptions if i.stop_s is not None]

    def others_stop_times(self) -> list[float]:
        return [s for i in self.interruptions for s in i.others_stop_s if s is not None]

    def words(self) -> dict[str, float]:
        """WER of the interruptions' words (Whisper's English normaliser), and how many of them
        had their first word transcribed."""
        import jiwer
        from whisper_normalizer.english import EnglishTextNormalizer

        norm = EnglishTextNormalizer()
        said = [norm(i.said) for i in self.interruptions]
        got = [norm(i.transcribed) for i in self.interruptions]
        out = jiwer.process_words(said, got)
        first = sum(bool(s.split()) and g.split()[:1] == s.split()[:1]
                    for s, g in zip(said, got, strict=True))  # fmt: skip
        return {"wer": float(out.wer), "deletions": float(out.deletions),
                "reference_words": float(sum(len(s.split()) for s in said)),
                "first_word": float(first)}  # fmt: skip


def utterances(audio: str, count: int) -> list[tuple[float, float]]:
    """The recording's first `count` RTTM turns of 1.5 s or more, in order (start, end)."""
    rttm = Path(audio).with_suffix(".rttm")
    spans = []
    for line in rttm.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "SPEAKER" and float(parts[4]) >= 1.5:
            spans.append((float(parts[3]), float(parts[3]) + float(parts[4])))
    if len(spans) < count:
        raise ValueError(f"{rttm} has {len(spans)} turns of 1.5 s or more, {count} needed")
    return spans[:count]


def said_in(audio: str, spans: list[tuple[float, float]]) -> list[str]:
    """The words of each span, from the recording's `.json` script (its turns by start)."""
    script = json.loads(Path(audio).with_suffix(".json").read_text())
    by_start = {round(float(t["start"]), 2): str(t["text"]) for t in script["turns"]}
    return [by_start.get(round(start, 2), "") for start, _ in spans]


def overlapping(turns: list[Any], start: float, end: float) -> str:
    """The text of the committed turns (latest versions) that overlap `start`…`end`."""
    return " ".join(t.text for t in turns if t.start < end and t.end > start)


def reply_after(arrivals: list[float], spoke_until: float, before: float | None) -> float | None:
    """From `spoke_until` (the end of what the caller said) to the first packet of a reply that
    began after it (its first packet after a `QUIET_GAP_S` gap), if it came before `before`;
    None when none did."""
    previous = None
    for t in arrivals:
        if before is not None and t >= before:
            break
        if t > spoke_until and (previous is None or t - previous >= QUIET_GAP_S):
            return t - spoke_until
        previous = t
    return None


def replies_after(arrivals: list[float], spoke_until: list[float]) -> list[float | None]:
    """`reply_after` for each thing said, each bounded by the end of the next."""
    return [reply_after(arrivals, at, nxt)
            for at, nxt in zip(spoke_until, [*spoke_until[1:], None], strict=True)]  # fmt: skip


def stop_time(arrivals: list[float], loud_at: float) -> float | None:
    """From `loud_at` to the last arrival before the first `QUIET_GAP_S` gap after it; None when
    nothing was arriving (no reply playing at `loud_at`)."""
    after = [t for t in arrivals if t >= loud_at - QUIET_GAP_S]
    if not after or after[0] > loud_at + QUIET_GAP_S:
        return None
    last = after[0]
    for t in after[1:]:
        if t - last >= QUIET_GAP_S:
            break
        last = t
    return max(0.0, last - loud_at)


class _Listener:
    """A caller in the room who only listens: their phone sends silence at real time."""

    def __init__(self, sip_port: int, room: str, n: int) -> None:
        self.caller = SipCaller(sip_port, room, name=f"Listener {n}")
        self.arrivals = _Arrivals()
        self.caller.rtp_in = self.arrivals  # type: ignore[assignment]
        self._task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        await self.caller.open()
        await self.caller.call()
        self._task = asyncio.create_task(self._silence())

    async def _silence(self) -> None:
        began, sent = time.monotonic(), 0
        while True:
            delay = began + sent * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            self.caller.rtp(sent, b"\xff" * FRAME_BYTES)
            sent += 1

    async def leave(self) -> None:
        if self._task is not None:
            self._task.cancel()
        with contextlib.suppress(Exception):
            await self.caller.hang_up()
        self.caller.close()


async def barge_in_call(
    base: str, sip_port: int, room: str, token: str, audio: str, spans: list[tuple[float, float]],
    after: float, listeners: int = 0, echo: _EchoingPhone | None = None, listen_s: float = 0.0,
    gain_db: float = 0.0,
) -> BargeInResult:
    """One call: the first span said, then each next one said over the reply to the one before;
    `listeners` more callers in the room first, listening. With `echo`, the caller's phone sends
    back the reply it hears; `listen_s` of silence after the last span (the last reply heard);
    the caller's voice `gain_db` louder than the recording's."""
    import numpy as np

    from server.client import EventFeed
    from server.protocol import FeedMessage, TurnMessage
    from voice.audio import (
        float_to_pcm16,
        level_dbfs,
        mulaw_encode,
        read_audio_16k,
        resample,
    )

    recording = resample(read_audio_16k(audio), 16000, 8000) * np.float32(10 ** (gain_db / 20))
    result = BargeInResult()
    turns: list[TurnMessage] = []
    stopped = asyncio.Event()

    def on_message(message: FeedMessage) -> None:
        if isinstance(message, TurnMessage):
            turns.append(message)
        elif getattr(message, "type", "") == "stream_stopped":
            stopped.set()

    feed = await EventFeed.open(base, room, token, on_message=on_message)
    caller = SipCaller(sip_port, room)
    arrivals = echo or _Arrivals()
    caller.rtp_in = arrivals  # type: ignore[assignment]
    sent = 0
    began = 0.0
    said: list[tuple[float, float]] = []
    """The spans of the call the caller talked in (seconds)."""

    def frame_out(samples: Any) -> bytes:
        """One 20 ms frame as the phone sends it: what the caller says, and the echo."""
        if echo is not None:
            samples = samples + echo.echo(sent * FRAME_BYTES, FRAME_BYTES)
        return mulaw_encode(np.frombuffer(float_to_pcm16(np.asarray(samples, np.float32)), "<i2"))

    spoke_until: list[float] = []
    """When the last frame of each span's speech went (monotonic)."""

    async def say(start: float, end: float, pause: float) -> float | None:
        """The span at real time, then `pause` of silence; the time its first loud frame went."""
        nonlocal sent
        narrow = recording[int(start * 8000) : int(end * 8000)]
        said.append((sent * FRAME_S, sent * FRAME_S + len(narrow) / 8000))
        speech = len(narrow)
        narrow = np.concatenate([narrow, np.zeros(int(pause * 8000), np.float32)])
        loud_at = None
        for i in range(0, len(narrow), FRAME_BYTES):
            if i >= speech and len(spoke_until) < len(said):
                spoke_until.append(time.monotonic())
            talk = narrow[i : i + FRAME_BYTES]
            talk = np.pad(talk, (0, FRAME_BYTES - len(talk)))
            delay = began + sent * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            caller.rtp(sent, frame_out(talk))
            if loud_at is None and level_dbfs(talk) >= TALK_DBFS:  # their voice, not the echo
                loud_at = time.monotonic()
            sent += 1
        if len(spoke_until) < len(said):  # (no pause after it)
            spoke_until.append(time.monotonic())
        return loud_at

    async def silence_until(ready: Any, limit_s: float) -> None:
        nonlocal sent
        deadline = time.monotonic() + limit_s
        while not ready():
            if time.monotonic() > deadline:
                raise TimeoutError("no reply came")
            delay = began + sent * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            caller.rtp(sent, frame_out(np.zeros(FRAME_BYTES)))  # silence (and any echo)
            sent += 1

    others = [_Listener(sip_port, room, n) for n in range(1, listeners + 1)]
    async with recorded(result, caller, feed):
        for other in others:
            await other.join()
        await caller.open()
        await caller.call()
        began = time.monotonic()
        if echo is not None:
            echo.began = began
        first, *rest = spans
        await say(*first, PAUSE_S)
        for start, end in rest:
            seen = len(arrivals.times)

            def playing_a_while(seen: int = seen) -> bool:  # the reply began `after` ago
                return len(arrivals.times) > seen and time.monotonic() - arrivals.times[seen] >= after

            await silence_until(playing_a_while, 60.0)
            at = sent * FRAME_S
            loud_at = await say(start, end, PAUSE_S)
            item = Interruption(round(at, 2), round(at + end - start, 2))
            if loud_at is not None:
                item.stop_s = stop_time(arrivals.times, loud_at)
                item.others_stop_s = [stop_time(o.arrivals.times, loud_at) for o in others]
            result.interruptions.append(item)
        if listen_s > 0:  # the reply to the last span, heard to its end
            end_at = time.monotonic() + listen_s
            await silence_until(lambda: time.monotonic() >= end_at, listen_s + 1)
        await hang_up_and_flush(caller, stopped)
    for other in others:
        await other.leave()
    result.reply_after_s = replies_after(arrivals.times, spoke_until)
    result.turns = len(turns)
    _score(result, turns, audio, spans)
    result.echo_turns = echo_turns(turns, said)
    result.echo_words = " ".join(text for _, _, text in result.echo_turns)
    return result


ECHO_MARGIN_S = 0.3
"""A turn within this much of what the caller said is theirs (turn edges are not exact)."""


def echo_words(turns: list[Any], said: list[tuple[float, float]]) -> str:
    """The text of the committed turns (latest versions) that overlap none of `said`, widened by
    `ECHO_MARGIN_S`: words nobody on the call said."""
    return " ".join(text for _, _, text in echo_turns(turns, said))


def echo_turns(turns: list[Any], said: list[tuple[float, float]]) -> list[tuple[float, float, str]]:
    """Those turns: (start, end, text), in the call's seconds."""
    from server.client import latest_turns

    return [(t.start, t.end, t.text) for t in latest_turns(turns)
            if not any(t.start < end + ECHO_MARGIN_S and t.end > start - ECHO_MARGIN_S
                       for start, end in said)]  # fmt: skip


REPLY_DBFS = -20.0
"""The level `--speech-replies` are brought to (RMS): about what a realtime model's speech is."""
SPEECH_REPLY_AT = 41.41
"""Where in the demo meeting `--speech-replies` begin (its 13th turn; the bench caller says the
first nine at most)."""


def speech_reply(audio: str, seconds: float) -> tuple[bytes, str]:
    """`seconds` of the meeting from `SPEECH_REPLY_AT` as the stand-in model's reply audio
    (pcm16 at 24 kHz, mono, at `REPLY_DBFS`) and its words: the script's turns that overlap it."""
    from voice.audio import float_to_pcm16, level_dbfs, read_audio_16k, resample

    start, end = SPEECH_REPLY_AT, SPEECH_REPLY_AT + seconds
    speech = read_audio_16k(audio)[int(start * 16000) : int(end * 16000)]
    speech = resample(speech, 16000, 24000)
    script = json.loads(Path(audio).with_suffix(".json").read_text())
    text = " ".join(str(t["text"]) for t in script["turns"]
                    if float(t["start"]) < end and float(t["end"]) > start)  # fmt: skip
    return float_to_pcm16(speech * 10 ** ((REPLY_DBFS - level_dbfs(speech)) / 20)), text


def server_samples(port: int, *names: str) -> dict[str, float]:
    """The sum of each named sample over its labels, from the server's `/metrics` (read with
    Prometheus' own parser); a name the server does not write is left out."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def barge_ins(port: int) -> int | None:
    """The server's `chorus_barge_ins_total` over every stream kind; None for a server that
    does not count them."""
    count = server_samples(port, "chorus_barge_ins_total").get("chorus_barge_ins_total")
    return None if count is None else round(count)


def server_reply_latency(port: int) -> tuple[float, int] | None:
    """The server's `chorus_reply_latency_seconds` (sum, count); None for a server without it."""
    got = server_samples(port, "chorus_reply_latency_seconds_sum",
                         "chorus_reply_latency_seconds_count")  # fmt: skip
    if len(got) < 2:
        return None
    return got["chorus_reply_latency_seconds_sum"], round(got["chorus_reply_latency_seconds_count"])


def _score(
    result: BargeInResult, turns: list[Any], audio: str, spans: list[tuple[float, float]]
) -> None:
    from server.client import latest_turns

    final = latest_turns(turns)
    words = said_in(audio, spans[1 : len(result.interruptions) + 1])  # (fewer: the call failed)
    for item, said in zip(result.interruptions, words, strict=True):
        item.heard = any(t.start < item.end and t.end > item.start for t in final)
        item.said = said
        item.transcribed = overlapping(final, item.start, item.end)


PAGE_LEVEL = 0.02
"""The page's barge-in level (RMS of a frame, full scale 1)."""
TALK_DBFS = -35.0
"""Where the bench's clock starts on a SIP call: the caller's first frame at this RMS level (the
level gate the phone's barge-in rule was before it heard speech with a VAD; the same start for
the rule before and after)."""

PAGE_HOLD_FRAMES = 12
"""The page's barge-in hold: twelve 20 ms frames (240 ms)."""


async def device_barge_in(
    base: str, room: str, token: str, audio: str, spans: list[tuple[float, float]], after: float,
    echo_cancelled: bool = False, server_barge_in: bool = False, gain_db: float = 0.0,
) -> BargeInResult:
    """As `barge_in_call`, from a room's device that does what the page does with echo
    cancellation off (see the module's docstring); `echo_cancelled`, one that declares it
    cancels its own echo; `server_barge_in`, the page with echo cancellation on: the server
    hears it over the reply and decides the barge-in (`BargeIn`), the device only stops playing
    at `reply_stopped`."""
    import numpy as np

    from server.client import DeviceStream
    from server.protocol import FeedMessage, ReplyStoppedMessage, StartMessage, TurnMessage
    from voice.audio import float_to_pcm16, read_audio_16k

    recording = read_audio_16k(audio) * np.float32(10 ** (gain_db / 20))
    result = BargeInResult()
    arrivals: list[float] = []  # when each piece of reply audio arrived
    plays_until = 0.0
    frame = 320  # 20 ms at 16 kHz
    sent = 0
    began = 0.0

    def play(pcm16: bytes) -> None:  # the reply's audio as the page plays it
        nonlocal plays_until
        now = time.monotonic()
        arrivals.append(now)
        plays_until = max(plays_until, now) + len(pcm16) / 2 / 16000

    def told(message: FeedMessage) -> None:  # the server stopped the reply: drop what is held
        nonlocal plays_until
        if isinstance(message, ReplyStoppedMessage):
            plays_until = 0.0

    desk = await DeviceStream.open(base, room, token, StartMessage(
        participant="bench-desk", name="Bench", sample_rate=16000, shared_mic=False,
        echo_cancelled=echo_cancelled, server_barge_in=server_barge_in), on_message=told,
        on_audio=play)  # fmt: skip
    page_rule = not (echo_cancelled or server_barge_in)

    async def say(samples: Any) -> float | None:
        """At real time in 20 ms frames, the page's barge-in rule on each; the time of the
        first frame at its level while the reply played (None: none)."""
        nonlocal sent, plays_until
        loud_at, loud = None, 0
        for i in range(0, len(samples), frame):
            piece = samples[i : i + frame]
            delay = began + sent * 0.02 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await desk.ws.send(float_to_pcm16(piece))
            sent += 1
            playing = time.monotonic() < plays_until
            level = float(np.sqrt(np.mean(np.square(piece)))) if len(piece) else 0.0
            if playing and level >= PAGE_LEVEL:
                loud += 1
                if loud_at is None:
                    loud_at = time.monotonic()
                if loud == PAGE_HOLD_FRAMES and page_rule:
                    plays_until = 0.0  # the page drops what it holds
                    await desk.barge_in()
            else:
                loud = 0
        return loud_at

    def silence(seconds: float) -> Any:
        return np.zeros(int(seconds * 16000), np.float32)

    spoke_until: list[float] = []
    """When the last frame of each span's speech went (monotonic)."""

    async def say_span(start: float, end: float) -> float | None:
        """The span, then `PAUSE_S` of silence; the time of its first loud frame (as `say`)."""
        loud_at = await say(recording[int(start * 16000) : int(end * 16000)])
        spoke_until.append(time.monotonic())
        await say(silence(PAUSE_S))
        return loud_at

    try:
        began = time.monotonic()
        first, *rest = spans
        await say_span(*first)
        for start, end in rest:
            seen = len(arrivals)
            deadline = time.monotonic() + 60.0
            while not (len(arrivals) > seen and time.monotonic() - arrivals[seen] >= after):
                if time.monotonic() > deadline:
                    raise TimeoutError("no reply came")
                await say(silence(0.02))
            at = sent * 0.02
            loud_at = await say_span(start, end)
            item = Interruption(round(at, 2), round(at + end - start, 2))
            if loud_at is not None:
                item.stop_s = stop_time(arrivals, loud_at)
            result.interruptions.append(item)
        await say(silence(2.0))
        await asyncio.wait_for(desk.stop(), 120)
    except Exception as exc:
        result.error = f"{type(exc).__name__}: {exc}"
        with contextlib.suppress(Exception):
            await desk.ws.close()
    result.reply_after_s = replies_after(arrivals, spoke_until)
    turns = [m for m in desk.received if isinstance(m, TurnMessage)]
    result.turns = len({t.event_id for t in turns})
    _score(result, turns, audio, spans)
    return result


def run(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    from realtime.testing.openai_server import OpenAIRealtimeServer
    from server.auth import issue_token

    spans = utterances(args.audio, args.interruptions + 1)
    workdir = Path(tempfile.mkdtemp(prefix="chorus-bench-barge-in-"))
    env = {**os.environ, "PYANNOTE_METRICS_ENABLED": "0", "CHORUS_SECRET": SECRET}
    port, sip_port = _free_port(), _free_udp_port()
    if args.speech_replies and spans[-1][1] > SPEECH_REPLY_AT:
        raise SystemExit(f"--speech-replies: the caller's {len(spans)} turns reach past "
                         f"{SPEECH_REPLY_AT} s, where the replies are taken from")  # fmt: skip
    voice, said = speech_reply(args.audio, args.reply_seconds) if args.speech_replies else (None, "")
    echo = None if args.echo_loss is None else _EchoingPhone(args.echo_loss, args.echo_delay)
    async with OpenAIRealtimeServer(reply_audio_seconds=args.reply_seconds, audio_pace=4.0,
                                    reply_voice=voice,
                                    replies=[said] * 100 if said else ()) as model:  # fmt: skip
        config = workdir / "chorus.toml"
        config.write_text(
            '[stt]\nprovider = "whisper"\n'
            + (f'model = "{args.stt_model}"\n' if args.stt_model else "")
            + '[store]\nurl = "memory://"\n'
            f'[realtime]\nprovider = "openai"\nbase_url = "{model.base_url}"\napi_key = "bench"\n'
            '[policy]\nanswer_only = ["Bench"]\n'  # the caller's From display name
            f'[sip]\nenabled = true\nlisten = "127.0.0.1:{sip_port}"\n'
            f'users = {{ {USER} = "{PASSWORD}" }}\n'
        )
        serve = [sys.executable, "-m", "cli.main", "serve", "--port", str(port), "--config",
                 str(config), "--log-level", "WARNING"]  # fmt: skip
        with _process(serve, env, workdir / "server.log", cwd=Path(args.server_repo)) as srv:
            await _wait_port(port, srv, "chorus serve")
            print(f"server pid {srv.pid}; logs in {workdir}", file=sys.stderr)
            base, token = f"ws://127.0.0.1:{port}", issue_token(SECRET, "bench-barge-in")
            if args.path in ("device", "echo-cancelled", "server-decided"):
                result = await device_barge_in(base, "bench-barge-in", token, args.audio, spans,
                                               args.after, args.path == "echo-cancelled",
                                               args.path == "server-decided",
                                               args.caller_gain)  # fmt: skip
            else:
                result = await barge_in_call(base, sip_port, "bench-barge-in", token, args.audio,
                                             spans, args.after, args.listeners, echo,
                                             args.reply_seconds + 1.0 if echo else 0.0,
                                             args.caller_gain)  # fmt: skip
            result.barge_ins = await asyncio.to_thread(barge_ins, port)
            result.server_reply_latency = await asyncio.to_thread(server_reply_latency, port)
        result.cancelled, result.truncated = len(model.cancelled), len(model.truncated)
    stops = result.stop_times()
    print("| interruption | at (s) | stop (ms) | heard | the listeners' stop (ms) |")
    print("|---:|---:|---:|---|---|")
    for n, item in enumerate(result.interruptions, 1):
        stop = "—" if item.stop_s is None else f"{item.stop_s * 1000:.0f}"
        theirs = ", ".join("—" if s is None else f"{s * 1000:.0f}" for s in item.others_stop_s)
        print(f"| {n} | {item.start:.1f} | {stop} | {'yes' if item.heard else 'no'} | {theirs} |")
    if stops:
        print(f"\nstop p50 {percentile(stops, 50) * 1000:.0f} ms, p95 "
              f"{percentile(stops, 95) * 1000:.0f} ms, max {max(stops) * 1000:.0f} ms over "
              f"{len(stops)}; heard {sum(i.heard for i in result.interruptions)} of "
              f"{len(result.interruptions)}; the model was sent {result.cancelled} cancel(s) and "
              f"{result.truncated} truncate(s)")  # fmt: skip
    words = result.words()
    print(f"the interruptions' words: WER {words['wer']:.1%} (Whisper's English normaliser; "
          f"{words['deletions']:.0f} of {words['reference_words']:.0f} words missing), the first "
          f"word transcribed in {words['first_word']:.0f} of {len(result.interruptions)}")  # fmt: skip
    if echo is not None or result.barge_ins is not None:
        stopped = sum(i.stop_s is not None for i in result.interruptions)
        heard = len(result.echo_words.split())
        print(f"barge-ins heard by the server: {result.barge_ins} (interruptions that stopped a "
              f"reply: {stopped}); words nobody on the call said, in the caller's turns: {heard}"
              + (f" ({result.echo_words!r})" if heard else ""))  # fmt: skip
    replies = [r for r in result.reply_after_s if r is not None]
    if replies:
        print(f"reply after the caller's speech ended (at the {'device' if args.path != 'sip' else 'phone'}, "
              f"the model answering at once): "
              f"p50 {percentile(replies, 50) * 1000:.0f} ms, p95 "
              f"{percentile(replies, 95) * 1000:.0f} ms, max {max(replies) * 1000:.0f} ms over "
              f"{len(replies)} of {len(result.reply_after_s)}")  # fmt: skip
    if result.server_reply_latency is not None and result.server_reply_latency[1]:
        total, count = result.server_reply_latency
        print(f"the server's reply latency (chorus_reply_latency_seconds): mean "
              f"{total / count * 1000:.0f} ms over {count}")  # fmt: skip
    others = result.others_stop_times()
    if others:
        print(f"the listeners' stop p50 {percentile(others, 50) * 1000:.0f} ms, p95 "
              f"{percentile(others, 95) * 1000:.0f} ms, max {max(others) * 1000:.0f} ms over "
              f"{len(others)}")  # fmt: skip
    if result.error:
        print(f"error: {result.error}", file=sys.stderr)
    if args.json:
        await asyncio.to_thread(Path(args.json).write_text, json.dumps(asdict(result), indent=2))
    return 1 if result.error else 0


__all__ = [
    "BargeInResult",
    "Interruption",
    "barge_in_call",
    "device_barge_in",
    "said_in",
    "stop_time",
    "utterances",
]

