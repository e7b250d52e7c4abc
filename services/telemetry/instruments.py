"""The instruments of each service, built only when telemetry is on.

Each service holds ``None`` instead of these objects when its telemetry is off, so the hot paths
pay one ``is None`` test and nothing else. When on, recording is per partition batch, never per
record, and as cheap as we could make it:

* per-topic counters (records and bytes appended, fetched) are :class:`RunningTotals`: plain
  ints bumped on the hot path (~0.1 us) and reported by an *observable* counter at collection
  time -- an SDK ``Counter.add`` costs ~5 us per call (measurement object, attribute hashing,
  locks), which was 11 us per append for two of them;
* gauges over state that already exists (log end offsets, log sizes, fetch-port counters, the
  coordinator's metadata cache, consumer lag) are observed at collection time: free;
* histograms (batch sizes, call durations) and spans are recorded directly: at most one span per
  append, one histogram point per partition batch or RPC.

Inputs are duck-typed (``logs.partitions()`` yielding objects with ``topic``, ``partition``,
``log_end_offset`` ...) so that ``services/`` imports no service package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.records import RECORD_BATCH_OVERHEAD, read_batch_header
from services.telemetry import names
from services.telemetry.lag import CONSUMER_LAG, ConsumerLagRegistry

#: Batch-size buckets (bytes): 1 KiB .. 16 MiB in powers of 4 (the gateway caps batches at 1 MiB
#: by default, max.message.bytes may allow more).
BATCH_BYTES_BUCKETS = (1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216)
BATCH_RECORDS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)


class _TopicAttributes(dict):
    """topic -> ``{"messaging.destination.name": topic}``, built once per topic."""

    def __missing__(self, topic: str) -> dict:
        value = self[topic] = {names.MESSAGING_DESTINATION_NAME: topic}
        return value


def _partition_attributes(topic: str, partition: int) -> dict:
    return {names.MESSAGING_DESTINATION_NAME: topic, names.MESSAGING_DESTINATION_PARTITION_ID: str(partition)}


class RunningTotals:
    """Monotonic sums per key, kept in plain ints and reported by an observable counter.

    ``add`` runs on the event loop; the callback runs on the exporter's thread and copies the
    dict first (``list(dict.items())`` does not release the GIL, so it never sees a half-made
    change; a value one add behind is fine for a counter).
    """

    def __init__(
        self, meter, name: str, *, unit: str, description: str, attributes: Callable[[object], dict]
    ) -> None:
        self._sums: dict = {}
        self._attributes = attributes
        meter.create_observable_counter(name, [self._observe], unit=unit, description=description)

    def add(self, key, amount: int) -> None:
        sums = self._sums
        sums[key] = sums.get(key, 0) + amount

    def _observe(self, options: CallbackOptions) -> list[Observation]:
        return [Observation(total, self._attributes(key)) for key, total in list(self._sums.items())]


# ---- storage node ------------------------------------------------------------------------------


class StorageNodeInstruments:
    """Append counters and span, fetch-port bytes, and per-partition log gauges of one node.

    ``logs`` is the node's LogManager (``partitions()``); ``fetch_stats()`` returns the fetch
    server's FetchStats (``sendfile_bytes``, ``copied_bytes``, ``requests``, ``errors``,
    ``connections``, ``connections_refused``, ``polls_cancelled``).
    """

    def __init__(self, telemetry, *, logs, fetch_stats: Callable[[], object]) -> None:
        self._tracer = telemetry.tracer
        self._logs = logs
        self._fetch_stats = fetch_stats
        topics = self._topics = _TopicAttributes()
        self._records_in = self._bytes_in = self._errors = self._bytes_out = None
        meter = telemetry.meter
        if meter is None:
            return
        self._records_in = RunningTotals(
            meter,
            names.STORAGE_APPENDED_RECORDS,
            unit="{record}",
            description="Records appended, per topic.",
            attributes=topics.__getitem__,
        )
        self._bytes_in = RunningTotals(
            meter,
            names.STORAGE_APPENDED_BYTES,
            unit="By",
            description="Record batch bytes appended, per topic.",
            attributes=topics.__getitem__,
        )
        self._errors = RunningTotals(
            meter,
            names.STORAGE_APPEND_ERRORS,
            unit="{append}",
            description="Appends of a partition's batches that failed, per topic and reason.",
            attributes=lambda key: {names.MESSAGING_DESTINATION_NAME: key[0], names.ERROR_TYPE: key[1]},
        )
        self._bytes_out = RunningTotals(
            meter,
            names.STORAGE_FETCHED_BYTES,
            unit="By",
            description="Bytes served by the fetch port, per topic.",
            attributes=topics.__getitem__,
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_SENDFILE_BYTES,
            [self._stat("sendfile_bytes")],
            unit="By",
            description="Bytes the fetch port sent with os.sendfile (zero-copy).",
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_COPIED_BYTES,
            [self._stat("copied_bytes")],
            unit="By",
            description="Bytes the fetch port sent through read+send (fetch_zero_copy=false).",
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_REQUESTS,
            [self._stat("requests")],
            unit="{request}",
            description="Fetch requests served by the fetch port.",
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_ERRORS,
            [self._stat("errors")],
            unit="{request}",
            description="Fetch-port requests answered with an error.",
        )
        meter.create_observable_up_down_counter(
            names.STORAGE_FETCH_CONNECTIONS,
            [self._stat("connections")],
            unit="{connection}",
            description="Open fetch-port connections.",
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_CONNECTIONS_REFUSED,
            [self._stat("connections_refused")],
            unit="{connection}",
            description="Fetch-port connections refused at a connection cap.",
        )
        meter.create_observable_counter(
            names.STORAGE_FETCH_POLLS_CANCELLED,
            [self._stat("polls_cancelled")],
            unit="{request}",
            description="Fetch-port long polls ended because their client disconnected.",
        )
        for name, attribute, unit, description in (
            (names.STORAGE_LOG_END_OFFSET, "log_end_offset", "{offset}", "Next offset to be written."),
            (names.STORAGE_LOG_START_OFFSET, "log_start_offset", "{offset}", "First offset still kept."),
            (names.STORAGE_LOG_SIZE, "size_in_bytes", "By", "Bytes of segment data."),
            (names.STORAGE_LOG_SEGMENTS, "segment_count", "{segment}", "Segments on disk."),
        ):
            meter.create_observable_gauge(
                name,
                [self._per_partition(attribute)],
                unit=unit,
                description=f"{description} Per hosted partition.",
            )

    def _stat(self, attribute: str):
        def observe(options: CallbackOptions) -> list[Observation]:
            return [Observation(getattr(self._fetch_stats(), attribute))]

        return observe

    def _per_partition(self, attribute: str):
        def observe(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(getattr(log, attribute), _partition_attributes(log.topic, log.partition))
                for log in self._logs.partitions()
                if not log.closed
            ]

        return observe

    def start_append(self, topic: str, partition: int, size: int):
        """The span around one partition's append (a child of the Append server span), or None."""
        if self._tracer is None:
            return None
        return self._tracer.start_span(
            f"{names.SPAN_STORAGE_APPEND} {topic}",
            kind=SpanKind.INTERNAL,
            attributes={
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_DESTINATION_NAME: topic,
                names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                names.MESSAGING_OPERATION_NAME: names.SPAN_STORAGE_APPEND,
                names.ATTR_BATCH_BYTES: size,
            },
        )

    def end_append(self, span, topic: str, size: int, result) -> None:
        """Count an append's outcome (``result``: an AppendResult) and end its span."""
        error = result.error
        if self._records_in is not None:
            if error is None:
                self._records_in.add(topic, result.record_count)
                self._bytes_in.add(topic, size)
            else:
                self._errors.add((topic, error.reason), 1)
        if span is None:
            return
        if error is None:
            span.set_attributes(
                {
                    names.MESSAGING_BATCH_MESSAGE_COUNT: result.record_count,
                    names.ATTR_BASE_OFFSET: result.base_offset,
                    names.ATTR_LAST_OFFSET: result.last_offset,
                }
            )
        else:
            span.set_attributes({names.ERROR_TYPE: error.reason, names.ATTR_ERROR_REASON: error.reason})
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

    def fetched(self, topic: str, size: int) -> None:
        """Bytes the fetch port sent for ``topic`` (one response)."""
        if self._bytes_out is not None and size:
            self._bytes_out.add(topic, size)


