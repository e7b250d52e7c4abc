"""Every metric, span and attribute name Tributary emits, in one place.

Names follow the OpenTelemetry semantic conventions where one exists (checked against
``opentelemetry-semantic-conventions`` 0.66b2, the RPC conventions at "release candidate"):

* RPC: spans named ``<package.Service>/<Method>`` with ``rpc.system.name`` = ``grpc``, the
  fully-qualified ``rpc.method``, ``rpc.response.status_code`` (the status name, ``"OK"``),
  ``server.address``/``server.port`` on the client side and ``error.type`` on failures; the
  ``rpc.server.call.duration`` / ``rpc.client.call.duration`` histograms in seconds.
  ``OTEL_SEMCONV_STABILITY_OPT_IN=rpc/dup`` additionally emits the pre-1.38 experimental names
  (``rpc.system``, ``rpc.service``, short ``rpc.method``, integer ``rpc.grpc.status_code``, and
  the ``rpc.server.duration`` / ``rpc.client.duration`` histograms in milliseconds) for
  dashboards built on them.
* Messaging attributes on our own spans and metrics: ``messaging.system``,
  ``messaging.destination.name`` (the topic), ``messaging.destination.partition.id`` (the
  partition, a string), ``messaging.consumer.group.name``, ``messaging.operation.type`` /
  ``.name``, ``messaging.batch.message_count``; the SDK's ``messaging.client.sent.messages``,
  ``messaging.client.consumed.messages`` and ``messaging.client.operation.duration``.

Everything without a convention is ours, under ``tributary.``. Counters are named
``<thing>.<what>.<unit-noun>`` (``tributary.storage.appended.bytes``) the way the messaging
conventions name theirs (``messaging.client.sent.messages``), so the Prometheus exporter turns
them into the familiar ``tributary_storage_appended_bytes_total``.
"""

from __future__ import annotations

from typing import Final

# ---- resource and scope ---------------------------------------------------------------------

SCOPE: Final = "tributary"
SERVICE_NAMESPACE: Final = "tributary"
#: ``messaging.system`` value for Tributary (not one of the convention's well-known values).
MESSAGING_SYSTEM_VALUE: Final = "tributary"

# ---- attributes (semantic conventions) ------------------------------------------------------

SERVICE_NAME: Final = "service.name"
SERVICE_NAMESPACE_ATTR: Final = "service.namespace"
SERVICE_INSTANCE_ID: Final = "service.instance.id"
SERVICE_VERSION: Final = "service.version"

RPC_SYSTEM_NAME: Final = "rpc.system.name"
RPC_METHOD: Final = "rpc.method"
RPC_RESPONSE_STATUS_CODE: Final = "rpc.response.status_code"
SERVER_ADDRESS: Final = "server.address"
SERVER_PORT: Final = "server.port"
ERROR_TYPE: Final = "error.type"
#: Pre-1.38 experimental RPC attributes (emitted only with ``rpc/dup``).
OLD_RPC_SYSTEM: Final = "rpc.system"
OLD_RPC_SERVICE: Final = "rpc.service"
OLD_RPC_GRPC_STATUS_CODE: Final = "rpc.grpc.status_code"

MESSAGING_SYSTEM: Final = "messaging.system"
MESSAGING_DESTINATION_NAME: Final = "messaging.destination.name"
MESSAGING_DESTINATION_PARTITION_ID: Final = "messaging.destination.partition.id"
MESSAGING_CONSUMER_GROUP_NAME: Final = "messaging.consumer.group.name"
MESSAGING_OPERATION_TYPE: Final = "messaging.operation.type"
MESSAGING_OPERATION_NAME: Final = "messaging.operation.name"
MESSAGING_BATCH_MESSAGE_COUNT: Final = "messaging.batch.message_count"

# ---- attributes (ours) ----------------------------------------------------------------------

