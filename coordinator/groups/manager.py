"""Consumer groups of one controller term: membership operations and the routines that follow etcd.

One :class:`GroupManager` per controller term (created, run and cancelled with the term by
:class:`~coordinator.leadership.Leadership`). It

* **loads** every group from etcd when the term starts (:class:`~coordinator.groups.store.GroupStore`),
  so a new active controller carries on the groups of one that died: same members (their leases
  are still alive if they kept heartbeating), generation, target, ownership registry and committed
  offsets -- then rebalances groups whose members expired during the failover;
* serves **joins, heartbeats and leaves** (below), **commits**
  (:class:`~coordinator.groups.commits.CommitBatcher`) and **reads and admin**
  (:class:`~coordinator.groups.admin.GroupAdmin`);
* **follows** ``groups/`` for member keys etcd deleted (the member stopped heartbeating and its
  lease expired) and removes those members -- on the metadata cache's watch, which sees every
  key of the cluster anyway; **follows topic metadata** (a new topic matching a pattern, added
  partitions, deleted topics) and rebalances -- subscription patterns matched in a worker
  thread and kept while the topic names stay the same (:mod:`coordinator.groups.matcher`), so
  no pattern or topic count makes the event loop wait; **expires** committed offsets of empty
  groups after ``offsets.retention.minutes``;
* checks and applies **transactional offsets** for the transaction coordinator
  (:class:`~coordinator.groups.txn_offsets.TransactionalOffsets`).

A member's session is an etcd lease this controller holds for it (TTL = its session timeout)
and refreshes on each of its heartbeats -- the coordinator's side of the member's keep-alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass

from coordinator.groups import keys, rules
from coordinator.groups.admin import GroupAdmin
from coordinator.groups.commits import CommitBatcher
from coordinator.groups.model import HeartbeatParams, JoinParams, Member, MemberAssignment
from coordinator.groups.state import JoinKind, new_member_id
from coordinator.groups.store import GroupEntry, GroupStore
from coordinator.groups.tasks import OwnedTasks, restarting
from coordinator.groups.txn_offsets import TransactionalOffsets
from coordinator.metadata import MetadataCache
from coordinator.storage_client import StorageNodes
from services import errors
from services.clock import SYSTEM_CLOCK, Clock
from services.etcd.connection import Backoff
from services.etcd.exceptions import EtcdError
from services.etcd.values import EventType, WatchEvent, WatchResync
from services.telemetry import forget_consumer_lag, record_consumer_lag

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Group coordination settings (from :class:`coordinator.config.CoordinatorConfig`)."""

    #: Kafka's group.min.session.timeout.ms / group.max.session.timeout.ms.
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    #: Kafka's offsets.retention.minutes (7 days), in ms, and its check interval, in seconds.
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000
    offsets_retention_check_interval_s: float = 600.0
    #: Kafka's offset.metadata.max.bytes.
    offset_metadata_max_bytes: int = 4096
    #: How long a call at the start of a term waits for the groups to be loaded.
    load_wait_s: float = 10.0
    #: Period of the consumer-lag sample fed to the telemetry gauge (0 = off, the default when
    #: no metrics exporter is configured: each sample asks the partition leaders for offsets).
    lag_sample_interval_s: float = 0.0


