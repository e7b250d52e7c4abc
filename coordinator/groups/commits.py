"""CommitOffsets, batched: concurrent commits of a group share one etcd transaction.

A group has at most one flush task at a time. Commits queue on the group's entry; the flush
task takes as many as fit one transaction (:data:`~coordinator.groups.store.TXN_OPS` offsets),
checks each against the group's state with its lock held (generation fencing: ILLEGAL_GENERATION,
UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID per request; unknown partitions, oversized metadata, and
partitions held by another member per partition), writes the accepted offsets in one
transaction guarded by the controller epoch and by the group's state key revision (which every
generation change rewrites), and answers every caller. While one transaction is in flight the
next batch gathers, so throughput grows with concurrency instead of being one etcd round trip
per commit.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from coordinator.groups import keys
from coordinator.groups.model import CommitParams, OffsetCommit, OffsetRecord, PartitionResult
from coordinator.groups.offsets import check_commit_partition
from coordinator.groups.state import GroupState
from coordinator.groups.store import TXN_OPS, GroupEntry, GroupStore, PendingCommit
from coordinator.groups.tasks import OwnedTasks
from services import errors
from services.etcd.exceptions import EtcdError
from services.etcd.txn import Op
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class CommitBatcher:
    """The commit path of one term's groups."""

    def __init__(self, store: GroupStore, tasks: OwnedTasks, *, max_metadata_bytes: int) -> None:
        self.store = store
        self.tasks = tasks
        self.max_metadata_bytes = max_metadata_bytes

    async def commit(self, params: CommitParams) -> list[PartitionResult]:
        """Per-partition results once the batch holding this commit is written (or its error)."""
        await self.store.ready()
        entry = self.store.entry_for_commit(params.group_id)
        pending = PendingCommit(params, asyncio.get_running_loop().create_future())
        entry.commits.append(pending)
        if not entry.flushing:
            entry.flushing = True
            self.tasks.spawn(self._flush_routine(entry))
        return await pending.future

    async def _flush_routine(self, entry: GroupEntry) -> None:
        batch: list[PendingCommit] = []
        try:
            while entry.commits:
                batch = take_batch(entry.commits)
                await self._commit_batch(entry, batch)
        except asyncio.CancelledError:
            ended = errors.NotControllerError(
                "the controller term ended before the commit was answered; retry"
            )
            for pending in [*batch, *entry.commits]:
                settle(pending.future, ended)
            entry.commits.clear()
            raise
        finally:
            entry.flushing = False

    async def _commit_batch(self, entry: GroupEntry, batch: list[PendingCommit]) -> None:
        """Check every commit of ``batch``, write the accepted offsets, answer each caller."""
        try:
            outcomes = await self._write_batch(entry, batch)
        except (errors.TributaryError, EtcdError) as exc:
            failure = (
                exc
                if isinstance(exc, errors.TributaryError)
                else errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc}")
            )
            outcomes = [failure] * len(batch)
        except Exception as exc:
            log.exception("committing offsets of group %s failed", entry.group_id)
            outcomes = [errors.TributaryError(f"{type(exc).__name__}: {exc}")] * len(batch)
        for pending, outcome in zip(batch, outcomes):
            settle(pending.future, outcome)

    async def _write_batch(self, entry: GroupEntry, batch: list[PendingCommit]) -> list[Any]:
        async with entry.lock:
            if entry.removed:
                raise errors.CoordinatorNotAvailableError(
                    f"group {entry.group_id} was deleted meanwhile; retry"
                )
            if entry.stale:
                await self.store.reload(entry)
            outcomes, records = self._plan(entry.state, batch)
            changed = {tp: r for tp, r in records.items() if not _same_commit(entry.offsets.get(tp), r)}
            if changed:
                ops = [
                    Op.put(keys.offset_key(entry.group_id, tp), keys.encode_offset(r))
                    for tp, r in changed.items()
                ]
                await self.store.write(entry, ops, [entry.state_guard()], ordered=False)
                entry.offsets.update(changed)
            return outcomes

    def _plan(self, state: GroupState, batch: list[PendingCommit]):
        """Per request: its error, or its per-partition results; and the records to write (a
        later request's offset for a partition wins over an earlier one's)."""
        topics, now_ms = self.store.topics(), self.store.clock.time_ms()
        outcomes: list[Any] = []
        records: dict[TopicPartition, OffsetRecord] = {}
        for pending in batch:
            params = pending.params
            try:
                state.ensure_can_commit(params.member_id, params.generation, params.instance_id)
            except errors.TributaryError as exc:
                outcomes.append(exc)
                continue
            results = []
            for commit in params.offsets:
                error = self._partition_error(state, params.member_id, commit, topics)
                if error is None:
                    records[commit.tp] = OffsetRecord(
                        commit.offset, commit.metadata, now_ms, params.generation
                    )
                results.append(PartitionResult(commit.tp, error))
            outcomes.append(results)
        return outcomes, records

    def _partition_error(
        self, state: GroupState, member_id: str, commit: OffsetCommit, topics: dict[str, int]
    ) -> errors.TributaryError | None:
        """Why one partition of an accepted request cannot be stored. A partition another member
        holds is refused even at the current generation: during a cooperative hand-off only the
        holder may commit it (before it releases it), never the member it is moving to."""
        error = check_commit_partition(commit, topics, self.max_metadata_bytes)
        if error is None and (holder := state.commit_conflict(member_id, commit.tp)) is not None:
            error = errors.IllegalGenerationError(
                f"{commit.topic}-{commit.partition} is held by member {holder}; only its holder may commit it"
            )
        return error


def _same_commit(stored: OffsetRecord | None, new: OffsetRecord) -> bool:
    """Whether ``new`` would store what is stored already but for its timestamp: a consumer of
    thousands of partitions auto-commits every position every few seconds, most unchanged, and
    rewriting them would cost an etcd write each. The stored timestamp is only read once the
    group is empty (retention counts from then, KIP-211), so keeping the older one changes
    nothing a member or an operator relies on."""
    return (
        stored is not None
        and stored.offset == new.offset
        and stored.metadata == new.metadata
        and stored.generation == new.generation
    )


def take_batch(queue: list[PendingCommit]) -> list[PendingCommit]:
    """Pending commits from the front, as many as fit one transaction (at least one)."""
    batch: list[PendingCommit] = []
    size = 0
    while queue and (not batch or size + len(queue[0].params.offsets) <= TXN_OPS):
        pending = queue.pop(0)
        batch.append(pending)
        size += len(pending.params.offsets)
    return batch


def settle(future: asyncio.Future, outcome) -> None:
    if future.done():
        return  # the caller gave up (its RPC was cancelled)
    if isinstance(outcome, BaseException):
        future.set_exception(outcome)
    else:
        future.set_result(outcome)
