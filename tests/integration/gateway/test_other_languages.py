"""What a client in another language meets, against a real cluster (etcd, a coordinator, two
storage nodes, a gateway, each a process on loopback):

* the JavaScript example (``examples/node``) runs end to end, and what it wrote is what the
  Python SDK reads;
* a Fetch with default fields fits gRPC's default 4 MiB receive limit, typed or raw, even when
  the partitions hold far more (and compressed batches decode to far more);
* the two error forms of ``common.proto``: a call that fails, a partition result that fails;
* DeleteRecords through the gateway, ``Admin.delete_records`` and ``tributary delete-records``;
* the client id in the call metadata: logged by the gateway, shown by ``groups describe``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import grpc
import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import OffsetOutOfRangeError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from services.client_id import CLIENT_ID_METADATA_KEY
from services.proto import gateway_grpc, pb

REPO = Path(__file__).resolve().parents[3]
NODE_EXAMPLE = REPO / "examples" / "node"
#: What ``deploy/setup-venv.sh`` found: node and npm (and installed the example), or neither.
NODE_NOTE = Path(sys.prefix) / "node-example.txt"
GRPC_DEFAULT_RECEIVE_LIMIT = 4 << 20
CALL_TIMEOUT = 30


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=1, session_timeout_s=2)
    with LocalCluster(tmp_path_factory.mktemp("polyglot-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="module")
def admin(cluster):
    with Admin(servers=cluster.gateway) as client:
        yield client


@pytest.fixture(scope="module")
def stub(cluster):
    # A default channel, as any language's client has: the receive limit stays 4 MiB.
    with grpc.insecure_channel(cluster.gateway) as channel:
        yield gateway_grpc.GatewayStub(channel)


def new_topic(admin, partitions: int) -> str:
    name = f"pg-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions)])
    return name


def read_all(servers: str, topic: str, partitions: int, *, until: dict[int, int]) -> dict[int, list]:
    """Every record of ``topic`` below ``until`` per partition, through the Python SDK."""
    got: dict[int, list] = {p: [] for p in range(partitions)}
    consumer = Consumer(servers=servers, auto_offset_reset="earliest")
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        deadline = time.monotonic() + 60
        while any(got[p][-1].offset + 1 < until[p] if got[p] else until[p] > 0 for p in got):
            assert time.monotonic() < deadline, {p: len(r) for p, r in got.items()}
            for tp, records in consumer.poll(timeout_ms=500).items():
                got[tp.partition].extend(records)
    finally:
        consumer.close()
    return got


# ---- the JavaScript example ------------------------------------------------------------------


def test_the_node_example_runs_against_the_cluster(cluster, admin):
    note = NODE_NOTE.read_text().strip()
    node = shutil.which("node")
    if node is None:
        # No toolchain on this machine: then the setup must have said so (and nothing ran).
        assert note.startswith("absent:"), f"node is missing but the setup said: {note}"
        return
    assert note.startswith("installed:"), (
        f"node is installed but the setup did not install the example: {note}"
    )
    assert (NODE_EXAMPLE / "node_modules" / "@grpc" / "grpc-js").is_dir(), "run deploy/setup-venv.sh"
    topic = f"node-{uuid.uuid4().hex[:8]}"
    run = subprocess.run(
        [node, "client.js", cluster.gateway, topic],
        cwd=NODE_EXAMPLE,
        capture_output=True,
        text=True,
        timeout=180,
        env={k: v for k, v in os.environ.items() if k != "TRIBUTARY_GATEWAY"},
    )
    assert run.returncode == 0, f"stdout:\n{run.stdout}\nstderr:\n{run.stderr}"
    summary = json.loads(run.stdout)
    assert summary["health"] == "SERVING"
    assert summary["produced"] == summary["fetched"] == 110
    # The two error forms, as a JavaScript client reads them.
    assert summary["partition_error"] == {
        "reason": "UNKNOWN_TOPIC_OR_PARTITION",
        "kafka_code": 3,
        "retriable": True,
    }
    assert summary["call_error"] == {
        "code": "NOT_FOUND",
        "reason": "UNKNOWN_TOPIC_OR_PARTITION",
        "domain": "tributary.dev",
        "kafka_code": "3",
        "retriable": "true",
    }
    # ~8 MB fetched with default fields by a default client: each answer big, none over 4 MiB.
    assert 2 << 20 < summary["fetch"]["largest_answer_bytes"] < GRPC_DEFAULT_RECEIVE_LIMIT
    group = summary["group"]
    assert (group["state"], group["group_state"]) == ("Stable", "GROUP_STATE_STABLE")
    assert group["client_ids"] == ["node-example"]  # from the call metadata alone
    assert group["committed"] == 8 and group["lag"] == [0] * 8
    assert summary["log_start_offset"] == 1

    # What the JavaScript client wrote is what the Python SDK reads, byte for byte.
    ends = {
        p: admin.list_offsets({TopicPartition(topic, p): "latest"})[TopicPartition(topic, p)].offset
        for p in range(8)
    }
    read = read_all(cluster.gateway, topic, 8, until=ends)
    by_position = {(r.partition, r.offset): r for records in read.values() for r in records}
    assert sum(len(records) for records in read.values()) == 110 - 1  # offset 0 of partition 0 deleted
    for sent in summary["records"]:
        position = (sent["partition"], int(sent["offset"]))
        if position == (0, 0):
            assert position not in by_position
            continue
        record = by_position[position]
        assert (record.key, record.value) == (sent["key"].encode(), sent["value"].encode())
        assert record.headers == (("source", b"node"),)
    committed = admin.list_consumer_group_offsets(group["group_id"])
    assert {tp.partition: c.offset for tp, c in committed.items()} == ends


# ---- Fetch defaults ---------------------------------------------------------------------------


def _fetch_everything(stub, topic: str, partitions: int, *, raw: bool) -> tuple[dict[int, list], int]:
    """Default-field fetches of every partition until each reaches its high watermark."""
    offsets = dict.fromkeys(range(partitions), 0)
    got: dict[int, list] = {p: [] for p in range(partitions)}
    largest = 0
    for _ in range(200):
        answer = stub.Fetch(
            pb.FetchRequest(
                partitions=[
                    pb.FetchPartition(topic=topic, partition=p, offset=o) for p, o in offsets.items()
                ],
                raw_batches=raw,
            ),
            timeout=CALL_TIMEOUT,
        )
        largest = max(largest, answer.ByteSize())
        done = True
        for result in answer.partitions:
            assert not result.HasField("error"), result.error
            got[result.partition].append(result.record_batches if raw else list(result.records))
            offsets[result.partition] = result.next_offset
            done = done and result.next_offset >= result.high_watermark
        if done:
            return got, largest
    raise AssertionError("the fetches did not progress")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_a_default_fetch_fits_a_default_client(cluster, admin, stub, compression):
    topic = new_topic(admin, 8)
    # ~1.5 MB per partition; zstd batches of zeros are a few KiB on the wire, 1.5 MB decoded.
    value_size, per_partition = 50_000, 30
    producer = Producer(servers=cluster.gateway, compression=compression, batch_size=1 << 20, linger_ms=20)
    try:
        for p in range(8):
            for i in range(per_partition):
                value = bytearray(value_size)
                value[:15] = f"{p:03d}-{i:06d}-xxxx".encode()
                producer.send(topic, bytes(value), key=f"k{i}".encode(), partition=p)
        producer.flush(timeout=60)
    finally:
        producer.close()
    typed, largest_typed = _fetch_everything(stub, topic, 8, raw=False)
    assert 2 << 20 < largest_typed < GRPC_DEFAULT_RECEIVE_LIMIT
    for p in range(8):
        records = [r for chunk in typed[p] for r in chunk]
        assert [r.offset for r in records] == list(range(per_partition))
        assert [r.value[:15] for r in records] == [
            f"{p:03d}-{i:06d}-xxxx".encode() for i in range(per_partition)
        ]
        assert all(len(r.value) == value_size for r in records)
    _, largest_raw = _fetch_everything(stub, topic, 8, raw=True)
    assert largest_raw < GRPC_DEFAULT_RECEIVE_LIMIT
    # Asking for more works too, for a client that raised its own limit.
    with grpc.insecure_channel(
        cluster.gateway, options=[("grpc.max_receive_message_length", 64 << 20)]
    ) as channel:
        big = gateway_grpc.GatewayStub(channel).Fetch(
            pb.FetchRequest(
                partitions=[
                    pb.FetchPartition(topic=topic, partition=p, offset=0, max_bytes=8 << 20) for p in range(8)
                ],
                max_bytes=64 << 20,
            ),
            timeout=CALL_TIMEOUT,
        )
    assert big.ByteSize() > GRPC_DEFAULT_RECEIVE_LIMIT
    assert sum(len(r.records) for r in big.partitions) == 8 * per_partition


# ---- the two error forms ----------------------------------------------------------------------


def test_a_request_that_cannot_be_served_fails_a_partition_that_cannot_has_its_error(admin, stub):
    topic = new_topic(admin, 2)
    with pytest.raises(grpc.RpcError) as failed:
        stub.Produce(
            pb.ProduceRequest(topic=f"{topic}-missing", records=[pb.ProduceRecord(value=b"x")]), timeout=30
        )
    assert failed.value.code() == grpc.StatusCode.NOT_FOUND
    assert errors.error_from_rpc(failed.value).reason == "UNKNOWN_TOPIC_OR_PARTITION"

    answer = stub.Produce(
        pb.ProduceRequest(
            topic=topic,
            records=[
                pb.ProduceRecord(value=b"lost", partition=99),
                pb.ProduceRecord(value=b"kept", partition=1),
            ],
        ),
        timeout=CALL_TIMEOUT,
    )
    results = {r.partition: r for r in answer.partitions}
    assert results[99].error.reason == "UNKNOWN_TOPIC_OR_PARTITION" and results[99].error.kafka_code == 3
    assert not results[1].HasField("error") and results[1].base_offset == 0
    assert [(r.partition, r.offset) for r in answer.records] == [(99, -1), (1, 0)]


# ---- DeleteRecords ----------------------------------------------------------------------------


def _produce(servers: str, topic: str, counts: dict[int, int]) -> None:
    producer = Producer(servers=servers)
    try:
        for partition, count in counts.items():
            for i in range(count):
                producer.send(topic, f"v{i}".encode(), partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()


def test_delete_records_through_the_gateway(cluster, admin, stub):
    topic = new_topic(admin, 3)
    _produce(cluster.gateway, topic, {0: 10, 1: 5, 2: 4})
    answer = stub.DeleteRecords(
        pb.DeleteRecordsRequest(
            partitions=[
                pb.DeleteRecordsPartition(topic=topic, partition=0, offset=4),
                pb.DeleteRecordsPartition(topic=topic, partition=1, offset=-1),  # the high watermark
                pb.DeleteRecordsPartition(topic=topic, partition=2, offset=5),  # above it
                pb.DeleteRecordsPartition(topic=topic, partition=99, offset=1),
                pb.DeleteRecordsPartition(topic=f"{topic}-missing", partition=0, offset=1),
            ]
        ),
        timeout=CALL_TIMEOUT,
    )
    results = [(r.partition, r.log_start_offset, r.error.reason) for r in answer.partitions]
    assert results == [
        (0, 4, ""),
        (1, 5, ""),
        (2, -1, "OFFSET_OUT_OF_RANGE"),
        (99, -1, "UNKNOWN_TOPIC_OR_PARTITION"),
        (0, -1, "UNKNOWN_TOPIC_OR_PARTITION"),
    ]
    bad = stub.DeleteRecords(
        pb.DeleteRecordsRequest(partitions=[pb.DeleteRecordsPartition(topic=topic, partition=2, offset=-2)]),
        timeout=CALL_TIMEOUT,
    ).partitions[0]
    assert bad.error.reason == "OFFSET_OUT_OF_RANGE"
    with pytest.raises(grpc.RpcError) as twice:
        stub.DeleteRecords(
            pb.DeleteRecordsRequest(
                partitions=[pb.DeleteRecordsPartition(topic=topic, partition=0, offset=1)] * 2
            ),
            timeout=CALL_TIMEOUT,
        )
    assert errors.error_from_rpc(twice.value).reason == "INVALID_REQUEST"

    # The Admin API: the new log starts; never backwards; errors raised.
    tp0, tp2 = TopicPartition(topic, 0), TopicPartition(topic, 2)
    assert admin.delete_records({tp0: 2, tp2: 3}) == {tp0: 4, tp2: 3}
    with pytest.raises(OffsetOutOfRangeError):
        admin.delete_records({tp2: 100})
    earliest = admin.list_offsets({TopicPartition(topic, p): "earliest" for p in range(3)})
    assert {tp.partition: o.offset for tp, o in earliest.items()} == {0: 4, 1: 5, 2: 3}
    read = read_all(cluster.gateway, topic, 3, until={0: 10, 1: 0, 2: 4})
    assert [r.offset for r in read[0]] == list(range(4, 10)) and [r.offset for r in read[2]] == [3]


def test_the_delete_records_command(cluster, admin, tmp_path):
    topic = new_topic(admin, 2)
    _produce(cluster.gateway, topic, {0: 6, 1: 6})

    def tributary(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "gateway.cli.main", *args, "--gateway", cluster.gateway],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )

    one = tributary("delete-records", "--topic", topic, "--partition", "0", "--offset", "2")
    assert one.returncode == 0, one.stderr
    assert one.stdout.strip() == f"partition: {topic}-0\tlow_watermark: 2"
    offsets_file = tmp_path / "offsets.json"
    offsets_file.write_text(
        json.dumps(
            {
                "partitions": [
                    {"topic": topic, "partition": 0, "offset": 3},
                    {"topic": topic, "partition": 1, "offset": -1},
                ],
                "version": 1,
            }
        )
    )
    both = tributary("delete-records", "--offset-json-file", str(offsets_file))
    assert both.returncode == 0, both.stderr
    assert both.stdout.splitlines() == [
        f"partition: {topic}-0\tlow_watermark: 3",
        f"partition: {topic}-1\tlow_watermark: 6",
    ]
    too_far = tributary("delete-records", "--topic", topic, "--partition", "0", "--offset", "60")
    assert too_far.returncode == 1 and "above the high watermark" in too_far.stderr
    missing = tributary("delete-records", "--topic", topic, "--offset", "1")
    assert missing.returncode == 2 and "--partition" in missing.stderr
    offsets_file.write_text('{"partitions": [{"topic": "t"}]}')
    malformed = tributary("delete-records", "--offset-json-file", str(offsets_file))
    assert malformed.returncode == 2 and "not an offsets file" in malformed.stderr


# ---- the client id ----------------------------------------------------------------------------


def test_the_client_id_is_sent_logged_and_shown(cluster, admin, stub):
    topic = new_topic(admin, 1)
    producer = Producer(servers=cluster.gateway, client_id="billing-producer")
    try:
        producer.send(topic, b"x").get(timeout=30)
    finally:
        producer.close()
    log = cluster.run_dir / "gateway-0.log"
    deadline = time.monotonic() + 10
    while "client 'billing-producer' connected from" not in log.read_text():
        assert time.monotonic() < deadline, "the gateway did not log the producer's client id"
        time.sleep(0.05)

    group = f"{topic}-group"
    consumer = Consumer(
        servers=cluster.gateway, group_id=group, client_id="billing-7", auto_offset_reset="earliest"
    )
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while not consumer.assignment():
            assert time.monotonic() < deadline
            consumer.poll(timeout_ms=200)
        # A client in another language may name itself in the metadata only.
        joined = stub.JoinGroup(
            pb.JoinGroupRequest(group_id=group, subscription=pb.Subscription(topics=[topic])),
            metadata=[(CLIENT_ID_METADATA_KEY, "metadata-only")],
            timeout=CALL_TIMEOUT,
        )
        described = subprocess.run(
            [
                sys.executable,
                "-m",
                "gateway.cli.main",
                "groups",
                "describe",
                group,
                "--gateway",
                cluster.gateway,
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=60,
        )
        assert described.returncode == 0, described.stderr
        assert "billing-7" in described.stdout and "metadata-only" in described.stdout
        stub.LeaveGroup(
            pb.LeaveGroupRequest(group_id=group, member_id=joined.member_id), timeout=CALL_TIMEOUT
        )
    finally:
        consumer.close()
    listing = {g.group_id: g for g in stub.ListGroups(pb.ListGroupsRequest(), timeout=CALL_TIMEOUT).groups}
    assert listing[group].group_state == pb.GROUP_STATE_EMPTY and listing[group].state == "Empty"
