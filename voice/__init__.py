"""Voice: shared-microphone audio → per-speaker turns (rules V1–V6, V9, V10, S1–S3).

Owns audio I/O and codecs (`voice.audio`), the one onnxruntime session factory (`voice.onnx`), VAD
(`voice.vad`), speaker embeddings (`voice.embedding`) with their one normaliser and centroid type
(`voice.centroids`), STT providers behind one interface (`voice.stt`), words and runs
(`voice.turns`), speaker labels across reconnects (`voice.speakers`), the diarization stage
interface and its declared abilities (`voice.diarization_stage`), when a turn ends
(`voice.assembler`: the pure `TurnAssembler` and its `TurnPolicy`), feeding a stream's stage off
the loop (`voice.stage_driver`), applying the assembler's decisions to the room
(`voice.turn_writer`, with the hook payloads of `voice.events`), one stream (`voice.session`), the
`VoiceChannel` (`voice.channel`), file transcription through the live path (`voice.transcribe`),
names suggested from introductions (`voice.introductions`, a pure rule) and a local
Deepgram-protocol server for tests (`voice.testing`).
May import: models, attribution, rooms. Never imports diarization, realtime or server.
"""