# ---- gateway -----------------------------------------------------------------------------------


def count_records(data) -> int:
    """Records in concatenated batches, from their headers alone (stops at the first bad one;
    the storage node is the one that validates)."""
    total = pos = 0
    end = len(data)
    while end - pos >= RECORD_BATCH_OVERHEAD:
        header = read_batch_header(data, pos)
        if header.batch_length <= 0:
            break
        total += max(header.record_count, 0)
        pos += header.size_in_bytes
    return total


class GatewayInstruments:
    """Produce batch sizes, what Fetch returned, and spans around fetch-port reads."""

    def __init__(self, telemetry) -> None:
        self._tracer = telemetry.tracer
        self._topics = _TopicAttributes()
        self._batch_records = self._batch_bytes = self._records_out = self._bytes_out = None
        meter = telemetry.meter
        if meter is None:
            return
        self._batch_records = meter.create_histogram(
            names.GATEWAY_PRODUCE_BATCH_RECORDS,
            unit="{record}",
            description="Records per partition batch sent by a produce, per topic.",
            explicit_bucket_boundaries_advisory=BATCH_RECORDS_BUCKETS,
        )
        self._batch_bytes = meter.create_histogram(
            names.GATEWAY_PRODUCE_BATCH_SIZE,
            unit="By",
            description="Bytes per partition batch sent by a produce, per topic.",
            explicit_bucket_boundaries_advisory=BATCH_BYTES_BUCKETS,
        )
        self._records_out = RunningTotals(
            meter,
            names.GATEWAY_FETCHED_RECORDS,
            unit="{record}",
            description="Records (offsets) returned by Fetch, per topic.",
            attributes=self._topics.__getitem__,
        )
        self._bytes_out = RunningTotals(
            meter,
            names.GATEWAY_FETCHED_BYTES,
            unit="By",
            description="Record batch bytes returned by Fetch, per topic.",
            attributes=self._topics.__getitem__,
        )

    def produce_planned(self, topic: str, payloads: Iterable) -> None:
        """One observation per partition payload (``data``, ``record_indexes``) of a produce;
        the totals go on the current (Produce server) span as messaging attributes."""
        records_total = bytes_total = 0
        attributes = self._topics[topic]
        for payload in payloads:
            records = len(payload.record_indexes) or count_records(payload.data)
            size = len(payload.data)
            records_total += records
            bytes_total += size
            if self._batch_records is not None:
                self._batch_records.record(records, attributes)
                self._batch_bytes.record(size, attributes)
        if self._tracer is not None:
            span = trace.get_current_span()
            if span.is_recording():
                span.set_attributes(
                    {
                        names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                        names.MESSAGING_OPERATION_TYPE: "send",
                        names.MESSAGING_DESTINATION_NAME: topic,
                        names.MESSAGING_BATCH_MESSAGE_COUNT: records_total,
                        names.ATTR_BATCH_BYTES: bytes_total,
                    }
                )

    def fetched(self, topic: str, records: int, size: int) -> None:
        if self._records_out is not None and (records or size):
            self._records_out.add(topic, records)
            self._bytes_out.add(topic, size)

    def start_fetch_port_read(self, topic: str, partition: int, host: str, port: int):
        """A CLIENT span around one fetch-port request (that protocol carries no trace context)."""
        if self._tracer is None:
            return None
        return self._tracer.start_span(
            f"{names.SPAN_FETCH_PORT} {topic}",
            kind=SpanKind.CLIENT,
            attributes={
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_TYPE: "receive",
                names.MESSAGING_OPERATION_NAME: names.SPAN_FETCH_PORT,
                names.MESSAGING_DESTINATION_NAME: topic,
                names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                names.SERVER_ADDRESS: host,
                names.SERVER_PORT: port,
            },
        )

    @staticmethod
    def end_fetch_port_read(span, size: int, error=None) -> None:
        if span is None:
            return
        span.set_attribute(names.ATTR_BATCH_BYTES, size)
        if error is not None:
            reason = getattr(error, "reason", type(error).__name__)
            span.set_attributes({names.ERROR_TYPE: reason, names.ATTR_ERROR_REASON: reason})
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()


