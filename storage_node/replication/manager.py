"""``ReplicaManager``: every partition replica of one storage node and their roles (Kafka's
``ReplicaManager``).

* **Roles** come from the controller (:meth:`ReplicaManager.update_leader_and_isr`), fenced by the
  controller epoch: a call older than the newest epoch seen -- in a call, or in etcd through
  :meth:`observe_controller_epoch` -- is STALE_CONTROLLER_EPOCH and changes nothing. A replica
  that must already hold its log (it is in the ISR) but does not answers REPLICA_NOT_AVAILABLE,
  so the controller takes it out of the ISR instead of letting an empty log lead under the old
  offsets; others create their log and catch up.
* **Appends** reach the leader only (:meth:`append`): ``acks=all`` checks ``min.insync.replicas``
  before writing and waits for the high watermark after.
* **Reads**: consumers read below the high watermark of a leader (:meth:`read_for_consumer`);
  followers fetch to the log end (:meth:`read_for_follower`), which is how the leader learns
  their positions.
* **Followers** are fed by one replica fetcher per leader (``fetcher.py``).
* **ISR upkeep** (:meth:`maintain`): leaders ask to drop followers that lagged for
  ``replica.lag.time.max.ms``; changes go to the controller through an :class:`IsrChannel`.

Thread safety: event-loop only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from services import errors
from services.broker_address import BrokerAddress
from services.clock import Clock
from services.fetchport.multi import PartitionFetch
from services.leader_and_isr import LeaderAndIsr
from storage_node.log.leader_epochs import EpochEndOffset
from storage_node.log.log_manager import LogManager
from storage_node.log.partition_log import AppendInfo, FetchInfo
from storage_node.notifier import AppendNotifier
from storage_node.replication.partition import Partition

log = logging.getLogger(__name__)


class IsrChannel(Protocol):
    """Where AlterPartition requests go (the active controller)."""

    def submit(self, partition: Partition, new_isr: tuple[int, ...]) -> None:
        """Send the change; answer with ``partition.apply_state`` or ``on_isr_change_failed``."""


class FollowerFetchers(Protocol):
    """The replica fetchers: which partitions follow which leader."""

    def follow(self, partition: Partition, leader: BrokerAddress) -> None: ...

    def unfollow(self, key: tuple[str, int]) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """A storage node's replication settings (Kafka's names with dots as underscores)."""

    #: A follower not caught up for this long leaves the ISR (replica.lag.time.max.ms).
    replica_lag_time_max_ms: int = 30_000
    #: Long-poll bound of a follower's fetch (replica.fetch.wait.max.ms).
    replica_fetch_wait_max_ms: int = 500
    #: Record bytes per partition per fetch (replica.fetch.max.bytes).
    replica_fetch_max_bytes: int = 1 << 20
    #: Record bytes per fetch response (replica.fetch.response.max.bytes).
    replica_fetch_response_max_bytes: int = 10 << 20
    #: Pause of a partition (or a connection) after a fetch error (replica.fetch.backoff.ms).
    replica_fetch_backoff_ms: int = 1_000


@dataclass(frozen=True, slots=True)
class StateUpdateResult:
    topic: str
    partition: int
    error: errors.TributaryError | None = None


class ReplicaManager:
    """The replicas of one storage node. See the module docstring."""

    def __init__(
        self,
        node_id: int,
        logs: LogManager,
        notifier: AppendNotifier,
        clock: Clock,
        settings: ReplicationSettings = ReplicationSettings(),
    ) -> None:
        self.node_id = node_id
        self.logs = logs
        self.notifier = notifier
        self.clock = clock
        self.settings = settings
        self.controller_epoch = 0
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._isr_channel: IsrChannel | None = None
        self._fetchers: FollowerFetchers | None = None

    def attach(self, *, isr_channel: IsrChannel | None, fetchers: FollowerFetchers | None) -> None:
        """Connect the controller channel and the replica fetchers (built after this manager)."""
        self._isr_channel = isr_channel
        self._fetchers = fetchers

    # ---- partitions ------------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> Partition:
        """The replica; UNKNOWN_TOPIC_OR_PARTITION if this node has no log for it."""
        replica = self._partitions.get((topic, partition))
        if replica is not None and not replica.log.closed:
            return replica
        return self._adopt(self.logs.get(topic, partition))

    def _adopt(self, partition_log) -> Partition:
        """The Partition of a log that exists on disk (created, or found at start)."""
        key = (partition_log.topic, partition_log.partition)
        replica = self._partitions.get(key)
        if replica is None or replica.log is not partition_log:
            replica = Partition(
                self.node_id,
                partition_log,
                self.clock,
                on_high_watermark=self.notifier.notify,
                send_isr_change=self._send_isr_change,
            )
            self._partitions[key] = replica
        return replica

    def partitions(self) -> list[Partition]:
        return [self.get(pl.topic, pl.partition) for pl in self.logs.partitions()]

    def leaders(self) -> list[Partition]:
        return [p for p in self._partitions.values() if p.is_leader and not p.log.closed]

    def _send_isr_change(self, partition: Partition, new_isr: tuple[int, ...]) -> None:
        if self._isr_channel is not None:
            self._isr_channel.submit(partition, new_isr)

    # ---- controller epoch ------------------------------------------------------------------------

    def observe_controller_epoch(self, epoch: int) -> None:
        """A controller epoch seen in etcd: calls carrying an older one are refused from now on."""
        if epoch > self.controller_epoch:
            self.controller_epoch = epoch

    def ensure_controller_epoch(self, epoch: int) -> None:
        if epoch < self.controller_epoch:
            raise errors.StaleControllerEpochError(
                f"controller epoch {epoch} is older than {self.controller_epoch}, the newest node "
                f"{self.node_id} has seen: the call comes from a deposed controller"
            )
        self.controller_epoch = epoch

    # ---- roles -----------------------------------------------------------------------------------

    def update_leader_and_isr(
        self,
        controller_epoch: int,
        states: Iterable[LeaderAndIsr],
        leaders: Mapping[int, BrokerAddress],
        topic_configs: Mapping[str, Mapping[str, str]],
    ) -> list[StateUpdateResult]:
        """Apply the controller's partition states; one result per state."""
        self.ensure_controller_epoch(controller_epoch)
        results = []
        for state in states:
            try:
                self._apply(state, leaders, topic_configs.get(state.topic))
                results.append(StateUpdateResult(state.topic, state.partition))
            except errors.TributaryError as exc:
                results.append(StateUpdateResult(state.topic, state.partition, exc))
        return results

    def _apply(
        self, state: LeaderAndIsr, leaders: Mapping[int, BrokerAddress], configs: Mapping[str, str] | None
    ) -> None:
        if self.node_id not in state.replicas:
            if self._retire(state):
                return
            raise errors.NotLeaderOrFollowerError(
                f"node {self.node_id} is not a replica of {state.topic}-{state.partition} "
                f"({list(state.replicas)})"
            )
        replica = self._replica_for_state(state, configs)
        if not replica.apply_state(state):
            return
        if replica.is_leader or state.deleting or state.leader < 0:
            if self._fetchers is not None:
                self._fetchers.unfollow(replica.key)
            return
        endpoint = leaders.get(state.leader)
        if endpoint is None:
            raise errors.LeaderNotAvailableError(
                f"no endpoint for node {state.leader}, the leader of {replica.name}"
            )
        if self._fetchers is not None:
            self._fetchers.follow(replica, endpoint)

    def _retire(self, state: LeaderAndIsr) -> bool:
        """A state that no longer names this node, for a replica it holds: a reassignment took
        the partition off it. The replica stops (fetching, serving, waiting appends fail) and may
        be deleted next. False when this node holds no replica with a state."""
        replica = self._partitions.get(state.key)
        if replica is None or replica.state is None or replica.log.closed:
            return False
        if state.newer_than(replica.state):
            replica.apply_state(state)
            replica.stop(f"reassigned to nodes {list(state.replicas)}")
            log.info("%s: reassigned off this node (now on %s): stopped", replica.name, list(state.replicas))
        if self._fetchers is not None:
            self._fetchers.unfollow(replica.key)
        return True

    def _replica_for_state(self, state: LeaderAndIsr, configs: Mapping[str, str] | None) -> Partition:
        try:
            return self.get(state.topic, state.partition)
        except errors.UnknownTopicOrPartitionError:
            pass
        if self.node_id in state.isr:
            raise errors.ReplicaNotAvailableError(
                f"{state.topic}-{state.partition}: node {self.node_id} is in the ISR but holds no log "
                "for it (lost): it must leave the ISR and copy the log again"
            ) from None
        if state.deleting:
            raise errors.UnknownTopicOrPartitionError(f"{state.topic}-{state.partition} is being deleted")
        partition_log = self.logs.create_partition(state.topic, state.partition, configs)
        log.info("Created %s as a follower that will copy its leader", partition_log.name)
        return self._adopt(partition_log)

    def become_sole_leader(self, topic: str, partition: int, leader_epoch: int) -> None:
        """A standalone node (no controller) leads its partitions alone: ISR = replicas = itself."""
        replica = self.get(topic, partition)
        current = replica.state
        if current is not None and current.leader_epoch >= leader_epoch:
            return
        replica.apply_state(
            LeaderAndIsr(topic, partition, (self.node_id,), self.node_id, leader_epoch, (self.node_id,), 0)
        )

    def stop_replica(self, controller_epoch: int, topic: str, partition: int) -> None:
        """Before a DeletePartition: refuse it while this node is an active replica, unless the
        controller stopped it first (its state says the topic is being deleted)."""
        self.ensure_controller_epoch(controller_epoch)
        replica = self._partitions.get((topic, partition))
        if replica is None or replica.state is None or replica.log.closed:
            return
        if not replica.state.deleting and self.node_id in replica.state.replicas:
            raise errors.PolicyViolationError(
                f"{replica.name} is an active replica on node {self.node_id} (leader epoch "
                f"{replica.state.leader_epoch}); only the controller deletes it, after stopping it"
            )
        replica.stop("deleted")
        if self._fetchers is not None:
            self._fetchers.unfollow(replica.key)
        del self._partitions[(topic, partition)]

    # ---- data ------------------------------------------------------------------------------------

    def append(
        self, topic: str, partition: int, data, *, acks_all: bool, leader_epoch: int | None
    ) -> tuple[Partition, AppendInfo]:
        replica = self.get(topic, partition)
        return replica, replica.append_as_leader(data, acks_all=acks_all, leader_epoch=leader_epoch)

    def read_for_consumer(
        self,
        topic: str,
        partition: int,
        offset: int,
        max_bytes: int,
        *,
        committed: bool = False,
        bounds_only: bool = False,
    ) -> FetchInfo:
        return self.get(topic, partition).read_for_consumer(
            offset, max_bytes, committed=committed, bounds_only=bounds_only
        )

    def committed_view(self, topic: str, partition: int, offset: int) -> tuple[int, list[tuple[int, int]]]:
        return self.get(topic, partition).committed_view(offset)

    def read_for_follower(
        self, replica_id: int, fetch: PartitionFetch
    ) -> tuple[FetchInfo | None, EpochEndOffset | None]:
        return self.get(fetch.topic, fetch.partition).read_for_follower(replica_id, fetch)

    # ---- upkeep ----------------------------------------------------------------------------------

    def maintain(self) -> None:
        """Periodic: leaders ask to shrink ISRs of lagging followers."""
        for replica in self.leaders():
            try:
                replica.maybe_shrink_isr(self.settings.replica_lag_time_max_ms)
            except errors.TributaryError as exc:
                log.warning("ISR upkeep of %s failed: %s", replica.name, exc)

    def forget(self, topic: str, partition: int) -> None:
        """The partition's log is gone (deleted): drop its replica."""
        replica = self._partitions.pop((topic, partition), None)
        if replica is not None:
            replica.stop("deleted")
            if self._fetchers is not None:
                self._fetchers.unfollow(replica.key)

    def stop(self) -> None:
        for replica in self._partitions.values():
            replica.stop("the storage node is stopping")
