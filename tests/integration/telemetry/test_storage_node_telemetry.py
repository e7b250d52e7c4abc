"""A standalone storage node's telemetry as its config turns it on: the Prometheus endpoint
(``metrics_address``) over real appends and fetch-port reads, failed appends, and the default: off.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from services.fetchport.client import FetchClient
from services.proto import pb, storage_grpc
from services.records import RecordBatchBuilder
from services.telemetry import Telemetry, names, telemetry_settings
from storage_node.config import StorageNodeConfig
from storage_node.node import StorageNode


def batch(count: int, size: int = 50) -> bytes:
    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    for i in range(count):
        builder.append(b"%d" % i * size, timestamp=now)
    return builder.build()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the Prometheus sample ``name`` whose labels include ``labels``."""
    for line in text.splitlines():
        match = re.fullmatch(rf"{re.escape(name)}\{{(.*)\}} (\S+)", line)
        if match and all(f'{key}="{value}"' in match.group(1) for key, value in labels.items()):
            return float(match.group(2))
    return None


async def _start(tmp_path: Path, **settings) -> StorageNode:
    node = StorageNode(StorageNodeConfig(log_dirs=[tmp_path / "data"], standalone=True, **settings))
    await node.start()
    return node


async def _stop(node: StorageNode) -> None:
    assert node.grpc is not None, "started"
    await node.grpc.stop(0)
    await node.stop()


def test_prometheus_endpoint_from_config_serves_storage_metrics(tmp_path, monkeypatch):
    for variable in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(variable, raising=False)

    async def scenario():
        node = await _start(tmp_path, metrics_address="127.0.0.1:0")
        try:
            assert node.telemetry.enabled and node.telemetry.tracer is None  # metrics only
            endpoint = node.telemetry.prometheus
            assert endpoint is not None and endpoint.port > 0
            data = batch(9)
            async with grpc.aio.insecure_channel(f"127.0.0.1:{node.grpc.port}") as channel:
                stub = storage_grpc.StorageNodeStub(channel)
                await stub.CreatePartition(pb.CreatePartitionRequest(topic="metered", partition=2))
                answer = await stub.Append(
                    pb.AppendRequest(
                        acks=pb.ACKS_ALL,
                        partitions=[pb.PartitionAppend(topic="metered", partition=2, record_batches=data)],
                    )
                )
                assert not answer.partitions[0].HasField("error")
            client = FetchClient("127.0.0.1", node.fetch_server.port)
            try:
                fetched = await client.fetch("metered", 2, 0, max_bytes=1 << 20)
            finally:
                await client.close()
            assert len(fetched.records) == len(data)

            text = await asyncio.to_thread(_get, f"http://127.0.0.1:{endpoint.port}/metrics")
            topic = {"messaging_destination_name": "metered"}
            partition = {**topic, "messaging_destination_partition_id": "2"}
            assert sample(text, "tributary_storage_appended_records_total", **topic) == 9
            assert sample(text, "tributary_storage_appended_bytes_total", **topic) == len(data)
            assert sample(text, "tributary_storage_fetched_bytes_total", **topic) == len(data)
            assert sample(text, "tributary_storage_fetch_sendfile_bytes_total") == len(data)
            assert sample(text, "tributary_storage_fetch_copied_bytes_total") == 0
            assert sample(text, "tributary_storage_fetch_requests_total") == 1
            assert sample(text, "tributary_storage_log_end_offset", **partition) == 9
            assert sample(text, "tributary_storage_log_start_offset", **partition) == 0
            assert sample(text, "tributary_storage_log_size_bytes", **partition) == len(data)
            assert sample(text, "tributary_storage_log_segments", **partition) == 1
            assert (
                sample(
                    text,
                    "rpc_server_call_duration_seconds_count",
                    rpc_method="tributary.v1.StorageNode/Append",
                    rpc_response_status_code="OK",
                    rpc_system_name="grpc",
                )
                == 1
            )
            # The resource names the service.
            assert 'service_name="tributary-storage-node"' in text
            assert 'service_instance_id="storage-0"' in text
        finally:
            await _stop(node)
        # Stopping the node stopped the endpoint it owned.
        with pytest.raises(OSError):
            await asyncio.to_thread(_get, f"http://127.0.0.1:{endpoint.port}/metrics")

    asyncio.run(scenario())


