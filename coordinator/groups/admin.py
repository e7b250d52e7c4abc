"""Reading and administering groups: committed offsets, listings, descriptions with lag, offset
resets, deletion, and the retention pass that expires offsets of empty groups.

Reads are answered from the active controller's memory (the only writer of ``groups/``, so
memory is what etcd holds). Resets and deletes need a group without members (NON_EMPTY_GROUP
otherwise): changing a group's offsets under running consumers would be overwritten by their next
commit, as in Kafka.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence

from coordinator.groups import keys, lag
from coordinator.groups.model import (
    CommittedOffset,
    GroupDescription,
    GroupListing,
    MemberDescription,
    OffsetRecord,
    PartitionLag,
    ResetSpec,
    sorted_partitions,
)
from coordinator.groups.offsets import check_commit_partition, expired_offsets, offsets_of_deleted_topics
from coordinator.groups.state import GroupState
from coordinator.groups.store import GroupEntry, GroupStore
from coordinator.groups.tasks import OwnedTasks
from coordinator.storage_client import StorageNodes
from services import errors
from services.etcd.txn import Op
from services.offset_spec import EARLIEST, LATEST
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)


class GroupAdmin:
    """Reads and admin operations over one term's groups."""

    def __init__(
        self,
        store: GroupStore,
        tasks: OwnedTasks,
        storage: StorageNodes,
        *,
        retention_ms: int,
        max_metadata_bytes: int,
    ) -> None:
        self.store = store
        self.tasks = tasks
        self.storage = storage
        self.retention_ms = retention_ms
        self.max_metadata_bytes = max_metadata_bytes

    # ---- reads ----------------------------------------------------------------------------------------

    async def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> list[CommittedOffset]:
        """Committed offsets of ``partitions`` (all the group has when empty); -1 where none."""
        await self.store.ready()
        entry = self.store.groups.get(group_id)
        if entry is not None and entry.stale:
            entry = None
            with contextlib.suppress(errors.GroupIdNotFoundError):
                async with self.store.locked(group_id, create=False) as entry:
                    pass  # taking the lock reloaded it
        offsets = entry.offsets if entry is not None else {}
        return [committed(tp, offsets.get(tp)) for tp in (partitions or sorted(offsets))]

    async def list_groups(self) -> list[GroupListing]:
        await self.store.ready()
        return [
            GroupListing(g, e.state.state_name, len(e.state.members))
            for g, e in sorted(self.store.groups.items())
            if e.listed
        ]

    async def describe(self, group_id: str) -> GroupDescription:
        """Members with their target and held partitions; per partition (assigned, held or
        committed) the committed offset, log end offset, lag and holder."""
        await self.store.ready()
        entry = self.store.groups.get(group_id)
        if entry is None or not entry.listed:
            raise errors.GroupIdNotFoundError(f"group {group_id} does not exist")
        state, offsets = entry.state, dict(entry.offsets)  # states are replaced, never mutated: a snapshot
        members = tuple(
            MemberDescription(
                m,
                sorted_partitions(state.target.get(m.member_id, ())),
                sorted_partitions(state.owned_by(m.member_id)),
            )
            for m in sorted(state.members.values(), key=lambda m: m.member_id)
        )
        wanted = sorted(
            set(offsets) | set(state.owners) | {tp for tps in state.target.values() for tp in tps}
        )
        lags = await self._lags(state, offsets, wanted)
        return GroupDescription(
            group_id, state.state_name, state.generation, state.assignor, members, tuple(lags)
        )

    async def _lags(
        self, state: GroupState, offsets: dict[TopicPartition, OffsetRecord], wanted: list[TopicPartition]
    ) -> list[PartitionLag]:
        metadata = self.store.cache.state
        ends = await lag.log_offsets(metadata, self.storage, wanted, LATEST)
        starts = await lag.log_offsets(
            metadata, self.storage, [tp for tp in wanted if tp not in offsets], EARLIEST
        )
        return [
            partition_lag(tp, offsets.get(tp), ends[tp], starts.get(tp), state.owners.get(tp, ""))
            for tp in wanted
        ]

    # ---- reset --------------------------------------------------------------------------------------

    async def reset_offsets(
        self, group_id: str, topics: Sequence[str], spec: ResetSpec, *, dry_run: bool
    ) -> list[CommittedOffset]:
        """Move the group's committed offsets of every partition of ``topics`` (or the explicit
        ones); ``dry_run`` only computes them."""
        await self.store.ready()
        return await self.tasks.detached(self._do_reset(group_id, topics, spec, dry_run))

    async def _do_reset(
        self, group_id: str, topics: Sequence[str], spec: ResetSpec, dry_run: bool
    ) -> list[CommittedOffset]:
        async with self.store.locked(group_id, create=True) as entry:
            ensure_no_members(entry.state, "reset its offsets")
            targets = await self._reset_targets(topics, spec)
            now_ms = self.store.clock.time_ms()
            records = {tp: OffsetRecord(o, "", now_ms, -1) for tp, o in targets.items() if isinstance(o, int)}
            if records and not dry_run:
                await self.store.write(
                    entry,
                    [
                        Op.put(keys.offset_key(group_id, tp), keys.encode_offset(r))
                        for tp, r in records.items()
                    ],
                )
                entry.offsets.update(records)
                log.info("group %s: offsets of %d partitions reset", group_id, len(records))
            return [
                committed(tp, records.get(tp), error=None if isinstance(o, int) else o)
                for tp, o in sorted(targets.items())
            ]

    async def _reset_targets(
        self, topics: Sequence[str], spec: ResetSpec
    ) -> dict[TopicPartition, lag.OffsetOrError]:
        known = self.store.topics()
        if spec.explicit:
            for commit in spec.explicit:
                if (error := check_commit_partition(commit, known, self.max_metadata_bytes)) is not None:
                    raise error
            return {c.tp: c.offset for c in spec.explicit}
        if not topics:
            raise errors.InvalidRequestError("name the topics to reset, or give explicit offsets")
        for topic in topics:
            if topic not in known:
                raise errors.UnknownTopicOrPartitionError(f"topic {topic!r} does not exist")
        partitions = [TopicPartition(t, p) for t in sorted(set(topics)) for p in range(known[t])]
        timestamp = {"earliest": EARLIEST, "latest": LATEST}.get(spec.kind, spec.timestamp)
        metadata = self.store.cache.state
        found = await lag.log_offsets(metadata, self.storage, partitions, timestamp)
        if timestamp >= 0:  # no record that recent: the end of the log, as Kafka's reset tool does
            late = [tp for tp, offset in found.items() if offset == -1]
            found.update(await lag.log_offsets(metadata, self.storage, late, LATEST))
        return found

    # ---- delete and retention ---------------------------------------------------------------------

    async def delete_group(self, group_id: str) -> None:
        """Delete a group without members, with its committed offsets."""
        await self.store.ready()
        await self.tasks.detached(self._do_delete(group_id))

    async def _do_delete(self, group_id: str) -> None:
        async with self.store.locked(group_id, create=False) as entry:
            if not entry.listed:
                raise errors.GroupIdNotFoundError(f"group {group_id} does not exist")
            ensure_no_members(entry.state, "delete it")
            await self.store.write(
                entry, [Op.delete(keys.group_key(group_id)), Op.delete_prefix(keys.group_prefix(group_id))]
            )
            self.store.forget(entry)
            log.info("group %s deleted", group_id)

    async def expire_offsets(self) -> int:
        """One retention pass over every group; returns how many offsets were deleted."""
        deleted = 0
        for group_id in list(self.store.groups):
            with contextlib.suppress(errors.GroupIdNotFoundError):
                deleted += await self.tasks.detached(self._expire_group(group_id))
        return deleted

    async def _expire_group(self, group_id: str) -> int:
        async with self.store.locked(group_id, create=False) as entry:
            state, now_ms = entry.state, self.store.clock.time_ms()
            gone = set(offsets_of_deleted_topics(entry.offsets, self.store.topics()))
            gone |= set(
                expired_offsets(
                    entry.offsets,
                    has_members=bool(state.members),
                    empty_since_ms=state.empty_since_ms,
                    now_ms=now_ms,
                    retention_ms=self.retention_ms,
                )
            )
            if gone:
                await self.store.write(
                    entry, [Op.delete(keys.offset_key(group_id, tp)) for tp in sorted(gone)]
                )
                for tp in gone:
                    del entry.offsets[tp]
                log.info("group %s: %d committed offsets expired or of deleted topics", group_id, len(gone))
            await self._maybe_drop(entry)
            return len(gone)

    async def _maybe_drop(self, entry: GroupEntry) -> None:
        """Forget a group left with nothing: no members, offsets or pending commits (Kafka's Dead)."""
        if entry.state.members or entry.offsets or entry.commits or entry.flushing:
            return
        if entry.has_state_key:
            await self.store.write(entry, [Op.delete(keys.group_key(entry.group_id))])
            log.info("group %s removed: empty and without committed offsets", entry.group_id)
        self.store.forget(entry)


def committed(
    tp: TopicPartition, record: OffsetRecord | None, *, error: errors.TributaryError | None = None
) -> CommittedOffset:
    if record is None:
        return CommittedOffset(tp, error=error)
    return CommittedOffset(tp, record.offset, record.metadata, record.commit_timestamp)


def partition_lag(
    tp: TopicPartition,
    record: OffsetRecord | None,
    end: lag.OffsetOrError,
    start: lag.OffsetOrError | None,
    owner: str,
) -> PartitionLag:
    """Lag = log end - committed offset, or - log start when nothing is committed."""
    committed_offset = record.offset if record is not None else -1
    if isinstance(end, errors.TributaryError):
        return PartitionLag(tp, committed_offset, -1, -1, owner, end)
    base = committed_offset if record is not None else (start if isinstance(start, int) else 0)
    return PartitionLag(tp, committed_offset, end, max(0, end - base), owner)


def ensure_no_members(state: GroupState, action: str) -> None:
    if state.members:
        raise errors.NonEmptyGroupError(
            f"group {state.group_id} has {len(state.members)} active members; stop them to {action}"
        )
