"""Fixtures for coordinator integration tests (see ``_cluster.py`` for the cluster helper)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.etcd.embedded import EmbeddedEtcd

from ._cluster import SHARED_RACKS, Cluster


@pytest.fixture
def make_cluster(etcd: EmbeddedEtcd, tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """Build clusters on the shared etcd (or a given one); all their processes die at teardown."""
    clusters: list[Cluster] = []

    def make(server: EmbeddedEtcd | None = None) -> Cluster:
        cluster = Cluster(
            server or etcd, tmp_path / f"cluster-{len(clusters)}", f"test-{uuid.uuid4().hex[:8]}"
        )
        clusters.append(cluster)
        return cluster

    yield make
    for cluster in clusters:
        cluster.stop_all()


@pytest.fixture(scope="module")
def shared_cluster(etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two coordinators and three storage nodes (racks r1, r1, r2), healthy, for one test module.

    Tests on it use their own topic names and never inject faults.
    """
    cluster = Cluster(etcd, tmp_path_factory.mktemp("shared-cluster"), f"shared-{uuid.uuid4().hex[:8]}")
    try:
        cluster.start(["c1", "c2"], SHARED_RACKS)
        cluster.wait_active()
        yield cluster
    finally:
        cluster.stop_all()
