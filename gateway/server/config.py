"""Settings of one gateway process (file, ``TRIBUTARY_GATEWAY_*`` environment, flags)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from services.config import MemberTlsConfig, ServiceConfig

ENV_PREFIX = "TRIBUTARY_GATEWAY"


@dataclass
class GatewayConfig(ServiceConfig, MemberTlsConfig):
    #: Bind address of the public Gateway gRPC service; also written to the ready file.
    host: str = "127.0.0.1"
    #: gRPC port (0 = any free port).
    port: int = 0
    #: Coordinator gRPC addresses, host:port, comma-separated. Any of them serves metadata; the
    #: gateway fails over between them and follows NOT_CONTROLLER redirects for admin calls.
    coordinators: list[str] = field(default_factory=lambda: ["127.0.0.1:9093"])
    #: Deadline of a produce (and of retries after metadata refreshes) when the request gives none.
    default_timeout_ms: int = 30_000
    #: Deadline of forwarded admin / group / metadata calls and of ListOffsets.
    admin_timeout_ms: int = 30_000
    #: Used only when the coordinator does not implement WatchMetadata: poll GetMetadata this often.
    metadata_poll_interval_ms: int = 1_000
    #: Open fetch-port connections per storage node (one long poll holds one connection).
    fetch_connections_per_node: int = 64
    #: Appends to storage nodes go over each node's data port (one pipelined connection per node,
    #: ``services/fetchport/append.py``); false = unary gRPC StorageNode.Append. A node that takes
    #: no appends on its data port is served over gRPC either way.
    data_port_appends: bool = True
    #: Produce records into batches of at most this many bytes per partition (and never above the
    #: topic's max.message.bytes when it is set on the topic).
    max_batch_bytes: int = 1_048_576
    #: acks=none appends still running in the background before new acks=none requests wait.
    max_unacked_appends: int = 1_000
    #: A typed Fetch answer decodes at most this many records (the rest comes in the next fetch).
    fetch_max_decoded_records: int = 100_000
    #: ... and at most this many decompressed record bytes (the first batch always gets a window).
    fetch_max_decoded_bytes: int = 32 << 20
    #: Threads that decode typed Fetch answers and build them into protobuf, off the event loop.
    fetch_decode_threads: int = 2
    #: A ProduceStream with no request (and no answer owed) this long is ended with a retriable
    #: NETWORK_EXCEPTION, as Kafka closes connections idle for connections.max.idle.ms (10 min);
    #: the SDK opens a new stream on its next send. 0 = never.
    produce_stream_max_idle_ms: int = 600_000
    #: Serve the raw data protocol (``services/dataport``) beside gRPC, and advertise it to
    #: clients in GetMetadata (``data_address``); the Python SDK then produces and fetches over
    #: it. False: gRPC only (clients fall back to it).
    data_listener: bool = True
    #: Port of the raw data listener (0 = any free port), on ``host``.
    data_port: int = 0
    #: Open data connections at most; more are answered with an error frame and closed.
    data_max_connections: int = 4_096
    #: A data client that stops inside a frame (or the handshake) this long is disconnected.
    data_stall_timeout_ms: int = 10_000
    #: Bytes of requests one data connection may hold unanswered before the gateway stops
    #: reading from it (back-pressure; bounds the connection's memory).
    data_max_in_flight_bytes: int = 64 << 20
    #: A data connection with no request (and no answer owed) this long is closed, as Kafka
    #: closes connections idle for connections.max.idle.ms. 0 = never.
    data_max_idle_ms: int = 600_000
    #: Fetch sessions (KIP-227, protocol version 3) one data connection may hold; opening one
    #: more evicts its least recently used. 0 = none (every fetch is a full one).
    data_fetch_sessions_per_connection: int = 4
    #: Partitions one fetch session may hold; a full fetch of more is served without a session.
    data_fetch_session_max_partitions: int = 25_000
    #: TLS on the public ports (gRPC and the raw data listener): this gateway's certificate
    #: chain (PEM). With it and ``tls_key_file`` set, both ports speak TLS only; the files are
    #: re-read when they change (new connections get the new certificate).
    tls_cert_file: Path | None = None
    #: The private key of ``tls_cert_file`` (PEM).
    tls_key_file: Path | None = None
    #: Mutual TLS: clients must present a certificate signed by this CA bundle (PEM).
    tls_client_ca_file: Path | None = None
    #: Authenticate clients by bearer token (``services/tokens.py``, Kafka's SASL/OAUTHBEARER):
    #: the PEM public key (Ed25519, RSA or ECDSA) tokens must be signed with; re-read when the
    #: file changes. Every call and data connection must then carry a valid token (gRPC:
    #: ``authorization: Bearer <token>``), and its ``sub`` is the principal (``User:<sub>``).
    #: Needs TLS; a gateway authenticates by certificate or by token, not both (run one of each,
    #: as Kafka runs an SSL and a SASL_SSL listener).
    token_public_key_file: Path | None = None
    #: When set, a token's ``iss`` claim must be this.
    token_issuer: str | None = None
    #: When set, a token's ``aud`` claim must include this.
    token_audience: str | None = None
    #: Authorize every call against the cluster's ACLs (``tributary acls``): the caller is the
    #: common name of its TLS client certificate (``User:<CN>``; ``User:ANONYMOUS`` without one)
    #: or its token's subject,
    #: nothing is allowed that no ACL allows, deny beats allow (Kafka's AclAuthorizer).
    authorizer_enabled: bool = False
    #: Principals allowed everything (Kafka's super.users), e.g. User:admin; comma-separated.
    super_users: list[str] = field(default_factory=list)
    #: Client quotas (``tributary quotas``) are metered over this many windows (Kafka's
    #: quota.window.num) ...
    quota_window_num: int = 11
    #: ... of this many seconds each (Kafka's quota.window.size.seconds; fractions allowed). A
    #: request-time throttle lasts at most one window.
    quota_window_size_seconds: float = 1.0
