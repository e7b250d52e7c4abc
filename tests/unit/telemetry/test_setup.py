"""Providers built from settings: which exporters, the missing-extra errors, the SDK entry points."""

from __future__ import annotations

import sys

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from services.telemetry import (
    Telemetry,
    TelemetryConfigError,
    client_instruments,
    client_interceptors,
    names,
    telemetry_settings,
)


def build(env):
    return Telemetry.from_settings(telemetry_settings("tributary-test", env=env))


def span_exporters(telemetry):
    processors = telemetry.span_processors
    assert all(isinstance(p, BatchSpanProcessor) for p in processors)
    return [type(p.span_exporter).__name__ for p in processors]


def metric_exporters(telemetry):
    readers = telemetry.metric_readers
    assert all(isinstance(r, PeriodicExportingMetricReader) for r in readers)
    return [type(r._exporter).__name__ for r in readers]


def test_disabled_has_no_providers_and_no_interceptors():
    telemetry = build({})
    assert not telemetry.enabled
    assert (telemetry.tracer_provider, telemetry.meter_provider, telemetry.tracer, telemetry.meter) == (
        None,
    ) * 4
    assert telemetry.server_interceptors() == [] and telemetry.client_interceptors("h:1") == []
    telemetry.shutdown()


def test_console_exporters():
    telemetry = build({"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"})
    try:
        assert span_exporters(telemetry) == ["ConsoleSpanExporter"]
        assert metric_exporters(telemetry) == ["ConsoleMetricExporter"]
        assert telemetry.tracer is not None and telemetry.meter is not None
        assert len(telemetry.server_interceptors()) == 1
        assert len(telemetry.client_interceptors("h:1")) == 4  # one per call arity
        resource = telemetry.tracer_provider.resource.attributes
        assert resource[names.SERVICE_NAME] == "tributary-test"
        assert resource["telemetry.sdk.language"] == "python"
    finally:
        telemetry.shutdown()
        telemetry.shutdown()  # idempotent


def test_traces_only_builds_no_meter():
    telemetry = build({"OTEL_TRACES_EXPORTER": "console"})
    try:
        assert telemetry.tracer is not None and telemetry.meter is None and telemetry.meter_provider is None
    finally:
        telemetry.shutdown()


def test_otlp_exporters(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")  # nothing listens there
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    telemetry = build({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp"})
    try:
        assert span_exporters(telemetry) == ["OTLPSpanExporter"]
        assert metric_exporters(telemetry) == ["OTLPMetricExporter"]
    finally:
        telemetry.shutdown()


@pytest.mark.parametrize(
    ("env", "module", "package"),
    [
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "otlp"},
            "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
            "opentelemetry-exporter-otlp-proto-grpc",
            id="otlp-traces",
        ),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "otlp"},
            "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
            "opentelemetry-exporter-otlp-proto-grpc",
            id="otlp-metrics",
        ),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
            "opentelemetry-exporter-otlp-proto-http",
            id="otlp-http",
        ),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": "prometheus"},
            "opentelemetry.exporter.prometheus",
            "opentelemetry-exporter-prometheus",
            id="prometheus",
        ),
    ],
)
def test_a_missing_optional_package_is_a_clear_error(monkeypatch, env, module, package):
    monkeypatch.setitem(sys.modules, module, None)  # makes the import fail as if not installed
    for key, value in env.items():
        if key.startswith("OTEL_EXPORTER_OTLP"):
            monkeypatch.setenv(key, value)
    with pytest.raises(TelemetryConfigError, match=package):
        build(env)


def test_prometheus_port_in_use_is_a_clear_error():
    first = build(
        {
            "OTEL_METRICS_EXPORTER": "prometheus",
            "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
            "OTEL_EXPORTER_PROMETHEUS_PORT": "0",
        }
    )
    try:
        port = first.prometheus.port
        with pytest.raises(TelemetryConfigError, match=f"127.0.0.1:{port}"):
            build(
                {
                    "OTEL_METRICS_EXPORTER": "prometheus",
                    "OTEL_EXPORTER_PROMETHEUS_HOST": "127.0.0.1",
                    "OTEL_EXPORTER_PROMETHEUS_PORT": str(port),
                }
            )
    finally:
        first.shutdown()


def test_unsupported_otlp_protocol(monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    with pytest.raises(TelemetryConfigError, match="http/json"):
        build({"OTEL_TRACES_EXPORTER": "otlp"})


# ---- the SDK's entry points ---------------------------------------------------------------------


def test_sdk_gets_no_interceptors_while_the_application_configured_nothing():
    # A fresh interpreter: other tests in this process may have installed global providers
    # (OpenTelemetry's globals can be set once per process), so check the untouched state there.
    import os
    import subprocess
    import sys

    script = (
        "from services.telemetry import client_instruments, client_interceptors\n"
        "assert client_interceptors('gw:9092') == [], 'interceptors without a configured SDK'\n"
        "assert client_instruments('gw:9092') is None, 'instruments without a configured SDK'\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, cwd=root)
    assert result.returncode == 0, result.stderr


def test_sdk_interceptors_and_instruments_on_given_providers(monkeypatch):
    monkeypatch.delenv("OTEL_SDK_DISABLED", raising=False)
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    tracer_provider = TracerProvider()
    assert len(client_interceptors("gw:9092", tracer_provider=tracer_provider)) == 4
    assert len(client_interceptors("gw:9092", meter_provider=meter_provider)) == 4
    first = client_instruments("gw-a:9092", meter_provider=meter_provider)
    second = client_instruments("gw-b:9092", meter_provider=meter_provider)
    assert client_instruments("gw-a:9092", meter_provider=meter_provider) is first
    first.sent("orders", 10, partition=3)
    second.sent("orders", 2, error_type="NOT_LEADER_OR_FOLLOWER")
    first.consumed("orders", 5, partition=3, group="billing")
    first.operation_duration(0.004, operation="send", topic="orders")
    metrics = {m.name: m for m in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics}
    sent = {
        (p.attributes[names.SERVER_ADDRESS], p.attributes.get(names.ERROR_TYPE)): p.value
        for p in metrics[names.MESSAGING_CLIENT_SENT_MESSAGES].data.data_points
    }
    assert sent == {("gw-a", None): 10, ("gw-b", "NOT_LEADER_OR_FOLLOWER"): 2}
    (consumed,) = metrics[names.MESSAGING_CLIENT_CONSUMED_MESSAGES].data.data_points
    assert dict(consumed.attributes) == {
        names.MESSAGING_SYSTEM: "tributary",
        names.MESSAGING_OPERATION_NAME: "poll",
        names.MESSAGING_OPERATION_TYPE: "receive",
        names.MESSAGING_DESTINATION_NAME: "orders",
        names.SERVER_ADDRESS: "gw-a",
        names.SERVER_PORT: 9092,
        names.MESSAGING_DESTINATION_PARTITION_ID: "3",
        names.MESSAGING_CONSUMER_GROUP_NAME: "billing",
    }
    assert consumed.value == 5
    (duration,) = metrics[names.MESSAGING_CLIENT_OPERATION_DURATION].data.data_points
    assert duration.count == 1 and duration.attributes[names.MESSAGING_OPERATION_TYPE] == "send"


def test_sdk_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    assert client_interceptors("gw:1", tracer_provider=TracerProvider()) == []
    assert client_instruments("gw:1", meter_provider=MeterProvider()) is None
