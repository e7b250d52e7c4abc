"""Rolling restart under load (issue 18): 3 storage nodes, RF 3, min.insync.replicas=2, an
idempotent acks=all producer sending numbered records throughout and a consumer reading them;
each node in turn is stopped with SIGTERM and started again, the next only once it is back in
every ISR. Controlled shutdown moves each node's leadership away before it exits, so: no send
fails, nothing acknowledged is lost, nothing is written twice, and the stopping node led nothing
when it exited (its own log, and the controller's, say so).

The longest gap between two acknowledgements is printed (the issue saw 9.7 s before controlled
shutdown); it is a measure here, not an assertion -- speed belongs to bench/.
"""

from __future__ import annotations

import itertools
import re
import subprocess
import sys
import threading
import time
from typing import Any

import grpc
import pytest

from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import errors
from services.proto import coordinator_grpc, gateway_grpc, pb
from tests.integration.replication._chaos import (
    ConsumerLog,
    ProduceHistory,
    check_acknowledged,
    check_consumer_saw_everything,
    check_dense,
    check_known,
    describe,
    duplicates,
    quote,
    read_logs,
    record_value,
)
from tests.support.wait import seconds_until

TOPIC = "rolling"
PARTITIONS = 3
NODES = (0, 1, 2)
TOPIC_CONFIGS = {"min.insync.replicas": "2", "message.timestamp.type": "LogAppendTime"}
PRODUCER_SETTINGS: dict[str, Any] = {
    "acks": "all",  # idempotent by default
    "linger_ms": 5,
    "request_timeout_ms": 10_000,
    "delivery_timeout_ms": 60_000,
    "retry_backoff_ms": 50,
    "retry_backoff_max_ms": 500,
}
#: Records per second the producer sends throughout.
RATE = 200
#: The node's line once the controller has moved everything it could (storage_node/shutdown.py).
DONE = re.compile(r"controlled shutdown done in [\d.]+s: leads only the (\d+) partitions")


class PacedProducer(threading.Thread):
    """Sends numbered records to every partition in turn, ``RATE`` a second, until stopped;
    remembers when each acknowledgement arrived."""

    def __init__(self, servers: str, history: ProduceHistory) -> None:
        super().__init__(name="rolling-producer", daemon=True)
        self.servers = servers
        self.history = history
        self.ack_times: list[float] = []
        self.sent = 0
        self.error: BaseException | None = None
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def _delivered(self, seq: int, error, metadata) -> None:
        self.history.on_delivery(0, seq, error, metadata)
        if error is None:
            self.ack_times.append(time.monotonic())

    def run(self) -> None:
        try:
            with Producer(servers=self.servers, **PRODUCER_SETTINGS) as producer:
                start = time.monotonic()
                while not self._halt.is_set():
                    seq = self.sent
                    ahead = start + seq / RATE - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                    partition = seq % PARTITIONS
                    self.history.on_send(record_value(0, seq), partition)
                    producer.send(
                        TOPIC,
                        record_value(0, seq),
                        partition=partition,
                        on_delivery=lambda error, metadata, seq=seq: self._delivered(seq, error, metadata),
                    )
                    self.sent += 1
                producer.flush(90)
        except BaseException as exc:  # noqa: BLE001 -- reported by the test
            self.error = exc

    def longest_ack_gap_s(self) -> float:
        times = sorted(self.ack_times)
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=len(NODES),
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        storage_args=["--replica-lag-time-max-ms", "1500", "--replica-fetch-backoff-ms", "200"],
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


def full_isrs(admin: Admin) -> bool:
    return all(s.leader >= 0 and len(s.isr) == len(NODES) for s in describe(admin, TOPIC).values())


def elect_preferred_leaders(cluster: LocalCluster) -> dict[int, str]:
    """Gateway.ElectLeaders (forwarded to the controller) for every partition of the topic:
    partition -> "" (moved) or the reason it was not."""
    with grpc.insecure_channel(cluster.gateway) as channel:
        stub = gateway_grpc.GatewayStub(channel)
        response = stub.ElectLeaders(pb.ElectLeadersRequest(topics=[TOPIC]), timeout=30)
    return {r.partition: r.error.reason if r.HasField("error") else "" for r in response.results}


