"""The transaction coordinator of one controller term (Kafka's TransactionCoordinator).

One :class:`TransactionManager` per controller term, created, run and cancelled with the term by
:class:`~coordinator.leadership.Leadership`, beside the consumer groups. It

* **loads** every transactional id from etcd when the term starts, and finishes each transaction
  an earlier controller decided but did not complete (PREPARE_*: markers, then COMPLETE_*);
* hands out **producer ids** (:mod:`.producer_ids`) and serves InitProducerId,
  AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn -- each a pure transition
  (:mod:`.state`) written to etcd before it is kept (:mod:`.store`);
* **completes** transactions: the marker to every partition's leader (:mod:`.markers`), then, for
  a commit, the staged offsets become the group's committed offsets in the etcd transaction that
  records COMPLETE_COMMIT (:mod:`coordinator.groups.txn_offsets`; when they are more than one
  etcd transaction holds, the earlier ones are written first, and a controller that takes over
  writes them all again before completing);
* **aborts** transactions open longer than their timeout under a bumped epoch, so the producer is
  fenced, and **forgets** transactional ids idle for ``transactional_id_expiration_ms``.

EndTxn answers once its transaction is complete, or after ``complete_wait_s`` with it still being
completed (a leader down): the outcome is decided and durable, the completion goes on, and the
producer's next transaction waits for it with CONCURRENT_TRANSACTIONS. InitProducerId on an id
with an open transaction aborts it the same way before bumping the epoch.

Calls run detached from their RPC (:meth:`~coordinator.groups.tasks.OwnedTasks.detached`): a
client that gives up mid-write does not leave etcd and memory disagreeing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from coordinator.groups.manager import GroupManager
from coordinator.groups.model import PartitionResult
from coordinator.groups.tasks import OwnedTasks, restarting
from coordinator.metadata import MetadataCache, MetadataState
from coordinator.storage_client import StorageNodes
from coordinator.transactions import state
from coordinator.transactions.markers import MarkerWriter, split_deleted
from coordinator.transactions.model import (
    MAX_PRODUCER_EPOCH,
    InitProducerIdParams,
    ProducerIdAndEpoch,
    ProducerRef,
    TxnMarker,
    TxnMetadata,
    TxnOffsetCommitParams,
    TxnState,
)
from coordinator.transactions.offload import off_loop_if_large
from coordinator.transactions.producer_ids import ProducerIdManager
from coordinator.transactions.store import TxnEntry, TxnStore
from services import errors
from services.clock import SYSTEM_CLOCK, Clock
from services.etcd.connection import Backoff
from services.etcd.exceptions import EtcdError
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)

#: Transactional ids looked at between two yields of the event loop in the expiration pass.
_SCAN_SLICE = 1_000


@dataclass(frozen=True, slots=True)
class TransactionSettings:
    """Transaction coordinator settings (from :class:`coordinator.config.CoordinatorConfig`)."""

    #: Kafka's transaction.max.timeout.ms (15 min).
    max_timeout_ms: int = 900_000
    #: Kafka's transactional.id.expiration.ms (7 days).
    id_expiration_ms: int = 7 * 24 * 60 * 60 * 1000
    #: Kafka's transaction.abort.timed.out.transaction.cleanup.interval.ms (10 s), in seconds.
    abort_check_interval_s: float = 10.0
    #: Kafka's transaction.remove.expired.transaction.cleanup.interval.ms (1 h), in seconds.
    expiration_check_interval_s: float = 3600.0
    #: Producer ids taken from etcd's counter at a time.
    producer_id_block_size: int = 1_000
    #: How long EndTxn (and InitProducerId aborting an open transaction) waits for completion
    #: (the service uses half of admin_wait_s / forward_timeout_s, whichever is shorter).
    complete_wait_s: float = 5.0
    #: How long a call at the start of a term waits for the transactional ids to be loaded.
    load_wait_s: float = 10.0


class TransactionManager:
    """Every transactional id and producer id of one controller term. See the module docstring."""

    def __init__(
        self,
        *,
        client,
        cache: MetadataCache,
        storage: StorageNodes,
        controller,
        groups: GroupManager,
        settings: TransactionSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.cache = cache
        self.controller = controller
        self.groups = groups
        self.settings = settings or TransactionSettings()
        self.clock = clock
        self.tasks = OwnedTasks("transaction")
        self.store = TxnStore(client=client, controller=controller, load_wait_s=self.settings.load_wait_s)
        self.producer_ids = ProducerIdManager(
            client=client, controller=controller, block_size=self.settings.producer_id_block_size
        )
        self.markers = MarkerWriter(cache=cache, storage=storage, tasks=self.tasks)

    # ---- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Load, complete what was decided, then abort timed-out transactions and expire idle
        ids until cancelled."""
        try:
            await self._load_routine()
            for entry in self.store.preparing():
                log.info(
                    "transactional id %s: completing its %s decided by an earlier controller",
                    entry.transactional_id,
                    entry.meta.state.name if entry.meta else "?",
                )
                self._start_completion(entry)
            await asyncio.gather(
                restarting(self._timeout_routine, "transaction"),
                restarting(self._expiration_routine, "transaction"),
            )
        finally:
            self.tasks.cancel_all()

    async def _load_routine(self) -> None:
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            try:
                await self.store.load()
                return
            except EtcdError as exc:
                log.warning("cannot load transactional ids yet (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())

    # ---- InitProducerId -------------------------------------------------------------------------------

    async def init_producer_id(self, params: InitProducerIdParams) -> ProducerIdAndEpoch:
        """A producer id and epoch: a fresh id for an idempotent producer (or its epoch bumped,
        KIP-360); for a transactional id, its epoch bumped, fencing every older instance."""
        expected = state.expected_producer(params.producer_id, params.producer_epoch)
        if not params.transactional_id:
            return await self.tasks.detached(self._init_idempotent(expected))
        state.ensure_valid_transactional_id(params.transactional_id)
        state.ensure_valid_timeout(params.transaction_timeout_ms, self.settings.max_timeout_ms)
        await self.store.ready()
        if expected is not None:
            await self.producer_ids.ensure_handed_out(expected.producer_id)
        for _ in range(2):  # at most: abort the open transaction, then bump
            answer, entry = await self.tasks.detached(self._init_transactional(params, expected))
            if answer is not None:
                return answer
            await self._wait_completed(entry)
        raise errors.ConcurrentTransactionsError(
            f"transactional id {params.transactional_id!r}: its open transaction is still being aborted; "
            "retry"
        )

    async def _init_idempotent(self, expected: ProducerIdAndEpoch | None) -> ProducerIdAndEpoch:
        if expected is None:
            return ProducerIdAndEpoch(await self.producer_ids.next_id(), 0)
        await self.producer_ids.ensure_handed_out(expected.producer_id)
        if expected.epoch >= MAX_PRODUCER_EPOCH:
            return ProducerIdAndEpoch(await self.producer_ids.next_id(), 0)
        return ProducerIdAndEpoch(expected.producer_id, expected.epoch + 1)

    async def _init_transactional(
        self, params: InitProducerIdParams, expected: ProducerIdAndEpoch | None
    ) -> tuple[ProducerIdAndEpoch | None, TxnEntry]:
        """The new id and epoch; or None once an open transaction was fenced and its abort
        started (the caller waits for it and comes back)."""
        async with self.store.locked(params.transactional_id, create=True) as entry:
            now = self.clock.time_ms()
            timeout = params.transaction_timeout_ms
            meta = entry.meta
            if meta is None:
                meta = state.new_transactional_id(
                    params.transactional_id, await self.producer_ids.next_id(), timeout, now
                )
            else:
                state.ensure_init_allowed(meta, expected)
                if meta.state is TxnState.ONGOING:
                    await self._fence_and_abort(entry, meta, "InitProducerId", expected=expected)
                    return None, entry
            new_id = (
                await self.producer_ids.next_id() if state.needs_new_producer_id(meta, expected) else None
            )
            after = state.init_producer(meta, expected, timeout, now, new_id)
            await self.store.write(entry, after)
            log.info(
                "transactional id %s: producer id %d, epoch %d",
                params.transactional_id,
                after.producer_id,
                after.producer_epoch,
            )
            return ProducerIdAndEpoch(after.producer_id, after.producer_epoch), entry

    # ---- a transaction's contents ---------------------------------------------------------------------

    async def add_partitions(
        self, producer: ProducerRef, partitions: Sequence[TopicPartition]
    ) -> list[PartitionResult]:
        """AddPartitionsToTxn. Partitions that do not exist are UNKNOWN_TOPIC_OR_PARTITION and
        then nothing is added (the others are OPERATION_NOT_ATTEMPTED), as Kafka."""
        await self.store.ready()
        wanted, results, refused = await off_loop_if_large(
            len(partitions), check_partitions_to_add, self.cache.state, partitions
        )
        if not refused:
            await self.tasks.detached(
                self._change(
                    producer, len(wanted), lambda meta, now: state.add_partitions(meta, producer, wanted, now)
                )
            )
        return results

    async def describe(
        self, transactional_ids: Sequence[str], states: Sequence[str]
    ) -> list[TxnMetadata | errors.TributaryError]:
        """The named ids' metadata (TRANSACTIONAL_ID_NOT_FOUND for unknown ones), or every id's
        (in ``states``, by Kafka name, when given), sorted by id. Reads memory only."""
        await self.store.ready()
        known = {member.kafka_name: member for member in TxnState}
        unknown = [name for name in states if name not in known]
        if unknown:
            raise errors.InvalidRequestError(
                f"unknown transaction state {unknown[0]!r}; one of {', '.join(known)}"
            )
        wanted = {known[name] for name in states}
        if transactional_ids:
            described: list[TxnMetadata | errors.TributaryError] = []
            for transactional_id in transactional_ids:
                entry = self.store.entries.get(transactional_id)
                if entry is None or entry.meta is None:
                    described.append(
                        errors.TransactionalIdNotFoundError(
                            f"transactional id {transactional_id!r} is unknown"
                        )
                    )
                else:
                    described.append(entry.meta)
            return described
        metas = [e.meta for e in self.store.entries.values() if e.meta is not None]
        listed: list[TxnMetadata] = sorted(
            (m for m in metas if not wanted or m.state in wanted), key=lambda m: m.transactional_id
        )
        return list(listed)

    def health(self) -> dict[str, int]:
        """Gauges: transactional ids, open transactions, the oldest one's age in ms. Runs on the
        metrics exporter's thread: reads copies only."""
        entries = dict(self.store.entries)
        starts = [
            e.meta.start_ms
            for tid in list(self.store.ongoing)
            if (e := entries.get(tid)) is not None and e.meta is not None and e.meta.start_ms >= 0
        ]
        now = self.clock.time_ms()
        return {
            "transactional_ids": len(entries),
            "open_transactions": len(starts),
            "oldest_open_transaction_ms": max(0, now - min(starts)) if starts else 0,
        }

    async def verify_partitions(
        self, producer_id: int, producer_epoch: int, partitions: Sequence[TopicPartition]
    ) -> list[PartitionResult]:
        """Whether ``producer_id``'s transaction is open, at ``producer_epoch``, with each partition
        added: what a partition leader asks before the first transactional batch of a transaction
        (reads memory only; the active controller's memory is what etcd holds)."""
        await self.store.ready()
        meta = self.store.for_producer(producer_id)
        return [
            PartitionResult(tp, state.verification_error(meta, producer_id, producer_epoch, tp))
            for tp in partitions
        ]

    async def add_offsets(self, producer: ProducerRef, group_id: str) -> None:
        """AddOffsetsToTxn: offsets of ``group_id`` may be staged in the transaction."""
        await self.store.ready()
        await self.tasks.detached(
            self._change(producer, 1, lambda meta, now: state.add_group(meta, producer, group_id, now))
        )

    async def _change(self, producer: ProducerRef, size: int, change) -> None:
        async with self.store.locked(producer.transactional_id, create=False) as entry:
            meta = entry.meta
            after = await off_loop_if_large(size, change, meta, self.clock.time_ms())
            if after is not meta:
                await self.store.write(entry, after)

    async def txn_offset_commit(self, params: TxnOffsetCommitParams) -> list[PartitionResult]:
        """TxnOffsetCommit: checked like a commit, staged in the transaction; per-partition results."""
        await self.store.ready()
        return await self.tasks.detached(self._txn_offset_commit(params))

    async def _txn_offset_commit(self, params: TxnOffsetCommitParams) -> list[PartitionResult]:
        producer, group_id = params.producer, params.group_id
        offsets = self.groups.txn_offsets
        async with self.store.locked(producer.transactional_id, create=False) as entry:
            state.ensure_can_stage_offsets(entry.meta, producer, group_id)
            await offsets.check_member(group_id, params.member_id, params.generation)
            results, records = await off_loop_if_large(
                len(params.offsets),
                lambda: offsets.check_partitions(params.offsets, generation=params.generation),
            )
            meta = entry.meta
            after = await off_loop_if_large(
                len(records), state.stage_offsets, meta, producer, group_id, records, self.clock.time_ms()
            )
            if after is not meta:
                await self.store.write(entry, after)
        return results

    # ---- EndTxn and completion ------------------------------------------------------------------------

    async def end_txn(self, producer: ProducerRef, commit: bool) -> None:
        """EndTxn: record the decision, then wait (bounded) for the transaction to complete."""
        await self.store.ready()
        entry = await self.tasks.detached(self._end_txn(producer, commit))
        if entry is not None:
            await self._wait_completed(entry)

    async def _end_txn(self, producer: ProducerRef, commit: bool) -> TxnEntry | None:
        async with self.store.locked(producer.transactional_id, create=False) as entry:
            before = entry.meta
            after = state.end_transaction(before, producer, commit, self.clock.time_ms())
            if after is not before:
                await self.store.write(entry, after)
                log.info(
                    "transactional id %s: %s (producer %d, epoch %d, %d partitions, %d groups)",
                    producer.transactional_id,
                    after.state.name,
                    after.producer_id,
                    after.producer_epoch,
                    len(after.partitions),
                    len(after.groups),
                )
            if not after.state.preparing:
                return None  # the same outcome, already complete: a retry
            self._start_completion(entry)
            return entry

    async def _fence_and_abort(
        self, entry: TxnEntry, meta: TxnMetadata, reason: str, *, expected: ProducerIdAndEpoch | None = None
    ) -> None:
        """Abort the open transaction under a bumped epoch. The caller holds the entry's lock."""
        fenced = state.fence_ongoing(meta, self.clock.time_ms(), expected=expected)
        await self.store.write(entry, fenced)
        log.info(
            "transactional id %s: aborting the open transaction and fencing epoch %d (%s)",
            entry.transactional_id,
            meta.producer_epoch,
            reason,
        )
        self._start_completion(entry)

    def _start_completion(self, entry: TxnEntry) -> None:
        if entry.completion is None or entry.completion.done():
            entry.completion = self.tasks.spawn(self._completion_routine(entry))

    async def _wait_completed(self, entry: TxnEntry) -> bool:
        """Wait (at most ``complete_wait_s``) for the entry's completion; whether it is complete."""
        task = entry.completion
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=self.settings.complete_wait_s)
        return entry.meta is not None and not entry.meta.state.preparing

    async def _completion_routine(self, entry: TxnEntry) -> None:
        """Markers, then COMPLETE_* -- retried until done or until the term ends."""
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            decided = entry.meta
            if entry.removed or decided is None or not decided.state.preparing:
                return
            marker = TxnMarker(
                decided.producer_id,
                decided.producer_epoch,
                decided.state is TxnState.PREPARE_COMMIT,
                self.controller.epoch,
                tuple(sorted(decided.partitions)),
            )
            try:
                await self.markers.write(marker)
                async with self.store.locked(entry.transactional_id, create=False) as current:
                    if current.meta is not None and _same_decision(current.meta, decided):
                        await self._complete(current, current.meta)
                return
            except errors.NotControllerError:
                return  # the term is over: the next controller completes it
            except (errors.TributaryError, EtcdError) as exc:
                log.warning(
                    "transactional id %s: completing %s failed (will retry): %s",
                    entry.transactional_id,
                    decided.state.name,
                    exc,
                )
                await asyncio.sleep(backoff.next_delay())

    async def _complete(self, entry: TxnEntry, decided: TxnMetadata) -> None:
        """Record COMPLETE_*; for a commit with staged offsets, in the write of the last group's
        offsets. The caller holds the entry's lock."""
        done = state.complete(decided, self.clock.time_ms())
        staged = sorted(decided.pending_offsets.items()) if decided.state is TxnState.PREPARE_COMMIT else []
        if not staged:
            await self.store.write(entry, done)
        for index, (group_id, records) in enumerate(staged):
            last = index == len(staged) - 1

            async def write(ops, last=last) -> None:
                await self.store.write(entry, done if last else None, ops)

            await self.groups.txn_offsets.apply(group_id, records, write)
        log.info(
            "transactional id %s: %s (producer %d, epoch %d)",
            entry.transactional_id,
            done.state.name,
            done.producer_id,
            done.producer_epoch,
        )

    # ---- timeouts and expiration ----------------------------------------------------------------------

    async def _timeout_routine(self) -> None:
        """Abort transactions open longer than their transaction.timeout.ms."""
        while True:
            await asyncio.sleep(self.settings.abort_check_interval_s)
            now = self.clock.time_ms()
            due = [
                transactional_id
                for transactional_id in self.store.ongoing
                if (entry := self.store.entries.get(transactional_id)) is not None
                and entry.meta is not None
                and state.timed_out(entry.meta, now)
            ]
            for transactional_id in due:
                try:
                    await self.tasks.detached(self._abort_timed_out(transactional_id))
                except (errors.TributaryError, EtcdError) as exc:
                    log.warning(
                        "transactional id %s: timeout abort failed (next check retries): %s",
                        transactional_id,
                        exc,
                    )

    async def _abort_timed_out(self, transactional_id: str) -> None:
        async with self.store.locked(transactional_id, create=False) as entry:
            meta = entry.meta
            if meta is None or not state.timed_out(meta, self.clock.time_ms()):
                return  # ended meanwhile
            await self._fence_and_abort(entry, meta, f"open longer than its timeout of {meta.timeout_ms} ms")

    async def _expiration_routine(self) -> None:
        """Forget transactional ids idle for longer than transactional.id.expiration.ms."""
        while True:
            await asyncio.sleep(self.settings.expiration_check_interval_s)
            for transactional_id in await self._expired_ids():
                try:
                    await self.tasks.detached(self._expire(transactional_id))
                except (errors.TributaryError, EtcdError) as exc:
                    log.warning(
                        "transactional id %s: expiring it failed (next pass retries): %s",
                        transactional_id,
                        exc,
                    )

    async def _expired_ids(self) -> list[str]:
        """The idle ids past the expiration, in slices so the event loop never waits long."""
        now, expiration = self.clock.time_ms(), self.settings.id_expiration_ms
        entries = list(self.store.entries.values())
        found = []
        for start in range(0, len(entries), _SCAN_SLICE):
            found += [
                e.transactional_id
                for e in entries[start : start + _SCAN_SLICE]
                if e.meta is not None and state.expired(e.meta, now, expiration)
            ]
            await asyncio.sleep(0)
        return found

    async def _expire(self, transactional_id: str) -> None:
        async with self.store.locked(transactional_id, create=False) as entry:
            meta = entry.meta
            if meta is None or not state.expired(meta, self.clock.time_ms(), self.settings.id_expiration_ms):
                return
            if await self.store.delete(entry):
                log.info(
                    "transactional id %s expired (idle since %d, producer id %d)",
                    transactional_id,
                    meta.last_update_ms,
                    meta.producer_id,
                )


def check_partitions_to_add(
    metadata: MetadataState, partitions: Sequence[TopicPartition]
) -> tuple[list[TopicPartition], list[PartitionResult], bool]:
    """The distinct partitions of an AddPartitionsToTxn, their results, and whether the request
    is refused (a partition does not exist: then nothing is added). Linear in the request."""
    wanted = list(dict.fromkeys(partitions))
    _, unknown = split_deleted(metadata, wanted)
    if not unknown:
        return wanted, [PartitionResult(tp) for tp in wanted], False
    not_attempted = errors.OperationNotAttemptedError("another partition of the request does not exist")
    results = [
        PartitionResult(
            tp,
            errors.UnknownTopicOrPartitionError(f"{tp.topic}-{tp.partition} does not exist")
            if tp in unknown
            else not_attempted,
        )
        for tp in wanted
    ]
    return wanted, results, True


def _same_decision(current: TxnMetadata, decided: TxnMetadata) -> bool:
    """Whether ``current`` is still the decided, not yet completed transaction ``decided``."""
    return (
        current.state is decided.state
        and current.producer_id == decided.producer_id
        and current.producer_epoch == decided.producer_epoch
    )
