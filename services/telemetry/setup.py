"""Tracer and meter providers for one process, built from :class:`TelemetrySettings`.

:class:`Telemetry` owns a process's (or, in tests, one in-process service's) providers and
hands out its tracer, meter and gRPC interceptors. When the settings name no exporter it holds
no provider at all: ``enabled`` is false, ``tracer`` and ``meter`` are None, the interceptor
lists are empty and services build no instruments -- zero overhead, not "no-op objects called
on every append".

Exporters, imported only when named:

* ``console``: spans and metrics printed to stdout (``ConsoleSpanExporter`` behind a batch
  processor, ``ConsoleMetricExporter`` behind a periodic reader).
* ``otlp``: ``opentelemetry-exporter-otlp-proto-grpc`` (or ``-proto-http`` when
  ``OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf``); the exporters read ``OTEL_EXPORTER_OTLP_*``.
* ``prometheus`` (metrics): ``opentelemetry-exporter-prometheus`` + ``prometheus-client``; an
  HTTP endpoint (``/metrics``) on its own registry, served from a daemon thread.

A missing optional package is a :class:`TelemetryConfigError` that names the package to install.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable
from importlib import metadata as importlib_metadata

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace

from services.telemetry import names
from services.telemetry.rpc import (
    RpcInstruments,
    RpcObserver,
    make_client_interceptors,
    make_server_interceptors,
)
from services.telemetry.settings import TelemetryConfigError, TelemetrySettings

log = logging.getLogger(__name__)


def _version() -> str:
    try:
        return importlib_metadata.version("tributary")
    except importlib_metadata.PackageNotFoundError:
        return "0.0.0"


VERSION = _version()


def _missing(what: str, package: str, exc: ImportError) -> TelemetryConfigError:
    return TelemetryConfigError(
        f"{what} needs the optional package {package!r} (pip install 'tributary[telemetry]' or "
        f"pip install {package}): {exc}"
    )


def _otlp_protocol(signal: str) -> str:
    import os

    return (
        (
            os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL")
            or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "grpc"
        )
        .strip()
        .lower()
    )


def _otlp_exporter(signal: str, module: str, class_name: str, what: str):
    """The OTLP exporter for ``signal`` (TRACES, METRICS) over the protocol OTEL_* names:
    ``opentelemetry.exporter.otlp.proto.<grpc|http>.<module>.<class_name>``."""
    protocol = _otlp_protocol(signal)
    if protocol not in ("grpc", "http/protobuf"):
        raise TelemetryConfigError(f"OTLP protocol {protocol!r} is not supported (grpc, http/protobuf)")
    transport = "grpc" if protocol == "grpc" else "http"
    try:
        exporter_module = importlib.import_module(f"opentelemetry.exporter.otlp.proto.{transport}.{module}")
    except ImportError as exc:
        raise _missing(what, f"opentelemetry-exporter-otlp-proto-{transport}", exc) from exc
    return getattr(exporter_module, class_name)()


def _otlp_span_exporter():
    return _otlp_exporter("TRACES", "trace_exporter", "OTLPSpanExporter", "OTLP trace export")


def _otlp_metric_exporter():
    return _otlp_exporter("METRICS", "metric_exporter", "OTLPMetricExporter", "OTLP metric export")


class PrometheusEndpoint:
    """A ``/metrics`` HTTP endpoint over one metric reader's own registry."""

    def __init__(self, host: str, port: int) -> None:
        try:
            from opentelemetry.exporter.prometheus import PrometheusMetricReader
            from prometheus_client import CollectorRegistry, start_http_server
        except ImportError as exc:
            raise _missing("the Prometheus endpoint", "opentelemetry-exporter-prometheus", exc) from exc
        self.registry = CollectorRegistry(auto_describe=True)
        self.reader = PrometheusMetricReader(registry=self.registry)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise TelemetryConfigError(f"cannot serve Prometheus metrics on {host}:{port}: {exc}") from exc
        self.host = host
        self.port = self._server.server_port

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _span_processors(settings: TelemetrySettings) -> list:
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    processors = []
    for name in settings.traces_exporters:
        exporter = ConsoleSpanExporter() if name == "console" else _otlp_span_exporter()
        processors.append(BatchSpanProcessor(exporter))
    return processors


def _metric_readers(settings: TelemetrySettings) -> tuple[list, PrometheusEndpoint | None]:
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    readers: list = []
    endpoint = None
    for name in settings.metrics_exporters:
        if name == "prometheus":
            endpoint = PrometheusEndpoint(settings.prometheus_host, settings.prometheus_port)
            readers.append(endpoint.reader)
        else:
            exporter = ConsoleMetricExporter() if name == "console" else _otlp_metric_exporter()
            readers.append(PeriodicExportingMetricReader(exporter))
    return readers, endpoint


