"""The docs run (issue 24.5): what README.md and docs/*.md show a user is checked against the code.

- every ```toml block is a config that loads (`server.config.load_config`, or
  `livekit_worker.config.load_agent_config` for a block with `[livekit]`); a block that is not a
  config says so on the line before it: `<!-- not-a-config -->`;
- every `chorus …` command in a shell block (bash, sh, or unlabelled; also `python -m cli.main …`,
  after `VAR=value` prefixes, inside `( … )`, `&&`, `;`) parses with the real `chorus` parser.
  Usage lines are read as synopses: `[…]` groups are tried left out and put in, `a|b` is read as
  its first choice, and `...` / `…` stand for a value the reader fills in;
- the sample `chorus.toml` of docs/server.md serves as it is: `chorus serve --config` on it
  answers /healthz and turns a shared microphone's speech into turns (local Whisper, the
  embedded diarizer: what the sample names).

Each failure names the file and line.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from cli.main import build_parser
from livekit_worker.config import load_agent_config
from server.auth import issue_token
from server.client import DeviceStream, EventFeed
from server.config import ConfigError, load_config
from server.protocol import StartMessage
from server.testing.harness import eventually
from tests.serve_process import ServeProcess
from voice.audio import float_to_pcm16, read_audio_16k

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
NOT_A_CONFIG = "<!-- not-a-config -->"
SHELL = {"", "bash", "sh", "shell", "console"}
FENCE = re.compile(r"^\s*```(\S*)\s*$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int
    """1-based line of the block's first content line."""
    lang: str
    lines: tuple[str, ...]
    before: str
    """The last non-blank line before the opening fence."""

    def where(self, offset: int = 0) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line + offset}"


def fenced_blocks(path: Path) -> Iterator[Block]:
    lines = path.read_text().splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].strip().startswith("```"):
            end += 1
        before = next((lines[k] for k in range(index - 1, -1, -1) if lines[k].strip()), "")
        yield Block(path, index + 2, opening.group(1), tuple(lines[index + 1 : end]), before)
        index = end + 1


def all_blocks() -> list[Block]:
    return [block for path in DOCS for block in fenced_blocks(path)]


# --- config blocks -----------------------------------------------------------------------------


def config_blocks() -> list[Block]:
    return [b for b in all_blocks() if b.lang == "toml" and NOT_A_CONFIG not in b.before]


