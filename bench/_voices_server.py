"""`chorus bench voices --path server`: the voiceprint pair through a real `chorus serve`.

Issue 27's measurement as the issue words it: remember the speakers of meeting A, then run
meeting B live at real-time pace, and score what reached the device. Starts `chorus serve` of this
checkout in its own process (`bench.load`'s `_process`) on loopback, in a temporary folder: the
embedded default STT (local Whisper tiny.en), the embedded diarization stage, the recorder
realtime session, a SQLite store and `[voices] enabled = true` at the `[voices]` defaults.

1. Meeting A is streamed at real-time pace by a shared-mic device in room `meeting-a`
   (`bench.load._one_device`, 100 ms frames). While its stream is still open (a voice is
   remembered from an open stream's stage), each reference speaker of A is remembered under
   their reference id through `POST /v1/rooms/meeting-a/speakers/remember`, from the stage label
   whose turns overlap most of their reference speech; a refusal (`422 not_enough_speech` below
   `min_speech_s`, a voice that already took another speaker's name) is reported, not retried.
   With `--directory close-clips|far-clips` A is not streamed: A's speakers are enrolled from
   their enrollment clips through `POST /v1/voices` (base64 audio, a server-wide admin token).
2. Meeting B is streamed the same way in room `meeting-b`, with a reader on the room's feed
   (`/events`: the `speaker_suggestion` messages reach only the feed). Every turn is kept as it
   reached the device (its arrival, seconds after the stream's first frame), a turn re-sent
   corrected counting from its settled version (`bench.load.settled_versions`). A turn is named
   when its `speaker` (the name shown) is not its raw `label`, and suggested when the feed had
   suggested a name for its label before it (the suggestion is published on the turn path just
   before the turn it was made for).
3. The turns are scored by `bench.voices.score_shown`, the scoring of the replay and batch paths:
   per remembered speaker of B, the share of their speech time inside turns named for them, and
   named or suggested; the share of all speech inside turns with a wrong name; the new speaker's
   time under any remembered name and whether their own voice took one; the time from each
   remembered speaker's first speech to the arrival of the first turn named (or suggested) for
   them that holds their speech. The server's turn latency (`bench.load.turn_latencies`) is
   given for context.

Everything stays on 127.0.0.1; every wait is bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.load import (
    REPO,
    SECRET,
    StreamResult,
    TokenMinter,
    _commit_of,
    _free_port,
    _one_device,
    _process,
    _wait_port,
    serve_module,
    settled_versions,
)
from bench.voices import (
    GRID_S,
    Shown,
    _pct,
    _reference,
    label_grids,
    one_label_each,
    pair_row,
    score_shown,
)
from server.client import EventFeed
from server.config import VoicesConfig
from server.metrics import percentile
from server.protocol import FeedMessage, SpeakerSuggestionMessage, TurnMessage
from voice.identify import TURN_MIN_S

SETTLE_S = 3.0
"""Meeting A's turns are taken as settled once none arrived for this long (after its audio)..."""
SETTLE_MAX_S = 20.0
"""...or this long after its last frame, whichever comes first."""
FEED_WAIT_S = 10.0
"""How long the feed may lag behind the device once the stream has closed."""


def voices_settings(pairs: list[str]) -> dict[str, float]:
    """`--voices-set KEY=NUMBER` items as `[voices]` settings (checked by `VoicesConfig`)."""
    out: dict[str, float] = {}
    for item in pairs:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--voices-set wants KEY=NUMBER, got {item!r}")
        out[key.strip()] = float(value)
    VoicesConfig(enabled=True, **out)
    return out


def _config(
    workdir: Path, voices: dict[str, float] | None = None, stt_model: str | None = None
) -> str:
    return (
        '[stt]\nprovider = "whisper"\n'
        + (f"model = {json.dumps(stt_model)}\n" if stt_model else "")
        + '[diarizer]\nkind = "embedded"\n'
        '[realtime]\nprovider = "recorder"\n'
        "[voices]\nenabled = true\n"
        + "".join(f"{k} = {v}\n" for k, v in (voices or {}).items())
        + f'[store]\nurl = "sqlite:///{workdir}/chorus.db"\n'
    )


