"""Service instruments against in-memory readers, with fake inputs; the consumer-lag registry."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from coordinator.telemetry import ClusterHealth, CoordinatorInstruments
from gateway.server.quotas import ClientQuotas
from gateway.server.telemetry import GatewayInstruments, count_records
from services.quotas import PRODUCER_BYTE_RATE, QuotaEntity
from services.records import RecordBatchBuilder
from services.telemetry import ClientInstruments, ConsumerLagRegistry, Telemetry, names, telemetry_settings
from storage_node.telemetry import StorageNodeInstruments


def make(*, traces: bool = True, metrics: bool = True):
    spans, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry = Telemetry.create(
        telemetry_settings("unit", env={}),
        span_processors=[SimpleSpanProcessor(spans)] if traces else [],
        metric_readers=[reader] if metrics else [],
    )
    return telemetry, spans, reader


def metrics_of(reader) -> dict:
    data = reader.get_metrics_data()
    if data is None:
        return {}
    return {
        m.name: m.data.data_points
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
    }


def batch(count: int) -> bytes:
    builder = RecordBatchBuilder()
    for i in range(count):
        builder.append(b"v%d" % i, timestamp=1_700_000_000_000)
    return builder.build()


def test_count_records_reads_headers_only_and_stops_at_garbage():
    data = batch(3) + batch(1) + batch(12)
    assert count_records(data) == 16
    assert count_records(b"") == 0
    assert count_records(data + b"\x00" * 70) == 16  # a zero-length header ends the walk
    assert count_records(data[:-5]) == 16  # a truncated last batch still has its header


@dataclass
class Payload:
    data: bytes
    record_indexes: list


def test_gateway_batch_histograms_typed_and_raw():
    telemetry, _, reader = make()
    gateway = GatewayInstruments(telemetry)
    with telemetry.tracer.start_as_current_span("tributary.v1.Gateway/Produce") as server:
        gateway.produce_planned("orders", [Payload(batch(4), [0, 1, 2, 3]), Payload(batch(2), [])])
    (records,) = metrics_of(reader)[names.GATEWAY_PRODUCE_BATCH_RECORDS]
    assert (records.count, records.sum, dict(records.attributes)) == (
        2,
        6,
        {names.MESSAGING_DESTINATION_NAME: "orders"},
    )
    (size,) = metrics_of(reader)[names.GATEWAY_PRODUCE_BATCH_SIZE]
    assert size.sum == len(batch(4)) + len(batch(2))
    assert server.attributes[names.MESSAGING_BATCH_MESSAGE_COUNT] == 6
    assert server.attributes[names.MESSAGING_OPERATION_TYPE] == "send"
    gateway.fetched("orders", 0, 0)  # an empty answer adds no series
    assert names.GATEWAY_FETCHED_RECORDS not in metrics_of(reader)
    gateway.fetched("orders", 6, 500)
    assert metrics_of(reader)[names.GATEWAY_FETCHED_RECORDS][0].value == 6


def test_gateway_instruments_with_tracing_only_record_no_metrics():
    telemetry, spans, reader = make(metrics=False)
    gateway = GatewayInstruments(telemetry)
    gateway.produce_planned("orders", [Payload(batch(1), [0])])
    gateway.fetched("orders", 1, 10)
    assert metrics_of(reader) == {}
    span = gateway.start_fetch_port_read("orders", 2, "10.0.0.1", 9093)
    gateway.end_fetch_port_read(span, 0, ConnectionError("reset"))
    (read,) = spans.get_finished_spans()
    assert read.name == "fetch orders" and read.attributes[names.ERROR_TYPE] == "ConnectionError"


def test_gateway_data_requests_are_spans_joining_the_clients_trace_and_durations():
    telemetry, spans, reader = make()
    gateway = GatewayInstruments(telemetry)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    request = gateway.start_data_request("produce", "orders", "app-1", traceparent)
    with gateway.use_span(request):
        gateway.produce_planned("orders", [Payload(batch(3), [])])
    gateway.end_data_request(request)
    failed = gateway.start_data_request("fetch", "orders", "app-1")
    gateway.end_data_request(failed, ConnectionError("reset"))
    produce, fetch = spans.get_finished_spans()
    assert produce.name == "data produce orders" and produce.kind.name == "SERVER"
    assert f"{produce.context.trace_id:032x}" == "0af7651916cd43dd8448eb211c80319c"
    assert f"{produce.parent.span_id:016x}" == "b7ad6b7169203331"
    assert produce.attributes[names.MESSAGING_BATCH_MESSAGE_COUNT] == 3
    assert fetch.parent is None and fetch.attributes[names.ERROR_TYPE] == "ConnectionError"
    points = metrics_of(reader)[names.GATEWAY_DATA_REQUEST_DURATION]
    assert sorted((dict(p.attributes).get(names.ERROR_TYPE, ""), p.count) for p in points) == [
        ("", 1),
        ("ConnectionError", 1),
    ]


class FakeLog:
    def __init__(self, topic, partition, end, closed=False):
        self.topic, self.partition, self.closed = topic, partition, closed
        self.log_end_offset, self.log_start_offset, self.size_in_bytes, self.segment_count = (
            end,
            0,
            end * 10,
            1,
        )


class FakeLogs:
    def __init__(self, logs):
        self.logs = logs

    def partitions(self):
        return self.logs


def test_storage_gauges_observe_the_log_manager_at_collection_time():
    telemetry, _, reader = make(traces=False)

    @dataclass
    class Stats:
        sendfile_bytes: int = 0
        copied_bytes: int = 0
        requests: int = 0
        errors: int = 0
        connections: int = 0

    stats = Stats()
    logs = FakeLogs([FakeLog("a", 0, 5), FakeLog("a", 1, 7), FakeLog("gone", 0, 3, closed=True)])
    StorageNodeInstruments(telemetry, logs=logs, fetch_stats=lambda: stats)
    end = {
        (
            p.attributes[names.MESSAGING_DESTINATION_NAME],
            p.attributes[names.MESSAGING_DESTINATION_PARTITION_ID],
        ): p.value
        for p in metrics_of(reader)[names.STORAGE_LOG_END_OFFSET]
    }
    assert end == {("a", "0"): 5, ("a", "1"): 7}
    logs.logs[0].log_end_offset = 9
    stats.sendfile_bytes, stats.connections = 4096, 2
    collected = metrics_of(reader)
    assert {p.value for p in collected[names.STORAGE_LOG_END_OFFSET]} == {9, 7}
    assert collected[names.STORAGE_FETCH_SENDFILE_BYTES][0].value == 4096
    assert collected[names.STORAGE_FETCH_CONNECTIONS][0].value == 2


def test_storage_cleaner_metrics_follow_its_rounds_and_dirty_ratios():
    from storage_node.log.cleaner.cleaner import CleanResult

    telemetry, _, reader = make(traces=False)

    class FakeCleaner:
        on_clean = None

        def dirty_ratios(self):
            return {("c", 0): 0.75}

    cleaner = FakeCleaner()
    StorageNodeInstruments(telemetry, logs=FakeLogs([]), fetch_stats=lambda: None, cleaner=cleaner)
    assert cleaner.on_clean is not None
    cleaner.on_clean(CleanResult("c", 0, 0, 100, 0.75, bytes_read=4000, bytes_written=1000, duration_s=0.5))
    collected = metrics_of(reader)
    assert [p.value for p in collected[names.STORAGE_CLEANER_DIRTY_RATIO]] == [0.75]
    assert [p.value for p in collected[names.STORAGE_CLEANER_BYTES_READ]] == [4000]
    assert [p.value for p in collected[names.STORAGE_CLEANER_BYTES_WRITTEN]] == [1000]
    assert collected[names.STORAGE_CLEANER_DURATION][0].sum == 0.5


def test_coordinator_gauges_and_lag_from_their_sources():
    telemetry, _, reader = make(traces=False)
    active = {"value": False}
    calls = []

    def health():
        calls.append(1)
        return ClusterHealth(
            controller_epoch=4, live_brokers=2, partitions={"online": 5, "offline": 1}, under_replicated=1
        )

    lag = ConsumerLagRegistry()
    CoordinatorInstruments(
        telemetry,
        coordinator_id="c9",
        is_active=lambda: active["value"],
        cluster_health=health,
        consumer_lag=lag,
    )
    collected = metrics_of(reader)
    assert len(calls) == 1  # one computation serves every gauge of a collection
    assert [(p.value, dict(p.attributes)) for p in collected[names.COORDINATOR_CONTROLLER_ACTIVE]] == [
        (0, {names.ATTR_COORDINATOR_ID: "c9"})
    ]
    assert collected[names.COORDINATOR_CONTROLLER_EPOCH][0].value == 4
    assert collected[names.COORDINATOR_BROKERS_LIVE][0].value == 2
    assert collected[names.COORDINATOR_PARTITIONS_OFFLINE][0].value == 1
    assert collected[names.COORDINATOR_PARTITIONS_UNDER_REPLICATED][0].value == 1
    assert {
        p.attributes[names.ATTR_PARTITION_STATE]: p.value for p in collected[names.COORDINATOR_PARTITIONS]
    } == {"online": 5, "offline": 1, "pending": 0}
    assert names.CONSUMER_LAG not in collected
    active["value"] = True
    lag.record("g1", "t", 0, 12)
    collected = metrics_of(reader)
    assert collected[names.COORDINATOR_CONTROLLER_ACTIVE][0].value == 1
    (point,) = collected[names.CONSUMER_LAG]
    assert (point.value, dict(point.attributes)) == (
        12,
        {
            names.MESSAGING_CONSUMER_GROUP_NAME: "g1",
            names.MESSAGING_DESTINATION_NAME: "t",
            names.MESSAGING_DESTINATION_PARTITION_ID: "0",
        },
    )


# ---- consumer lag registry ---------------------------------------------------------------------


def test_lag_registry_push_forget_and_pull_sources():
    lag = ConsumerLagRegistry()
    lag.record("g1", "t", 0, 5)
    lag.record("g1", "t", 1, 6)
    lag.record("g1", "u", 0, 7)
    lag.record("g2", "t", 0, 8)
    lag.record("g1", "t", 0, 4)  # latest wins
    assert sorted(lag.samples()) == [
        ("g1", "t", 0, 4),
        ("g1", "t", 1, 6),
        ("g1", "u", 0, 7),
        ("g2", "t", 0, 8),
    ]
    lag.forget("g1", "t", 1)
    assert ("g1", "t", 1, 6) not in lag.samples()
    lag.forget("g1", "u")
    assert sorted(lag.samples()) == [("g1", "t", 0, 4), ("g2", "t", 0, 8)]
    lag.forget("g1")
    assert lag.samples() == [("g2", "t", 0, 8)]

    remove = lag.add_source(lambda: [("g3", "t", 2, 99)])
    assert lag.samples() == [("g2", "t", 0, 8), ("g3", "t", 2, 99)]
    remove()
    remove()  # twice is harmless
    assert lag.samples() == [("g2", "t", 0, 8)]


def test_a_failing_lag_source_does_not_blank_the_others(caplog):
    lag = ConsumerLagRegistry()
    lag.record("g", "t", 0, 1)

    def broken():
        raise KeyError("group vanished")

    lag.add_source(broken)
    lag.add_source(lambda: [("h", "t", 0, 2)])
    assert lag.samples() == [("g", "t", 0, 1), ("h", "t", 0, 2)]
    assert "consumer lag source" in caplog.text


def test_lag_registry_is_safe_to_feed_while_collecting():
    lag = ConsumerLagRegistry()
    stop = threading.Event()

    def feed():
        i = 0
        while not stop.is_set():
            lag.record(f"g{i % 50}", "t", i % 7, i)
            if i % 3 == 0:
                lag.forget(f"g{(i + 25) % 50}")
            i += 1

    feeder = threading.Thread(target=feed)
    feeder.start()
    try:
        for _ in range(300):
            assert all(len(sample) == 4 for sample in lag.samples())
    finally:
        stop.set()
        feeder.join()


def test_module_level_hooks_feed_the_process_registry():
    from services.telemetry import (
        CONSUMER_LAG,
        forget_consumer_lag,
        record_consumer_lag,
        register_consumer_lag_source,
    )

    try:
        record_consumer_lag("grp", "t", 3, 10)
        remove = register_consumer_lag_source(lambda: [("src", "t", 0, 1)])
        assert sorted(CONSUMER_LAG.samples()) == [("grp", "t", 3, 10), ("src", "t", 0, 1)]
        remove()
        forget_consumer_lag("grp")
        assert CONSUMER_LAG.samples() == []
    finally:
        CONSUMER_LAG.clear()


@pytest.mark.parametrize("with_metrics", [True, False])
def test_instruments_tolerate_a_signal_being_off(with_metrics):
    telemetry, _, _ = make(traces=not with_metrics, metrics=with_metrics)
    CoordinatorInstruments(
        telemetry, coordinator_id="c", is_active=lambda: True, cluster_health=ClusterHealth
    )
    gateway = GatewayInstruments(telemetry)
    gateway.produce_planned("t", [Payload(batch(1), [0])])
    assert (telemetry.meter is not None) == with_metrics


def test_gateway_quota_metrics_per_user_client_id_and_key():
    telemetry, _, reader = make()
    gateway = GatewayInstruments(telemetry)
    quotas = ClientQuotas()
    gateway.watch_quotas(quotas)
    quotas.update([(QuotaEntity(None, "app"), {PRODUCER_BYTE_RATE: 1000.0})])
    quota = quotas.client("User:alice", "app")
    assert quota is not None
    assert quota.record_produce_bytes(3000) > 0
    found = metrics_of(reader)
    attributes = {
        names.ATTR_QUOTA_USER: "",
        names.ATTR_QUOTA_CLIENT_ID: "app",
        names.ATTR_QUOTA_KEY: PRODUCER_BYTE_RATE,
    }
    (throttle,) = found[names.GATEWAY_QUOTA_THROTTLE_TIME]
    assert dict(throttle.attributes) == attributes and throttle.sum == pytest.approx(2.0, rel=0.01)
    (rate,) = found[names.GATEWAY_QUOTA_BYTE_RATE]
    assert dict(rate.attributes) == attributes and rate.value == pytest.approx(3000, rel=0.01)
    (limit,) = found[names.GATEWAY_QUOTA_LIMIT]
    assert limit.value == 1000.0
    assert names.GATEWAY_QUOTA_REQUEST_TIME not in found  # no request_percentage allowance


def test_the_sdk_records_how_long_a_gateway_held_it():
    telemetry, _, reader = make()
    instruments = ClientInstruments(telemetry.meter, server_address="gw", server_port=9092)
    instruments.throttled(0.25, operation="produce")
    (held,) = metrics_of(reader)[names.CLIENT_THROTTLE_TIME]
    assert held.sum == 0.25
    assert dict(held.attributes) == {
        names.MESSAGING_OPERATION_NAME: "produce",
        names.SERVER_ADDRESS: "gw",
        names.SERVER_PORT: 9092,
    }


def test_gateway_fetch_session_metrics_follow_the_counts():
    from gateway.server.fetch_sessions import FetchSessions, SessionCounts
    from services.dataport import protocol as dp

    telemetry, _, reader = make()
    gateway = GatewayInstruments(telemetry)
    counts = SessionCounts()
    sessions = FetchSessions(max_sessions=1, counts=counts)
    gateway.watch_fetch_sessions(counts, lambda: len(sessions))
    full = dp.FetchRequest(1, [dp.FetchPartition("t", 0, 0)], session_epoch=dp.INITIAL_EPOCH)
    first = sessions.begin(full, 100)
    sessions.complete(first, [None])  # nothing new
    sessions.begin(full, 100)  # evicts the first
    found = metrics_of(reader)
    (open_now,) = found[names.GATEWAY_FETCH_SESSIONS_OPEN]
    assert open_now.value == 1
    events = {
        dict(p.attributes)[names.ATTR_SESSION_EVENT]: p.value for p in found[names.GATEWAY_FETCH_SESSIONS]
    }
    assert events == {"opened": 2, "evicted": 1, "refused": 0}
    kinds = {dict(p.attributes)[names.ATTR_FETCH_KIND]: p.value for p in found[names.GATEWAY_SESSION_FETCHES]}
    assert kinds == {"full": 2, "incremental": 0}
