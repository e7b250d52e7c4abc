"""Telemetry across the services: one produce is one trace (client -> gateway -> storage node),
metrics move as the data does, and the coordinator's gauges and the consumer-lag hook show up
in its metric reader and on its Prometheus endpoint.

A coordinator, a storage node and a gateway run in the test's process on a real etcd (see
``_cluster.py``), each with its own Telemetry, all exporting spans to one in-memory exporter.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
from opentelemetry.trace import SpanKind, StatusCode

from services.proto import pb
from services.records import RecordBatchBuilder
from services.telemetry import CONSUMER_LAG, forget_consumer_lag, names, record_consumer_lag
from tests.integration.telemetry._cluster import CALL_TIMEOUT, metric_points, point_value, run_in_cluster
from tests.support.names import unique


def service_of(span) -> str:
    return span.resource.attributes[names.SERVICE_NAME]


def only(spans, *, name: str, service: str, kind: SpanKind):
    found = [s for s in spans if s.name == name and service_of(s) == service and s.kind == kind]
    assert len(found) == 1, f"expected one {kind.name} span {name!r} from {service}, got {found}"
    return found[0]


def assert_linked(trace_spans) -> None:
    """One root; every other span's parent is a span of the same trace."""
    ids = {s.context.span_id for s in trace_spans}
    roots = [s for s in trace_spans if s.parent is None]
    assert len(roots) == 1, [s.name for s in roots]
    for span in trace_spans:
        if span.parent is not None:
            assert span.parent.span_id in ids, f"{span.name} has a parent outside the trace"


def batch(values: list[bytes]) -> bytes:
    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    for value in values:
        builder.append(value, timestamp=now)
    return builder.build()


@pytest.fixture(autouse=True)
def _clean_lag_registry():
    yield
    CONSUMER_LAG.clear()


