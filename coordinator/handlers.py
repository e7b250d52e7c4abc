"""What the Coordinator RPCs do, as plain methods over domain values (no gRPC in here).

Reads (metadata, describe, list, controller info) are answered by any coordinator from its own
watch-fed cache, stamped with the etcd revision it reflects. Admin operations need the active
controller: on a standby they raise :class:`~coordinator.redirect.ControllerMovedError` naming
the active one, which the servicer turns into a forwarded call. While etcd is unreachable every
call fails with COORDINATOR_NOT_AVAILABLE (UNAVAILABLE, retriable).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from coordinator import topic_rules
from coordinator.acls import MAX_ACLS, AclCache, acl_key, create_ops, delete_ops
from coordinator.controller import Controller
from coordinator.groups.manager import GroupManager
from coordinator.health import EtcdHealth
from coordinator.isr_changes import IsrChange
from coordinator.keys import WRITE_BATCH
from coordinator.leadership import Leadership
from coordinator.metadata import MetadataCache, MetadataState
from coordinator.model import (
    ClusterMetadata,
    ConfigValue,
    ControllerStatus,
    PartitionRecord,
    TopicLookup,
    TopicSpec,
    TopicView,
)
from coordinator.quotas import MAX_QUOTA_ENTITIES, QuotaCache, alter_ops, quota_key
from coordinator.reassignment import ReassignmentRequest
from coordinator.redirect import ControllerMovedError
from coordinator.transactions.manager import TransactionManager
from services import errors
from services.acls import AclBinding, AclFilter
from services.leader_and_isr import LeaderAndIsr
from services.quotas import QuotaEntity, QuotaFilter, apply_alteration
from services.topic_config import TOPIC_CONFIGS, format_topic_config


class CoordinatorHandlers:
    """The Coordinator service's operations over this process's cache and leadership."""

    def __init__(
        self,
        *,
        coordinator_id: str,
        cache: MetadataCache,
        leadership: Leadership,
        health: EtcdHealth,
        acls: AclCache | None = None,
        quotas: QuotaCache | None = None,
    ) -> None:
        self.coordinator_id = coordinator_id
        self.cache = cache
        self.leadership = leadership
        self.health = health
        self.acls = acls if acls is not None else AclCache()
        self.quotas = quotas if quotas is not None else QuotaCache()
        #: Quota alterations read, change and write an entity's values: one at a time.
        self._quota_writes = asyncio.Lock()

    def _state(self) -> MetadataState:
        """The cache's state, if it can be trusted now (synced, etcd reachable)."""
        self.health.ensure_available()
        if not self.cache.synced:
            raise errors.CoordinatorNotAvailableError("metadata is not loaded from etcd yet")
        return self.cache.state

    # -- reads ------------------------------------------------------------------------------------

    def metadata_revision(self) -> int:
        """The etcd revision metadata would be served at now (raises when it cannot be served).

        Everything GetMetadata answers is a function of the cache's metadata, which changes only
        with this revision (consumer-group writes do not move it), so callers may reuse an answer
        built at the same revision.
        """
        return self._state().metadata_revision

    async def wait_for_metadata_after(self, revision: int, timeout: float) -> None:
        """Return once metadata changed after ``revision`` or ``timeout`` seconds passed."""
        await self.cache.wait_for_metadata_after(revision, timeout)

    def get_metadata(self, topics: Sequence[str]) -> ClusterMetadata:
        """Live storage nodes and the requested topics (all when empty), with per-topic errors."""
        state = self._state()
        names = list(topics) or state.topic_names()
        return ClusterMetadata(
            brokers=tuple(sorted(state.brokers.values(), key=lambda b: b.node_id)),
            topics=tuple(_lookup(state, name) for name in names),
            controller=state.controller,
            revision=state.metadata_revision,
            cluster_id=state.cluster_id,
        )

    def get_metadata_delta(self, after_revision: int, *, partitions: bool = False) -> ClusterMetadata | None:
        """What changed after ``after_revision``: the live storage nodes and controller in full,
        the topics changed since (each whole, or with ``partitions`` only their changed
        partitions where that says it) and those deleted since; None when a delta cannot say it
        (a snapshot or a change of the live nodes since), so the whole metadata is due. Costs in
        proportion to the changed topics (partitions), not to the cluster."""
        state = self._state()
        if after_revision <= 0 or not state.delta_possible_since(after_revision):
            return None
        changed = state.topics_changed_since(after_revision)
        return ClusterMetadata(
            brokers=tuple(sorted(state.brokers.values(), key=lambda b: b.node_id)),
            topics=tuple(
                _changed_lookup(state, name, after_revision, partitions)
                for name in changed
                if state.live_topic(name) is not None
            ),
            controller=state.controller,
            revision=state.metadata_revision,
            cluster_id=state.cluster_id,
            delta=True,
            base_revision=after_revision,
            removed_topics=tuple(name for name in changed if state.live_topic(name) is None),
        )

    def controller_status(self) -> ControllerStatus:
        """This coordinator's role, and the active controller as etcd last said."""
        state = self._state()
        return ControllerStatus(self.coordinator_id, self.leadership.is_active, state.controller)

    def describe_topics(self, names: Sequence[str], *, include_defaults: bool) -> list[TopicLookup]:
        """Topics with their configs (all topics when ``names`` is empty); per-topic errors."""
        state = self._state()
        lookups = [_lookup(state, name) for name in (list(names) or state.topic_names())]
        return [
            lookup
            if lookup.view is None
            else TopicLookup(
                lookup.name, lookup.view, configs=describe_configs(lookup.view.configs, include_defaults)
            )
            for lookup in lookups
        ]

    def list_topics(self) -> list[str]:
        return self._state().topic_names()

    # -- admin (active controller only) ----------------------------------------------------------

    def _controller(self) -> Controller:
        self._state()
        controller = self.leadership.controller
        if controller is None or controller.deposed.is_set():
            raise self._moved()
        return controller

    def _moved(self) -> ControllerMovedError:
        active = self.cache.state.controller
        if active is None or active.coordinator_id == self.coordinator_id:
            return ControllerMovedError(
                f"coordinator {self.coordinator_id} is not the active controller and none is elected now"
            )
        return ControllerMovedError(
            f"coordinator {self.coordinator_id} is not the active controller; the active controller is "
            f"{active.coordinator_id} at {active.address} (epoch {active.epoch})",
            active_id=active.coordinator_id,
            active_address=active.address,
        )

    def group_manager(self) -> GroupManager:
        """This term's consumer groups: the active controller's only (NOT_CONTROLLER elsewhere)."""
        self._controller()
        groups = self.leadership.groups
        if groups is None:
            raise self._moved()
        return groups

    def transaction_manager(self) -> TransactionManager:
        """This term's transaction coordinator: the active controller's only (NOT_CONTROLLER elsewhere)."""
        self._controller()
        transactions = self.leadership.transactions
        if transactions is None:
            raise self._moved()
        return transactions

    async def create_topic(self, spec: TopicSpec) -> TopicView:
        return await self._controller().create_topic(spec)

    async def delete_topic(self, name: str) -> None:
        await self._controller().delete_topic(name)

    async def alter_partition(
        self, node_id: int, changes: Sequence[IsrChange]
    ) -> list[LeaderAndIsr | errors.TributaryError]:
        return await self._controller().alter_partition(node_id, changes)

    async def controlled_shutdown(
        self, node_id: int, broker_epoch: int, wait_s: float
    ) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        return await self._controller().controlled_shutdown(node_id, broker_epoch, wait_s)

    async def elect_preferred_leaders(
        self, topics: Sequence[str], partitions: Sequence[tuple[str, int]]
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        return await self._controller().elect_preferred_leaders(topics, partitions)

    async def alter_reassignments(
        self, requests: Sequence[ReassignmentRequest], throttle_bytes_per_s: int, *, validate_only: bool
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        return await self._controller().reassignments.alter(
            requests, throttle_bytes_per_s, validate_only=validate_only
        )

    async def list_reassignments(self, topics: Sequence[str]) -> list[tuple[str, int, PartitionRecord]]:
        return self._controller().reassignments.in_progress(topics)

    # -- ACLs ---------------------------------------------------------------------------------------

    async def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Store bindings (those there already are kept as they are), through the controller."""
        controller = self._controller()
        new = [b for b in dict.fromkeys(bindings) if acl_key(b) not in self.acls.bindings]
        if len(self.acls.bindings) + len(new) > MAX_ACLS:
            raise errors.PolicyViolationError(f"the cluster may hold at most {MAX_ACLS} ACLs")
        for start in range(0, len(new), WRITE_BATCH):
            await controller._write(create_ops(new[start : start + WRITE_BATCH]))
        await controller._await_own_writes()

    def describe_acls(self, filter_: AclFilter) -> list[AclBinding]:
        self._state()
        return [binding for _, binding in self.acls.matching(filter_)]

    async def delete_acls(self, filters: Sequence[AclFilter]) -> list[AclBinding]:
        """Delete every binding any filter matches; the deleted ones."""
        controller = self._controller()
        matched = {key: binding for f in filters for key, binding in self.acls.matching(f)}
        found = list(matched)
        for start in range(0, len(found), WRITE_BATCH):
            await controller._write(delete_ops(found[start : start + WRITE_BATCH]))
        await controller._await_own_writes()
        return list(matched.values())

    # -- client quotas ------------------------------------------------------------------------------

    async def alter_client_quotas(
        self,
        alterations: Sequence[tuple[QuotaEntity, Sequence[tuple[str, float | None]]]],
        *,
        validate_only: bool = False,
    ) -> None:
        """Set and remove quota keys per entity (each entity at most once), through the
        controller; an entity left without keys is deleted. Validated as a whole first."""
        controller = self._controller()
        entities = [entity for entity, _ in alterations]
        if len(set(entities)) != len(entities):
            raise errors.InvalidRequestError("a quota entity appears twice in one alteration")
        async with self._quota_writes:
            updated = []
            for entity, changes in alterations:
                try:
                    updated.append((entity, apply_alteration(self.quotas.values_of(entity), changes)))
                except ValueError as exc:
                    raise errors.InvalidRequestError(f"quota entity {entity}: {exc}") from None
            new = sum(1 for e, values in updated if values and quota_key(e) not in self.quotas.entries)
            if len(self.quotas.entries) + new > MAX_QUOTA_ENTITIES:
                raise errors.PolicyViolationError(
                    f"the cluster may hold at most {MAX_QUOTA_ENTITIES} quota entities"
                )
            if validate_only:
                return
            for start in range(0, len(updated), WRITE_BATCH):
                ops = [
                    op for e, values in updated[start : start + WRITE_BATCH] for op in alter_ops(e, values)
                ]
                await controller._write(ops)
            await controller._await_own_writes()

    def describe_client_quotas(self, quota_filter: QuotaFilter) -> list[tuple[QuotaEntity, dict[str, float]]]:
        self._state()
        return self.quotas.matching(quota_filter)

    async def create_partitions(self, topic: str, total: int, *, validate_only: bool) -> TopicView:
        return await self._controller().create_partitions(topic, total, validate_only=validate_only)

    async def alter_topic_configs(
        self, topic: str, set_configs: Mapping[str, str], delete: Sequence[str], *, validate_only: bool
    ) -> TopicLookup:
        """Alter configs; the topic with every config (defaults included) as it is afterwards."""
        record = await self._controller().alter_topic_configs(
            topic, set_configs, delete, validate_only=validate_only
        )
        view = self.cache.state.topic_view(topic)
        if view is None:
            raise errors.UnknownTopicOrPartitionError(f"Topic '{topic}' was deleted meanwhile")
        return TopicLookup(topic, view, configs=describe_configs(record.configs, True))


def _changed_lookup(state: MetadataState, name: str, after_revision: int, partial: bool) -> TopicLookup:
    """A changed live topic in a delta: whole, or (``partial``) only its changed partitions
    when the topic itself did not change."""
    topic = state.live_topic(name)
    if partial and topic is not None:
        changed = state.changed_partitions(topic, after_revision)
        if changed is not None:
            return TopicLookup(name, state.partial_topic_view(topic, changed))
    return _lookup(state, name)


def _lookup(state: MetadataState, name: str) -> TopicLookup:
    try:
        topic_rules.ensure_valid_topic_name(name)
    except errors.InvalidTopicError as exc:
        return TopicLookup(name, error=exc)
    view = state.topic_view(name)
    if view is None:
        return TopicLookup(name, error=errors.UnknownTopicOrPartitionError(f"Topic '{name}' does not exist"))
    return TopicLookup(name, view)


def describe_configs(configs: Mapping[str, str], include_defaults: bool) -> tuple[ConfigValue, ...]:
    """The configs set on a topic, plus (``include_defaults``) every other one at its default."""
    described = []
    for name, definition in sorted(TOPIC_CONFIGS.items()):
        if name in configs:
            described.append(ConfigValue(name, configs[name], False, definition.doc))
        elif include_defaults:
            described.append(
                ConfigValue(name, format_topic_config(name, definition.default), True, definition.doc)
            )
    return tuple(described)
