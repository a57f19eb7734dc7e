"""Summaries (rule G4): the transcript a summarizer reads, and the context built around a summary.

Owns `render_summary_transcript`, `summary_labelling_on`, `render_summary` and
`render_summarized_context`. A summarizing memory folds older turns into a running summary written
by a model; that model reads who said what exactly as any other model does, and the model that later
reads the summary must not lose it:

- **The transcript.** With labelling on, every line of a turn reads `Alice: “…”`: the label outside
  the quote, the line inside it escaped as a JSON string's inside is (C2: `"` and `\\` escaped,
  control characters and line separators as JSON escapes, every other double-quote mark — `“` and
  `”` included — turned into `'`), so no line can close the quote early or open a new line with a
  name. The agent the summary is for reads `[assistant]`; another agent reads as the room labels it
  (`@ai2`); a runtime notice reads `[system]`. With labelling off (one speaker: a one-to-one
  conversation) the lines read `[user]: …` / `[assistant]: …`, every line prefixed. Copies of
  runtime marks are neutralized (E3) either way.
- **Labelling is decided together.** The count covers every turn the memory retrieved — summarized
  now or kept verbatim — and the people the summary already names (`summary_names`), so a summary
  naming Alice is never followed by an unlabelled `Alice: …` typed by someone else (A1 extended).
- **The summary in a context.** It rides a `system` message opening with `SUMMARY_MARK`, before the
  turns kept verbatim; the channel's system prompt is untouched (E1). The summary's text is model
  output and may quote participants, so runtime marks in it are neutralized too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from attribution.register import Register, label_for
from attribution.render import (
    LABELLED_METADATA,
    NOTE,
    SUMMARY_MARK,
    _attach_notes,
    _counts,
    _labelled_message,
    _turns,
    json_line,
    neutralize_marks,
    render_chat_context,
    render_plain_context,
)
from attribution.speakers import Participants, participant_list
from models import AIContext, AIMessage, RoomEvent

ASSISTANT_TAG = "[assistant]"
USER_TAG = "[user]"
SYSTEM_TAG = "[system]"
OPEN_QUOTE = "\u201c"
CLOSE_QUOTE = "\u201d"


def summary_speakers(
    turns: Iterable[RoomEvent],
    participants: Participants,
    register: Register,
    *,
    ai_channel_id: str,
) -> list[str]:
    """The labels of the speakers of `turns` (not the agent's own turns, not runtime notices), in
    order of first appearance: what a summary of these turns names."""
    people = participant_list(participants)
    seen: list[str] = []
    for event in turns:
        if _counts(event, ai_channel_id):
            label = label_for(event, people, register)
            if label not in seen:
                seen.append(label)
    return seen


def summary_labelling_on(
    summary_names: Iterable[str],
    turns: Iterable[RoomEvent],
    participants: Participants,
    register: Register,
    *,
    ai_channel_id: str,
) -> bool:
    """G4: two or more speakers among the people the summary names and every turn retrieved."""
    speakers = set(summary_names)
    speakers.update(summary_speakers(turns, participants, register, ai_channel_id=ai_channel_id))
    return len(speakers) >= 2


def quoted_line(line: str) -> str:
    """One line inside typographic quotes, escaped as a JSON string's inside (C2)."""
    return f"{OPEN_QUOTE}{json_line(line)[1:-1]}{CLOSE_QUOTE}"


def _split(text: str) -> list[str]:
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")


def render_summary_transcript(
    turns: Sequence[RoomEvent],
    participants: Participants,
    register: Register,
    *,
    ai_channel_id: str,
    labelled: bool,
) -> str:
    """G4: the lines a summarizer reads for `turns`, oldest first, one line per line of text.

    `labelled` comes from `summary_labelling_on` (the memory decides it over everything it holds).
    """
    people = participant_list(participants)
    out: list[str] = []
    for event in turns:
        text = neutralize_marks(event.text)
        if event.kind == "system":
            tag = SYSTEM_TAG
        elif event.source.channel_id == ai_channel_id:
            tag = ASSISTANT_TAG
        elif labelled:
            tag = label_for(event, people, register)
        else:
            tag = USER_TAG
        if labelled:
            out.extend(f"{tag}: {quoted_line(line)}" for line in _split(text))
        else:
            out.extend(f"{tag}: {line}" for line in (text.splitlines() or [""]))
    return "\n".join(out)


def render_summary(summary: str) -> str:
    """G4: a running summary as a model reads it: the runtime mark, then the summary's text
    (runtime marks inside it neutralized), closed by `]`."""
    return f"{SUMMARY_MARK} {neutralize_marks(summary.strip())}]"


def render_summarized_context(
    summary: str | None,
    summary_names: Iterable[str],
    window: Sequence[RoomEvent],
    trigger: RoomEvent | None,
    participants: Participants,
    register: Register,
    *,
    ai_channel_id: str,
    system_prompt: str | None = None,
    notes: Sequence[str] = (),
    attribution: bool = True,
) -> AIContext:
    """The chat context for a call whose older turns were folded into `summary` (G4).

    `window` is the turns kept verbatim; `summary_names` the people the summary names. Labelling
    is on when they together hold two or more speakers (and `attribution` is on); with no summary
    and no names this is exactly `render_chat_context` (or `render_plain_context` without
    attribution), so a memory that has folded nothing yet changes no byte (A2).
    """
    names = list(summary_names)
    if summary is None and not names:
        if attribution:
            return render_chat_context(
                window,
                trigger,
                participants,
                register,
                ai_channel_id=ai_channel_id,
                system_prompt=system_prompt,
                notes=notes,
            )
        return render_plain_context(
            window, trigger, ai_channel_id=ai_channel_id, system_prompt=system_prompt, notes=notes
        )
    people = participant_list(participants)
    turns = _turns(window, trigger)
    labelled = attribution and summary_labelling_on(
        names, turns, people, register, ai_channel_id=ai_channel_id
    )
    if labelled:
        messages = [_labelled_message(e, people, register, ai_channel_id) for e in turns]
        # The note explains labelled lines: with none kept (everything folded) there is none.
        has_user_turn = any(m.role == "user" for m in messages)
        _attach_notes(messages, turns, trigger, [*notes, NOTE] if has_user_turn else list(notes))
        metadata = dict(LABELLED_METADATA)
    else:
        plain = render_plain_context(window, trigger, ai_channel_id=ai_channel_id, notes=notes)
        messages = list(plain.messages)
        metadata = {}
    if summary is not None:
        messages.insert(0, AIMessage(role="system", content=render_summary(summary)))
    return AIContext(messages=messages, system_prompt=system_prompt, metadata=metadata)