@pytest.mark.parametrize("data_port", [True, False], ids=["data-port", "grpc"])
def test_one_produce_is_one_trace_from_client_to_storage_append(tmp_path, etcd, data_port):
    """Whichever way the gateway appends (the nodes' data port, or gRPC), one trace."""
    append_name = names.SPAN_DATA_PORT_APPEND if data_port else "tributary.v1.StorageNode/Append"

    async def scenario(cluster):
        topic = unique("traced")
        await cluster.create_topic(topic, 1)
        storage, gateway = cluster.readers["storage"], cluster.readers["gateway"]
        bytes_before = (
            point_value(storage, names.STORAGE_APPENDED_BYTES, messaging__destination__name=topic) or 0
        )
        assert (
            point_value(storage, names.STORAGE_APPENDED_RECORDS, messaging__destination__name=topic) is None
        )
        size_before = cluster.node.logs.get(topic, 0).size_in_bytes
        cluster.spans.clear()

        answer = await cluster.stub.Produce(
            pb.ProduceRequest(
                topic=topic,
                records=[pb.ProduceRecord(value=b"v%d" % i, partition=0) for i in range(7)],
                acks=pb.ACKS_ALL,
            ),
            timeout=CALL_TIMEOUT,
        )
        assert [r.offset for r in answer.records] == list(range(7))

        spans = cluster.spans.get_finished_spans()
        client = only(spans, name="tributary.v1.Gateway/Produce", service="test-client", kind=SpanKind.CLIENT)
        trace_spans = [s for s in spans if s.context.trace_id == client.context.trace_id]
        assert_linked(trace_spans)
        assert client.parent is None
        gw_server = only(
            trace_spans,
            name="tributary.v1.Gateway/Produce",
            service="tributary-gateway",
            kind=SpanKind.SERVER,
        )
        gw_append = only(
            trace_spans,
            name=append_name,
            service="tributary-gateway",
            kind=SpanKind.CLIENT,
        )
        sn_server = only(
            trace_spans,
            name=append_name,
            service="tributary-storage-node",
            kind=SpanKind.SERVER,
        )
        sn_append = only(
            trace_spans, name=f"append {topic}", service="tributary-storage-node", kind=SpanKind.INTERNAL
        )
        assert gw_server.parent.span_id == client.context.span_id
        assert gw_server.parent.is_remote
        assert gw_append.parent.span_id == gw_server.context.span_id
        assert sn_server.parent.span_id == gw_append.context.span_id
        assert sn_server.parent.is_remote
        assert sn_append.parent.span_id == sn_server.context.span_id
        # Nesting in time as well: the storage append happens inside the gateway's call.
        assert gw_append.start_time <= sn_server.start_time <= sn_append.start_time
        assert sn_append.end_time <= sn_server.end_time <= gw_append.end_time <= gw_server.end_time

        grpc_spans = (client, gw_server) if data_port else (client, gw_server, gw_append, sn_server)
        for span in grpc_spans:
            assert span.attributes[names.RPC_SYSTEM_NAME] == "grpc"
            assert span.attributes[names.RPC_RESPONSE_STATUS_CODE] == "OK"
        for span in (client, gw_server, gw_append, sn_server):
            assert span.status.status_code is StatusCode.UNSET
        if data_port:
            for span in (gw_append, sn_server):
                assert span.attributes[names.RPC_SYSTEM_NAME] == names.DATA_PORT_RPC_SYSTEM
            assert gw_append.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        assert gw_append.attributes[names.SERVER_ADDRESS] == "127.0.0.1"
        node_port = cluster.node.fetch_server.port if data_port else cluster.node.grpc.port
        assert gw_append.attributes[names.SERVER_PORT] == node_port
        assert gw_server.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        assert gw_server.attributes[names.MESSAGING_OPERATION_TYPE] == "send"
        assert gw_server.attributes[names.MESSAGING_BATCH_MESSAGE_COUNT] == 7
        assert sn_append.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        assert sn_append.attributes[names.MESSAGING_DESTINATION_PARTITION_ID] == "0"
        assert sn_append.attributes[names.MESSAGING_BATCH_MESSAGE_COUNT] == 7
        assert sn_append.attributes[names.ATTR_BASE_OFFSET] == 0
        assert sn_append.attributes[names.ATTR_LAST_OFFSET] == 6

        # Metrics: bytes in grew by exactly what the log grew by, records by what was produced.
        grown = cluster.node.logs.get(topic, 0).size_in_bytes - size_before
        assert grown > 0
        assert (
            point_value(storage, names.STORAGE_APPENDED_BYTES, messaging__destination__name=topic)
            == bytes_before + grown
        )
        assert point_value(storage, names.STORAGE_APPENDED_RECORDS, messaging__destination__name=topic) == 7
        assert (
            point_value(
                storage,
                names.STORAGE_LOG_END_OFFSET,
                messaging__destination__name=topic,
                messaging__destination__partition__id="0",
            )
            == 7
        )
        assert (
            point_value(
                storage,
                names.STORAGE_LOG_SIZE,
                messaging__destination__name=topic,
                messaging__destination__partition__id="0",
            )
            == size_before + grown
        )
        batch_records = [
            p
            for p in metric_points(gateway, names.GATEWAY_PRODUCE_BATCH_RECORDS)
            if p.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        ]
        assert [(p.count, p.sum) for p in batch_records] == [(1, 7)]
        batch_bytes = [
            p
            for p in metric_points(gateway, names.GATEWAY_PRODUCE_BATCH_SIZE)
            if p.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        ]
        assert [(p.count, p.sum) for p in batch_bytes] == [(1, grown)]
        produce = [
            p
            for p in metric_points(gateway, names.RPC_SERVER_CALL_DURATION)
            if p.attributes[names.RPC_METHOD] == "tributary.v1.Gateway/Produce"
        ]
        assert [(p.count, p.attributes[names.RPC_RESPONSE_STATUS_CODE]) for p in produce] == [(1, "OK")]
        appends = [
            p
            for p in metric_points(gateway, names.RPC_CLIENT_CALL_DURATION)
            if p.attributes[names.RPC_METHOD] == "tributary.v1.StorageNode/Append"
        ]
        if data_port:  # no gRPC call to the node: the node times the data-port request
            assert appends == []
            durations = metric_points(storage, names.STORAGE_DATA_PORT_APPEND_DURATION)
            assert [p.count for p in durations] == [1]
        else:
            assert [p.count for p in appends] == [1]
            assert appends[0].attributes[names.SERVER_PORT] == cluster.node.grpc.port
        client_calls = [
            p
            for p in metric_points(cluster.readers["client"], names.RPC_CLIENT_CALL_DURATION)
            if p.attributes[names.RPC_METHOD] == "tributary.v1.Gateway/Produce"
        ]
        assert [p.count for p in client_calls] == [1]

    run_in_cluster(tmp_path, etcd.endpoint, scenario, data_port_appends=data_port)


