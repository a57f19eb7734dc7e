"""The attribution engine: who said what, as every model reads it (spec: attribution.md, A–F).

Owns speaker resolution (B), shown names and labels (C4, C6, C7), look-alike groups and the room's
register of ranks (D), the note and runtime marks (E), and the renderers that hand a provider a
labelled conversation (A, C, E, F): `render_chat_context` for chat models, `render_line` for
realtime sessions (G1), `render_task_block` for task blocks handed to a worker agent (G5), and the
summary transcript and summarized contexts of summarizing memories (G4). Pure functions and plain data, no I/O: the caller (rooms) owns storage and
the room lock, and calls `register_participant` from `ensure_participant` and `commit_turn` for
every committed turn.

Imports only `models` (and pydantic, and the Unicode confusables data of `confusable-homoglyphs`).
"""

from attribution.confusables import reading_keys, reads_alike, skeleton
from attribution.names import MAX_NAME_CHARS, ROLE_WORDS, format_label, is_role_word, shown_name
from attribution.register import (
    AUTHOR_KEY,
    Register,
    RegisterEntry,
    commit_turn,
    label_for,
    nameless_label,
    rebuild_register,
    register_participant,
)
from attribution.render import (
    MARK_NOTICE,
    NOTE,
    NOTE_MARK,
    RUNTIME_MARKS,
    SUMMARY_MARK,
    json_line,
    labelled_lines,
    labelling_on,
    neutralize_marks,
    other_double_quotes,
    render_chat_context,
    render_line,
    render_plain_context,
)
from attribution.speakers import Participants, Speaker, match_participant, resolve_speaker
from attribution.summaries import (
    ASSISTANT_TAG,
    SYSTEM_TAG,
    USER_TAG,
    quoted_line,
    render_summarized_context,
    render_summary,
    render_summary_transcript,
    summary_labelling_on,
    summary_speakers,
)
from attribution.tasks import TASK_CLOSE, TASK_OPEN, render_task_block

__all__ = [
    "ASSISTANT_TAG",
    "AUTHOR_KEY",
    "MARK_NOTICE",
    "MAX_NAME_CHARS",
    "NOTE",
    "NOTE_MARK",
    "ROLE_WORDS",
    "RUNTIME_MARKS",
    "SUMMARY_MARK",
    "SYSTEM_TAG",
    "TASK_CLOSE",
    "TASK_OPEN",
    "USER_TAG",
    "Participants",
    "Register",
    "RegisterEntry",
    "Speaker",
    "commit_turn",
    "format_label",
    "is_role_word",
    "json_line",
    "label_for",
    "labelled_lines",
    "labelling_on",
    "match_participant",
    "nameless_label",
    "neutralize_marks",
    "other_double_quotes",
    "quoted_line",
    "reading_keys",
    "reads_alike",
    "rebuild_register",
    "register_participant",
    "render_chat_context",
    "render_line",
    "render_plain_context",
    "render_summarized_context",
    "render_summary",
    "render_summary_transcript",
    "render_task_block",
    "resolve_speaker",
    "shown_name",
    "skeleton",
    "summary_labelling_on",
    "summary_speakers",
]
