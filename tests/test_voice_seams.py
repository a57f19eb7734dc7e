"""Issue 26: the voice package's seams — the turn rules from `[voice]`, stage abilities declared
(never probed), one stage per session, and the records a session or channel keeps bounded."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from server.config import ConfigError, load_config
from server.pipeline import VoicePipeline
from tests.voice_helpers import ScriptedStage, UtteranceSTT, turns_of, voice_room
from voice.assembler import TurnPolicy
from voice.channel import KEPT_PLAYED, VoiceChannel
from voice.diarization_stage import (
    NO_ABILITIES,
    SpeakerSegment,
    SpeakerTimeline,
    StageAbilities,
    abilities_of,
)

REPO = Path(__file__).resolve().parents[1]
VOICES = SpeakerTimeline([SpeakerSegment(0.0, 1.0, "Alice"), SpeakerSegment(1.1, 2.0, "Bob")])
FINALS = [(2.0, [("Ship", 0.1, 0.4), ("it?", 0.5, 0.9), ("No,", 1.2, 1.5), ("wait.", 1.6, 1.9)],
           True)]
AUDIO = np.zeros(16000 * 3, np.float32)


# ----------------------------------------------------------------------------- [voice] config


def test_the_voice_section_reaches_every_voice_session(tmp_path: Path) -> None:
    path = tmp_path / "chorus.toml"
    path.write_text("[voice]\nearly_commit = false\nspeaker_wait = 3.5\n")
    config = load_config(path, environ={"CHORUS_VOICE_PROVISIONAL_CHANGES": "false"})
    policy = TurnPolicy(early_commit=False, provisional_changes=False, speaker_wait=3.5)
    assert config.voice.policy() == policy
    pipeline = VoicePipeline(config, UtteranceSTT([]))
    assert pipeline.shared_voice.policy == policy
    assert pipeline.diarized_voice.policy == policy
    assert load_config(None, environ={}).voice.policy() == TurnPolicy()


@pytest.mark.parametrize(("text", "needle"), [
    ("[voice]\nspeaker_wait = -1\n", "voice.speaker_wait"),
    ("[voice]\nearly_comit = true\n", "voice.early_comit"),
])
def test_a_bad_voice_section_names_the_key(tmp_path: Path, text: str, needle: str) -> None:
    path = tmp_path / "chorus.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=needle):
        load_config(path, environ={})


def test_transcribe_reads_the_voice_section_and_refuses_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "chorus.toml"
    path.write_text("[voice]\nspeaker_wait = -1\n")
    done = subprocess.run([sys.executable, "-m", "cli.main", "transcribe", "missing.wav",
                           "--config", str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2
    assert "voice.speaker_wait" in done.stderr


def test_a_channel_keyword_overrides_one_field_of_its_policy() -> None:
    base = TurnPolicy(early_commit=False, speaker_wait=5.0)
    channel = VoiceChannel(stt=UtteranceSTT([]), policy=base, speaker_wait=1.0)
    assert channel.policy == TurnPolicy(early_commit=False, speaker_wait=1.0)
    with pytest.raises(ValueError, match="speaker_wait"):
        TurnPolicy(speaker_wait=-0.5)


# ------------------------------------------------------------------------ stage abilities


class FlushingButSilent(ScriptedStage):
    """Has a `flush` method it never declared: a stage that declares nothing has no abilities."""

    def __init__(self, timeline: SpeakerTimeline) -> None:
        super().__init__(timeline)
        self.flushed = 0

    def flush(self) -> SpeakerTimeline:
        self.flushed += 1
        return self.timeline


class ClaimsWithoutMethod(ScriptedStage):
    abilities = StageAbilities(recent_view=True)


def test_abilities_are_declared_and_checked_once() -> None:
    assert abilities_of(ScriptedStage(VOICES)) is NO_ABILITIES
    with pytest.raises(TypeError, match="declares recent_view but has no recent"):
        abilities_of(ClaimsWithoutMethod(VOICES))
    with pytest.raises(TypeError, match="declares recent_view"):
        VoiceChannel(stt=UtteranceSTT([]), pipeline_speakers=True,
                     diarizer=ClaimsWithoutMethod(VOICES))


def test_the_embedded_stage_declares_what_it_can_do() -> None:
    from diarization.embedded import EmbeddedStage

    assert EmbeddedStage.abilities == StageAbilities(decides_late=True, recent_view=True,
                                                      provisional_view=True, stretches_step=True,
                                                      catches_up=True, abandons=True,
                                                      speaker_prints=True, anchors=True)


async def test_an_undeclared_method_is_never_called() -> None:
    stage = FlushingButSilent(VOICES)
    channel = VoiceChannel(stt=UtteranceSTT(FINALS), pipeline_speakers=True, diarizer=stage)
    await voice_room(channel)
    session = await channel.start_session("room", "mic")
    turns = await turns_of(session, AUDIO, 16000)
    assert [(t.sender_name, t.text) for t in turns] == [("Alice", "Ship it?"), ("Bob", "No, wait.")]
    assert stage.flushed == 0


# ---------------------------------------------------------------------- one stage per session


async def test_one_channel_serves_many_streams_each_with_its_own_stage() -> None:
    channel = VoiceChannel(stt=UtteranceSTT(FINALS), pipeline_speakers=True,
                           stage_per_session=True)
    await voice_room(channel)
    first, second = ScriptedStage(VOICES), ScriptedStage(VOICES)
    a = await channel.start_session("room", "mic-a", stage=first)
    b = await channel.start_session("room", "mic-b", stage=second)
    turns_a = await turns_of(a, AUDIO, 16000)
    turns_b = await turns_of(b, AUDIO[: 16000 * 2], 16000)
    assert [t.sender_name for t in turns_a] == ["Alice", "Bob"]
    assert [t.sender_name for t in turns_b] == ["Alice", "Bob"]
    # each stage heard its own stream only
    assert (first.fed, second.fed) == (len(AUDIO), 16000 * 2)
    with pytest.raises(ValueError, match="start_session"):
        await channel.start_session("room", "mic-c")


def test_a_pipeline_channel_still_needs_a_stage_or_per_session_stages() -> None:
    with pytest.raises(ValueError, match="stage_per_session=True"):
        VoiceChannel(stt=UtteranceSTT([]), pipeline_speakers=True)


# --------------------------------------------------------------------------------- bounds


async def test_a_session_keeps_its_latest_turns_and_the_room_keeps_them_all() -> None:
    finals = [(0.5 * (i + 1), [(f"w{i}.", 0.5 * i, 0.5 * i + 0.3)], True) for i in range(6)]
    channel = VoiceChannel(stt=UtteranceSTT(finals), kept_turns=2)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic")
    await turns_of(session, AUDIO, 16000)
    await kit.drain()
    assert [t.text for t in session.turns] == ["w4.", "w5."]
    assert [e.text for e in await kit.list_events("room")] == [f"w{i}." for i in range(6)]


async def test_the_channel_keeps_its_latest_play_calls() -> None:
    channel = VoiceChannel(stt=UtteranceSTT([]))
    await voice_room(channel)
    for i in range(KEPT_PLAYED + 10):
        await channel.play("room", b"\0\0" * (i + 1), 16000)
    assert len(channel.played) == KEPT_PLAYED
    assert channel.played[-1] == ("room", 2 * (KEPT_PLAYED + 10), 16000)


def test_the_load_bench_hands_the_voice_section_to_the_server(tmp_path: Path) -> None:
    from bench.load import voice_section

    given = tmp_path / "given.toml"
    given.write_text("[voice]\nprovisional_changes = false\nspeaker_wait = 1.5\n[stt]\nprovider = 'whisper'\n")
    written = tmp_path / "server.toml"
    written.write_text(voice_section(given))
    assert load_config(written, environ={}).voice.policy() == TurnPolicy(
        provisional_changes=False, speaker_wait=1.5)
    assert voice_section(None) == ""


class CatchingUpStage(ScriptedStage):
    """Declares `catches_up` and records what it was told."""

    abilities = StageAbilities(catches_up=True)

    def __init__(self, timeline: SpeakerTimeline) -> None:
        super().__init__(timeline)
        self.told: list[bool] = []

    def catch_up(self, on: bool) -> None:
        self.told.append(on)


@pytest.mark.parametrize("catch_up", [True, False])
async def test_a_live_servers_stages_catch_up_and_a_files_never_do(catch_up: bool) -> None:
    """Issue 31: a channel with `catch_up` (the server's diarized streams) tells each stream's
    stage, once, with its first feed, to skip a backlog's windows; without it (a file pushed
    faster than real time) the stage is never told and runs every window."""
    stage = CatchingUpStage(VOICES)
    channel = VoiceChannel(stt=UtteranceSTT(FINALS), pipeline_speakers=True,
                           stage_per_session=True, catch_up=catch_up)
    kit = await voice_room(channel)
    session = await channel.start_session("room", "mic", stage=stage)
    turns = await turns_of(session, AUDIO, 16000)
    assert stage.told == ([True] if catch_up else [])
    assert [t.sender_name for t in turns] == ["Alice", "Bob"]
    await kit.close()


def test_the_servers_diarized_streams_catch_up() -> None:
    pipeline = VoicePipeline(load_config(None, environ={}), UtteranceSTT([]))
    assert pipeline.diarized_voice.catch_up and not VoiceChannel(stt=UtteranceSTT([])).catch_up
