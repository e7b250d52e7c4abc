"""The storage node's instruments (built only when telemetry is on; see
:mod:`services.telemetry.metrics`): append counters and span, fetch-port bytes, log gauges."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable

from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.telemetry import names
from services.telemetry.metrics import RunningTotals, TopicAttributes, partition_attributes
from services.telemetry.rpc import extract_context


class StorageNodeInstruments:
    """Append counters and span, fetch-port bytes, and per-partition log gauges of one node.

    ``logs`` is the node's LogManager (``partitions()``); ``fetch_stats()`` returns the fetch
    server's FetchStats (``sendfile_bytes``, ``copied_bytes``, ``requests``, ``errors``,
    ``connections``, ``connections_refused``, ``polls_cancelled``); ``cleaner`` the node's
    LogCleaner (its rounds' bytes and durations, the dirty ratio of each compacted partition).
    """

    def __init__(
        self,
        telemetry,
        *,
        logs,
        fetch_stats: Callable[[], object],
        throttled_bytes: Callable[[], int] = lambda: 0,
        cleaner=None,
    ) -> None:
        self._tracer = telemetry.tracer
        self._logs = logs
        self._fetch_stats = fetch_stats
        topics = self._topics = TopicAttributes()
        self._records_in: RunningTotals | None = None
        self._bytes_in: RunningTotals | None = None
        self._errors: RunningTotals | None = None
        self._bytes_out: RunningTotals | None = None
        self._data_port_duration = None
        meter = telemetry.meter
        if meter is None:
            return
        self._data_port_duration = meter.create_histogram(
            names.STORAGE_DATA_PORT_APPEND_DURATION,
            unit="s",
            description="Data-port append requests, from read to answer.",
        )
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
        # The fetch port's FetchStats, observed at each collection (a gauge for open connections).
        for name, attribute, unit, description, up_down in (
            (
                names.STORAGE_FETCH_SENDFILE_BYTES,
                "sendfile_bytes",
                "By",
                "Bytes the fetch port sent with os.sendfile (zero-copy).",
                False,
            ),
            (
                names.STORAGE_FETCH_COPIED_BYTES,
                "copied_bytes",
                "By",
                "Bytes the fetch port sent through read+send (fetch_zero_copy=false, or TLS).",
                False,
            ),
            (
                names.STORAGE_FETCH_REQUESTS,
                "requests",
                "{request}",
                "Fetch requests served by the fetch port.",
                False,
            ),
            (
                names.STORAGE_FETCH_ERRORS,
                "errors",
                "{request}",
                "Fetch-port requests answered with an error.",
                False,
            ),
            (
                names.STORAGE_FETCH_CONNECTIONS,
                "connections",
                "{connection}",
                "Open fetch-port connections.",
                True,
            ),
            (
                names.STORAGE_FETCH_CONNECTIONS_REFUSED,
                "connections_refused",
                "{connection}",
                "Fetch-port connections refused at a connection cap.",
                False,
            ),
            (
                names.STORAGE_FETCH_POLLS_CANCELLED,
                "polls_cancelled",
                "{request}",
                "Fetch-port long polls ended because their client disconnected.",
                False,
            ),
            (
                names.STORAGE_FETCH_TLS_HANDSHAKES,
                "tls_handshakes",
                "{connection}",
                "TLS handshakes completed on the fetch port (internal TLS on).",
                False,
            ),
            (
                names.STORAGE_FETCH_TLS_HANDSHAKE_FAILURES,
                "tls_handshake_failures",
                "{connection}",
                "Fetch-port connections refused at the TLS handshake: no certificate of the "
                "cluster CA, not TLS, or gone before it ended.",
                False,
            ),
        ):
            create = meter.create_observable_up_down_counter if up_down else meter.create_observable_counter
            create(name, [self._stat(attribute)], unit=unit, description=description)
        meter.create_observable_counter(
            names.STORAGE_REPLICATION_THROTTLED_BYTES,
            [lambda options: [Observation(throttled_bytes())]],
            unit="By",
            description="Bytes this node's new replicas copied under a reassignment's throttle.",
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

        if cleaner is not None:
            self._observe_cleaner(meter, cleaner)

    def _observe_cleaner(self, meter, cleaner) -> None:
        read = meter.create_counter(
            names.STORAGE_CLEANER_BYTES_READ, unit="By", description="Bytes the log cleaner read, per topic."
        )
        written = meter.create_counter(
            names.STORAGE_CLEANER_BYTES_WRITTEN,
            unit="By",
            description="Bytes of cleaned segments the log cleaner swapped in, per topic.",
        )
        duration = meter.create_histogram(
            names.STORAGE_CLEANER_DURATION, unit="s", description="Log cleaner rounds, one partition each."
        )

        def cleaned(result) -> None:
            attributes = self._topics[result.topic]
            read.add(result.bytes_read, attributes)
            written.add(result.bytes_written, attributes)
            duration.record(result.duration_s, attributes)

        def dirty_ratios(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(ratio, partition_attributes(topic, partition))
                for (topic, partition), ratio in cleaner.dirty_ratios().items()
            ]

        cleaner.on_clean = cleaned
        meter.create_observable_gauge(
            names.STORAGE_CLEANER_DIRTY_RATIO,
            [dirty_ratios],
            unit="1",
            description="Uncleaned share of a compacted partition's cleanable bytes, as last seen.",
        )

    def _stat(self, attribute: str):
        def observe(options: CallbackOptions) -> list[Observation]:
            return [Observation(getattr(self._fetch_stats(), attribute))]

        return observe

    def _per_partition(self, attribute: str):
        def observe(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(getattr(log, attribute), partition_attributes(log.topic, log.partition))
                for log in self._logs.partitions()
                if not log.closed
            ]

        return observe

    def data_port_append_span(self, trace_context: Iterable[tuple[str, str]]):
        """A context manager: the SERVER span of one data-port append request, current while it
        is served (the partition appends' spans are its children), child of the sender's span
        named by the frame's trace context; does nothing without a tracer."""
        if self._tracer is None and self._data_port_duration is None:
            return contextlib.nullcontext()
        return self._observed_data_port_append(trace_context)

    @contextlib.contextmanager
    def _observed_data_port_append(self, trace_context: Iterable[tuple[str, str]]):
        started = time.perf_counter()
        error: BaseException | None = None
        span_context = (
            contextlib.nullcontext()
            if self._tracer is None
            else self._tracer.start_as_current_span(
                names.SPAN_DATA_PORT_APPEND,
                context=extract_context(trace_context),
                kind=SpanKind.SERVER,
                attributes={names.RPC_SYSTEM_NAME: names.DATA_PORT_RPC_SYSTEM, names.RPC_METHOD: "Append"},
            )
        )
        try:
            with span_context:
                yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            if self._data_port_duration is not None:
                attributes = {names.ERROR_TYPE: type(error).__name__} if error is not None else {}
                self._data_port_duration.record(time.perf_counter() - started, attributes)

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
        if error is None:
            if self._records_in is not None:
                self._records_in.add(topic, result.record_count)
            if self._bytes_in is not None:
                self._bytes_in.add(topic, size)
        elif self._errors is not None:
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
