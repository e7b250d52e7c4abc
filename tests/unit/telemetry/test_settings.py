"""OTEL_* environment and service config -> TelemetrySettings (pure; no provider is built)."""

from __future__ import annotations

import pytest

from coordinator.config import CoordinatorConfig
from gateway.server.config import GatewayConfig
from services.config import ConfigError, load_config
from services.telemetry import TelemetryConfigError, telemetry_settings
from services.telemetry.settings import DEFAULT_PROMETHEUS_PORT, parse_resource_attributes
from storage_node.config import StorageNodeConfig


def settings(env=None, **kwargs):
    return telemetry_settings("tributary-test", env=env or {}, **kwargs)


def test_off_by_default_even_though_the_spec_defaults_traces_to_otlp():
    s = settings()
    assert not s.enabled and s.traces_exporters == () and s.metrics_exporters == ()
    assert s.service_name == "tributary-test"
    assert s.resource_attributes["service.namespace"] == "tributary"


@pytest.mark.parametrize(
    ("env", "traces", "metrics"),
    [
        pytest.param({"OTEL_TRACES_EXPORTER": "console"}, ("console",), (), id="traces-console"),
        pytest.param({"OTEL_TRACES_EXPORTER": "otlp"}, ("otlp",), (), id="traces-otlp"),
        pytest.param({"OTEL_METRICS_EXPORTER": "prometheus"}, (), ("prometheus",), id="metrics-prometheus"),
        pytest.param(
            {"OTEL_METRICS_EXPORTER": " OTLP , console,otlp"}, (), ("otlp", "console"), id="list-dedup-case"
        ),
        pytest.param({"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none"}, (), (), id="none"),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "otlp,prometheus"},
            ("console",),
            ("otlp", "prometheus"),
            id="both",
        ),
    ],
)
def test_exporters_from_the_environment(env, traces, metrics):
    s = settings(env)
    assert (s.traces_exporters, s.metrics_exporters) == (traces, metrics)
    assert s.enabled == bool(traces or metrics)


def test_service_config_exporter_replaces_the_environment_for_both_signals():
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp"}
    s = settings(env, exporter="console")
    assert (s.traces_exporters, s.metrics_exporters) == (("console",), ("console",))
    s = settings(env, exporter="prometheus")  # metrics only: traces off
    assert (s.traces_exporters, s.metrics_exporters) == ((), ("prometheus",))
    s = settings(env, exporter="none")
    assert not s.enabled


@pytest.mark.parametrize(
    ("env", "kwargs", "source"),
    [
        pytest.param({"OTEL_TRACES_EXPORTER": "jaeger"}, {}, "OTEL_TRACES_EXPORTER", id="env-traces"),
        pytest.param(
            {"OTEL_TRACES_EXPORTER": "prometheus"}, {}, "OTEL_TRACES_EXPORTER", id="prometheus-traces"
        ),
        pytest.param({"OTEL_METRICS_EXPORTER": "statsd"}, {}, "OTEL_METRICS_EXPORTER", id="env-metrics"),
        pytest.param({}, {"exporter": "console,zipkin"}, "telemetry_exporter", id="config"),
    ],
)
def test_unknown_exporters_are_errors_naming_their_source(env, kwargs, source):
    with pytest.raises(TelemetryConfigError, match=source) as info:
        settings(env, **kwargs)
    assert isinstance(info.value, ConfigError)
    assert "known: none" in str(info.value)