def test_a_failed_append_is_an_error_span_and_counted_by_reason(tmp_path):
    spans = InMemorySpanExporter()
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    telemetry = Telemetry.create(
        telemetry_settings("tributary-storage-node", env={}),
        span_processors=[SimpleSpanProcessor(spans)],
        metric_readers=[reader],
    )

    async def scenario():
        node = StorageNode(
            StorageNodeConfig(log_dirs=[tmp_path / "data"], standalone=True), telemetry=telemetry
        )
        await node.start()
        try:
            corrupt = bytearray(batch(3))
            corrupt[-1] ^= 0xFF  # breaks the CRC
            async with grpc.aio.insecure_channel(f"127.0.0.1:{node.grpc.port}") as channel:
                stub = storage_grpc.StorageNodeStub(channel)
                await stub.CreatePartition(pb.CreatePartitionRequest(topic="bad", partition=0))
                answer = await stub.Append(
                    pb.AppendRequest(
                        acks=pb.ACKS_ALL,
                        partitions=[
                            pb.PartitionAppend(topic="bad", partition=0, record_batches=bytes(corrupt))
                        ],
                    )
                )
            assert answer.partitions[0].error.reason == "CORRUPT_MESSAGE"
        finally:
            await _stop(node)

    asyncio.run(scenario())
    (append,) = [s for s in spans.get_finished_spans() if s.name == "append bad"]
    assert append.status.status_code is StatusCode.ERROR
    assert append.attributes[names.ERROR_TYPE] == "CORRUPT_MESSAGE"
    assert names.MESSAGING_BATCH_MESSAGE_COUNT not in append.attributes
    points = {
        (p.attributes[names.MESSAGING_DESTINATION_NAME], p.attributes[names.ERROR_TYPE]): p.value
        for m in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics
        if m.name == names.STORAGE_APPEND_ERRORS
        for p in m.data.data_points
    }
    assert points == {("bad", "CORRUPT_MESSAGE"): 1}
    names_seen = {m.name for m in reader.get_metrics_data().resource_metrics[0].scope_metrics[0].metrics}
    assert names.STORAGE_APPENDED_BYTES not in names_seen  # nothing was appended
    telemetry.shutdown()


def test_telemetry_is_off_by_default_and_installs_nothing(tmp_path, monkeypatch):
    for variable in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(variable, raising=False)

    async def scenario():
        node = await _start(tmp_path)
        try:
            assert not node.telemetry.enabled
            assert node.telemetry.tracer is None and node.telemetry.meter is None
            assert node.telemetry.prometheus is None
            assert node.instruments is None and node.handlers.telemetry is None
            assert (
                node.telemetry.server_interceptors() == [] and node.telemetry.client_interceptors("x:1") == []
            )
            async with grpc.aio.insecure_channel(f"127.0.0.1:{node.grpc.port}") as channel:
                stub = storage_grpc.StorageNodeStub(channel)
                await stub.CreatePartition(pb.CreatePartitionRequest(topic="quiet", partition=0))
                answer = await stub.Append(
                    pb.AppendRequest(
                        acks=pb.ACKS_ALL,
                        partitions=[pb.PartitionAppend(topic="quiet", partition=0, record_batches=batch(2))],
                    )
                )
            assert answer.partitions[0].last_offset == 1
        finally:
            await _stop(node)

    asyncio.run(scenario())


def test_an_unknown_exporter_in_the_config_fails_at_construction(tmp_path):
    from services.config import ConfigError

    with pytest.raises(ConfigError, match="unknown exporter 'jaeger'"):
        StorageNode(
            StorageNodeConfig(log_dirs=[tmp_path / "data"], standalone=True, telemetry_exporter="jaeger")
        )
