"""What the planner asks the cluster: partitions of a subscription and offsets. Driver side.

Wraps the SDK's ``Admin`` (one connection, reused for every question of one planning step).
Readers are pickled to executors, so a :class:`ClusterView` is opened where it is used and never
stored in a pickled object.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.client import Admin, TopicPartition
from gateway.client.servers import resolve_servers
from spark_jobs.offsets import Offsets, PlanningError, listed_partitions, resolve_bound, timestamps_needed
from spark_jobs.options import Subscription, sdk_settings

#: ``--servers`` of every job.
SERVERS_HELP = "gateway addresses, comma-separated (default: $TRIBUTARY_GATEWAY, then the local cluster)"


def resolve_addresses(servers: str | None) -> str:
    """Gateway addresses as a ``servers`` string, resolved once on the driver.

    Executors get the explicit list: they may run where neither ``$TRIBUTARY_GATEWAY`` nor the
    local cluster's ``cluster.json`` is visible.
    """
    return ",".join(resolve_servers(servers))


class ClusterView:
    """Partition and offset lookups for planning; use as a context manager."""

    def __init__(
        self,
        servers: str,
        *,
        isolation_level: str = "read_uncommitted",
        security: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self._admin = Admin(servers=servers, **sdk_settings(security))
        #: read_committed: "latest" is the last stable offset, where committed data ends.
        self._isolation_level = isolation_level

    def __enter__(self) -> ClusterView:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._admin.close()

    def partitions(self, subscription: Subscription, *, must_exist: bool) -> list[TopicPartition]:
        """Every partition the subscription covers now, sorted.

        ``must_exist``: raise PlanningError for a named topic or assigned partition the cluster
        does not have (batch queries); streaming queries wait for them to appear instead.
        """
        _, topics = self._admin.metadata()
        counts = {t.name: len(t.partitions) for t in topics}
        if subscription.kind == "subscribePattern":
            return sorted(
                TopicPartition(name, p)
                for name, count in counts.items()
                if subscription.matches(name)
                for p in range(count)
            )
        if subscription.kind == "subscribe":
            return _subscribed(subscription.topics, counts, must_exist)
        return _assigned(subscription.assignment, counts, must_exist)

    def offsets(self, tps: Sequence[TopicPartition], spec: str) -> Offsets:
        """``{tp: offset}`` for ``spec`` "earliest" (log start) or "latest" (high watermark; the
        last stable offset with read_committed)."""
        if not tps:
            return {}
        found = self._admin.list_offsets({tp: spec for tp in tps}, isolation_level=self._isolation_level)
        return {tp: r.offset for tp, r in found.items()}

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, int | None]:
        """First offset at or after each timestamp; ``None`` when no record is that recent."""
        if not timestamps:
            return {}
        found = self._admin.list_offsets(timestamps, isolation_level=self._isolation_level)
        return {tp: (r.offset if r.offset >= 0 else None) for tp, r in found.items()}


def _subscribed(topics: Iterable[str], counts: dict[str, int], must_exist: bool) -> list[TopicPartition]:
    missing = [t for t in topics if t not in counts]
    if missing and must_exist:
        raise PlanningError(f"subscribe: topic {missing[0]!r} does not exist")
    return sorted(TopicPartition(t, p) for t in topics if t in counts for p in range(counts[t]))


def _assigned(
    assignment: Iterable[TopicPartition], counts: dict[str, int], must_exist: bool
) -> list[TopicPartition]:
    present = [tp for tp in assignment if tp.partition < counts.get(tp.topic, 0)]
    absent = sorted(set(assignment) - set(present))
    if absent and must_exist:
        tp = absent[0]
        have = f"{counts[tp.topic]} partitions" if tp.topic in counts else "no such topic"
        raise PlanningError(f"assign: partition {tp} does not exist ({tp.topic}: {have})")
    return sorted(present)


def resolve_offsets(
    view: ClusterView,
    bound,
    tps: Sequence[TopicPartition],
    *,
    default: int,
    option: str | None,
    earliest: Offsets,
    latest: Offsets,
    no_match: str = "latest",
) -> Offsets:
    """Concrete offsets of an offset bound for ``tps`` (looking timestamps up as needed)."""
    stray = sorted(listed_partitions(bound) - set(tps))
    if stray:
        raise PlanningError(
            f"{option or 'offsets'}: partition {stray[0]} is not part of the subscription (or does not exist)"
        )
    by_timestamp = view.offsets_for_times(timestamps_needed(bound, tps))
    return resolve_bound(
        bound,
        tps,
        earliest=earliest,
        latest=latest,
        by_timestamp=by_timestamp,
        default=default,
        option=option or "offsets",
        no_match=no_match,
    )