def test_admin_calls_trace_through_to_the_coordinator_and_fetch_counts_bytes_out(tmp_path, etcd):
    async def scenario(cluster):
        topic = unique("fetched")
        cluster.spans.clear()
        await cluster.create_topic(topic, 1)
        spans = cluster.spans.get_finished_spans()
        client = only(
            spans, name="tributary.v1.Gateway/CreateTopic", service="test-client", kind=SpanKind.CLIENT
        )
        trace_spans = [s for s in spans if s.context.trace_id == client.context.trace_id]
        assert_linked(trace_spans)
        gw_server = only(
            trace_spans,
            name="tributary.v1.Gateway/CreateTopic",
            service="tributary-gateway",
            kind=SpanKind.SERVER,
        )
        # The gateway retries while the controller is still being elected: one CLIENT span per
        # attempt, each answered by one coordinator SERVER span, the last one OK.
        forwarded = sorted(
            (
                s
                for s in trace_spans
                if s.name == "tributary.v1.Coordinator/CreateTopic" and s.kind is SpanKind.CLIENT
            ),
            key=lambda s: s.start_time,
        )
        served = [
            s
            for s in trace_spans
            if s.name == "tributary.v1.Coordinator/CreateTopic" and s.kind is SpanKind.SERVER
        ]
        assert forwarded and all(service_of(s) == "tributary-gateway" for s in forwarded)
        assert all(s.parent.span_id == gw_server.context.span_id for s in forwarded)
        assert sorted(s.parent.span_id for s in served) == sorted(s.context.span_id for s in forwarded)
        assert all(service_of(s) == "tributary-coordinator" for s in served)
        assert forwarded[-1].attributes[names.RPC_RESPONSE_STATUS_CODE] == "OK"

        data = batch([b"x" * 100] * 5)
        await cluster.stub.Produce(
            pb.ProduceRequest(
                topic=topic, batches=[pb.PartitionBatches(partition=0, record_batches=data)], acks=pb.ACKS_ALL
            ),
            timeout=CALL_TIMEOUT,
        )
        cluster.spans.clear()
        answer = await cluster.stub.Fetch(
            pb.FetchRequest(
                partitions=[pb.FetchPartition(topic=topic, partition=0, offset=0)], raw_batches=True
            ),
            timeout=CALL_TIMEOUT,
        )
        fetched = answer.partitions[0]
        assert fetched.next_offset == 5 and fetched.record_batches

        spans = cluster.spans.get_finished_spans()
        server = only(
            spans, name="tributary.v1.Gateway/Fetch", service="tributary-gateway", kind=SpanKind.SERVER
        )
        reads = [s for s in spans if s.name == f"fetch {topic}"]
        assert reads and all(s.parent.span_id == server.context.span_id for s in reads)
        assert all(
            s.kind is SpanKind.CLIENT and s.attributes[names.SERVER_PORT] == cluster.node.fetch_server.port
            for s in reads
        )
        assert sum(s.attributes[names.ATTR_BATCH_BYTES] for s in reads) == len(data)

        storage, gateway = cluster.readers["storage"], cluster.readers["gateway"]
        assert point_value(storage, names.STORAGE_FETCHED_BYTES, messaging__destination__name=topic) == len(
            data
        )
        assert point_value(storage, names.STORAGE_FETCH_SENDFILE_BYTES) >= len(data)
        assert point_value(storage, names.STORAGE_FETCH_REQUESTS) >= 1
        assert point_value(gateway, names.GATEWAY_FETCHED_RECORDS, messaging__destination__name=topic) == 5
        assert point_value(gateway, names.GATEWAY_FETCHED_BYTES, messaging__destination__name=topic) == len(
            data
        )
        # Pre-encoded batches: the batch histogram counts their records from the headers.
        assert [
            (p.count, p.sum)
            for p in metric_points(gateway, names.GATEWAY_PRODUCE_BATCH_RECORDS)
            if p.attributes[names.MESSAGING_DESTINATION_NAME] == topic
        ] == [(1, 5)]

    run_in_cluster(tmp_path, etcd.endpoint, scenario)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        assert response.status == 200
        return response.read().decode()


