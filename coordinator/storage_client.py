"""The controller's calls to storage nodes: create, delete and list partitions, replica roles
(UpdateLeaderAndIsr), list offsets, transaction markers (WriteTxnMarkers). Calls that change a
node carry the controller epoch.

One ``grpc.aio`` channel per node address, opened on first use and kept. Every call has a
deadline, so a paused or partitioned node stalls a reconcile pass for at most that long, and
failures come back as the taxonomy (:func:`services.errors.error_from_rpc`), never as raw gRPC
errors.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc
import grpc.aio

from coordinator.model import RegisteredBroker
from coordinator.transactions.model import TxnMarker
from services import errors
from services.grpc_server import INTERNAL_CHANNEL_OPTIONS
from services.leader_and_isr import LeaderAndIsr
from services.proto import pb, storage_grpc
from services.serde import error_from_proto, leader_and_isr_to_proto, offset_spec_to_proto
from services.tls import ChannelRotation, ClientTls, aio_channel, retire_channels

log = logging.getLogger(__name__)


#: Extra deadline per partition of a CreatePartitionBatch (a new log is a few file operations).
CREATE_DEADLINE_PER_PARTITION_S = 0.005


@dataclass(frozen=True, slots=True)
class PartitionCreation:
    """One partition of a CreatePartitionBatch: create it (idempotent; configs applied), or with
    ``must_exist`` only confirm the node holds it."""

    topic: str
    partition: int
    configs: Mapping[str, str]
    leader_epoch: int
    replicas: tuple[int, ...]
    must_exist: bool = False


class StorageNodes:
    """Partition-lifecycle RPCs to storage nodes, by :class:`~coordinator.model.RegisteredBroker`."""

    def __init__(self, *, timeout: float = 5.0, tls: ClientTls | None = None) -> None:
        self.timeout = timeout
        #: Mutual TLS to the nodes (the coordinator's member certificate); None: plaintext.
        self._tls = tls
        self._rotation = ChannelRotation(tls)
        self._stubs: dict[str, tuple[grpc.aio.Channel, storage_grpc.StorageNodeStub]] = {}

    def _stub(self, broker: RegisteredBroker) -> storage_grpc.StorageNodeStub:
        if self._rotation.rotated():  # new channels present the new certificate
            retire_channels(channel for channel, _ in self._stubs.values())
            self._stubs = {}
        entry = self._stubs.get(broker.grpc_target)
        if entry is None:
            channel = aio_channel(broker.grpc_target, self._tls, options=INTERNAL_CHANNEL_OPTIONS)
            entry = (channel, storage_grpc.StorageNodeStub(channel))
            self._stubs[broker.grpc_target] = entry
        return entry[1]

    async def create_partition(
        self,
        broker: RegisteredBroker,
        topic: str,
        partition: int,
        *,
        configs: Mapping[str, str],
        leader_epoch: int,
        replicas: Sequence[int],
        controller_epoch: int,
        must_exist: bool = False,
    ) -> None:
        """Ask ``broker`` to create (or confirm it has) a partition; idempotent on the node. With
        ``must_exist`` it only confirms (REPLICA_NOT_AVAILABLE when the log was lost)."""
        request = pb.CreatePartitionRequest(
            topic=topic,
            partition=partition,
            configs=dict(configs),
            leader_epoch=leader_epoch,
            replicas=list(replicas),
            controller_epoch=controller_epoch,
            must_exist=must_exist,
        )
        await self._call(broker, "CreatePartition", request)

    async def create_partitions(
        self, broker: RegisteredBroker, creations: Sequence[PartitionCreation], *, controller_epoch: int
    ) -> list[errors.TributaryError | None]:
        """:meth:`create_partition` for many partitions in one call: each one's outcome (None =
        held), in order. Raises when the call as a whole fails. A node without the batch call
        (an older one) gets one CreatePartition per partition."""
        request = pb.CreatePartitionBatchRequest(
            partitions=[
                pb.CreatePartitionRequest(
                    topic=c.topic,
                    partition=c.partition,
                    configs=dict(c.configs),
                    leader_epoch=c.leader_epoch,
                    replicas=list(c.replicas),
                    controller_epoch=controller_epoch,
                    must_exist=c.must_exist,
                )
                for c in creations
            ]
        )
        timeout = self.timeout + CREATE_DEADLINE_PER_PARTITION_S * len(creations)
        try:
            response = await self._stub(broker).CreatePartitionBatch(request, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return await self._create_one_by_one(broker, creations, controller_epoch)
            raise errors.error_from_rpc(exc) from exc
        results = {(r.topic, r.partition): r for r in response.partitions}
        outcomes: list[errors.TributaryError | None] = []
        for c in creations:
            result = results.get((c.topic, c.partition))
            if result is None:
                outcomes.append(errors.UnknownServerError("the storage node did not answer for it"))
            else:
                outcomes.append(error_from_proto(result.error) if result.HasField("error") else None)
        return outcomes

    async def _create_one_by_one(
        self, broker: RegisteredBroker, creations: Sequence[PartitionCreation], controller_epoch: int
    ) -> list[errors.TributaryError | None]:
        async def one(c: PartitionCreation) -> errors.TributaryError | None:
            try:
                await self.create_partition(
                    broker,
                    c.topic,
                    c.partition,
                    configs=c.configs,
                    leader_epoch=c.leader_epoch,
                    replicas=c.replicas,
                    controller_epoch=controller_epoch,
                    must_exist=c.must_exist,
                )
                return None
            except errors.TributaryError as exc:
                return exc

        return list(await asyncio.gather(*map(one, creations)))

    async def delete_partition(
        self, broker: RegisteredBroker, topic: str, partition: int, *, controller_epoch: int
    ) -> None:
        """Ask ``broker`` to delete a partition and its data; idempotent on the node."""
        request = pb.DeletePartitionRequest(
            topic=topic, partition=partition, controller_epoch=controller_epoch
        )
        await self._call(broker, "DeletePartition", request)

    async def update_leader_and_isr(
        self,
        broker: RegisteredBroker,
        *,
        controller_epoch: int,
        states: Sequence[LeaderAndIsr],
        leaders: Sequence[RegisteredBroker],
        topic_configs: Mapping[str, Mapping[str, str]],
    ) -> dict[tuple[str, int], errors.TributaryError | None]:
        """Tell ``broker`` its roles; the per-partition outcome (None = applied)."""
        request = pb.UpdateLeaderAndIsrRequest(
            controller_epoch=controller_epoch,
            partitions=[leader_and_isr_to_proto(s) for s in states],
            leaders=[
                pb.ReplicaEndpoint(node_id=b.node_id, host=b.host, fetch_port=b.fetch_port) for b in leaders
            ],
            topic_configs={t: pb.TopicConfigs(configs=dict(c)) for t, c in topic_configs.items()},
        )
        response = await self._call(broker, "UpdateLeaderAndIsr", request)
        return {
            (r.topic, r.partition): error_from_proto(r.error) if r.HasField("error") else None
            for r in response.partitions
        }

    async def local_partitions(self, broker: RegisteredBroker) -> list[tuple[str, int]]:
        """Every partition ``broker`` holds on disk."""
        response = await self._call(broker, "DescribePartitions", pb.DescribePartitionsRequest())
        return [(p.topic, p.partition) for p in response.partitions]

    async def list_offsets(
        self,
        broker: RegisteredBroker,
        queries: Sequence[tuple[str, int, int]],
    ) -> list[tuple[str, int, int, errors.TributaryError | None]]:
        """Offsets of partitions ``broker`` leads: each query is (topic, partition, timestamp) with
        Kafka's convention (-2 earliest, -1 latest / high watermark, else the first offset at or
        after that timestamp, -1 when there is none). Per-partition errors are returned, not raised."""
        request = pb.ListPartitionOffsetsRequest(
            partitions=[
                pb.PartitionOffsetQuery(
                    topic=topic, partition=partition, spec=offset_spec_to_proto(timestamp)
                )
                for topic, partition, timestamp in queries
            ]
        )
        response = await self._call(broker, "ListPartitionOffsets", request)
        return [
            (r.topic, r.partition, r.offset, error_from_proto(r.error) if r.HasField("error") else None)
            for r in response.partitions
        ]

    async def write_txn_markers(
        self, broker: RegisteredBroker, markers: Sequence[TxnMarker]
    ) -> dict[int, dict[tuple[str, int], errors.TributaryError | None]]:
        """Ask ``broker`` to append COMMIT / ABORT markers to partitions it leads: per producer id,
        the per-partition outcome (None = written). A partition missing from the answer was not."""
        request = pb.WriteTxnMarkersRequest(
            markers=[
                pb.TxnMarker(
                    producer_id=m.producer_id,
                    producer_epoch=m.producer_epoch,
                    commit=m.commit,
                    coordinator_epoch=m.coordinator_epoch,
                    partitions=[pb.TopicPartition(topic=t, partition=p) for t, p in m.partitions],
                )
                for m in markers
            ]
        )
        response = await self._call(broker, "WriteTxnMarkers", request)
        return {
            answer.producer_id: {
                (r.topic, r.partition): error_from_proto(r.error) if r.HasField("error") else None
                for r in answer.results
            }
            for answer in response.markers
        }

    async def _call(self, broker: RegisteredBroker, method: str, request):
        rpc = getattr(self._stub(broker), method)
        try:
            return await rpc(request, timeout=self.timeout)
        except grpc.aio.AioRpcError as exc:
            raise errors.error_from_rpc(exc) from exc

    async def close(self) -> None:
        entries, self._stubs = list(self._stubs.values()), {}
        for channel, _ in entries:
            await channel.close()
