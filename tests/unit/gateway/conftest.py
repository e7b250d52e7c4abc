"""In-process fakes of a coordinator and storage nodes, to test the gateway's I/O logic fast.

They speak the real wire contracts (the Coordinator and StorageNode gRPC services, the fetch-port
framing of ``services.fetchport.protocol``) over loopback, with in-memory logs. They are not the
real services: the integration tests in ``tests/integration/gateway`` run those. What the fakes
add is control -- kill a node, move a leader, delay metadata -- so retries, metadata refreshes
and long polls can be checked deterministically and in milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

import grpc
import pytest

from gateway.server.config import GatewayConfig
from gateway.server.service import GatewayService
from services import errors
from services.fetchport import protocol
from services.grpc_server import GrpcServer, ServiceRegistration, create_server, translate_errors
from services.proto import COORDINATOR_SERVICE, STORAGE_SERVICE, coordinator_grpc, pb, storage_grpc
from services.records import iter_batches, set_base_offset
from services.serde import error_to_proto

# ---- storage node -----------------------------------------------------------------------------


@dataclass
class FakeLog:
    """One partition: concatenated batches with their (base offset, position) for lookups."""

    max_message_bytes: int = 1_048_588
    data: bytearray = field(default_factory=bytearray)
    index: list[tuple[int, int, int]] = field(default_factory=list)  # (base, last, position)
    next_offset: int = 0
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def append(self, payload: bytes) -> tuple[int, int, int]:
        batches = list(iter_batches(payload))
        for batch in batches:
            batch.validate()
            if batch.size_in_bytes > self.max_message_bytes:
                raise errors.RecordTooLargeError(
                    f"batch of {batch.size_in_bytes} bytes exceeds max.message.bytes {self.max_message_bytes}"
                )
        if not batches:
            raise errors.CorruptRecordError("no batches")
        base = self.next_offset
        count = 0
        for batch in batches:
            buf = bytearray(batch.buffer)
            set_base_offset(buf, self.next_offset)
            self.index.append((self.next_offset, self.next_offset + batch.last_offset_delta, len(self.data)))
            self.data += buf
            self.next_offset += batch.last_offset_delta + 1
            count += batch.record_count
        self.changed.set()
        self.changed = asyncio.Event()
        return base, self.next_offset - 1, count

    def read(self, offset: int, max_bytes: int) -> bytes:
        if offset < 0 or offset > self.next_offset:
            raise errors.OffsetOutOfRangeError(f"offset {offset} is outside [0, {self.next_offset}]")
        start = next((pos for base, last, pos in self.index if last >= offset), None)
        if start is None:
            return b""
        first_end = next((p for _, _, p in self.index if p > start), len(self.data))
        end = max(first_end, min(len(self.data), start + max_bytes))
        return bytes(self.data[start:end])  # may end in a partial batch, as Kafka's can


class FakeStorageServicer(storage_grpc.StorageNodeServicer):
    def __init__(self, node: FakeStorageNode) -> None:
        self._node = node

    @translate_errors
    async def Append(self, request, context):
        self._node.append_calls += 1
        if self._node.append_delay:
            await asyncio.sleep(self._node.append_delay)
        results = []
        for p in request.partitions:
            try:
                log = self._node.log(p.topic, p.partition)
                base, last, count = log.append(p.record_batches)
                results.append(
                    pb.PartitionAppendResult(
                        topic=p.topic,
                        partition=p.partition,
                        base_offset=base,
                        last_offset=last,
                        log_append_time=-1,
                        log_start_offset=0,
                        record_count=count,
                    )
                )
            except errors.TributaryError as exc:
                results.append(
                    pb.PartitionAppendResult(topic=p.topic, partition=p.partition, error=error_to_proto(exc))
                )
        return pb.AppendResponse(partitions=results)

    @translate_errors
    async def ListPartitionOffsets(self, request, context):
        results = []
        for q in request.partitions:
            try:
                log = self._node.log(q.topic, q.partition)
            except errors.TributaryError as exc:
                results.append(
                    pb.PartitionOffsetResult(topic=q.topic, partition=q.partition, error=error_to_proto(exc))
                )
                continue
            offset = 0 if q.spec.WhichOneof("spec") == "earliest" else log.next_offset
            results.append(
                pb.PartitionOffsetResult(topic=q.topic, partition=q.partition, offset=offset, timestamp=-1)
            )
        return pb.ListPartitionOffsetsResponse(partitions=results)


class FakeStorageNode:
    """A storage node: a gRPC StorageNode service and a fetch port over in-memory logs."""

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.logs: dict[tuple[str, int], FakeLog] = {}
        self.grpc: GrpcServer | None = None
        self.fetch_server: asyncio.AbstractServer | None = None
        self.fetch_port = 0
        self.append_calls = 0
        self.fetch_requests: list[protocol.FetchRequest] = []
        self.append_delay = 0.0
        self._connections: set[asyncio.Task] = set()

    def log(self, topic: str, partition: int) -> FakeLog:
        log = self.logs.get((topic, partition))
        if log is None:
            raise errors.NotLeaderOrFollowerError(f"node {self.node_id} does not lead {topic}-{partition}")
        return log

    async def start(self) -> None:
        self.grpc = await create_server(
            "127.0.0.1:0",
            [
                ServiceRegistration(
                    storage_grpc.add_StorageNodeServicer_to_server, FakeStorageServicer(self), STORAGE_SERVICE
                )
            ],
        )
        self.fetch_server = await asyncio.start_server(self._serve_connection, "127.0.0.1", 0)
        self.fetch_port = self.fetch_server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.grpc is not None and self.fetch_server is not None, "started"
        await self.grpc.server.stop(0)
        self.fetch_server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self.fetch_server.wait_closed()

    def broker(self):
        assert self.grpc is not None, "started"
        return pb.BrokerInfo(
            node_id=self.node_id, host="127.0.0.1", grpc_port=self.grpc.port, fetch_port=self.fetch_port
        )

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None  # a connection handler runs as a task
        self._connections.add(task)
        try:
            while True:
                (size,) = protocol.SIZE.unpack(await reader.readexactly(4))
                try:
                    request = protocol.decode_request_body(await reader.readexactly(size))
                except errors.TributaryError as exc:
                    # As a node that speaks only version 0 answers frames it does not know
                    # (version-1 multi-partition fetches among them): a refusal, then close.
                    writer.write(protocol.encode_response_header(-1, error=exc))
                    await writer.drain()
                    return
                self.fetch_requests.append(request)
                writer.write(await self._answer(request))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._connections.discard(asyncio.current_task())
            writer.close()

    async def _answer(self, request: protocol.FetchRequest) -> bytes:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + request.max_wait_ms / 1000
        while True:
            try:
                log = self.log(request.topic, request.partition)
                data = log.read(request.offset, request.max_bytes)
            except errors.TributaryError as exc:
                return protocol.encode_response_header(request.correlation_id, error=exc)
            remaining = deadline - loop.time()
            if len(data) >= max(request.min_bytes, 1) or remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(log.changed.wait(), remaining)
        header = protocol.encode_response_header(
            request.correlation_id,
            high_watermark=log.next_offset,
            log_start_offset=0,
            log_end_offset=log.next_offset,
            records_length=len(data),
        )
        return header + data


# ---- coordinator ------------------------------------------------------------------------------


class FakeCoordinatorServicer(coordinator_grpc.CoordinatorServicer):
    def __init__(self, cluster: FakeCluster) -> None:
        self._cluster = cluster

    async def GetMetadata(self, request, context):
        self._cluster.metadata_calls += 1
        return self._cluster.metadata()

    async def WatchMetadata(self, request, context):
        if not self._cluster.watch_supported:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no watch here")
        while True:
            changed = self._cluster.changed
            yield self._cluster.metadata()
            await changed.wait()

    @translate_errors
    async def CreateTopic(self, request, context):
        if request.name in self._cluster.topics:
            raise errors.TopicAlreadyExistsError(f"topic {request.name!r} already exists")
        self._cluster.create_topic(request.name, request.partitions, dict(request.configs))
        return pb.CreateTopicResponse(topic=self._cluster.topic_metadata(request.name))

    @translate_errors
    async def ListTopics(self, request, context):
        if self._cluster.not_controller_redirect is not None:
            await context.abort_with_status(_not_controller_status(self._cluster.not_controller_redirect))
        return pb.ListTopicsResponse(names=sorted(self._cluster.topics))


def _not_controller_status(redirect: str):
    status = errors.to_status(errors.NotControllerError("not the controller"))

    class _Status(grpc.Status):
        code = status.code
        details = status.details
        trailing_metadata = (*status.trailing_metadata, ("x-tributary-controller", redirect))

    return _Status()


@dataclass
class FakeTopic:
    partitions: int
    configs: dict[str, str]
    leaders: dict[int, int]


class FakeCluster:
    """A fake coordinator, ``node_count`` fake storage nodes and a real in-process gateway."""

    def __init__(self, node_count: int = 2) -> None:
        self.nodes = {i: FakeStorageNode(i) for i in range(node_count)}
        self.topics: dict[str, FakeTopic] = {}
        self.revision = 1
        self.changed = asyncio.Event()
        self.watch_supported = True
        self.metadata_calls = 0
        self.hidden_nodes: set[int] = set()
        self.not_controller_redirect: str | None = None
        self.coordinator: GrpcServer | None = None
        self.gateway: GatewayService | None = None
        self.channel: grpc.aio.Channel | None = None

    # -- metadata --
    def bump(self) -> None:
        self.revision += 1
        self.changed.set()
        self.changed = asyncio.Event()

    def topic_metadata(self, name: str):
        topic = self.topics[name]
        return pb.TopicMetadata(
            name=name,
            configs=topic.configs,
            partitions=[
                pb.PartitionMetadata(
                    partition=p,
                    leader=topic.leaders[p],
                    replicas=[topic.leaders[p]],
                    state=pb.PARTITION_STATE_ONLINE if topic.leaders[p] >= 0 else pb.PARTITION_STATE_OFFLINE,
                )
                for p in range(topic.partitions)
            ],
        )

    def metadata(self):
        return pb.GetMetadataResponse(
            revision=self.revision,
            brokers=[n.broker() for i, n in self.nodes.items() if i not in self.hidden_nodes],
            topics=[self.topic_metadata(name) for name in sorted(self.topics)],
        )

    def create_topic(self, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
        configs = configs or {}
        leaders = {p: p % len(self.nodes) for p in range(partitions)}
        self.topics[name] = FakeTopic(partitions, configs, leaders)
        limit = int(configs.get("max.message.bytes", 1_048_588))
        for p, leader in leaders.items():
            self.nodes[leader].logs[(name, p)] = FakeLog(max_message_bytes=limit)
        self.bump()

    def move_leader(self, topic: str, partition: int, to_node: int, *, publish: bool = True) -> None:
        """Move the partition (and its data) to another node."""
        old = self.topics[topic].leaders[partition]
        self.nodes[to_node].logs[(topic, partition)] = self.nodes[old].logs.pop((topic, partition))
        self.topics[topic].leaders[partition] = to_node
        if publish:
            self.bump()

    async def restart_node(self, node_id: int) -> None:
        """Stop a node and start it again on new ports, keeping its logs."""
        old = self.nodes[node_id]
        await old.stop()
        new = FakeStorageNode(node_id)
        new.logs = old.logs
        await new.start()
        self.nodes[node_id] = new

    # -- lifecycle --
    async def start(self, **gateway_settings) -> FakeCluster:
        for node in self.nodes.values():
            await node.start()
        self.coordinator = coordinator = await create_server(
            "127.0.0.1:0",
            [
                ServiceRegistration(
                    coordinator_grpc.add_CoordinatorServicer_to_server,
                    FakeCoordinatorServicer(self),
                    COORDINATOR_SERVICE,
                )
            ],
        )
        # ``dead_coordinators``: addresses listed before the live one, where nothing answers.
        dead = gateway_settings.pop("dead_coordinators", [])
        config = GatewayConfig(coordinators=[*dead, f"127.0.0.1:{coordinator.port}"], **gateway_settings)
        self.gateway = GatewayService(config)
        await self.gateway.start()
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.gateway.port}")
        return self

    async def stop(self) -> None:
        assert self.channel is not None and self.gateway is not None and self.coordinator is not None, (
            "started"
        )
        await self.channel.close()
        await self.gateway.shutdown(grace=0.5)
        await self.coordinator.server.stop(0)
        for node in self.nodes.values():
            await node.stop()

    def stub(self):
        from services.proto import gateway_grpc

        return gateway_grpc.GatewayStub(self.channel)


@pytest.fixture
def run_with_cluster():
    """``run_with_cluster(scenario, nodes=2, **gateway_settings)``: run ``await scenario(cluster)``."""

    def run(scenario, nodes: int = 2, **gateway_settings):
        async def main():
            cluster = await FakeCluster(nodes).start(**gateway_settings)
            try:
                await asyncio.wait_for(scenario(cluster), 30)
            finally:
                await cluster.stop()

        asyncio.run(main())

    return run
