"""The group side of transactional offset commits (Kafka's TxnOffsetCommit, KIP-98 / KIP-447).

A TxnOffsetCommit is checked here as a CommitOffsets is -- the member and generation when given
(generation -1 with no member id skips that), then each partition: it exists, the offset is not
negative, the metadata fits -- but its offsets are staged in the transaction
(:mod:`coordinator.transactions`), not written to the group. Only when the transaction commits
does :meth:`TransactionalOffsets.apply` make them the group's committed offsets: with the group's
lock held, in the etcd write that completes the transaction (the caller's ``write``), and only
then in memory.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from coordinator.groups import keys
from coordinator.groups.model import OffsetCommit, OffsetRecord, PartitionResult
from coordinator.groups.offsets import check_commit_partition
from coordinator.groups.store import GroupStore
from services import errors
from services.etcd.txn import Op
from services.topic_partition import TopicPartition


class TransactionalOffsets:
    """Checks and applies transactional offsets of one term's groups."""

    def __init__(self, store: GroupStore, *, max_metadata_bytes: int) -> None:
        self.store = store
        self.max_metadata_bytes = max_metadata_bytes

    async def check_member(self, group_id: str, member_id: str, generation: int) -> None:
        """KIP-447 fencing: a commit naming a member must come from a current member at the
        group's generation (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION otherwise)."""
        await self.store.ready()
        if not member_id and generation < 0:
            return
        entry = self.store.groups.get(group_id)
        if entry is not None and entry.stale:
            with contextlib.suppress(errors.GroupIdNotFoundError):
                async with self.store.locked(group_id, create=False) as entry:
                    pass  # taking the lock reloaded it
        if entry is None:
            raise errors.UnknownMemberIdError(f"group {group_id} has no member {member_id!r}")
        entry.state.ensure_can_commit(member_id, generation)

    def check_partitions(
        self, offsets: Sequence[OffsetCommit], *, generation: int
    ) -> tuple[list[PartitionResult], dict[TopicPartition, OffsetRecord]]:
        """Per-partition results, and the records to stage for the accepted partitions (a later
        offset of a partition in the same request wins)."""
        topics, now_ms = self.store.topics(), self.store.clock.time_ms()
        results, records = [], {}
        for commit in offsets:
            error = check_commit_partition(commit, topics, self.max_metadata_bytes)
            if error is None:
                records[commit.tp] = OffsetRecord(commit.offset, commit.metadata, now_ms, generation)
            results.append(PartitionResult(commit.tp, error))
        return results, records

    async def apply(
        self,
        group_id: str,
        records: Mapping[TopicPartition, OffsetRecord],
        write: Callable[[list[Op]], Awaitable[None]],
    ) -> None:
        """Make ``records`` the group's committed offsets: ``write`` gets their puts (and adds
        its own operations and guards), then memory follows. The group is reloaded before its next
        operation if ``write`` fails."""
        await self.store.ready()
        async with self.store.locked(group_id, create=True) as entry:
            ops = [
                Op.put(keys.offset_key(group_id, tp), keys.encode_offset(r))
                for tp, r in sorted(records.items())
            ]
            try:
                await write(ops)
            except BaseException:
                entry.stale = True
                raise
            entry.offsets.update(records)
