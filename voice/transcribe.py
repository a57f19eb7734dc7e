"""Transcribe a recording through the same path a live stream takes: a room, a `VoiceChannel`,
one session fed PCM16 frames, turns committed as room events.

Why not call Whisper on the file directly: the CLI (`chorus transcribe`) and the benchmark
(`chorus bench transcription`) must measure and show what a live room gets — the same VAD
segmentation, the same turn cutting, hooks and renames. `speed` paces the frames at a multiple of
real time (1.0 = live) so latency from the end of speech to the turn event can be measured.
Also here: the output formats (text, markdown, json, srt, vtt, rttm).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from rooms import HookContext, HookResult, HookTrigger, RoomKit
from voice.assembler import TurnPolicy
from voice.audio import float_to_pcm16, resample
from voice.channel import CommittedTurn, TranscriptionEvent, VoiceChannel
from voice.diarization_stage import DiarizationStage, KnownTimelineStage, SpeakerTimeline
from voice.second_pass import SecondPass
from voice.stt.base import SttProvider
from voice.turns import Word

FloatAudio = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Turn:
    speaker: str | None
    text: str
    start: float
    end: float
    label: str | None = None
    """The raw label before renames (`Speaker A`)."""
    latency: float | None = None
    """Seconds from the end of the turn's speech (as streamed) to its room event (paced runs)."""
    words: tuple[Word, ...] = ()
    typed: bool = False
    """A typed line of the room (its chat, Teams, WhatsApp), not speech: `start` = `end` = where
    it fell among the spoken turns (the end of the last one before it)."""
    suggestion: str | None = None
    """A name the voice directory finds likely for this voice (tier suggest: the speaker keeps
    its letter; docs/voices.md)."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"speaker": self.speaker, "text": self.text, "start": round(self.start, 3),
               "end": round(self.end, 3), "kind": "typed" if self.typed else "spoken"}
        if self.suggestion is not None:
            out["suggestion"] = self.suggestion
        return out

    @property
    def shown_speaker(self) -> str | None:
        """The speaker as the text, SRT and WebVTT formats show it (`Erin (typed)`)."""
        if self.typed:
            return f"{self.speaker or 'someone'} (typed)"
        return self.speaker


@dataclass
class Transcription:
    turns: list[Turn]
    duration: float
    elapsed: float
    """Wall seconds from the first frame to the last turn."""
    stt: str
    reconnects: int = 0
    errors: list[str] = field(default_factory=list)
    corrections: int = 0
    """Turns committed early (from interim results) that a final result corrected."""
    first_pass: list[Turn] | None = None
    """With a second pass: the turns as first committed (before it corrected any)."""
    second_pass: dict[str, int] | None = None
    """With a second pass: what it did (`SecondPassStats.as_dict`)."""

    @property
    def real_time_factor(self) -> float:
        return self.elapsed / self.duration if self.duration else 0.0


def parse_renames(pairs: Sequence[str]) -> dict[str, str]:
    """`["Speaker A=Alice", …]` → `{"Speaker A": "Alice"}` (a clear error for a malformed pair)."""
    out: dict[str, str] = {}
    for pair in pairs:
        label, sep, name = pair.partition("=")
        if not sep or not label.strip() or not name.strip():
            raise ValueError(f"--rename expects LABEL=NAME (e.g. \"Speaker A=Alice\"), got {pair!r}")
        out[label.strip()] = name.strip()
    return out


async def transcribe_audio(
    audio: FloatAudio,
    sample_rate: int,
    *,
    stt: SttProvider,
    pipeline_speakers: bool = False,
    diarizer: DiarizationStage | None = None,
    renames: dict[str, str] | None = None,
    speed: float | None = None,
    frame_seconds: float = 0.1,
    progress: Callable[[float], None] | None = None,
    refine_speakers: bool = False,
    policy: TurnPolicy | None = None,
    second_pass: SecondPass | None = None,
    diarizer_audio: FloatAudio | None = None,
    name_speakers: Callable[[SpeakerTimeline, FloatAudio], Mapping[str, str]] | None = None,
    name_turn: Callable[[str, float, float], str] | None = None,
) -> Transcription:
    """Stream `audio` into a fresh room's VoiceChannel and collect the committed turns.

    `policy`: the turn rules (`[voice]`; the defaults when None). `speed=None` pushes as fast as the STT takes it; `speed=1.0` paces frames in real time and
    fills `Turn.latency`. `progress(seconds)` is called as audio is transcribed.
    `refine_speakers=True` (a whole file is at hand): the diarization stage first diarizes the
    whole recording in batch mode, and the channel reads that timeline instead of the stage's live
    decisions; everything after (word alignment, turns, hooks) is the live path.
    `second_pass`: re-decode stretches of committed turns and correct them in place
    (`voice.second_pass`); the result's `first_pass` has the turns as first committed.
    `diarizer_audio` (with `refine_speakers`): what the diarizer hears instead of `audio` (the
    same recording through another front end, `voice.frontend`).
    `name_speakers(timeline, audio at the stage's rate)` (with `refine_speakers`): names for the
    whole recording's labels (the voice directory's, `diarization.directory`), applied as
    renames are; a `renames` entry for the same label wins. `name_turn(label, start, end)` (with
    `name_speakers`): what each turn of a label no rename names reads instead (its name, another,
    or the label: `diarization.directory.TurnChecks`), called off the loop."""
    explicit = dict(renames or {})
    names = dict(explicit)
    if name_speakers is not None and not (pipeline_speakers and diarizer is not None
                                          and refine_speakers):
        raise ValueError("naming speakers needs the whole recording diarized first "
                         "(pipeline_speakers, a diarizer and refine_speakers)")
    if name_turn is not None and name_speakers is None:
        raise ValueError("name_turn checks the names name_speakers gave: pass both")
    if pipeline_speakers and diarizer is not None and refine_speakers:
        diarized = audio if diarizer_audio is None else diarizer_audio
        whole = resample(diarized, sample_rate, diarizer.sample_rate)
        timeline = await asyncio.to_thread(diarizer.diarize, whole)
        if name_speakers is not None:
            found = await asyncio.to_thread(name_speakers, timeline, whole)
            names = {**found, **names}
        diarizer = KnownTimelineStage(timeline)
    kit = RoomKit()
    room = await kit.create_room(room_id="transcribe")
    channel = VoiceChannel("voice", stt=stt, pipeline_speakers=pipeline_speakers, diarizer=diarizer,
                           policy=policy, kept_turns=None, second_pass=second_pass)
    kit.register_channel(channel)
    await kit.attach_channel(room.id, channel.channel_id)
    if names or name_turn is not None:
        @kit.hook(HookTrigger.ON_TRANSCRIPTION)
        async def rename(
            event: TranscriptionEvent, ctx: HookContext
        ) -> HookResult[TranscriptionEvent]:
            label = event.speaker
            target = names.get(label) if label is not None else None
            if label is not None and name_turn is not None and label not in explicit:
                target = await asyncio.to_thread(name_turn, label, event.start, event.end)
            if target is not None and event.sender_name != target:
                return HookResult.modify(dataclasses.replace(event, sender_name=target))
            return HookResult.allow()

    first_pass: list[TranscriptionEvent] = []
    if second_pass is not None:
        @kit.hook(HookTrigger.ON_TRANSCRIPTION, priority=10_000)
        def heard(event: TranscriptionEvent, ctx: HookContext) -> HookResult[TranscriptionEvent]:
            first_pass.append(event)  # the last hook: the turn as committed
            return HookResult.allow()

    session = await channel.start_session(room.id, "recording", sample_rate=sample_rate)
    pcm = float_to_pcm16(audio)
    step = max(2, int(frame_seconds * sample_rate) * 2)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    wall0 = time.perf_counter()
    for i in range(0, len(pcm), step):
        session.push(pcm[i : i + step])
        if speed:
            target = t0 + (i + step) / 2 / sample_rate / speed
            await asyncio.sleep(max(0.0, target - loop.time()))
        else:
            await asyncio.sleep(0)
        if progress is not None:
            progress(session.stt.final_until)
    finishing = asyncio.create_task(session.finish())
    while not finishing.done():
        if progress is not None:
            progress(session.stt.final_until)
        await asyncio.wait([finishing], timeout=0.2)
    committed: list[CommittedTurn] = finishing.result()
    elapsed = time.perf_counter() - wall0
    if progress is not None:
        progress(len(audio) / sample_rate)
    turns = [
        Turn(
            speaker=c.sender_name,
            text=c.text,
            start=c.start,
            end=c.end,
            label=c.transcription.speaker,
            latency=(c.committed_at - (t0 + c.end / speed)) if speed else None,
            words=c.transcription.words,
        )
        for c in committed
    ]
    errors = [session.error] if session.error else []
    result = Transcription(turns, len(audio) / sample_rate, elapsed, stt.describe(),
                           session.stt.reconnects, errors, session.corrections)
    if second_pass is not None:
        result.first_pass = [Turn(speaker=e.sender_name, text=e.text, start=e.start, end=e.end,
                                  label=e.speaker, words=e.words) for e in first_pass]
        result.second_pass = second_pass.stats.as_dict()
    await channel.close()
    await kit.close()
    return result


# ------------------------------------------------------------------ output formats

FORMATS = ("text", "markdown", "json", "srt", "vtt", "rttm")


def clock(seconds: float, *, sep: str = ".", hours: bool = False, digits: int = 2) -> str:
    """`83.2` → `01:23.20` (or `00:01:23,200` with hours=True, sep=",", digits=3)."""
    scale = 10**digits
    total = round(max(0.0, seconds) * scale)
    whole, frac = divmod(total, scale)
    h, rem = divmod(whole, 3600)
    m, s = divmod(rem, 60)
    if hours or h:
        return f"{h:02d}:{m:02d}:{s:02d}{sep}{frac:0{digits}d}"
    return f"{m:02d}:{s:02d}{sep}{frac:0{digits}d}"


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]<>|~])")


def markdown_escaped(text: str) -> str:
    """`text` as literal inline Markdown: the characters of inline markup (emphasis, code, links,
    HTML, tables, strike-through) are escaped, line breaks become spaces (a turn is one list item,
    so nothing can start a block)."""
    return _MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def format_turns(turns: Sequence[Turn], fmt: str, *, file_id: str = "audio") -> str:
    if fmt == "markdown":
        items = [f"# Transcript: {markdown_escaped(file_id)}", ""]
        for t in turns:
            span = clock(t.start) if t.typed else f"{clock(t.start)}–{clock(t.end)}"
            who = t.shown_speaker
            head = f"**{markdown_escaped(who)}** " if who else ""
            items.append(f"- {head}({span}): {markdown_escaped(t.text)}")
        return "\n".join(items) + "\n"
    if fmt == "text":
        lines = []
        for t in turns:
            span = f"[{clock(t.start)}]" if t.typed else f"[{clock(t.start)}–{clock(t.end)}]"
            quoted = json.dumps(t.text, ensure_ascii=False)
            who = t.shown_speaker
            lines.append(f"{span} {who}: {quoted}" if who else f"{span} {quoted}")
        return "\n".join(lines) + ("\n" if lines else "")
    if fmt == "json":
        return json.dumps([t.as_json() for t in turns], ensure_ascii=False, indent=2) + "\n"
    if fmt == "srt":
        blocks = []
        for n, t in enumerate(turns, 1):
            span = (f"{clock(t.start, sep=',', hours=True, digits=3)} --> "
                    f"{clock(t.end, sep=',', hours=True, digits=3)}")
            who = t.shown_speaker
            blocks.append(f"{n}\n{span}\n{who + ': ' if who else ''}{t.text}\n")
        return "\n".join(blocks)
    if fmt == "vtt":
        blocks = ["WEBVTT\n"]
        for t in turns:
            span = f"{clock(t.start, hours=True, digits=3)} --> {clock(t.end, hours=True, digits=3)}"
            voice = f"<v {t.shown_speaker}>" if t.shown_speaker else ""
            blocks.append(f"{span}\n{voice}{t.text}\n")
        return "\n".join(blocks)
    if fmt == "rttm":
        return "".join(
            f"SPEAKER {file_id} 1 {t.start:.3f} {max(0.0, t.end - t.start):.3f} <NA> <NA> "
            f"{(t.speaker or 'unknown').replace(' ', '_')} <NA> <NA>\n"
            for t in turns
            if not t.typed  # speech only: a typed line has no speaking time
        )
    raise ValueError(f"unknown format {fmt!r} (choose from {', '.join(FORMATS)})")
