"""Task blocks (rule G5): what a worker agent reads when another agent hands it work.

Owns `render_task_block`. A block is headed by who asked, in the room's labels, so the worker knows
whose request it serves without guessing from the wording:

- a person's request, forwarded as they wrote it: `Alice asked:`;
- a task an agent wrote on someone's behalf (its own words, not theirs): `Requested by Alice (2):`;
- a worker's own input (a task with nobody behind it): no header, it names no one.

The task's lines follow the header as JSON strings, one per line (C2), with copies of runtime marks
neutralized (E3): a `Bob asked:` or a `</task>` inside the text is plainly part of a string, never
a header or the end of the block. The requester is given as a label the engine produced
(`label_for`: `Alice`, `Alice (2)`, `@sms1`), never a raw name, so it reads exactly as the same
person reads everywhere else.
"""

from __future__ import annotations

from attribution.render import json_line, neutralize_marks

TASK_OPEN = "<task>"
TASK_CLOSE = "</task>"


def _check_label(requester: str) -> str:
    label = requester.strip()
    if not label:
        raise ValueError("requester must be a non-empty label")
    if any(ch in label for ch in "\r\n\u2028\u2029\x85\x0b\x0c") or not label.isprintable():
        raise ValueError(f"requester {requester!r} is not a one-line label")
    return label


def render_task_block(
    task: str, requester: str | None = None, *, written_by_agent: bool = False
) -> str:
    """G5: `task` as a `<task>` block headed by who asked.

    `requester` is the label of the person (or channel) the task serves; None for a worker's own
    input. `written_by_agent=False` means `task` is the requester's own words (`Alice asked:`);
    True means an agent wrote it for them (`Requested by Alice (2):`).

    >>> print(render_task_block("Book the room.\\nTuesday, please.", "Alice"))
    <task>
    Alice asked:
    "Book the room."
    "Tuesday, please."
    </task>
    """
    if not task.strip():
        raise ValueError("a task needs some text")
    lines = [TASK_OPEN]
    if requester is not None:
        label = _check_label(requester)
        lines.append(f"Requested by {label}:" if written_by_agent else f"{label} asked:")
    text = neutralize_marks(task)
    lines.extend(json_line(line) for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))
    lines.append(TASK_CLOSE)
    return "\n".join(lines)