class Telemetry:
    """One service's tracer and meter (either may be absent) and the gRPC interceptors on them.

    Build with :meth:`from_settings` (exporters from the settings), :meth:`create` (explicit
    span processors and metric readers: tests) or :meth:`disabled`. ``shutdown()`` flushes and
    stops everything this object started.
    """

    def __init__(
        self,
        settings: TelemetrySettings,
        *,
        tracer_provider=None,
        meter_provider=None,
        prometheus: PrometheusEndpoint | None = None,
        span_processors: Iterable = (),
        metric_readers: Iterable = (),
    ) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.prometheus = prometheus
        #: What the providers export through (for introspection; owned by the providers).
        self.span_processors = tuple(span_processors)
        self.metric_readers = tuple(metric_readers)
        self.tracer = (
            tracer_provider.get_tracer(names.SCOPE, VERSION) if tracer_provider is not None else None
        )
        self.meter = meter_provider.get_meter(names.SCOPE, VERSION) if meter_provider is not None else None
        old = settings.rpc_old_conventions
        self._server_rpc = RpcInstruments(self.meter, side="server", old_conventions=old)
        self._client_rpc = RpcInstruments(self.meter, side="client", old_conventions=old)
        self._closed = False

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def disabled(cls, settings: TelemetrySettings | None = None) -> Telemetry:
        return cls(settings or TelemetrySettings())

    @classmethod
    def create(
        cls,
        settings: TelemetrySettings,
        *,
        span_processors: Iterable = (),
        metric_readers: Iterable = (),
        prometheus: PrometheusEndpoint | None = None,
    ) -> Telemetry:
        """Providers over the given processors and readers (none given: that signal is off)."""
        span_processors, metric_readers = list(span_processors), list(metric_readers)
        if not span_processors and not metric_readers:
            return cls.disabled(settings)
        from opentelemetry.sdk.resources import Resource

        resource = Resource.create(dict(settings.resource_attributes))
        tracer_provider = meter_provider = None
        if span_processors:
            from opentelemetry.sdk.trace import TracerProvider

            tracer_provider = TracerProvider(resource=resource)
            for processor in span_processors:
                tracer_provider.add_span_processor(processor)
        if metric_readers:
            from opentelemetry.sdk.metrics import MeterProvider

            meter_provider = MeterProvider(resource=resource, metric_readers=metric_readers)
        return cls(
            settings,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            prometheus=prometheus,
            span_processors=span_processors,
            metric_readers=metric_readers,
        )

    @classmethod
    def from_settings(cls, settings: TelemetrySettings) -> Telemetry:
        """Exporters as the settings name them (optional packages imported only then)."""
        if not settings.enabled:
            return cls.disabled(settings)
        processors = _span_processors(settings)
        readers, endpoint = _metric_readers(settings)
        try:
            return cls.create(
                settings, span_processors=processors, metric_readers=readers, prometheus=endpoint
            )
        except BaseException:
            if endpoint is not None:
                endpoint.close()
            raise

    # ---- use -------------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        return self.tracer is not None or self.meter is not None

    @property
    def service_name(self) -> str:
        return self.settings.service_name

    def server_interceptors(self) -> list:
        """For ``create_server(..., interceptors=...)``: empty when telemetry is off."""
        if not self.enabled:
            return []
        observer = RpcObserver(
            self.tracer, self._server_rpc, side="server", old_conventions=self.settings.rpc_old_conventions
        )
        return make_server_interceptors(observer)

    def client_interceptors(self, target: str = "") -> list:
        """For ``grpc.aio.insecure_channel(target, interceptors=...)``: empty when off."""
        if not self.enabled:
            return []
        observer = RpcObserver(
            self.tracer,
            self._client_rpc,
            side="client",
            target=target,
            old_conventions=self.settings.rpc_old_conventions,
        )
        return make_client_interceptors(observer)

    def install_global(self) -> None:
        """Make these providers the OpenTelemetry globals (so application and library code using
        ``trace.get_tracer`` joins the same traces), unless something set them already."""
        if self.tracer_provider is not None and isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider
        ):
            trace.set_tracer_provider(self.tracer_provider)
        if (
            self.meter_provider is not None
            and type(otel_metrics.get_meter_provider()).__name__ == "_ProxyMeterProvider"
        ):
            otel_metrics.set_meter_provider(self.meter_provider)

    def force_flush(self, timeout_ms: int = 5000) -> None:
        if self.tracer_provider is not None:
            self.tracer_provider.force_flush(timeout_ms)
        if self.meter_provider is not None:
            self.meter_provider.force_flush(timeout_ms)

    def shutdown(self) -> None:
        """Flush and stop the providers and the Prometheus endpoint (idempotent)."""
        if self._closed:
            return
        self._closed = True
        for provider in (self.tracer_provider, self.meter_provider):
            if provider is None:
                continue
            try:
                provider.shutdown()
            except Exception:
                log.exception("telemetry provider shutdown failed")
        if self.prometheus is not None:
            self.prometheus.close()
