"""The SDK's own telemetry, on the application's OpenTelemetry providers (never our own).

Off -- ``None``, no cost beyond one test per call -- unless the application configured an
OpenTelemetry SDK (a TracerProvider and/or MeterProvider set as the globals) and did not set
``OTEL_SDK_DISABLED``. Then, following the messaging semantic conventions:

* every ``send`` of a record is a PRODUCER span ``send <topic>``, from the call until the record
  is acknowledged or fails (``messaging.destination.partition.id`` and
  ``messaging.kafka.offset`` once known, the error otherwise), and counts in
  ``messaging.client.sent.messages`` and ``messaging.client.operation.duration``;
* the Produce request that carries a batch runs in the context of the batch's first record's
  span, so its gRPC CLIENT span (:func:`services.telemetry.client_interceptors`, on every SDK
  channel) and the gateway's and storage node's spans join that record's trace (one produce, one
  trace). A ``ProduceStream`` (the default transport) is one gRPC call for many requests: its
  spans join the trace of the record that opened it, and the later records' traces end in the
  SDK; ``transport="unary"`` gives every request its own RPC;
* every ``poll`` that returns records is a CONSUMER span ``poll <topic>`` (with
  ``messaging.batch.message_count``), and the records count in
  ``messaging.client.consumed.messages`` per partition, the poll in the operation duration.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterable, Mapping

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.client.futures import FutureRecordMetadata, ProduceResult
from gateway.client.structs import ConsumerRecord, TopicPartition
from services.telemetry import ClientInstruments, client_instruments, client_tracer, names

#: The Kafka attributes of the messaging conventions (messaging.kafka.*).
KAFKA_OFFSET = "messaging.kafka.offset"
KAFKA_MESSAGE_KEY = "messaging.kafka.message.key"
MESSAGING_CLIENT_ID = "messaging.client.id"

#: The span of each batch's first record, while the batch is in flight: the context its
#: Produce request runs in (see :func:`request_context`). Keyed by the batch's shared result;
#: an entry leaves when the batch completes.
_batch_spans: dict[ProduceResult, trace.Span] = {}


def _error_type(error: BaseException) -> str:
    return getattr(error, "reason", None) or type(error).__qualname__


class ProducerTelemetry:
    """Spans and metrics of one producer's sends."""

    def __init__(self, tracer, instruments: ClientInstruments | None, client_id: str) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._client_id = client_id

    @classmethod
    def create(cls, client_id: str, servers: Iterable[str]) -> ProducerTelemetry | None:
        """None when the application configured no OpenTelemetry SDK."""
        tracer = client_tracer()
        instruments = client_instruments(next(iter(servers), ""))
        if tracer is None and instruments is None:
            return None
        return cls(tracer, instruments, client_id)

    @staticmethod
    def now() -> int:
        return time.time_ns()

    def sent(self, topic: str, key, future: FutureRecordMetadata, started_ns: int) -> None:
        """A record was queued (``send`` began at ``started_ns``): its span and metrics end
        when ``future`` settles."""
        result = future._result
        partition = result.topic_partition.partition
        span = None
        if self._tracer is not None:
            attributes = {
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_NAME: "send",
                names.MESSAGING_OPERATION_TYPE: "send",
                names.MESSAGING_DESTINATION_NAME: topic,
                names.MESSAGING_DESTINATION_PARTITION_ID: str(partition),
                MESSAGING_CLIENT_ID: self._client_id,
            }
            if isinstance(key, (bytes, str)):
                attributes[KAFKA_MESSAGE_KEY] = (
                    key if isinstance(key, str) else key.decode("utf-8", "replace")
                )
            span = self._tracer.start_span(
                f"send {topic}", kind=SpanKind.PRODUCER, attributes=attributes, start_time=started_ns
            )
            if result not in _batch_spans and not result.done:
                _batch_spans[result] = span
        instruments = self._instruments

        def settled(error, metadata) -> None:
            _batch_spans.pop(result, None)
            error_type = _error_type(error) if error is not None else None
            if span is not None:
                if error is None:
                    span.set_attribute(KAFKA_OFFSET, metadata.offset)
                else:
                    span.set_attribute(names.ERROR_TYPE, error_type)
                    span.record_exception(error)
                    span.set_status(Status(StatusCode.ERROR, str(error)))
                span.end()
            if instruments is not None:
                instruments.sent(topic, 1, partition=partition, error_type=error_type)
                instruments.operation_duration(
                    (time.time_ns() - started_ns) / 1e9,
                    operation="send",
                    topic=topic,
                    partition=partition,
                    error_type=error_type,
                )

        future.add_delivery_callback(settled)


def request_context(batches: Iterable[ProduceResult]) -> contextvars.Context | None:
    """The context a Produce request for ``batches`` runs in: the first traced batch's first
    record's span, so the request's RPC continues that record's trace. None (the sender's own
    context) when no batch is traced -- always, when telemetry is off."""
    if not _batch_spans:
        return None
    for result in batches:
        span = _batch_spans.get(result)
        if span is not None:
            context = contextvars.copy_context()
            context.run(otel_context.attach, trace.set_span_in_context(span))
            return context
    return None


class ConsumerTelemetry:
    """Spans and metrics of one consumer's polls."""

    def __init__(
        self, tracer, instruments: ClientInstruments | None, client_id: str, group: str | None
    ) -> None:
        self._tracer = tracer
        self._instruments = instruments
        self._client_id = client_id
        self._group = group or None

    @classmethod
    def create(cls, client_id: str, group: str | None, servers: Iterable[str]) -> ConsumerTelemetry | None:
        tracer = client_tracer()
        instruments = client_instruments(next(iter(servers), ""))
        if tracer is None and instruments is None:
            return None
        return cls(tracer, instruments, client_id, group)

    @staticmethod
    def now() -> int:
        return time.time_ns()

    def polled(self, records: Mapping[TopicPartition, list[ConsumerRecord]], started_ns: int) -> None:
        """A poll that began at ``started_ns`` returned ``records`` (nothing is recorded for an
        empty poll: a poll loop would otherwise be mostly empty spans)."""
        if not records:
            return
        topics = sorted({tp.topic for tp in records})
        count = sum(len(batch) for batch in records.values())
        topic = topics[0] if len(topics) == 1 else ""
        if self._tracer is not None:
            attributes = {
                names.MESSAGING_SYSTEM: names.MESSAGING_SYSTEM_VALUE,
                names.MESSAGING_OPERATION_NAME: "poll",
                names.MESSAGING_OPERATION_TYPE: "receive",
                names.MESSAGING_BATCH_MESSAGE_COUNT: count,
                MESSAGING_CLIENT_ID: self._client_id,
            }
            if topic:
                attributes[names.MESSAGING_DESTINATION_NAME] = topic
            if self._group:
                attributes[names.MESSAGING_CONSUMER_GROUP_NAME] = self._group
            span = self._tracer.start_span(
                f"poll {topic}" if topic else "poll",
                kind=SpanKind.CONSUMER,
                attributes=attributes,
                start_time=started_ns,
            )
            span.end()
        if self._instruments is not None:
            for tp, batch in records.items():
                self._instruments.consumed(tp.topic, len(batch), partition=tp.partition, group=self._group)
            seconds = (time.time_ns() - started_ns) / 1e9
            for name in topics:
                self._instruments.operation_duration(seconds, operation="poll", topic=name, group=self._group)
