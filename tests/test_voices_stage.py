"""Issue 27: the live stage's side of the voice directory, on the real models — each anonymous
voice's print and speech (`speaker_prints`, with the model id the directory stores), and anchors
(`anchor`: known voices the clustering starts from, each taking a letter when first heard)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diarization.embedded import EmbeddedStage
from voice.audio import read_audio_16k

CLIPS = "librispeech-meetings/enroll_{}_{}.flac"


def test_two_anchored_voices_are_told_apart_and_printed_from_this_stream(
    shared_fixtures: Path,
) -> None:
    stage = EmbeddedStage()
    clip = {
        s: read_audio_16k(shared_fixtures / CLIPS.format(s, "far")) for s in ("LS1688", "LS1998")
    }
    known = {
        s: stage.live_voiceprint(read_audio_16k(shared_fixtures / CLIPS.format(s, "close")))
        for s in ("LS1688", "LS1998", "LS367")
    }
    stage.anchor(known)
    stage.reset()
    audio = np.concatenate([clip["LS1688"], np.zeros(16000, np.float32), clip["LS1998"]])
    for k in range(0, len(audio), 8000):
        stage.feed(audio[k : k + 8000])
    stage.flush()
    prints = stage.speaker_prints()
    assert prints.model == stage.live_model and prints.model.startswith("campplus-trunk-")
    talkers = sorted(label for label, s in prints.speech_s.items() if s >= 3.0)
    assert len(talkers) == 2 and all(t.startswith("Speaker ") for t in talkers)  # letters
    assert "LS367" not in stage.live_speakers and "" not in stage.live_speakers
    nearest = set()
    for label in talkers:
        scores = {p: float(prints.prints[label] @ v) for p, v in known.items()}
        nearest.add(max(scores, key=lambda p: scores[p]))
        assert abs(float(np.linalg.norm(prints.prints[label])) - 1.0) < 1e-4
    assert nearest == {"LS1688", "LS1998"}
    stage.anchor({})  # everyone forgotten: the voices stay, as plain voices of this stream
    stage.feed(np.zeros(8000, np.float32))
    assert set(stage.speaker_prints().prints) >= set(talkers)


def test_a_turns_own_print_matches_its_speaker_best(shared_fixtures: Path) -> None:
    """The per-turn check (`[voices] verify`, `voice.identify.turn_matches`) on the real model:
    two seconds of each speaker's far-field clip, printed as a turn is (`turn_voiceprint`, no
    VAD), match their own close-talk print at the default threshold, best of all."""
    from server.config import VoicesConfig
    from voice.identify import KnownVoice, TurnPrint, turn_matches, turn_scores

    settings = VoicesConfig(enabled=True).identify_settings()
    stage = EmbeddedStage()
    people = ("LS1688", "LS1998", "LS367", "LS2033", "LS2414")
    known = {
        s: KnownVoice(
            s, s, stage.live_voiceprint(read_audio_16k(shared_fixtures / CLIPS.format(s, "close")))[None]
        )
        for s in people
    }
    for speaker in people:
        far = read_audio_16k(shared_fixtures / CLIPS.format(speaker, "far"))
        turn = stage.turn_voiceprint(far[16000:48000])
        assert abs(float(np.linalg.norm(turn)) - 1.0) < 1e-4
        printed = TurnPrint(turn)
        assert turn_matches(printed, known[speaker], settings)
        row = turn_scores(printed, [known[p] for p in people])
        assert people[int(row.argmax())] == speaker  # what a claim goes by
        # the nearest other person stays under 0.40, though not always under the 0.35 default
        # (LS2414's two seconds score 0.354 against LS2033's print): a turn's check only takes a
        # name back or lends one already in the meeting; naming a voice takes `auto`
        assert sorted(row.tolist())[-2] < 0.40
    with pytest.raises(ValueError):
        stage.turn_voiceprint(np.zeros(4000, np.float32))  # a quarter second: too short