def test_coordinator_gauges_consumer_lag_and_offline_partitions(tmp_path, etcd):
    async def scenario(cluster):
        topic = unique("gauged")
        await cluster.create_topic(topic, 3)
        reader = cluster.readers["coordinator"]
        assert point_value(reader, names.COORDINATOR_CONTROLLER_ACTIVE, tributary__coordinator__id="c0") == 1
        assert point_value(reader, names.COORDINATOR_CONTROLLER_EPOCH) >= 1
        assert point_value(reader, names.COORDINATOR_BROKERS_LIVE) == 1
        assert point_value(reader, names.COORDINATOR_PARTITIONS, tributary__partition__state="online") == 3
        assert point_value(reader, names.COORDINATOR_PARTITIONS_OFFLINE) == 0
        assert point_value(reader, names.COORDINATOR_PARTITIONS_UNDER_REPLICATED) == 0

        # A transaction opened through the gateway shows in the transaction gauges until it ends.
        assert point_value(reader, names.COORDINATOR_TRANSACTIONS_OPEN) == 0
        init = await cluster.stub.InitProducerId(
            pb.InitProducerIdRequest(
                transactional_id="gauged", transaction_timeout_ms=60_000, producer_id=-1, producer_epoch=-1
            ),
            timeout=CALL_TIMEOUT,
        )
        producer = {"transactional_id": "gauged", "producer_id": init.producer_id, "producer_epoch": 0}
        await cluster.stub.AddPartitionsToTxn(
            pb.AddPartitionsToTxnRequest(
                partitions=[pb.TopicPartition(topic=topic, partition=0)], **producer
            ),
            timeout=CALL_TIMEOUT,
        )
        await asyncio.sleep(0.6)  # the gauges recompute at most every 0.5 s
        assert point_value(reader, names.COORDINATOR_TRANSACTIONAL_IDS) == 1
        assert point_value(reader, names.COORDINATOR_TRANSACTIONS_OPEN) == 1
        assert point_value(reader, names.COORDINATOR_TRANSACTION_OLDEST_AGE) >= 500
        await cluster.stub.EndTxn(pb.EndTxnRequest(commit=False, **producer), timeout=CALL_TIMEOUT)
        await asyncio.sleep(0.6)
        assert point_value(reader, names.COORDINATOR_TRANSACTIONS_OPEN) == 0
        assert point_value(reader, names.COORDINATOR_TRANSACTION_OLDEST_AGE) == 0

        # The hook the consumer-group code feeds.
        record_consumer_lag("readers", topic, 1, 42)
        record_consumer_lag("readers", topic, 2, 0)
        lag = {
            (
                p.attributes[names.MESSAGING_CONSUMER_GROUP_NAME],
                p.attributes[names.MESSAGING_DESTINATION_NAME],
                p.attributes[names.MESSAGING_DESTINATION_PARTITION_ID],
            ): p.value
            for p in metric_points(reader, names.CONSUMER_LAG)
        }
        assert lag == {("readers", topic, "1"): 42, ("readers", topic, "2"): 0}
        record_consumer_lag("readers", topic, 1, 40)
        assert point_value(reader, names.CONSUMER_LAG, messaging__destination__partition__id="1") == 40

        # The same names on the coordinator's Prometheus endpoint.
        port = cluster.telemetries["coordinator"].prometheus.port
        text = await asyncio.to_thread(_get, f"http://127.0.0.1:{port}/metrics")
        lag_lines = [line for line in text.splitlines() if line.startswith("tributary_consumer_lag{")]
        assert any(
            'messaging_consumer_group_name="readers"' in line
            and 'messaging_destination_partition_id="1"' in line
            and line.endswith(" 40.0")
            for line in lag_lines
        ), lag_lines
        for name in (
            "tributary_coordinator_controller_active",
            "tributary_coordinator_controller_epoch",
            "tributary_coordinator_partitions_offline",
            "rpc_server_call_duration_seconds_bucket",
        ):
            assert f"\n{name}{{" in text, name

        forget_consumer_lag("readers")
        assert metric_points(reader, names.CONSUMER_LAG) == []

        # The only storage node leaves: its partitions go offline in the coordinator's gauges.
        await cluster.stop_storage_node()
        deadline = time.monotonic() + 10
        while point_value(reader, names.COORDINATOR_PARTITIONS_OFFLINE) != 3:
            assert time.monotonic() < deadline, "partitions never reported offline"
            await asyncio.sleep(0.6)  # the gauges recompute at most every 0.5 s
        assert point_value(reader, names.COORDINATOR_BROKERS_LIVE) == 0
        assert point_value(reader, names.COORDINATOR_PARTITIONS, tributary__partition__state="online") == 0

    run_in_cluster(tmp_path, etcd.endpoint, scenario)


