"""The configured exporters deliver: OTLP/gRPC to a collector (a fake one on loopback), console to
stdout. Settings come from the environment, exactly as a deployed service reads them."""

from __future__ import annotations

import io
import json
import threading
from concurrent import futures

import grpc
import pytest
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from services.telemetry import Telemetry, telemetry_settings


class FakeCollector(
    trace_service_pb2_grpc.TraceServiceServicer, metrics_service_pb2_grpc.MetricsServiceServicer
):
    """Keeps every OTLP export request it receives."""

    def __init__(self) -> None:
        self.traces: list = []
        self.metrics: list = []
        self.lock = threading.Lock()

    def Export(self, request, context):  # both services name their RPC Export
        with self.lock:
            if isinstance(request, trace_service_pb2.ExportTraceServiceRequest):
                self.traces.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()
            self.metrics.append(request)
            return metrics_service_pb2.ExportMetricsServiceResponse()


@pytest.fixture
def collector():
    servicer = FakeCollector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(servicer, server)
    metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    servicer.endpoint = f"http://127.0.0.1:{port}"
    yield servicer
    server.stop(0)


def test_otlp_exports_spans_and_metrics_to_the_collector(collector, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "otlp",
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=test",
    }
    telemetry = Telemetry.from_settings(telemetry_settings("tributary-gateway", env=env))
    with telemetry.tracer.start_as_current_span("exported-span"):
        pass
    telemetry.meter.create_counter("tributary.test.exported").add(3, {"k": "v"})
    telemetry.shutdown()  # flushes both signals

    spans = [
        (span.name, {a.key: a.value.string_value for a in rs.resource.attributes})
        for request in collector.traces
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert [name for name, _ in spans] == ["exported-span"]
    resource = spans[0][1]
    assert resource["service.name"] == "tributary-gateway"
    assert resource["service.namespace"] == "tributary"
    assert resource["deployment.environment.name"] == "test"
    assert resource["telemetry.sdk.language"] == "python"
    sums = [
        point.as_int
        for request in collector.metrics
        for rm in request.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        if metric.name == "tributary.test.exported"
        for point in metric.sum.data_points
    ]
    assert sums and sums[-1] == 3


def test_console_exporter_prints_spans():
    telemetry = Telemetry.from_settings(
        telemetry_settings("tributary-coordinator", env={"OTEL_TRACES_EXPORTER": "console"})
    )
    (processor,) = telemetry.span_processors
    processor.span_exporter.out = out = io.StringIO()  # stdout, bound when the exporter was made
    with telemetry.tracer.start_as_current_span("printed-span"):
        pass
    telemetry.shutdown()
    printed = json.loads(out.getvalue())
    assert printed["name"] == "printed-span"
    assert printed["resource"]["attributes"]["service.name"] == "tributary-coordinator"
