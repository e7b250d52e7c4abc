"""``tributary top`` against a real local cluster: nodes, leaders, traffic rates, group lag."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec

REPO = Path(__file__).resolve().parents[3]


def test_top_shows_nodes_leaders_and_traffic(tmp_path):
    with LocalCluster(tmp_path / "cluster", LocalClusterSpec(storage_nodes=2)) as cluster:
        admin = Admin(servers=cluster.gateway)
        admin.create_topics([NewTopic("watched", num_partitions=4)])
        admin.close()
        stop = threading.Event()

        def produce_while_watched():
            producer = Producer(servers=cluster.gateway, linger_ms=5)
            while not stop.is_set():
                for i in range(200):
                    producer.send("watched", b"v" * 200, key=b"k%d" % i)
                producer.flush()
            producer.close()

        writer = threading.Thread(target=produce_while_watched)
        writer.start()
        try:
            env = {k: v for k, v in os.environ.items() if k != "TRIBUTARY_GATEWAY"}
            result = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "gateway.cli.main",
                    "top",
                    "--gateway",
                    cluster.gateway,
                    "--iterations",
                    "2",
                    "--interval",
                    "1.5",
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                env=env,
                timeout=60,
            )
        finally:
            stop.set()
            writer.join(30)
    assert result.returncode == 0, result.stderr
    screens = result.stdout.split("tributary top")
    assert len(screens) == 3  # two screens
    last = screens[-1]
    assert "topics 1  partitions 4  offline 0  under-replicated 0  under-min-isr 0  reassigning 0" in last
    node_lines = [line.split() for line in last.splitlines() if line[:1].isdigit()]
    assert sorted(int(cols[0]) for cols in node_lines) == [0, 1]
    assert sum(int(cols[2]) for cols in node_lines) == 4  # every partition has a leader
    # The second screen has rates, and bytes went in while it watched.
    # NODE ADDRESS LEADERS REPLICAS <size> MB <in> MB/s <records> rec/s <out> MB/s
    assert sum(int(cols[3]) for cols in node_lines) == 4  # one replica per partition
    records_per_second = [float(cols[8].replace(",", "")) for cols in node_lines]
    assert all(cols[9] == "rec/s" for cols in node_lines) and sum(records_per_second) > 0
