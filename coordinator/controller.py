"""The active controller: one term (one controller epoch) of topic admin and partition upkeep.

A :class:`Controller` exists only while its coordinator holds the controller seat. It does two
things:

* **admin operations** (create / delete topics, add partitions, alter configs): validate against
  the metadata cache, place replicas (:mod:`coordinator.placement`), write the topic key;
* **reconciliation** (:meth:`Controller.reconcile_routine`): one task that repeatedly compares the
  metadata with what should be (:mod:`coordinator.partition_state`) and closes the gap -- pushes
  CreatePartition to leaders and only then marks partitions ONLINE, elects new leaders from the
  ISR when a leader's node is lost (or marks the partition OFFLINE), drops lost nodes from ISRs,
  tells every replica its role (:mod:`coordinator.replica_roles`), deletes the data of deleted
  topics; moves leadership and ISR membership off nodes in controlled shutdown
  (:meth:`Controller.controlled_shutdown`).
* **ISR changes** asked by leaders (:meth:`Controller.alter_partition`, KIP-497), checked by
  :mod:`coordinator.isr_changes` and written with a compare-and-swap on the state's version.
  Passes run one at a time. Beside them, one background task per (re)registered storage node
  re-pushes its partitions and removes its orphans (a node back with an empty disk may need
  thousands of partitions re-created; that must not hold up elections or new topics). Admin
  calls only write etcd and wait; they never call storage nodes themselves.

**Fencing.** Every etcd write is a transaction guarded by "``controller_epoch`` still holds my
epoch" and "the ``controller`` key is still the one my election created". A deposed controller
(paused past its lease, cut off from etcd) cannot write anything: its first write fails, it marks
itself deposed -- which ends its term -- and the caller gets NOT_CONTROLLER naming whoever is
active now (so the servicer forwards the call there). Its calls to storage nodes carry its epoch,
and nodes refuse an epoch older than the newest they have seen (in a call or in etcd), so it
cannot change a node either.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from coordinator import keys, topic_rules
from coordinator.isr_changes import IsrChange, validated_isr_change
from coordinator.keys import WRITE_BATCH
from coordinator.leader_balance import imbalanced_partitions
from coordinator.metadata import MetadataCache, MetadataState, leader_counts
from coordinator.model import (
    NO_LEADER,
    PartitionStatus,
    PartitionView,
    RegisteredBroker,
    TopicRecord,
    TopicSpec,
    TopicView,
)
from coordinator.partition_state import (
    Transition,
    deleting_topics,
    election_targets,
    plan_node_sync,
    plan_partitions,
    plan_preferred_leader,
    shutdown_progress,
)
from coordinator.placement import assign_added_partitions, assign_replicas, least_loaded_start
from coordinator.reassigner import Reassigner
from coordinator.redirect import ControllerMovedError
from coordinator.replica_roles import RoleTracker, leader_and_isr
from coordinator.storage_client import PartitionCreation, StorageNodes
from services import errors
from services.etcd.election import epoch_guard
from services.etcd.exceptions import EtcdError, EtcdGuardFailedError, EtcdRequestTooLargeError, NotLeaderError
from services.etcd.txn import Compare, Op, TxnResult
from services.leader_and_isr import LeaderAndIsr
from services.topic_config import TOPIC_CONFIGS, format_topic_config, validate_topic_configs

log = logging.getLogger(__name__)

#: Attempts of an admin write that lost a compare-and-swap race with the reconcile loop.
_CAS_ATTEMPTS = 5
#: Partition states per UpdateLeaderAndIsr call. A node applies a call in one go on its event
#: loop, two fsyncs per partition it starts leading (the leader-epoch checkpoint): 2,000 held it
#: for seconds, past a short lease's keep-alive on a busy machine; 500 keep each under a second.
ROLES_BATCH = 500
#: Partitions per CreatePartitionBatch call: a create's pushes and a restarted node's
#: re-election confirmations cost a call per thousand partitions, not one each (10,000 gRPC calls
#: were a quarter of the controller's time in a create of 10,000 partitions).
CREATE_BATCH = 1000
#: A pass over every partition at least this often (the others plan only the topics that changed
#: or still had work): the level-triggered safety net, at a cost linear in the cluster's partitions.
FULL_PASS_INTERVAL_S = 30.0


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """Tuning of the active controller (from :class:`coordinator.config.CoordinatorConfig`)."""

    #: Passes also run this often without any change, to retry failed storage-node calls.
    reconcile_interval_s: float = 1.0
    #: How long admin calls wait for their effect (partitions online, data deleted).
    admin_wait_s: float = 10.0
    #: Storage-node RPCs in flight at once during a pass.
    max_parallel_rpcs: int = 64
    #: Replication factor of a CreateTopic that leaves it 0.
    default_replication_factor: int = 1
    #: Partition limits (:mod:`coordinator.config` says why these defaults).
    max_partitions_per_topic: int = topic_rules.DEFAULT_MAX_PARTITIONS_PER_TOPIC
    max_partitions_per_cluster: int = topic_rules.DEFAULT_MAX_PARTITIONS_PER_CLUSTER
    #: Move leadership back to preferred replicas on its own (auto.leader.rebalance.enable).
    auto_leader_rebalance_enable: bool = True
    #: A node's share of preferred-led partitions led elsewhere that triggers it, percent.
    leader_imbalance_per_broker_percentage: int = 10
    #: How often the imbalance is checked (leader.imbalance.check.interval.seconds).
    leader_imbalance_check_interval_s: float = 300.0


class Controller:
    """The duties of the active controller for one epoch. See the module docstring."""

    def __init__(
        self,
        *,
        client,
        cache: MetadataCache,
        storage: StorageNodes,
        epoch: int,
        election_guard: Callable[[], Compare],
        settings: ControllerSettings = ControllerSettings(),
        rng: random.Random | None = None,
        on_unclean_election: Callable[[], None] = lambda: None,
    ) -> None:
        self.client = client
        self._on_unclean_election = on_unclean_election
        self.cache = cache
        self.storage = storage
        self.epoch = epoch
        self.settings = settings
        self.deposed = asyncio.Event()
        self.deposed_reason = ""
        self._election_guard = election_guard
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._last_write_revision = 0
        self._synced_incarnations: dict[int, int] = {}
        #: Incremental passes (see :meth:`_topics_to_plan`): the metadata revision the last pass
        #: planned at, the topics it left work in, topics marked for the next pass, and whether
        #: the next pass must look at every partition.
        self._planned_revision = 0
        self._unfinished_topics: set[str] = set()
        self._dirty_topics: set[str] = set()
        self._full_pass_due = True
        self._last_full_pass = 0.0
        self._syncs: dict[int, asyncio.Task] = {}
        self._configs_to_push: set[str] = set()
        self._roles = RoleTracker()
        #: Replicas that answered that their log is missing, per partition: they may neither lead
        #: nor stay in the ISR (kept for this term; a new controller learns them again).
        self._lost: dict[tuple[str, int], set[int]] = {}
        #: Nodes in controlled shutdown: node id -> the registration (incarnation) that asked. Kept
        #: for this term while that registration lives (a restarted node is eligible again); a
        #: new controller learns them again, as the stopping node asks until it is done.
        self._shutting_down: dict[int, int] = {}
        #: Elections that gave the lead to an out-of-sync replica (records may have been lost).
        self.unclean_elections = 0
        #: Creates and grows run one at a time, so each checks the cluster's partition limit
        #: against all earlier ones (milliseconds each; waiting for partitions to come online is
        #: outside it).
        self._growth_lock = asyncio.Lock()
        self._rpc_slots = asyncio.Semaphore(settings.max_parallel_rpcs)
        # Node syncs get their own, smaller share, so a big one never starves the passes.
        self._sync_slots = asyncio.Semaphore(max(1, settings.max_parallel_rpcs // 4))
        self.reassignments = Reassigner(self)
        #: When the next automatic preferred-leader check is due (auto.leader.rebalance.enable).
        self._next_balance_check = time.monotonic() + settings.leader_imbalance_check_interval_s
        cache.add_listener(self.kick)

    # -- term -------------------------------------------------------------------------------------

    def kick(self) -> None:
        """Ask for a reconcile pass soon (called on every metadata change)."""
        self._wake.set()

    def depose(self, reason: str) -> None:
        """End this term: no more writes, the reconcile routine stops."""
        if not self.deposed.is_set():
            self.deposed_reason = reason
            log.warning("controller epoch %d stepping down: %s", self.epoch, reason)
            self.deposed.set()
            self._cancel_node_syncs()
            self.cache.remove_listener(self.kick)
            self.kick()

    def ensure_current(self) -> None:
        """Raise NOT_CONTROLLER once deposed, naming the active controller if the cache knows it."""
        if self.deposed.is_set():
            raise self._moved()

    def _moved(self) -> ControllerMovedError:
        active = self.cache.state.controller
        if active is None or active.epoch == self.epoch:
            return ControllerMovedError(f"controller epoch {self.epoch} was deposed; no new controller yet")
        return ControllerMovedError(
            f"controller epoch {self.epoch} was deposed; the active controller is {active.coordinator_id} "
            f"at {active.address} (epoch {active.epoch})",
            active_id=active.coordinator_id,
            active_address=active.address,
        )

    # -- fenced writes ----------------------------------------------------------------------------

    def _guards(self) -> list[Compare]:
        try:
            return [epoch_guard(keys.CONTROLLER_EPOCH, self.epoch), self._election_guard()]
        except NotLeaderError as exc:
            self.depose(f"lost the election: {exc}")
            raise self._moved() from exc

    async def fenced_txn(self, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> TxnResult:
        """One transaction fenced by this term; ``succeeded`` says whether ``compares`` held.

        Every write of the active controller goes through here -- topic metadata and consumer
        groups alike -- so a deposed controller can write nothing: a stale epoch deposes this
        term and raises NOT_CONTROLLER naming the new controller; an unreachable etcd raises
        COORDINATOR_NOT_AVAILABLE. Requests etcd refuses outright (e.g. a lease that expired)
        are raised as the etcd error, for the caller to interpret.
        """
        self.ensure_current()
        try:
            return await self.client.txn(compares, ops, guard=self._guards())
        except EtcdGuardFailedError as exc:
            log.error("write rejected, controller epoch %d is stale (%s)", self.epoch, exc)
            self.depose("a write was rejected: stale controller epoch")
            raise self._moved() from exc
        except EtcdRequestTooLargeError as exc:
            # The same write is refused every time: never COORDINATOR_NOT_AVAILABLE (retried).
            raise errors.PolicyViolationError(
                f"the metadata write is larger than etcd accepts: {exc.message}"
            ) from exc
        except EtcdError as exc:
            if not exc.retriable:
                raise  # a request etcd refuses outright is a bug here: UNKNOWN_SERVER_ERROR
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc.message}") from exc

    async def _write(self, ops: Sequence[Op], compares: Sequence[Compare] = ()) -> TxnResult:
        """A fenced metadata write, remembered so admin calls can wait to see their own writes."""
        result = await self.fenced_txn(ops, compares)
        self._last_write_revision = max(self._last_write_revision, result.revision)
        return result

    async def _await_own_writes(self) -> None:
        """Let the cache catch up with this controller's writes (read-your-writes)."""
        if not await self.cache.wait_for_revision(self._last_write_revision, self.settings.admin_wait_s):
            raise errors.CoordinatorNotAvailableError("metadata cache is not catching up with etcd")

    # -- admin: create ------------------------------------------------------------------------------

    async def create_topic(self, spec: TopicSpec) -> TopicView:
        """Validate, place and store a new topic; return it once its partitions are online
        (or after ``admin_wait_s`` with those still pending).

        Every check whose cost does not grow with the request comes first, the partition limits
        among them; placement, encoding and the validate-only answer -- the parts that grow with
        partitions times replicas (10,000 x 3: ~10, ~4 and ~12 ms; bench/bounds.py) -- run in
        worker threads, so the event loop (the election lease's keep-alive, every other call)
        never waits for them."""
        self.ensure_current()
        async with self._growth_lock:
            await self._await_own_writes()
            state = self.cache.state
            racks = state.live_racks()
            configs, factor = self._check_new_topic(state, spec, racks)
            existing = tuple(state.topics.values())
            record = await asyncio.to_thread(_place_topic, spec, configs, factor, racks, existing, self._rng)
            if spec.validate_only:
                return await asyncio.to_thread(_pending_view, record)
            key = keys.topic_key(spec.name)
            value = await asyncio.to_thread(keys.encode_topic, record)
            result = await self._write([Op.put(key, value)], [Compare.absent(key)])
        if not result.succeeded:
            raise errors.TopicAlreadyExistsError(f"Topic '{spec.name}' already exists.")
        log.info(
            "created topic %s: %d partitions, replication factor %d, configs %s",
            spec.name,
            record.partition_count,
            record.replication_factor,
            dict(record.configs),
        )
        return await self._wait_online(spec.name, range(record.partition_count))

    def _check_new_topic(
        self, state: MetadataState, spec: TopicSpec, racks: Mapping[int, str]
    ) -> tuple[dict[str, str], int]:
        """Every rule a new topic must meet, before any placement: its canonical configs and
        replication factor."""
        topic_rules.ensure_valid_topic_name(spec.name)
        topic_rules.ensure_valid_partition_count(spec.partitions)
        topic_rules.ensure_within_topic_limit(
            spec.name, spec.partitions, self.settings.max_partitions_per_topic
        )
        configs = canonical_configs(spec.configs)
        ensure_no_collision(state, spec.name)
        factor = topic_rules.resolve_replication_factor(
            spec.replication_factor, len(racks), default=self.settings.default_replication_factor
        )
        topic_rules.ensure_within_cluster_limit(
            spec.name, spec.partitions, state.partition_count(), self.settings.max_partitions_per_cluster
        )
        topic_rules.ensure_record_fits(spec.name, spec.partitions, factor, racks, configs)
        return configs, factor

    async def _wait_online(self, name: str, partitions: Iterable[int]) -> TopicView:
        """Kick a pass and wait until none of ``partitions`` is PENDING; the topic as it is then."""
        wanted = list(partitions)
        self.kick()

        def settled(state: MetadataState) -> bool:
            topic = state.live_topic(name)
            return topic is None or all(
                state.partition_view(topic, p).status is not PartitionStatus.PENDING for p in wanted
            )

        await self._await_own_writes()
        await self.cache.wait_for(settled, self.settings.admin_wait_s)
        view = self.cache.state.topic_view(name)
        if view is None:
            raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' was deleted meanwhile")
        return view

    # -- admin: delete -------------------------------------------------------------------------------

    async def delete_topic(self, name: str) -> None:
        """Mark ``name`` for deletion; return once its data is gone from every live replica and its
        keys are removed (or after ``admin_wait_s``, the deletion continuing in the background)."""
        self.ensure_current()
        await self._await_own_writes()

        async def mark(topic: TopicRecord) -> TopicRecord | None:
            return None if topic.deleting else dataclasses.replace(topic, deleting=True)

        await self._update_topic(name, mark, allow_deleting=True)
        log.info("topic %s marked for deletion", name)
        self.kick()
        await self.cache.wait_for(lambda state: name not in state.topics, self.settings.admin_wait_s)

    async def _update_topic(
        self,
        name: str,
        change: Callable[[TopicRecord], Awaitable[TopicRecord | None]],
        *,
        allow_deleting: bool = False,
    ) -> TopicRecord:
        """Compare-and-swap the topic key with ``change(current)`` (None: leave it); retried on races."""
        key = keys.topic_key(name)
        for _ in range(_CAS_ATTEMPTS):
            topic = self.cache.state.topics.get(name)
            if topic is None or (topic.deleting and not allow_deleting):
                raise errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist")
            updated = await change(topic)
            if updated is None:
                return topic
            value = await asyncio.to_thread(keys.encode_topic, updated)  # ~4 ms at 10,000 partitions
            result = await self._write([Op.put(key, value)], [Compare.mod_revision(key, topic.mod_revision)])
            if result.succeeded:
                await self._await_own_writes()
                return updated
            await self.cache.wait_for_revision(result.revision, self.settings.admin_wait_s)
        raise errors.CoordinatorNotAvailableError(f"topic '{name}' kept changing; try again")

    # -- admin: partitions and configs ---------------------------------------------------------------

    async def create_partitions(self, name: str, total: int, *, validate_only: bool = False) -> TopicView:
        """Grow ``name`` to ``total`` partitions, placed like Kafka's add-partitions (limits
        checked first, placement in a worker thread, as for :meth:`create_topic`)."""
        self.ensure_current()
        planned: list[TopicRecord] = []
        current_counts: list[int] = []

        async def grow(topic: TopicRecord) -> TopicRecord | None:
            current_counts.append(topic.partition_count)
            state = self.cache.state
            racks = state.live_racks()
            self._check_growth(state, topic, total, racks)
            grown = await asyncio.to_thread(_grow_topic, topic, total, racks, self._rng)
            planned.append(grown)
            return None if validate_only else grown

        async with self._growth_lock:
            await self._await_own_writes()
            await self._update_topic(name, grow)
        if validate_only:
            # The thread only reads the live state by key (atomic dict lookups), never iterates it.
            return await asyncio.to_thread(_pending_view, planned[-1], stored=self.cache.state)
        log.info("topic %s grown from %d to %d partitions", name, current_counts[-1], total)
        return await self._wait_online(name, range(current_counts[-1], total))

    def _check_growth(
        self, state: MetadataState, topic: TopicRecord, total: int, racks: Mapping[int, str]
    ) -> None:
        """Every rule growing ``topic`` to ``total`` partitions must meet, before any placement."""
        topic_rules.ensure_valid_new_partition_count(topic.name, topic.partition_count, total)
        topic_rules.ensure_within_topic_limit(topic.name, total, self.settings.max_partitions_per_topic)
        topic_rules.resolve_replication_factor(topic.replication_factor, len(racks))
        topic_rules.ensure_within_cluster_limit(
            topic.name,
            total - topic.partition_count,
            state.partition_count(),
            self.settings.max_partitions_per_cluster,
        )

    async def alter_topic_configs(
        self,
        name: str,
        set_configs: Mapping[str, str],
        delete: Sequence[str],
        *,
        validate_only: bool = False,
    ) -> TopicRecord:
        """Set and reset topic configs (validated as a whole); storage nodes get them next pass."""
        self.ensure_current()
        await self._await_own_writes()
        both = set(set_configs) & set(delete)
        if both:
            raise errors.InvalidRequestError(f"configs both set and deleted: {', '.join(sorted(both))}")
        for config_name in delete:
            if config_name not in TOPIC_CONFIGS:
                raise errors.InvalidConfigError(f"Unknown topic config name: {config_name}")
        planned: list[TopicRecord] = []

        async def alter(topic: TopicRecord) -> TopicRecord | None:
            merged = {k: v for k, v in topic.configs.items() if k not in delete}
            merged.update(set_configs)
            altered = dataclasses.replace(topic, configs=canonical_configs(merged))
            planned.append(altered)
            return None if validate_only or altered.configs == topic.configs else altered

        await self._update_topic(name, alter)
        if not validate_only:
            self._configs_to_push.add(name)
            self.kick()
        return planned[-1]

    # -- reconciliation ----------------------------------------------------------------------------

    async def reconcile_routine(self) -> None:
        """Run passes until deposed: after every metadata change, and every reconcile interval."""
        while not self.deposed.is_set():
            self._wake.clear()
            try:
                await self._do_pass()
            except errors.NotControllerError:
                return
            except (errors.CoordinatorNotAvailableError, EtcdError) as exc:
                log.warning("reconcile pass interrupted, retrying: %s", exc)
            except Exception:
                log.exception("reconcile pass failed, retrying")
            await self._sleep_until_kicked(self.settings.reconcile_interval_s)

    async def _sleep_until_kicked(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass

    async def _do_pass(self) -> None:
        await self._await_own_writes()
        state = self.cache.state
        revision = state.metadata_revision
        shutting_down = self._nodes_shutting_down()
        topics = self._topics_to_plan(state)
        transitions = plan_partitions(state, self._lost, shutting_down, topics=topics)
        await self._apply_transitions(transitions)
        due = await self._push_roles(topics)
        # Topics with work this pass are planned again next pass (a failed call is retried, a
        # written state gets its roles pushed); the rest wait for a change.
        self._unfinished_topics = {t.topic for t in transitions} | due
        self._planned_revision = revision
        await self.reassignments.advance()
        await self._finish_deletions(deleting_topics(self.cache.state))
        await self._push_altered_configs()
        self._start_node_syncs()
        await self._maybe_balance_leaders()

    async def _maybe_balance_leaders(self) -> None:
        """auto.leader.rebalance.enable: every check interval, move leadership back to the
        preferred replicas of each node whose share of them led by others is above
        leader.imbalance.per.broker.percentage (Kafka's checkAndTriggerAutoLeaderRebalance)."""
        settings = self.settings
        if not settings.auto_leader_rebalance_enable or time.monotonic() < self._next_balance_check:
            return
        self._next_balance_check = time.monotonic() + settings.leader_imbalance_check_interval_s
        due = imbalanced_partitions(
            self.cache.state, settings.leader_imbalance_per_broker_percentage, self._nodes_shutting_down()
        )
        if due:
            log.info(
                "leader imbalance above %d%%: electing preferred leaders of %d partitions",
                settings.leader_imbalance_per_broker_percentage,
                len(due),
            )
            await self.elect_preferred_leaders((), due)

    def _topics_to_plan(self, state: MetadataState) -> set[str] | None:
        """The topics this pass plans: None (every topic) for the first pass of the term, after
        a snapshot, a change of the live storage nodes or of the nodes in controlled shutdown,
        and every :data:`FULL_PASS_INTERVAL_S`; otherwise only the topics changed since the
        last pass, those it left work in, and those marked since (a replica lost its log).

        What a partition needs depends only on its topic, its stored state, the live nodes,
        the nodes shutting down and its lost replicas, so a topic none of those changed for
        needs nothing new: a pass costs in proportion to what changed, not to the cluster."""
        now = asyncio.get_running_loop().time()
        full = (
            self._full_pass_due
            or not state.delta_possible_since(self._planned_revision)
            or now - self._last_full_pass >= FULL_PASS_INTERVAL_S
        )
        dirty, self._dirty_topics = self._dirty_topics, set()
        if full:
            self._full_pass_due = False
            self._last_full_pass = now
            return None
        return set(state.topics_changed_since(self._planned_revision)) | self._unfinished_topics | dirty

    async def _limited(self, call: Awaitable[None], slots: asyncio.Semaphore | None = None) -> bool:
        """Run one storage-node call within the parallelism limit; True if it succeeded."""
        async with slots or self._rpc_slots:
            try:
                await call
                return True
            except errors.TributaryError as exc:
                log.warning("storage node call failed (will retry): %s", exc)
                return False

    def _broker(self, node_id: int) -> RegisteredBroker | None:
        return self.cache.state.brokers.get(node_id)

    def _create_on(
        self, node_id: int, topic: TopicRecord, partition: int, leader_epoch: int, *, must_exist: bool = False
    ) -> Awaitable[None]:
        broker = self._broker(node_id)
        if broker is None:
            return _failed(errors.BrokerNotAvailableError(f"node {node_id} is not live"))
        return self.storage.create_partition(
            broker,
            topic.name,
            partition,
            configs=topic.configs,
            leader_epoch=leader_epoch,
            replicas=topic.assignment[partition],
            controller_epoch=self.epoch,
            must_exist=must_exist,
        )

    def _mark_lost(self, node_id: int, topic: str, partition: int, error: errors.TributaryError) -> None:
        lost = self._lost.setdefault((topic, partition), set())
        if node_id not in lost:
            lost.add(node_id)
            self._dirty_topics.add(topic)
            log.error(
                "node %d lost the log of %s-%d (%s): it may no longer lead it or count as in sync",
                node_id,
                topic,
                partition,
                error,
            )
            self.kick()

    # -- partition transitions -------------------------------------------------------------------

    async def _apply_transitions(self, transitions: list[Transition]) -> None:
        """Push to the nodes that must hold each partition first, then write the new states."""
        if not transitions:
            return
        ready = await self.push_transitions(transitions)
        for start in range(0, len(ready), WRITE_BATCH):
            await self._write_states(ready[start : start + WRITE_BATCH])

    async def push_transitions(self, transitions: Sequence[Transition]) -> list[Transition]:
        """Ask the nodes of each transition to hold its partition (a new leader: to confirm it
        still does), in one CreatePartitionBatch per node and :data:`CREATE_BATCH` partitions;
        the transitions to write (in order), without those whose required node did not."""
        state = self.cache.state
        wanted: dict[int, list[PartitionCreation]] = {}
        for t in transitions:
            topic = state.topics.get(t.topic)
            if topic is None:
                continue
            for node in t.push_to:
                wanted.setdefault(node, []).append(
                    PartitionCreation(
                        topic.name,
                        t.partition,
                        topic.configs,
                        t.record.leader_epoch,
                        tuple(topic.assignment[t.partition]),
                        t.must_exist,
                    )
                )
        confirmed: set[tuple[int, str, int]] = set()
        await asyncio.gather(
            *(
                self._confirm_batch(node, creations[start : start + CREATE_BATCH], confirmed)
                for node, creations in wanted.items()
                for start in range(0, len(creations), CREATE_BATCH)
            )
        )
        pushed = (
            self._pushed(t, {n for n in t.push_to if (n, t.topic, t.partition) in confirmed})
            for t in transitions
            if t.topic in state.topics
        )
        return [t for t in pushed if t is not None]

    async def _confirm_batch(
        self, node_id: int, creations: list[PartitionCreation], confirmed: set[tuple[int, str, int]]
    ) -> None:
        """One CreatePartitionBatch: adds to ``confirmed`` the (node, topic, partition) it holds."""
        broker = self._broker(node_id)
        if broker is None:
            return
        async with self._rpc_slots:
            try:
                outcomes = await self.storage.create_partitions(
                    broker, creations, controller_epoch=self.epoch
                )
            except errors.TributaryError as exc:
                log.warning("storage node call failed (will retry): %s", exc)
                return
        failed: list[errors.TributaryError] = []
        for creation, error in zip(creations, outcomes, strict=True):
            if error is None:
                confirmed.add((node_id, creation.topic, creation.partition))
            elif isinstance(error, errors.ReplicaNotAvailableError):
                self._mark_lost(node_id, creation.topic, creation.partition, error)
            else:
                failed.append(error)
        if failed:
            log.warning(
                "node %d did not create %d of %d partitions (will retry): %s",
                node_id,
                len(failed),
                len(creations),
                failed[0],
            )

    def _pushed(self, transition: Transition, confirmed: set[int]) -> Transition | None:
        """The transition to write once pushed to ``confirmed`` nodes, or None when its required
        node was not among them. A new partition's ISR is the replicas that created it."""
        if transition.required is not None and transition.required not in confirmed:
            return None
        if transition.unclean:
            self.unclean_elections += 1
            self._on_unclean_election()
            stored = self.cache.state.partition_record(transition.topic, transition.partition)
            log.warning(
                "unclean leader election for %s-%d: node %d was not in sync (ISR %s) and now leads; "
                "records it never copied are lost",
                transition.topic,
                transition.partition,
                transition.record.leader,
                list(stored.isr) if stored else [],
            )
        if transition.expected_mod_revision == 0:
            isr = tuple(r for r in transition.record.isr if r in confirmed)
            return dataclasses.replace(transition, record=dataclasses.replace(transition.record, isr=isr))
        return transition

    # -- replica roles ------------------------------------------------------------------------------

    async def _push_roles(self, topics: set[str] | None = None) -> set[str]:
        """Tell every live node the partition states (of ``topics``; None: all) it has not
        acknowledged yet; the topics that had any."""
        state = self.cache.state
        due = self._roles.due(state, topics)
        calls = []
        for node_id, states in due.items():
            broker = state.brokers.get(node_id)
            if broker is None:
                continue
            for start in range(0, len(states), ROLES_BATCH):
                calls.append(self._limited(self._push_roles_to(broker, states[start : start + ROLES_BATCH])))
        await asyncio.gather(*calls)
        return {s.topic for states in due.values() for s in states}

    async def _push_roles_to(self, broker: RegisteredBroker, states: list[LeaderAndIsr]) -> None:
        state = self.cache.state
        leaders = {s.leader for s in states if s.leader >= 0}
        endpoints = [state.brokers[n] for n in leaders if n in state.brokers]
        configs = {s.topic: dict(state.topics[s.topic].configs) for s in states if s.topic in state.topics}
        outcomes = await self.storage.update_leader_and_isr(
            broker, controller_epoch=self.epoch, states=states, leaders=endpoints, topic_configs=configs
        )
        applied = {}
        for s in states:
            error = outcomes.get(s.key, errors.UnknownServerError("no answer"))
            if error is None:
                applied[s.key] = s
            elif isinstance(error, errors.ReplicaNotAvailableError):
                self._mark_lost(broker.node_id, s.topic, s.partition, error)
            elif isinstance(error, errors.FencedLeaderEpochError):
                applied[s.key] = s  # the node already holds a newer state
            else:
                log.info(
                    "node %d did not take the state of %s-%d: %s", broker.node_id, s.topic, s.partition, error
                )
        self._roles.acknowledged(broker.node_id, broker.incarnation, applied)

    # -- controlled shutdown ----------------------------------------------------------------------

    def _nodes_shutting_down(self) -> frozenset[int]:
        """Live nodes in controlled shutdown (entries of registrations that are gone are dropped)."""
        brokers = self.cache.state.brokers
        for node_id, incarnation in list(self._shutting_down.items()):
            broker = brokers.get(node_id)
            if broker is None or broker.incarnation != incarnation:
                del self._shutting_down[node_id]
        return frozenset(self._shutting_down)

    async def controlled_shutdown(
        self, node_id: int, broker_epoch: int, wait_s: float
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """Move leadership and ISR membership off a stopping node (Kafka's ControlledShutdown).

        Answers ``(remaining, kept)`` (:func:`coordinator.partition_state.shutdown_progress`) once
        nothing is left to move or after ``wait_s``. A request naming a registration that is not
        the node's current one (a delayed request of an earlier run) is refused with
        STALE_BROKER_EPOCH, an unregistered node with BROKER_NOT_AVAILABLE: nothing changes.
        The moves are the reconcile pass's own fenced writes, so a deposed controller makes none.
        """
        self.ensure_current()
        broker = self.cache.state.brokers.get(node_id)
        if broker is None:
            raise errors.BrokerNotAvailableError(f"node {node_id} is not registered")
        if broker.incarnation != broker_epoch:
            raise errors.StaleBrokerEpochError(
                f"node {node_id}: broker epoch {broker_epoch} is not the current registration "
                f"{broker.incarnation}"
            )
        if self._shutting_down.get(node_id) != broker_epoch:
            self._shutting_down[node_id] = broker_epoch
            self._full_pass_due = True  # every partition it leads or follows may move
            log.info("node %d asked for a controlled shutdown (broker epoch %d)", node_id, broker_epoch)
        self.kick()

        def settled(state: MetadataState) -> bool:
            return not shutdown_progress(state, node_id, self._nodes_shutting_down())[0]

        await self.cache.wait_for(settled, wait_s)
        self.ensure_current()
        remaining, kept = shutdown_progress(self.cache.state, node_id, self._nodes_shutting_down())
        log.info(
            "controlled shutdown of node %d: %d partitions left to move, %d kept (no other in-sync replica)",
            node_id,
            len(remaining),
            len(kept),
        )
        return remaining, kept

    # -- preferred leader election ------------------------------------------------------------------

    async def elect_preferred_leaders(
        self, topics: Sequence[str], partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        """Move leadership back to each named partition's first replica where it is live and in
        sync (Kafka's preferred replica election); both empty: every partition. Per partition:
        None once moved, else why not. The new leader confirms it holds the log first; the
        write is fenced and compare-and-swapped like any election, and the replicas learn their
        roles in the next pass."""
        self.ensure_current()
        await self._await_own_writes()
        state = self.cache.state
        results: dict[tuple[str, int], errors.TributaryError | None] = {}
        planned: list[Transition] = []
        live, shutting_down = set(state.brokers), self._nodes_shutting_down()
        for key in election_targets(state, topics, partitions):
            topic = state.live_topic(key[0])
            if topic is None or not 0 <= key[1] < topic.partition_count:
                results[key] = errors.UnknownTopicOrPartitionError(f"{key[0]}-{key[1]} does not exist")
                continue
            plan = plan_preferred_leader(
                topic, key[1], state.partition_record(*key), live, self._lost.get(key, ()), shutting_down
            )
            if isinstance(plan, errors.TributaryError):
                results[key] = plan
            else:
                planned.append(plan)
        confirmed = await self.push_transitions(planned)
        for t in planned:
            if t not in confirmed:
                results[(t.topic, t.partition)] = errors.PreferredLeaderNotAvailableError(
                    f"{t.topic}-{t.partition}: node {t.record.leader} did not confirm it holds the log"
                )
        for start in range(0, len(confirmed), WRITE_BATCH):
            results.update(await self._write_elections(confirmed[start : start + WRITE_BATCH]))
        elected = [f"{t}-{p}" for (t, p), error in results.items() if error is None]
        if elected:
            log.info(
                "preferred leader election: %d partitions led by their first replica again: %s",
                len(elected),
                elected,
            )
        await self._await_own_writes()
        self.kick()  # the next pass tells the replicas their roles
        return results

    async def _write_elections(
        self, batch: list[Transition]
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        """Write elected states in one compare-and-swap; a lost race is retriable."""
        result = await self._write(
            [
                Op.put(keys.partition_key(t.topic, t.partition), keys.encode_partition(t.record))
                for t in batch
            ],
            [
                Compare.mod_revision(keys.partition_key(t.topic, t.partition), t.expected_mod_revision)
                for t in batch
            ],
        )
        race = errors.CoordinatorNotAvailableError("the partition's state changed meanwhile; try again")
        return {(t.topic, t.partition): None if result.succeeded else race for t in batch}

    # -- ISR changes (AlterPartition) ---------------------------------------------------------------

    async def alter_partition(
        self, node_id: int, changes: Sequence[IsrChange]
    ) -> list[LeaderAndIsr | errors.TributaryError]:
        """Apply a leader's ISR changes: per change the committed state, or the error."""
        self.ensure_current()
        await self._await_own_writes()
        results: list[LeaderAndIsr | errors.TributaryError] = []
        for change in changes:
            try:
                results.append(await self._alter_one(node_id, change))
            except errors.NotControllerError:
                raise
            except errors.TributaryError as exc:
                results.append(exc)
        return results

    async def _alter_one(self, node_id: int, change: IsrChange) -> LeaderAndIsr:
        state = self.cache.state
        lost = self._lost.get((change.topic, change.partition), ())
        current, proposed = validated_isr_change(state, node_id, change, lost, self._nodes_shutting_down())
        topic = state.topics[change.topic]
        if proposed.isr == current.isr:
            return leader_and_isr(topic, change.partition, current)
        key = keys.partition_key(change.topic, change.partition)
        result = await self._write(
            [Op.put(key, keys.encode_partition(proposed))], [Compare.mod_revision(key, current.mod_revision)]
        )
        if not result.succeeded:
            raise errors.InvalidUpdateVersionError(
                f"{change.topic}-{change.partition}: the state changed while the ISR change was written"
            )
        log.info(
            "partition %s-%d: ISR %s -> %s (asked by leader %d, epoch %d)",
            change.topic,
            change.partition,
            list(current.isr),
            list(proposed.isr),
            node_id,
            current.leader_epoch,
        )
        committed = dataclasses.replace(proposed, mod_revision=result.revision)
        return leader_and_isr(topic, change.partition, committed)

    async def _write_states(self, batch: list[Transition]) -> None:
        ops = [
            Op.put(keys.partition_key(t.topic, t.partition), keys.encode_partition(t.record)) for t in batch
        ]
        compares = [
            Compare.mod_revision(keys.partition_key(t.topic, t.partition), t.expected_mod_revision)
            for t in batch
        ]
        result = await self._write(ops, compares)
        if not result.succeeded:
            log.info("partition states changed during the pass; recomputing")
            self._dirty_topics.update(t.topic for t in batch)
            self.kick()
            return
        created = sum(1 for t in batch if t.expected_mod_revision == 0)
        if created:
            log.info("%d new partitions online", created)
        for t in batch:
            # New partitions are summarised above; leadership changes are worth a line each.
            level = logging.DEBUG if t.expected_mod_revision == 0 else logging.INFO
            log.log(
                level,
                "partition %s-%d: %s, leader %d, leader epoch %d",
                t.topic,
                t.partition,
                t.record.status.value,
                t.record.leader,
                t.record.leader_epoch,
            )

    # -- topic deletion ---------------------------------------------------------------------------

    async def _finish_deletions(self, topics: list[TopicRecord]) -> None:
        """Delete the data of topics marked for deletion on every live replica (each stopped by
        a role push saying so first: nodes refuse to delete a replica they still serve), then
        their keys."""
        for topic in topics:
            if any(node in self._syncs for replicas in topic.assignment for node in replicas):
                continue  # a node sync could re-create what we delete; retried once it is done
            brokers = self.cache.state.brokers
            if any(
                node in brokers
                for record in self.cache.state.partitions.get(topic.name, {}).values()
                for node in record.retired
            ):
                continue  # copies a reassignment left on live nodes are deleted first
            calls = [
                self._limited(
                    self.storage.delete_partition(broker, topic.name, partition, controller_epoch=self.epoch)
                )
                for partition, replicas in enumerate(topic.assignment)
                for broker in map(self._broker, replicas)
                if broker is not None  # offline replicas drop theirs when they return (node sync)
            ]
            if not all(await asyncio.gather(*calls)):
                continue
            key = keys.topic_key(topic.name)
            result = await self._write(
                [Op.delete(key), Op.delete_prefix(keys.partitions_prefix(topic.name))],
                [Compare.mod_revision(key, topic.mod_revision)],
            )
            if result.succeeded:
                log.info("topic %s deleted", topic.name)

    # -- configs ------------------------------------------------------------------------------------

    async def _push_altered_configs(self) -> None:
        """Re-send CreatePartition (idempotent) with the topic's new configs to its live replicas
        that hold its log (a replica without one gets the configs when its role makes it create it)."""
        for name in list(self._configs_to_push):
            topic = self.cache.state.live_topic(name)
            calls = (
                []
                if topic is None
                else [
                    self._limited(self._configure(node, topic, partition))
                    for partition, replicas in enumerate(topic.assignment)
                    for node in replicas
                    if self._broker(node) is not None
                ]
            )
            if all(await asyncio.gather(*calls)):
                self._configs_to_push.discard(name)

    async def _configure(self, node_id: int, topic: TopicRecord, partition: int) -> None:
        try:
            await self._create_on(
                node_id, topic, partition, self._leader_epoch(topic, partition), must_exist=True
            )
        except errors.ReplicaNotAvailableError:
            pass  # no log there: nothing to configure

    def _leader_epoch(self, topic: TopicRecord, partition: int) -> int:
        record = self.cache.state.partition_record(topic.name, partition)
        return record.leader_epoch if record is not None else 0

    # -- nodes that (re)joined ---------------------------------------------------------------------

    def _start_node_syncs(self) -> None:
        """Start a background sync of every node this term has not synced since it registered.

        Syncs run beside the passes, not in them: a node that rejoins with an empty disk may need
        thousands of partitions re-created, and that must not delay elections or new topics.
        """
        for broker in self.cache.state.brokers.values():
            running = self._syncs.get(broker.node_id)
            if self._synced_incarnations.get(broker.node_id) == broker.incarnation or running is not None:
                continue
            task = asyncio.create_task(self._sync_node(broker), name=f"controller-sync-node-{broker.node_id}")
            self._syncs[broker.node_id] = task
            task.add_done_callback(functools.partial(self._sync_done_callback, broker.node_id))

    def _sync_done_callback(self, node_id: int, _task: asyncio.Task) -> None:
        self._sync_done(node_id)

    def _sync_done(self, node_id: int) -> None:
        self._syncs.pop(node_id, None)
        self.kick()  # deletions wait for syncs; failed syncs are retried by the next pass

    def _cancel_node_syncs(self) -> None:
        for task in self._syncs.values():
            task.cancel()

    async def _sync_node(self, broker: RegisteredBroker) -> None:
        """Give ``broker`` everything assigned to it, and drop what it holds but should not
        (partitions of topics deleted while it was away)."""
        try:
            local = await self.storage.local_partitions(broker)
        except errors.TributaryError as exc:
            log.warning("cannot list the partitions of node %d (will retry): %s", broker.node_id, exc)
            return
        plan = plan_node_sync(self.cache.state, broker.node_id, local)  # state read after the listing
        slots = self._sync_slots
        calls = [
            self._limited(self.storage.delete_partition(broker, t, p, controller_epoch=self.epoch), slots)
            for t, p in plan.delete
        ]
        calls += [
            self._limited(self._maybe_create_assigned(broker.node_id, t, p), slots) for t, p in plan.create
        ]
        if all(await asyncio.gather(*calls)):
            self._synced_incarnations[broker.node_id] = broker.incarnation
            log.info(
                "node %d synced: %d partitions confirmed, orphans removed: %s",
                broker.node_id,
                len(plan.create),
                list(plan.delete) or "none",
            )

    async def _maybe_create_assigned(self, node_id: int, topic_name: str, partition: int) -> None:
        """Create one partition on a node, unless its topic was deleted since the sync began, or
        the partition already has a state: then the node's role says whether it may create its
        log (a follower out of the ISR) or must already hold it (in the ISR), so a node back with
        an empty disk never gets an empty log under the old offsets."""
        topic = self.cache.state.live_topic(topic_name)
        if topic is None or partition >= topic.partition_count:
            return
        if self.cache.state.partition_record(topic_name, partition) is not None:
            return
        await self._create_on(node_id, topic, partition, 0)


async def _failed(error: Exception) -> None:
    raise error


# -- placement work, run in worker threads (pure: arguments in, a new value out) -----------------


def _place_topic(
    spec: TopicSpec,
    configs: Mapping[str, str],
    factor: int,
    racks: Mapping[int, str],
    existing: Sequence[TopicRecord],
    rng: random.Random,
) -> TopicRecord:
    """The new topic's record: replicas placed from the least-loaded node on."""
    start = least_loaded_start(racks, leader_counts(existing), rng)
    assignment = assign_replicas(racks, spec.partitions, factor, start_index=start, rng=rng)
    return TopicRecord(
        spec.name, uuid.uuid4().hex, factor, dict(configs), tuple(tuple(r) for r in assignment)
    )


def _grow_topic(topic: TopicRecord, total: int, racks: Mapping[int, str], rng: random.Random) -> TopicRecord:
    """``topic`` with partitions up to ``total`` placed (Kafka's add-partitions), unless its
    record would not fit in etcd (checked first: the node ids it names may be gone from ``racks``)."""
    node_ids = {node for replicas in topic.assignment for node in replicas} | set(racks)
    topic_rules.ensure_record_fits(topic.name, total, topic.replication_factor, node_ids, topic.configs)
    added = assign_added_partitions(racks, topic.assignment, total, rng=rng)
    return dataclasses.replace(topic, assignment=topic.assignment + tuple(tuple(r) for r in added))


def canonical_configs(configs: Mapping[str, str]) -> dict[str, str]:
    """Validated topic configs in their canonical string form (InvalidConfigError if not valid)."""
    typed = validate_topic_configs(dict(configs))
    topic_rules.ensure_supported_configs(typed)
    return {name: format_topic_config(name, value) for name, value in sorted(typed.items())}


def ensure_no_collision(state: MetadataState, name: str) -> None:
    """TopicAlreadyExists for an existing name; InvalidTopic for one that differs only by '.'
    versus '_' (Kafka forbids those: they collide in metric names)."""
    existing = state.topics.get(name)
    if existing is not None:
        suffix = " and is marked for deletion" if existing.deleting else ""
        raise errors.TopicAlreadyExistsError(f"Topic '{name}' already exists{suffix}.")
    normalized = name.replace(".", "_")
    for other in state.topics:
        if other.replace(".", "_") == normalized:
            raise errors.InvalidTopicError(
                f"Topic '{name}' collides with existing topic: {other} "
                "(a '.' and a '_' are the same in metric names)"
            )


def _pending_view(record: TopicRecord, *, stored: MetadataState | None = None) -> TopicView:
    """How a planned (validate-only) topic would look: partitions already stored as they are,
    the planned ones PENDING."""
    existing = stored.live_topic(record.name) if stored is not None else None
    count = existing.partition_count if existing is not None else 0
    partitions = (
        [stored.partition_view(existing, p) for p in range(count)]
        if stored is not None and existing is not None
        else []
    )
    partitions += [
        PartitionView(record.name, p, tuple(record.assignment[p]), NO_LEADER, 0, (), PartitionStatus.PENDING)
        for p in range(count, record.partition_count)
    ]
    return TopicView(
        record.name, record.topic_id, record.replication_factor, dict(record.configs), tuple(partitions)
    )
