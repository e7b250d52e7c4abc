"""The Coordinator gRPC servicer: translation between protobuf and :mod:`coordinator.handlers`.

Each RPC decodes, calls one handler, encodes; errors are mapped once by ``translate_errors``.
Admin, group and transaction RPCs additionally forward to the active controller when this
coordinator is a standby (:mod:`coordinator.redirect`): consumer groups and the transaction
coordinator live in the active controller (:mod:`coordinator.groups`,
:mod:`coordinator.transactions`).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from typing import Any

from coordinator import serde
from coordinator.groups import serde as group_serde
from coordinator.groups.handlers import GroupHandlers
from coordinator.handlers import CoordinatorHandlers
from coordinator.isr_changes import IsrChange
from coordinator.reassignment import ReassignmentRequest
from coordinator.redirect import ControllerMovedError, Forwarder
from coordinator.transactions import serde as txn_serde
from coordinator.transactions.handlers import TransactionHandlers
from coordinator.transactions.offload import off_loop_if_large
from coordinator.watched_keys import WatchedKeys
from services import errors
from services.acls import AclFilter
from services.grpc_server import translate_errors
from services.proto import coordinator_grpc, pb
from services.quotas import QuotaFilter
from services.serde import (
    acl_filter_from_proto,
    acl_to_proto,
    error_to_proto,
    leader_and_isr_to_proto,
    quota_alteration_from_proto,
    quota_entry_to_proto,
    quota_filter_from_proto,
)
from services.serde import acl_from_proto as serde_acl_from_proto

#: A watch re-checks etcd health at least this often even when nothing changes.
WATCH_HEARTBEAT_S = 5.0
#: The longest one ControlledShutdown waits for its moves (and its default): the node asks again.
_CONTROLLED_SHUTDOWN_WAIT_MS = 10_000


async def _snapshots(cache: WatchedKeys, snapshot: Callable[[int], Any]) -> AsyncIterator[Any]:
    """``snapshot(version)`` of a watched set now, then after every change; a quiet stream still
    answers within WATCH_HEARTBEAT_S of a change (a wake-up lost to a race is only late)."""
    sent = -1
    while True:
        version = cache.version
        if version != sent:
            yield snapshot(version)
            sent = version
        await cache.wait_changed(version, timeout=WATCH_HEARTBEAT_S)


class _RevisionMemo:
    """Encoded answers kept while the etcd revision they were built at is current.

    Building the metadata of thousands of partitions costs milliseconds of Python per request;
    between two metadata changes every answer to the same question is identical.
    """

    def __init__(self, max_entries: int = 256) -> None:
        self._revision = -1
        self._entries: dict = {}
        self._max_entries = max_entries

    def get_or_build(self, revision: int, key, build):
        if revision != self._revision:
            self._revision, self._entries = revision, {}
        answer = self._entries.get(key)
        if answer is None:
            answer = build()
            if len(self._entries) < self._max_entries:
                self._entries[key] = answer
        return answer


def _admin(method):
    """An admin RPC: on a standby, forward the request to the active controller."""
    name = method.__name__

    @functools.wraps(method)
    async def forwarding(self, request, context):
        try:
            return await method(self, request, context)
        except ControllerMovedError as moved:
            return await self._forwarder.forward(moved, name, request, context)

    return translate_errors(forwarding)


class CoordinatorServicer(coordinator_grpc.CoordinatorServicer):
    def __init__(
        self,
        handlers: CoordinatorHandlers,
        forwarder: Forwarder,
        groups: GroupHandlers,
        transactions: TransactionHandlers,
    ) -> None:
        self._handlers = handlers
        self._forwarder = forwarder
        self._groups = groups
        self._transactions = transactions
        self._metadata_memo = _RevisionMemo()

    @translate_errors
    async def GetMetadata(self, request, context):
        topics = tuple(request.topics)
        return self._metadata_memo.get_or_build(
            self._handlers.metadata_revision(),
            topics,
            lambda: serde.metadata_to_proto(self._handlers.get_metadata(topics)),
        )

    @translate_errors
    async def WatchMetadata(self, request, context):
        """The whole metadata now, then again after every change (gateways' routing caches).

        A watcher that accepts deltas gets the whole metadata first and then, while a delta can
        say what changed (:meth:`CoordinatorHandlers.get_metadata_delta`), only the changed
        topics: with tens of thousands of partitions a create no longer re-sends, re-encodes
        and re-parses every partition of the cluster on every coordinator and gateway. One that
        also accepts partition deltas gets, of a topic whose own key did not change, only the
        changed partitions: a restarted node's partitions re-elected 100 at a time re-encoded
        their whole 10,000-partition topic each time, most of the controller's time.

        The stream ends with UNAVAILABLE when etcd cannot vouch for the cache; the caller
        reconnects (to this or another coordinator) and gets a fresh snapshot.
        """
        sent = request.after_revision
        deltas = request.accept_deltas
        partitions = deltas and request.accept_partition_deltas
        whole_sent = False
        while True:
            revision = self._handlers.metadata_revision()
            if revision > sent:
                yield self._watch_answer(revision, sent if deltas and whole_sent else 0, partitions)
                sent, whole_sent = revision, True
            await self._handlers.wait_for_metadata_after(sent, timeout=WATCH_HEARTBEAT_S)

    def _watch_answer(self, revision: int, after: int, partitions: bool = False):
        """The delta since ``after`` (0: none wanted; ``partitions``: of changed partitions
        where it can be) when one can be given, else everything."""
        if after > 0:
            delta = self._metadata_memo.get_or_build(
                revision, ("delta", after, partitions), lambda: self._encoded_delta(after, partitions)
            )
            if delta is not None:
                return delta
        return self._metadata_memo.get_or_build(
            revision, (), lambda: serde.metadata_to_proto(self._handlers.get_metadata(()))
        )

    def _encoded_delta(self, after: int, partitions: bool):
        delta = self._handlers.get_metadata_delta(after, partitions=partitions)
        return None if delta is None else serde.metadata_to_proto(delta)

    @translate_errors
    async def GetControllerInfo(self, request, context):
        return serde.controller_status_to_proto(self._handlers.controller_status())

    @translate_errors
    async def DescribeTopics(self, request, context):
        lookups = self._handlers.describe_topics(
            list(request.names), include_defaults=request.include_defaults
        )
        return pb.DescribeTopicsResponse(topics=[serde.description_to_proto(t) for t in lookups])

    @translate_errors
    async def ListTopics(self, request, context):
        return pb.ListTopicsResponse(names=self._handlers.list_topics())

    @_admin
    async def CreateTopic(self, request, context):
        view = await self._handlers.create_topic(serde.topic_spec_from_proto(request))
        # A topic of 10,000 partitions takes ~60 ms to encode: not on the event loop.
        return pb.CreateTopicResponse(topic=await asyncio.to_thread(serde.topic_to_proto, view))

    @_admin
    async def DeleteTopic(self, request, context):
        await self._handlers.delete_topic(request.name)
        return pb.DeleteTopicResponse()

    @_admin
    async def CreatePartitions(self, request, context):
        view = await self._handlers.create_partitions(
            request.topic, request.total_count, validate_only=request.validate_only
        )
        return pb.CreatePartitionsResponse(topic=await asyncio.to_thread(serde.topic_to_proto, view))

    @_admin
    async def AlterPartition(self, request, context):
        changes = [
            IsrChange(c.topic, c.partition, c.leader_epoch, c.partition_version, tuple(c.new_isr))
            for c in request.partitions
        ]
        outcomes = await self._handlers.alter_partition(request.node_id, changes)
        results = []
        for change, outcome in zip(changes, outcomes):
            if isinstance(outcome, errors.TributaryError):
                results.append(
                    pb.AlterPartitionResult(
                        topic=change.topic, partition=change.partition, error=error_to_proto(outcome)
                    )
                )
            else:
                results.append(
                    pb.AlterPartitionResult(
                        topic=change.topic, partition=change.partition, state=leader_and_isr_to_proto(outcome)
                    )
                )
        return pb.AlterPartitionResponse(partitions=results)

    @_admin
    async def ControlledShutdown(self, request, context):
        wait_s = (request.wait_ms or _CONTROLLED_SHUTDOWN_WAIT_MS) / 1000.0
        remaining, kept = await self._handlers.controlled_shutdown(
            request.node_id, request.broker_epoch, min(wait_s, _CONTROLLED_SHUTDOWN_WAIT_MS / 1000.0)
        )
        return pb.ControlledShutdownResponse(
            remaining=[pb.TopicPartition(topic=t, partition=p) for t, p in remaining],
            kept=[pb.TopicPartition(topic=t, partition=p) for t, p in kept],
        )

    @_admin
    async def ElectLeaders(self, request, context):
        results = await self._handlers.elect_preferred_leaders(
            list(request.topics), [(tp.topic, tp.partition) for tp in request.partitions]
        )
        return pb.ElectLeadersResponse(
            results=[
                pb.ElectLeadersResult(topic=t, partition=p, error=error_to_proto(error) if error else None)
                for (t, p), error in results.items()
            ]
        )

    @_admin
    async def AlterPartitionReassignments(self, request, context):
        requests = [
            ReassignmentRequest(r.topic, r.partition, tuple(r.replicas)) for r in request.reassignments
        ]
        results = await self._handlers.alter_reassignments(
            requests, request.throttle_bytes_per_second, validate_only=request.validate_only
        )
        return pb.AlterPartitionReassignmentsResponse(
            results=[
                pb.AlterPartitionReassignmentsResult(
                    topic=t, partition=p, error=error_to_proto(error) if error else None
                )
                for (t, p), error in results.items()
            ]
        )

    @_admin
    async def ListPartitionReassignments(self, request, context):
        entries = await self._handlers.list_reassignments(list(request.topics))
        return pb.ListPartitionReassignmentsResponse(
            reassignments=[
                pb.PartitionReassignment(
                    topic=t,
                    partition=p,
                    replicas=list(r.replicas),
                    adding_replicas=list(r.adding),
                    removing_replicas=list(r.removing),
                    isr=list(r.isr),
                    leader=r.leader,
                    throttle_bytes_per_second=r.throttle_bytes_per_s,
                )
                for t, p, r in entries
            ]
        )

    @_admin
    async def CreateAcls(self, request, context):
        bindings = [serde_acl_from_proto(a) for a in request.acls]
        await self._handlers.create_acls(bindings)
        return pb.CreateAclsResponse(errors=[pb.Error() for _ in bindings])

    @translate_errors
    async def DescribeAcls(self, request, context):
        found = self._handlers.describe_acls(acl_filter_from_proto(request.filter))
        return pb.DescribeAclsResponse(acls=[acl_to_proto(b) for b in found])

    @_admin
    async def DeleteAcls(self, request, context):
        deleted = await self._handlers.delete_acls([acl_filter_from_proto(f) for f in request.filters])
        return pb.DeleteAclsResponse(deleted=[acl_to_proto(b) for b in deleted])

    @translate_errors
    async def WatchAcls(self, request, context):
        """Every ACL now, then again after every change (the gateways' authorizers)."""

        def snapshot(version: int):
            bindings = self._handlers.describe_acls(AclFilter())  # refuses while the cache is not loaded
            return pb.AclSnapshot(acls=[acl_to_proto(b) for b in bindings], version=version)

        async for answer in _snapshots(self._handlers.acls, snapshot):
            yield answer

    @_admin
    async def AlterClientQuotas(self, request, context):
        alterations = [quota_alteration_from_proto(entry) for entry in request.entries]
        await self._handlers.alter_client_quotas(alterations, validate_only=request.validate_only)
        return pb.AlterClientQuotasResponse(errors=[pb.Error() for _ in alterations])

    @translate_errors
    async def DescribeClientQuotas(self, request, context):
        found = self._handlers.describe_client_quotas(quota_filter_from_proto(request))
        return pb.DescribeClientQuotasResponse(entries=[quota_entry_to_proto(e, v) for e, v in found])

    @translate_errors
    async def WatchClientQuotas(self, request, context):
        """Every quota entity now, then again after every change (the gateways' quota managers)."""

        def snapshot(version: int):
            entries = self._handlers.describe_client_quotas(QuotaFilter())  # refuses until loaded
            return pb.ClientQuotaSnapshot(
                entries=[quota_entry_to_proto(e, v) for e, v in entries], version=version
            )

        async for answer in _snapshots(self._handlers.quotas, snapshot):
            yield answer

    @_admin
    async def AlterTopicConfigs(self, request, context):
        lookup = await self._handlers.alter_topic_configs(
            request.topic, dict(request.set), list(request.delete), validate_only=request.validate_only
        )
        return pb.AlterTopicConfigsResponse(topic=serde.description_to_proto(lookup))

    # ---- consumer groups (active controller; standbys forward) ----------------------------------

    @_admin
    async def JoinGroup(self, request, context):
        answer = await self._groups.join(group_serde.join_from_proto(request, _peer_host(context)))
        return group_serde.join_to_proto(answer)

    @_admin
    async def Heartbeat(self, request, context):
        answer = await self._groups.heartbeat(group_serde.heartbeat_from_proto(request))
        return group_serde.heartbeat_to_proto(answer)

    @_admin
    async def LeaveGroup(self, request, context):
        await self._groups.leave(request.group_id, request.member_id, request.group_instance_id)
        return pb.LeaveGroupResponse()

    @_admin
    async def CommitOffsets(self, request, context):
        results = await self._groups.commit(group_serde.commit_from_proto(request))
        return group_serde.commit_results_to_proto(results)

    @_admin
    async def FetchCommittedOffsets(self, request, context):
        offsets = await self._groups.fetch_offsets(
            request.group_id, group_serde.tps_from_proto(request.partitions)
        )
        return pb.FetchCommittedOffsetsResponse(offsets=[group_serde.committed_to_proto(o) for o in offsets])

    @_admin
    async def ListGroups(self, request, context):
        listings = await self._groups.list_groups()
        return pb.ListGroupsResponse(groups=[group_serde.listing_to_proto(g) for g in listings])

    @_admin
    async def DescribeGroup(self, request, context):
        return group_serde.description_to_proto(await self._groups.describe(request.group_id))

    @_admin
    async def ResetGroupOffsets(self, request, context):
        offsets = await self._groups.reset_offsets(
            request.group_id,
            list(request.topics),
            group_serde.reset_spec_from_proto(request),
            dry_run=request.dry_run,
        )
        return pb.ResetGroupOffsetsResponse(offsets=[group_serde.committed_to_proto(o) for o in offsets])

    @_admin
    async def DeleteGroup(self, request, context):
        await self._groups.delete_group(request.group_id)
        return pb.DeleteGroupResponse()

    # ---- transactions (active controller; standbys forward) ---------------------------------------

    @_admin
    async def InitProducerId(self, request, context):
        answer = await self._transactions.init_producer_id(txn_serde.init_from_proto(request))
        return txn_serde.init_to_proto(answer)

    @_admin
    async def AddPartitionsToTxn(self, request, context):
        # A request may name hundreds of thousands of partitions: decoded and encoded off the loop.
        size = len(request.partitions)
        partitions = await off_loop_if_large(size, txn_serde.partitions_from_proto, request.partitions)
        results = await self._transactions.add_partitions(txn_serde.producer_from_proto(request), partitions)
        return pb.AddPartitionsToTxnResponse(
            results=await off_loop_if_large(size, txn_serde.results_to_proto, results)
        )

    @_admin
    async def AddOffsetsToTxn(self, request, context):
        await self._transactions.add_offsets(txn_serde.producer_from_proto(request), request.group_id)
        return pb.AddOffsetsToTxnResponse()

    @_admin
    async def TxnOffsetCommit(self, request, context):
        size = len(request.offsets)
        params = await off_loop_if_large(size, txn_serde.txn_offset_commit_from_proto, request)
        results = await self._transactions.txn_offset_commit(params)
        return pb.TxnOffsetCommitResponse(
            results=await off_loop_if_large(size, txn_serde.results_to_proto, results)
        )

    @_admin
    async def DescribeTransactions(self, request, context):
        named = list(request.transactional_ids)
        described = await self._transactions.describe(named, list(request.states))
        return pb.DescribeTransactionsResponse(
            transactions=await off_loop_if_large(
                len(described),
                lambda: [txn_serde.description_to_proto(d, with_partitions=bool(named)) for d in described],
            )
        )

    @_admin
    async def VerifyTxnPartitions(self, request, context):
        size = len(request.partitions)
        partitions = await off_loop_if_large(size, txn_serde.partitions_from_proto, request.partitions)
        results = await self._transactions.verify_partitions(
            request.producer_id, request.producer_epoch, partitions
        )
        return pb.VerifyTxnPartitionsResponse(
            results=await off_loop_if_large(size, txn_serde.results_to_proto, results)
        )

    @_admin
    async def EndTxn(self, request, context):
        await self._transactions.end_txn(txn_serde.producer_from_proto(request), request.commit)
        return pb.EndTxnResponse()


def _peer_host(context) -> str:
    """The caller's host as gRPC names it (``ipv4:127.0.0.1:5555`` -> ``127.0.0.1``): the
    gateway's or forwarding coordinator's address when the call came through one."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        host, _, _port = rest.rpartition(":")
        return host.strip("[]") or rest
    return peer