@pytest.mark.parametrize("block", config_blocks(), ids=lambda b: b.where())
def test_every_config_block_loads(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "chorus.toml"
    path.write_text("\n".join(block.lines) + "\n")
    try:
        if re.search(r"^\s*\[livekit\]", path.read_text(), re.MULTILINE):
            load_agent_config(path, environ={})
        else:
            load_config(path, environ={})
    except ConfigError as exc:
        pytest.fail(f"{block.where()}: {exc}")


def test_a_config_block_that_is_wrong_fails_and_a_marked_one_is_skipped(tmp_path: Path) -> None:
    """The check above can fail: the old sample's `num_speakers = 0` is refused, and a block
    marked not-a-config is not read."""
    doc = tmp_path / "doc.md"
    doc.write_text(
        "```toml\n[diarizer]\nnum_speakers = 0\n```\n\n"
        f"{NOT_A_CONFIG}\n```toml\n[tool.ruff]\nline-length = 100\n```\n"
    )
    blocks = list(fenced_blocks(doc))
    assert [b.line for b in blocks] == [2, 8]
    assert NOT_A_CONFIG in blocks[1].before and NOT_A_CONFIG not in blocks[0].before
    path = tmp_path / "chorus.toml"
    path.write_text("\n".join(blocks[0].lines))
    with pytest.raises(ConfigError, match=r"diarizer\.num_speakers"):
        load_config(path, environ={})


# --- commands ----------------------------------------------------------------------------------

SEPARATORS = {"&&", "||", ";", "(", ")", "&"}
PLACEHOLDER = "X"


def _is_chorus(words: list[str]) -> int | None:
    """Where the `chorus` arguments start in `words` (after `VAR=value`s), or None."""
    index = 0
    while index < len(words) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=\S*", words[index]):
        index += 1
    if index >= len(words):
        return None
    head = words[index]
    if head == "$":  # a prompt
        return _shifted(_is_chorus(words[index + 1 :]), index + 1)
    if head == "chorus" or head.endswith("/chorus"):
        return index + 1
    if re.search(r"(^|/)python[0-9.]*$", head) and words[index + 1 : index + 3] in (
        ["-m", "cli.main"],
        ["-m", "cli"],
    ):
        return index + 3
    return None


def _shifted(start: int | None, by: int) -> int | None:
    return None if start is None else start + by


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars="|&;()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def commands_in(text: str) -> Iterator[list[str]]:
    """The argument lists of each `chorus` invocation in one shell line (continuations joined)."""
    words = _tokens(text)
    segments: list[list[str]] = [[]]
    for word in words:
        if word in SEPARATORS:
            segments.append([])
        elif word == "|":
            segments[-1].append("|")
        else:
            segments[-1].append(word)
    for segment in segments:
        # `|` ends a command when another chorus command follows (README: `a | b` lists them);
        # otherwise it separates alternatives, and the first is read
        pieces: list[list[str]] = [[]]
        for word in segment:
            if word == "|":
                pieces.append([])
            else:
                pieces[-1].append(word)
        current: list[str] | None = None
        for piece in pieces:
            start = _is_chorus(piece)
            if start is not None:
                if current is not None:
                    yield current
                current = piece[start:]
            elif current is not None and piece:
                current.extend(piece[1:])  # `x|y rest`: `x` was read, `y` is dropped
        if current is not None:
            yield current


def synopsis_forms(args: list[str]) -> list[list[str]]:
    """`[…]` groups left out, and all put in (brackets dropped); `...`/`…` are kept for
    `with_placeholders_filled`."""
    plain: list[str] = []
    full: list[str] = []
    depth = 0
    for word in args:
        opens, closes = word.count("["), word.count("]")
        bracketed = bool(opens or closes) and "=" not in word
        bare = word.replace("[", "").replace("]", "") if bracketed else word
        if depth == 0 and not opens:
            plain.append(bare)
        if bare or not bracketed:
            full.append(bare)
        depth += opens - closes
    return [plain] if plain == full else [plain, full]


@dataclass(frozen=True)
class Shown:
    where: str
    text: str
    args: tuple[str, ...]


def shown_commands() -> list[Shown]:
    found: list[Shown] = []
    for block in all_blocks():
        if block.lang not in SHELL:
            continue
        offset = 0
        while offset < len(block.lines):
            first = offset
            text = block.lines[offset]
            while text.rstrip().endswith("\\") and offset + 1 < len(block.lines):
                offset += 1
                text = text.rstrip()[:-1] + " " + block.lines[offset].strip()
            offset += 1
            try:
                commands = list(commands_in(text))
            except ValueError:  # not shell (a diagram, a JSON line): no command shown
                continue
            found += [Shown(block.where(first), text.strip(), tuple(a)) for a in commands]
    return found


def _leaf(parser: argparse.ArgumentParser, args: list[str]) -> argparse.ArgumentParser:
    """The (sub)parser that reads the options of `args` (`bench load …`: the `load` parser)."""
    for word in args:
        subparsers = [
            a for a in parser._actions if isinstance(a, argparse._SubParsersAction)
        ]
        if not subparsers or word not in subparsers[0].choices:
            break
        parser = subparsers[0].choices[word]
    return parser


def with_placeholders_filled(parser: argparse.ArgumentParser, args: list[str]) -> list[str]:
    """A metavar shown as a value (`--num-speakers N`, `--ttl SECONDS`) is filled with a value of
    the option's type (a number for a number); any other value is read as written."""
    leaf = _leaf(parser, args)
    options = {s: a for a in leaf._actions for s in a.option_strings}
    out: list[str] = []
    for word in args:
        action = options.get(out[-1]) if out else None
        takes_value = action is not None and action.nargs != 0
        if word in ("...", "…"):  # a value to fill in after an option, "and more" elsewhere
            if takes_value:
                assert action is not None
                out.append("1" if action.type in (int, float) else PLACEHOLDER)
            continue
        if takes_value and re.fullmatch(r"[A-Z][A-Z0-9_]*", word):
            assert action is not None
            word = "1" if action.type in (int, float) else word
        out.append(word)
    return out


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    args = with_placeholders_filled(parser, args)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):  # --help exits 0
            return err.getvalue().strip().splitlines()[-1]
    return None


