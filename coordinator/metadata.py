"""Cluster metadata: the pure state built from etcd keys, and the watch-fed cache around it.

:class:`MetadataState` is a plain object that applies etcd snapshots and events (no I/O, unit
tested) and answers queries: live storage nodes, topics, partitions as served (see
:class:`~coordinator.model.PartitionView`), who the controller is, and the etcd revision it
reflects.

:class:`MetadataCache` feeds a state from one watch over the whole cluster prefix (one snapshot,
then every event in revision order, a whole etcd response -- one txn -- at a time, so readers never
see half a write) and lets callers wait for a revision or a condition. Every coordinator, active or
standby, serves metadata from its own cache. Not thread-safe: one event loop.

The watch also sees consumer-group keys (``groups/...``), which change far more often than
metadata (a committing group writes every few milliseconds). Those advance :attr:`revision`
(read-your-writes waits need it) but not :attr:`metadata_revision`, and do not call the change
listeners: the controller's reconcile loop and the gateways' WatchMetadata streams only wake for
metadata. Batch listeners (:meth:`MetadataCache.add_batch_listener`) get every watch response as
it is, so the consumer-group manager follows ``groups/`` on this same watch instead of a second
one that would deliver every commit again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from typing import Any

from coordinator import keys
from coordinator.model import (
    NO_LEADER,
    ControllerInfo,
    CoordinatorInfo,
    PartitionRecord,
    PartitionStatus,
    PartitionView,
    RegisteredBroker,
    TopicRecord,
    TopicView,
)
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync

log = logging.getLogger(__name__)


class MetadataState:
    """Everything the coordinator knows from etcd, as of :attr:`revision`."""

    def __init__(self) -> None:
        #: The etcd revision this state has caught up with (every key under the prefix).
        self.revision = 0
        #: The revision of the last change to metadata (group keys excluded); what clients see.
        self.metadata_revision = 0
        self.brokers: dict[int, RegisteredBroker] = {}
        self.coordinators: dict[str, CoordinatorInfo] = {}
        self.controller: ControllerInfo | None = None
        self.controller_epoch = 0
        self.cluster_id = ""
        self.topics: dict[str, TopicRecord] = {}
        self.partitions: dict[str, dict[int, PartitionRecord]] = {}
        #: Topic name -> the metadata revision of its last change (its key or one of its
        #: partitions' states; deleted topics stay as tombstones), least recently changed first,
        #: so :meth:`topics_changed_since` reads only the changes, not every topic.
        self.topic_revisions: dict[str, int] = {}
        #: The revision of the last change to the set of live storage nodes (every partition's
        #: served view depends on it), and of the last snapshot (resync) applied.
        self.brokers_revision = 0
        self.snapshot_revision = 0
        #: Topic name -> the revision of the last deletion of one of its partition states (a
        #: change a partition's mod revision cannot show).
        self.partition_deletions: dict[str, int] = {}

    # -- applying etcd data ---------------------------------------------------------------------

    def apply_resync(self, resync: WatchResync) -> None:
        """Replace everything with the snapshot in ``resync``."""
        self.__init__()  # type: ignore[misc]  # reset every field in one place
        for kv in resync.kvs:
            self._put(kv)
        self.revision = self.metadata_revision = resync.revision
        self.brokers_revision = self.snapshot_revision = resync.revision
        self.topic_revisions = dict.fromkeys(self.topics, resync.revision)

    def apply_events(self, events: Iterable[WatchEvent]) -> bool:
        """Apply events in order (a DELETE of a leased key is how a lease expiry shows up);
        return whether any of them was about metadata (not a key this state ignores)."""
        changed = False
        for event in events:
            parsed = keys.parse_key(event.kv.key)
            if parsed.kind == "other":
                self.revision = max(self.revision, event.revision)
                continue
            if event.type is EventType.PUT:
                self._put(event.kv)
            else:
                self._delete(event.kv.key)
                if parsed.kind == "partition":
                    self.partition_deletions[parsed.name] = event.revision
            self.revision = self.metadata_revision = max(self.revision, event.revision)
            if parsed.kind in ("topic", "partition"):
                self.topic_revisions.pop(parsed.name, None)  # re-inserted last: newest change
                self.topic_revisions[parsed.name] = self.metadata_revision
            elif parsed.kind == "broker":
                self.brokers_revision = self.metadata_revision
            changed = True
        return changed

    def _put(self, kv: KeyValue) -> None:
        parsed = keys.parse_key(kv.key)
        try:
            self._put_parsed(parsed, kv)
        except keys.BadValueError as exc:
            # One corrupt key must not take the cache down; it is ignored until rewritten.
            log.error("ignoring etcd key %r with a bad value: %s", kv.key, exc)
            self._delete(kv.key)

    def _put_parsed(self, parsed: keys.ParsedKey, kv: KeyValue) -> None:
        kind = parsed.kind
        if kind == "broker":
            broker = keys.decode_broker(kv.value, incarnation=kv.create_revision)
            self.brokers[broker.node_id] = broker
        elif kind == "coordinator":
            self.coordinators[parsed.name] = keys.decode_coordinator(kv.value)
        elif kind == keys.CONTROLLER:
            self.controller = keys.decode_controller(kv.value)
        elif kind == keys.CONTROLLER_EPOCH:
            self.controller_epoch = keys.decode_epoch(kv.value)
        elif kind == keys.CLUSTER_ID:
            self.cluster_id = kv.value.decode(errors="replace")
        elif kind == "topic":
            self.topics[parsed.name] = keys.decode_topic(parsed.name, kv.value, mod_revision=kv.mod_revision)
        elif kind == "partition":
            record = keys.decode_partition(kv.value, mod_revision=kv.mod_revision)
            self.partitions.setdefault(parsed.name, {})[parsed.partition] = record

    def _delete(self, key: str) -> None:
        parsed = keys.parse_key(key)
        kind = parsed.kind
        if kind == "broker":
            self.brokers = {i: b for i, b in self.brokers.items() if str(i) != parsed.name}
        elif kind == "coordinator":
            self.coordinators.pop(parsed.name, None)
        elif kind == keys.CONTROLLER:
            self.controller = None
        elif kind == keys.CONTROLLER_EPOCH:
            self.controller_epoch = 0
        elif kind == keys.CLUSTER_ID:
            self.cluster_id = ""
        elif kind == "topic":
            self.topics.pop(parsed.name, None)
        elif kind == "partition":
            self.partitions.get(parsed.name, {}).pop(parsed.partition, None)
            if not self.partitions.get(parsed.name, True):
                del self.partitions[parsed.name]

    # -- queries --------------------------------------------------------------------------------

    def topics_changed_since(self, revision: int) -> list[str]:
        """Names of the topics (existing or deleted) whose key or partition states changed after
        ``revision``, newest change first. Reads only those changes: a create costs the readers
        in proportion to its own topic, not to the cluster."""
        changed = []
        for name, changed_at in reversed(self.topic_revisions.items()):
            if changed_at <= revision:
                break
            changed.append(name)
        return changed

    def changed_partitions(self, topic: TopicRecord, revision: int) -> list[int] | None:
        """The partitions of ``topic`` whose state changed after ``revision``, ascending; None
        when the topic as a whole may have (its key was rewritten: configs, partition count; or
        a partition state was deleted). Compares each stored state's mod revision: linear in the
        topic's partitions, far cheaper than serving them all."""
        if topic.mod_revision > revision or self.partition_deletions.get(topic.name, 0) > revision:
            return None
        records = self.partitions.get(topic.name, {})
        return sorted(p for p, record in records.items() if record.mod_revision > revision)

    def partial_topic_view(self, topic: TopicRecord, partitions: Iterable[int]) -> TopicView:
        """``topic`` with only ``partitions`` as served (a partition delta)."""
        return TopicView(
            topic.name,
            topic.topic_id,
            topic.replication_factor,
            dict(topic.configs),
            tuple(self.partition_view(topic, p) for p in partitions),
            partial=True,
        )

    def delta_possible_since(self, revision: int) -> bool:
        """Whether the topics changed after ``revision`` are all that differs from what was served
        at ``revision``: no snapshot since (anything may differ), and the live storage nodes --
        on which every partition's served view depends -- unchanged."""
        return revision >= self.snapshot_revision and revision >= self.brokers_revision

    def live_topic(self, name: str) -> TopicRecord | None:
        """The topic, unless it does not exist or is being deleted."""
        topic = self.topics.get(name)
        return None if topic is None or topic.deleting else topic

    def topic_names(self) -> list[str]:
        """Names of the topics that exist and are not being deleted, sorted."""
        return sorted(name for name, topic in self.topics.items() if not topic.deleting)

    def partition_record(self, topic: str, partition: int) -> PartitionRecord | None:
        """The stored state of a partition; None while it is still PENDING."""
        return self.partitions.get(topic, {}).get(partition)

    def partition_view(self, topic: TopicRecord, partition: int) -> PartitionView:
        """A partition as served: its stored state seen against the live storage nodes."""
        record = self.partition_record(topic.name, partition)
        if record is None:
            return PartitionView(
                topic.name,
                partition,
                tuple(topic.assignment[partition]),
                NO_LEADER,
                0,
                (),
                PartitionStatus.PENDING,
            )
        status = record.status
        leader = record.leader
        if status is PartitionStatus.ONLINE and leader not in self.brokers:
            status, leader = PartitionStatus.OFFLINE, NO_LEADER
        if status is not PartitionStatus.ONLINE:
            leader = NO_LEADER
        return PartitionView(
            topic.name, partition, record.replicas, leader, record.leader_epoch, record.isr, status
        )

    def topic_view(self, name: str) -> TopicView | None:
        """A topic with every partition as served, or None if it does not exist."""
        topic = self.live_topic(name)
        if topic is None:
            return None
        partitions = tuple(self.partition_view(topic, p) for p in range(topic.partition_count))
        return TopicView(
            topic.name, topic.topic_id, topic.replication_factor, dict(topic.configs), partitions
        )

    def leader_counts(self) -> dict[int, int]:
        """Partitions each node leads or is the preferred leader of (placement spreads leaders)."""
        return leader_counts(self.topics.values())

    def partition_count(self) -> int:
        """Partitions of every topic, those being deleted included (they exist until deleted)."""
        return sum(topic.partition_count for topic in self.topics.values())

    def live_racks(self) -> dict[int, str]:
        """Live storage node ids and their racks: the input of placement."""
        return {node_id: broker.rack for node_id, broker in self.brokers.items()}


