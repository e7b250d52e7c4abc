"""Helpers for coordinator tests: a real cluster of etcd, coordinator and storage-node processes.

Every :class:`Cluster` has its own cluster name (etcd prefix), so tests sharing the session etcd
cannot see each other's keys. Processes are started through ``launcher.processes`` -- the launch
path users get -- several at once, and are killed at the end of the test whatever happened.
Calls go through the Coordinator gRPC API with a synchronous channel; failures come back as the
typed taxonomy (``services.errors.error_from_rpc``) so tests assert on reasons, not strings.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc

from launcher.processes import ServiceProcess
from services import errors
from services.etcd.embedded import EmbeddedEtcd
from services.proto import coordinator_grpc, pb, storage_grpc

#: Lease TTL of every process in these tests: short, so faults show quickly.
TTL_S = 2
#: Racks of the shared cluster's storage nodes: two on r1, one on r2, so rack spreading is visible.
SHARED_RACKS = {1: "r1", 2: "r1", 3: "r2"}


class Cluster:
    """Processes of one test cluster on one etcd."""

    def __init__(self, etcd: EmbeddedEtcd, run_dir: Path, name: str) -> None:
        self.etcd = etcd
        self.run_dir = run_dir
        self.name = name
        self.coordinators: dict[str, ServiceProcess] = {}
        self.storage: dict[int, ServiceProcess] = {}
        self._channels: dict[str, grpc.Channel] = {}

    # -- processes --------------------------------------------------------------------------

    def _common(self) -> list[str]:
        return [
            "--etcd-endpoints",
            self.etcd.endpoint,
            "--cluster",
            self.name,
            "--session-timeout-s",
            str(TTL_S),
        ]

    def coordinator_process(self, coordinator_id: str, *extra: str) -> ServiceProcess:
        process = ServiceProcess(
            name=coordinator_id,
            module="coordinator.main",
            args=[
                *self._common(),
                "--coordinator-id",
                coordinator_id,
                "--reconcile-interval-s",
                "0.5",
                "--storage-rpc-timeout-s",
                "2",
                *extra,
            ],
            ready_file=self.run_dir / f"{coordinator_id}.ready.json",
            log_file=self.run_dir / f"{coordinator_id}.log",
        )
        self.coordinators[coordinator_id] = process
        return process

    def storage_process(self, node_id: int, rack: str = "") -> ServiceProcess:
        args = [
            *self._common(),
            "--node-id",
            str(node_id),
            "--log-dirs",
            str(self.run_dir / f"data-{node_id}"),
        ]
        if rack:
            args += ["--rack", rack]
        process = ServiceProcess(
            name=f"storage-{node_id}",
            module="storage_node.main",
            args=args,
            ready_file=self.run_dir / f"storage-{node_id}.ready.json",
            log_file=self.run_dir / f"storage-{node_id}.log",
        )
        self.storage[node_id] = process
        return process

    def start(
        self,
        coordinators: list[str],
        storage: dict[int, str] | list[int],
        *,
        coordinator_args: tuple[str, ...] = (),
    ) -> Cluster:
        """Start the given coordinators (with ``coordinator_args`` added to their flags) and
        storage nodes (``{node_id: rack}``) in parallel."""
        racks = storage if isinstance(storage, dict) else {n: "" for n in storage}
        processes = [self.coordinator_process(c, *coordinator_args) for c in coordinators]
        processes += [self.storage_process(n, rack) for n, rack in racks.items()]
        with ThreadPoolExecutor(len(processes) or 1) as pool:
            list(pool.map(lambda p: p.start(timeout=30), processes))
        if racks:
            self.wait_for(
                lambda md: len(md.brokers) == len(racks), what=f"{len(racks)} storage nodes registered"
            )
        return self

    def stop_all(self) -> None:
        for process in [*self.coordinators.values(), *self.storage.values()]:
            process.kill()
        for channel in self._channels.values():
            channel.close()

    # -- calls ---------------------------------------------------------------------------------

    def address(self, coordinator_id: str) -> str:
        return f"127.0.0.1:{self.coordinators[coordinator_id].info['grpc_port']}"

    def stub(self, coordinator_id: str | None = None) -> coordinator_grpc.CoordinatorStub:
        """A stub for a coordinator (default: the active one, else the first)."""
        coordinator_id = coordinator_id or self.active_id() or next(iter(self.coordinators))
        address = self.address(coordinator_id)
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return coordinator_grpc.CoordinatorStub(self._channels[address])

    def storage_stub(self, node_id: int) -> storage_grpc.StorageNodeStub:
        address = f"127.0.0.1:{self.storage[node_id].info['grpc_port']}"
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        return storage_grpc.StorageNodeStub(self._channels[address])

    def active_id(self) -> str | None:
        """The coordinator that says it is active, asking every running one -- once every running
        one names it as the active controller (a standby that has not yet seen the election answers
        an admin call with NOT_CONTROLLER instead of forwarding it)."""
        active, named = None, set()
        for coordinator_id, process in self.coordinators.items():
            if not process.is_running() or not process.info:
                continue
            try:
                info = self.stub(coordinator_id).GetControllerInfo(pb.GetControllerInfoRequest(), timeout=1)
            except grpc.RpcError:
                continue
            if info.is_active:
                active = coordinator_id
            named.add(info.active_id)
        return active if named == {active} else None

    def metadata(self, coordinator_id: str | None = None, topics=(), timeout: float = 5.0):
        return self.stub(coordinator_id).GetMetadata(
            pb.GetMetadataRequest(topics=list(topics)), timeout=timeout
        )

    def local_partitions(self, node_id: int) -> set[tuple[str, int]]:
        response = self.storage_stub(node_id).DescribePartitions(pb.DescribePartitionsRequest(), timeout=5)
        return {(p.topic, p.partition) for p in response.partitions}

    # -- waiting -----------------------------------------------------------------------------

    def wait_for(
        self,
        predicate: Callable[[Any], bool],
        *,
        what: str,
        timeout: float = 15.0,
        coordinator_id: str | None = None,
        interval: float = 0.05,
    ):
        """Poll GetMetadata until ``predicate(metadata)``; return that metadata. Errors count as
        "not yet" (a coordinator may be UNAVAILABLE during the faults under test)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = self.metadata(coordinator_id, timeout=1)
                if predicate(last):
                    return last
            except grpc.RpcError as exc:
                last = exc
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout}s waiting for {what}; last answer: {last}")

    def wait_stable(
        self,
        predicate: Callable[[Any], bool],
        *,
        what: str,
        hold: float,
        timeout: float = 30.0,
        coordinator_id: str | None = None,
    ):
        """Wait until ``predicate(metadata)`` has held without a break for ``hold`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{what} did not hold for {hold}s within {timeout}s")
            self.wait_for(predicate, what=what, timeout=remaining, coordinator_id=coordinator_id)
            held_since = time.monotonic()
            while time.monotonic() - held_since < hold:
                try:
                    metadata = self.metadata(coordinator_id, timeout=1)
                except grpc.RpcError:
                    break
                if not predicate(metadata):
                    break
                time.sleep(0.05)
            else:
                return metadata

    def wait_active(self, *, timeout: float = 15.0, exclude: str | None = None) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            active = self.active_id()
            if active is not None and active != exclude:
                return active
            time.sleep(0.05)
        raise AssertionError(f"no active controller (other than {exclude}) after {timeout}s")


class Responsiveness:
    """Another client, on its own thread, calling ``probe(timeout)`` every ``interval`` seconds
    while the ``with`` block runs -- to show a service keeps answering while it handles
    something else. Each call gets ``deadline`` seconds; a slower answer is a failure."""

    def __init__(
        self, probe: Callable[[float], Any], *, deadline: float = 1.0, interval: float = 0.05
    ) -> None:
        self.probe, self.deadline, self.interval = probe, deadline, interval
        self.latencies: list[float] = []
        self.failures: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="responsiveness-probe", daemon=True)

    def __enter__(self) -> Responsiveness:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.probe(self.deadline)
                self.latencies.append(time.monotonic() - started)
            except Exception as exc:  # noqa: BLE001 -- every failure is reported by assert_answered
                self.failures.append(exc)
            self._stop.wait(self.interval)

    def assert_answered(self, *, at_least: int) -> None:
        """Every probe answered within the deadline, and there were at least ``at_least``."""
        assert not self.failures, f"the other client's calls failed: {self.failures[:3]}"
        assert len(self.latencies) >= at_least, f"only {len(self.latencies)} probe calls ran"
        assert max(self.latencies) < self.deadline


def call(method, request, *, timeout: float = 20.0, metadata=None):
    """Call a stub method; a failure is raised as the typed taxonomy error (reason, code kept)."""
    try:
        return method(request, timeout=timeout, metadata=metadata)
    except grpc.RpcError as exc:
        raise errors.error_from_rpc(exc) from exc


def rpc_code(error: errors.TributaryError) -> grpc.StatusCode:
    """The gRPC status code the server answered with (the cause kept by ``error_from_rpc``)."""
    cause = error.__cause__
    assert isinstance(cause, grpc.RpcError), f"{error!r} was not raised from an RPC error"
    return cause.code()


def partitions_by_state(topic_metadata) -> dict[str, list[int]]:
    result: dict[str, list[int]] = {}
    for p in topic_metadata.partitions:
        result.setdefault(pb.PartitionState.Name(p.state), []).append(p.partition)
    return result


def topic_of(metadata, name: str):
    return next(t for t in metadata.topics if t.name == name)


def read_etcd_state(cluster: Cluster):
    """The cluster's metadata read straight from etcd (not through any coordinator)."""
    import asyncio

    from coordinator.metadata import MetadataState
    from services.cluster_keys import cluster_prefix
    from services.etcd import EtcdClient
    from services.etcd.values import WatchResync

    async def read():
        async with EtcdClient(cluster.etcd.endpoint, prefix=cluster_prefix(cluster.name)) as client:
            return await client.get_prefix("")

    kvs, revision = asyncio.run(read())
    state = MetadataState()
    state.apply_resync(WatchResync(tuple(kvs), revision))
    return state


def assert_consistent(state) -> None:
    """Invariants of the stored metadata: every partition state belongs to a topic partition, its
    leader is one of its replicas, ONLINE leaders are live, and the controller's epoch is the
    stored epoch."""
    for topic_name, partitions in state.partitions.items():
        topic = state.topics.get(topic_name)
        assert topic is not None, f"partition states of missing topic {topic_name}"
        for p, record in partitions.items():
            assert p < topic.partition_count, f"{topic_name}-{p} beyond the topic's partitions"
            assert record.replicas == topic.assignment[p]
            if record.status.value == "ONLINE":
                assert record.leader in record.replicas and record.leader in state.brokers
    if state.controller is not None:
        assert state.controller.epoch == state.controller_epoch
