"""Prometheus text metrics for `/metrics`: streams, turns, replies, refusals, feed drops and the
turn-latency histogram.

Owns the counters the server keeps about itself. Written by hand (a few dozen lines) rather than
pulling in a client library: the server is one process with one event loop, so plain integers
updated on the loop need no locks, and the text format is small and stable.

Turn latency is measured where a user feels it: from the moment the server had received the audio
up to a turn's end, to the moment the turn was committed to the room.
"""

from __future__ import annotations

import bisect
from collections import defaultdict

LATENCY_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)


class Histogram:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.total = 0.0
        self.count = 0
        self.samples: list[float] = []
        """Kept (bounded) so tests and the load benchmark can read percentiles exactly."""

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1
        if len(self.samples) < 100_000:
            self.samples.append(value)

    def render(self, name: str, help_text: str) -> list[str]:
        lines = [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip(self.buckets, self.counts, strict=False):
            running += n
            lines.append(f'{name}_bucket{{le="{bound}"}} {running}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.count}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.count}")
        return lines


class ServerMetrics:
    def __init__(self) -> None:
        self.streams_active: dict[str, int] = defaultdict(int)
        self.streams_total: dict[str, int] = defaultdict(int)
        self.refused_total: dict[str, int] = defaultdict(int)
        self.turns_total = 0
        self.replies_total = 0
        self.speaker_changes_total = 0
        self.audio_seconds_total = 0.0
        self.feed_consumers = 0
        self.rooms_evicted_total = 0
        self.feed_dropped_total = 0
        self.stream_messages_dropped_total = 0
        self.turn_latency = Histogram()

    def render(self, rooms: int) -> str:
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str) -> None:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")

        family("chorus_rooms", "gauge", "Rooms the server holds (idle ones are evicted).")
        lines.append(f"chorus_rooms {rooms}")
        family(
            "chorus_rooms_evicted_total",
            "counter",
            "Rooms evicted after limits.idle_room_seconds without a stream or feed consumer.",
        )
        lines.append(f"chorus_rooms_evicted_total {self.rooms_evicted_total}")
        family("chorus_streams", "gauge", "Audio streams open now, by kind (device, twilio).")
        for kind in ("device", "twilio"):
            lines.append(f'chorus_streams{{kind="{kind}"}} {self.streams_active[kind]}')
        family("chorus_streams_total", "counter", "Audio streams started, by kind.")
        for kind in ("device", "twilio"):
            lines.append(f'chorus_streams_total{{kind="{kind}"}} {self.streams_total[kind]}')
        family(
            "chorus_refused_total", "counter", "Connections closed for a protocol or auth error."
        )
        for reason, n in sorted(self.refused_total.items()):
            lines.append(f'chorus_refused_total{{reason="{reason}"}} {n}')
        family("chorus_turns_total", "counter", "Speaker turns committed.")
        lines.append(f"chorus_turns_total {self.turns_total}")
        family("chorus_speaker_changes_total", "counter", "Speaker changes seen.")
        lines.append(f"chorus_speaker_changes_total {self.speaker_changes_total}")
        family("chorus_replies_total", "counter", "Assistant replies committed.")
        lines.append(f"chorus_replies_total {self.replies_total}")
        family("chorus_audio_seconds_total", "counter", "Seconds of audio received.")
        lines.append(f"chorus_audio_seconds_total {self.audio_seconds_total:.3f}")
        family("chorus_feed_consumers", "gauge", "Event-feed consumers connected.")
        lines.append(f"chorus_feed_consumers {self.feed_consumers}")
        family("chorus_feed_dropped_total", "counter", "Event-feed consumers dropped for lagging.")
        lines.append(f"chorus_feed_dropped_total {self.feed_dropped_total}")
        family(
            "chorus_stream_messages_dropped_total",
            "counter",
            "Messages to a device or phone leg dropped because it stopped reading.",
        )
        lines.append(f"chorus_stream_messages_dropped_total {self.stream_messages_dropped_total}")
        lines += self.turn_latency.render(
            "chorus_turn_latency_seconds",
            "From receiving the audio up to a turn's end to committing the turn.",
        )
        return "\n".join(lines) + "\n"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
