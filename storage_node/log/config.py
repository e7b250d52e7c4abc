"""``LogConfig``: one partition log's settings, typed, from Kafka-named topic configs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from services import topic_config
from services.topic_config import (
    CLEANUP_POLICY_COMPACT,
    CLEANUP_POLICY_DELETE,
    TIMESTAMP_TYPE_LOG_APPEND_TIME,
)


@dataclass(frozen=True)
class LogConfig:
    """The topic configs a partition log acts on. Build it with :meth:`from_dict`.

    Field names are the Kafka names with dots as underscores; see ``services.topic_config`` for
    each one's meaning and default.
    """

    segment_bytes: int
    segment_ms: int
    segment_index_bytes: int
    index_interval_bytes: int
    retention_ms: int
    retention_bytes: int
    flush_messages: int
    flush_ms: int
    max_message_bytes: int
    message_timestamp_type: str
    cleanup_policy: tuple[str, ...]
    min_insync_replicas: int
    compression_type: str
    file_delete_delay_ms: int
    unclean_leader_election_enable: bool
    min_cleanable_dirty_ratio: float
    min_compaction_lag_ms: int
    max_compaction_lag_ms: int
    delete_retention_ms: int

    @classmethod
    def from_dict(cls, *layers: Mapping[str, Any]) -> LogConfig:
        """Defaults overlaid by each mapping of Kafka-named configs in turn (later wins).

        Raises InvalidConfigError for an unknown name or a bad value.
        """
        resolved = topic_config.resolve_topic_configs(*layers)
        return cls(**{name.replace(".", "_"): value for name, value in resolved.items()})

    def to_dict(self) -> dict[str, str]:
        """Every config as Kafka name -> string, the form etcd and the CLI use."""
        return {
            name: topic_config.format_topic_config(name, getattr(self, name.replace(".", "_")))
            for name in topic_config.TOPIC_CONFIGS
        }

    @property
    def log_append_time(self) -> bool:
        """True when the broker stamps batches with its own clock (``LogAppendTime``)."""
        return self.message_timestamp_type == TIMESTAMP_TYPE_LOG_APPEND_TIME

    @property
    def delete_enabled(self) -> bool:
        """True when time and size retention apply (``cleanup.policy`` contains ``delete``)."""
        return CLEANUP_POLICY_DELETE in self.cleanup_policy

    @property
    def compact_enabled(self) -> bool:
        """True when the log cleaner compacts the log (``cleanup.policy`` contains ``compact``)."""
        return CLEANUP_POLICY_COMPACT in self.cleanup_policy

    @property
    def max_segment_ms(self) -> int:
        """When the active segment rolls by age: ``segment.ms``, or sooner for a compacted log so
        that ``max.compaction.lag.ms`` can be honoured (the cleaner never touches the active
        segment; Kafka's LogConfig.maxSegmentMs)."""
        if self.compact_enabled:
            return min(self.segment_ms, self.max_compaction_lag_ms)
        return self.segment_ms