#: Bytes of record batches in one append / fetch (span attribute).
ATTR_BATCH_BYTES: Final = "tributary.batch.bytes"
#: How many partitions one fetch-port request carried (the gateway asks a node for all of its at once).
ATTR_PARTITION_COUNT: Final = "tributary.partition.count"
#: First and last offset an append was given (span attributes).
ATTR_BASE_OFFSET: Final = "tributary.base_offset"
ATTR_LAST_OFFSET: Final = "tributary.last_offset"
#: The Kafka-named reason of a failed operation (``NOT_LEADER_OR_FOLLOWER``).
ATTR_ERROR_REASON: Final = "tributary.error.reason"
#: Partition state in coordinator gauges: ``online``, ``offline``, ``pending``.
ATTR_PARTITION_STATE: Final = "tributary.partition.state"
#: Which coordinator reports a gauge.
ATTR_COORDINATOR_ID: Final = "tributary.coordinator.id"
#: A client quota's metered allowance: the user and client id it is metered for ("" = shared
#: across), and the quota key (producer_byte_rate, consumer_byte_rate, request_percentage).
ATTR_QUOTA_USER: Final = "tributary.quota.user"
ATTR_QUOTA_CLIENT_ID: Final = "tributary.quota.client_id"
ATTR_QUOTA_KEY: Final = "tributary.quota.key"

# ---- RPC metrics (semantic conventions) -----------------------------------------------------

RPC_SERVER_CALL_DURATION: Final = "rpc.server.call.duration"  # histogram, s
RPC_CLIENT_CALL_DURATION: Final = "rpc.client.call.duration"  # histogram, s
OLD_RPC_SERVER_DURATION: Final = "rpc.server.duration"  # histogram, ms (rpc/dup only)
OLD_RPC_CLIENT_DURATION: Final = "rpc.client.duration"  # histogram, ms (rpc/dup only)

# ---- messaging client metrics (semantic conventions; for the SDK) ---------------------------

MESSAGING_CLIENT_SENT_MESSAGES: Final = "messaging.client.sent.messages"  # counter, {message}
MESSAGING_CLIENT_CONSUMED_MESSAGES: Final = "messaging.client.consumed.messages"  # counter, {message}
MESSAGING_CLIENT_OPERATION_DURATION: Final = "messaging.client.operation.duration"  # histogram, s

# ---- storage node metrics -------------------------------------------------------------------

#: Records and bytes appended, per topic (counted once per append of a partition's batches).
STORAGE_APPENDED_RECORDS: Final = "tributary.storage.appended.records"  # counter, {record}
STORAGE_APPENDED_BYTES: Final = "tributary.storage.appended.bytes"  # counter, By
#: Appends (one partition's batches each) that failed, per topic and reason.
STORAGE_APPEND_ERRORS: Final = "tributary.storage.append.errors"  # counter, {append}
#: Time from reading an append request on the data port to its answer (the data port's
#: counterpart of StorageNode/Append's rpc.server.call.duration), with error.type when the
#: request failed as a whole.
STORAGE_DATA_PORT_APPEND_DURATION: Final = "tributary.storage.data_port.append.duration"  # histogram, s
#: Bytes sent by the fetch port, per topic (sendfile and copy alike).
STORAGE_FETCHED_BYTES: Final = "tributary.storage.fetched.bytes"  # counter, By
#: Fetch-port totals from FetchStats: bytes sent zero-copy (os.sendfile) and through read+send.
STORAGE_FETCH_SENDFILE_BYTES: Final = "tributary.storage.fetch.sendfile.bytes"  # obs. counter, By
STORAGE_FETCH_COPIED_BYTES: Final = "tributary.storage.fetch.copied.bytes"  # obs. counter, By
STORAGE_FETCH_REQUESTS: Final = "tributary.storage.fetch.requests"  # obs. counter, {request}
STORAGE_FETCH_ERRORS: Final = "tributary.storage.fetch.errors"  # obs. counter, {request}
STORAGE_FETCH_CONNECTIONS: Final = "tributary.storage.fetch.connections"  # obs. up-down, {connection}
STORAGE_FETCH_CONNECTIONS_REFUSED: Final = "tributary.storage.fetch.connections.refused"  # obs. counter
STORAGE_FETCH_POLLS_CANCELLED: Final = "tributary.storage.fetch.polls.cancelled"  # obs. counter, {request}
STORAGE_FETCH_TLS_HANDSHAKES: Final = "tributary.storage.fetch.tls.handshakes"  # obs. counter
STORAGE_FETCH_TLS_HANDSHAKE_FAILURES: Final = "tributary.storage.fetch.tls.handshake_failures"  # obs. counter
#: Per hosted partition (observed from the LogManager at collection time).
STORAGE_LOG_END_OFFSET: Final = "tributary.storage.log.end_offset"  # gauge, {offset}
STORAGE_LOG_START_OFFSET: Final = "tributary.storage.log.start_offset"  # gauge, {offset}
STORAGE_LOG_SIZE: Final = "tributary.storage.log.size"  # gauge, By
STORAGE_LOG_SEGMENTS: Final = "tributary.storage.log.segments"  # gauge, {segment}
# The log cleaner (compacted topics).
STORAGE_CLEANER_BYTES_READ: Final = "tributary.storage.cleaner.read.bytes"  # counter, By
STORAGE_CLEANER_BYTES_WRITTEN: Final = "tributary.storage.cleaner.written.bytes"  # counter, By
STORAGE_CLEANER_DURATION: Final = "tributary.storage.cleaner.duration"  # histogram, s
STORAGE_CLEANER_DIRTY_RATIO: Final = "tributary.storage.cleaner.dirty_ratio"  # gauge, 1

