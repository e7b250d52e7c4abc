"""One gateway process: the metadata cache, the handlers, the gRPC server.

Start order: start the metadata watch, then serve (a request that arrives before the first
snapshot refreshes the metadata itself), then write the ready file. Stop order (SIGTERM): health
NOT_SERVING, finish in-flight calls, let background acks=none appends end, close the watch and
every channel. The gateway keeps no state of its own, so nothing needs saving.
"""

from __future__ import annotations

import asyncio
import logging
import os

from gateway.server.admin_forwarder import Forwarder
from gateway.server.authentication import Authenticator, TokenInterceptor
from gateway.server.authorization import Gatekeeper, follow_acls
from gateway.server.config import GatewayConfig
from gateway.server.coordinators import CoordinatorPool
from gateway.server.data_listener import DataListener
from gateway.server.decode_pool import DecodePool
from gateway.server.delete_records import DeleteRecordsHandler
from gateway.server.fetch import FetchHandler
from gateway.server.offsets import OffsetsHandler
from gateway.server.produce import ProduceHandler
from gateway.server.quotas import ClientQuotas, QuotaWindows, follow_quotas
from gateway.server.routing import MetadataWatch, NodeClients, Router
from gateway.server.servicer import GatewayServicer
from gateway.server.telemetry import GatewayInstruments
from services.clock import SYSTEM_CLOCK, Clock
from services.entrypoint import write_ready_file
from services.grpc_server import (
    GrpcServer,
    ServiceRegistration,
    create_server,
    health_address,
    run_until_signalled,
)
from services.proto import GATEWAY_SERVICE, gateway_grpc
from services.telemetry import Telemetry, setup_telemetry
from services.tls import ReloadingSslContext, ServerTls, grpc_server_credentials, member_tls
from services.tokens import TokenVerifier

log = logging.getLogger(__name__)


