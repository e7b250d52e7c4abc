"""The ``tributary`` command as users run it: a subprocess per command, a detached local cluster.

The module brings a cluster up with ``tributary cluster up`` in a temporary data directory and
runs every other command against it through that directory's ``cluster.json``; the last test
takes the cluster through status, a crash, ``up`` (restart what died), ``down`` and ``up`` again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from launcher.local_cluster import LocalCluster, process_alive, read_cluster_file
from services.partitioner import partition_for_key

REPO = Path(__file__).resolve().parents[3]


def tributary(
    data_dir: Path, *args: str, stdin: str | None = None, timeout: float = 120, env: dict | None = None
) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "TRIBUTARY_GATEWAY"}
    environment.update(TRIBUTARY_DATA_DIR=str(data_dir), **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        env=environment,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, (
        f"exit {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return result


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("cli-cluster")
    try:
        ok(tributary(directory, "cluster", "up", "--storage-nodes", "2"))
        yield directory
    finally:
        tributary(directory, "cluster", "down")
        LocalCluster.from_data_dir(directory).stop()  # whatever `down` could not stop


def test_cluster_up_wrote_every_address(data_dir):
    described = read_cluster_file(data_dir)
    assert described["gateway"].startswith("127.0.0.1:")
    assert len(described["storage_nodes"]) == 2 and len(described["coordinators"]) == 1
    assert all(process_alive(entry["pid"]) for entry in described["storage_nodes"].values())
    assert (data_dir / "run" / "gateway-0.log").exists()


def test_topics_commands(data_dir):
    assert (
        ok(
            tributary(
                data_dir,
                "topics",
                "create",
                "orders",
                "--partitions",
                "3",
                "--config",
                "retention.ms=3600000",
            )
        ).stdout.strip()
        == "Created topic orders."
    )
    assert "orders" in ok(tributary(data_dir, "topics", "list")).stdout.split()
    described = ok(tributary(data_dir, "topics", "describe", "orders")).stdout
    assert "PartitionCount: 3" in described and "retention.ms=3600000" in described
    assert len([line for line in described.splitlines() if line.startswith("orders ")]) == 3
    altered = ok(tributary(data_dir, "topics", "alter", "orders", "--config", "retention.ms=60000")).stdout
    assert "retention.ms=60000" in altered
    ok(tributary(data_dir, "topics", "delete", "orders"))
    assert "orders" not in tributary(data_dir, "topics", "list").stdout.split()


def test_produce_and_consume_round_trip(data_dir):
    ok(tributary(data_dir, "topics", "create", "lines", "--partitions", "4"))
    lines = [f"user-{i % 37}|event number {i}" for i in range(3000)]
    produced = ok(
        tributary(
            data_dir,
            "produce",
            "lines",
            "--key-separator",
            "|",
            "--header",
            "source=cli",
            "--compression",
            "gzip",
            stdin="\n".join(lines) + "\n",
        )
    )
    assert "Produced 3000 records" in produced.stderr
    consumed = ok(
        tributary(
            data_dir,
            "consume",
            "lines",
            "--from-beginning",
            "--max-messages",
            "3000",
            "--format",
            "json",
            "--timeout-ms",
            "20000",
        )
    )
    records = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert len(records) == 3000 and "Processed a total of 3000 messages" in consumed.stderr
    by_partition = defaultdict(list)
    for record in records:
        assert set(record) == {"topic", "partition", "offset", "timestamp", "key", "value", "headers"}
        assert record["headers"] == [["source", "cli"]]
        assert record["partition"] == partition_for_key(record["key"].encode(), 4)
        by_partition[record["partition"]].append(record)
    for items in by_partition.values():
        assert [r["offset"] for r in items] == list(range(len(items)))
    expected = defaultdict(list)
    for line in lines:
        key, value = line.split("|", 1)
        expected[partition_for_key(key.encode(), 4)].append([key, value])
    assert {p: [[r["key"], r["value"]] for r in items] for p, items in by_partition.items()} == dict(expected)

    one = ok(
        tributary(
            data_dir,
            "consume",
            "lines",
            "--partition",
            "1",
            "--offset",
            "2",
            "--max-messages",
            "2",
            "--print-key",
        )
    )
    assert one.stdout.splitlines() == ["\t".join(pair) for pair in expected[1][2:4]]
    offsets = ok(tributary(data_dir, "offsets", "lines")).stdout
    rows = {line.split()[1]: line.split() for line in offsets.splitlines()[1:]}
    assert {p: int(row[3]) for p, row in rows.items()} == {str(p): len(expected[p]) for p in range(4)}


def test_consume_from_timestamp(data_dir):
    ok(tributary(data_dir, "topics", "create", "timed", "--partitions", "1"))
    ok(tributary(data_dir, "produce", "timed", stdin="early\n"))
    cut = int(time.time() * 1000) + 1
    time.sleep(0.05)
    ok(tributary(data_dir, "produce", "timed", stdin="late-1\nlate-2\n"))
    result = ok(tributary(data_dir, "consume", "timed", "--from-timestamp", str(cut), "--max-messages", "2"))
    assert result.stdout.splitlines() == ["late-1", "late-2"]


def test_consume_read_committed_skips_aborted_and_open_transactions(data_dir):
    from gateway.client import Producer

    ok(tributary(data_dir, "topics", "create", "txn-lines", "--partitions", "1"))
    servers = read_cluster_file(data_dir)["gateway"]
    with Producer(servers=servers, transactional_id="cli-test") as producer:
        producer.init_transactions()
        for outcome in ("kept", "dropped", "pending"):
            producer.begin_transaction()
            for i in range(3):
                producer.send("txn-lines", f"{outcome}-{i}".encode())
            producer.flush()
            if outcome == "kept":
                producer.commit_transaction()
            elif outcome == "dropped":
                producer.abort_transaction()
        committed = ok(
            tributary(
                data_dir,
                "consume",
                "txn-lines",
                "--from-beginning",
                "--isolation-level",
                "read_committed",
                "--timeout-ms",
                "3000",
            )
        )
        everything = ok(
            tributary(data_dir, "consume", "txn-lines", "--from-beginning", "--max-messages", "9")
        )
        producer.abort_transaction()
    assert committed.stdout.splitlines() == ["kept-0", "kept-1", "kept-2"]
    assert len(everything.stdout.splitlines()) == 9


def test_transactions_list_and_describe(data_dir):
    from gateway.client import Producer

    ok(tributary(data_dir, "topics", "create", "txn-ops", "--partitions", "2"))
    servers = read_cluster_file(data_dir)["gateway"]
    with Producer(servers=servers, transactional_id="ops-open") as producer:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send("txn-ops", b"pending", partition=1).get(10)
        listed = ok(tributary(data_dir, "transactions", "list", "--state", "Ongoing")).stdout.splitlines()
        rows = {line.split()[0]: line.split() for line in listed[1:]}
        assert rows["ops-open"][1] == "Ongoing" and rows["ops-open"][5] == "1", listed
        assert rows["ops-open"][6].endswith("s"), listed  # the open transaction's age
        described = ok(tributary(data_dir, "transactions", "describe", "ops-open", "--format", "json"))
        (entry,) = json.loads(described.stdout)
        assert entry["state"] == "Ongoing" and entry["partitions"] == [["txn-ops", 1]]
        producer.commit_transaction()
    after = json.loads(ok(tributary(data_dir, "transactions", "list", "--format", "json")).stdout)
    assert {d["transactional_id"]: d["state"] for d in after}["ops-open"] == "CompleteCommit"
    assert "ops-open" not in ok(tributary(data_dir, "transactions", "list", "--state", "Ongoing")).stdout
    missing = tributary(data_dir, "transactions", "describe", "no-such-id")
    assert missing.returncode != 0 and "TRANSACTIONAL_ID_NOT_FOUND" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
    bad_state = tributary(data_dir, "transactions", "list", "--state", "Open")
    assert bad_state.returncode != 0 and "unknown transaction state 'Open'" in bad_state.stderr


def test_demo(data_dir):
    result = ok(tributary(data_dir, "demo", "--records", "2000"))
    assert "check: OK" in result.stdout
    counts = [int(line.split()[1]) for line in result.stdout.splitlines()[1:9]]
    assert sum(counts) == 2000 and all(counts)
    again = ok(
        tributary(data_dir, "demo", "--records", "500")
    )  # reuses the topic, checks only the new events
    assert "using the existing topic activity" in again.stderr and "check: OK" in again.stdout


def test_errors_are_one_line(data_dir):
    for args in (
        ["consume", "missing-topic", "--max-messages", "1"],
        ["topics", "describe", "missing-topic"],
        ["topics", "create", "bad", "--partitions", "1", "--config", "retention.ms=soon"],
    ):
        result = tributary(data_dir, *args)
        assert result.returncode != 0
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, (
            result.stderr
        )
    missing = tributary(data_dir, "produce", "missing-topic", stdin="x\n")
    assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_lifecycle_status_crash_up_down_up(data_dir):
    status = ok(tributary(data_dir, "cluster", "status")).stdout
    assert status.count("alive") == 5 and "dead" not in status  # etcd, coordinator, 2 storage, gateway
    assert "lines" in status, "partitions and their leaders, from GetMetadata"
    assert "UNDER-REPLICATED" in status, "one summary row per topic by default"
    every = ok(tributary(data_dir, "cluster", "status", "--partitions")).stdout
    assert "ISR" in every and "lines" in every, "one row per partition when asked"

    victim = read_cluster_file(data_dir)["storage_nodes"]["1"]["pid"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while process_alive(victim) and time.monotonic() < deadline:
        time.sleep(0.05)
    crashed = tributary(data_dir, "cluster", "status")
    assert crashed.returncode == 1 and "dead" in crashed.stdout

    restarted = ok(tributary(data_dir, "cluster", "up"))
    assert "starting storage-1" in restarted.stderr and "starting gateway" not in restarted.stderr
    ok(tributary(data_dir, "cluster", "status"))

    down = ok(tributary(data_dir, "cluster", "down"))
    assert "stopped 5 processes" in down.stdout
    stopped = tributary(data_dir, "cluster", "status")
    assert stopped.returncode == 1 and "no cluster is running" in stopped.stderr
    unreachable = tributary(data_dir, "topics", "list")
    assert unreachable.returncode == 1 and "cluster up" in unreachable.stderr

    ok(tributary(data_dir, "cluster", "up"))
    recovered = ok(
        tributary(
            data_dir,
            "consume",
            "lines",
            "--from-beginning",
            "--max-messages",
            "3000",
            "--timeout-ms",
            "20000",
        )
    )
    assert len(recovered.stdout.splitlines()) == 3000, "the data survived down and up"