def _shown_turns(
    result: StreamResult, suggestions: dict[str, str]
) -> tuple[list[Shown], dict[str, str | None], list[dict[str, Any]]]:
    """The settled turns of a stream as `Shown` stretches (arrival from the stream's first frame),
    the name each label ended with (its last turn long enough to be checked: a shorter one reads
    its letter whatever the voice is named, `voice.identify.TURN_MIN_S`), and the turns for the
    JSON."""
    began = result.sent_wall[0] if result.sent_wall else 0.0
    shown: list[Shown] = []
    final: dict[str, tuple[float, str | None]] = {}
    rows: list[dict[str, Any]] = []
    for now, m in settled_versions(result.versions):
        label = m.label or m.speaker
        name = m.speaker if m.speaker != label else None
        suggested = None if name is not None else suggestions.get(m.event_id or "")
        at = round(now - began, 3)
        shown.append(Shown(label, m.start, m.end, at, name, suggested))
        if m.end - m.start >= TURN_MIN_S and (label not in final or m.end >= final[label][0]):
            final[label] = (m.end, name)
        rows.append({"at": at, "start": m.start, "end": m.end, "label": label, "speaker": m.speaker,
                     "suggested": suggested, "corrected": m.corrected, "text": m.text[:80]})
    return shown, {label: name for label, (_, name) in final.items()}, rows


def suggestions_by_turn(messages: list[FeedMessage]) -> dict[str, str]:
    """Each turn's event id → the name the feed had suggested for its label when the turn (its
    latest version) went out on the feed."""
    current: dict[str, str] = {}
    out: dict[str, str] = {}
    for m in messages:
        if isinstance(m, SpeakerSuggestionMessage):
            current[m.label] = m.name
        elif isinstance(m, TurnMessage) and m.event_id is not None and not m.second_pass:
            label = m.label or m.speaker
            if label in current:
                out[m.event_id] = current[label]
            else:
                out.pop(m.event_id, None)
    return out


def label_of(result: StreamResult, reference: dict[str, Any]) -> dict[str, str]:
    """Each reference speaker → the stage label whose turns (settled so far) overlap most of
    their speech, one label per speaker (`bench.voices.one_label_each`; none when no turn left
    to take overlaps it)."""
    n = len(next(iter(reference.values())))
    turns = settled_versions(result.versions)
    grids = label_grids(((m.label or m.speaker, m.start, m.end) for _, m in turns), n)
    return one_label_each(reference, grids)


def voices_of(
    reference: dict[str, Any], shown: list[Shown], final: dict[str, str | None]
) -> dict[str, dict[str, Any]]:
    """Each stage label of the meeting → the name it ended with and the seconds of each reference
    speaker's speech inside its turns (where a voice was split, or two were mixed)."""
    n = len(next(iter(reference.values())))
    grids = label_grids(((s.label, s.start, s.end) for s in shown), n)
    return {
        label: {
            "name": final.get(label),
            "speech_s": {
                speaker: round(float((g & ref).sum()) * GRID_S, 1)
                for speaker, ref in sorted(reference.items())
                if (g & ref).any()
            },
        }
        for label, g in sorted(grids.items())
    }


def in_turns(reference: dict[str, Any], shown: list[Shown]) -> dict[str, float]:
    """Each reference speaker → the share of their speech inside any turn (what could be named at
    all: speech the STT made no turn of is counted as not named)."""
    n = len(next(iter(reference.values())))
    heard = np.zeros(n, dtype=bool)
    for grid in label_grids(((s.label, s.start, s.end) for s in shown), n).values():
        heard |= grid
    return {
        speaker: float((heard & ref).sum()) / max(int(ref.sum()), 1)
        for speaker, ref in sorted(reference.items())
    }


async def _settle(result: StreamResult) -> None:
    """Until no turn arrived for `SETTLE_S` (bounded by `SETTLE_MAX_S`)."""
    deadline = time.monotonic() + SETTLE_MAX_S
    while time.monotonic() < deadline:
        last = result.versions[-1][0] if result.versions else (result.sent_wall or [0.0])[-1]
        if time.monotonic() - last >= SETTLE_S:
            return
        await asyncio.sleep(0.2)


