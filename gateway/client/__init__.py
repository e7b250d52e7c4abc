"""Tributary's Python client SDK, shaped like kafka-python / aiokafka.

* :class:`Producer` / :class:`AsyncProducer` -- ``send(topic, value, key=None, headers=None,
  partition=None, timestamp=None)`` returning a future of :class:`RecordMetadata`; batches are
  built and compressed client-side as Kafka RecordBatch v2.
  Idempotent by default (``acks="all"``: retries never duplicate); with a ``transactional_id``,
  ``init_transactions``/``begin_transaction``/``send_offsets_to_transaction``/
  ``commit_transaction``/``abort_transaction`` write atomically across partitions (KIP-98).
* :class:`Consumer` / :class:`AsyncConsumer` -- consumer groups (``group_id``, ``subscribe``
  with a :class:`ConsumerRebalanceListener`, ``commit``/``commit_async``/``committed``,
  auto-commit, static membership) or ``assign``; ``poll``, iteration, ``seek*``, ``position``,
  ``offsets_for_times``, ``pause``/``resume``, ``wakeup``; batches decoded client-side;
  ``isolation_level="read_committed"`` reads only committed transactions.
* :class:`Admin` / :class:`AsyncAdmin` -- topics, cluster metadata, offsets, consumer groups,
  ACLs, client quotas.

The thread-based clients run their I/O on a background thread with an asyncio loop; the asyncio
clients run on yours. Both share one core. Every client takes ``servers="host:port,..."``
(gateway addresses), defaulting to ``$TRIBUTARY_GATEWAY``, then the local cluster's
``cluster.json`` (``$TRIBUTARY_DATA_DIR`` or ``./.tributary``).

Errors are :class:`TributaryError` subclasses with ``reason`` (Kafka's error name) and
``retriable``; see :mod:`gateway.client.errors`.
"""

from gateway.client.admin import Admin, AsyncAdmin
from gateway.client.consumer import AsyncConsumer, Consumer
from gateway.client.errors import (
    IllegalStateError,
    NoServersError,
    TransactionAbortedError,
    TributaryError,
    WakeupError,
)
from gateway.client.futures import FutureRecordMetadata
from gateway.client.listener import ConsumerRebalanceListener
from gateway.client.producer import AsyncProducer, Producer
from gateway.client.serialization import (
    json_deserializer,
    json_serializer,
    string_deserializer,
    string_serializer,
)
from gateway.client.structs import (
    BrokerMetadata,
    ClusterDescription,
    ConsumerGroupMetadata,
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    MemberDescription,
    NewPartitions,
    NewTopic,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionLag,
    PartitionMetadata,
    PartitionReassignment,
    RecordMetadata,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
)

__all__ = [
    "Admin",
    "AsyncAdmin",
    "AsyncConsumer",
    "AsyncProducer",
    "BrokerMetadata",
    "ClusterDescription",
    "Consumer",
    "ConsumerGroupMetadata",
    "ConsumerRebalanceListener",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "GroupDescription",
    "GroupListing",
    "IllegalStateError",
    "MemberDescription",
    "NewPartitions",
    "NewTopic",
    "NoServersError",
    "OffsetAndMetadata",
    "OffsetAndTimestamp",
    "PartitionLag",
    "PartitionMetadata",
    "PartitionReassignment",
    "Producer",
    "RecordMetadata",
    "TopicDescription",
    "TopicPartition",
    "TransactionAbortedError",
    "TransactionDescription",
    "TributaryError",
    "WakeupError",
    "json_deserializer",
    "json_serializer",
    "string_deserializer",
    "string_serializer",
]
