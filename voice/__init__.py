"""Voice: shared-microphone audio → per-speaker turns (rules V1–V10, S1–S3).

Owns audio I/O and codecs (`voice.audio`), VAD (`voice.vad`), speaker embeddings
(`voice.embedding`), STT providers (`voice.stt`), words and turns (`voice.turns`), speaker-label
continuity across reconnects (`voice.speakers`), the diarization stage interface
(`voice.diarization_stage`) and the `VoiceChannel` (`voice.channel`).
May import: models, attribution, rooms. Never imports diarization, realtime or server.
"""
