"""A real local cluster for the SDK tests: etcd, a coordinator, two storage nodes, two gateways.

One cluster serves every test of the package that does not break things on purpose (those start
their own, see ``test_faults.py``). Tests use their own topics (``unique_topic``).

Every test runs twice, once per data path: ``raw`` (the gateways offer their raw data listener,
so the SDK's default ``data_path="auto"`` produces and fetches over it) and ``grpc`` (the
gateways run with ``--data-listener false``, so the SDK falls back to gRPC, as with a gateway
that offers no listener).
"""

from __future__ import annotations

import uuid

import pytest

from gateway.client import Admin, NewTopic
from launcher.local_cluster import LocalCluster, LocalClusterSpec

DATA_PATHS = {"raw": [], "grpc": ["--data-listener", "false"]}


@pytest.fixture(scope="session", params=list(DATA_PATHS))
def data_path(request) -> str:
    """Which data path the SDK takes in this run of the tests: ``raw`` or ``grpc``."""
    return request.param


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, data_path):
    spec = LocalClusterSpec(
        storage_nodes=2, coordinators=1, gateways=2, session_timeout_s=2, gateway_args=DATA_PATHS[data_path]
    )
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
