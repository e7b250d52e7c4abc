"""Validation of topic-admin input: names, partition counts, replication factors. Pure.

The rules are Kafka's (``org.apache.kafka.common.internals.Topic.validate`` and the admin
manager's checks), and each failure raises the taxonomy error Kafka answers with, with a message
that says what was wrong and what is allowed.
"""

from __future__ import annotations

import re

from services.errors import (
    InvalidPartitionsError,
    InvalidReplicationFactorError,
    InvalidTopicError,
)

#: Kafka's limit: 249, so that "<topic>-<partition>" directory names stay under 255 bytes.
MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_CHARS = re.compile(r"[a-zA-Z0-9._-]+")
#: Kafka's default when a CreateTopics request leaves the replication factor unset.
DEFAULT_REPLICATION_FACTOR = 1


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