def test_consumer_lag_gauge_follows_commits(tmp_path, etcd):
    """The active controller samples every group's lag into tributary.consumer.lag."""

    async def lag_of(reader, topic):
        for _ in range(100):
            points = {
                p.attributes[names.MESSAGING_DESTINATION_PARTITION_ID]: p.value
                for p in metric_points(reader, names.CONSUMER_LAG)
                if p.attributes[names.MESSAGING_DESTINATION_NAME] == topic
            }
            yield points
            await asyncio.sleep(0.1)

    async def wait_for_lag(reader, topic, expected):
        seen = None
        async for seen in lag_of(reader, topic):
            if seen.get("0") == expected:
                return
        raise AssertionError(f"lag of {topic}-0 never became {expected}; last seen {seen}")

    async def scenario(cluster):
        topic = unique("lagged")
        await cluster.create_topic(topic, 1)
        records = [pb.ProduceRecord(value=b"v%d" % i, partition=0) for i in range(10)]
        await cluster.stub.Produce(pb.ProduceRequest(topic=topic, records=records), timeout=10)
        reader = cluster.readers["coordinator"]

        async def commit(offset):
            await cluster.stub.CommitOffsets(
                pb.CommitOffsetsRequest(
                    group_id="lag-readers",
                    member_id="",
                    generation_id=-1,
                    offsets=[pb.OffsetCommit(topic=topic, partition=0, offset=offset)],
                ),
                timeout=10,
            )

        await commit(4)
        await wait_for_lag(reader, topic, 6)
        await commit(10)
        await wait_for_lag(reader, topic, 0)

    run_in_cluster(tmp_path, etcd.endpoint, scenario)
