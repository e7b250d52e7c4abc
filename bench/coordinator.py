"""Coordinator benchmarks (not tests): how fast topics are created, metadata is served, and a
crashed controller is replaced.

Runs a real local cluster -- an embedded etcd (fsync on), two coordinators, storage nodes --
through ``launcher.processes``, and prints a report:

1. **create**: wall time of one CreateTopic of N partitions (default 1,000) until every
   partition is ONLINE (its leader created it), at replication factor 1 and 3.
2. **metadata**: GetMetadata requests per second served from the coordinators' caches, by
   several client processes, for one small topic and for every topic.
3. **failover**: ``kill -9`` of the active controller to the first successful admin call
   (CreateTopic through the surviving coordinator), over T trials (default 10): median and max.
   The killed coordinator is restarted as the new standby before the next trial.

Usage::

    python -m bench.coordinator [--partitions 1000] [--nodes 3] [--ttl 2] [--trials 10]
        [--metadata-seconds 5] [--client-processes 4] [--concurrency 16] [--out DIR]
        [--only create metadata failover]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path

import grpc
import grpc.aio

from launcher.processes import ServiceProcess, start_service
from services import errors
from services.etcd.embedded import EmbeddedEtcd
from services.proto import coordinator_grpc, pb

ONLINE = pb.PARTITION_STATE_ONLINE


class BenchCluster:
    """etcd + two coordinators + storage nodes, for the benchmarks."""

    def __init__(self, run_dir: Path, etcd: EmbeddedEtcd, ttl: int) -> None:
        self.run_dir, self.etcd, self.ttl = run_dir, etcd, ttl
        self.coordinators: dict[str, ServiceProcess] = {}
        self.storage: list[ServiceProcess] = []

    def _common(self) -> list[str]:
        return [
            "--etcd-endpoints",
            self.etcd.endpoint,
            "--cluster",
            "bench",
            "--session-timeout-s",
            str(self.ttl),
        ]

    def start(self, nodes: int) -> None:
        for coordinator_id in ("c1", "c2"):
            self.coordinators[coordinator_id] = start_service(
                coordinator_id,
                "coordinator.main",
                [*self._common(), "--coordinator-id", coordinator_id, "--admin-wait-s", "120"],
                self.run_dir,
            )
        for node_id in range(1, nodes + 1):
            self.storage.append(
                start_service(
                    f"storage-{node_id}",
                    "storage_node.main",
                    [
                        *self._common(),
                        "--node-id",
                        str(node_id),
                        "--log-dirs",
                        str(self.run_dir / f"data-{node_id}"),
                    ],
                    self.run_dir,
                )
            )
        wait_until(
            lambda: len(self.metadata(self.any_running()).brokers) == nodes, 30, "storage nodes registered"
        )

    def address(self, coordinator_id: str) -> str:
        return f"127.0.0.1:{self.coordinators[coordinator_id].info['grpc_port']}"

    def stub(self, coordinator_id: str) -> coordinator_grpc.CoordinatorStub:
        return coordinator_grpc.CoordinatorStub(grpc.insecure_channel(self.address(coordinator_id)))

    def any_running(self) -> str:
        return next(c for c, p in self.coordinators.items() if p.is_running())

    def metadata(self, coordinator_id: str, topics=()):
        return self.stub(coordinator_id).GetMetadata(pb.GetMetadataRequest(topics=list(topics)), timeout=10)

    def active_id(self) -> str:
        """The active coordinator's id; RuntimeError when none is active."""
        active = self.active()
        if active is None:
            raise RuntimeError("no coordinator is active")
        return active

    def active(self) -> str | None:
        for coordinator_id, process in self.coordinators.items():
            if process.is_running():
                try:
                    if (
                        self.stub(coordinator_id)
                        .GetControllerInfo(pb.GetControllerInfoRequest(), timeout=1)
                        .is_active
                    ):
                        return coordinator_id
                except grpc.RpcError:
                    pass
        return None

    def stop(self) -> None:
        for process in [*self.coordinators.values(), *self.storage]:
            process.stop()


