"""Who spoke a turn (rules B1–B3) and which *source* that is (D2).

Owns `resolve_speaker`. The name comes, in this order, from
B1 `event.metadata["sender_name"]` (stamped at ingress: a transport, a host, the voice channel's
STT or diarization; shown per C6, ignored when nothing readable is left), then
B2 the room's participant record whose `id` (on a channel in its `connected_via`) or `identity_id`
(on any channel) equals `event.source.participant_id`, then
B3 nobody: the turn is labelled by its channel (`@channel_id`, C4).

The source (what takes a rank in the register, D2) is decided alongside the name:

- the turn resolves to a registered participant (B2) and either carries no `sender_name` or one
  that shows exactly as that participant's name -> the participant (`("participant", identity_id
  or id)`), the same source `register_participant` registered, so a participant keeps their rank
  whichever channel they speak on, and records that share an identity are one source (B2);
- the turn carries a `sender_name` that is not the matched participant's name -> a sender identity
  on the channel, `("sender", channel_id, participant_id or "", shown sender_name)`. The name is part
  of the identity because one stream can carry several voices: a voice channel stamps
  `Speaker A` / `Speaker B` with the stream's owner as `participant_id`, and those are two people.
  The same holds for a chat user who takes another person's name: that is another source (D4);
- no name at all -> `("channel", channel_id)`: the nameless sender, labelled `@channel_id`, takes
  no rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from attribution.names import shown_name
from models import Participant, RoomEvent

Participants = Iterable[Participant] | Mapping[str, Participant]
"""The room's participants, as a list or as a mapping by id (either is accepted)."""

ResolvedBy = Literal["sender_name", "participant", "channel"]


@dataclass(frozen=True)
class Speaker:
    """The resolved speaker of one turn.

    `name` is the shown name (C6) or None for a nameless sender; `source` is the unsalted source
    identity (never stored: the register keeps only its salted digest, D6).
    """

    name: str | None
    channel_id: str
    resolved_by: ResolvedBy
    source: tuple[str, ...]
    participant: Participant | None = None

    @property
    def nameless(self) -> bool:
        return self.name is None


def participant_list(participants: Participants) -> list[Participant]:
    if isinstance(participants, Mapping):
        return list(participants.values())
    return list(participants)


def match_participant(event: RoomEvent, participants: Participants) -> Participant | None:
    """B2: the participant the event's `participant_id` names on the event's channel.

    Candidates are the records whose `id` is the sender on a channel they are reached through,
    then those whose `identity_id` is the sender (on any channel). Several records of one person
    (a nameless record by id, a named one by identity) may match: the first with a readable name
    names the turn; only when none has one is the first candidate returned.
    """
    pid = event.source.participant_id
    if not pid:
        return None
    channel = event.source.channel_id
    people = participant_list(participants)
    candidates = [p for p in people if p.id == pid and channel in p.connected_via]
    candidates += [p for p in people if p.identity_id is not None and p.identity_id == pid]
    for candidate in candidates:
        if shown_name(candidate.display_name) is not None:
            return candidate
    return candidates[0] if candidates else None


def participant_source(participant: Participant) -> tuple[str, ...]:
    """The source identity of a registered participant: its `identity_id` when it has one (records
    that share an identity are one person, one source for ranks, B2/D2), else its own id."""
    return ("participant", participant.identity_id or participant.id)


def resolve_speaker(event: RoomEvent, participants: Participants) -> Speaker:
    """B1–B3: the speaker of `event`, and the source that takes its rank (see module docstring)."""
    channel = event.source.channel_id
    participant = match_participant(event, participants)
    participant_name = shown_name(participant.display_name) if participant else None
    raw = event.metadata.get("sender_name")
    sender_name = shown_name(raw) if isinstance(raw, str) else None
    if sender_name is not None:
        if participant is not None and sender_name == participant_name:
            return Speaker(
                sender_name, channel, "sender_name", participant_source(participant), participant
            )
        source = ("sender", channel, event.source.participant_id or "", sender_name)
        return Speaker(sender_name, channel, "sender_name", source, participant)
    if participant is not None and participant_name is not None:
        return Speaker(
            participant_name, channel, "participant", participant_source(participant), participant
        )
    return Speaker(None, channel, "channel", ("channel", channel), participant)
