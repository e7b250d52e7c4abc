"""One storage node process: the log manager, the gRPC service, the fetch port, registration.

Start order: recover every partition from disk, start serving (gRPC and fetch port), follow the
active controller in etcd, then register so nobody routes to the node before it can answer. Roles
arrive from the controller after registration (UpdateLeaderAndIsr): until then every partition
answers NOT_LEADER_OR_FOLLOWER. Stop order (SIGTERM): controlled shutdown while still serving
(the controller moves leadership off the node: ``storage_node/shutdown.py``), health
NOT_SERVING, finish in-flight calls, stop the replica fetchers and the fetch port, flush and
close every log (clean shutdown marker: next start skips the recovery scan), revoke the
registration lease last.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING

from services.clock import SYSTEM_CLOCK
from services.config import ConfigError
from services.entrypoint import write_ready_file
from services.grpc_server import (
    GrpcServer,
    ServiceRegistration,
    create_server,
    health_address,
    run_until_signalled,
)
from services.proto import STORAGE_SERVICE, storage_grpc
from services.telemetry import Telemetry, setup_telemetry
from services.tls import ReloadingClientContext, ReloadingSslContext, grpc_server_credentials, member_tls
from storage_node.config import StorageNodeConfig
from storage_node.descriptors import (
    DescriptorBudget,
    current_descriptor_limit,
    resolve_max_open_segments,
)
from storage_node.fetch.server import FetchLimits, FetchServer
from storage_node.handlers import StorageNodeHandlers
from storage_node.log.cleaner.manager import CleanerSettings, LogCleaner
from storage_node.log.log_manager import LogManager
from storage_node.notifier import AppendNotifier
from storage_node.replication.fetcher import ReplicaFetchers
from storage_node.replication.manager import ReplicaManager, ReplicationSettings
from storage_node.servicer import StorageNodeServicer
from storage_node.shutdown import ShutdownOutcome, ShutdownSettings, controlled_shutdown
from storage_node.telemetry import StorageNodeInstruments

if TYPE_CHECKING:  # imported when started with a controller (not standalone)
    from storage_node.registration import BrokerRegistration
    from storage_node.replication.controller_channel import ControllerChannel

log = logging.getLogger(__name__)


def _fetch_limits(config: StorageNodeConfig, descriptors: DescriptorBudget) -> FetchLimits:
    try:
        return FetchLimits(
            max_connections=descriptors.fetch_connections,
            max_connections_per_ip=config.fetch_max_connections_per_ip,
            max_wait_ms=config.fetch_max_wait_ms,
        )
    except ValueError as exc:
        raise ConfigError(
            "fetch.max.connections.per.ip and fetch.max.wait.ms must not be negative "
            f"(got {config.fetch_max_connections_per_ip} and {config.fetch_max_wait_ms})"
        ) from exc


def _cleaner_settings(config: StorageNodeConfig) -> CleanerSettings:
    try:
        return CleanerSettings(
            threads=config.log_cleaner_threads,
            dedupe_buffer_size=config.log_cleaner_dedupe_buffer_size,
            io_max_bytes_per_second=config.log_cleaner_io_max_bytes_per_second,
            backoff_ms=config.log_cleaner_backoff_ms,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


class StorageNode:
    """Owns every part of a running node; ``start()`` then ``stop()``."""

    def __init__(
        self, config: StorageNodeConfig, *, clock=SYSTEM_CLOCK, telemetry: Telemetry | None = None
    ) -> None:
        self.config = config
        self.clock = clock
        #: Mutual TLS on the gRPC and fetch ports and to other members (None: plaintext).
        self.member_tls = member_tls(config)
        #: Given (tests share one) or built from the config and OTEL_* environment; off by default.
        self._owns_telemetry = telemetry is None
        self.telemetry = (
            telemetry
            if telemetry is not None
            else setup_telemetry(
                "tributary-storage-node",
                exporter=config.telemetry_exporter,
                metrics_address=config.metrics_address,
                default_host=config.host,
                instance_id=f"storage-{config.node_id}",
            )
        )
        max_open_segments = resolve_max_open_segments(config.max_open_segments, current_descriptor_limit())
        self.logs = LogManager(
            [Path(d) for d in config.log_dirs],
            clock,
            dict(config.default_topic_configs),
            max_open_segments=max_open_segments,
            recovery_threads_per_dir=config.num_recovery_threads_per_data_dir,
            producer_id_expiration_ms=config.producer_id_expiration_ms,
            producer_id_expiration_check_interval_ms=config.producer_id_expiration_check_interval_ms,
        )
        self.notifier = AppendNotifier()
        self.cleaner = LogCleaner(self.logs.partitions, _cleaner_settings(config), time_ms=clock.time_ms)
        self.replication_settings = ReplicationSettings(
            replica_lag_time_max_ms=config.replica_lag_time_max_ms,
            replica_fetch_wait_max_ms=config.replica_fetch_wait_max_ms,
            replica_fetch_max_bytes=config.replica_fetch_max_bytes,
            replica_fetch_response_max_bytes=config.replica_fetch_response_max_bytes,
            replica_fetch_backoff_ms=config.replica_fetch_backoff_ms,
        )
        self.replicas = ReplicaManager(
            config.node_id, self.logs, self.notifier, clock, self.replication_settings
        )
        self.fetchers = ReplicaFetchers(
            config.node_id,
            self.replication_settings,
            clock,
            ssl=ReloadingClientContext(self.member_tls.client) if self.member_tls is not None else None,
        )
        self.shutdown_settings = ShutdownSettings(
            enable=config.controlled_shutdown_enable,
            timeout_ms=config.controlled_shutdown_timeout_ms,
            max_retries=config.controlled_shutdown_max_retries,
        )
        #: How the controlled shutdown ended, once it ran.
        self.shutdown_outcome: ShutdownOutcome | None = None
        self.controller_channel: ControllerChannel | None = None
        self.instruments = None
        if self.telemetry.enabled:
            self.instruments = StorageNodeInstruments(
                self.telemetry,
                logs=self.logs,
                fetch_stats=lambda: self.fetch_server.stats,
                throttled_bytes=lambda: self.fetchers.throttle.bytes_copied,
                cleaner=self.cleaner,
            )
        self.handlers = StorageNodeHandlers(
            self.logs,
            self.notifier,
            self.replicas,
            flush_before_ack=config.flush_before_ack,
            standalone=config.standalone,
            telemetry=self.instruments,
        )
        self.descriptors = DescriptorBudget.plan(
            current_descriptor_limit(),
            max_open_segments=max_open_segments,
            fetch_max_connections=config.fetch_max_connections,
        )
        self.fetch_server = FetchServer(
            self.replicas,
            self.notifier,
            host=config.host,
            port=config.fetch_port,
            zero_copy=config.fetch_zero_copy,
            limits=_fetch_limits(config, self.descriptors),
            telemetry=self.instruments,
            appender=self.handlers,
            tls=ReloadingSslContext(self.member_tls.server) if self.member_tls is not None else None,
        )
        self.grpc: GrpcServer | None = None
        self.registration: BrokerRegistration | None = None
        self._maintenance: asyncio.Task | None = None
        self._isr_upkeep: asyncio.Task | None = None

    async def start(self) -> None:
        self.logs.load()
        log.info("loaded %d partitions from %s", len(list(self.logs.partitions())), self.config.log_dirs)
        servicer = StorageNodeServicer(
            self.handlers, self.config.node_id, fetch_stats=lambda: self.fetch_server.stats
        )
        self.grpc = grpc = await create_server(
            f"{self.config.host}:{self.config.port}",
            [ServiceRegistration(storage_grpc.add_StorageNodeServicer_to_server, servicer, STORAGE_SERVICE)],
            interceptors=self.telemetry.server_interceptors(),
            credentials=grpc_server_credentials(self.member_tls.server)
            if self.member_tls is not None
            else None,
            health_address=health_address(self.config),
        )
        await self.fetch_server.start()
        self.cleaner.start()
        self._maintenance = asyncio.create_task(self._maintenance_routine(), name="log-maintenance")
        self._isr_upkeep = asyncio.create_task(self._isr_upkeep_routine(), name="isr-upkeep")
        if not self.config.standalone:
            from storage_node.registration import BrokerRegistration
            from storage_node.replication.controller_channel import ControllerChannel

            self.registration = registration = BrokerRegistration.from_config(
                self.config, grpc_port=grpc.port, fetch_port=self.fetch_server.port
            )
            self.controller_channel = channel = ControllerChannel(
                registration.client,
                self.replicas,
                tls=self.member_tls.client if self.member_tls is not None else None,
            )
            self.replicas.attach(isr_channel=channel, fetchers=self.fetchers)
            if self.config.transaction_verification:
                self.handlers.transaction_verifier = channel
            await channel.start()
            await registration.register()
        else:
            # No controller: this node is the whole ISR of every partition it holds.
            self.replicas.attach(isr_channel=None, fetchers=self.fetchers)
            for partition_log in self.logs.partitions():
                self.replicas.become_sole_leader(
                    partition_log.topic, partition_log.partition, max(partition_log.latest_epoch, 0)
                )
        self._write_ready_file()
        limits = self.fetch_server.limits
        log.info(
            "storage node %d serving%s: grpc %s:%d, fetch %s:%d (at most %d connections, %s per "
            "address, long polls up to %d ms; descriptor limit %d, %d kept for the log)",
            self.config.node_id,
            "" if self.member_tls is None else " with mutual TLS on its internal ports",
            self.config.host,
            self.grpc.port,
            self.config.host,
            self.fetch_server.port,
            limits.max_connections,
            limits.max_connections_per_ip or "any",
            limits.max_wait_ms,
            self.descriptors.limit,
            self.descriptors.reserved,
        )

    def _write_ready_file(self) -> None:
        assert self.grpc is not None, "written once started"
        write_ready_file(
            self.config.ready_file,
            {
                "node_id": self.config.node_id,
                "pid": os.getpid(),
                "host": self.config.host,
                "grpc_port": self.grpc.port,
                "fetch_port": self.fetch_server.port,
                "health_port": self.grpc.health_port,
            },
        )

    async def _maintenance_routine(self) -> None:
        interval = self.config.maintenance_interval_ms / 1000.0
        while True:
            await asyncio.sleep(interval)
            try:
                # Flushes (fsync) and retention deletes block: keep them off the event loop.
                await asyncio.to_thread(self.logs.tick)
            except Exception:
                log.exception("log maintenance failed")

    async def _isr_upkeep_routine(self) -> None:
        """Leaders drop lagging followers from the ISR; idle fetchers are stopped."""
        interval = max(0.05, self.replication_settings.replica_lag_time_max_ms / 2000.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.replicas.maintain()
                await self.fetchers.stop_idle()
            except Exception:
                log.exception("ISR upkeep failed")

    async def controlled_shutdown(self) -> None:
        """Have the controller move this node's partitions elsewhere before it stops (SIGTERM;
        still serving). Does nothing standalone or with ``controlled_shutdown_enable=false``."""
        channel, registration = self.controller_channel, self.registration
        if channel is None or registration is None or not self.shutdown_settings.enable:
            return
        self.shutdown_outcome = await controlled_shutdown(
            channel,
            await registration.current_broker_epoch(),
            lambda: [p.key for p in self.replicas.leaders()],
            self.shutdown_settings,
            tracer=self.telemetry.tracer,
        )

    async def stop(self) -> None:
        for task in (self._maintenance, self._isr_upkeep):
            if task is not None:
                task.cancel()
        log.info("stopping: replica fetchers")
        await self.fetchers.stop()
        if self.controller_channel is not None:
            await self.controller_channel.stop()
        self.replicas.stop()
        log.info("stopping: fetch port")
        await self.fetch_server.stop()
        log.info("stopping: log cleaner")
        await asyncio.to_thread(self.cleaner.stop)
        log.info("stopping: flushing and closing the logs")
        self.logs.close()
        if self.registration is not None:
            log.info("stopping: revoking the registration")
            await self.registration.deregister()
        if self._owns_telemetry:
            self.telemetry.shutdown()  # flushes the last spans and metrics
        log.info("storage node %d stopped cleanly", self.config.node_id)

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop gracefully."""
        await self.start()
        assert self.grpc is not None
        await run_until_signalled(self.grpc, self.stop, before_stop=self.controlled_shutdown)
