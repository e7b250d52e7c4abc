"""The gateway's instruments (built only when telemetry is on; see
:mod:`services.telemetry.metrics`): produce batch sizes, what Fetch returned, fetch-port spans."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable
from typing import Any, NamedTuple

from opentelemetry import trace
from opentelemetry.metrics import CallbackOptions, Histogram, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode

from services.quotas import CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE
from services.records import RECORD_BATCH_OVERHEAD, read_batch_header
from services.telemetry import extract_context, names
from services.telemetry.metrics import (
    BATCH_BYTES_BUCKETS,
    BATCH_RECORDS_BUCKETS,
    RunningTotals,
    TopicAttributes,
)


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


def _quota_attributes(sensor) -> dict[str, str]:
    return {
        names.ATTR_QUOTA_USER: sensor.key.user,
        names.ATTR_QUOTA_CLIENT_ID: sensor.key.client_id,
        names.ATTR_QUOTA_KEY: sensor.quota_key,
    }


class DataRequest(NamedTuple):
    """A request on the raw data listener being served: for ``end_data_request``."""

    operation: str
    span: Any
    started: float


class GatewayInstruments:
    """Produce batch sizes, what Fetch returned, and spans around fetch-port reads."""

    def __init__(self, telemetry) -> None:
        self._tracer = telemetry.tracer
        self._topics = TopicAttributes()
        self._batch_records: Histogram | None = None
        self._batch_bytes: Histogram | None = None
        self._records_out: RunningTotals | None = None
        self._bytes_out: RunningTotals | None = None
        self._data_duration: Histogram | None = None
        meter = self._meter = telemetry.meter
        if meter is None:
            return
        self._data_duration = meter.create_histogram(
            names.GATEWAY_DATA_REQUEST_DURATION,
            unit="s",
            description="Duration of a request on the raw data listener, per operation (produce, fetch).",
        )
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

    def watch_quotas(self, quotas) -> None:
        """Throttle times as they happen, and each metered allowance's rate and bound when
        collected (``quotas``: the gateway's :class:`~gateway.server.quotas.ClientQuotas`)."""
        meter = self._meter
        if meter is None:
            return
        throttle_time = meter.create_histogram(
            names.GATEWAY_QUOTA_THROTTLE_TIME,
            unit="s",
            description="How long an answer held its client for going over a client quota, per "
            "user, client id and quota key.",
        )

        def throttled(sensor, seconds: float) -> None:
            throttle_time.record(seconds, _quota_attributes(sensor))

        quotas.on_throttle = throttled

        def observe(wanted: tuple[str, ...]):
            def callback(options: CallbackOptions) -> list[Observation]:
                now = quotas.clock()
                return [
                    Observation(sensor.rate.peek(now), _quota_attributes(sensor))
                    for sensor in list(quotas.sensors.values())
                    if sensor.quota_key in wanted
                ]

            return callback

        def limits(options: CallbackOptions) -> list[Observation]:
            return [Observation(s.limit, _quota_attributes(s)) for s in list(quotas.sensors.values())]

        meter.create_observable_gauge(
            names.GATEWAY_QUOTA_BYTE_RATE,
            [observe((PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE))],
            unit="By/s",
            description="Bytes per second a client-quota allowance is used at (produce: "
            "producer_byte_rate, fetch: consumer_byte_rate), over the quota windows.",
        )
        meter.create_observable_gauge(
            names.GATEWAY_QUOTA_REQUEST_TIME,
            [observe((REQUEST_PERCENTAGE,))],
            unit="%",
            description="Percent of the gateway's event loop a request_percentage allowance uses.",
        )
        meter.create_observable_gauge(
            names.GATEWAY_QUOTA_LIMIT,
            [limits],
            unit="1",
            description="The bound of each metered client-quota allowance, in its key's unit.",
        )

    def watch_fetch_sessions(self, counts, open_sessions) -> None:
        """Fetch sessions of the raw data listener, read when collected: ``counts`` (a
        :class:`~gateway.server.fetch_sessions.SessionCounts` every connection adds to) and
        ``open_sessions()``, the sessions open now."""
        meter = self._meter
        if meter is None:
            return
        meter.create_observable_gauge(
            names.GATEWAY_FETCH_SESSIONS_OPEN,
            [lambda options: [Observation(open_sessions())]],
            unit="{session}",
            description="Fetch sessions (KIP-227) open on the raw data listener.",
        )
        meter.create_observable_counter(
            names.GATEWAY_FETCH_SESSIONS,
            [
                lambda options: [
                    Observation(counts.opened, {names.ATTR_SESSION_EVENT: "opened"}),
                    Observation(counts.evicted, {names.ATTR_SESSION_EVENT: "evicted"}),
                    Observation(counts.refused, {names.ATTR_SESSION_EVENT: "refused"}),
                ]
            ],
            unit="{session}",
            description="Fetch sessions opened, evicted (a connection opened one over its cap) and "
            "refused (a full fetch over the per-session partition cap).",
        )
        meter.create_observable_counter(
            names.GATEWAY_SESSION_FETCHES,
            [
                lambda options: [
                    Observation(counts.full_fetches, {names.ATTR_FETCH_KIND: "full"}),
                    Observation(counts.incremental_fetches, {names.ATTR_FETCH_KIND: "incremental"}),
                ]
            ],
            unit="{request}",
            description="Fetches of version-3 data connections: full (opening a session) and incremental.",
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
            if self._batch_bytes is not None:
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
        if records or size:
            if self._records_out is not None:
                self._records_out.add(topic, records)
            if self._bytes_out is not None:
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

    def start_fetch_port_read_many(self, partitions: list[tuple[str, int]], host: str, port: int):
        """A CLIENT span around one fetch-port request for several partitions of one node."""
        if self._tracer is None:
            return None
        topics = sorted({topic for topic, _ in partitions})
        topic = topics[0] if len(topics) == 1 else f"{len(topics)} topics"
        return self._tracer.start_span(
            f"{names.SPAN_FETCH_PORT} {topic}",
            kind=SpanKind.CLIENT,
            attributes={
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_TYPE: "receive",
                names.MESSAGING_OPERATION_NAME: names.SPAN_FETCH_PORT,
                names.MESSAGING_DESTINATION_NAME: topic,
                names.ATTR_PARTITION_COUNT: len(partitions),
                names.SERVER_ADDRESS: host,
                names.SERVER_PORT: port,
            },
        )

    def start_data_request(
        self, operation: str, topic: str, client_id: str, traceparent: str = ""
    ) -> DataRequest:
        """One request of the raw data listener (``produce`` / ``fetch``): its SERVER span (the
        child of the client's span when the request carries its ``traceparent``) and its start,
        for ``tributary.gateway.data.request.duration`` (what ``rpc.server.call.duration`` is to
        gRPC)."""
        return DataRequest(
            operation, self._data_span(operation, topic, client_id, traceparent), time.monotonic()
        )

    def _data_span(self, operation: str, topic: str, client_id: str, traceparent: str):
        if self._tracer is None:
            return None
        parent = extract_context([("traceparent", traceparent)]) if traceparent else None
        return self._tracer.start_span(
            f"{names.SPAN_DATA_REQUEST} {operation} {topic}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_TYPE: "send" if operation == "produce" else "receive",
                names.MESSAGING_OPERATION_NAME: operation,
                names.MESSAGING_DESTINATION_NAME: topic,
                "messaging.client.id": client_id,
            },
        )

    @staticmethod
    def use_span(request: DataRequest):
        """The request's span as the current span for a ``with`` block (not ended on exit)."""
        if request.span is None:
            return contextlib.nullcontext()
        return trace.use_span(request.span, end_on_exit=False)

    def end_data_request(self, request: DataRequest, error=None) -> None:
        reason = getattr(error, "reason", type(error).__name__) if error is not None else None
        if self._data_duration is not None:
            attributes = {names.MESSAGING_OPERATION_NAME: request.operation}
            if reason is not None:
                attributes[names.ERROR_TYPE] = reason
            self._data_duration.record(time.monotonic() - request.started, attributes)
        span = request.span
        if span is None:
            return
        if reason is not None:
            span.set_attributes({names.ERROR_TYPE: reason, names.ATTR_ERROR_REASON: reason})
            span.set_status(Status(StatusCode.ERROR, str(error)))
        span.end()

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
