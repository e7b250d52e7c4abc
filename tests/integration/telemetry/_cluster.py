"""A coordinator, a storage node and a gateway running in the test's process and event loop, on a
real etcd, each with its own Telemetry (its own resource and metric reader) and all exporting
spans to one in-memory exporter -- so one trace can be followed across the three services.

Running the assembly classes in-process (instead of LocalCluster's subprocesses) is what makes
the spans collectable without files or a collector; the services talk to each other over real
loopback gRPC and the fetch port exactly as separate processes do.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.config import CoordinatorConfig
from coordinator.service import CoordinatorService
from gateway.server.config import GatewayConfig
from gateway.server.service import GatewayService
from services.proto import gateway_grpc, pb
from services.telemetry import PrometheusEndpoint, Telemetry, client_interceptors, telemetry_settings
from storage_node.config import StorageNodeConfig
from storage_node.node import StorageNode

CALL_TIMEOUT = 20


def make_telemetry(service_name: str, spans: InMemorySpanExporter, *, prometheus: bool = False):
    """(Telemetry, its InMemoryMetricReader): spans to ``spans``, metrics to the reader (and to a
    Prometheus endpoint on a free loopback port when asked)."""
    reader = InMemoryMetricReader()
    readers: list = [reader]
    endpoint = None
    if prometheus:
        endpoint = PrometheusEndpoint("127.0.0.1", 0)
        readers.append(endpoint.reader)
    settings = telemetry_settings(service_name, env={})
    telemetry = Telemetry.create(
        settings, span_processors=[SimpleSpanProcessor(spans)], metric_readers=readers, prometheus=endpoint
    )
    return telemetry, reader


def metric_points(reader: InMemoryMetricReader, name: str) -> list:
    """Every data point of metric ``name`` in one collection (cumulative)."""
    data = reader.get_metrics_data()
    found: list = []
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == name:
                    found.extend(metric.data.data_points)
    return found


def point_value(reader: InMemoryMetricReader, name: str, **attributes) -> float | None:
    """The value (sum / gauge value / histogram sum) of the one point whose attributes include
    ``attributes`` (keys with dots written as ``__``), or None when there is none."""
    wanted = {k.replace("__", "."): v for k, v in attributes.items()}
    matches = [p for p in metric_points(reader, name) if wanted.items() <= dict(p.attributes).items()]
    assert len(matches) <= 1, f"{name}: several points match {wanted}: {matches}"
    if not matches:
        return None
    point = matches[0]
    return getattr(point, "value", None) if hasattr(point, "value") else point.sum


@dataclass
class InProcessCluster:
    root: Path
    etcd_endpoint: str
    spans: InMemorySpanExporter = field(default_factory=InMemorySpanExporter)
    coordinator: CoordinatorService | None = None
    node: StorageNode | None = None
    gateway: GatewayService | None = None
    readers: dict = field(default_factory=dict)
    telemetries: dict = field(default_factory=dict)
    channel: grpc.aio.Channel | None = None
    #: The gateway appends over the nodes' data port (true) or gRPC StorageNode.Append (false).
    data_port_appends: bool = True

    async def start(self) -> InProcessCluster:
        cluster = f"tel-{uuid.uuid4().hex[:8]}"
        etcd = [self.etcd_endpoint]
        telemetry, self.readers["coordinator"] = make_telemetry(
            "tributary-coordinator", self.spans, prometheus=True
        )
        self.telemetries["coordinator"] = telemetry
        self.coordinator = CoordinatorService(
            CoordinatorConfig(
                coordinator_id="c0",
                etcd_endpoints=etcd,
                cluster=cluster,
                session_timeout_s=2,
                lag_sample_interval_s=0.3,
            ),
            telemetry=telemetry,
        )
        await self.coordinator.start()
        telemetry, self.readers["storage"] = make_telemetry("tributary-storage-node", self.spans)
        self.telemetries["storage"] = telemetry
        self.node = StorageNode(
            StorageNodeConfig(
                node_id=0,
                log_dirs=[self.root / "storage-0"],
                etcd_endpoints=etcd,
                cluster=cluster,
                session_timeout_s=2,
            ),
            telemetry=telemetry,
        )
        await self.node.start()
        telemetry, self.readers["gateway"] = make_telemetry("tributary-gateway", self.spans)
        self.telemetries["gateway"] = telemetry
        self.gateway = GatewayService(
            GatewayConfig(
                coordinators=[self.coordinator.identity.address], data_port_appends=self.data_port_appends
            ),
            telemetry=telemetry,
        )
        await self.gateway.start()
        # The "SDK": a separate tracer provider, as an application would configure, passed to the
        # entry point the SDK uses.
        telemetry, self.readers["client"] = make_telemetry("test-client", self.spans)
        self.telemetries["client"] = telemetry
        target = f"127.0.0.1:{self.gateway.port}"
        self.channel = grpc.aio.insecure_channel(
            target,
            interceptors=client_interceptors(
                target, tracer_provider=telemetry.tracer_provider, meter_provider=telemetry.meter_provider
            ),
        )
        return self

    @property
    def stub(self) -> gateway_grpc.GatewayStub:
        return gateway_grpc.GatewayStub(self.channel)

    async def create_topic(self, name: str, partitions: int) -> None:
        await self.stub.CreateTopic(
            pb.CreateTopicRequest(name=name, partitions=partitions), timeout=CALL_TIMEOUT
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            answer = await self.stub.GetMetadata(pb.GetMetadataRequest(topics=[name]), timeout=CALL_TIMEOUT)
            if all(p.state == pb.PARTITION_STATE_ONLINE for p in answer.topics[0].partitions):
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"{name} never came online")

    async def stop_storage_node(self) -> None:
        if self.node is not None and self.node.grpc is not None:
            await self.node.grpc.stop(0)
            await self.node.stop()
            self.node.grpc = None

    async def stop(self) -> None:
        if self.channel is not None:
            await self.channel.close()
        if self.gateway is not None:
            await self.gateway.shutdown(grace=0.5)
        await self.stop_storage_node()
        if self.coordinator is not None and self.coordinator.grpc is not None:
            await self.coordinator.grpc.stop(0)
            await self.coordinator.stop()
        for telemetry in self.telemetries.values():
            telemetry.shutdown()


def run_in_cluster(
    root: Path, etcd_endpoint: str, scenario, timeout: float = 60, *, data_port_appends: bool = True
) -> None:
    """``asyncio.run`` a scenario ``await scenario(cluster)`` against a fresh in-process cluster."""

    async def main() -> None:
        cluster = InProcessCluster(root, etcd_endpoint, data_port_appends=data_port_appends)
        try:
            await cluster.start()
            await asyncio.wait_for(scenario(cluster), timeout)
        finally:
            await cluster.stop()

    asyncio.run(main())
