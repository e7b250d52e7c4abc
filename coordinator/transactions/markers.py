"""Writing transaction markers to partition leaders (Kafka's TransactionMarkerChannelManager).

:meth:`MarkerWriter.write` returns once every partition of a marker has it. Partitions go to
their leader as the controller's metadata cache names it; one queue per storage node coalesces
the markers of every transaction completing at the same time into one ``WriteTxnMarkers``
request (at most :data:`MAX_PARTITIONS_PER_REQUEST` partitions, one marker per producer), so
many small transactions cost one round trip per node, not one each.

A partition is retried until its marker is written: its leader moved (NOT_LEADER_OR_FOLLOWER),
its node is down or paused (the call fails within the RPC deadline), it has no leader (offline:
the writer waits for the metadata to change). Meanwhile the transaction stays PREPARE_* -- the
outcome is decided -- and a controller that takes over writes the markers again. A partition of
a topic that was deleted is skipped. Answers that the marker is stale for this producer
(INVALID_PRODUCER_EPOCH, PRODUCER_FENCED: a newer epoch already wrote there) count as written, as
in Kafka; a node that has seen a newer controller (TRANSACTION_COORDINATOR_FENCED,
STALE_CONTROLLER_EPOCH) ends the attempt with NOT_CONTROLLER: this term is over.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.groups.tasks import OwnedTasks
from coordinator.metadata import MetadataCache, MetadataState
from coordinator.model import PartitionStatus, RegisteredBroker
from coordinator.storage_client import StorageNodes
from coordinator.transactions.model import TxnMarker
from coordinator.transactions.offload import off_loop_if_large
from services import errors
from services.etcd.connection import Backoff
from services.log_limit import RepeatedLog
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: Partitions per WriteTxnMarkers request (as UpdateLeaderAndIsr batches partition states).
MAX_PARTITIONS_PER_REQUEST = 2_000
#: Shortest pause between two rounds of a marker whose partitions are not all written.
_MIN_RETRY_S = 0.05

#: Per-partition answers after which the partition needs no marker from this writer.
_STALE_MARKER = (errors.InvalidProducerEpochError, errors.ProducerFencedError)
#: Answers that say a newer controller exists.
_NEWER_CONTROLLER = (errors.TransactionCoordinatorFencedError, errors.StaleControllerEpochError)


# ---- routing (pure) -------------------------------------------------------------------------------


def split_deleted(
    state: MetadataState, partitions: Iterable[TopicPartition]
) -> tuple[set[TopicPartition], set[TopicPartition]]:
    """``partitions`` as (still existing, of deleted topics)."""
    live: set[TopicPartition] = set()
    gone: set[TopicPartition] = set()
    for tp in partitions:
        topic = state.live_topic(tp.topic)
        (live if topic is not None and 0 <= tp.partition < topic.partition_count else gone).add(tp)
    return live, gone


def route_by_leader(
    state: MetadataState, partitions: Iterable[TopicPartition]
) -> dict[int, list[TopicPartition]]:
    """The partitions per live leader node; a partition without one (offline, not created yet,
    its leader's node gone) is left out until the metadata changes."""
    routes: dict[int, list[TopicPartition]] = {}
    for tp in sorted(partitions):
        record = state.partition_record(tp.topic, tp.partition)
        if (
            record is None
            or record.status is not PartitionStatus.ONLINE
            or record.leader not in state.brokers
        ):
            continue
        routes.setdefault(record.leader, []).append(tp)
    return routes


def chunks(partitions: list[TopicPartition], size: int) -> list[list[TopicPartition]]:
    return [partitions[start : start + size] for start in range(0, len(partitions), size)]


# ---- one queue per node ---------------------------------------------------------------------------


@dataclass
class _Pending:
    broker: RegisteredBroker
    marker: TxnMarker
    future: asyncio.Future


def take_marker_batch(pending: list[_Pending], max_partitions: int) -> list[_Pending]:
    """Markers from the front of ``pending`` for one request: at most ``max_partitions``
    partitions (but at least one marker) and one marker per producer id; the rest stay queued."""
    batch: list[_Pending] = []
    rest: list[_Pending] = []
    size, producers = 0, set()
    for item in pending:
        fits = not batch or size + len(item.marker.partitions) <= max_partitions
        if fits and item.marker.producer_id not in producers:
            batch.append(item)
            size += len(item.marker.partitions)
            producers.add(item.marker.producer_id)
        else:
            rest.append(item)
    pending[:] = rest
    return batch


class _NodeQueue:
    """Markers waiting for one storage node; one sending task while there are any."""

    def __init__(self, storage: StorageNodes, tasks: OwnedTasks) -> None:
        self.storage = storage
        self.tasks = tasks
        self.pending: list[_Pending] = []
        self.sending = False

    async def submit(
        self, broker: RegisteredBroker, marker: TxnMarker
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append(_Pending(broker, marker, future))
        if not self.sending:
            self.sending = True
            self.tasks.spawn(self._send_routine())
        return await future

    async def _send_routine(self) -> None:
        batch: list[_Pending] = []
        try:
            while self.pending:
                batch = take_marker_batch(self.pending, MAX_PARTITIONS_PER_REQUEST)
                try:
                    # The newest registration of the node: its address may have changed.
                    answers = await self.storage.write_txn_markers(
                        batch[-1].broker, [p.marker for p in batch]
                    )
                except errors.TributaryError as exc:
                    for item in batch:
                        _settle(item.future, exc)
                    continue
                for item in batch:
                    _settle(item.future, answers.get(item.marker.producer_id, {}))
        except asyncio.CancelledError:
            ended = errors.NotControllerError("the controller term ended before the markers were written")
            for item in [*batch, *self.pending]:
                _settle(item.future, ended)
            self.pending.clear()
            raise
        finally:
            self.sending = False


def _settle(future: asyncio.Future, outcome) -> None:
    if future.done():
        return  # its writer gave up (the term ended)
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


# ---- the writer -----------------------------------------------------------------------------------


class MarkerWriter:
    """Writes markers for one controller term (see the module docstring)."""

    def __init__(
        self,
        *,
        cache: MetadataCache,
        storage: StorageNodes,
        tasks: OwnedTasks,
        retry_initial_s: float = 0.1,
        retry_max_s: float = 2.0,
    ) -> None:
        self.cache = cache
        self.storage = storage
        self.tasks = tasks
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self._queues: dict[int, _NodeQueue] = {}
        self._log = RepeatedLog(log)

    async def write(self, marker: TxnMarker) -> None:
        """Return once every partition of ``marker`` has it (see the module docstring)."""
        remaining = set(marker.partitions)
        backoff = Backoff(initial=self.retry_initial_s, maximum=self.retry_max_s)
        size = len(remaining)
        while True:
            state = self.cache.state
            remaining, gone = await off_loop_if_large(size, split_deleted, state, remaining)
            if gone:
                log.info(
                    "producer %d: no marker for %d partitions of deleted topics (%s)",
                    marker.producer_id,
                    len(gone),
                    ", ".join(f"{t}-{p}" for t, p in sorted(gone)[:5]),
                )
            if not remaining:
                return
            routes = await off_loop_if_large(size, route_by_leader, state, remaining)
            calls = [
                self._write_to(state.brokers[node_id], marker, chunk)
                for node_id, partitions in routes.items()
                for chunk in chunks(partitions, MAX_PARTITIONS_PER_REQUEST)
            ]
            for written in await asyncio.gather(*calls):
                remaining -= written
            if not remaining:
                return
            self._log.info(
                "producer %d: %d partitions still wait for their %s marker (no leader, or the leader did "
                "not take it yet); retrying",
                marker.producer_id,
                len(remaining),
                "COMMIT" if marker.commit else "ABORT",
            )
            await asyncio.sleep(_MIN_RETRY_S)
            await self.cache.wait_for_metadata_after(state.metadata_revision, backoff.next_delay())

    async def _write_to(
        self, broker: RegisteredBroker, marker: TxnMarker, partitions: list[TopicPartition]
    ) -> set[TopicPartition]:
        """The partitions of ``partitions`` that have the marker after one request to ``broker``."""
        queue = self._queues.get(broker.node_id)
        if queue is None:
            queue = self._queues[broker.node_id] = _NodeQueue(self.storage, self.tasks)
        part = TxnMarker(
            marker.producer_id,
            marker.producer_epoch,
            marker.commit,
            marker.coordinator_epoch,
            tuple(partitions),
        )
        try:
            answers = await queue.submit(broker, part)
        except errors.TributaryError as exc:
            _ensure_current(exc, broker)
            self._log.warning("writing markers to node %d failed (will retry): %s", broker.node_id, exc)
            return set()
        written = set()
        for tp in partitions:
            error = answers.get((tp.topic, tp.partition), errors.UnknownServerError("not in the answer"))
            if error is not None:
                _ensure_current(error, broker)
            if error is None or isinstance(error, _STALE_MARKER):
                written.add(tp)
            else:
                self._log.info(
                    "marker for %s-%d not written by node %d yet: %s",
                    tp.topic,
                    tp.partition,
                    broker.node_id,
                    error,
                )
        return written


def _ensure_current(error: errors.TributaryError, broker: RegisteredBroker) -> None:
    if isinstance(error, _NEWER_CONTROLLER):
        raise errors.NotControllerError(
            f"storage node {broker.node_id} has seen a newer controller ({error}); this term is over"
        ) from error
