"""The groups of one controller term, in memory and in etcd: entries, locks, fenced writes, reloads.

Every change to a group follows one pattern (:meth:`GroupStore.change`): with the group's lock
held, apply the operation to a *copy* of its :class:`~coordinator.groups.state.GroupState`,
write the difference (:func:`coordinator.groups.keys.plan_writes`) in transactions fenced by the
controller epoch (:meth:`~coordinator.controller.Controller.fenced_txn`), and only then keep the
copy -- so memory never runs ahead of etcd. A write whose outcome is unknown (etcd unreachable
mid-call, a partial split write) marks the group stale: it is reloaded from etcd before its next
operation.

The active controller is the only writer of ``groups/``, so what it holds in memory is exactly
what etcd holds, except for keys etcd deletes by itself (expired member leases; see the manager's
watch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from coordinator.groups import keys
from coordinator.groups.matcher import TopicMatcher
from coordinator.groups.model import CommitParams, LiveTopics, OffsetRecord, Subscription
from coordinator.groups.state import GroupState
from coordinator.metadata import MetadataCache
from services import errors
from services.clock import Clock
from services.etcd.exceptions import EtcdLeaseNotFoundError
from services.etcd.txn import Compare, Op
from services.topic_partition import TopicPartition

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Operations per etcd transaction (etcd's default --max-txn-ops is 128).
TXN_OPS = 100
#: Transactions of one write in flight at once when their order does not matter (offsets): etcd
#: commits concurrent transactions in one raft round and fsync, so 10,000 offsets cost about
#: 13 round trips, not 100.
PARALLEL_TXNS = 8


@dataclass
class PendingCommit:
    """A CommitOffsets waiting for the group's next batched write."""

    params: CommitParams
    future: asyncio.Future


@dataclass
class GroupEntry:
    """One group's live state: the state machine, committed offsets, the lock over its writes."""

    state: GroupState
    offsets: dict[TopicPartition, OffsetRecord] = field(default_factory=dict)
    #: Mod revision of ``groups/<g>`` (0: absent). Every generation change rewrites that key, so
    #: commits guarded by it are guarded by the generation.
    state_revision: int = 0
    has_state_key: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    commits: list[PendingCommit] = field(default_factory=list)
    flushing: bool = False
    #: A write failed: memory may differ from etcd, reload before the next operation.
    stale: bool = False
    #: Deleted (DeleteGroup, retention): operations that waited for its lock start over.
    removed: bool = False

    @classmethod
    def from_loaded(cls, loaded: keys.LoadedGroup) -> GroupEntry:
        return cls(loaded.state, loaded.offsets, loaded.state_revision, loaded.has_state_key)

    @property
    def group_id(self) -> str:
        return self.state.group_id

    @property
    def listed(self) -> bool:
        """Whether the group exists for ListGroups / DescribeGroup: members, offsets or a stored state."""
        return bool(self.state.members or self.offsets or self.has_state_key)

    def state_guard(self) -> Compare:
        return Compare.mod_revision(keys.group_key(self.group_id), self.state_revision)


