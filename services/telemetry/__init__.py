"""OpenTelemetry for every Tributary service and for the SDK: providers, gRPC tracing, metrics.

Off by default and then free: no provider, no interceptor, no instrument (hot paths test one
``None``). Turned on by the standard ``OTEL_*`` variables or a service's ``telemetry_exporter``
/ ``metrics_address`` settings (see :mod:`services.telemetry.settings`).

Services (their assembly classes do this)::

    telemetry = setup_telemetry("tributary-gateway", exporter=config.telemetry_exporter,
                                metrics_address=config.metrics_address, default_host=config.host)
    server = await create_server(addr, regs, interceptors=telemetry.server_interceptors())
    channel = grpc.aio.insecure_channel(target, interceptors=telemetry.client_interceptors(target))
    ...
    telemetry.shutdown()  # flush on stop

SDK (``gateway/client``), which must not configure providers itself -- the application does::

    channel = grpc.aio.insecure_channel(target, interceptors=client_interceptors(target))
    instruments = client_instruments(target)  # None unless the application set a MeterProvider

Consumer-group code: :func:`record_consumer_lag` / :func:`forget_consumer_lag` or
:func:`register_consumer_lag_source` (see :mod:`services.telemetry.lag`).

Names of everything emitted: :mod:`services.telemetry.names`. Each service's instruments live in
that service (``storage_node/telemetry.py``, ``coordinator/telemetry.py``,
``gateway/server/telemetry.py``), built from :mod:`services.telemetry.metrics`.
"""

from __future__ import annotations

import os
import weakref

from opentelemetry import metrics as otel_metrics
from opentelemetry import trace

from services.telemetry import names
from services.telemetry.client import ClientInstruments
from services.telemetry.lag import (
    CONSUMER_LAG,
    ConsumerLagRegistry,
    forget_consumer_lag,
    record_consumer_lag,
    register_consumer_lag_source,
)
from services.telemetry.rpc import (
    RpcInstruments,
    RpcObserver,
    extract_context,
    inject_metadata,
    make_client_interceptors,
)
from services.telemetry.settings import TelemetryConfigError, TelemetrySettings, telemetry_settings
from services.telemetry.setup import VERSION, PrometheusEndpoint, Telemetry

__all__ = [
    "CONSUMER_LAG",
    "ClientInstruments",
    "ConsumerLagRegistry",
    "PrometheusEndpoint",
    "Telemetry",
    "TelemetryConfigError",
    "TelemetrySettings",
    "client_instruments",
    "client_interceptors",
    "client_tracer",
    "extract_context",
    "forget_consumer_lag",
    "inject_metadata",
    "names",
    "record_consumer_lag",
    "register_consumer_lag_source",
    "setup_telemetry",
    "telemetry_settings",
]


def setup_telemetry(
    service_name: str,
    *,
    exporter: str = "",
    metrics_address: str = "",
    default_host: str = "localhost",
    instance_id: str = "",
    install_global: bool = True,
) -> Telemetry:
    """A service process's telemetry from the environment and its config (off unless asked).

    With ``install_global`` the providers also become the OpenTelemetry globals (first caller
    wins), so :func:`client_interceptors` and application code in the process share them.
    Raises :class:`TelemetryConfigError` for unknown exporters or a missing optional package.
    """
    settings = telemetry_settings(
        service_name,
        exporter=exporter,
        metrics_address=metrics_address,
        default_host=default_host,
        instance_id=instance_id,
    )
    telemetry = Telemetry.from_settings(settings)
    if install_global and telemetry.enabled:
        telemetry.install_global()
    return telemetry


# ---- the SDK's entry points: the application's global providers ---------------------------------

_client_rpc_instruments: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_client_messaging_instruments: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sdk_disabled() -> bool:
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() in {"1", "true", "yes", "on"}


def _configured_tracer_provider(tracer_provider=None):
    provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
    if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
        return None
    return provider


def _configured_meter_provider(meter_provider=None):
    provider = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
    if (
        isinstance(provider, otel_metrics.NoOpMeterProvider)
        or type(provider).__name__ == "_ProxyMeterProvider"
    ):
        return None
    return provider


def _old_rpc_conventions() -> bool:
    return "rpc/dup" in [v.strip() for v in os.environ.get("OTEL_SEMCONV_STABILITY_OPT_IN", "").split(",")]


def client_interceptors(target: str = "", *, tracer_provider=None, meter_provider=None) -> list:
    """gRPC client interceptors for a ``grpc.aio`` channel to ``target`` (host:port), on the
    application's global providers (or the ones given).

    Returns ``[]`` -- no interceptor, no cost -- when the application configured no
    OpenTelemetry SDK (the global providers are still the API's no-op proxies) or set
    ``OTEL_SDK_DISABLED=true``. Call it when the channel is created, after the application set
    its providers.
    """
    if _sdk_disabled():
        return []
    tracer_provider = _configured_tracer_provider(tracer_provider)
    meter_provider = _configured_meter_provider(meter_provider)
    if tracer_provider is None and meter_provider is None:
        return []
    old = _old_rpc_conventions()
    tracer = tracer_provider.get_tracer(names.SCOPE, VERSION) if tracer_provider is not None else None
    instruments = None
    if meter_provider is not None:
        instruments = _client_rpc_instruments.get(meter_provider)
        if instruments is None:
            instruments = RpcInstruments(
                meter_provider.get_meter(names.SCOPE, VERSION), side="client", old_conventions=old
            )
            _client_rpc_instruments[meter_provider] = instruments
    observer = RpcObserver(tracer, instruments, side="client", target=target, old_conventions=old)
    return make_client_interceptors(observer)


def client_tracer(*, tracer_provider=None):
    """The SDK's tracer on the application's global TracerProvider (or the one given), or None
    when the application configured no OpenTelemetry SDK or set ``OTEL_SDK_DISABLED``."""
    if _sdk_disabled():
        return None
    provider = _configured_tracer_provider(tracer_provider)
    return provider.get_tracer(names.SCOPE, VERSION) if provider is not None else None


def client_instruments(target: str = "", *, meter_provider=None) -> ClientInstruments | None:
    """The messaging-client metrics (sent / consumed messages, operation duration) for the SDK,
    or None when the application set no MeterProvider (then record nothing: zero cost)."""
    if _sdk_disabled():
        return None
    meter_provider = _configured_meter_provider(meter_provider)
    if meter_provider is None:
        return None
    per_target = _client_messaging_instruments.setdefault(meter_provider, {})
    instruments = per_target.get(target)
    if instruments is None:
        host, _, port = target.rpartition(":")
        address, number = (host, int(port)) if host and port.isdigit() else (target, None)
        if per_target:  # share the instruments, vary only the peer attributes
            instruments = next(iter(per_target.values())).with_peer(address, number)
        else:
            instruments = ClientInstruments(
                meter_provider.get_meter(names.SCOPE, VERSION), server_address=address, server_port=number
            )
        per_target[target] = instruments
    return instruments