def wait_until(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except grpc.RpcError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


# ---------------------------------------------------------------------------------------------
# 1. create
# ---------------------------------------------------------------------------------------------


def bench_create(cluster: BenchCluster, partitions: int, replication_factor: int) -> float:
    """Seconds from CreateTopic to every partition ONLINE."""
    active = cluster.active_id()
    name = f"bench-{partitions}-rf{replication_factor}"
    started = time.perf_counter()
    cluster.stub(active).CreateTopic(
        pb.CreateTopicRequest(name=name, partitions=partitions, replication_factor=replication_factor),
        timeout=300,
    )

    def all_online() -> bool:
        topic = cluster.metadata(active, [name]).topics[0]
        return len(topic.partitions) == partitions and all(p.state == ONLINE for p in topic.partitions)

    wait_until(all_online, 300, f"{name} online")
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------
# 2. metadata
# ---------------------------------------------------------------------------------------------


async def _metadata_client(address: str, topics: list[str], seconds: float, concurrency: int) -> int:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        request = pb.GetMetadataRequest(topics=topics)
        deadline = time.monotonic() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < deadline:
                await stub.GetMetadata(request, timeout=10)
                done += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done


def _metadata_process(args: tuple[str, list[str], float, int]) -> int:
    return asyncio.run(_metadata_client(*args))


def bench_metadata(
    address: str, topics: list[str], seconds: float, processes: int, concurrency: int
) -> float:
    """GetMetadata requests per second from ``processes`` client processes."""
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        started = time.perf_counter()
        counts = pool.map(_metadata_process, [(address, topics, seconds, concurrency)] * processes)
        elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


# ---------------------------------------------------------------------------------------------
# 3. failover
# ---------------------------------------------------------------------------------------------


def failover_trial(cluster: BenchCluster, trial: int) -> float:
    """Seconds from kill -9 of the active controller to the first successful CreateTopic."""
    wait_until(lambda: cluster.active() is not None, 30, "an active controller")
    active = cluster.active_id()
    survivor = next(c for c in cluster.coordinators if c != active)
    stub = cluster.stub(survivor)
    killed_at = time.perf_counter()
    cluster.coordinators[active].kill()
    while True:
        try:
            stub.CreateTopic(pb.CreateTopicRequest(name=f"failover-{trial}", partitions=1), timeout=10)
            elapsed = time.perf_counter() - killed_at
            break
        except grpc.RpcError as exc:
            if not errors.error_from_rpc(exc).retriable:
                raise
            time.sleep(0.01)
    cluster.coordinators[active].start()
    return elapsed


# ---------------------------------------------------------------------------------------------


def report_create(cluster: BenchCluster, args: argparse.Namespace) -> None:
    rf3 = min(3, args.nodes)
    create1 = bench_create(cluster, args.partitions, 1)
    create3 = bench_create(cluster, args.partitions, rf3)
    print(
        f"create {args.partitions} partitions, rf 1: {create1:.2f}s "
        f"({args.partitions / create1:.0f} partitions/s)"
    )
    print(
        f"create {args.partitions} partitions, rf {rf3}: {create3:.2f}s "
        f"({args.partitions * rf3 / create3:.0f} replicas/s)"
    )


def report_metadata(cluster: BenchCluster, args: argparse.Namespace) -> None:
    active = cluster.active_id()
    cluster.stub(active).CreateTopic(pb.CreateTopicRequest(name="small", partitions=3), timeout=30)
    standby = next(c for c in cluster.coordinators if c != active)
    total = sum(len(t.partitions) for t in cluster.metadata(active).topics)
    for label, topics in (("one 3-partition topic", ["small"]), (f"all topics ({total} partitions)", [])):
        for role, coordinator_id in (("active", active), ("standby", standby)):
            rate = bench_metadata(
                cluster.address(coordinator_id),
                topics,
                args.metadata_seconds,
                args.client_processes,
                args.concurrency,
            )
            print(
                f"metadata, {label}, {role}: {rate:,.0f} requests/s "
                f"({args.client_processes} client processes x {args.concurrency} in flight)"
            )


def report_failover(cluster: BenchCluster, args: argparse.Namespace) -> None:
    times = [failover_trial(cluster, trial) for trial in range(args.trials)]
    print(
        f"failover (kill -9 -> first successful admin call), {args.trials} trials, TTL {args.ttl}s: "
        f"median {statistics.median(times):.2f}s, max {max(times):.2f}s, min {min(times):.2f}s "
        f"[{', '.join(f'{t:.2f}' for t in times)}]"
    )


def run(args: argparse.Namespace) -> None:
    run_dir = Path(args.out or tempfile.mkdtemp(prefix="bench-coordinator-"))
    with EmbeddedEtcd(run_dir / "etcd") as etcd:
        cluster = BenchCluster(run_dir, etcd, args.ttl)
        try:
            cluster.start(args.nodes)
            print(
                f"cluster: etcd {etcd.endpoint} (fsync on), 2 coordinators, {args.nodes} storage nodes, "
                f"lease TTL {args.ttl}s; logs in {run_dir}"
            )
            if "create" in args.only:
                report_create(cluster, args)
            if "metadata" in args.only:
                report_metadata(cluster, args)
            if "failover" in args.only:
                report_failover(cluster, args)
        finally:
            cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.coordinator", description=__doc__.split("\n\n")[0])
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--ttl", type=int, default=2, help="lease TTL (session timeout) of every process, s")
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--metadata-seconds", type=float, default=5.0)
    parser.add_argument("--client-processes", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None, help="run directory (default: a temp dir)")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=("create", "metadata", "failover"),
        default=["create", "metadata", "failover"],
        help="which benchmarks to run",
    )
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
