"""Argument checks the commands run BEFORE their work (issue 10.6): a bad count or an output path
that cannot be written is one clear line and exit code 2 at once, not a traceback after a whole
transcription or diarization.

Writability is probed, not guessed from permission bits (`os.access` says yes to root on a
read-only filesystem): an existing file is opened for append (nothing written), a new file's
nearest existing folder gets a temporary file created and removed. Missing parent folders are
fine: the command creates them when it writes.
"""

from __future__ import annotations

import tempfile
from pathlib import Path


class UsageError(ValueError):
    """A command-line value that cannot work; its message is the whole line to print."""


def check_count(value: int | None, flag: str) -> None:
    """A speaker count must be at least 1 when given."""
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be at least 1, got {value}")


def check_writable(path: Path | None, flag: str) -> None:
    """Raise `UsageError` naming `flag` and `path` when `path` cannot be written."""
    if path is None:
        return
    if path.is_dir():
        raise UsageError(f"{flag} {path}: is a directory, not a file")
    if path.exists():
        try:
            with path.open("ab"):
                pass
        except OSError as exc:
            raise UsageError(f"{flag} {path}: cannot write ({exc.strerror or exc})") from exc
        return
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UsageError(f"{flag} {path}: {folder} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc})") from exc


def prepare_parent(path: Path) -> None:
    """Create the folders above `path` (checked by `check_writable` beforehand)."""
    path.parent.mkdir(parents=True, exist_ok=True)
