"""The active controller's side of partition reassignment: the admin calls, and the steps each
reconcile pass takes (:mod:`coordinator.reassignment` holds the decisions; this module does the
etcd writes and storage-node calls, through the controller's fenced writes).

Every step is level-triggered from the partition records, so a controller elected in the middle
of a reassignment finishes it: it finds ``adding``/``removing`` (waiting for the new replicas to
join the ISR, then finishing) or ``retired`` (deleting the old copies) and carries on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from coordinator import keys
from coordinator.model import PartitionRecord, TopicRecord
from coordinator.partition_state import Transition
from coordinator.reassignment import (
    ReassignmentRequest,
    cancel_reassignment,
    plan_completion,
    reassigning,
    retiring,
    start_reassignment,
    validate_target,
    with_assignment,
)
from coordinator.replica_roles import leader_and_isr
from services import errors
from services.etcd.txn import Compare, Op

if TYPE_CHECKING:
    from coordinator.controller import Controller

log = logging.getLogger(__name__)

#: min.insync.replicas of a topic that does not set it (the broker default, as Kafka's).
DEFAULT_MIN_INSYNC_REPLICAS = 1

Outcomes = dict[tuple[str, int], errors.TributaryError | None]


class Reassigner:
    """Partition reassignments of one controller term. See the module docstring."""

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    # -- admin ------------------------------------------------------------------------------------

    async def alter(
        self,
        requests: Sequence[ReassignmentRequest],
        throttle_bytes_per_s: int,
        *,
        validate_only: bool = False,
    ) -> Outcomes:
        """Start (or, with an empty replica list, cancel) reassignments; per partition None once
        written, else why not. Nothing is written for a refused partition."""
        controller = self._controller
        controller.ensure_current()
        if throttle_bytes_per_s < 0:
            raise errors.InvalidRequestError(
                f"throttle {throttle_bytes_per_s} bytes/s must be >= 0 (0: none)"
            )
        await controller._await_own_writes()
        state = controller.cache.state
        live = set(state.brokers)
        stopping = controller._nodes_shutting_down()
        outcomes: Outcomes = {}
        planned: dict[str, list[Transition]] = defaultdict(list)
        for request in requests:
            key = (request.topic, request.partition)
            if key in outcomes or any(t.partition == request.partition for t in planned[request.topic]):
                outcomes[key] = errors.InvalidRequestError(f"{request.topic}-{request.partition} named twice")
                continue
            topic = state.live_topic(request.topic)
            record = state.partition_record(*key) if topic is not None else None
            try:
                if not request.replicas:
                    if topic is None or record is None:
                        raise errors.UnknownTopicOrPartitionError(
                            f"{request.topic}-{request.partition} does not exist"
                        )
                    transition = cancel_reassignment(topic, request.partition, record, live, stopping)
                else:
                    validate_target(
                        topic, request.partition, record, request.replicas, live, DEFAULT_MIN_INSYNC_REPLICAS
                    )
                    assert topic is not None and record is not None
                    started = start_reassignment(record, request.replicas, throttle_bytes_per_s)
                    transition = Transition(topic.name, request.partition, record.mod_revision, started)
            except errors.TributaryError as exc:
                outcomes[key] = exc
                continue
            planned[request.topic].append(transition)
        if validate_only:
            for transitions in planned.values():
                outcomes.update({(t.topic, t.partition): None for t in transitions})
            return outcomes
        for name, transitions in planned.items():
            outcomes.update(await self._write_topic(name, transitions, "reassignment"))
        await controller._await_own_writes()
        controller.kick()
        return outcomes

    def in_progress(self, topics: Sequence[str] = ()) -> list[tuple[str, int, PartitionRecord]]:
        """Partitions being reassigned (of ``topics``, or all)."""
        wanted = set(topics)
        partitions = self._controller.cache.state.partitions
        return [entry for entry in reassigning(partitions) if not wanted or entry[0] in wanted]

    # -- reconcile pass ---------------------------------------------------------------------------

    async def advance(self) -> None:
        """Finish the reassignments whose new replicas are in sync; delete retired copies."""
        controller = self._controller
        state = controller.cache.state
        live, stopping = set(state.brokers), controller._nodes_shutting_down()
        due: dict[str, list[Transition]] = defaultdict(list)
        for name, partition, record in reassigning(state.partitions):
            topic = state.live_topic(name)
            if topic is None:
                continue
            transition = plan_completion(topic, partition, record, live, stopping)
            if transition is not None:
                due[name].append(transition)
        for name, transitions in due.items():
            ready = await controller.push_transitions(transitions)
            if ready:
                await self._write_topic(name, ready, "completion")
        await self._retire()

    async def _retire(self) -> None:
        """Stop and delete the copies left on nodes a finished reassignment took a partition
        off, all partitions at once (within the controller's RPC limit). A node that is not
        registered keeps its entry until it is back (then this deletes its copy; the node sync
        leaves it alone); a topic being deleted waits only for registered ones."""
        controller = self._controller
        state = controller.cache.state
        work = []
        for name, partition, record in retiring(state.partitions):
            topic = state.topics.get(name)
            if topic is None:
                continue
            live = [n for n in record.retired if n in state.brokers and n not in record.replicas]
            if live:
                work.append((topic, partition, record, live))
        if not work:
            return

        async def drop_all(topic: TopicRecord, partition: int, record: PartitionRecord, live: list[int]):
            calls = [controller._limited(self._drop_copy(n, topic, partition, record)) for n in live]
            done = await asyncio.gather(*calls)
            return [n for n, ok in zip(live, done) if ok]

        dropped = await asyncio.gather(*(drop_all(*item) for item in work))
        for (topic, partition, record, _), gone in zip(work, dropped):
            if not gone:
                continue
            key = keys.partition_key(topic.name, partition)
            kept = tuple(n for n in record.retired if n not in gone)
            cleared = dataclasses.replace(record, retired=kept)
            result = await controller._write(
                [Op.put(key, keys.encode_partition(cleared))],
                [Compare.mod_revision(key, record.mod_revision)],
            )
            if result.succeeded:
                log.info(
                    "%s-%d: copies on retired nodes %s deleted%s",
                    topic.name,
                    partition,
                    gone,
                    f" ({list(kept)} when they are back)" if kept else "",
                )

    async def _drop_copy(
        self, node_id: int, topic: TopicRecord, partition: int, record: PartitionRecord
    ) -> None:
        controller = self._controller
        broker = controller.cache.state.brokers[node_id]
        # A state that no longer names the node stops its replica (fetching, serving); the node
        # refuses to delete a replica it still serves.
        await controller.storage.update_leader_and_isr(
            broker,
            controller_epoch=controller.epoch,
            states=[leader_and_isr(topic, partition, record)],
            leaders=[],
            topic_configs={},
        )
        await controller.storage.delete_partition(
            broker, topic.name, partition, controller_epoch=controller.epoch
        )

    async def _write_topic(self, name: str, transitions: list[Transition], what: str) -> Outcomes:
        """Write partition records of one topic with its assignment, each chunk (etcd allows
        128 operations per transaction) one compare-and-swap on its partitions and the topic."""
        controller = self._controller
        outcomes: Outcomes = {}
        topic = controller.cache.state.topics.get(name)
        for start in range(0, len(transitions), keys.WRITE_BATCH):
            chunk = transitions[start : start + keys.WRITE_BATCH]
            if topic is None:
                gone = errors.UnknownTopicOrPartitionError(f"topic {name} is gone")
                outcomes.update({(t.topic, t.partition): gone for t in chunk})
                continue
            updated = with_assignment(topic, {t.partition: t.record.replicas for t in chunk})
            ops = [
                Op.put(keys.partition_key(name, t.partition), keys.encode_partition(t.record)) for t in chunk
            ]
            ops.append(Op.put(keys.topic_key(name), keys.encode_topic(updated)))
            compares = [
                Compare.mod_revision(keys.partition_key(name, t.partition), t.expected_mod_revision)
                for t in chunk
            ]
            compares.append(Compare.mod_revision(keys.topic_key(name), topic.mod_revision))
            result = await controller._write(ops, compares)
            if not result.succeeded:
                controller.kick()
                race = errors.CoordinatorNotAvailableError(f"{name} changed meanwhile; try again")
                outcomes.update({(t.topic, t.partition): race for t in transitions[start:]})
                break
            topic = dataclasses.replace(updated, mod_revision=result.revision)
            for t in chunk:
                outcomes[(t.topic, t.partition)] = None
                log.info(
                    "partition %s-%d: %s, replicas %s (adding %s, removing %s), leader %d, ISR %s",
                    name,
                    t.partition,
                    what,
                    list(t.record.replicas),
                    list(t.record.adding),
                    list(t.record.removing),
                    t.record.leader,
                    list(t.record.isr),
                )
        return outcomes