# ---- coordinator -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ClusterHealth:
    """What the coordinator's gauges show, computed from its metadata cache at collection time."""

    controller_epoch: int = 0
    live_brokers: int = 0
    #: Partitions by state: ``online``, ``offline``, ``pending``.
    partitions: Mapping[str, int] = field(default_factory=dict)
    under_replicated: int = 0
    #: Online partitions whose ISR is smaller than their topic's min.insync.replicas.
    under_min_isr: int = 0
    #: Unclean leader elections this coordinator made (records may have been lost).
    unclean_elections: int = 0


#: How long one computed ClusterHealth serves the gauges of a collection.
_HEALTH_REUSE_S = 0.5


class CoordinatorInstruments:
    """Controller and partition-availability gauges, and the consumer-lag gauge.

    ``is_active()`` says whether this coordinator is the active controller; ``cluster_health()``
    computes a :class:`ClusterHealth` from the metadata cache. Both run on the exporter's thread
    and must only read.
    """

    def __init__(
        self,
        telemetry,
        *,
        coordinator_id: str,
        is_active: Callable[[], bool],
        cluster_health: Callable[[], ClusterHealth],
        consumer_lag: ConsumerLagRegistry = CONSUMER_LAG,
    ) -> None:
        meter = telemetry.meter
        if meter is None:
            return
        self._is_active = is_active
        self._compute_health = cluster_health
        self._health_at = -1.0
        self._health_value = ClusterHealth()
        self._lag = consumer_lag
        identity = {names.ATTR_COORDINATOR_ID: coordinator_id}
        meter.create_observable_gauge(
            names.COORDINATOR_CONTROLLER_ACTIVE,
            [lambda options: [Observation(1 if self._is_active() else 0, identity)]],
            unit="{controller}",
            description="1 on the active controller, 0 on standbys.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_CONTROLLER_EPOCH,
            [lambda options: [Observation(self._health().controller_epoch)]],
            unit="{epoch}",
            description="The controller epoch in the metadata cache.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_BROKERS_LIVE,
            [lambda options: [Observation(self._health().live_brokers)]],
            unit="{node}",
            description="Storage nodes holding a registration lease.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS,
            [self._observe_partitions],
            unit="{partition}",
            description="Partitions by state (online, offline, pending).",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_OFFLINE,
            [lambda options: [Observation(self._health().partitions.get("offline", 0))]],
            unit="{partition}",
            description="Partitions without a live leader.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_UNDER_REPLICATED,
            [lambda options: [Observation(self._health().under_replicated)]],
            unit="{partition}",
            description="Partitions with fewer in-sync replicas than replicas.",
        )
        meter.create_observable_gauge(
            names.COORDINATOR_PARTITIONS_UNDER_MIN_ISR,
            [lambda options: [Observation(self._health().under_min_isr)]],
            unit="{partition}",
            description="Partitions whose ISR is smaller than min.insync.replicas (acks=all refused).",
        )
        meter.create_observable_counter(
            names.COORDINATOR_UNCLEAN_ELECTIONS,
            [lambda options: [Observation(self._health().unclean_elections, identity)]],
            unit="{election}",
            description="Leader elections that gave the lead to an out-of-sync replica (data loss).",
        )
        meter.create_observable_gauge(
            names.CONSUMER_LAG,
            [self._observe_lag],
            unit="{record}",
            description="Log end offset minus committed offset, per group and partition.",
        )

    def _health(self) -> ClusterHealth:
        """Computed once per collection (several gauges read it within milliseconds)."""
        now = time.monotonic()
        if now - self._health_at > _HEALTH_REUSE_S:
            self._health_value = self._compute_health()
            self._health_at = now
        return self._health_value

    def _observe_partitions(self, options: CallbackOptions) -> list[Observation]:
        counts = self._health().partitions
        return [
            Observation(counts.get(state, 0), {names.ATTR_PARTITION_STATE: state})
            for state in ("online", "offline", "pending")
        ]

    def _observe_lag(self, options: CallbackOptions) -> list[Observation]:
        return [
            Observation(
                lag, {names.MESSAGING_CONSUMER_GROUP_NAME: group, **_partition_attributes(topic, partition)}
            )
            for group, topic, partition, lag in self._lag.samples()
        ]


