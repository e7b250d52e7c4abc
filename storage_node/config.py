"""Settings of one storage node process (file, ``TRIBUTARY_STORAGE_*`` environment, flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.config import InternalPortTlsConfig, ServiceConfig

ENV_PREFIX = "TRIBUTARY_STORAGE"


@dataclass
class StorageNodeConfig(ServiceConfig, InternalPortTlsConfig):
    #: Stable id of this node (Kafka's node.id / broker.id); unique among live nodes.
    node_id: int = 0
    #: Address clients use to reach this node; also the bind address.
    host: str = "127.0.0.1"
    #: gRPC port of the StorageNode service (0 = any free port).
    port: int = 0
    #: Raw TCP fetch port (0 = any free port).
    fetch_port: int = 0
    #: Data directories (Kafka's log.dirs); new partitions go to the least-loaded one.
    log_dirs: list[Path] = field(default_factory=lambda: [Path("data/storage-0")])
    #: etcd endpoints, host:port (or https://host:port), comma-separated.
    etcd_endpoints: list[str] = field(default_factory=lambda: ["127.0.0.1:2379"])
    #: Deadline of each etcd call, seconds.
    etcd_timeout_s: float = 5.0
    #: TLS to etcd: the CA bundle that signed etcd's certificate (optional; as the coordinator's).
    etcd_ca_file: Path | None = None
    #: TLS to etcd: this node's client certificate, for etcd's --client-cert-auth (optional).
    etcd_cert_file: Path | None = None
    #: TLS to etcd: the key of ``etcd_cert_file`` (optional).
    etcd_key_file: Path | None = None
    #: Cluster name: keys live under /tributary/<cluster>/ in etcd.
    cluster: str = "local"
    #: Rack id for rack-aware placement (Kafka's broker.rack).
    rack: str = ""
    #: TTL of the registration lease: a dead node's partitions go offline this long after it dies.
    session_timeout_s: int = 6
    #: On SIGTERM, ask the controller to move the leadership of this node's partitions to other
    #: in-sync replicas before stopping (Kafka's controlled.shutdown.enable).
    controlled_shutdown_enable: bool = True
    #: Longest the node waits for that before it stops anyway; the service manager's grace
    #: period (Kubernetes terminationGracePeriodSeconds, systemd TimeoutStopSec) must exceed it
    #: plus the in-flight calls' grace (5 s) and the log flush.
    controlled_shutdown_timeout_ms: int = 30_000
    #: Requests to the controller beyond the first while partitions are left to move or the
    #: controller cannot be reached (Kafka's controlled.shutdown.max.retries), within the timeout.
    controlled_shutdown_max_retries: int = 3
    #: fsync before acknowledging acks>=1 appends (group commit keeps it fast).
    flush_before_ack: bool = False
    #: A follower not caught up with its leader for this long leaves the ISR (Kafka's
    #: replica.lag.time.max.ms).
    replica_lag_time_max_ms: int = 30_000
    #: Long-poll bound of a follower's fetch from its leader (replica.fetch.wait.max.ms).
    replica_fetch_wait_max_ms: int = 500
    #: Record bytes per partition per follower fetch (replica.fetch.max.bytes).
    replica_fetch_max_bytes: int = 1 << 20
    #: Record bytes per follower fetch response (replica.fetch.response.max.bytes).
    replica_fetch_response_max_bytes: int = 10 << 20
    #: Pause after a failed follower fetch (replica.fetch.backoff.ms).
    replica_fetch_backoff_ms: int = 1_000
    #: Serve fetches with os.sendfile (true) or read+send (false, for comparison benchmarks).
    fetch_zero_copy: bool = True
    #: Period of background work: flush.ms, retention, segment.ms.
    maintenance_interval_ms: int = 1000
    #: Open segment (.log) file handles kept, least recently used closed first (bounded file
    #: descriptors); 0 = a quarter of the descriptor limit (storage_node/descriptors.py). A
    #: node appending to more partitions than this reopens a file per append, so the default
    #: grows with the limit: 1,024 made 3,333 busy partitions per node reopen on every append.
    max_open_segments: int = 0
    #: Threads per log dir that open and recover partitions at startup (Kafka's
    #: num.recovery.threads.per.data.dir); bench/scale.py measured the restart of a node holding
    #: ~13,000 partitions with 1 and with this many.
    num_recovery_threads_per_data_dir: int = 4
    #: An idempotent producer idle this long, with no transaction open, is forgotten by the
    #: partitions (producer.id.expiration.ms); its next batch moves it to a new epoch.
    producer_id_expiration_ms: int = 86_400_000
    #: A transactional batch that would open a transaction on a partition is appended only once
    #: the transaction coordinator confirms the partition was added to it (Kafka's
    #: transaction.partition.verification.enable, KIP-890); without it, a client that skips
    #: AddPartitionsToTxn can hold the partition's last stable offset back for good.
    transaction_verification: bool = True
    #: How often partitions look for such producers (producer.id.expiration.check.interval.ms).
    producer_id_expiration_check_interval_ms: int = 600_000
    #: Most fetch-port connections open at once (Kafka's max.connections); 0 = as many as the
    #: descriptor rule allows: half of RLIMIT_NOFILE at two descriptors per connection, the other
    #: half kept for the log, gRPC and etcd (storage_node/descriptors.py). A value that does not
    #: fit the rule stops the node at start.
    fetch_max_connections: int = 0
    #: Most fetch-port connections from one client address (Kafka's max.connections.per.ip);
    #: 0 = no per-address bound. Connections over a cap get an error frame and are closed.
    fetch_max_connections_per_ip: int = 1024
    #: Longest a fetch-port long poll waits, whatever max_wait_ms it asked for (Kafka's
    #: fetch.max.wait.ms bound); a longer request is answered at this bound, maybe empty.
    fetch_max_wait_ms: int = 30_000
    #: The log cleaner always runs (as in Kafka 4, where log.cleaner.enable is gone): a switch
    #: would let a node hold cleanup.policy=compact topics it never compacts.
    #: Cleaner threads, each cleaning one partition at a time (log.cleaner.threads).
    log_cleaner_threads: int = 1
    #: Memory budget of the cleaners' key -> offset maps, split among the threads
    #: (log.cleaner.dedupe.buffer.size; 24 bytes per key as counted, see cleaner/offset_map.py).
    log_cleaner_dedupe_buffer_size: int = 128 * 1024 * 1024
    #: Read + write bytes per second all cleaner threads together may use
    #: (log.cleaner.io.max.bytes.per.second); 0 = unthrottled (Kafka's default is unbounded).
    log_cleaner_io_max_bytes_per_second: float = 0.0
    #: Pause of a cleaner thread that found nothing to clean (log.cleaner.backoff.ms).
    log_cleaner_backoff_ms: int = 15_000
    #: Topic config defaults for partitions created here (Kafka names: retention.ms=...).
    default_topic_configs: dict[str, str] = field(default_factory=dict)
    #: Start without etcd (tests and benchmarks of the node alone).
    standalone: bool = False
