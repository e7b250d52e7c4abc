"""Settings of one coordinator process (file, ``TRIBUTARY_COORDINATOR_*`` environment, flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.config import InternalPortTlsConfig, ServiceConfig
from services.tls import member_tls_problem

ENV_PREFIX = "TRIBUTARY_COORDINATOR"


@dataclass
class CoordinatorConfig(ServiceConfig, InternalPortTlsConfig):
    #: Stable id of this coordinator; empty = "<hostname>-<port>" once the port is bound.
    coordinator_id: str = ""
    #: Address other coordinators and gateways use to reach this one; also the bind address.
    host: str = "127.0.0.1"
    #: gRPC port of the Coordinator service (0 = any free port).
    port: int = 0
    #: etcd endpoints, host:port (or http(s)://host:port), comma-separated.
    etcd_endpoints: list[str] = field(default_factory=lambda: ["127.0.0.1:2379"])
    #: Deadline of each etcd call, seconds.
    etcd_timeout_s: float = 5.0
    #: TLS to etcd: the CA bundle that signed etcd's certificate (optional).
    etcd_ca_file: Path | None = None
    #: TLS to etcd: this coordinator's client certificate, for etcd's --client-cert-auth (optional).
    etcd_cert_file: Path | None = None
    #: TLS to etcd: the key of ``etcd_cert_file`` (optional).
    etcd_key_file: Path | None = None
    #: Cluster name: keys live under /tributary/<cluster>/ in etcd.
    cluster: str = "local"
    #: TTL of the election and registration leases: a crashed controller is replaced this long
    #: (plus up to ~1 s) after it dies.
    session_timeout_s: int = 6
    #: Controller: reconcile pass period without changes (retries of failed storage-node calls).
    reconcile_interval_s: float = 1.0
    #: Controller: how long admin calls wait for partitions to come online / data to be deleted
    #: (and, halved, how long EndTxn waits for its transaction's markers before answering: the
    #: outcome is decided and recorded by then, the markers follow).
    admin_wait_s: float = 10.0
    #: Controller: storage-node RPCs in flight at once.
    max_parallel_rpcs: int = 64
    #: Controller: the deadline of each storage-node RPC, seconds.
    storage_rpc_timeout_s: float = 5.0
    #: Replication factor of topics created without one (Kafka's default.replication.factor).
    default_replication_factor: int = 1
    #: Partition limits, enforced by the active controller (set them alike on every coordinator).
    #: Most partitions one topic may have: CreateTopic and CreatePartitions above it are refused
    #: at once with INVALID_PARTITIONS. 10,000 is far beyond what one topic's consumers need
    #: (Kafka guidance keeps topics in the tens to low thousands) and its metadata record stays
    #: under ~170 KiB at replication factor 3, well inside one etcd write.
    max_partitions_per_topic: int = 10_000
    #: Most partitions the cluster may hold, all topics together (topics being deleted count until
    #: they are gone): a create or grow past it is refused with POLICY_VIOLATION. 200,000 is the
    #: per-cluster ceiling long advised for ZooKeeper-based Kafka; Tributary aims at tens of
    #: thousands of partitions working well, and this leaves room above that.
    max_partitions_per_cluster: int = 200_000
    #: Move leadership back to each partition's preferred (first) replica on its own when a
    #: node's share of it led elsewhere is above leader_imbalance_per_broker_percentage (Kafka's
    #: auto.leader.rebalance.enable; `tributary topics elect-leaders` does it on demand).
    auto_leader_rebalance_enable: bool = True
    #: The imbalance that triggers it, percent (leader.imbalance.per.broker.percentage).
    leader_imbalance_per_broker_percentage: int = 10
    #: How often the imbalance is checked, seconds (leader.imbalance.check.interval.seconds).
    leader_imbalance_check_interval_s: float = 300.0
    #: Deadline when a standby forwards an admin call to the active controller.
    forward_timeout_s: float = 10.0
    #: etcd health probe period; metadata is refused (UNAVAILABLE) while the probe fails.
    health_interval_s: float = 0.5
    #: Consumer groups: the shortest session timeout a member may ask for
    #: (Kafka's group.min.session.timeout.ms).
    group_min_session_timeout_ms: int = 6_000
    #: Consumer groups: the longest session timeout a member may ask for
    #: (Kafka's group.max.session.timeout.ms).
    group_max_session_timeout_ms: int = 1_800_000
    #: Committed offsets of a group without members expire this long after it emptied (Kafka's
    #: offsets.retention.minutes, 7 days).
    offsets_retention_minutes: int = 10_080
    #: How often expired offsets are looked for, seconds (offsets.retention.check.interval.ms).
    offsets_retention_check_interval_s: float = 600.0
    #: Longest metadata string a commit may store per partition (offset.metadata.max.bytes).
    offset_metadata_max_bytes: int = 4_096
    #: Transactions: the longest transaction timeout a producer may ask for (Kafka's
    #: transaction.max.timeout.ms, 15 min); InitProducerId above it is INVALID_TRANSACTION_TIMEOUT.
    transaction_max_timeout_ms: int = 900_000
    #: Transactions: how often the active controller looks for transactions open longer than their
    #: timeout and aborts them, fencing their producer (Kafka's
    #: transaction.abort.timed.out.transaction.cleanup.interval.ms, 10 s).
    transaction_abort_check_interval_ms: int = 10_000
    #: Transactions: a transactional id with no transaction for this long is forgotten -- its etcd
    #: key is deleted, and its next InitProducerId starts it over with a new producer id (Kafka's
    #: transactional.id.expiration.ms, 7 days).
    transactional_id_expiration_ms: int = 604_800_000
    #: Transactions: how often transactional ids are checked for expiry (Kafka's
    #: transaction.remove.expired.transaction.cleanup.interval.ms, 1 h).
    transaction_remove_expired_interval_ms: int = 3_600_000
    #: Transactions: producer ids the active controller takes from etcd's counter at a time, so one
    #: etcd write serves this many InitProducerId calls (ids left when a term ends are never used).
    producer_id_block_size: int = 1_000
    #: With a metrics exporter on: how often the active controller samples every group's lag
    #: per partition into the ``tributary.consumer.lag`` gauge (seconds).
    lag_sample_interval_s: float = 10.0


def config_problem(config: CoordinatorConfig) -> str | None:
    """What is wrong with settings that parsed but cannot be honoured (None when nothing)."""
    problem = member_tls_problem(config)
    if problem is not None:
        return problem
    for name in (
        "max_partitions_per_topic",
        "max_partitions_per_cluster",
        "transaction_max_timeout_ms",
        "transaction_abort_check_interval_ms",
        "transactional_id_expiration_ms",
        "transaction_remove_expired_interval_ms",
        "producer_id_block_size",
    ):
        if getattr(config, name) < 1:
            return f"--{name.replace('_', '-')} must be at least 1, not {getattr(config, name)}"
    if not 0 <= config.leader_imbalance_per_broker_percentage <= 100:
        return "--leader-imbalance-per-broker-percentage must be between 0 and 100"
    if config.leader_imbalance_check_interval_s <= 0:
        return "--leader-imbalance-check-interval-s must be positive"
    return None
