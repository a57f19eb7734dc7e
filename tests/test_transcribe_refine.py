"""Transcribing a whole file with pipeline speakers: the stage diarizes the whole recording first
(the refinement pass, P1) and the voice channel reads that timeline through the live path (V5)."""

from __future__ import annotations

import numpy as np

from voice.diarization_stage import Audio, KnownTimelineStage, SpeakerSegment, SpeakerTimeline
from voice.stt.deepgram import DeepgramSTT
from voice.testing.deepgram_server import DeepgramTestServer, ScriptedWords, SpokenWord
from voice.transcribe import transcribe_audio

AUDIO = np.zeros(16000 * 3, np.float32)
BATCH = SpeakerTimeline([SpeakerSegment(0.0, 1.0, "Speaker A"), SpeakerSegment(1.0, 3.0, "Speaker B")])
LIVE_LATE = SpeakerTimeline([SpeakerSegment(0.0, 1.8, "Speaker A"), SpeakerSegment(1.8, 3.0, "Speaker B")])


class TwoFacedStage:
    """Batch mode knows the change is at 1.0 s; live mode decides it late, at 1.8 s."""

    sample_rate = 16000

    def __init__(self) -> None:
        self.batch_calls = 0

    def feed(self, audio: Audio) -> SpeakerTimeline:
        return LIVE_LATE

    def diarize(self, audio: Audio, *, num_speakers: int | None = None,
                max_speakers: int | None = None) -> SpeakerTimeline:
        self.batch_calls += 1
        assert len(audio) == len(AUDIO)
        return BATCH

    def enroll(self, name: str, audio: Audio) -> None: ...
    def forget(self, name: str) -> None: ...
    def reset(self) -> None: ...


def words() -> ScriptedWords:
    return ScriptedWords([[
        SpokenWord("ship", 0.2, 0.5, 0, "Ship"), SpokenWord("it", 0.55, 0.8, 0, "it."),
        SpokenWord("no", 1.2, 1.4, 0, "No,"), SpokenWord("wait", 1.5, 1.7, 0, "wait."),
        SpokenWord("thursday", 2.0, 2.5, 0, "Thursday."),
    ]])


async def transcribe(refine: bool) -> tuple[list[tuple[str | None, str]], TwoFacedStage]:
    stage = TwoFacedStage()
    async with DeepgramTestServer(words()) as server:
        result = await transcribe_audio(AUDIO, 16000, stt=DeepgramSTT("k", url=server.url),
                                         pipeline_speakers=True, diarizer=stage, refine_speakers=refine)
    return [(t.speaker, t.text) for t in result.turns], stage


async def test_P1_V5_a_whole_file_is_diarized_first_and_words_follow_that_timeline() -> None:
    turns, stage = await transcribe(refine=True)
    assert stage.batch_calls == 1
    assert turns == [("Speaker A", "Ship it."), ("Speaker B", "No, wait. Thursday.")]


async def test_V5_live_diarization_reads_the_stages_live_decisions() -> None:
    turns, stage = await transcribe(refine=False)
    assert stage.batch_calls == 0
    assert turns == [("Speaker A", "Ship it. No, wait."), ("Speaker B", "Thursday.")]


def test_P3_known_timeline_stage_hands_out_its_timeline() -> None:
    stage = KnownTimelineStage(BATCH)
    assert stage.feed(AUDIO[:320]) is BATCH and stage.diarize(AUDIO) is BATCH


def test_V5_a_word_without_duration_takes_the_speaker_of_the_word_it_touches() -> None:
    from voice.turns import Word, assign_speakers

    timeline = SpeakerTimeline([SpeakerSegment(0.0, 4.6, "Speaker A"), SpeakerSegment(4.1, 6.0, "Speaker B")])
    words = [Word("meeting.", 3.5, 4.0), Word("Good", 4.5, 4.5), Word("morning.", 4.5, 5.1)]
    assert [w.speaker for w in assign_speakers(words, timeline)] == ["Speaker A", "Speaker B", "Speaker B"]
