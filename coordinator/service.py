"""One coordinator process: etcd client, metadata cache, election, gRPC service, registration.

Start order: bind and serve gRPC (answers UNAVAILABLE until metadata is loaded), follow etcd
with the metadata cache and the health probe, register ``coordinators/<id>`` under a lease,
campaign for the controller seat, and write the ready file once the cache holds a snapshot. Stop
order (SIGTERM): health NOT_SERVING, in-flight calls finish, resign the controller seat (deleting
the key, so a standby takes over at once instead of after the TTL), revoke the registration
lease, close connections.

Nothing here exits because etcd is unreachable: every routine retries, and calls answer
COORDINATOR_NOT_AVAILABLE meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from coordinator import keys
from coordinator.acls import AclCache
from coordinator.config import CoordinatorConfig
from coordinator.controller import ControllerSettings
from coordinator.groups.handlers import GroupHandlers
from coordinator.groups.manager import GroupSettings
from coordinator.handlers import CoordinatorHandlers
from coordinator.health import EtcdHealth
from coordinator.leadership import Leadership
from coordinator.metadata import MetadataCache
from coordinator.model import CoordinatorInfo, PartitionStatus
from coordinator.quotas import QuotaCache
from coordinator.redirect import Forwarder
from coordinator.servicer import CoordinatorServicer
from coordinator.storage_client import StorageNodes
from coordinator.telemetry import ClusterHealth, CoordinatorInstruments
from coordinator.transactions.handlers import TransactionHandlers
from coordinator.transactions.manager import TransactionSettings
from services.cluster_keys import cluster_prefix
from services.entrypoint import write_ready_file
from services.etcd.client import EtcdClient
from services.etcd.connection import Backoff, tls_from_files
from services.etcd.exceptions import EtcdError
from services.grpc_server import (
    GrpcServer,
    ServiceRegistration,
    create_server,
    health_address,
    run_until_signalled,
)
from services.proto import COORDINATOR_SERVICE, coordinator_grpc
from services.telemetry import Telemetry, setup_telemetry
from services.tls import grpc_server_credentials, member_tls

log = logging.getLogger(__name__)


class CoordinatorService:
    """Owns every part of a running coordinator; ``start()`` then ``stop()``."""

    def __init__(self, config: CoordinatorConfig, *, telemetry: Telemetry | None = None) -> None:
        self.config = config
        self.coordinator_id = config.coordinator_id or f"{socket.gethostname()}-{os.getpid()}"
        #: Mutual TLS on the gRPC port and to storage nodes and other coordinators (None: plaintext).
        self.member_tls = member_tls(config)
        member_client = self.member_tls.client if self.member_tls is not None else None
        #: Given (tests share one) or built from the config and OTEL_* environment; off by default.
        self._owns_telemetry = telemetry is None
        self.telemetry = (
            telemetry
            if telemetry is not None
            else setup_telemetry(
                "tributary-coordinator",
                exporter=config.telemetry_exporter,
                metrics_address=config.metrics_address,
                default_host=config.host,
                instance_id=self.coordinator_id,
            )
        )
        self.client = EtcdClient(
            config.etcd_endpoints,
            prefix=cluster_prefix(config.cluster),
            tls=tls_from_files(config.etcd_ca_file, config.etcd_cert_file, config.etcd_key_file),
            timeout=config.etcd_timeout_s,
        )
        self.cache = MetadataCache()
        self.health = EtcdHealth(
            self.client, interval=config.health_interval_s, timeout=min(1.0, config.etcd_timeout_s)
        )
        self.storage = StorageNodes(timeout=config.storage_rpc_timeout_s, tls=member_client)
        self.leadership = Leadership(
            client=self.client,
            cache=self.cache,
            storage=self.storage,
            identity=CoordinatorInfo(self.coordinator_id, config.host, 0),
            ttl=config.session_timeout_s,
            settings=ControllerSettings(
                reconcile_interval_s=config.reconcile_interval_s,
                admin_wait_s=config.admin_wait_s,
                max_parallel_rpcs=config.max_parallel_rpcs,
                default_replication_factor=config.default_replication_factor,
                max_partitions_per_topic=config.max_partitions_per_topic,
                max_partitions_per_cluster=config.max_partitions_per_cluster,
                auto_leader_rebalance_enable=config.auto_leader_rebalance_enable,
                leader_imbalance_per_broker_percentage=config.leader_imbalance_per_broker_percentage,
                leader_imbalance_check_interval_s=config.leader_imbalance_check_interval_s,
            ),
            group_settings=group_settings(config, lag_sampling=self.telemetry.enabled),
            transaction_settings=transaction_settings(config),
        )
        self.forwarder = Forwarder(self.coordinator_id, timeout=config.forward_timeout_s, tls=member_client)
        #: Every ACL, from the same watch as the metadata (WatchAcls streams it to gateways).
        self.acls = AclCache()
        self.cache.add_batch_listener(self.acls.apply)
        #: Every client quota, likewise (WatchClientQuotas streams it to gateways).
        self.quotas = QuotaCache()
        self.cache.add_batch_listener(self.quotas.apply)
        self.handlers = CoordinatorHandlers(
            coordinator_id=self.coordinator_id,
            cache=self.cache,
            leadership=self.leadership,
            health=self.health,
            acls=self.acls,
            quotas=self.quotas,
        )
        self.grpc: GrpcServer | None = None
        self._tasks: list[asyncio.Task] = []
        if self.telemetry.enabled:
            CoordinatorInstruments(
                self.telemetry,
                coordinator_id=self.coordinator_id,
                is_active=lambda: self.leadership.is_active,
                cluster_health=lambda: cluster_health(
                    self.cache.state,
                    unclean_elections=self.leadership.unclean_elections,
                    transactions=self.leadership.transactions,
                ),
            )

    @property
    def identity(self) -> CoordinatorInfo:
        return self.leadership.identity

    async def start(self) -> None:
        servicer = CoordinatorServicer(
            self.handlers,
            self.forwarder,
            GroupHandlers(self.handlers.group_manager),
            TransactionHandlers(self.handlers.transaction_manager),
        )
        self.grpc = await create_server(
            f"{self.config.host}:{self.config.port}",
            [
                ServiceRegistration(
                    coordinator_grpc.add_CoordinatorServicer_to_server, servicer, COORDINATOR_SERVICE
                )
            ],
            interceptors=self.telemetry.server_interceptors(),
            credentials=grpc_server_credentials(self.member_tls.server)
            if self.member_tls is not None
            else None,
            health_address=health_address(self.config),
        )
        # The address in etcd must carry the port actually bound (port 0 = any free port).
        self.leadership.identity = CoordinatorInfo(self.coordinator_id, self.config.host, self.grpc.port)
        self._spawn(self.health.probe_routine(), "etcd-health")
        self._spawn(self._cache_routine(), "metadata-cache")
        self._spawn(self._registration_routine(), "coordinator-registration")
        await self.cache.wait_for(lambda state: True, timeout=float("inf"))
        self._spawn(self.leadership.campaign_routine(), "controller-election")
        self._write_ready_file()
        log.info(
            "coordinator %s serving on %s%s (cluster %s, etcd %s)",
            self.coordinator_id,
            self.identity.address,
            "" if self.member_tls is None else " with mutual TLS",
            self.config.cluster,
            ",".join(self.config.etcd_endpoints),
        )

    def _spawn(self, routine, name: str) -> None:
        self._tasks.append(asyncio.create_task(routine, name=name))

    async def _cache_routine(self) -> None:
        """Follow etcd; opening the watch is retried while etcd is unreachable."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            try:
                await self.cache.watch_routine(self.client)
                return
            except EtcdError as exc:
                log.warning("cannot follow etcd metadata (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())

    async def _registration_routine(self) -> None:
        """Keep ``coordinators/<id>`` alive under a lease; register again after losing it."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        value = keys.encode_coordinator(self.identity)
        while True:
            try:
                lease = await self.client.grant_lease(self.config.session_timeout_s)
                try:
                    await self.client.put(keys.coordinator_key(self.coordinator_id), value, lease)
                    backoff.reset()
                    async with self.client.keep_alive(lease) as keep_alive:
                        await keep_alive.wait_lost()
                finally:
                    await _revoke_quietly(lease)
            except EtcdError as exc:
                log.warning("coordinator registration failed (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())

    def _write_ready_file(self) -> None:
        write_ready_file(
            self.config.ready_file,
            {
                "coordinator_id": self.coordinator_id,
                "pid": os.getpid(),
                "host": self.config.host,
                "grpc_port": self.identity.grpc_port,
                "health_port": self.grpc.health_port if self.grpc is not None else 0,
            },
        )

    async def stop(self) -> None:
        # Reverse start order: the election first, so the seat is handed over promptly.
        for task in reversed(self._tasks):
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self.forwarder.close()
        await self.storage.close()
        await self.client.close()
        if self._owns_telemetry:
            self.telemetry.shutdown()  # flushes the last spans and metrics
        log.info("coordinator %s stopped", self.coordinator_id)

    async def run(self) -> None:
        """Start, serve until SIGTERM/SIGINT, stop gracefully."""
        await self.start()
        assert self.grpc is not None
        await run_until_signalled(self.grpc, self.stop)


def group_settings(config: CoordinatorConfig, *, lag_sampling: bool = False) -> GroupSettings:
    return GroupSettings(
        lag_sample_interval_s=config.lag_sample_interval_s if lag_sampling else 0.0,
        min_session_timeout_ms=config.group_min_session_timeout_ms,
        max_session_timeout_ms=config.group_max_session_timeout_ms,
        offsets_retention_ms=config.offsets_retention_minutes * 60_000,
        offsets_retention_check_interval_s=config.offsets_retention_check_interval_s,
        offset_metadata_max_bytes=config.offset_metadata_max_bytes,
        load_wait_s=config.admin_wait_s,
    )


def transaction_settings(config: CoordinatorConfig) -> TransactionSettings:
    return TransactionSettings(
        max_timeout_ms=config.transaction_max_timeout_ms,
        id_expiration_ms=config.transactional_id_expiration_ms,
        abort_check_interval_s=config.transaction_abort_check_interval_ms / 1000,
        expiration_check_interval_s=config.transaction_remove_expired_interval_ms / 1000,
        producer_id_block_size=config.producer_id_block_size,
        # Well inside the deadline of a standby forwarding the call, so an EndTxn that waits the
        # whole time still gets its answer back through the standby.
        complete_wait_s=min(config.admin_wait_s, config.forward_timeout_s) / 2,
        load_wait_s=config.admin_wait_s,
    )


def cluster_health(state, *, unclean_elections: int = 0, transactions=None) -> ClusterHealth:
    """The coordinator's gauges, from its metadata cache's state. Runs on the metrics exporter's
    thread: it only reads (copies the topic map first)."""
    counts = {"online": 0, "offline": 0, "pending": 0}
    under_replicated = under_min_isr = reassigning = 0
    for topic in list(state.topics.values()):
        if topic.deleting:
            continue
        for partition in range(topic.partition_count):
            record = state.partition_record(topic.name, partition)
            reassigning += 1 if record is not None and record.reassigning else 0
            view = state.partition_view(topic, partition)
            counts[view.status.value.lower()] += 1
            adding = len(record.adding) if record is not None else 0  # copying: not yet expected
            if view.status is PartitionStatus.ONLINE and len(view.isr) < len(view.replicas) - adding:
                under_replicated += 1
            if view.status is PartitionStatus.ONLINE and len(view.isr) < _min_isr(topic):
                under_min_isr += 1
    epoch = state.controller.epoch if state.controller is not None else state.controller_epoch
    return ClusterHealth(
        controller_epoch=epoch,
        live_brokers=len(state.brokers),
        partitions=counts,
        under_replicated=under_replicated,
        under_min_isr=under_min_isr,
        reassigning=reassigning,
        unclean_elections=unclean_elections,
        **(transactions.health() if transactions is not None else {}),
    )


def _min_isr(topic) -> int:
    try:
        return int(topic.configs.get("min.insync.replicas", 1))
    except ValueError:
        return 1


async def _revoke_quietly(lease) -> None:
    try:
        await asyncio.shield(lease.revoke())
    except (EtcdError, asyncio.CancelledError):
        pass