def test_sdk_disabled_wins_over_everything():
    env = {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console", "OTEL_METRICS_EXPORTER": "console"}
    assert not settings(env, exporter="otlp", metrics_address="9999").enabled
    assert settings({**env, "OTEL_SDK_DISABLED": "false"}).enabled


def test_metrics_address_adds_the_prometheus_endpoint():
    s = settings(metrics_address="9100")
    assert s.metrics_exporters == ("prometheus",) and s.traces_exporters == ()
    assert (s.prometheus_host, s.prometheus_port) == ("localhost", 9100)
    s = settings({"OTEL_METRICS_EXPORTER": "otlp"}, metrics_address=":0", default_host="10.0.0.5")
    assert s.metrics_exporters == ("otlp", "prometheus")
    assert (s.prometheus_host, s.prometheus_port) == ("10.0.0.5", 0)
    s = settings({"OTEL_METRICS_EXPORTER": "prometheus"}, metrics_address="0.0.0.0:9100")
    assert s.metrics_exporters == ("prometheus",) and s.prometheus_host == "0.0.0.0"
    assert settings(metrics_address="[::1]:9100").prometheus_host == "::1"
    assert not settings(metrics_address="  ").enabled


def test_prometheus_host_and_port_precedence():
    env = {
        "OTEL_METRICS_EXPORTER": "prometheus",
        "OTEL_EXPORTER_PROMETHEUS_HOST": "0.0.0.0",
        "OTEL_EXPORTER_PROMETHEUS_PORT": "9500",
    }
    assert settings({"OTEL_METRICS_EXPORTER": "prometheus"}).prometheus_port == DEFAULT_PROMETHEUS_PORT
    assert (
        settings({"OTEL_METRICS_EXPORTER": "prometheus"}, default_host="10.0.0.5").prometheus_host
        == "10.0.0.5"
    )
    s = settings(env, default_host="10.0.0.5")
    assert (s.prometheus_host, s.prometheus_port) == ("0.0.0.0", 9500)
    s = settings(env, metrics_address="127.0.0.1:9600")
    assert (s.prometheus_host, s.prometheus_port) == ("127.0.0.1", 9600)
    with pytest.raises(TelemetryConfigError, match="OTEL_EXPORTER_PROMETHEUS_PORT"):
        settings({**env, "OTEL_EXPORTER_PROMETHEUS_PORT": "ninety"})
    with pytest.raises(TelemetryConfigError, match="out of range"):
        settings(metrics_address="70000")
    with pytest.raises(TelemetryConfigError, match="metrics_address setting: bad port 'x'"):
        settings(metrics_address="host:x")


def test_resource_from_defaults_environment_and_service_name():
    s = settings(instance_id="storage-3")
    assert s.resource_attributes == {
        "service.name": "tributary-test",
        "service.namespace": "tributary",
        "service.instance.id": "storage-3",
    }
    env = {
        "OTEL_RESOURCE_ATTRIBUTES": "deployment.environment.name=prod, service.namespace=payments,"
        "k8s.pod.name=storage%2D0",
        "OTEL_SERVICE_NAME": "storage-eu",
    }
    s = settings(env, instance_id="storage-3")
    assert s.resource_attributes == {
        "service.name": "storage-eu",
        "service.namespace": "payments",
        "service.instance.id": "storage-3",
        "deployment.environment.name": "prod",
        "k8s.pod.name": "storage-0",
    }
    # service.name from OTEL_RESOURCE_ATTRIBUTES beats the default, OTEL_SERVICE_NAME beats both.
    assert settings({"OTEL_RESOURCE_ATTRIBUTES": "service.name=a"}).service_name == "a"
    assert (
        settings({"OTEL_RESOURCE_ATTRIBUTES": "service.name=a", "OTEL_SERVICE_NAME": "b"}).service_name == "b"
    )


def test_bad_resource_attributes_are_errors():
    assert parse_resource_attributes("") == {}
    assert parse_resource_attributes("a=1,,b=x=y") == {"a": "1", "b": "x=y"}
    with pytest.raises(TelemetryConfigError, match="key=value"):
        parse_resource_attributes("a=1,oops")
    with pytest.raises(TelemetryConfigError, match="key=value"):
        parse_resource_attributes("=1")


@pytest.mark.parametrize(
    ("value", "old"),
    [("", False), ("rpc", False), ("http,rpc/dup", True), ("RPC/DUP", True), ("database/dup", False)],
)
def test_semconv_opt_in(value, old):
    assert settings({"OTEL_SEMCONV_STABILITY_OPT_IN": value}).rpc_old_conventions is old


def test_service_configs_carry_the_telemetry_settings():
    env = {
        "TRIBUTARY_STORAGE_TELEMETRY_EXPORTER": "otlp,prometheus",
        "TRIBUTARY_STORAGE_METRICS_ADDRESS": "0.0.0.0:9464",
    }
    config = load_config(StorageNodeConfig, env=env, env_prefix="TRIBUTARY_STORAGE")
    assert (config.telemetry_exporter, config.metrics_address) == ("otlp,prometheus", "0.0.0.0:9464")
    assert load_config(StorageNodeConfig, env={}, env_prefix="TRIBUTARY_STORAGE").metrics_address == ""
    gateway = load_config(
        GatewayConfig, overrides={"telemetry-exporter": "console", "metrics.address": "9464"}
    )
    assert (gateway.telemetry_exporter, gateway.metrics_address) == ("console", "9464")
    coordinator = load_config(
        CoordinatorConfig,
        env={"TRIBUTARY_COORDINATOR_METRICS_ADDRESS": ":9464"},
        env_prefix="TRIBUTARY_COORDINATOR",
    )
    assert coordinator.metrics_address == ":9464"
