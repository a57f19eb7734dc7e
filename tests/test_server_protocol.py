"""Wire messages: the device stream protocol and Twilio Media Streams framing parse as typed values."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from server.protocol import (
    StartMessage,
    StopMessage,
    TurnMessage,
    dump,
    error_location,
    parse_device_message,
    parse_server_message,
)
from server.twilio import (
    TwilioConnected,
    TwilioMedia,
    TwilioStart,
    TwilioStop,
    parse_twilio_message,
)

# Shapes as Twilio documents them (Media Streams WebSocket messages).
TWILIO_CONNECTED = {"event": "connected", "protocol": "Call", "version": "1.0.0"}
TWILIO_START = {
    "event": "start",
    "sequenceNumber": "1",
    "start": {
        "accountSid": "AC123",
        "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
        "callSid": "CA123",
        "tracks": ["inbound"],
        "mediaFormat": {"encoding": "audio/x-mulaw", "sampleRate": 8000, "channels": 1},
        "customParameters": {"room": "r1", "token": "t", "name": "Dana"},
    },
    "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
}
TWILIO_MEDIA = {
    "event": "media",
    "sequenceNumber": "3",
    "media": {"track": "inbound", "chunk": "1", "timestamp": "5", "payload": "no+JhoaJjpzN"},
    "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
}
TWILIO_STOP = {
    "event": "stop",
    "sequenceNumber": "5",
    "stop": {"accountSid": "AC123", "callSid": "CA123"},
    "streamSid": "MZ18ad3ab5a668481ce02b83e7395059f0",
}


def test_device_start_and_stop() -> None:
    start = parse_device_message(
        '{"type":"start","participant":"dev-1","name":"Room 4","sample_rate":16000,'
        '"encoding":"pcm16","channels":1,"shared_mic":true}'
    )
    assert isinstance(start, StartMessage) and start.shared_mic and start.name == "Room 4"
    assert isinstance(parse_device_message('{"type":"stop"}'), StopMessage)


def test_unknown_encoding_is_located_at_the_encoding_field() -> None:
    with pytest.raises(ValidationError) as err:
        parse_device_message('{"type":"start","participant":"d","encoding":"opus"}')
    assert error_location(list(err.value.errors()))[-1] == "encoding"


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"type":"dance"}',
        '{"type":"start"}',
        '{"type":"start","participant":"d","sample_rate":5}',
        '{"type":"start","participant":"d","encoding":"mulaw","sample_rate":16000}',
        '{"type":"start","participant":"has space"}',
    ],
)
def test_bad_device_messages_are_refused(text: str) -> None:
    with pytest.raises(ValidationError):
        parse_device_message(text)


def test_twilio_messages_parse_as_documented() -> None:
    assert isinstance(parse_twilio_message(json.dumps(TWILIO_CONNECTED)), TwilioConnected)
    start = parse_twilio_message(json.dumps(TWILIO_START))
    assert isinstance(start, TwilioStart)
    assert start.start.customParameters["name"] == "Dana"
    assert start.start.mediaFormat.sampleRate == 8000
    media = parse_twilio_message(json.dumps(TWILIO_MEDIA))
    assert isinstance(media, TwilioMedia) and media.media.payload == "no+JhoaJjpzN"
    assert isinstance(parse_twilio_message(json.dumps(TWILIO_STOP)), TwilioStop)


def test_built_messages_round_trip() -> None:
    turn = TurnMessage(room="r", speaker="Alice", text="hi", start=1.0, end=2.0, participant="p")
    again = parse_server_message(dump(turn))
    assert again == turn
    assert json.loads(dump(turn))["type"] == "turn"
