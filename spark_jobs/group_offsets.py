"""A consumer group's committed offsets, committed standalone through the SDK's ``Admin``.

The loader commits as a consumer outside the group (``Admin.alter_consumer_group_offsets``:
``CommitOffsets`` with no member id and generation -1, allowed while the group has no active
members), and reads back with ``list_consumer_group_offsets``. The offsets follow Kafka's
convention: the next offset to consume. TLS and token settings are the Spark options' own
(``security``, see :func:`spark_jobs.options.sdk_settings`).

Best-effort by design: the loader's own ``_offsets`` manifests are the source of truth for
exactly-once, and the group's offsets only mirror them (for lag monitoring and for a new
output starting where the group is). When the cluster does not serve group offsets (an error,
no gateway answering), :meth:`GroupOffsets.commit` logs one clear line and returns False.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from gateway.client import Admin, OffsetAndMetadata, TopicPartition
from gateway.client.errors import TributaryError
from spark_jobs.options import sdk_settings

log = logging.getLogger("spark_jobs.group_offsets")


class GroupOffsetsUnavailable(RuntimeError):
    """The cluster could not store or return the group's offsets."""


class GroupOffsets:
    """Fetch and commit one group's offsets; use as a context manager."""

    def __init__(
        self,
        servers: str,
        group_id: str,
        *,
        timeout_s: float = 10.0,
        security: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.group_id = group_id
        self._admin = Admin(
            servers=servers, request_timeout_ms=int(timeout_s * 1000), **sdk_settings(security)
        )

    def __enter__(self) -> GroupOffsets:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._admin.close()

    def fetch(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int] | None:
        """Committed offsets of ``tps`` (partitions without one are left out); None if unavailable."""
        try:
            committed = self._admin.list_consumer_group_offsets(self.group_id, list(tps))
        except TributaryError as exc:
            log.warning(
                "group %s: committed offsets not read (%s); starting from the output's manifests "
                "or the earliest offsets",
                self.group_id,
                exc,
            )
            return None
        return {tp: c.offset for tp, c in committed.items() if c.offset >= 0}

    def commit(self, offsets: Mapping[TopicPartition, int], metadata: str = "") -> bool:
        """Commit ``offsets`` as a standalone consumer; False (logged) if the cluster did not take them."""
        try:
            self._admin.alter_consumer_group_offsets(
                self.group_id, {tp: OffsetAndMetadata(offset, metadata) for tp, offset in offsets.items()}
            )
        except TributaryError as exc:
            log.warning(
                "group %s: offsets NOT committed (%s); the output's _offsets manifests remain the "
                "source of truth, and the next run commits them again",
                self.group_id,
                exc,
            )
            return False
        return True
