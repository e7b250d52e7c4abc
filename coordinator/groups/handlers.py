"""What the group RPCs do, as plain methods over domain values (no gRPC in here).

Groups live in the active controller. ``locate`` returns this term's
:class:`~coordinator.groups.manager.GroupManager`, or raises NOT_CONTROLLER naming the active
controller (on a standby: the servicer then forwards the call there), or
COORDINATOR_NOT_AVAILABLE while etcd is unreachable. Requests are validated here before they
reach the manager.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from coordinator.groups import rules
from coordinator.groups.manager import GroupManager
from coordinator.groups.model import (
    CommitParams,
    CommittedOffset,
    GroupDescription,
    GroupListing,
    HeartbeatParams,
    JoinParams,
    MemberAssignment,
    PartitionResult,
    ResetSpec,
    ensure_valid_subscription,
)
from services.topic_partition import TopicPartition


class GroupHandlers:
    """The Coordinator service's group operations, on the active controller's group manager."""

    def __init__(self, locate: Callable[[], GroupManager]) -> None:
        self._locate = locate

    def _groups(self, group_id: str | None = None) -> GroupManager:
        if group_id is not None:
            rules.ensure_valid_group_id(group_id)
        return self._locate()

    async def join(self, params: JoinParams) -> MemberAssignment:
        manager = self._groups(params.group_id)
        if params.subscription.pattern:  # compiling may take ~0.2 s for the largest patterns
            await asyncio.to_thread(ensure_valid_subscription, params.subscription)
        else:
            ensure_valid_subscription(params.subscription)
        rules.ensure_valid_poll_interval(params.max_poll_interval_ms)
        return await manager.join(params)

    async def heartbeat(self, params: HeartbeatParams) -> MemberAssignment:
        return await self._groups(params.group_id).heartbeat(params)

    async def leave(self, group_id: str, member_id: str, instance_id: str) -> None:
        await self._groups(group_id).leave(group_id, member_id, instance_id)

    async def commit(self, params: CommitParams) -> list[PartitionResult]:
        return await self._groups(params.group_id).commits.commit(params)

    async def fetch_offsets(
        self, group_id: str, partitions: Sequence[TopicPartition]
    ) -> list[CommittedOffset]:
        return await self._groups(group_id).admin.fetch_offsets(group_id, partitions)

    async def list_groups(self) -> list[GroupListing]:
        return await self._groups().admin.list_groups()

    async def describe(self, group_id: str) -> GroupDescription:
        return await self._groups(group_id).admin.describe(group_id)

    async def reset_offsets(
        self, group_id: str, topics: Sequence[str], spec: ResetSpec, *, dry_run: bool
    ) -> list[CommittedOffset]:
        return await self._groups(group_id).admin.reset_offsets(group_id, topics, spec, dry_run=dry_run)

    async def delete_group(self, group_id: str) -> None:
        await self._groups(group_id).admin.delete_group(group_id)
