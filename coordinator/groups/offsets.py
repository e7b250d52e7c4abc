"""Committed offsets: per-partition checks of a commit, and which offsets expire. Pure.

Retention follows Kafka since 2.1 (KIP-211): a group's offsets never expire while it has
members. Once it is empty, an offset expires ``offsets.retention.minutes`` after the later of
its commit and the moment the group lost its last member; a group that never had members
(standalone consumers only) counts from each commit.
"""

from __future__ import annotations

from collections.abc import Mapping

from coordinator.groups.model import OffsetCommit, OffsetRecord
from services import errors
from services.topic_partition import TopicPartition


def check_commit_partition(
    commit: OffsetCommit, topics: Mapping[str, int], max_metadata_bytes: int
) -> errors.TributaryError | None:
    """Why one partition of a commit cannot be stored, or None."""
    count = topics.get(commit.topic)
    if count is None or not 0 <= commit.partition < count:
        return errors.UnknownTopicOrPartitionError(f"{commit.topic}-{commit.partition} does not exist")
    if commit.offset < 0:
        return errors.OffsetOutOfRangeError(
            f"offset {commit.offset} of {commit.topic}-{commit.partition} is negative"
        )
    if len(commit.metadata.encode()) > max_metadata_bytes:
        return errors.OffsetMetadataTooLargeError(
            f"metadata of {commit.topic}-{commit.partition} is over {max_metadata_bytes} bytes "
            "(offset.metadata.max.bytes)"
        )
    return None


def expired_offsets(
    offsets: Mapping[TopicPartition, OffsetRecord],
    *,
    has_members: bool,
    empty_since_ms: int | None,
    now_ms: int,
    retention_ms: int,
) -> list[TopicPartition]:
    """The partitions whose committed offsets have outlived the retention (see the module doc)."""
    if has_members:
        return []
    expired = []
    for tp, record in offsets.items():
        since = max(record.commit_timestamp, empty_since_ms or -1)
        if now_ms - since >= retention_ms:
            expired.append(tp)
    return sorted(expired)


def offsets_of_deleted_topics(
    offsets: Mapping[TopicPartition, OffsetRecord], topics: Mapping[str, int]
) -> list[TopicPartition]:
    """Offsets of partitions that no longer exist (their topic was deleted), as Kafka drops them."""
    return sorted(tp for tp in offsets if tp.partition >= topics.get(tp.topic, 0))
