"""`Backoff`: the one connect/retry policy of every connection a channel holds (the STT stream
of a voice session, a realtime model session).

Why one policy, here: both reconnect to a provider that may be away for a while, and both must
neither hammer it nor give up on a live room because of a short outage. `rooms` is the package
both build on, so the policy lives here, with no I/O: callers sleep `delay(attempt)` and ask
`exhausted(attempts)`. The budget counts the attempts of one outage; callers start it afresh once
a connection is up, so many short outages never add up to giving up.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Backoff:
    """When to retry a connection: `first` seconds, times `factor` per failed attempt, at most
    `longest`. `attempts` bounds the attempts of one outage (None: retry as long as the stream
    lives). The budget starts afresh with every outage."""

    first: float = 0.1
    factor: float = 2.0
    longest: float = 2.0
    attempts: int | None = None

    def __post_init__(self) -> None:
        if self.first < 0 or self.factor < 1 or self.longest < self.first:
            raise ValueError(f"invalid backoff {self}")
        if self.attempts is not None and self.attempts < 1:
            raise ValueError("Backoff.attempts must be at least 1 (or None: no limit)")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number `attempt` (1-based)."""
        return float(min(self.longest, self.first * self.factor ** max(0, attempt - 1)))

    def exhausted(self, attempts: int) -> bool:
        return self.attempts is not None and attempts >= self.attempts
