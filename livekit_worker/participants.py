"""Who a LiveKit participant is to Chorus: one named person, a phone caller, or a shared mic.

Pure functions over `rtc.Participant` fields (name, identity, kind, attributes), so the rules are
stated once and tested without a room:

- a participant with the attribute `chorus.shared_mic=true`, or whose name or identity matches one
  of the configured `shared_mic_names` patterns, is a shared microphone: its voices are split into
  speakers (STT labels or the diarization stage);
- a SIP participant (a phone caller, `kind == SIP`) is named by its LiveKit name, else by its
  `sip.phoneNumber` attribute, else by its identity;
- anyone else is one speaker named by its LiveKit name (its identity when it has none);
- a track published with echo cancellation on (LiveKit's `TF_ECHO_CANCELLATION` track feature,
  which the client sets from its capture options) keeps most of the agent's reply out of it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from livekit import rtc
from livekit.rtc._proto.track_pb2 import AudioTrackFeature

from livekit_worker.config import SHARED_MIC_ATTRIBUTE

SIP_PHONE_ATTRIBUTE = "sip.phoneNumber"
_TRUE = {"true", "1", "yes", "on"}


@dataclass(frozen=True)
class Speaker:
    """How one participant's audio is attributed."""

    identity: str
    """The LiveKit identity: the Chorus participant id (stable across reconnects)."""
    name: str
    """The display name turns carry when the participant is one person."""
    shared_mic: bool
    sip: bool


def is_sip(participant: rtc.Participant) -> bool:
    return participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_SIP


def is_shared_mic(participant: rtc.Participant, patterns: Sequence[str] = ()) -> bool:
    """Marked by attribute, or matched by a configured name pattern (case-insensitive)."""
    if participant.attributes.get(SHARED_MIC_ATTRIBUTE, "").strip().lower() in _TRUE:
        return True
    names = [n.lower() for n in (participant.name, participant.identity) if n]
    return any(fnmatch.fnmatchcase(n, p.lower()) for p in patterns for n in names)


def display_name(participant: rtc.Participant) -> str:
    """LiveKit name; for a phone caller its number when it has no name; else the identity."""
    if participant.name.strip():
        return participant.name.strip()
    if is_sip(participant):
        phone = participant.attributes.get(SIP_PHONE_ATTRIBUTE, "").strip()
        if phone:
            return phone
    return participant.identity


def echo_cancelled(participant: rtc.Participant, track_sid: str) -> bool:
    """Whether the participant published this track with echo cancellation on."""
    publication = participant.track_publications.get(track_sid)
    return publication is not None and (
        AudioTrackFeature.TF_ECHO_CANCELLATION in publication.audio_features
    )


def speaker_of(participant: rtc.Participant, shared_mic_names: Sequence[str] = ()) -> Speaker:
    return Speaker(
        identity=participant.identity,
        name=display_name(participant),
        shared_mic=is_shared_mic(participant, shared_mic_names),
        sip=is_sip(participant),
    )