class GatewayService:
    """Owns every part of a running gateway; ``start()`` then ``stop()`` (or ``run()``)."""

    def __init__(
        self, config: GatewayConfig, *, clock: Clock = SYSTEM_CLOCK, telemetry: Telemetry | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        #: Given (tests share one) or built from the config and OTEL_* environment; off by default.
        self._owns_telemetry = telemetry is None
        self.telemetry = (
            telemetry
            if telemetry is not None
            else setup_telemetry(
                "tributary-gateway",
                exporter=config.telemetry_exporter,
                metrics_address=config.metrics_address,
                default_host=config.host,
            )
        )
        self.instruments = GatewayInstruments(self.telemetry) if self.telemetry.enabled else None
        self.grpc: GrpcServer | None = None
        self.coordinators: CoordinatorPool | None = None
        self.router: Router | None = None
        self.produce: ProduceHandler | None = None
        self.decode_pool: DecodePool | None = None
        self.data_listener: DataListener | None = None
        self._acl_task: asyncio.Task | None = None
        #: Client quotas: every client's allowances, following the coordinators (always on; a
        #: client without a quota is not metered).
        self.quotas = ClientQuotas(
            QuotaWindows(config.quota_window_num, config.quota_window_size_seconds), clock=clock.monotonic
        )
        if self.instruments is not None:
            self.instruments.watch_quotas(self.quotas)
        self._quota_task: asyncio.Task | None = None

    async def start(self) -> None:
        config = self.config
        interceptors = self.telemetry.client_interceptors if self.telemetry.enabled else None
        member = member_tls(config)
        internal = member.client if member is not None else None
        self.coordinators = CoordinatorPool(config.coordinators, interceptors=interceptors, tls=internal)
        cache = MetadataWatch(self.coordinators, poll_interval_s=config.metadata_poll_interval_ms / 1000.0)
        self.router = Router(
            cache,
            NodeClients(
                fetch_connections=config.fetch_connections_per_node,
                interceptors=interceptors,
                data_port_appends=config.data_port_appends,
                tracer=self.telemetry.tracer if self.telemetry.enabled else None,
                tls=internal,
            ),
        )
        self.router.start()
        self.decode_pool = DecodePool(threads=config.fetch_decode_threads)
        self.produce = ProduceHandler(
            self.router,
            clock=self.clock,
            default_timeout_ms=config.default_timeout_ms,
            max_batch_bytes=config.max_batch_bytes,
            max_unacked=config.max_unacked_appends,
            telemetry=self.instruments,
            offload=self.decode_pool.run,
        )
        fetch = FetchHandler(
            self.router,
            self.decode_pool,
            max_decoded_records=config.fetch_max_decoded_records,
            max_decoded_bytes=config.fetch_max_decoded_bytes,
            telemetry=self.instruments,
        )
        tls = (
            ServerTls(config.tls_cert_file, config.tls_key_file, config.tls_client_ca_file)
            if config.tls_cert_file is not None and config.tls_key_file is not None
            else None
        )
        verifier = (
            TokenVerifier.from_file(
                config.token_public_key_file, issuer=config.token_issuer, audience=config.token_audience
            )
            if config.token_public_key_file is not None
            else None
        )
        authenticator = Authenticator(verifier)
        self.gatekeeper: Gatekeeper | None = None
        if config.authorizer_enabled:
            self.gatekeeper = Gatekeeper(config.super_users)
            self._acl_task = asyncio.create_task(
                follow_acls(self.coordinators, self.gatekeeper), name="gateway-acls"
            )
        self._quota_task = asyncio.create_task(
            follow_quotas(self.coordinators, self.quotas), name="gateway-quotas"
        )
        if config.data_listener:
            self.data_listener = DataListener(
                self.produce,
                fetch,
                host=config.host,
                port=config.data_port,
                max_connections=config.data_max_connections,
                max_in_flight_bytes=config.data_max_in_flight_bytes,
                stall_timeout_s=config.data_stall_timeout_ms / 1000.0,
                max_idle_s=config.data_max_idle_ms / 1000.0 if config.data_max_idle_ms > 0 else None,
                max_fetch_sessions=config.data_fetch_sessions_per_connection,
                max_session_partitions=config.data_fetch_session_max_partitions,
                telemetry=self.instruments,
                ssl_context=ReloadingSslContext(tls) if tls is not None else None,
                gatekeeper=self.gatekeeper,
                authenticator=authenticator,
                quotas=self.quotas,
            )
            await self.data_listener.start()
        servicer = GatewayServicer(
            self.produce,
            fetch,
            OffsetsHandler(self.router),
            Forwarder(self.coordinators, cache, timeout_s=config.admin_timeout_ms / 1000.0),
            self.decode_pool,
            DeleteRecordsHandler(self.router),
            default_timeout_ms=config.default_timeout_ms,
            stream_max_idle_ms=config.produce_stream_max_idle_ms,
            data_address=f"{config.host}:{self.data_port}" if self.data_listener is not None else "",
            gatekeeper=self.gatekeeper,
            authenticator=authenticator,
            quotas=self.quotas,
        )
        self.grpc = await create_server(
            f"{config.host}:{config.port}",
            [ServiceRegistration(gateway_grpc.add_GatewayServicer_to_server, servicer, GATEWAY_SERVICE)],
            # The token check first: a call without a valid token reaches nothing else.
            interceptors=[
                *([TokenInterceptor(verifier)] if verifier is not None else []),
                *self.telemetry.server_interceptors(),
            ],
            credentials=grpc_server_credentials(tls) if tls is not None else None,
            health_address=health_address(config),
        )
        self._write_ready_file()
        log.info(
            "gateway serving on %s:%d%s, data listener %s (coordinators %s%s)",
            config.host,
            self.grpc.port,
            ""
            if tls is None
            else (
                " with mutual TLS"
                if tls.client_ca_file
                else (" with TLS and bearer tokens" if verifier is not None else " with TLS")
            ),
            self.data_port or "off",
            ",".join(config.coordinators),
            "" if member is None else "; mutual TLS to coordinators and storage nodes",
        )

    @property
    def port(self) -> int:
        assert self.grpc is not None, "start() first"
        return self.grpc.port

    @property
    def data_port(self) -> int:
        """The raw data listener's port; 0 when it is off."""
        return self.data_listener.port if self.data_listener is not None else 0

    def _write_ready_file(self) -> None:
        write_ready_file(
            self.config.ready_file,
            {
                "pid": os.getpid(),
                "host": self.config.host,
                "grpc_port": self.port,
                "data_port": self.data_port,
                "health_port": self.grpc.health_port if self.grpc is not None else 0,
            },
        )

    async def stop(self) -> None:
        """Release everything after the server stopped (``run`` calls it after the grace period)."""
        if self._acl_task is not None:
            self._acl_task.cancel()
        if self._quota_task is not None:
            self._quota_task.cancel()
        if self.data_listener is not None:
            await self.data_listener.close()
        if self.produce is not None:
            await self.produce.close()
        if self.router is not None:
            await self.router.close()
        if self.coordinators is not None:
            await self.coordinators.close()
        if self.decode_pool is not None:
            self.decode_pool.close()
        if self._owns_telemetry:
            self.telemetry.shutdown()  # flushes the last spans and metrics
        log.info("gateway stopped")

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop serving and release everything (for callers that do not use ``run``)."""
        if self.grpc is not None:
            await self.grpc.stop(grace)
        await self.stop()

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop gracefully."""
        await self.start()
        assert self.grpc is not None
        await run_until_signalled(self.grpc, self.stop)
