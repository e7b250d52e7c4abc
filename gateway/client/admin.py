"""Administration: topics (create, delete, describe, list, add partitions, alter configs),
cluster metadata, offsets, deleting records below an offset, and consumer groups (list,
describe with lag, committed offsets, reset, delete). ``AsyncAdmin`` for asyncio, ``Admin`` for
threads (same methods).

Every failure raises the typed error the gateway reported, e.g. ``TopicAlreadyExistsError``
(``TOPIC_ALREADY_EXISTS``), ``InvalidPartitionsError``, ``InvalidConfigError``,
``UnknownTopicOrPartitionError``::

    with Admin(servers="127.0.0.1:9092") as admin:
        admin.create_topics([NewTopic("activity", num_partitions=8)])
        print(admin.describe_topics(["activity"])[0].partitions)
        for p in admin.describe_consumer_group("loader").partitions:
            print(p.topic, p.partition, p.committed_offset, p.log_end_offset, p.lag)

Group resets and deletes need a group without members (``NonEmptyGroupError`` otherwise), as in
Kafka: running consumers would overwrite a reset with their next commit.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gateway.client.client import GatewayClient, client_tls, list_offsets, offset_spec
from gateway.client.credentials import client_token_source
from gateway.client.errors import TributaryError
from gateway.client.group_serde import (
    committed_from_proto,
    description_from_proto,
    listing_from_proto,
    tps_to_proto,
)
from gateway.client.io_thread import IOThread
from gateway.client.metadata import cluster_from_proto, topic_from_proto
from gateway.client.structs import (
    ClusterDescription,
    GroupDescription,
    GroupListing,
    NewPartitions,
    NewTopic,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    PartitionReassignment,
    TopicDescription,
    TopicPartition,
    TransactionDescription,
)
from services.acls import AclBinding, AclFilter
from services.clock import SYSTEM_CLOCK, Clock
from services.proto import pb
from services.quotas import QuotaEntity, QuotaFilter
from services.serde import (
    acl_filter_to_proto,
    acl_from_proto,
    acl_to_proto,
    error_from_proto,
    quota_alteration_to_proto,
    quota_entry_from_proto,
    quota_filter_to_proto,
)


def _configs(configs: Mapping[str, Any] | None) -> dict[str, str]:
    return {str(k): str(v) for k, v in (configs or {}).items()}


class AsyncAdmin:
    """Topic and cluster administration on the running event loop."""

    def __init__(
        self,
        *,
        servers: str | Sequence[str] | None = None,
        request_timeout_ms: int = 30_000,
        clock: Clock = SYSTEM_CLOCK,
        client_id: str = "tributary-admin",
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: Any = None,
    ) -> None:
        self._client = GatewayClient(
            servers,
            request_timeout_ms=request_timeout_ms,
            clock=clock,
            client_id=client_id,
            tls=client_tls(security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile),
            token_source=client_token_source(security_protocol, sasl_mechanism, sasl_oauth_token_provider),
        )

    @property
    def addresses(self) -> list[str]:
        return list(self._client.addresses)

    async def __aenter__(self) -> AsyncAdmin:
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connections."""
        await self._client.close()

    # -- topics ----------------------------------------------------------------------------

    async def create_topics(
        self, new_topics: Iterable[NewTopic], *, validate_only: bool = False
    ) -> list[TopicDescription]:
        """Create each topic; raises the first failure (topics before it are created)."""
        created = []
        for topic in new_topics:
            response = await self._client.call(
                "CreateTopic",
                pb.CreateTopicRequest(
                    name=topic.name,
                    partitions=topic.num_partitions,
                    replication_factor=topic.replication_factor,
                    configs=_configs(topic.topic_configs),
                    validate_only=validate_only,
                ),
            )
            created.append(topic_from_proto(response.topic))
        return created

    async def create_topic(
        self,
        name: str,
        num_partitions: int = 1,
        replication_factor: int = 1,
        configs: Mapping[str, Any] | None = None,
    ) -> TopicDescription:
        """Create one topic (shorthand for ``create_topics([NewTopic(...)])``)."""
        return (
            await self.create_topics(
                [NewTopic(name, num_partitions, replication_factor, dict(configs or {}))]
            )
        )[0]

    async def delete_topics(self, names: Iterable[str]) -> None:
        """Delete each topic and its data."""
        for name in names:
            await self._client.call("DeleteTopic", pb.DeleteTopicRequest(name=name))
            self._client.metadata.invalidate(name)

    async def list_topics(self) -> list[str]:
        """Every topic name, sorted."""
        response = await self._client.call("ListTopics", pb.ListTopicsRequest())
        return sorted(response.names)

    async def describe_topics(
        self, names: Iterable[str] = (), *, include_defaults: bool = False
    ) -> list[TopicDescription]:
        """Partitions, leaders, replicas and configs (every config with ``include_defaults``).

        Raises ``UnknownTopicOrPartitionError`` if a named topic does not exist.
        """
        response = await self._client.call(
            "DescribeTopics", pb.DescribeTopicsRequest(names=list(names), include_defaults=include_defaults)
        )
        descriptions = []
        for topic in response.topics:
            error = error_from_proto(topic.metadata.error) if topic.metadata.HasField("error") else None
            if error is not None:
                raise error
            configs = {e.name: e.value for e in topic.configs} if topic.configs else None
            descriptions.append(topic_from_proto(topic.metadata, configs))
        return descriptions

    async def create_partitions(
        self, new_partitions: Mapping[str, NewPartitions | int], *, validate_only: bool = False
    ) -> list[TopicDescription]:
        """Raise each topic's partition count to the given total (Kafka never shrinks a topic)."""
        results = []
        for topic, total in new_partitions.items():
            count = total.total_count if isinstance(total, NewPartitions) else int(total)
            response = await self._client.call(
                "CreatePartitions",
                pb.CreatePartitionsRequest(topic=topic, total_count=count, validate_only=validate_only),
            )
            self._client.metadata.invalidate(topic)
            results.append(topic_from_proto(response.topic))
        return results

    async def alter_topic_configs(
        self,
        topic: str,
        set: Mapping[str, Any] | None = None,
        delete: Iterable[str] = (),
        *,
        validate_only: bool = False,
    ) -> TopicDescription:
        """Set configs (Kafka names, e.g. ``{"retention.ms": 3600000}``) and reset others to default."""
        response = await self._client.call(
            "AlterTopicConfigs",
            pb.AlterTopicConfigsRequest(
                topic=topic, set=_configs(set), delete=list(delete), validate_only=validate_only
            ),
        )
        description = response.topic
        configs = {e.name: e.value for e in description.configs} if description.configs else None
        return topic_from_proto(description.metadata, configs)

    # -- cluster and offsets ---------------------------------------------------------------

    async def describe_cluster(self) -> ClusterDescription:
        """Cluster id, active controller and storage nodes."""
        return cluster_from_proto(await self._client.refresh_metadata())

    async def metadata(self, topics: Sequence[str] = ()) -> tuple[ClusterDescription, list[TopicDescription]]:
        """The cluster and its topics (all topics when none are named), from one GetMetadata."""
        response = await self._client.refresh_metadata(list(topics))
        described = [
            topic_from_proto(t)
            for t in sorted(response.topics, key=lambda t: t.name)
            if not (t.HasField("error") and t.error.reason)
        ]
        return cluster_from_proto(response), described

    async def list_offsets(
        self, specs: Mapping[TopicPartition, Any], *, isolation_level: str = "read_uncommitted"
    ) -> dict[TopicPartition, OffsetAndTimestamp]:
        """``{tp: "earliest" | "latest" | timestamp_ms}`` -> ``{tp: OffsetAndTimestamp}``.

        A timestamp with no record at or after it gives offset -1. With
        ``isolation_level="read_committed"``, "latest" is the last stable offset (where a
        read_committed consumer's reading ends). Raises the first per-partition error (e.g.
        ``UnknownTopicOrPartitionError``).
        """
        if isolation_level not in ("read_uncommitted", "read_committed"):
            raise ValueError("isolation_level must be read_uncommitted or read_committed")
        results = await list_offsets(
            self._client,
            {TopicPartition(*tp): spec for tp, spec in specs.items()},
            read_committed=isolation_level == "read_committed",
        )
        for result in results.values():
            if isinstance(result, TributaryError):
                raise result
        return results

    async def delete_records(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Delete the records of each partition below its offset (Kafka's ``deleteRecords``):
        ``{tp: offset}``, where -1 means the high watermark (every record consumers can read).
        Returns ``{tp: new log start offset}`` (Kafka's low watermark). The log start never
        moves back. Raises the first per-partition error, e.g. ``OffsetOutOfRangeError`` for an
        offset above the high watermark or ``UnknownTopicOrPartitionError`` (the other
        partitions' deletions still happen)."""
        request = pb.DeleteRecordsRequest(
            partitions=[
                pb.DeleteRecordsPartition(topic=tp[0], partition=tp[1], offset=int(offset))
                for tp, offset in offsets.items()
            ],
            timeout_ms=self._client.request_timeout_ms,
        )
        response = await self._client.call("DeleteRecords", request)
        result: dict[TopicPartition, int] = {}
        for item in response.partitions:
            if item.HasField("error") and (error := error_from_proto(item.error)) is not None:
                raise error
            result[TopicPartition(item.topic, item.partition)] = item.log_start_offset
        return result

    async def elect_leaders(
        self, topics: Iterable[str] = (), partitions: Iterable[TopicPartition] = ()
    ) -> dict[TopicPartition, TributaryError | None]:
        """Preferred leader election (Kafka's ``electLeaders`` with ``ElectionType.PREFERRED``):
        every partition of ``topics`` and every one of ``partitions`` -- naming neither, every
        partition of the cluster -- is led by its first replica again when that replica is live,
        in sync and not stopping. Returns ``{tp: None}`` for a partition now led by it, else the
        reason: ``ElectionNotNeededError`` (it led already), ``PreferredLeaderNotAvailableError``,
        ``UnknownTopicOrPartitionError``."""
        request = pb.ElectLeadersRequest(
            topics=list(topics),
            partitions=[pb.TopicPartition(topic=tp[0], partition=tp[1]) for tp in partitions],
        )
        response = await self._client.call("ElectLeaders", request)
        return {
            TopicPartition(item.topic, item.partition): (
                error_from_proto(item.error) if item.HasField("error") else None
            )
            for item in response.results
        }

    async def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition, Sequence[int] | None],
        *,
        throttle_bytes_per_second: int = 0,
        validate_only: bool = False,
    ) -> dict[TopicPartition, TributaryError | None]:
        """Move partitions to new replica lists (Kafka's ``alterPartitionReassignments``): per
        partition, the new replicas (first: the preferred leader) or None to cancel a running
        reassignment. The new replicas copy the log -- at most ``throttle_bytes_per_second`` per
        node while they catch up, if set -- join the ISR, then the removed ones are dropped and
        their copies deleted; leadership moves if the leader is removed. Returns ``{tp: None}``
        once started, else why not (``InvalidReplicaAssignmentError``,
        ``ReassignmentInProgressError``, ``UnknownTopicOrPartitionError``, ...); follow progress
        with :meth:`list_partition_reassignments`."""
        request = pb.AlterPartitionReassignmentsRequest(
            reassignments=[
                pb.ReplicaReassignment(topic=tp[0], partition=tp[1], replicas=list(replicas or ()))
                for tp, replicas in reassignments.items()
            ],
            throttle_bytes_per_second=throttle_bytes_per_second,
            validate_only=validate_only,
        )
        response = await self._client.call("AlterPartitionReassignments", request)
        return {
            TopicPartition(item.topic, item.partition): (
                error_from_proto(item.error) if item.HasField("error") else None
            )
            for item in response.results
        }

    async def list_partition_reassignments(self, topics: Iterable[str] = ()) -> list[PartitionReassignment]:
        """Reassignments in progress (of ``topics``, or all), sorted by partition."""
        response = await self._client.call(
            "ListPartitionReassignments", pb.ListPartitionReassignmentsRequest(topics=list(topics))
        )
        return sorted(
            PartitionReassignment(
                r.topic,
                r.partition,
                tuple(r.replicas),
                tuple(r.adding_replicas),
                tuple(r.removing_replicas),
                tuple(r.isr),
                r.leader,
                r.throttle_bytes_per_second,
            )
            for r in response.reassignments
        )

    # -- ACLs ------------------------------------------------------------------------------

    async def create_acls(self, bindings: Iterable[AclBinding]) -> None:
        """Add ACL bindings (Kafka's ``createAcls``); bindings there already are kept. Needs
        ALTER on the cluster when the gateway authorizes calls."""
        request = pb.CreateAclsRequest(acls=[acl_to_proto(b) for b in bindings])
        response = await self._client.call("CreateAcls", request)
        for item in response.errors:
            if item.reason and (error := error_from_proto(item)) is not None:
                raise error

    async def describe_acls(self, acl_filter: AclFilter | None = None) -> list[AclBinding]:
        """The bindings the filter matches (its None fields match anything; no filter: all)."""
        wanted = acl_filter_to_proto(acl_filter if acl_filter is not None else AclFilter())
        response = await self._client.call("DescribeAcls", pb.DescribeAclsRequest(filter=wanted))
        return [acl_from_proto(a) for a in response.acls]

    async def delete_acls(self, filters: Iterable[AclFilter]) -> list[AclBinding]:
        """Delete every binding any filter matches; returns those deleted."""
        request = pb.DeleteAclsRequest(filters=[acl_filter_to_proto(f) for f in filters])
        response = await self._client.call("DeleteAcls", request)
        return [acl_from_proto(a) for a in response.deleted]

    # -- client quotas ---------------------------------------------------------------------

    async def alter_client_quotas(
        self, alterations: Mapping[QuotaEntity, Mapping[str, float | None]], *, validate_only: bool = False
    ) -> None:
        """Set (a value) or remove (None) quota keys per entity (Kafka's ``alterClientQuotas``):
        ``{QuotaEntity(user="alice"): {"producer_byte_rate": 1_048_576}}``. Keys:
        ``producer_byte_rate``, ``consumer_byte_rate`` (bytes/s), ``request_percentage``.
        Invalid input stores nothing (InvalidRequestError naming the entity and the key). Needs
        ALTER_CONFIGS on the cluster when the gateway authorizes calls."""
        request = pb.AlterClientQuotasRequest(
            entries=[
                quota_alteration_to_proto(entity, changes.items()) for entity, changes in alterations.items()
            ],
            validate_only=validate_only,
        )
        response = await self._client.call("AlterClientQuotas", request)
        for item in response.errors:
            if item.reason and (error := error_from_proto(item)) is not None:
                raise error

    async def describe_client_quotas(
        self, quota_filter: QuotaFilter | None = None
    ) -> dict[QuotaEntity, dict[str, float]]:
        """The quota entities the filter matches, with their values (no filter: every one)."""
        request = quota_filter_to_proto(quota_filter if quota_filter is not None else QuotaFilter())
        response = await self._client.call("DescribeClientQuotas", request)
        return dict(quota_entry_from_proto(entry) for entry in response.entries)

    # -- transactions ----------------------------------------------------------------------

    async def describe_transactions(
        self, transactional_ids: Iterable[str] = (), *, states: Iterable[str] = ()
    ) -> list[TransactionDescription]:
        """The named transactional ids with their partitions (``TransactionalIdNotFoundError``
        for an unknown one), or -- naming none -- every id, optionally only those in ``states``
        (Kafka's names: ``Ongoing``, ``PrepareCommit``, ...), sorted by id."""
        request = pb.DescribeTransactionsRequest(
            transactional_ids=list(transactional_ids), states=list(states)
        )
        response = await self._client.call("DescribeTransactions", request)
        described = []
        for item in response.transactions:
            if item.HasField("error") and (error := error_from_proto(item.error)) is not None:
                raise error
            described.append(
                TransactionDescription(
                    item.transactional_id,
                    item.state,
                    item.producer_id,
                    item.producer_epoch,
                    item.transaction_timeout_ms,
                    item.start_ms,
                    item.partition_count,
                    tuple(TopicPartition(p.topic, p.partition) for p in item.partitions),
                    tuple(item.groups),
                )
            )
        return described

    # -- consumer groups -------------------------------------------------------------------

    async def list_consumer_groups(self) -> list[GroupListing]:
        """Every consumer group: id, state (Empty, Stable, PreparingRebalance), member count."""
        response = await self._client.call("ListGroups", pb.ListGroupsRequest())
        return sorted((listing_from_proto(g) for g in response.groups), key=lambda g: g.group_id)

    async def describe_consumer_group(self, group_id: str) -> GroupDescription:
        """Members with their assignment, and per partition the committed offset, log end offset,
        lag and owner. ``GroupIdNotFoundError`` if the group does not exist."""
        response = await self._client.call("DescribeGroup", pb.DescribeGroupRequest(group_id=group_id))
        return description_from_proto(response)

    async def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition] | None = None,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """The group's committed offsets (of ``partitions``, or all it has); partitions without
        one are left out."""
        request = pb.FetchCommittedOffsetsRequest(
            group_id=group_id, partitions=tps_to_proto([TopicPartition(*tp) for tp in partitions or ()])
        )
        response = await self._client.call("FetchCommittedOffsets", request)
        return _committed_offsets(response.offsets)

    async def alter_consumer_group_offsets(
        self, group_id: str, offsets: Mapping[TopicPartition, OffsetAndMetadata | int]
    ) -> None:
        """Commit ``offsets`` (the next offset to consume, with optional metadata) for a group
        without active members, as a consumer outside the group does (Kafka's
        ``alterConsumerGroupOffsets``): a tool or a batch job that keeps a group's offsets for
        lag monitoring. ``UnknownMemberIdError`` while the group has members; otherwise raises
        the first partition's error (an unknown partition, metadata too long)."""
        request = pb.CommitOffsetsRequest(
            group_id=group_id,
            member_id="",
            generation_id=-1,
            offsets=[
                pb.OffsetCommit(
                    topic=tp[0],
                    partition=tp[1],
                    offset=committed if isinstance(committed, int) else committed.offset,
                    metadata="" if isinstance(committed, int) else committed.metadata,
                )
                for tp, committed in sorted(offsets.items())
            ],
        )
        response = await self._client.call("CommitOffsets", request)
        for result in response.results:
            error = error_from_proto(result.error) if result.HasField("error") else None
            if error is not None:
                raise error

    async def reset_consumer_group_offsets(
        self,
        group_id: str,
        topics: Iterable[str] = (),
        to: str | int | Mapping[TopicPartition, int] = "earliest",
        *,
        dry_run: bool = False,
    ) -> dict[TopicPartition, OffsetAndMetadata]:
        """Move the committed offsets of every partition of ``topics`` to ``"earliest"``,
        ``"latest"`` or the first offset at or after a timestamp (an int, ms; the log end when no
        record is that recent) -- or, with a ``{TopicPartition: offset}`` mapping, to exactly
        those offsets (``topics`` is then ignored). Returns the new offsets; ``dry_run`` only
        computes them. ``NonEmptyGroupError`` while the group has members."""
        request = pb.ResetGroupOffsetsRequest(group_id=group_id, topics=list(topics), dry_run=dry_run)
        if isinstance(to, Mapping):
            request.explicit.extend(
                pb.OffsetCommit(topic=tp[0], partition=tp[1], offset=int(offset))
                for tp, offset in sorted(to.items())
            )
        else:
            request.spec.CopyFrom(offset_spec(to))
        response = await self._client.call("ResetGroupOffsets", request)
        return _committed_offsets(response.offsets)

    async def delete_consumer_group(self, group_id: str) -> None:
        """Delete a group without members, with its committed offsets."""
        await self._client.call("DeleteGroup", pb.DeleteGroupRequest(group_id=group_id))


def _committed_offsets(messages) -> dict[TopicPartition, OffsetAndMetadata]:
    """``CommittedOffset`` messages as ``{tp: OffsetAndMetadata}``; raises the first per-partition error."""
    result = {}
    for message in messages:
        tp, committed, error = committed_from_proto(message)
        if error is not None:
            raise error
        if committed is not None:
            result[tp] = committed
    return result


def _sync(name: str):
    """A blocking twin of ``AsyncAdmin.<name>`` that runs it on the I/O thread."""
    async_method = getattr(AsyncAdmin, name)

    def method(self, *args, **kwargs):
        return self._io.run(getattr(self._core, name)(*args, **kwargs))

    method.__name__ = name
    method.__qualname__ = f"Admin.{name}"
    method.__doc__ = async_method.__doc__
    return method


class Admin:
    """Thread-based administration client; the same methods as :class:`AsyncAdmin`, blocking."""

    def __init__(
        self,
        *,
        servers: str | Sequence[str] | None = None,
        request_timeout_ms: int = 30_000,
        clock: Clock = SYSTEM_CLOCK,
        client_id: str = "tributary-admin",
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauth_token_provider: Any = None,
    ) -> None:
        client_tls(security_protocol, ssl_cafile, ssl_certfile, ssl_keyfile)  # refuse bad ones here
        client_token_source(security_protocol, sasl_mechanism, sasl_oauth_token_provider)
        self._io = IOThread("tributary-admin")

        async def create() -> AsyncAdmin:
            return AsyncAdmin(
                servers=servers,
                request_timeout_ms=request_timeout_ms,
                clock=clock,
                client_id=client_id,
                security_protocol=security_protocol,
                ssl_cafile=ssl_cafile,
                ssl_certfile=ssl_certfile,
                ssl_keyfile=ssl_keyfile,
                sasl_mechanism=sasl_mechanism,
                sasl_oauth_token_provider=sasl_oauth_token_provider,
            )

        try:
            self._core = self._io.run(create())
        except BaseException:
            self._io.stop()
            raise
        self._closed = False

    @property
    def addresses(self) -> list[str]:
        return self._core.addresses

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    describe_transactions = _sync("describe_transactions")
    elect_leaders = _sync("elect_leaders")
    alter_partition_reassignments = _sync("alter_partition_reassignments")
    create_acls = _sync("create_acls")
    describe_acls = _sync("describe_acls")
    delete_acls = _sync("delete_acls")
    alter_client_quotas = _sync("alter_client_quotas")
    describe_client_quotas = _sync("describe_client_quotas")
    list_partition_reassignments = _sync("list_partition_reassignments")
    create_topics = _sync("create_topics")
    create_topic = _sync("create_topic")
    delete_topics = _sync("delete_topics")
    list_topics = _sync("list_topics")
    describe_topics = _sync("describe_topics")
    create_partitions = _sync("create_partitions")
    alter_topic_configs = _sync("alter_topic_configs")
    describe_cluster = _sync("describe_cluster")
    metadata = _sync("metadata")
    list_offsets = _sync("list_offsets")
    delete_records = _sync("delete_records")
    list_consumer_groups = _sync("list_consumer_groups")
    describe_consumer_group = _sync("describe_consumer_group")
    list_consumer_group_offsets = _sync("list_consumer_group_offsets")
    alter_consumer_group_offsets = _sync("alter_consumer_group_offsets")
    reset_consumer_group_offsets = _sync("reset_consumer_group_offsets")
    delete_consumer_group = _sync("delete_consumer_group")

    def close(self) -> None:
        """Close the connections and stop the I/O thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._io.run(self._core.close())
        finally:
            self._io.stop()
