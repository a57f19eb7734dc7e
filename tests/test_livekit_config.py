"""Who a LiveKit participant is (shared mic, SIP caller, one person), the `[livekit]` config
section beside `chorus serve`'s, and the `chorus agent` command's refusals."""

from __future__ import annotations

from pathlib import Path

import pytest
from livekit import rtc

from cli.main import main
from livekit_worker.config import LiveKitConfig, load_agent_config
from livekit_worker.participants import display_name, is_shared_mic, speaker_of
from livekit_worker.worker import build_server, missing_credentials
from server.config import ConfigError
from tests.livekit_helpers import remote_participant

SIP = rtc.ParticipantKind.PARTICIPANT_KIND_SIP


def test_a_participant_is_named_by_its_livekit_name_else_its_identity() -> None:
    assert display_name(remote_participant("u-17", "Alice")) == "Alice"
    assert display_name(remote_participant("u-17")) == "u-17"
    assert display_name(remote_participant("u-17", "  ")) == "u-17"


def test_a_sip_caller_is_named_by_name_else_phone_number_else_identity() -> None:
    phone = {"sip.phoneNumber": "+15550100"}
    assert display_name(remote_participant("sip_1", "Front desk", kind=SIP, attributes=phone)) \
        == "Front desk"
    assert display_name(remote_participant("sip_1", kind=SIP, attributes=phone)) == "+15550100"
    assert display_name(remote_participant("sip_1", kind=SIP)) == "sip_1"
    # the phone attribute means nothing on a participant that is not a SIP caller
    assert display_name(remote_participant("u-2", attributes=phone)) == "u-2"
    assert speaker_of(remote_participant("sip_1", kind=SIP, attributes=phone)).sip


def test_a_shared_mic_is_marked_by_attribute_or_a_name_pattern() -> None:
    assert is_shared_mic(remote_participant("m", attributes={"chorus.shared_mic": "true"}))
    assert is_shared_mic(remote_participant("m", attributes={"chorus.shared_mic": "TRUE"}))
    assert not is_shared_mic(remote_participant("m", attributes={"chorus.shared_mic": "false"}))
    assert not is_shared_mic(remote_participant("m", "Conference room"))
    patterns = ["conference*", "*-table-mic"]
    assert is_shared_mic(remote_participant("m", "Conference Room 2"), patterns)
    assert is_shared_mic(remote_participant("floor3-table-mic"), patterns)
    assert not is_shared_mic(remote_participant("alice", "Alice"), patterns)
    speaker = speaker_of(remote_participant("m", "Conference room"), patterns)
    assert speaker.shared_mic and speaker.name == "Conference room" and speaker.identity == "m"


def test_the_livekit_section_sits_beside_the_serve_sections(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text(
        '[stt]\nprovider = "deepgram"\n\n[realtime]\nprovider = "none"\n\n'
        '[livekit]\nagent_name = "meeting-bot"\nshared_mic_names = ["conference*"]\n'
    )
    server, livekit = load_agent_config(file, environ={"DEEPGRAM_API_KEY": "dg"})
    assert server.stt.provider == "deepgram" and server.stt.deepgram_api_key == "dg"
    assert server.realtime.provider == "none"
    assert livekit.agent_name == "meeting-bot" and livekit.shared_mic_names == ["conference*"]
    _, livekit = load_agent_config(
        file, environ={"CHORUS_LIVEKIT_SHARED_MIC_NAMES": "a*, b*", "CHORUS_LIVEKIT_AGENT_NAME": "x"})
    assert livekit.shared_mic_names == ["a*", "b*"] and livekit.agent_name == "x"
    _, default = load_agent_config(None, environ={})
    assert default == LiveKitConfig() and default.agent_name == "chorus"


def test_a_bad_livekit_key_is_an_error_naming_it(tmp_path: Path) -> None:
    file = tmp_path / "chorus.toml"
    file.write_text("[livekit]\nagent_nme = \"x\"\n")
    with pytest.raises(ConfigError, match=r"livekit\.agent_nme"):
        load_agent_config(file, environ={})
    file.write_text("[livekit]\nload_threshold = 3\n")
    with pytest.raises(ConfigError, match=r"livekit\.load_threshold"):
        load_agent_config(file, environ={})
    file.write_text("[sttt]\nprovider = \"whisper\"\n")
    with pytest.raises(ConfigError, match="sttt"):
        load_agent_config(file, environ={})


def test_the_worker_registers_for_explicit_dispatch_as_chorus() -> None:
    server = build_server(LiveKitConfig(), ws_url="ws://127.0.0.1:7880", api_key="k",
                          api_secret="s")
    assert server._agent_name == "chorus"
    threshold = server._load_threshold
    assert threshold.prod_default == 0.7 and threshold.dev_default == float("inf")  # type: ignore[union-attr]
    assert missing_credentials({"LIVEKIT_URL": "ws://x"}) == ["LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"]


def test_chorus_agent_refuses_without_credentials_or_with_a_bad_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("LIVEKIT_URL", "LIVEKIT_API_KEY", "LIVEKIT_API_SECRET"):
        monkeypatch.delenv(name, raising=False)
    assert main(["agent"]) == 2
    assert "LIVEKIT_URL, LIVEKIT_API_KEY, LIVEKIT_API_SECRET" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[livekit]\nshared_mic_names = 3\n")
    assert main(["agent", "--config", str(bad)]) == 2
    assert "livekit.shared_mic_names" in capsys.readouterr().err

