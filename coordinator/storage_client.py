"""The controller's calls to storage nodes: create, delete and list partitions, replica roles
(UpdateLeaderAndIsr), list offsets, transaction markers (WriteTxnMarkers). Calls that change a
node carry the controller epoch.

One ``grpc.aio`` channel per node address, opened on first use and kept. Every call has a
deadline, so a paused or partitioned node stalls a reconcile pass for at most that long, and
failures come back as the taxonomy (:func:`services.errors.error_from_rpc`), never as raw gRPC
errors.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

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
