"""The `[livekit]` section of the Chorus config file, and loading it beside `chorus serve`'s.

`chorus agent` reads the same TOML file as `chorus serve` (STT, diarizer, realtime, policy) plus
one section of its own. `server.config.ServerConfig` forbids unknown sections (a typo must be an
error), so this module takes `[livekit]` out of the file before handing the rest to
`ServerConfig`, with the same precedence as `server.config.load_config`: defaults < file <
environment (`CHORUS_<SECTION>_<FIELD>`; here also `CHORUS_LIVEKIT_<FIELD>`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from server.config import ConfigError, ServerConfig, environment_overrides, read_config_file

SHARED_MIC_ATTRIBUTE = "chorus.shared_mic"
"""Participant attribute that marks a shared microphone (`"true"`)."""


class LiveKitConfig(BaseModel):
    """`[livekit]`: how the worker registers and whom it treats as a shared microphone."""

    model_config = ConfigDict(extra="forbid")

    agent_name: str = "chorus"
    """Explicit dispatch name (rooms get the worker through a dispatch naming it)."""
    shared_mic_names: list[str] = Field(default_factory=list)
    """Shell-style patterns (`fnmatch`, case-insensitive) matched against a participant's name
    and identity; a match is a shared microphone even without the attribute."""
    load_threshold: float = Field(default=0.7, gt=0, le=1)
    """Worker load (0–1) above which LiveKit stops sending it jobs (production mode). The load
    is `chorus serve`'s figure (`server.load.load_figure`, docs/livekit.md): the largest of the
    machine's CPU share and the running jobs over `max_jobs`."""
    max_jobs: int = Field(default=16, ge=1)
    """Rooms (jobs) one worker runs at most: at this many the load is 1."""
    reply_sample_rate: int = Field(default=24000, ge=8000, le=48000)
    """Sample rate of the agent's published reply track."""
    reply_track_name: str = "chorus-reply"
    transcription_attribute: str = "chorus.speaker"
    """Attribute of each published transcription that carries the speaker's attribution label."""


_LIST_FIELDS = {"shared_mic_names"}


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _problems(exc: ValidationError, prefix: str = "") -> str:
    return "; ".join(
        f"{prefix}{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in exc.errors()
    )


def livekit_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """`CHORUS_LIVEKIT_<FIELD>` variables (lists comma-separated)."""
    out: dict[str, Any] = {}
    for field in LiveKitConfig.model_fields:
        name = f"CHORUS_LIVEKIT_{field}".upper()
        if name in environ:
            value: Any = environ[name]
            if field in _LIST_FIELDS:
                value = [v.strip() for v in value.split(",") if v.strip()]
            out[field] = value
    return out


def load_agent_config(
    path: str | Path | None = None, environ: Mapping[str, str] | None = None
) -> tuple[ServerConfig, LiveKitConfig]:
    """`chorus serve`'s configuration and the `[livekit]` section from one file.

    Raises `ConfigError` naming the bad key, exactly as `server.config.load_config` does."""
    env = os.environ if environ is None else environ
    data = read_config_file(path)
    section = data.pop("livekit", {})
    if not isinstance(section, dict):
        raise ConfigError("bad configuration: livekit: must be a table ([livekit])")
    try:
        livekit = LiveKitConfig.model_validate(_merge(section, livekit_overrides(env)))
    except ValidationError as exc:
        raise ConfigError(f"bad configuration: {_problems(exc, 'livekit.')}") from exc
    try:
        server = ServerConfig.model_validate(_merge(data, environment_overrides(env)))
    except ValidationError as exc:
        raise ConfigError(f"bad configuration: {_problems(exc)}") from exc
    if server.stt.provider == "deepgram" and server.stt.deepgram_api_key is None:
        server.stt.deepgram_api_key = env.get("DEEPGRAM_API_KEY")
    return server, livekit