SHOWN = shown_commands()


def test_the_docs_show_commands_of_every_subcommand() -> None:
    shown = {s.args[0] for s in SHOWN if s.args}
    assert {"serve", "token", "agent", "transcribe", "diarize", "bench"} <= shown


@pytest.mark.parametrize("shown", SHOWN, ids=lambda s: s.where)
def test_every_shown_command_parses(shown: Shown) -> None:
    parser = build_parser()
    for form in synopsis_forms(list(shown.args)):
        problem = parse_error(parser, form)
        assert problem is None, f"{shown.where}: `{shown.text}` does not parse: {problem}"


def test_the_command_check_can_fail() -> None:
    """A flag that does not exist, a missing required argument and a bad choice are caught,
    wherever in the line the command sits."""
    parser = build_parser()
    (old,) = commands_in("PYTHONPATH=. $ENV/bin/python -m cli.main diarize meeting.wav --diarizer pyannote")
    assert parse_error(parser, old) is not None  # the old docs/pyannote.md line: no --rttm
    (typo,) = commands_in("(cd /tmp && chorus serve --prot 8765)")
    assert "unrecognized arguments: --prot" in (parse_error(parser, typo) or "")
    first, second = commands_in("chorus bench transcription | chorus bench lod")
    assert parse_error(parser, first) is None and parse_error(parser, second) is not None
    (choice,) = commands_in("chorus transcribe a.wav --stt whisper|deepgram --format txt")
    assert "invalid choice: 'txt'" in (parse_error(parser, choice) or "")
    forms = synopsis_forms(["token", "ROOM", "[--grant", "stream", "...]", "[--ttl", "N]"])
    assert forms == [["token", "ROOM"], ["token", "ROOM", "--grant", "stream", "...", "--ttl", "N"]]
    assert with_placeholders_filled(parser, forms[1]) == [
        "token", "ROOM", "--grant", "stream", "--ttl", "1"
    ]  # fmt: skip
    assert with_placeholders_filled(parser, ["bench", "load", "--json", "..."])[-1] == PLACEHOLDER


# --- the sample chorus.toml serves -------------------------------------------------------------


def sample_config() -> Block:
    (block,) = [b for b in fenced_blocks(REPO / "docs" / "server.md") if b.lang == "toml"]
    return block


@pytest.mark.asyncio
async def test_the_sample_config_of_docs_server_md_serves(tmp_path: Path) -> None:
    block = sample_config()
    config = tmp_path / "chorus.toml"
    config.write_text("\n".join(block.lines) + "\n")
    secret = load_config(config, environ={}).secret
    assert secret is not None
    # the sample's store is the default one, in the user's data directory: here, a fresh one
    server = await ServeProcess.start(config, secret=None, env={"XDG_DATA_HOME": str(tmp_path)})
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{server.port}") as http:
            health = await http.get("/healthz")
        assert health.status_code == 200 and health.json()["status"] == "ok", block.where()
        token = issue_token(secret, "sample")
        feed = await EventFeed.open(server.base, "sample", token)
        device = await DeviceStream.open(
            server.base, "sample", token,
            StartMessage(participant="room-1", name="Room 1", sample_rate=16000, shared_mic=True),
        )  # fmt: skip
        audio = read_audio_16k(REPO / "examples" / "meeting" / "meeting.wav")[: 16000 * 10]
        await device.send_audio(float_to_pcm16(audio), chunk_s=0.5, realtime=False)
        await device.stop()

        def turns() -> list[str]:
            return [m.speaker for m in feed.received if m.type == "turn"]

        def errors() -> list[object]:
            return [m for m in device.received if m.type == "error"]

        await eventually(
            lambda: len(turns()) >= 1 or bool(errors()), 120, f"a turn from {block.where()}'s server"
        )
        assert not errors(), f"{block.where()}: the stream failed: {errors()}"
        assert all(s.startswith("Speaker ") for s in turns())  # the embedded diarizer named them
        await feed.close()
        assert (tmp_path / "chorus" / "chorus.db").exists()  # the default store, where it says
    finally:
        await server.stop()
