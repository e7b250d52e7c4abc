"""Which telemetry a process emits: the standard ``OTEL_*`` environment plus the service config.

Pure: :func:`telemetry_settings` reads a mapping (``os.environ`` by default) and returns a frozen
:class:`TelemetrySettings`; nothing is imported or started here (see ``setup.py`` for that).

Sources, later ones winning:

1. Tributary's default: **no exporter** -- telemetry is off and costs nothing. (The
   OpenTelemetry specification defaults ``OTEL_TRACES_EXPORTER`` to ``otlp``; we do not, because
   "nothing is required to run".)
2. The environment: ``OTEL_TRACES_EXPORTER`` and ``OTEL_METRICS_EXPORTER`` (comma-separated:
   ``none``, ``console``, ``otlp``; metrics also ``prometheus``), ``OTEL_SERVICE_NAME``,
   ``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_EXPORTER_PROMETHEUS_HOST`` / ``_PORT`` (9464),
   ``OTEL_SEMCONV_STABILITY_OPT_IN`` (``rpc/dup``), and ``OTEL_SDK_DISABLED=true``, which turns
   everything off whatever else says. The OTLP exporter reads its own variables
   (``OTEL_EXPORTER_OTLP_ENDPOINT``, ``..._HEADERS``, ``..._PROTOCOL`` ...), the SDK its sampler
   (``OTEL_TRACES_SAMPLER``) and export intervals (``OTEL_METRIC_EXPORT_INTERVAL``,
   ``OTEL_BSP_*``).
3. The service config: ``telemetry_exporter`` (comma-separated; ``console`` and ``otlp`` apply
   to traces and metrics, ``prometheus`` to metrics, ``none`` turns both off) replaces both
   ``OTEL_*_EXPORTER`` variables when set; ``metrics_address`` (``host:port`` or ``port``; when
   set) adds the Prometheus endpoint there (port 0 = any free port; host defaults to the
   service's own host). One address setting rather than a ``metrics_port``: an unset port is not
   a port the service binds (the deploy wiring checks hold every ``*_port`` to be one).

An unknown exporter name is a :class:`TelemetryConfigError` naming its source, not a silent no-op.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from services.config import ConfigError
from services.telemetry import names

TRACE_EXPORTERS = frozenset({"console", "otlp"})
METRIC_EXPORTERS = frozenset({"console", "otlp", "prometheus"})
DEFAULT_PROMETHEUS_PORT = 9464
_TRUE = {"1", "true", "yes", "on"}


class TelemetryConfigError(ConfigError):
    """An exporter name or telemetry setting that cannot be honoured (or a missing extra)."""


@dataclass(frozen=True)
class TelemetrySettings:
    """Everything needed to build a process's tracer and meter providers."""

    #: ``service.name`` and the rest of the resource (environment values already applied).
    resource_attributes: Mapping[str, str] = field(default_factory=dict)
    #: Span exporters by name, in the order given: a subset of ``TRACE_EXPORTERS``.
    traces_exporters: tuple[str, ...] = ()
    #: Metric exporters by name: a subset of ``METRIC_EXPORTERS``.
    metrics_exporters: tuple[str, ...] = ()
    prometheus_host: str = "localhost"
    prometheus_port: int = DEFAULT_PROMETHEUS_PORT
    #: Also emit the pre-1.38 RPC attribute and metric names (``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup``).
    rpc_old_conventions: bool = False

    @property
    def service_name(self) -> str:
        return self.resource_attributes.get(names.SERVICE_NAME, "")

    @property
    def tracing(self) -> bool:
        return bool(self.traces_exporters)

    @property
    def metering(self) -> bool:
        return bool(self.metrics_exporters)

    @property
    def enabled(self) -> bool:
        return self.tracing or self.metering


def _split(value: str) -> list[str]:
    return [item.strip().lower() for item in value.split(",") if item.strip()]


