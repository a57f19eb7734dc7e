"""The client events an OpenAI Realtime session sends, built from the session's own values.

Why apart from `realtime.openai_session`: the recorder session (`realtime.recorder`, the key-less
embedded default) records exactly these events without the `openai` package, which only the real
session needs (the `openai` extra). Both sessions build them here, so what the recorder shows is
what the OpenAI session would send.
"""

from __future__ import annotations

from realtime import openai_wire as wire
from realtime.session import ContextItem, SessionOptions


def session_config(options: SessionOptions, model: str | None = None) -> wire.SessionConfig:
    """The `session.update` body for these options.

    Audio mode sets `audio.input.turn_detection` to `null` (the model's own turn detection off,
    R3) and the input format to 24 kHz PCM; text mode leaves turn detection alone (the model
    gets no audio).
    """
    config = wire.SessionConfig(type="realtime")
    if model is not None:
        config.model = model
    if options.instructions is not None:
        config.instructions = options.instructions
    config.output_modalities = ["audio"] if options.output_audio else ["text"]
    audio: wire.AudioConfig | None = None
    if options.audio_input or options.voice is not None:
        audio = wire.AudioConfig()
        if options.audio_input:
            audio.input = wire.AudioInputConfig(
                format=wire.AudioFormat(type="audio/pcm", rate=wire.INPUT_SAMPLE_RATE),
                turn_detection=None,
            )
        if options.voice is not None:
            audio.output = wire.AudioOutputConfig(voice=options.voice)
        config.audio = audio
    return config


def client_item_event(item: ContextItem) -> wire.ConversationItemCreate:
    if item.role == "user":
        message = wire.user_text_item(item.text)
    elif item.role == "system":
        message = wire.system_text_item(item.text)
    else:
        message = wire.assistant_text_item(item.text)
    return wire.ConversationItemCreate(item=message)


def response_create_event(number: int) -> wire.ResponseCreate:
    """The n-th `response.create` of a session. Its `event_id` comes back in an `error` that
    refuses it, so a refused request does not leave a response "in flight" forever."""
    return wire.ResponseCreate(event_id=f"chorus_response_{number}")
