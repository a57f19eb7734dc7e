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
its first frame at an RMS of 0.02, as for the page.

Per interruption:
- **stop**: from the caller's first frame at −35 dBFS (`TALK_DBFS`) to the last reply RTP
  packet that reached the caller before the reply went quiet (a gap of 0.2 s); the rule itself
  (`server.reply_audio.BargeIn`) needs `BARGE_IN_S` of speech by Silero VAD;
- **others' stop**: the same, from the same frame, for each listener (the reply stops for the
  whole room, or only for whoever talked);
- **heard**: whether a committed turn of the call overlaps the interruption's audio (the V9
  gate does not silence a phone leg);
- **words**: the committed turns overlapping the interruption against what was said (the demo
  meeting's `meeting.json`), WER after Whisper's English normaliser (`whisper_normalizer`), and
  whether its first word was transcribed;
- what the model was told: the stand-in's `response.cancel`s and `conversation.item.truncate`s.
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
        "--path", choices=("sip", "device", "echo-cancelled"), default="sip",
        help="the caller: a SIP call (default), a room's device that stops the reply itself (as "
        "the page), or a device that declares `echo_cancelled` (the server hears it over the "
        "reply and stops it)",
    )  # fmt: skip
    parser.add_argument(
        "--server-repo", default=str(REPO),
        help="run the `chorus serve` of this checkout (an older one, side by side)",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="write the results here")


class _Arrivals(asyncio.DatagramProtocol):
    """The caller's RTP socket: when each packet of reply audio arrived."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.times.append(time.monotonic())


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
    after: float, listeners: int = 0,
) -> BargeInResult:
    """One call: the first span said, then each next one said over the reply to the one before;
    `listeners` more callers in the room first, listening."""
    import numpy as np

    from server.client import EventFeed
    from server.protocol import FeedMessage, TurnMessage
    from voice.audio import (
        float_to_pcm16,
        level_dbfs,
        mulaw_decode,
        mulaw_encode,
        pcm16_to_float,
        read_audio_16k,
        resample,
    )

    recording = resample(read_audio_16k(audio), 16000, 8000)
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
    arrivals = _Arrivals()
    caller.rtp_in = arrivals  # type: ignore[assignment]
    sent = 0
    began = 0.0

    async def say(start: float, end: float, pause: float) -> float | None:
        """The span at real time, then `pause` of silence; the time its first loud frame went."""
        nonlocal sent
        narrow = recording[int(start * 8000) : int(end * 8000)]
        narrow = np.concatenate([narrow, np.zeros(int(pause * 8000), np.float32)])
        mulaw = mulaw_encode(np.frombuffer(float_to_pcm16(narrow), "<i2"))
        loud_at = None
        for i in range(0, len(mulaw), FRAME_BYTES):
            frame = mulaw[i : i + FRAME_BYTES].ljust(FRAME_BYTES, b"\xff")
            delay = began + sent * FRAME_S - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            caller.rtp(sent, frame)
            level = level_dbfs(pcm16_to_float(mulaw_decode(frame)))
            if loud_at is None and level >= TALK_DBFS:
                loud_at = time.monotonic()
            sent += 1
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
            caller.rtp(sent, b"\xff" * FRAME_BYTES)
            sent += 1

    others = [_Listener(sip_port, room, n) for n in range(1, listeners + 1)]
    async with recorded(result, caller, feed):
        for other in others:
            await other.join()
        await caller.open()
        await caller.call()
        began = time.monotonic()
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
        await hang_up_and_flush(caller, stopped)
    for other in others:
        await other.leave()
    result.turns = len(turns)
    _score(result, turns, audio, spans)
    return result


def _score(
    result: BargeInResult, turns: list[Any], audio: str, spans: list[tuple[float, float]]
) -> None:
    from server.client import latest_turns

    final = latest_turns(turns)
    for item, said in zip(result.interruptions, said_in(audio, spans[1:]), strict=True):
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
    echo_cancelled: bool = False,
) -> BargeInResult:
    """As `barge_in_call`, from a room's device that does what the page does (see the module's
    docstring); or, `echo_cancelled`, one that declares it cancels its own echo: the server
    hears it over the reply and decides the barge-in (`BargeIn`), the device only stops playing
    at `reply_stopped`."""
    import numpy as np

    from server.client import DeviceStream
    from server.protocol import FeedMessage, ReplyStoppedMessage, StartMessage, TurnMessage
    from voice.audio import float_to_pcm16, read_audio_16k

    recording = read_audio_16k(audio)
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
        echo_cancelled=echo_cancelled), on_message=told, on_audio=play)  # fmt: skip

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
                if loud == PAGE_HOLD_FRAMES and not echo_cancelled:
                    plays_until = 0.0  # the page drops what it holds
                    await desk.barge_in()
            else:
                loud = 0
        return loud_at

    def silence(seconds: float) -> Any:
        return np.zeros(int(seconds * 16000), np.float32)

    try:
        began = time.monotonic()
        first, *rest = spans
        await say(np.concatenate([recording[int(first[0] * 16000) : int(first[1] * 16000)],
                                  silence(PAUSE_S)]))  # fmt: skip
        for start, end in rest:
            seen = len(arrivals)
            deadline = time.monotonic() + 60.0
            while not (len(arrivals) > seen and time.monotonic() - arrivals[seen] >= after):
                if time.monotonic() > deadline:
                    raise TimeoutError("no reply came")
                await say(silence(0.02))
            at = sent * 0.02
            loud_at = await say(np.concatenate([recording[int(start * 16000) : int(end * 16000)],
                                                silence(PAUSE_S)]))  # fmt: skip
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
    async with OpenAIRealtimeServer(reply_audio_seconds=args.reply_seconds,
                                    audio_pace=4.0) as model:  # fmt: skip
        config = workdir / "chorus.toml"
        config.write_text(
            '[stt]\nprovider = "whisper"\n[store]\nurl = "memory://"\n'
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
            if args.path in ("device", "echo-cancelled"):
                result = await device_barge_in(base, "bench-barge-in", token, args.audio, spans,
                                               args.after, args.path == "echo-cancelled")  # fmt: skip
            else:
                result = await barge_in_call(base, sip_port, "bench-barge-in", token, args.audio,
                                             spans, args.after, args.listeners)  # fmt: skip
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