def _exporters(
    value: str, known: frozenset[str], source: str, *, ignore: frozenset[str] = frozenset()
) -> tuple:
    """Names from a comma-separated list; ``none`` alone means none, unknown names raise."""
    items = _split(value)
    if items == ["none"]:
        return ()
    chosen: list[str] = []
    for item in items:
        if item in ignore:
            continue
        if item not in known:
            raise TelemetryConfigError(
                f"{source}: unknown exporter {item!r} in {value!r} (known: none, {', '.join(sorted(known))})"
            )
        if item not in chosen:
            chosen.append(item)
    return tuple(chosen)


def parse_resource_attributes(value: str) -> dict[str, str]:
    """``OTEL_RESOURCE_ATTRIBUTES``: ``k=v,k=v`` with percent-encoded values; bad pairs raise."""
    attributes: dict[str, str] = {}
    for pair in value.split(","):
        if not pair.strip():
            continue
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise TelemetryConfigError(f"OTEL_RESOURCE_ATTRIBUTES: expected key=value, got {pair!r}")
        attributes[key.strip()] = unquote(raw.strip())
    return attributes


def _port(value: str, source: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise TelemetryConfigError(f"{source}: bad port {value!r}") from None
    if not 0 <= port <= 65535:
        raise TelemetryConfigError(f"{source}: port {port} is out of range")
    return port


def parse_address(value: str, source: str) -> tuple[str, int]:
    """``host:port``, ``[v6]:port``, ``:port`` or ``port`` -> (host or "", port)."""
    host, sep, port = value.strip().rpartition(":")
    if not sep:
        host, port = "", value.strip()
    return host.strip("[]"), _port(port, source)


def telemetry_settings(
    service_name: str,
    *,
    exporter: str = "",
    metrics_address: str = "",
    default_host: str = "localhost",
    instance_id: str = "",
    env: Mapping[str, str] | None = None,
) -> TelemetrySettings:
    """The settings of one process (see the module docstring for precedence).

    ``service_name`` is the default ``service.name`` (``OTEL_SERVICE_NAME`` and a
    ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES`` win); ``exporter`` and ``metrics_address``
    come from the service config; ``default_host`` is where the Prometheus endpoint binds when
    neither the config nor ``OTEL_EXPORTER_PROMETHEUS_HOST`` say.
    """
    env = os.environ if env is None else env
    resource = {names.SERVICE_NAME: service_name, names.SERVICE_NAMESPACE_ATTR: names.SERVICE_NAMESPACE}
    if instance_id:
        resource[names.SERVICE_INSTANCE_ID] = instance_id
    resource.update(parse_resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", "")))
    if env.get("OTEL_SERVICE_NAME", "").strip():
        resource[names.SERVICE_NAME] = env["OTEL_SERVICE_NAME"].strip()
    old_rpc = "rpc/dup" in _split(env.get("OTEL_SEMCONV_STABILITY_OPT_IN", ""))

    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in _TRUE:
        return TelemetrySettings(resource_attributes=resource, rpc_old_conventions=old_rpc)

    if exporter.strip():
        source = "telemetry_exporter setting"
        traces = _exporters(exporter, TRACE_EXPORTERS, source, ignore=frozenset({"prometheus"}))
        metrics = _exporters(exporter, METRIC_EXPORTERS, source)
    else:
        traces = _exporters(env.get("OTEL_TRACES_EXPORTER", "none"), TRACE_EXPORTERS, "OTEL_TRACES_EXPORTER")
        metrics = _exporters(
            env.get("OTEL_METRICS_EXPORTER", "none"), METRIC_EXPORTERS, "OTEL_METRICS_EXPORTER"
        )

    host = env.get("OTEL_EXPORTER_PROMETHEUS_HOST", "").strip() or default_host
    port = _port(
        env.get("OTEL_EXPORTER_PROMETHEUS_PORT", str(DEFAULT_PROMETHEUS_PORT)),
        "OTEL_EXPORTER_PROMETHEUS_PORT",
    )
    if metrics_address.strip():
        given_host, port = parse_address(metrics_address, "metrics_address setting")
        host = given_host or default_host
        if "prometheus" not in metrics:
            metrics = (*metrics, "prometheus")
    return TelemetrySettings(
        resource_attributes=resource,
        traces_exporters=traces,
        metrics_exporters=metrics,
        prometheus_host=host,
        prometheus_port=port,
        rpc_old_conventions=old_rpc,
    )