class GroupManager:
    """Every consumer group, for one controller term. See the module docstring."""

    def __init__(
        self,
        *,
        client,
        cache: MetadataCache,
        storage: StorageNodes,
        controller,
        settings: GroupSettings | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.cache = cache
        self.settings = settings or GroupSettings()
        self.tasks = OwnedTasks()
        self.store = GroupStore(
            client=client,
            cache=cache,
            controller=controller,
            clock=clock,
            load_wait_s=self.settings.load_wait_s,
        )
        self.commits = CommitBatcher(
            self.store, self.tasks, max_metadata_bytes=self.settings.offset_metadata_max_bytes
        )
        self.admin = GroupAdmin(
            self.store,
            self.tasks,
            storage,
            retention_ms=self.settings.offsets_retention_ms,
            max_metadata_bytes=self.settings.offset_metadata_max_bytes,
        )
        #: Offsets committed through transactions (checked here, staged by the transaction coordinator).
        self.txn_offsets = TransactionalOffsets(
            self.store, max_metadata_bytes=self.settings.offset_metadata_max_bytes
        )
        self._topics_changed = asyncio.Event()
        #: Watch responses up to this revision are reflected in what was loaded.
        self._loaded_revision: int | None = None
        #: Watch responses that arrived while loading, replayed once loaded.
        self._early: list[list[WatchEvent] | WatchResync] = []

    # ---- lifecycle --------------------------------------------------------------------------------

    async def run(self) -> None:
        """Load the groups, then follow lease expiries, topic changes and retention until cancelled."""
        # Listening starts before the load, so no expiry between the two is missed; responses the
        # load already reflects are skipped by revision.
        self.cache.add_batch_listener(self._on_watch_batch)
        self.cache.add_listener(self._topics_changed.set)
        try:
            self._loaded_revision = await self._load_routine()
            early, self._early = self._early, []
            for batch in early:
                self._on_watch_batch(batch)
            routines = [restarting(self._topics_routine), restarting(self._retention_routine)]
            if self.settings.lag_sample_interval_s > 0:
                routines.append(restarting(self._lag_routine))
            await asyncio.gather(*routines)
        finally:
            self.cache.remove_batch_listener(self._on_watch_batch)
            self.cache.remove_listener(self._topics_changed.set)
            self.tasks.cancel_all()

    async def _load_routine(self) -> int:
        backoff = Backoff(initial=0.1, maximum=2.0)
        while True:
            try:
                revision = await self.store.load()
                break
            except EtcdError as exc:
                log.warning("cannot load consumer groups yet (%s); retrying", exc)
                await asyncio.sleep(backoff.next_delay())
        for group_id in list(self.store.groups):
            self.tasks.spawn(self._rebalance(group_id, "loaded by a new active controller"))
        return revision

    # ---- join, heartbeat, leave ----------------------------------------------------------------------

    async def join(self, params: JoinParams) -> MemberAssignment:
        rules.ensure_valid_session_timeout(
            params.session_timeout_ms,
            self.settings.min_session_timeout_ms,
            self.settings.max_session_timeout_ms,
        )
        await self.store.ready()
        return await self.tasks.detached(self._do_join(params))

    async def _do_join(self, params: JoinParams) -> MemberAssignment:
        async with self.store.locked(params.group_id, create=True) as entry:
            kind, existing = entry.state.classify_join(params)
            if kind is not JoinKind.REJOIN or existing is None:  # REJOIN always names its member
                return await self._join_with_new_lease(entry, params)
            await self._ensure_session(entry, existing.member_id)
            topics = await self.store.live_topics(entry, params.subscription)
            return await self.store.change(
                entry,
                lambda s: s.join(params, topics)[0],
                f"{existing.member_id} joined again",
                may_rebalance=True,
            )

    async def _join_with_new_lease(self, entry: GroupEntry, params: JoinParams) -> MemberAssignment:
        """A new member, or a static member's new incarnation: both get a new id and lease."""
        topics = await self.store.live_topics(entry, params.subscription)
        try:
            lease = await self.client.grant_lease(rules.lease_ttl_s(params.session_timeout_ms))
        except EtcdError as exc:
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc}") from exc
        member_id = new_member_id(params)
        try:
            answer, replaced = await self.store.change(
                entry,
                lambda s: s.join(params, topics, member_id=member_id, lease_id=lease.id),
                f"{member_id} joined",
                may_rebalance=True,
            )
        except BaseException:
            await self._revoke_quietly(lease.id)
            raise
        if replaced is not None:
            log.info(
                "group %s: static member %s restarted as %s (was %s)",
                entry.group_id,
                params.instance_id,
                member_id,
                replaced.member_id,
            )
            await self._revoke_quietly(replaced.lease_id)  # it holds no key any more
        return answer

    async def heartbeat(self, params: HeartbeatParams) -> MemberAssignment:
        await self.store.ready()
        if params.group_id not in self.store.groups:
            raise errors.UnknownMemberIdError(f"group {params.group_id} has no member {params.member_id}")
        return await self.tasks.detached(self._do_heartbeat(params))

    async def _do_heartbeat(self, params: HeartbeatParams) -> MemberAssignment:
        async with self.store.locked(params.group_id, create=False) as entry:
            member_id = entry.state.ensure_member(params.member_id, params.instance_id).member_id
            await self._ensure_session(entry, member_id)
            if not params.polled and entry.state.poll_expired(member_id):
                await self._remove(entry, member_id, "no poll within max.poll.interval.ms")
                raise errors.UnknownMemberIdError(
                    f"member {member_id} was removed: no poll within its max.poll.interval.ms; join again"
                )
            return await self.store.change(
                entry,
                lambda s: s.heartbeat(
                    member_id,
                    params.generation,
                    params.owned,
                    polled=params.polled,
                    instance_id=params.instance_id,
                ),
            )

    async def leave(self, group_id: str, member_id: str, instance_id: str) -> None:
        await self.store.ready()
        if group_id not in self.store.groups:
            raise errors.UnknownMemberIdError(f"group {group_id} has no member {member_id or instance_id}")
        removed = await self.tasks.detached(self._do_leave(group_id, member_id, instance_id))
        await self._revoke_quietly(removed.lease_id)

    async def _do_leave(self, group_id: str, member_id: str, instance_id: str) -> Member:
        async with self.store.locked(group_id, create=False) as entry:
            topics = await self.store.live_topics(entry)
            return await self.store.change(
                entry,
                lambda s: s.leave(member_id, instance_id, topics),
                f"{member_id or instance_id} left",
                may_rebalance=True,
            )

    # ---- sessions -------------------------------------------------------------------------------------

    async def _ensure_session(self, entry: GroupEntry, member_id: str) -> None:
        """Refresh the member's lease (its heartbeat, as etcd sees it); UNKNOWN_MEMBER_ID if it expired."""
        try:
            ttl = await self.client.refresh_lease(entry.state.members[member_id].lease_id)
        except EtcdError as exc:
            raise errors.CoordinatorNotAvailableError(f"etcd is unavailable: {exc}") from exc
        if ttl <= 0:
            await self._remove(entry, member_id, "session expired")
            raise errors.UnknownMemberIdError(f"the session of member {member_id} expired; join again")

    async def _remove(self, entry: GroupEntry, member_id: str, reason: str) -> None:
        log.info("group %s: removing member %s: %s", entry.group_id, member_id, reason)
        topics = await self.store.live_topics(entry)
        await self.store.change(
            entry, lambda s: s.remove(member_id, topics), f"{member_id}: {reason}", may_rebalance=True
        )

    async def _remove_expired(self, group_id: str, member_id: str) -> None:
        with contextlib.suppress(errors.GroupIdNotFoundError):
            async with self.store.locked(group_id, create=False) as entry:
                if member_id in entry.state.members:
                    await self._remove(entry, member_id, "session timed out")

    async def _revoke_quietly(self, lease_id: int) -> None:
        try:
            await self.client.revoke_lease(lease_id)
        except EtcdError as exc:
            log.info("could not revoke lease %x (it expires by itself): %s", lease_id, exc)

    async def _rebalance(self, group_id: str, reason: str) -> None:
        with contextlib.suppress(errors.GroupIdNotFoundError):
            async with self.store.locked(group_id, create=False) as entry:
                topics = await self.store.live_topics(entry)
                await self.store.change(entry, lambda s: s.rebalance(topics), reason, may_rebalance=True)

    # ---- routines ---------------------------------------------------------------------------------

    def _on_watch_batch(self, batch: list[WatchEvent] | WatchResync) -> None:
        """Every response of the cluster watch: remove members whose key etcd deleted."""
        if self._loaded_revision is None:
            self._early.append(batch)
            return
        if isinstance(batch, WatchResync):
            self.tasks.spawn(self._on_resync({keys.parse_group_key(kv.key) for kv in batch.kvs}))
            return
        for event in batch:  # offsets and owners go by by the thousand: test cheaply first
            if (
                event.type is EventType.DELETE
                and "/members/" in event.kv.key
                and event.revision > self._loaded_revision
            ):
                parsed = keys.parse_group_key(event.kv.key)
                entry = self.store.groups.get(parsed.group_id)
                if parsed.kind == "member" and entry is not None and parsed.member_id in entry.state.members:
                    self.tasks.spawn(self._remove_expired(parsed.group_id, parsed.member_id))

    async def _on_resync(self, stored: set[keys.GroupKey]) -> None:
        """After a compaction gap: members whose key is gone expired while we could not see it
        (checked again, as the snapshot may predate a join)."""
        for group_id, entry in list(self.store.groups.items()):
            for member_id in list(entry.state.members):
                if (
                    keys.GroupKey("member", group_id, member_id=member_id) not in stored
                    and await self.client.get(keys.member_key(group_id, member_id)) is None
                ):
                    await self._remove_expired(group_id, member_id)

    async def _topics_routine(self) -> None:
        """Rebalance groups whose subscribed topics changed (new matches, new partitions, deletions);
        a group whose inputs did not change is left alone (:meth:`GroupState.rebalance`)."""
        while True:
            await self._topics_changed.wait()
            self._topics_changed.clear()
            for group_id, entry in list(self.store.groups.items()):
                if entry.state.members:
                    await asyncio.gather(
                        self.tasks.spawn(self._rebalance(group_id, "topics changed")), return_exceptions=True
                    )

    async def _lag_routine(self) -> None:
        """Sample every group's lag per partition into the ``tributary.consumer.lag`` gauge."""
        reported: set[str] = set()
        try:
            while True:
                await asyncio.sleep(self.settings.lag_sample_interval_s)
                reported = await self._sample_lag(reported)
        finally:
            for group_id in reported:  # the term ended: the next controller reports them
                forget_consumer_lag(group_id)

    async def _sample_lag(self, reported: set[str]) -> set[str]:
        seen: set[str] = set()
        for listing in await self.admin.list_groups():
            try:
                description = await self.admin.describe(listing.group_id)
            except (errors.TributaryError, EtcdError) as exc:
                log.debug("lag sample of %s skipped: %s", listing.group_id, exc)
                continue
            forget_consumer_lag(description.group_id)  # partitions no longer consumed drop out
            for partition in description.partitions:
                if partition.error is None:
                    record_consumer_lag(
                        description.group_id, partition.tp.topic, partition.tp.partition, partition.lag
                    )
            seen.add(description.group_id)
        for gone in reported - seen:
            forget_consumer_lag(gone)
        return seen

    async def _retention_routine(self) -> None:
        while True:
            await asyncio.sleep(self.settings.offsets_retention_check_interval_s)
            try:
                await self.admin.expire_offsets()
            except (errors.TributaryError, EtcdError) as exc:
                log.warning("offset retention pass interrupted (%s); the next pass retries", exc)
