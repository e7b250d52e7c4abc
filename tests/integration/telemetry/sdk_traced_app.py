"""An application with its own OpenTelemetry SDK using the Tributary SDK, run as a subprocess by
``test_sdk_telemetry.py`` (OpenTelemetry's global providers can be set once per process, so the
application gets a process of its own). Prints its finished spans and metric totals as JSON.

Usage: python sdk_traced_app.py GATEWAY TOPIC
"""

from __future__ import annotations

import json
import sys
import time

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

spans = InMemorySpanExporter()
provider = TracerProvider(resource=Resource.create({"service.name": "sdk-app"}))
provider.add_span_processor(SimpleSpanProcessor(spans))
trace.set_tracer_provider(provider)
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from gateway.client import Admin, Consumer, NewTopic, Producer  # noqa: E402 -- after the providers

servers, topic = sys.argv[1], sys.argv[2]
with Admin(servers=servers) as admin:
    admin.create_topics([NewTopic(topic, 2), NewTopic(f"{topic}-small", 1, 1, {"max.message.bytes": "1000"})])

tracer = trace.get_tracer("sdk-app")
# One traced produce over unary Produce: the application's span, the SDK's send span, its RPC.
with (
    Producer(
        servers=servers, transport="unary", data_path="grpc", client_id="traced-app", linger_ms=50
    ) as producer,
    tracer.start_as_current_span("checkout"),
):
    unary = producer.send(topic, b"traced", key=b"order-1").get(timeout=30)
# One traced produce over the gateway's raw data listener (the default path): the frame carries
# the send span's traceparent.
with (
    Producer(servers=servers, client_id="traced-app", linger_ms=50) as producer,
    tracer.start_as_current_span("checkout-raw"),
):
    raw = producer.send(topic, b"traced-raw", key=b"order-2").get(timeout=30)
# The default transport (ProduceStream) and a failure.
with Producer(servers=servers, client_id="traced-app") as producer:
    streamed = [producer.send(topic, f"s{i}".encode(), partition=i % 2) for i in range(4)]
    for future in streamed:
        future.get(timeout=30)
    failed = producer.send(f"{topic}-small", bytes(5000))  # refused by the storage node
    try:
        failed.get(timeout=30)
    except Exception as exc:  # noqa: BLE001 -- the failure is what we look at
        failure = type(exc).__name__

consumed = 0
with Consumer(
    servers=servers, group_id=f"{topic}-g", client_id="traced-consumer", auto_offset_reset="earliest"
) as consumer:
    consumer.subscribe([topic])
    deadline = time.monotonic() + 30
    while consumed < 6 and time.monotonic() < deadline:
        consumed += sum(len(records) for records in consumer.poll(timeout_ms=500).values())

provider.force_flush()


def span_json(span) -> dict:
    return {
        "name": span.name,
        "kind": span.kind.name,
        "service": span.resource.attributes.get("service.name"),
        "trace_id": f"0x{span.context.trace_id:032x}",
        "span_id": f"0x{span.context.span_id:016x}",
        "parent_id": f"0x{span.parent.span_id:016x}" if span.parent is not None else None,
        "status": span.status.status_code.name,
        "attributes": {k: v for k, v in span.attributes.items()},
    }


totals: dict[str, float] = {}
data = reader.get_metrics_data()
assert data is not None, "the reader collected once"
for resource_metrics in data.resource_metrics:
    for scope_metrics in resource_metrics.scope_metrics:
        for metric in scope_metrics.metrics:
            for point in metric.data.data_points:
                value = getattr(point, "value", None)
                if value is None:
                    value = getattr(point, "count")  # noqa: B009 -- histograms: how many were recorded
                key = metric.name + "".join(
                    f"|{k}=" + str(v)
                    for k, v in sorted((point.attributes or {}).items())
                    if k in ("error.type", "messaging.operation.name")
                )
                totals[key] = totals.get(key, 0) + value

print(
    json.dumps(
        {
            "unary_offset": unary.offset,
            "raw_offset": raw.offset,
            "failure": failure,
            "consumed": consumed,
            "spans": [span_json(s) for s in spans.get_finished_spans()],
            "metrics": totals,
        }
    )
)
