"""Prometheus metrics for `/metrics`, through `prometheus_client`: streams, turns, replies,
refusals, feed drops, the queued channels' deliveries, the turn-latency histogram, and the load
(the diarization stage's lag and what overload did about it, the CPU, the load figure of
`server.load`).

Owns the counters the server keeps about itself. The server updates plain integers on its one
event loop (no locks, nothing to register per increment); a per-server `CollectorRegistry` turns
them into metric families at scrape time through a custom collector, and the turn latency is a
real `prometheus_client.Histogram`. One registry per server, so two servers in one process (tests,
benchmarks) never share or collide on metrics, and the output is whatever Prometheus' own client
writes — parseable by Prometheus' own parser.

Turn latency is measured where a user feels it: from the moment the server had received the audio
up to a turn's end, to the moment the turn was committed to the room; reply latency from the same
moment of a turn that asked the realtime model, to the reply's first audio.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from realtime import SessionCounts
from rooms import ChannelDeliveryStats
from server.load import Load, load_figure
from server.overload import StageLoad

LATENCY_BUCKETS_S: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
STREAM_KINDS = ("device", "twilio", "audiosocket", "sip")
MAX_SAMPLES = 100_000


class LatencyHistogram:
    """A latency histogram (the turns' by default), plus the raw samples (bounded) so tests and
    the load benchmark can read percentiles exactly."""

    def __init__(
        self,
        registry: CollectorRegistry,
        name: str = "chorus_turn_latency_seconds",
        help_text: str = "From receiving the audio up to a turn's end to committing the turn.",
    ) -> None:
        self._histogram = Histogram(name, help_text, buckets=LATENCY_BUCKETS_S, registry=registry)
        self.samples: list[float] = []
        self.count = 0

    def observe(self, value: float) -> None:
        self._histogram.observe(value)
        self.count += 1
        if len(self.samples) < MAX_SAMPLES:
            self.samples.append(value)


class ServerMetrics(Collector):
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.streams_active: dict[str, int] = defaultdict(int)
        self.streams_total: dict[str, int] = defaultdict(int)
        self.refused_total: dict[str, int] = defaultdict(int)
        self.turns_total = 0
        self.turn_corrections_total = 0
        self.replies_total = 0
        self.speaker_changes_total = 0
        self.dtmf_total = 0
        self.barge_ins_total: dict[str, int] = defaultdict(int)
        """Someone talking over a reply (which was stopped), by stream kind."""
        self.audio_seconds_total = 0.0
        self.feed_consumers = 0
        self.rooms_evicted_total = 0
        self.feed_dropped_total = 0
        self.stream_messages_dropped_total = 0
        self.stt_outages_total = 0
        self.stt_recoveries_total = 0
        self.stt_audio_lost_seconds_total = 0.0
        self.stt_stream_errors_total = 0
        self.stt_refused_total = 0
        self.assistant_outages_total = 0
        """Times a model of a room (the realtime session, the agent, the chat model) was away
        (`assistant_status` unavailable)."""
        self.diarization_fallbacks_total = 0
        self.diarization_recoveries_total = 0
        self.rooms = 0
        self.second_pass: Callable[[], dict[str, int] | None] = lambda: None
        """What the live second pass did with the turns (`SecondPassStats.as_dict`), read at
        scrape time; None when it is off."""
        self.realtime: Callable[[], SessionCounts | None] = lambda: None
        """What the rooms' realtime sessions went through (`RealtimeChannel.session_counts`)."""
        self.voice_turns: Callable[[], tuple[int, int] | None] = lambda: None
        """(unmatched, claimed): turns of directory-named voices that read their letter
        (`[voices] verify`), and turns that read another voice's person (`[voices] claim`),
        read at scrape time; None when the voice directory is off."""
        self.stage_load: Callable[[], StageLoad | None] = lambda: None
        """The pipeline's stage load (`Pipeline.stage_load`), read at scrape time."""
        self.load: Callable[[], Load] = lambda: load_figure(stage=0.0, streams=0,
                                                            max_streams=1, cpu=0.0)
        """The server's load figure (`server.load`), read at scrape time; the server sets it."""
        self.delivery: Callable[[], dict[str, ChannelDeliveryStats]] = dict
        """The room kit's queued channels' counters (`RoomKit.delivery_stats`), read at scrape
        time; the server sets it to its kit's."""
        self.turn_latency = LatencyHistogram(self.registry)
        self.reply_latency = LatencyHistogram(
            self.registry, "chorus_reply_latency_seconds",
            "From receiving the audio up to the end of a turn that asked the room's realtime "
            "model, to its reply's first audio reaching the room's streams.",
        )  # fmt: skip
        """What a person who asks feels (voice to voice): the asking turn's own latency plus the
        model's time to its first audio (`first_audio_ms` of the reply)."""
        self.registry.register(self)

    def collect(self) -> Iterator[Metric]:
        """The metric families at scrape time (called by the registry)."""
        yield _gauge("chorus_rooms", "Rooms the server holds (idle ones are evicted).", self.rooms)
        yield _counter(
            "chorus_rooms_evicted",
            "Rooms evicted after limits.idle_room_seconds without a stream or feed consumer.",
            self.rooms_evicted_total,
        )
        streams = GaugeMetricFamily(
            "chorus_streams", "Audio streams open now, by kind (device, twilio, audiosocket, sip).", labels=["kind"]
        )
        started = CounterMetricFamily(
            "chorus_streams", "Audio streams started, by kind.", labels=["kind"]
        )
        for kind in STREAM_KINDS:
            streams.add_metric([kind], self.streams_active[kind])
            started.add_metric([kind], self.streams_total[kind])
        yield streams
        yield started
        refused = CounterMetricFamily(
            "chorus_refused",
            "Connections closed for a protocol or auth error, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(self.refused_total.items()):
            refused.add_metric([reason], n)
        yield refused
        yield _counter("chorus_turns", "Speaker turns committed.", self.turns_total)
        yield _counter(
            "chorus_turn_corrections",
            "Early voice turns corrected in place (re-sent with corrected: true).",
            self.turn_corrections_total,
        )
        yield _counter(
            "chorus_speaker_changes", "Speaker changes seen.", self.speaker_changes_total
        )
        yield _counter("chorus_dtmf", "DTMF digits pressed on phone legs.", self.dtmf_total)
        barge_ins = CounterMetricFamily(
            "chorus_barge_ins",
            "Someone talking over a reply, which was stopped, by the stream's kind (a device says "
            "so; a phone leg's barge-in is heard by the server).",
            labels=["kind"],
        )
        for kind in STREAM_KINDS:
            barge_ins.add_metric([kind], self.barge_ins_total[kind])
        yield barge_ins
        yield _counter("chorus_replies", "Assistant replies committed.", self.replies_total)
        yield _counter(
            "chorus_audio_seconds", "Seconds of audio received.", self.audio_seconds_total
        )
        yield _gauge(
            "chorus_feed_consumers", "Event-feed consumers connected.", self.feed_consumers
        )
        yield _counter(
            "chorus_feed_dropped",
            "Event-feed consumers dropped for lagging.",
            self.feed_dropped_total,
        )
        yield _counter(
            "chorus_stream_messages_dropped",
            "Messages to a device or phone leg dropped because it stopped reading.",
            self.stream_messages_dropped_total,
        )
        yield _counter(
            "chorus_stt_outages",
            "Times a stream's STT connection dropped (the stream reconnects and resends).",
            self.stt_outages_total,
        )
        yield _counter(
            "chorus_stt_recoveries",
            "Times a stream's STT connection came back after an outage.",
            self.stt_recoveries_total,
        )
        yield _counter(
            "chorus_stt_audio_lost_seconds",
            "Seconds of stream audio never transcribed (an outage outlasted the carry-over buffer).",
            self.stt_audio_lost_seconds_total,
        )
        yield _counter(
            "chorus_stt_stream_errors",
            "Streams whose STT ended for good (could not connect, or gave up).",
            self.stt_stream_errors_total,
        )
        yield _counter(
            "chorus_stt_refused",
            "Streams whose STT service refused the credentials or permission (HTTP 401/403; "
            "final, never retried).",
            self.stt_refused_total,
        )
        yield _counter(
            "chorus_assistant_outages",
            "Times a model of a room (the realtime session, the agent, the chat model) was away: "
            "its provider refused or could not be reached, its process exited, or its call "
            "failed.",
            self.assistant_outages_total,
        )
        counts = self.realtime()
        if counts is not None:
            yield from _realtime_families(counts)
        outcomes = self.second_pass()
        if outcomes is not None:
            second = CounterMetricFamily(
                "chorus_second_pass",
                "Committed turns the live second pass was given, by outcome: corrected (in "
                "place), same, skipped_behind (it was behind), skipped_edited (a hook's edit), "
                "stale (revised meanwhile), failed.",
                labels=["outcome"],
            )
            for outcome, n in outcomes.items():
                second.add_metric([outcome], n)
            yield second
        checked = self.voice_turns()
        if checked is not None:
            yield _counter(
                "chorus_voice_turns_unmatched",
                "Turns of voices the voice directory named that did not sound like the person "
                "([voices] verify), or were too short to print, and read the voice's letter (or "
                "a claimed name).",
                checked[0],
            )
            yield _counter(
                "chorus_voice_turns_claimed",
                "Turns that sounded like a person named for another voice of their stream "
                "([voices] claim), or a remembered person named for none of its voices "
                "(claim_new), and read that person's name.",
                checked[1],
            )
        yield from _delivery_families(self.delivery())
        yield from self._load_families()

    def _load_families(self) -> Iterator[Metric]:
        load = self.load()
        yield _gauge(
            "chorus_load",
            "The server's load, 0..1: the largest of the stage's, the streams' and the CPU's "
            "shares (a load balancer stops sending work near 1; docs/server.md).",
            load.load,
        )
        parts = GaugeMetricFamily(
            "chorus_load_part", "The parts of chorus_load, 0..1, by part.", labels=["part"]
        )
        for part, value in (("stage", load.stage), ("streams", load.streams), ("cpu", load.cpu)):
            parts.add_metric([part], value)
        yield parts
        stage = self.stage_load()
        if stage is None:
            return
        yield _gauge(
            "chorus_diarization_lag_seconds",
            "The largest lag of a stream on the diarization stage: seconds of its audio whose "
            "stage answer is not back yet.",
            stage.lag_s,
        )
        modes = GaugeMetricFamily(
            "chorus_diarization_streams",
            "Shared-mic stage streams by mode: stage, stretched (on the stage, step stretched), "
            "fallback (speakers from the STT).",
            labels=["mode"],
        )
        modes.add_metric(["stage"], stage.on_stage - stage.stretched)
        modes.add_metric(["stretched"], stage.stretched)
        modes.add_metric(["fallback"], stage.fallback)
        yield modes
        yield _gauge(
            "chorus_diarization_admitting",
            "1 while new shared-mic streams are admitted to the stage, 0 while refused (4429).",
            1.0 if stage.admitting else 0.0,
        )
        yield _counter(
            "chorus_diarization_stretches",
            "Times a stream's diarization step was stretched (its lag passed stretch_lag_s).",
            stage.counts.stretches,
        )
        yield _counter(
            "chorus_diarization_fallbacks",
            "Times a stream left the diarization stage for the STT's labels (told: degraded).",
            self.diarization_fallbacks_total,
        )
        yield _counter(
            "chorus_diarization_recoveries",
            "Times a stream came back to the diarization stage (told: recovered).",
            self.diarization_recoveries_total,
        )

    def render(self, rooms: int) -> str:
        """The Prometheus text exposition of every metric of this server."""
        self.rooms = rooms
        return generate_latest(self.registry).decode()


def _delivery_families(stats: dict[str, ChannelDeliveryStats]) -> Iterator[Metric]:
    """A queued channel's deliveries (the chat model: `rooms.kit`, issue 24.1): how many it took,
    failed or skipped (its queue was full), and how many wait now, by channel id."""
    deliveries = CounterMetricFamily(
        "chorus_channel_deliveries",
        "Events handed to a queued channel (the chat model) through its own queue, by channel and "
        "outcome: delivered, failed (it raised), dropped (skipped: the queue was full).",
        labels=["channel", "outcome"],
    )
    waiting = GaugeMetricFamily(
        "chorus_channel_deliveries_waiting",
        "Deliveries waiting in a queued channel's queues now, over all rooms, by channel.",
        labels=["channel"],
    )
    for channel_id, counts in sorted(stats.items()):
        deliveries.add_metric([channel_id, "delivered"], counts.delivered)
        deliveries.add_metric([channel_id, "failed"], counts.failed)
        deliveries.add_metric([channel_id, "dropped"], counts.dropped)
        waiting.add_metric([channel_id], counts.waiting)
    yield deliveries
    yield waiting


REALTIME_COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("reconnects", "chorus_realtime_reconnects",
     "Realtime model connections opened after a room's first: drops and renewals."),
    ("renewals", "chorus_realtime_renewals",
     "Realtime model connections renewed ahead of the end their provider announced."),
    ("refusals", "chorus_realtime_refusals",
     "Realtime model connects refused (or connections closed as refused) after the session had "
     "worked; each was tried again."),
    ("retried", "chorus_realtime_retried_responses",
     "Realtime responses that failed with nothing said and were asked for again."),
    ("audio_dropped_s", "chorus_realtime_audio_dropped_seconds",
     "Turn audio that waited too long for an away provider and went as its line alone."),
)  # fmt: skip
"""`SessionCounts` field, metric name, help: what `/metrics` says of the realtime sessions."""


def _realtime_families(counts: SessionCounts) -> Iterator[Metric]:
    for field_name, name, help_text in REALTIME_COUNTERS:
        yield _counter(name, help_text, float(getattr(counts, field_name)))


def _gauge(name: str, help_text: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, help_text, value=value)


def _counter(name: str, help_text: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, help_text, value=value)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)