class GroupStore:
    """Every group of the term (see the module docstring). One event loop; not thread-safe."""

    def __init__(self, *, client, cache: MetadataCache, controller, clock: Clock, load_wait_s: float) -> None:
        self.client = client
        self.cache = cache
        self.controller = controller
        self.clock = clock
        self.load_wait_s = load_wait_s
        self.groups: dict[str, GroupEntry] = {}
        self.loaded = asyncio.Event()
        self._topics_memo: tuple[int, dict[str, int]] = (-1, {})
        self.matcher = TopicMatcher(self.topics)

    # ---- loading ----------------------------------------------------------------------------------

    async def load(self) -> int:
        """Read every group from etcd; returns the revision read at (watch from the next one)."""
        kvs, revision = await self.client.get_prefix(keys.GROUPS)
        loaded, problems = keys.load_groups(kvs, self.clock)
        for problem in problems:
            log.error("ignoring a consumer-group key with a bad value: %s", problem)
        self.groups = {g: GroupEntry.from_loaded(group) for g, group in loaded.items()}
        self.loaded.set()
        log.info(
            "loaded %d consumer groups (%d with members) at etcd revision %d",
            len(self.groups),
            sum(1 for e in self.groups.values() if e.state.members),
            revision,
        )
        return revision

    async def ready(self) -> None:
        """Wait (bounded) for the load; COORDINATOR_NOT_AVAILABLE if it takes too long."""
        if self.loaded.is_set():
            return
        try:
            async with asyncio.timeout(self.load_wait_s):
                await self.loaded.wait()
        except TimeoutError:
            raise errors.CoordinatorNotAvailableError("consumer groups are still being loaded") from None

    def topics(self) -> dict[str, int]:
        """Live topics and their partition counts (memoised per metadata revision)."""
        state = self.cache.state
        if self._topics_memo[0] != state.metadata_revision:
            counts = {name: t.partition_count for name, t in state.topics.items() if not t.deleting}
            self._topics_memo = (state.metadata_revision, counts)
        return self._topics_memo[1]

    async def live_topics(self, entry: GroupEntry, *also: Subscription) -> LiveTopics:
        """The live topics with the patterns of the group's members (and of ``also``) matched,
        off the event loop: what every state change that may rebalance is given."""
        patterns = {m.subscription.pattern for m in entry.state.members.values()}
        patterns.update(subscription.pattern for subscription in also)
        return await self.matcher.live_topics(patterns)

    # ---- entries and locks ------------------------------------------------------------------------

    def entry_for_commit(self, group_id: str) -> GroupEntry:
        """The group's entry, created empty if it does not exist (standalone commits create groups)."""
        entry = self.groups.get(group_id)
        if entry is None:
            entry = self.groups[group_id] = GroupEntry(GroupState(group_id, self.clock))
        return entry

    @contextlib.asynccontextmanager
    async def locked(self, group_id: str, *, create: bool) -> AsyncIterator[GroupEntry]:
        """The group's entry with its lock held (created if ``create``, else GROUP_ID_NOT_FOUND);
        reloaded first if a write failed."""
        while True:
            entry = self.entry_for_commit(group_id) if create else self.groups.get(group_id)
            if entry is None:
                raise errors.GroupIdNotFoundError(f"group {group_id} does not exist")
            async with entry.lock:
                if entry.removed:
                    continue  # deleted while we waited: start over with the current entry
                if entry.stale:
                    await self.reload(entry)
                yield entry
                return

    def forget(self, entry: GroupEntry) -> None:
        entry.removed = True
        if self.groups.get(entry.group_id) is entry:
            del self.groups[entry.group_id]

    # ---- changes ------------------------------------------------------------------------------------

    async def change(
        self,
        entry: GroupEntry,
        change: Callable[[GroupState], T],
        reason: str = "",
        *,
        may_rebalance: bool = False,
    ) -> T:
        """Apply ``change`` to a copy of the state, write the difference, keep the copy.
        The caller holds the entry's lock.

        ``may_rebalance``: the change may recompute the group's assignment (joins, leaves,
        removals, topic changes), work that grows with members times subscribed partitions --
        100 members on 10,000 topics take ~1 s -- so it runs in a worker thread, on the copy no
        one else sees. Heartbeats never rebalance and stay on the event loop."""
        candidate = entry.state.copy()
        if may_rebalance:
            result, ops = await asyncio.to_thread(_apply, change, entry.state, candidate)
        else:
            result, ops = _apply(change, entry.state, candidate)
        if ops:
            await self.write(entry, ops)
        if candidate.generation != entry.state.generation:
            log.info(
                "group %s: generation %d, %d members, %s assignor%s",
                entry.group_id,
                candidate.generation,
                len(candidate.members),
                candidate.assignor,
                f" ({reason})" if reason else "",
            )
        entry.state = candidate
        return result

    async def write(
        self, entry: GroupEntry, ops: Sequence[Op], compares: Sequence[Compare] = (), *, ordered: bool = True
    ) -> None:
        """Fenced transactions of at most :data:`TXN_OPS` operations; marks the group stale on failure.

        ``ordered=False`` (writes none of which changes what ``compares`` guard, such as offsets)
        lets up to :data:`PARALLEL_TXNS` transactions run at once. Either way a failure leaves an
        unknown prefix or subset written, hence the reload before the group's next operation."""
        chunks = [ops[start : start + TXN_OPS] for start in range(0, len(ops), TXN_OPS)]
        try:
            if ordered or len(chunks) == 1:
                for chunk in chunks:
                    await self._write_chunk(entry, chunk, compares)
            else:
                slots = asyncio.Semaphore(PARALLEL_TXNS)

                async def write_chunk(chunk: Sequence[Op]) -> None:
                    async with slots:
                        await self._write_chunk(entry, chunk, compares)

                outcomes = await asyncio.gather(*map(write_chunk, chunks), return_exceptions=True)
                failures = [o for o in outcomes if isinstance(o, BaseException)]
                if failures:
                    raise failures[0]
        except EtcdLeaseNotFoundError as exc:
            entry.stale = True
            raise errors.CoordinatorNotAvailableError(
                "a member's session expired during the change; retry"
            ) from exc
        except BaseException:
            entry.stale = True
            raise

    async def _write_chunk(self, entry: GroupEntry, chunk: Sequence[Op], compares: Sequence[Compare]) -> None:
        result = await self.controller.fenced_txn(chunk, compares)
        if not result.succeeded:
            raise errors.CoordinatorNotAvailableError(f"group {entry.group_id} changed underneath; retry")
        state_key = keys.group_key(entry.group_id)
        if any(op.key == state_key and op.kind == "put" for op in chunk):
            entry.state_revision, entry.has_state_key = result.revision, True

    async def reload(self, entry: GroupEntry) -> None:
        """Replace the entry's state with etcd's (after a write whose outcome is unknown), then
        rebalance if members expired meanwhile. The caller holds the entry's lock."""
        group_id = entry.group_id
        kvs, _ = await self.client.get_prefix(keys.group_prefix(group_id))
        state_kv = await self.client.get(keys.group_key(group_id))
        loaded, problems = keys.load_groups([*kvs, *([state_kv] if state_kv else [])], self.clock)
        for problem in problems:
            log.error("ignoring a consumer-group key with a bad value: %s", problem)
        group = loaded.get(group_id) or keys.LoadedGroup(GroupState(group_id, self.clock), {}, 0, False)
        group.state.fenced = entry.state.fenced
        entry.state, entry.offsets = group.state, group.offsets
        entry.state_revision, entry.has_state_key = group.state_revision, group.has_state_key
        entry.stale = False
        log.info("group %s reloaded from etcd", group_id)
        topics = await self.live_topics(entry)
        await self.change(entry, lambda s: s.rebalance(topics), "reloaded from etcd", may_rebalance=True)


def _apply(
    change: Callable[[GroupState], T], current: GroupState, candidate: GroupState
) -> tuple[T, list[Op]]:
    """``change`` applied to ``candidate`` (a copy of ``current``), and the writes it needs."""
    result = change(candidate)
    return result, keys.plan_writes(current, candidate)