def leader_counts(topics: Iterable[TopicRecord]) -> dict[int, int]:
    """Partitions each node is the preferred leader of, over ``topics``. Linear in their
    partitions (200,000 take ~40 ms): the controller runs it in a worker thread."""
    counts: dict[int, int] = {}
    for topic in topics:
        for replicas in topic.assignment:
            counts[replicas[0]] = counts.get(replicas[0], 0) + 1
    return counts


class MetadataCache:
    """A :class:`MetadataState` kept current by a watch, with ways to wait for it.

    ``synced`` turns true at the first snapshot. :meth:`watch_routine` is the long-lived task;
    listeners registered with :meth:`add_listener` are called (synchronously) after every applied
    change, e.g. to wake the controller's reconcile loop.
    """

    def __init__(self) -> None:
        self.state = MetadataState()
        self.synced = False
        self._changed = asyncio.Event()
        self._listeners: list[Callable[[], None]] = []
        self._batch_listeners: list[Callable[[list[WatchEvent] | WatchResync], None]] = []

    @property
    def revision(self) -> int:
        return self.state.revision

    def add_listener(self, listener: Callable[[], None]) -> None:
        self._listeners.append(listener)

    def remove_listener(self, listener: Callable[[], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def add_batch_listener(self, listener: Callable[[list[WatchEvent] | WatchResync], None]) -> None:
        """Call ``listener`` (synchronously) with every watch response or resync, once applied."""
        self._batch_listeners.append(listener)

    def remove_batch_listener(self, listener: Callable[[list[WatchEvent] | WatchResync], None]) -> None:
        if listener in self._batch_listeners:
            self._batch_listeners.remove(listener)

    def apply(self, batch: list[WatchEvent] | WatchResync) -> None:
        """Apply one watch response (all events of one etcd response) or a resync, then notify
        waiters -- and listeners too if metadata changed."""
        if isinstance(batch, WatchResync):
            self.state.apply_resync(batch)
            self.synced = True
            changed = True
        else:
            changed = self.state.apply_events(batch)
        self._notify(listeners=changed)
        for listener in list(self._batch_listeners):
            listener(batch)

    async def watch_routine(self, client: Any) -> None:
        """Follow the cluster prefix forever: a snapshot first, then every change.

        The etcd layer's watch reconnects by itself and turns compaction into a resync, so this
        only has to apply what it yields.
        """
        watch = await client.watch_prefix_with_snapshot("")
        async with watch:
            async for batch in watch.batches():
                self.apply(batch)

    def _notify(self, *, listeners: bool = True) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()
        if listeners:
            for listener in self._listeners:
                listener()

    async def wait_for(self, predicate: Callable[[MetadataState], bool], timeout: float) -> bool:
        """Wait until ``predicate(state)`` holds; return False if ``timeout`` seconds pass first."""
        try:
            async with asyncio.timeout(timeout):
                while not (self.synced and predicate(self.state)):
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    async def wait_for_revision(self, revision: int, timeout: float) -> bool:
        """Wait until the cache reflects etcd revision ``revision`` (read-your-writes)."""
        return await self.wait_for(lambda state: state.revision >= revision, timeout)

    async def wait_for_metadata_after(self, revision: int, timeout: float) -> bool:
        """Wait until metadata changed after ``revision`` (group keys do not count)."""
        return await self.wait_for(lambda state: state.metadata_revision > revision, timeout)