async def _remember_from_a(
    http: Any, base: str, audio: bytes, reference: dict[str, Any], tokens: TokenMinter,
    admin: str,
) -> tuple[StreamResult, list[dict[str, Any]]]:
    """Meeting A streamed in `meeting-a`; before its stream stops, each reference speaker
    remembered from the label that holds most of their speech."""
    attempts: list[dict[str, Any]] = []

    async def remember(result: StreamResult) -> None:
        await _settle(result)
        taken: dict[str, str] = {}
        for speaker, label in sorted(label_of(result, reference).items()):
            row: dict[str, Any] = {"speaker": speaker, "label": label}
            if label in taken:
                row.update(status=None, problem="same_voice",
                           detail=f"{label} was remembered as {taken[label]} already")
            else:
                r = await http.post(
                    "/v1/rooms/meeting-a/speakers/remember",
                    json={"label": label, "name": speaker},
                    headers={"Authorization": f"Bearer {admin}"},
                )
                row["status"] = r.status_code
                if r.status_code == 201:
                    taken[label] = speaker
                else:
                    body = r.json()
                    row.update(problem=body.get("problem"), detail=body.get("detail"))
            attempts.append(row)
        for speaker in sorted(set(reference) - set(label_of(result, reference))):
            attempts.append({"speaker": speaker, "label": None, "status": None,
                             "problem": "no_turn", "detail": "no turn overlaps their speech"})

    result = await _one_device(base, "meeting-a", audio, len(audio) / 32000, tokens,
                               before_stop=remember)
    return result, attempts


async def _enroll(
    http: Any, folder: Path, enrollment: list[dict[str, Any]], speakers: list[str], kind: str,
    admin: str,
) -> list[dict[str, Any]]:
    """A's speakers enrolled from their `kind` clips (`POST /v1/voices`)."""
    attempts: list[dict[str, Any]] = []
    for entry in enrollment:
        if entry["speaker"] not in speakers:
            continue
        clip = await asyncio.to_thread((folder / entry[kind]["file"]).read_bytes)
        r = await http.post(
            "/v1/voices",
            json={"name": entry["speaker"], "audio": base64.b64encode(clip).decode()},
            headers={"Authorization": f"Bearer {admin}"},
        )
        row: dict[str, Any] = {"speaker": entry["speaker"], "clip": entry[kind]["file"],
                               "status": r.status_code}
        if r.status_code != 201:
            row.update(problem=r.json().get("problem"), detail=r.json().get("detail"))
        attempts.append(row)
    return attempts


async def _meeting_b(
    base: str, audio: bytes, tokens: TokenMinter
) -> tuple[StreamResult, list[FeedMessage]]:
    """Meeting B streamed in `meeting-b`, with a reader on the room's feed."""
    feed = await EventFeed.open(base, "meeting-b", await tokens.mint("meeting-b"))
    try:
        result = await _one_device(base, "meeting-b", audio, len(audio) / 32000, tokens)
        wanted = {m.event_id for _, m in result.versions if m.event_id is not None}
        deadline = time.monotonic() + FEED_WAIT_S
        while time.monotonic() < deadline:  # the feed's copies of the turns, bounded
            seen = {m.event_id for m in feed.received if isinstance(m, TurnMessage)}
            if wanted <= seen:
                break
            await asyncio.sleep(0.1)
    finally:
        await feed.close()
    return result, list(feed.received)


def _latency(result: StreamResult) -> dict[str, Any]:
    return {
        "turns": len(settled_versions(result.versions)),
        "corrected": sum(1 for _, m in result.versions if m.corrected),
        "p50_latency_s": round(percentile(result.latencies, 50), 3),
        "p95_latency_s": round(percentile(result.latencies, 95), 3),
        "p95_strict_latency_s": round(percentile(result.strict_latencies, 95), 3),
        "degraded": result.degraded,
        "error": result.error,
    }


