"""The controller's partition creates against a storage node without ``CreatePartitionBatch``
(an older node during a rolling upgrade): over a real gRPC server on loopback that implements
only ``CreatePartition``, the batch falls back to one call per partition and reports each
partition's own outcome."""

from __future__ import annotations

import asyncio

import grpc

from coordinator.model import RegisteredBroker
from coordinator.storage_client import PartitionCreation, StorageNodes
from services import errors
from services.proto import pb, storage_grpc


class OlderNode(storage_grpc.StorageNodeServicer):
    """Only CreatePartition (the generated base answers UNIMPLEMENTED to everything else);
    refuses ``refused`` as a node whose log was lost does."""

    def __init__(self, refused: tuple[str, int]) -> None:
        self.created: list[tuple[str, int, int, bool]] = []
        self.refused = refused

    async def CreatePartition(self, request, context):
        if (request.topic, request.partition) == self.refused:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "REPLICA_NOT_AVAILABLE: the log is gone")
        self.created.append((request.topic, request.partition, request.controller_epoch, request.must_exist))
        return pb.CreatePartitionResponse()


async def _create_on_an_older_node() -> tuple[list[errors.TributaryError | None], OlderNode]:
    node = OlderNode(refused=("t", 2))
    server = grpc.aio.server()
    storage_grpc.add_StorageNodeServicer_to_server(node, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    nodes = StorageNodes(timeout=5.0)
    try:
        creations = [
            PartitionCreation(
                "t", p, {"retention.ms": "1000"}, leader_epoch=0, replicas=(1,), must_exist=p == 2
            )
            for p in range(4)
        ]
        broker = RegisteredBroker(node_id=1, host="127.0.0.1", grpc_port=port)
        outcomes = await nodes.create_partitions(broker, creations, controller_epoch=7)
    finally:
        await nodes.close()
        await server.stop(None)
    return outcomes, node


def test_a_batch_to_a_node_without_the_batch_call_is_created_one_by_one():
    outcomes, node = asyncio.run(_create_on_an_older_node())
    assert sorted(node.created) == [("t", 0, 7, False), ("t", 1, 7, False), ("t", 3, 7, False)]
    assert [o is None for o in outcomes] == [True, True, False, True]
    refused = outcomes[2]
    assert isinstance(refused, errors.TributaryError) and "the log is gone" in str(refused)
