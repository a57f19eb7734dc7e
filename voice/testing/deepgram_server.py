"""A local server that speaks Deepgram's streaming protocol (`/v1/listen`) on 127.0.0.1.

Why: the Deepgram provider is tested with the real `deepgram-sdk` client, pointed at this server
through the SDK environment (`DEEPGRAM_URL` / `voice.stt.deepgram.environment_for`). It speaks the
real wire format with the typed messages the client validates (`voice.stt.deepgram_wire`), so it
cannot drift from what the client reads. It behaves like the service where tests need it to:

- binary frames are audio (linear16 at the `sample_rate` the client asked for); `KeepAlive`,
  `Finalize` and `CloseStream` are JSON text frames;
- interim `Results` while words are in progress, a final `Results` (`speech_final: true`) once the
  audio after a group of words holds `endpointing` ms of silence, `from_finalize: true` answers a
  `Finalize`, `UtteranceEnd` after `utterance_end_ms` without words, `Metadata` before a clean close;
- a connection that sends nothing (no audio, no KeepAlive) for `idle_timeout` (10 s) is closed
  with code 1011, as Deepgram does (NET-0001);
- `drop_after(seconds)` aborts the next connection once it has received that much audio (a forced
  disconnect mid-stream);
- `outage(seconds)` aborts every open connection and refuses new ones (HTTP 503 at the
  handshake, as a load balancer in front of an unavailable service answers) for that many
  seconds of wall time; `outage_after(audio_seconds, seconds)` starts one when a connection has
  received that much audio;
- as Deepgram does, audio without words is answered too: an empty final `Results` once
  `silence_every` (2 s) of audio went by with nothing sent and no words in progress;
- `go_silent()` makes every connection accept audio and never answer again (no result, no
  close, not even after `CloseStream`), until `go_silent(False)`;
- `hold_handshakes()` accepts TCP and never completes the websocket handshake of later
  connections, until `hold_handshakes(False)`;
- `refuse_handshakes(status)` answers every later handshake with that HTTP status (401: the key
  was revoked, 403: no permission) until `refuse_handshakes(None)`;
- speaker ids restart at 0 on every connection, in order of first appearance, as Deepgram's do;
  a connection that asked for `diarize=false` gets words without `speaker`, as from Deepgram.

Where words come from (a `WordSource`):
- `ScriptedWords`: a test gives the finals to send, each a list of words in connection time;
- `MeetingWords`: real words from the audio received. The server finds where the received audio
  sits in a reference recording (exact PCM16 match, cross-correlation as a fallback) and emits the
  scripted words whose middle falls in audio it has actually received, with the speaker the script
  says. This is how load tests and the reconnect test stream the demo meeting.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np
import numpy.typing as npt
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from voice.stt.deepgram_wire import (
    CLIENT_MESSAGE,
    CloseStream,
    DeepgramAlternative,
    DeepgramChannel,
    DeepgramMetadata,
    DeepgramModelInfo,
    DeepgramResults,
    DeepgramResultsMetadata,
    DeepgramUtteranceEnd,
    DeepgramWord,
    Finalize,
    KeepAlive,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SpokenWord:
    """A word the server will report: times in seconds, `speaker` a voice key (int or name)."""

    word: str
    start: float
    end: float
    speaker: object = 0
    punctuated_word: str | None = None
    confidence: float = 0.99


# ------------------------------------------------------------------ word sources


class WordSource(abc.ABC):
    """Decides, per connection, which words its audio holds (grouped into finals)."""

    @abc.abstractmethod
    def finals_for(self, conn: ConnectionState) -> list[list[SpokenWord]] | None:
        """Groups of words in connection time, or None while it cannot tell yet."""


@dataclass
class ScriptedWords(WordSource):
    """The finals to send, as given by a test (the same on every connection)."""

    finals: list[list[SpokenWord]]

    def finals_for(self, conn: ConnectionState) -> list[list[SpokenWord]] | None:
        return self.finals


@dataclass
class MeetingWords(WordSource):
    """Words of a reference recording, located in the audio a connection really received."""

    reference: npt.NDArray[np.int16]
    words: list[SpokenWord]
    sample_rate: int = 16000
    endpointing: float = 0.3
    max_final: float = 6.0
    align_seconds: float = 0.25
    search_seconds: float = 0.25
    """How much of a connection's audio may be searched for the recording, one `align_seconds`
    probe after another, before it is taken for audio that is not from it. The default reads
    one probe; audio that went through a browser's capture (its start resampled room noise) may
    need a few seconds."""
    rotate_speakers: bool = False
    """Shift speaker ids by the connection number (mod the voices in the script), so a test can
    be sure a reconnect renumbers the voices (Deepgram guarantees no numbering across connections)."""
    _spectra: dict[int, tuple[int, npt.NDArray[np.complex128], npt.NDArray[np.float64]]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    """Per probe length: the FFT size, the reference's spectrum and its windowed energy, computed
    once (the reference does not change), so locating a resampled connection costs two FFTs."""

    @classmethod
    def from_meeting(cls, directory: str | Path) -> MeetingWords:
        """The demo meeting (`examples/meeting/`): `meeting.wav` and the words of `meeting.json`."""
        import soundfile as sf

        directory = Path(directory)
        audio, rate = sf.read(directory / "meeting.wav", dtype="int16")
        doc = json.loads((directory / "meeting.json").read_text())
        words = [
            SpokenWord(w["word"], float(w["start"]), float(w["end"]), t["speaker"], w["punctuated_word"])
            for t in doc["turns"]
            for w in t["words"]
        ]
        words.sort(key=lambda w: (w.start, w.end))
        return cls(np.asarray(audio, np.int16), words, int(rate))

    def locate(self, received: npt.NDArray[np.int16], first_probe: int = 0) -> int | None:
        """Sample offset of `received` in the reference, or None if it is not there: its first
        `align_seconds` probe, then the next ones, up to `search_seconds` of it (from probe
        `first_probe`: the ones before it were tried already)."""
        need = int(self.align_seconds * self.sample_rate)
        for k in range(first_probe, self.probes_in(len(received))):
            found = self._locate_probe(received[k * need : (k + 1) * need])
            if found is not None:
                return max(0, found - k * need)
        return None

    def probes_in(self, samples: int) -> int:
        """Whole probes `samples` of a connection's audio hold, within `search_seconds`."""
        need = int(self.align_seconds * self.sample_rate)
        searched = max(need, int(self.search_seconds * self.sample_rate))
        return min(samples, searched) // need

    def _locate_probe(self, probe: npt.NDArray[np.int16]) -> int | None:
        need = len(probe)
        ref = self.reference
        for cand in np.flatnonzero(ref[: len(ref) - need + 1] == probe[0]):
            if np.array_equal(ref[cand : cand + need], probe):
                return int(cand)
        # Not bit-exact (gain or resampling on the way): normalised cross-correlation.
        a = probe.astype(np.float64)
        a -= a.mean()
        n, spectrum, energy = self._spectrum(need)
        corr = np.fft.irfft(spectrum * np.conj(np.fft.rfft(a, n)), n)[: len(ref) - need + 1]
        score = corr / (energy[: len(corr)] * (np.linalg.norm(a) + 1e-9))
        best = int(np.argmax(score))
        return best if score[best] > 0.8 else None

    def _spectrum(
        self, need: int
    ) -> tuple[int, npt.NDArray[np.complex128], npt.NDArray[np.float64]]:
        cached = self._spectra.get(need)
        if cached is None:
            from scipy.fft import next_fast_len

            r = self.reference.astype(np.float64)
            n = next_fast_len(len(r) + need, real=True)  # an awkward size is 5x slower
            power = np.concatenate([[0.0], np.cumsum(r**2)])
            energy = np.sqrt(np.maximum(power[need:] - power[:-need], 0.0)) + 1e-9
            cached = self._spectra[need] = (n, np.fft.rfft(r, n), energy)
        return cached

    def finals_for(self, conn: ConnectionState) -> list[list[SpokenWord]] | None:
        if conn.offset is None:
            received = conn.audio_int16()
            probes = self.probes_in(len(received))
            if probes > conn.probes_tried:
                conn.offset = self.locate(received, conn.probes_tried)
                conn.probes_tried = probes
            if conn.offset is None:
                if conn.audio_seconds >= max(self.align_seconds, self.search_seconds):
                    conn.offset = -1  # audio that is not from the meeting: no words
                return None
        if conn.offset < 0:
            return []
        t0 = conn.offset / self.sample_rate
        mine = [w for w in self.words if (w.start + w.end) / 2 >= t0]
        keys: dict[object, int] = {}
        shifted = []
        for w in mine:
            speaker = keys.setdefault(w.speaker, len(keys))  # per connection, first appearance
            if self.rotate_speakers:
                voices = len({x.speaker for x in self.words})
                speaker = (speaker + conn.index) % voices
            shifted.append(SpokenWord(w.word, max(0.0, w.start - t0), w.end - t0, speaker,
                                      w.punctuated_word, w.confidence))
        groups: list[list[SpokenWord]] = []
        for w in shifted:
            if groups and (w.start - max(x.end for x in groups[-1]) < self.endpointing
                           and w.end - groups[-1][0].start <= self.max_final):
                groups[-1].append(w)
            else:
                groups.append([w])
        return groups