# ---- SDK (messaging client) --------------------------------------------------------------------


#: messaging.operation.name -> messaging.operation.type for the SDK's operations.
_OPERATION_TYPES = {
    "send": "send",
    "produce": "send",
    "poll": "receive",
    "fetch": "receive",
    "receive": "receive",
    "commit": "settle",
}


class ClientInstruments:
    """The messaging client conventions, for the SDK's producer and consumer (see ``__init__``)."""

    def __init__(self, meter, *, server_address: str = "", server_port: int | None = None) -> None:
        self._set_peer(server_address, server_port)
        self._sent = meter.create_counter(
            names.MESSAGING_CLIENT_SENT_MESSAGES,
            unit="{message}",
            description="Number of messages producer attempted to send to the broker.",
        )
        self._consumed = meter.create_counter(
            names.MESSAGING_CLIENT_CONSUMED_MESSAGES,
            unit="{message}",
            description="Number of messages that were delivered to the application.",
        )
        self._duration = meter.create_histogram(
            names.MESSAGING_CLIENT_OPERATION_DURATION,
            unit="s",
            description="Duration of messaging operation initiated by a producer or consumer client.",
            explicit_bucket_boundaries_advisory=(
                0.005,
                0.01,
                0.025,
                0.05,
                0.075,
                0.1,
                0.25,
                0.5,
                0.75,
                1.0,
                2.5,
                5.0,
                7.5,
                10.0,
            ),
        )

    def _set_peer(self, server_address: str, server_port: int | None) -> None:
        self._peer = {names.SERVER_ADDRESS: server_address} if server_address else {}
        if server_port is not None and server_address:
            self._peer[names.SERVER_PORT] = server_port
        self._attributes: dict[tuple, dict] = {}

    def with_peer(self, server_address: str = "", server_port: int | None = None) -> ClientInstruments:
        """The same instruments, recording another ``server.address``/``server.port``."""
        other = object.__new__(ClientInstruments)
        other._sent, other._consumed, other._duration = self._sent, self._consumed, self._duration
        other._set_peer(server_address, server_port)
        return other

    def _attrs(
        self, operation: str, topic: str, partition: int | None, group: str | None, error_type: str | None
    ) -> dict:
        key = (operation, topic, partition, group, error_type)
        attributes = self._attributes.get(key)
        if attributes is None:
            attributes = {
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_NAME: operation,
                names.MESSAGING_DESTINATION_NAME: topic,
                **self._peer,
            }
            if operation in _OPERATION_TYPES:
                attributes[names.MESSAGING_OPERATION_TYPE] = _OPERATION_TYPES[operation]
            if partition is not None:
                attributes[names.MESSAGING_DESTINATION_PARTITION_ID] = str(partition)
            if group:
                attributes[names.MESSAGING_CONSUMER_GROUP_NAME] = group
            if error_type:
                attributes[names.ERROR_TYPE] = error_type
            self._attributes[key] = attributes
        return attributes

    def sent(
        self,
        topic: str,
        count: int,
        *,
        partition: int | None = None,
        error_type: str | None = None,
        operation: str = "send",
    ) -> None:
        """``count`` messages of one produce request / batch were sent (or failed: ``error_type``)."""
        self._sent.add(count, self._attrs(operation, topic, partition, None, error_type))

    def consumed(
        self,
        topic: str,
        count: int,
        *,
        partition: int | None = None,
        group: str | None = None,
        operation: str = "poll",
    ) -> None:
        """``count`` messages were delivered to the application (once per delivery)."""
        self._consumed.add(count, self._attrs(operation, topic, partition, group, None))

    def operation_duration(
        self,
        seconds: float,
        *,
        operation: str,
        topic: str,
        partition: int | None = None,
        group: str | None = None,
        error_type: str | None = None,
    ) -> None:
        """How long one send (request until acknowledged) or one poll took."""
        self._duration.record(seconds, self._attrs(operation, topic, partition, group, error_type))

    @staticmethod
    def now() -> float:
        return time.perf_counter()
