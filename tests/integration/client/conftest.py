"""A real local cluster for the SDK tests: etcd, a coordinator, two storage nodes, two gateways.

One cluster serves every test of the package that does not break things on purpose (those start
their own, see ``test_faults.py``). Tests use their own topics (``unique_topic``).
"""

from __future__ import annotations

import uuid

import pytest

from gateway.client import Admin, NewTopic
from launcher.local_cluster import LocalCluster, LocalClusterSpec


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    spec = LocalClusterSpec(storage_nodes=2, coordinators=1, gateways=2, session_timeout_s=2)
    # Each LocalCluster has its own etcd, so no unique cluster name is needed.
    with LocalCluster(tmp_path_factory.mktemp("client-cluster"), spec) as local:
        yield local


@pytest.fixture(scope="session")
def servers(cluster) -> str:
    return cluster.gateway


@pytest.fixture(scope="session")
def admin(servers):
    with Admin(servers=servers) as client:
        yield client


@pytest.fixture
def make_topic(admin):
    """``make_topic(partitions=1, **configs) -> name``: a fresh topic for one test."""

    def create(partitions: int = 1, **configs) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        admin.create_topics(
            [NewTopic(name, partitions, 1, {k.replace("_", "."): str(v) for k, v in configs.items()})]
        )
        return name

    return create
