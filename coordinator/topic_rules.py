"""Validation of topic-admin input: names, partition counts, replication factors, limits. Pure.

The rules are Kafka's (``org.apache.kafka.common.internals.Topic.validate`` and the admin
manager's checks), and each failure raises the taxonomy error Kafka answers with, with a message
that says what was wrong and what is allowed.

Beyond Kafka's rules, the cluster's partition limits (settings ``max_partitions_per_topic``,
``max_partitions_per_cluster``) and the size of the topic's metadata record are checked here,
before any placement: the work of placing, storing and serving a topic grows with its partitions
times its replicas, so a request for a million partitions must be refused at once, not after it
has been built.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

from coordinator import keys
from services.errors import (
    InvalidConfigError,
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
    PolicyViolationError,
)

#: Kafka's limit: 249, so that "<topic>-<partition>" directory names stay under 255 bytes.
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
#: Kafka's default when a CreateTopics request leaves the replication factor unset.
DEFAULT_REPLICATION_FACTOR = 1
#: Defaults of the coordinator settings max_partitions_per_topic / max_partitions_per_cluster
#: (:class:`coordinator.config.CoordinatorConfig` says why).
DEFAULT_MAX_PARTITIONS_PER_TOPIC = 10_000
DEFAULT_MAX_PARTITIONS_PER_CLUSTER = 200_000


def ensure_valid_topic_name(name: str) -> None:
    """Raise InvalidTopicError unless ``name`` is 1..249 chars of ``[a-zA-Z0-9._-]``, not ``.``/``..``."""
    if not name:
        raise InvalidTopicError("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopicError(f'Topic name cannot be "." or ".." (got {name!r})')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopicError(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} characters, "
            f"topic name: {name[:40]}... ({len(name)} characters)"
        )
    if not _LEGAL_CHARS.fullmatch(name):
        bad = sorted({c for c in name if not _LEGAL_CHARS.fullmatch(c)})
        raise InvalidTopicError(
            f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, "
            f"'.', '_' and '-' (found {''.join(bad)!r})"
        )


def ensure_valid_partition_count(partitions: int) -> None:
    """Raise InvalidPartitionsError unless ``partitions`` >= 1."""
    if partitions < 1:
        raise InvalidPartitionsError(f"Number of partitions must be larger than 0, got {partitions}")


def resolve_replication_factor(
    requested: int, live_nodes: int, *, default: int = DEFAULT_REPLICATION_FACTOR
) -> int:
    """The replication factor to use: ``requested``, or ``default`` when it is 0 (unset).

    Raises InvalidReplicationFactorError when it is negative or larger than the number of live
    storage nodes (each replica must sit on a distinct node).
    """
    factor = default if requested == 0 else requested
    if factor < 1:
        raise InvalidReplicationFactorError(f"Replication factor must be larger than 0, got {factor}")
    if factor > live_nodes:
        raise InvalidReplicationFactorError(
            f"Replication factor: {factor} larger than available brokers: {live_nodes}"
        )
    return factor


def ensure_valid_new_partition_count(topic: str, current: int, requested_total: int) -> None:
    """Raise InvalidPartitionsError unless ``requested_total`` grows the topic (Kafka never shrinks)."""
    if requested_total == current:
        raise InvalidPartitionsError(f"Topic {topic} already has {current} partitions.")
    if requested_total < current:
        raise InvalidPartitionsError(
            f"Topic {topic} currently has {current} partitions, {requested_total} would not be an increase."
        )


def ensure_within_topic_limit(topic: str, total: int, max_per_topic: int) -> None:
    """Raise InvalidPartitionsError when ``total`` partitions exceed the per-topic limit."""
    if total > max_per_topic:
        raise InvalidPartitionsError(
            f"Topic {topic}: {total} partitions is more than the {max_per_topic} a topic may have "
            "(coordinator setting max_partitions_per_topic)"
        )


def ensure_within_cluster_limit(topic: str, added: int, cluster_total: int, max_per_cluster: int) -> None:
    """Raise PolicyViolationError when ``added`` partitions would take the cluster (now holding
    ``cluster_total``) past its limit."""
    if cluster_total + added > max_per_cluster:
        raise PolicyViolationError(
            f"Topic {topic}: {added} more partitions would make {cluster_total + added} in the cluster, "
            f"more than the {max_per_cluster} it may hold (coordinator setting max_partitions_per_cluster; "
            f"it holds {cluster_total} now)"
        )


def ensure_record_fits(
    topic: str,
    partitions: int,
    replication_factor: int,
    node_ids: Collection[int],
    configs: Mapping[str, str],
) -> None:
    """Raise PolicyViolationError when the topic's metadata record (one etcd value holding every
    partition's replica list) could exceed :data:`coordinator.keys.MAX_TOPIC_VALUE_BYTES`."""
    id_width = max((len(str(node_id)) for node_id in node_ids), default=1)
    size = keys.topic_value_bound(partitions, replication_factor, id_width, configs)
    limit = keys.MAX_TOPIC_VALUE_BYTES
    if size > limit:
        raise PolicyViolationError(
            f"Topic {topic}: {partitions} partitions at replication factor {replication_factor} need a "
            f"metadata record of up to {size // 1024} KiB, more than the {limit // 1024} KiB one etcd "
            "write may carry; use fewer partitions or a lower replication factor"
        )


#: Topic config values that are valid Kafka but not honoured yet: refused at create and alter
#: rather than stored and silently ignored.
_NOT_SUPPORTED_YET = {
    "compression.type": (
        lambda value: value != "producer",
        "compression.type other than 'producer' is not supported yet: batches keep the producer's "
        "compression (set it on the producer)",
    ),
}


def ensure_supported_configs(typed: Mapping[str, object]) -> None:
    """INVALID_CONFIG for a setting this cluster would accept but not honour."""
    for name, (unsupported, reason) in _NOT_SUPPORTED_YET.items():
        value = typed.get(name)
        if value is None:
            continue
        text = ",".join(value) if isinstance(value, (tuple, list)) else str(value)
        if unsupported(text):
            raise InvalidConfigError(f"{reason} (got {name}={text})")
