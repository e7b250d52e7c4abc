"""``TopicPartition``: one partition of one topic, the key of nearly everything in Tributary.

Defined once here for every side -- the coordinator's groups and offsets, the SDK (which exports
it as :class:`gateway.client.TopicPartition`) and the Spark source -- so a value built on one side
is equal to, and hashes like, one built on the other. Pure.
"""

from __future__ import annotations

from typing import NamedTuple


class TopicPartition(NamedTuple):
    """A topic and a partition number (a NamedTuple: immutable, hashable, unpackable, ordered by
    topic then partition)."""

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"