async def _measure(args: argparse.Namespace) -> dict[str, Any]:
    import httpx

    from voice.audio import float_to_pcm16, read_audio_16k

    folder: Path = args.dir
    manifest = json.loads(await asyncio.to_thread((folder / "manifest.json").read_text))
    pair = manifest["voiceprint_pair"]
    render: str = args.render
    names = pair["files"][render]
    limit = args.seconds

    def load(name: str) -> tuple[bytes, dict[str, Any]]:
        audio = read_audio_16k(folder / f"{name}.flac")
        if limit is not None:
            audio = audio[: int(limit * 16000)]
        reference = _reference(folder / f"{name}.rttm", len(audio) / 16000)
        # a cut (`--seconds`) keeps the speakers who speak in it
        return float_to_pcm16(audio), {s: g for s, g in reference.items() if g.any()}

    a_audio, a_ref = await asyncio.to_thread(load, names["A"])
    b_audio, b_ref = await asyncio.to_thread(load, names["B"])
    workdir = Path(tempfile.mkdtemp(prefix="chorus-bench-voices-"))
    port = _free_port()
    config = workdir / "chorus.toml"
    voices = voices_settings(getattr(args, "voices_set", []))
    stt_model = getattr(args, "stt_model", None)
    await asyncio.to_thread(config.write_text, _config(workdir, voices, stt_model))
    env = {**os.environ, "PYANNOTE_METRICS_ENABLED": "0", "CHORUS_SECRET": SECRET,
           "CHORUS_STORE_URL": f"sqlite:///{workdir}/chorus.db"}
    py = sys.executable
    serve = [py, "-m", serve_module(REPO), "serve", "--port", str(port), "--config", str(config),
             "--log-level", "WARNING"]  # fmt: skip
    from server.auth import issue_token

    admin = issue_token(SECRET, "*", 7200, grants=["admin"])
    tokens = TokenMinter(REPO, py, env)
    base = f"ws://127.0.0.1:{port}"
    settings = VoicesConfig(**voices).identify_settings()
    report: dict[str, Any] = {
        "path": "server", "render": render, "directory": args.directory,
        "commit": _commit_of(REPO), "seconds": limit, "meeting_a": names["A"],
        "meeting_b": names["B"], "auto": settings.auto, "suggest": settings.suggest,
        "verify": settings.verify, "claim": settings.claim, "claim_new": settings.claim_new,
        "stt_model": stt_model or "tiny.en",
        "load_average_before": os.getloadavg(),
    }
    began = time.monotonic()
    with _process(serve, env, workdir / "server.log", cwd=REPO) as srv:
        await _wait_port(port, srv, "chorus serve", within_s=300)
        print(f"chorus serve ({report['commit']}) pid {srv.pid}; logs in {workdir}",
              file=sys.stderr, flush=True)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            if args.directory == "remembered":
                print(f"meeting A ({names['A']}, {len(a_audio) / 32000:.0f} s) at real-time "
                      "pace in room meeting-a ...", file=sys.stderr, flush=True)
                a_result, attempts = await _remember_from_a(
                    http, base, a_audio, a_ref, tokens, admin
                )
                report["meeting_a_turns"] = _latency(a_result)
            else:
                kind = args.directory.removesuffix("-clips")
                attempts = await _enroll(http, folder, manifest["enrollment"], sorted(a_ref),
                                         kind, admin)
            report["directory_attempts"] = attempts
            r = await http.get("/v1/voices", headers={"Authorization": f"Bearer {admin}"})
            remembered = sorted(v["name"] for v in r.json()) if r.status_code == 200 else []
            report["remembered"] = remembered
            print(f"meeting B ({names['B']}, {len(b_audio) / 32000:.0f} s) at real-time pace in "
                  f"room meeting-b; directory: {', '.join(remembered) or 'nobody'} ...",
                  file=sys.stderr, flush=True)
            b_result, feed = await _meeting_b(base, b_audio, tokens)
    report["wall_s"] = round(time.monotonic() - began, 1)
    report["load_average_after"] = os.getloadavg()
    suggestions = suggestions_by_turn(feed)
    shown, final, rows = _shown_turns(b_result, suggestions)
    report["suggestions"] = [
        {"label": m.label, "name": m.name} for m in feed if isinstance(m, SpeakerSuggestionMessage)
    ]
    report["meeting_b_turns"] = _latency(b_result)
    report["turns"] = rows
    report["outcome"] = score_shown(b_ref, shown, remembered, final)
    report["voices"] = voices_of(b_ref, shown, final)
    report["in_turns"] = in_turns(b_ref, shown)
    return report


