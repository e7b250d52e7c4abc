"""auto.leader.rebalance.enable (issue 18), with real processes: after a storage node restarts it
leads nothing; the active controller's periodic imbalance check (here every second) gives each
partition back to its preferred leader without anyone asking."""

from __future__ import annotations

import pytest

from gateway.client import Admin, NewTopic
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from tests.integration.replication._chaos import describe
from tests.support.wait import seconds_until

TOPIC = "balanced"
PARTITIONS = 4


@pytest.fixture
def cluster(tmp_path):
    spec = LocalClusterSpec(
        storage_nodes=2,
        coordinators=1,
        gateways=1,
        session_timeout_s=2,
        coordinator_args=["--leader-imbalance-check-interval-s", "1"],
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


def test_leadership_returns_to_preferred_replicas_on_its_own(cluster):
    with Admin(servers=cluster.gateway) as admin:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 2)])

        def preferred_everywhere() -> bool:
            states = describe(admin, TOPIC).values()
            return all(s.leader == s.replicas[0] and len(s.isr) == 2 for s in states)

        seconds_until(preferred_everywhere, timeout=30, what="preferred leaders at first", interval=0.2)
        preferring_0 = [p for p, s in describe(admin, TOPIC).items() if s.replicas[0] == 0]
        assert preferring_0, "placement gives node 0 some preferred leaders"

        cluster.storage_nodes[0].stop(timeout=60)  # controlled shutdown: node 1 leads everything
        seconds_until(
            lambda: all(s.leader == 1 for s in describe(admin, TOPIC).values()),
            timeout=30,
            what="node 1 leading every partition",
            interval=0.2,
        )
        cluster.start_storage_node(0)
        took = seconds_until(preferred_everywhere, timeout=30, what="preferred leaders again", interval=0.2)
        print(f"\nleadership back on the preferred replicas {took:.1f} s after node 0 restarted")
    log = "".join(p.read_text(errors="replace") for p in cluster.run_dir.glob("coordinator*.log"))
    assert "leader imbalance above 10%" in log