# ------------------------------------------------------------------ per-connection state


@dataclass
class ConnectionState:
    """What one client connection sent and was sent (tests read these)."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]
    sample_rate: int = 16000
    index: int = 0
    """0 for the first connection the server accepted, 1 for the next …"""
    audio: bytearray = field(default_factory=bytearray)
    keepalives: int = 0
    finalizes: int = 0
    close_streams: int = 0
    malformed: int = 0
    sent: list[dict[str, Any]] = field(default_factory=list)
    offset: int | None = None
    probes_tried: int = 0
    """`MeetingWords`: the probes of this connection's audio already searched for."""
    groups: list[list[SpokenWord]] | None = None
    next_final: int = 0
    last_interim_at: float = 0.0
    last_word_end: float | None = None
    utterance_end_sent: bool = True
    closed_reason: str | None = None
    answered_at: float = 0.0
    """Seconds of audio received when the server last sent this connection anything."""

    @property
    def diarize(self) -> bool:
        """The client asked for speaker ids (`diarize=true` or a `diarize_model`)."""
        return self.query.get("diarize") == "true" or "diarize_model" in self.query

    @property
    def audio_seconds(self) -> float:
        return len(self.audio) // 2 / self.sample_rate

    def audio_int16(self) -> npt.NDArray[np.int16]:
        return np.frombuffer(bytes(self.audio[: len(self.audio) // 2 * 2]), dtype="<i2")

    @property
    def finals_sent(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m.get("type") == "Results" and m.get("is_final")]


class DeepgramTestServer:
    """`async with DeepgramTestServer(source) as server:` → `server.url` (`ws://127.0.0.1:PORT`)."""

    def __init__(
        self,
        source: WordSource | None = None,
        *,
        idle_timeout: float = 10.0,
        endpointing: float = 0.3,
        interim_every: float = 0.5,
        api_key: str | None = None,
        silence_every: float = 2.0,
    ) -> None:
        self.source = source or ScriptedWords([])
        self.idle_timeout = idle_timeout
        self.endpointing = endpointing
        self.interim_every = interim_every
        self.silence_every = silence_every
        self.silent = False
        """Accept audio and never answer (`go_silent`)."""
        self._held = asyncio.Event()
        self._held.set()
        """Cleared while handshakes are held (`hold_handshakes`)."""
        self.held = 0
        """Handshakes held (never completed)."""
        self.api_key = api_key
        self.connections: list[ConnectionState] = []
        self._open: dict[int, ServerConnection] = {}
        self._server: Server | None = None
        self._drop_after: float | None = None
        self._outage_after: tuple[float, float] | None = None
        self._refuse_until = 0.0
        self.refused = 0
        """Handshakes refused (during outages, or by `refuse_handshakes`)."""
        self._handshake_status: HTTPStatus | None = None
        self.outage_ended = asyncio.Event()
        """Set when the last outage's refusal window has passed."""
        self.port = 0

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def drop_now(self) -> None:
        """Abort every open connection at once (no close frame, as a network failure would)."""
        for index, ws in list(self._open.items()):
            self.connections[index].closed_reason = "dropped"
            ws.transport.abort()

    def outage(self, seconds: float) -> None:
        """Drop every open connection now and refuse handshakes for `seconds` (wall time)."""
        loop = asyncio.get_running_loop()
        self._refuse_until = max(self._refuse_until, loop.time() + seconds)
        self.outage_ended.clear()
        loop.call_at(self._refuse_until, self._outage_over)
        self.drop_now()

    def outage_after(self, audio_seconds: float, seconds: float) -> None:
        """Start an `outage(seconds)` once a connection has received `audio_seconds` of audio."""
        self._outage_after = (audio_seconds, seconds)

    def _outage_over(self) -> None:
        if asyncio.get_running_loop().time() >= self._refuse_until:
            self.outage_ended.set()

    def go_silent(self, silent: bool = True) -> None:
        """Every connection (open or later) takes audio and never answers, or answers again."""
        self.silent = silent

    def hold_handshakes(self, hold: bool = True) -> None:
        """Accept TCP and never complete the websocket handshake of later connections."""
        if hold:
            self._held.clear()
        else:
            self._held.set()

    def refuse_handshakes(self, status: HTTPStatus | int | None) -> None:
        """Answer every later handshake with HTTP `status` (None: accept again)."""
        self._handshake_status = None if status is None else HTTPStatus(status)

    async def _refuse_during_outage(self, connection: ServerConnection,
                                    request: Request) -> Response | None:
        if not self._held.is_set():
            self.held += 1
            await self._held.wait()
        if self._handshake_status is not None:
            self.refused += 1
            return connection.respond(self._handshake_status, f"{self._handshake_status.phrase}\n")
        if asyncio.get_running_loop().time() < self._refuse_until:
            self.refused += 1
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "service unavailable\n")
        return None

    async def send_raw(self, text: str) -> None:
        """Send a raw text frame to every open connection (malformed-message tests)."""
        for ws in list(self._open.values()):
            await ws.send(text)

    def drop_after(self, seconds: float) -> None:
        """Abort the next connection (or the current one) once it has received `seconds` of audio."""
        self._drop_after = seconds

    async def start(self) -> DeepgramTestServer:
        self._server = await serve(self._handle, "127.0.0.1", 0, max_size=2**24,
                                   process_request=self._refuse_during_outage)
        sock = next(iter(self._server.sockets))
        self.port = int(sock.getsockname()[1])
        return self

    async def stop(self) -> None:
        self._held.set()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)
            self._server = None

    async def __aenter__(self) -> DeepgramTestServer:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- protocol ----------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        request = ws.request
        assert request is not None
        parts = urlsplit(request.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        headers = {k.lower(): v for k, v in request.headers.raw_items()}
        state = ConnectionState(parts.path, query, headers, int(query.get("sample_rate", "16000")),
                                index=len(self.connections))
        self.connections.append(state)
        self._open[state.index] = ws
        try:
            await self._serve(ws, state, parts.path, headers)
        finally:
            self._open.pop(state.index, None)

    async def _serve(self, ws: ServerConnection, state: ConnectionState, path: str,
                     headers: dict[str, str]) -> None:
        if path != "/v1/listen":
            await ws.close(code=1008, reason=f"unknown path {path}")
            return
        if self.api_key is not None and headers.get("authorization") != f"Token {self.api_key}":
            await ws.close(code=1008, reason="invalid credentials")
            return
        request_id = str(uuid.uuid4())
        try:
            while True:
                try:
                    message = await asyncio.wait_for(
                        ws.recv(), None if self.silent else self.idle_timeout)
                except TimeoutError:
                    state.closed_reason = "idle"
                    await ws.close(code=1011, reason="Deepgram did not receive audio data or a text "
                                   "message within the timeout window (NET-0001)")
                    return
                if self.silent:  # takes everything, says nothing, never closes
                    if isinstance(message, bytes):
                        state.audio.extend(message)
                    continue
                if isinstance(message, bytes):
                    state.audio.extend(message)
                    if self._drop_after is not None and state.audio_seconds >= self._drop_after:
                        self._drop_after = None
                        state.closed_reason = "dropped"
                        ws.transport.abort()
                        return
                    if self._outage_after is not None and state.audio_seconds >= self._outage_after[0]:
                        _, seconds = self._outage_after
                        self._outage_after = None
                        self.outage(seconds)
                        return
                    await self._progress(ws, state, request_id, finalize=False)
                    continue
                try:
                    control = CLIENT_MESSAGE.validate_json(message)
                except Exception:
                    state.malformed += 1
                    continue
                if isinstance(control, KeepAlive):
                    state.keepalives += 1
                elif isinstance(control, Finalize):
                    state.finalizes += 1
                    await self._progress(ws, state, request_id, finalize=True)
                elif isinstance(control, CloseStream):
                    state.close_streams += 1
                    await self._progress(ws, state, request_id, finalize=True, answer=False)
                    meta = DeepgramMetadata(
                        transaction_key="deprecated", request_id=request_id, sha256="0" * 64,
                        created=datetime.now(UTC).isoformat(), duration=state.audio_seconds,
                        channels=1,
                    )
                    await self._send(ws, state, meta)
                    state.closed_reason = "close_stream"
                    await ws.close()
                    return
        except ConnectionClosed:
            state.closed_reason = state.closed_reason or "client"

    async def _send(self, ws: ServerConnection, state: ConnectionState, msg: Any) -> None:
        data = msg.model_dump(mode="json", exclude_none=True)
        state.sent.append(data)
        state.answered_at = state.audio_seconds
        await ws.send(json.dumps(data))

    def _results(self, request_id: str, words: Sequence[SpokenWord], *, is_final: bool,
                 speech_final: bool, from_finalize: bool, start: float, duration: float,
                 diarize: bool = True) -> DeepgramResults:
        wire = [
            DeepgramWord(word=w.word, start=round(w.start, 3), end=round(w.end, 3),
                         confidence=w.confidence,
                         speaker=int(w.speaker) if diarize else None,  # type: ignore[call-overload]
                         punctuated_word=w.punctuated_word or w.word)
            for w in words
        ]
        transcript = " ".join(w.punctuated_word or w.word for w in words)
        return DeepgramResults(
            channel_index=[0, 1], duration=round(duration, 3), start=round(start, 3),
            is_final=is_final, speech_final=speech_final, from_finalize=from_finalize or None,
            channel=DeepgramChannel(alternatives=[DeepgramAlternative(
                transcript=transcript, confidence=0.99 if words else 0.0, words=wire)]),
            metadata=DeepgramResultsMetadata(
                request_id=request_id, model_uuid="00000000-0000-0000-0000-000000000000",
                model_info=DeepgramModelInfo(name="chorus-local", version="test", arch="local")),
        )

    async def _progress(self, ws: ServerConnection, state: ConnectionState, request_id: str, *,
                        finalize: bool, answer: bool = True) -> None:
        if state.groups is None:
            found = self.source.finals_for(state)
            if found is not None:
                state.groups = [list(g) for g in found]
        groups = state.groups if state.groups is not None else []
        heard = state.audio_seconds
        answered = False
        while state.next_final < len(groups):
            group = groups[state.next_final]
            end = max(w.end for w in group)
            ready = heard >= end + self.endpointing
            if not ready and not finalize:
                break
            words = [w for w in group if w.end <= heard] if not ready else group
            if not words:
                break
            if len(words) < len(group):  # Finalize mid-group: the rest stays for later
                groups[state.next_final] = group[len(words):]
            else:
                state.next_final += 1
            start = min(w.start for w in words)
            from_finalize = finalize and not ready and answer
            answered = answered or from_finalize
            await self._send(ws, state, self._results(
                request_id, words, is_final=True, speech_final=ready,
                from_finalize=from_finalize, start=start,
                duration=max(w.end for w in words) - start, diarize=state.diarize))
            state.last_word_end = max(w.end for w in words)
            state.utterance_end_sent = False
            if len(words) < len(group):
                break
        if finalize and answer:
            # Deepgram always answers a Finalize with a from_finalize result, even an empty one.
            if not answered:
                await self._send(ws, state, self._results(
                    request_id, [], is_final=True, speech_final=False, from_finalize=True,
                    start=heard, duration=0.0))
            return
        # Interim results for the group in progress.
        if state.next_final < len(groups) and heard - state.last_interim_at >= self.interim_every:
            partial = [w for w in groups[state.next_final] if w.end <= heard]
            if partial:
                state.last_interim_at = heard
                start = partial[0].start
                await self._send(ws, state, self._results(
                    request_id, partial, is_final=False, speech_final=False, from_finalize=False,
                    start=start, duration=heard - start, diarize=state.diarize))
        in_progress = state.next_final < len(groups) and groups[state.next_final][0].start <= heard
        if not in_progress and heard - state.answered_at >= self.silence_every:
            # Deepgram answers audio without words too: an empty final over what it heard
            start = state.answered_at
            await self._send(ws, state, self._results(
                request_id, [], is_final=True, speech_final=False, from_finalize=False,
                start=start, duration=heard - start))
        utterance_end = float(state.query.get("utterance_end_ms", "0") or 0) / 1000
        if (utterance_end and not state.utterance_end_sent and state.last_word_end is not None
                and heard >= state.last_word_end + utterance_end):
            nxt = groups[state.next_final][0].start if state.next_final < len(groups) else None
            if nxt is None or nxt > heard:
                state.utterance_end_sent = True
                await self._send(ws, state, DeepgramUtteranceEnd(channel=[0, 1],
                                                                  last_word_end=state.last_word_end))


class ThreadedServer:
    """A `DeepgramTestServer` on its own event loop in a daemon thread, for callers that run
    their own loop (the CLI, the benchmark) and must not share it with the server."""

    def __init__(self, server: DeepgramTestServer, *, timeout: float = 10.0) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve_forever() -> None:
            asyncio.set_event_loop(self._loop)
            self._loop.run_until_complete(server.start())
            ready.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve_forever, name="local-deepgram", daemon=True)
        self._thread.start()
        if not ready.wait(timeout):
            raise RuntimeError("the local Deepgram-protocol server did not start")

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self, timeout: float = 10.0) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)