# ---- gateway metrics ------------------------------------------------------------------------

#: One observation per partition batch a produce sends, per topic.
GATEWAY_PRODUCE_BATCH_RECORDS: Final = "tributary.gateway.produce.batch.records"  # histogram, {record}
GATEWAY_PRODUCE_BATCH_SIZE: Final = "tributary.gateway.produce.batch.size"  # histogram, By
#: What Fetch returned to clients, per topic (records = offsets the answer advanced).
GATEWAY_FETCHED_RECORDS: Final = "tributary.gateway.fetched.records"  # counter, {record}
GATEWAY_FETCHED_BYTES: Final = "tributary.gateway.fetched.bytes"  # counter, By
#: A request on the gateway's raw data listener (the gRPC calls have rpc.server.call.duration).
GATEWAY_DATA_REQUEST_DURATION: Final = "tributary.gateway.data.request.duration"  # histogram, s
#: Fetch sessions (KIP-227) on the raw data listener: sessions open now; sessions opened, evicted
#: (a connection opened one over its cap) and refused (a full fetch over the partition cap), and
#: fetches by kind (ATTR_FETCH_KIND: full or incremental), since the gateway started.
GATEWAY_FETCH_SESSIONS_OPEN: Final = "tributary.gateway.fetch_sessions.open"  # gauge, {session}
GATEWAY_FETCH_SESSIONS: Final = "tributary.gateway.fetch_sessions"  # counter, {session}, ATTR_SESSION_EVENT
GATEWAY_SESSION_FETCHES: Final = "tributary.gateway.fetch_sessions.fetches"  # counter, {request}
ATTR_SESSION_EVENT: Final = "tributary.fetch_session.event"  # opened, evicted, refused
ATTR_FETCH_KIND: Final = "tributary.fetch.kind"  # full, incremental
#: Client quotas (Kafka's throttle-time, byte-rate and request-time quota metrics), per user and
#: client id of each metered allowance (ATTR_QUOTA_USER, ATTR_QUOTA_CLIENT_ID, ATTR_QUOTA_KEY):
#: how long each answer held its client, and the rate each allowance is used at now.
GATEWAY_QUOTA_THROTTLE_TIME: Final = "tributary.gateway.quota.throttle.time"  # histogram, s
GATEWAY_QUOTA_BYTE_RATE: Final = "tributary.gateway.quota.byte_rate"  # gauge, By/s
GATEWAY_QUOTA_REQUEST_TIME: Final = "tributary.gateway.quota.request_time"  # gauge, % of the loop
GATEWAY_QUOTA_LIMIT: Final = "tributary.gateway.quota.limit"  # gauge, the key's unit

