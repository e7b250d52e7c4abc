"""Fixtures for consumer-group integration tests: etcd, two coordinators, a storage node and a
gateway as real processes (one cluster per module), and helpers to create topics."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from launcher.processes import ServiceProcess
from services.etcd.embedded import EmbeddedEtcd
from services.proto import gateway_grpc, pb

from ..coordinator._cluster import Cluster, call

#: Sessions in these tests are short, so the coordinators accept them.
GROUP_ARGS = ("--group-min-session-timeout-ms", "1000")


class GroupCluster(Cluster):
    """A :class:`Cluster` with group settings for short sessions, and a gateway."""

    gateway: ServiceProcess | None = None

    def start_groups_cluster(self) -> GroupCluster:
        processes = [self.coordinator_process(c, *GROUP_ARGS) for c in ("c1", "c2")]
        processes.append(self.storage_process(1))
        with ThreadPoolExecutor(len(processes)) as pool:
            list(pool.map(lambda p: p.start(timeout=30), processes))
        self.wait_for(lambda md: len(md.brokers) == 1, what="the storage node registered")
        active = self.wait_active()
        # The standby first: gateway calls go gateway -> standby -> (forwarded) -> active.
        order = sorted(("c1", "c2"), key=lambda c: c == active)
        self.gateway = ServiceProcess(
            name="gateway",
            module="gateway.server.main",
            args=["--coordinators", ",".join(self.address(c) for c in order)],
            ready_file=self.run_dir / "gateway.ready.json",
            log_file=self.run_dir / "gateway.log",
        )
        self.gateway.start(timeout=30)
        return self

    def standby_id(self) -> str:
        active = self.wait_active()
        return next(c for c in self.coordinators if c != active)

    def gateway_stub(self) -> gateway_grpc.GatewayStub:
        assert self.gateway is not None, "started"
        address = f"127.0.0.1:{self.gateway.info['grpc_port']}"
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return gateway_grpc.GatewayStub(self._channels[address])

    def create_topic(self, name: str, partitions: int) -> str:
        call(self.stub().CreateTopic, pb.CreateTopicRequest(name=name, partitions=partitions))
        self.wait_for(
            lambda md: any(
                t.name == name
                and t.partitions
                and all(p.state == pb.PARTITION_STATE_ONLINE for p in t.partitions)
                for t in md.topics
            ),
            what=f"{name} online",
        )
        return name

    def stop_all(self) -> None:
        if self.gateway is not None:
            self.gateway.kill()
        super().stop_all()


def start_cluster(etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> GroupCluster:
    cluster = GroupCluster(etcd, tmp_path_factory.mktemp("groups-cluster"), f"groups-{uuid.uuid4().hex[:8]}")
    try:
        return cluster.start_groups_cluster()
    except BaseException:
        cluster.stop_all()
        raise


@pytest.fixture(scope="package")
def cluster(etcd: EmbeddedEtcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupCluster]:
    """One healthy cluster for every test of the package that injects no faults."""
    cluster = start_cluster(etcd, tmp_path_factory)
    try:
        yield cluster
    finally:
        cluster.stop_all()


def all_partitions(topic: str, count: int) -> set[tuple[str, int]]:
    return {(topic, p) for p in range(count)}


def settle(seconds: float) -> None:
    time.sleep(seconds)