def elect_with_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    """``tributary topics elect-leaders ARGS`` against the cluster's gateway."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "gateway.cli.main",
            "topics",
            "elect-leaders",
            *args,
            "--gateway",
            cluster.gateway,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def refused_shutdown(cluster: LocalCluster, node_id: int, broker_epoch: int) -> errors.TributaryError:
    """Send a ControlledShutdown the controller must refuse; the error it answered."""
    address = f"127.0.0.1:{cluster.coordinators[0].info['grpc_port']}"
    with grpc.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        request = pb.ControlledShutdownRequest(node_id=node_id, broker_epoch=broker_epoch, wait_ms=1000)
        with pytest.raises(grpc.RpcError) as refused:
            stub.ControlledShutdown(request, timeout=10)
    return errors.error_from_rpc(refused.value)


def test_rolling_restart_under_load_loses_nothing_and_moves_leaders_first(cluster):
    admin = Admin(servers=cluster.gateway)
    admin.create_topics([NewTopic(TOPIC, PARTITIONS, len(NODES), TOPIC_CONFIGS)])
    seconds_until(lambda: full_isrs(admin), timeout=30, what="a full ISR everywhere", interval=0.2)

    # A request of an earlier run of a node (its registration's revision is past 1), and one of
    # a node that is not registered, change nothing.
    before = {p: (s.leader, s.leader_epoch, tuple(s.isr)) for p, s in describe(admin, TOPIC).items()}
    assert isinstance(refused_shutdown(cluster, 0, broker_epoch=1), errors.StaleBrokerEpochError)
    assert isinstance(refused_shutdown(cluster, 7, broker_epoch=1), errors.BrokerNotAvailableError)
    after = {p: (s.leader, s.leader_epoch, tuple(s.isr)) for p, s in describe(admin, TOPIC).items()}
    assert after == before

    history = ProduceHistory()
    producer = PacedProducer(cluster.gateway, history)
    consumer = ConsumerLog(servers=cluster.gateway, topic=TOPIC, partitions=PARTITIONS)
    restarts = []
    try:
        consumer.start()
        producer.start()
        seconds_until(lambda: len(history.acks) >= RATE, timeout=30, what="the producer is acknowledged")
        for node in NODES:
            led = [p for p, s in describe(admin, TOPIC).items() if s.leader == node]
            process = cluster.storage_nodes[node]
            log_start = process.log_file.stat().st_size
            stopping = time.monotonic()
            assert process.stop(timeout=60) == 0, f"node {node} did not exit cleanly"
            stopped_s = time.monotonic() - stopping
            own_log = process.log_file.read_bytes()[log_start:].decode(errors="replace")
            done = DONE.search(own_log)
            assert done is not None, f"node {node} did not finish its controlled shutdown:\n{own_log[-3000:]}"
            assert done.group(1) == "0", f"node {node} still led partitions when it exited"
            cluster.start_storage_node(node)
            rejoin_s = seconds_until(
                lambda: full_isrs(admin), timeout=30, what=f"node {node} back in every ISR", interval=0.2
            )
            restarts.append(
                {"node": node, "led": led, "stop_s": round(stopped_s, 2), "rejoin_s": round(rejoin_s, 1)}
            )
        # The last node restarted leads nothing now: preferred leader election, still under load,
        # gives every partition back to its first replica.
        states = describe(admin, TOPIC)
        moved = {
            tp.partition: error.reason if error is not None else ""
            for tp, error in admin.elect_leaders([TOPIC]).items()
        }
        assert moved == {
            p: ("ELECTION_NOT_NEEDED" if s.leader == s.replicas[0] else "") for p, s in states.items()
        }
        balanced = seconds_until(
            lambda: all(s.leader == s.replicas[0] for s in describe(admin, TOPIC).values()),
            timeout=10,
            what="every partition led by its first replica",
            interval=0.1,
        )
        assert set(elect_preferred_leaders(cluster).values()) == {"ELECTION_NOT_NEEDED"}
        cli = elect_with_cli(cluster, TOPIC)
        assert cli.returncode == 0, cli.stderr
        assert sorted(cli.stdout.splitlines()) == sorted(
            f"{TOPIC}-{p}\tpreferred leader leads already" for p in range(PARTITIONS)
        )
        unknown = elect_with_cli(cluster, TOPIC, "--partition", str(PARTITIONS + 5))
        assert unknown.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in unknown.stdout + unknown.stderr
        seconds_until(lambda: len(history.acks) >= producer.sent - RATE, timeout=30, what="acks catch up")
    finally:
        producer.stop()
        producer.join(120)
    describe_after = describe(admin, TOPIC)
    try:
        assert producer.error is None, f"the producer failed: {producer.error!r}"
        assert not producer.is_alive(), "the producer did not flush"
        assert history.settled == producer.sent, f"{producer.sent - history.settled} sends never settled"
        logs = read_logs(cluster.gateway, TOPIC, PARTITIONS, timeout_s=60)
        ends = {p: (records[-1].offset + 1 if records else 0) for p, records in logs.items()}
        seconds_until(lambda: consumer.reached(ends), timeout=60, what="the consumer reads everything")
    finally:
        consumer.stop(30)
        admin.close()
    assert consumer.error is None, f"the consumer failed: {consumer.error!r}"

    summary = {
        "sent": producer.sent,
        "acknowledged": len(history.acks),
        "failed": len(history.failures),
        "failure_kinds": sorted({reason.split(":")[0] for reason in history.failures.values()}),
        "duplicates": duplicates(logs),
        "longest_ack_gap_s": round(producer.longest_ack_gap_s(), 2),
        "restarts": restarts,
        "leaders_after_election": {p: s.leader for p, s in describe_after.items()},
        "election_visible_s": round(balanced, 2),
    }
    print(f"\nrolling restart summary: {summary}")
    controller_log = "".join(p.read_text(errors="replace") for p in cluster.run_dir.glob("coordinator*.log"))
    for node in NODES:
        assert f"node {node} asked for a controlled shutdown" in controller_log
    checks = {
        "no send failed": [f"{v!r}: {why}" for v, why in history.failures.items()],
        "no record written twice (idempotent producer)": (
            [f"{duplicates(logs)} duplicates"] if duplicates(logs) else []
        ),
        "final logs dense from offset 0": check_dense(logs),
        "acknowledged records in the final log at their offsets": check_acknowledged(history.acks, logs),
        "final log holds only records sent": check_known(logs, history.sent),
        "consumer got every record of the final log": check_consumer_saw_everything(consumer.seen, logs),
    }
    broken = {name: violations for name, violations in checks.items() if violations}
    assert not broken, (
        "\n".join(f"{name}: {quote(v)}" for name, v in broken.items()) + f"\nsummary: {summary}"
    )
