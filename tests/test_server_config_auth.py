"""Server configuration (defaults < file < environment) and room tokens (HMAC, one room, expiry)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cli.commands.serve import is_loopback_only, settle_secret
from server.auth import TokenError, TokenProblem, issue_token, verify_token
from server.config import ConfigError, ServerConfig, load_config

SECRET = "s" * 32


def test_embedded_default_needs_no_file_and_no_variable() -> None:
    config = load_config(None, environ={})
    assert config.stt.provider == "whisper"
    assert config.diarizer.kind == "embedded"
    assert config.realtime.provider == "recorder"
    assert config.secret is None


def test_file_then_environment_override(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text(
        'secret = "from-file-secret-0123456789"\n'
        '[stt]\nprovider = "deepgram"\ndeepgram_url = "ws://127.0.0.1:9"\n'
        '[limits]\nmax_streams = 5\n[policy]\nanswer_only = ["Alice"]\n'
    )
    config = load_config(
        file,
        environ={
            "CHORUS_LIMITS_MAX_STREAMS": "7",
            "CHORUS_POLICY_ANSWER_ONLY": "Bob, Carol",
            "DEEPGRAM_API_KEY": "k",
        },
    )
    assert config.secret == "from-file-secret-0123456789"
    assert config.stt.provider == "deepgram"
    assert config.stt.deepgram_api_key == "k"
    assert config.limits.max_streams == 7
    assert config.policy.answer_only == ["Bob", "Carol"]


def test_secret_from_environment() -> None:
    assert load_config(None, environ={"CHORUS_SECRET": SECRET}).secret == SECRET


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[stt]\nprovider = "nope"\n', "stt.provider"),
        ("[limits]\nmax_streams = 0\n", "limits.max_streams"),
        ("[stt]\nunknown_key = 1\n", "stt.unknown_key"),
        ("not toml = = =", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text(text)
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        load_config(file, environ={})


def test_missing_config_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "absent.toml", environ={})


def test_token_grants_its_room_until_expiry() -> None:
    token = issue_token(SECRET, "room-1", ttl_s=60, now=1000)
    grant = verify_token(SECRET, token, "room-1", now=1059)
    assert grant.room == "room-1" and grant.expires_at == 1060


@pytest.mark.parametrize(
    ("token_room", "asked_room", "now", "secret", "problem"),
    [
        ("room-1", "room-2", 1000, SECRET, TokenProblem.WRONG_ROOM),
        ("room-1", "room-1", 1060, SECRET, TokenProblem.EXPIRED),
        ("room-1", "room-1", 1000, "t" * 32, TokenProblem.BAD_SIGNATURE),
    ],
)
def test_token_refusals(
    token_room: str, asked_room: str, now: int, secret: str, problem: TokenProblem
) -> None:
    token = issue_token(SECRET, token_room, ttl_s=60, now=1000)
    with pytest.raises(TokenError) as err:
        verify_token(secret, token, asked_room, now=now)
    assert err.value.problem is problem


@pytest.mark.parametrize("token", [None, "", "abc", "v1.x.y", "v2.a.b"])
def test_missing_or_malformed_tokens(token: str | None) -> None:
    with pytest.raises(TokenError) as err:
        verify_token(SECRET, token, "room-1")
    assert err.value.problem in (
        TokenProblem.MISSING,
        TokenProblem.MALFORMED,
        TokenProblem.BAD_SIGNATURE,
    )


@given(st.text(min_size=1, max_size=40), st.text(min_size=1, max_size=40))
def test_a_token_for_one_room_never_opens_another(room: str, other: str) -> None:
    token = issue_token(SECRET, room, ttl_s=60)
    if room == other:
        assert verify_token(SECRET, token, other).room == room
    else:
        with pytest.raises(TokenError):
            verify_token(SECRET, token, other)


@given(st.binary(min_size=1, max_size=8), st.integers(min_value=0, max_value=200))
def test_tampered_tokens_are_refused(noise: bytes, where: int) -> None:
    token = issue_token(SECRET, "room-1", ttl_s=60)
    i = where % len(token)
    tampered = token[:i] + noise.hex() + token[i + 1 :]
    if tampered != token:
        with pytest.raises(TokenError):
            verify_token(SECRET, tampered, "room-1")


def test_loopback_server_makes_a_secret_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    secret = settle_secret(ServerConfig(), "127.0.0.1")
    assert len(secret) >= 32
    assert "CHORUS_SECRET=" + secret in capsys.readouterr().err


@pytest.mark.parametrize("host", ["0.0.0.0", "::", ""])
def test_public_server_refuses_to_start_without_secret(host: str) -> None:
    assert not is_loopback_only(host)
    with pytest.raises(ConfigError, match="without a secret"):
        settle_secret(ServerConfig(), host)


def test_token_command_prints_a_token_the_server_accepts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from cli.main import main

    monkeypatch.setenv("CHORUS_SECRET", SECRET)
    assert main(["token", "room-9", "--ttl", "120"]) == 0
    token = capsys.readouterr().out.strip()
    assert verify_token(SECRET, token, "room-9").room == "room-9"
    monkeypatch.delenv("CHORUS_SECRET")
    assert main(["token", "room-9"]) == 2
    assert "no secret" in capsys.readouterr().err


def test_realtime_response_timeout_is_configurable_and_reaches_the_channel(tmp_path: Path) -> None:
    from server.pipeline import realtime_channel

    path = tmp_path / "chorus.toml"
    path.write_text("[realtime]\nresponse_timeout = 12.5\n")
    config = load_config(path, environ={})
    assert config.realtime.response_timeout == 12.5
    channel = realtime_channel(config)
    assert channel is not None and channel.options.response_timeout == 12.5
    path.write_text("[realtime]\nresponse_timeout = 0\n")
    with pytest.raises(ConfigError, match="response_timeout"):
        load_config(path, environ={})