# ---- coordinator metrics --------------------------------------------------------------------

#: 1 on the coordinator that is the active controller, 0 on standbys (sum over all = 1).
COORDINATOR_CONTROLLER_ACTIVE: Final = "tributary.coordinator.controller.active"  # gauge, {controller}
COORDINATOR_CONTROLLER_EPOCH: Final = "tributary.coordinator.controller.epoch"  # gauge, {epoch}
COORDINATOR_PARTITIONS: Final = "tributary.coordinator.partitions"  # gauge by state, {partition}
COORDINATOR_PARTITIONS_OFFLINE: Final = "tributary.coordinator.partitions.offline"  # gauge, {partition}
COORDINATOR_PARTITIONS_UNDER_REPLICATED: Final = (
    "tributary.coordinator.partitions.under_replicated"  # gauge, {partition}
)
COORDINATOR_PARTITIONS_UNDER_MIN_ISR: Final = (
    "tributary.coordinator.partitions.under_min_isr"  # gauge, {partition}
)
#: Partitions being reassigned (new replicas copying, old ones not yet dropped).
COORDINATOR_PARTITIONS_REASSIGNING: Final = "tributary.coordinator.partitions.reassigning"  # gauge
#: Bytes a storage node's new replicas copied under a reassignment's throttle.
STORAGE_REPLICATION_THROTTLED_BYTES: Final = "tributary.storage.replication.throttled_bytes"  # counter, By
#: Unclean leader elections (an out-of-sync replica made leader: records may be lost).
COORDINATOR_UNCLEAN_ELECTIONS: Final = "tributary.coordinator.unclean_elections"  # counter, {election}
#: Transactional ids the active controller holds, and those with a transaction open (gauges).
COORDINATOR_TRANSACTIONAL_IDS: Final = "tributary.coordinator.transactional_ids"  # {id}
COORDINATOR_TRANSACTIONS_OPEN: Final = "tributary.coordinator.transactions.open"  # {transaction}
#: Age of the oldest open transaction: a transaction stuck open holds read_committed readers back.
COORDINATOR_TRANSACTION_OLDEST_AGE: Final = "tributary.coordinator.transactions.oldest_open_age"  # ms
COORDINATOR_BROKERS_LIVE: Final = "tributary.coordinator.brokers.live"  # gauge, {node}

# ---- consumer groups ------------------------------------------------------------------------

#: Log end offset minus committed offset, per group, topic and partition.
CONSUMER_LAG: Final = "tributary.consumer.lag"  # gauge, {record}

#: The SDK's wait before its next request to a gateway that throttled it (KIP-219), per
#: operation (produce, fetch).
CLIENT_THROTTLE_TIME: Final = "tributary.client.throttle.time"  # histogram, s

# ---- spans (ours; RPC spans are named after the method) -------------------------------------

#: The storage node's append of one partition's batches: ``append <topic>``.
SPAN_STORAGE_APPEND: Final = "append"
#: The gateway's read of one partition from a node's fetch port: ``fetch <topic>``.
SPAN_FETCH_PORT: Final = "fetch"
#: One append request on a node's data port (``services/fetchport/append.py``): the gateway's
#: CLIENT span and the node's SERVER span, named like the gRPC method it stands in for.
SPAN_DATA_PORT_APPEND: Final = "tributary.dataport/Append"
#: ``rpc.system.name`` of the data port's spans.
DATA_PORT_RPC_SYSTEM: Final = "tributary.dataport"
#: A request on the gateway's raw data listener: ``data produce <topic>`` / ``data fetch <topic>``
#: (the child of the SDK's span when the frame carries its ``traceparent``).
SPAN_DATA_REQUEST: Final = "data"