def _or_never(x: float | None) -> str:
    return "never" if x is None else f"{x:.1f}"


def run_server(args: argparse.Namespace) -> int:
    report = asyncio.run(_measure(args))
    outcome = report.pop("outcome")
    where = f"the first {report['seconds']:g} s of each meeting" if report["seconds"] else \
        "whole meetings"
    clips = report["directory"].replace("-", " ")
    print(f"\nthrough chorus serve ({report['commit']}), {report['render']} render, {where} at "
          f"real-time pace; auto {report['auto']:.2f}, suggest {report['suggest']:.2f}, "
          f"verify {report['verify']}, claim {report['claim']}, claim_new {report['claim_new']}; "
          f"Whisper {report.get('stt_model', 'tiny.en')}")
    if report["directory"] == "remembered":
        print(f"meeting A ({report['meeting_a']}): remembered from its room:")
    else:
        print(f"meeting A's speakers enrolled from their {clips}:")
    for a in report["directory_attempts"]:
        said = "ok" if a.get("status") == 201 else f"refused: {a.get('problem') or a.get('status')}"
        print(f"  {a['speaker']} ({a.get('label') or a.get('clip')}): {said}"
              + (f" ({a['detail']})" if a.get("detail") and a.get("status") != 201 else ""))
    print(f"\nmeeting B ({report['meeting_b']}); directory: {', '.join(report['remembered'])}")
    label = ("remembered from meeting A" if report["directory"] == "remembered"
             else f"enrolled from the {clips}")
    row = pair_row(label, report["remembered"], outcome, batch=False)
    report["pair"] = {label: row}
    lat = report["meeting_b_turns"]
    print(f"  meeting B's turns: {lat['turns']} ({lat['corrected']} corrections), latency p50 "
          f"{lat['p50_latency_s']:.2f} s, p95 {lat['p95_latency_s']:.2f} s (p95 from each turn's "
          f"own end {lat['p95_strict_latency_s']:.2f} s)"
          + (", the stage degraded" if lat["degraded"] else "")
          + (f", error {lat['error']}" if lat["error"] else ""))
    print("  suggestions on the feed: "
          + (", ".join(f"{s['label']} → {s['name']}" for s in report["suggestions"]) or "none"))
    print(f"  load average {', '.join(f'{x:.2f}' for x in report['load_average_before'])} before, "
          f"{', '.join(f'{x:.2f}' for x in report['load_average_after'])} after; "
          f"{report['wall_s']:.0f} s in all")
    print("\n| speaker | speech (s) | in a turn | named | named or suggested | first name after (s) "
          "| first suggestion after (s) | first turn (s): named |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    cover = report["in_turns"]
    for s, v in row["speakers"].items():
        print(f"| {s} | {v['speech_s']:.1f} | {_pct(cover[s])} | {_pct(v['named'])} | "
              f"{_pct(v['named_or_suggested'])}"
              f" | {_or_never(v['first_named_after_s'])} | "
              f"{_or_never(v['first_suggested_after_s'])} | "
              f"{v['first_turn_s']:.1f}: {_pct(v['first_turn_named'])} |")
    for s, v in row["strangers_named"].items():
        print(f"| {s} (not remembered) | {outcome.strangers[s] * GRID_S:.1f} | {_pct(cover[s])} | "
              f"under a name {_pct(v)} | own voice: {outcome.strangers_voice[s] or 'its letter'} "
              "| | | |")
    print(f"\nwrong names {_pct(row['wrong'])} of all speech, wrong suggestions "
          f"{_pct(row['wrong_suggested'])}")
    print("meeting B's stage voices (the name each ended with: whose speech its turns hold):")
    for label, v in report["voices"].items():
        held = ", ".join(f"{s} {t:.1f} s" for s, t in v["speech_s"].items()) or "no speech"
        print(f"  {label} ({v['name'] or 'its letter'}): {held}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0
