"""Consumer-group benchmarks (not tests): rebalance time after a member dies, eager versus
cooperative, and committed-offset throughput.

Runs a real local cluster -- an embedded etcd (fsync on), one coordinator, one storage node --
through ``launcher.processes``; group members are asyncio tasks on raw gRPC stubs that follow the
protocol an SDK implements (join; heartbeat every ``session/3``, at once after a revocation and
every 100 ms while partitions are pending; report what they still own). Prints a report:

1. **rebalance**: M members share a topic of P partitions. One member is killed (its task stops:
   no LeaveGroup, as ``kill -9``). Measured per trial: *detect* (kill -> the survivors see a new
   generation: the session timeout plus etcd's lease expiry check), *hand-off* (new generation
   -> every partition owned by a survivor and nobody waiting) and *total*; plus how many
   partitions the survivors had to revoke. Median and max over T trials (default 10) for an eager
   assignor (range: everyone revokes everything first) and cooperative-sticky (only what moves).
   The killed member is replaced by a new one between trials.
2. **commits**: CommitOffsets per second from C concurrent committers of one group (each request
   one partition, unthrottled) for S seconds, with latency percentiles.

Usage::

    python -m bench.groups [--members 4] [--partitions 12] [--session-ms 2000] [--trials 10]
        [--commit-seconds 3] [--concurrency 1 16 64] [--only rebalance commits]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio

from launcher.processes import ServiceProcess, start_service
from services import errors
from services.etcd.embedded import EmbeddedEtcd
from services.proto import coordinator_grpc, pb

PENDING_HEARTBEAT_S = 0.1


class BenchCluster:
    """etcd + one coordinator + one storage node."""

    def __init__(self, run_dir: Path, etcd: EmbeddedEtcd) -> None:
        self.run_dir, self.etcd = run_dir, etcd
        self.processes: list[ServiceProcess] = []

    def start(self, min_session_ms: int) -> str:
        common = ["--etcd-endpoints", self.etcd.endpoint, "--cluster", "bench", "--session-timeout-s", "2"]
        coordinator = start_service(
            "c1",
            "coordinator.main",
            [*common, "--coordinator-id", "c1", "--group-min-session-timeout-ms", str(min_session_ms)],
            self.run_dir,
        )
        storage = start_service(
            "storage-1",
            "storage_node.main",
            [*common, "--node-id", "1", "--log-dirs", str(self.run_dir / "data-1")],
            self.run_dir,
        )
        self.processes += [coordinator, storage]
        return f"127.0.0.1:{coordinator.info['grpc_port']}"

    def stop(self) -> None:
        for process in self.processes:
            process.stop()


@dataclass
class Member:
    """One member following the group protocol on its own task."""

    stub: coordinator_grpc.CoordinatorStub
    group: str
    topic: str
    assignor: pb.Assignor
    session_ms: int
    member_id: str = ""
    generation: int = -1
    owned: set = field(default_factory=set)
    pending: set = field(default_factory=set)
    revoked: int = 0
    task: asyncio.Task | None = None

    async def join(self) -> None:
        response = await self.stub.JoinGroup(
            pb.JoinGroupRequest(
                group_id=self.group,
                member_id=self.member_id,
                subscription=pb.Subscription(topics=[self.topic]),
                assignor=self.assignor,
                session_timeout_ms=self.session_ms,
            ),
            timeout=10,
        )
        self.member_id, self.generation = response.member_id, response.generation_id
        self.owned, self.pending = _tps(response.assignment), _tps(response.pending)

    async def heartbeat(self) -> float:
        """One heartbeat; returns how long to wait before the next."""
        response = await self.stub.Heartbeat(
            pb.HeartbeatRequest(
                group_id=self.group,
                member_id=self.member_id,
                generation_id=self.generation,
                polled=True,
                owned=[pb.TopicPartition(topic=t, partition=p) for t, p in self.owned],
            ),
            timeout=10,
        )
        self.revoked += len(response.revoke)
        self.generation = response.generation_id
        self.owned, self.pending = _tps(response.assignment), _tps(response.pending)
        if response.revoke:
            return 0.0
        return PENDING_HEARTBEAT_S if response.pending else self.session_ms / 3000

    async def run(self) -> None:
        await self.join()
        while True:
            try:
                await asyncio.sleep(await self.heartbeat())
            except grpc.aio.AioRpcError as exc:
                if isinstance(errors.error_from_rpc(exc), errors.UnknownMemberIdError):
                    self.member_id, self.owned = "", set()
                    await self.join()
                else:
                    await asyncio.sleep(0.1)

    def start(self) -> Member:
        self.task = asyncio.create_task(self.run())
        return self

    async def kill(self) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


def _tps(messages) -> set:
    return {(m.topic, m.partition) for m in messages}


def settled(members: list[Member], partitions: set) -> bool:
    owned = [tp for m in members for tp in m.owned]
    return len(owned) == len(set(owned)) and set(owned) == partitions and not any(m.pending for m in members)


def stable(members: list[Member], partitions: set) -> bool:
    """Settled, and every member has heard of the current generation (a quiet starting point)."""
    return settled(members, partitions) and len({m.generation for m in members}) == 1


async def wait_for(predicate, timeout: float = 30.0, interval: float = 0.005) -> float:
    """Poll until ``predicate()``; the monotonic time it first held."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(interval)
    return time.monotonic()


# ---- rebalance --------------------------------------------------------------------------------------


async def rebalance_trials(
    address: str, *, assignor: pb.Assignor, members: int, partitions: int, session_ms: int, trials: int
) -> list[dict]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        topic = f"rebalance-{assignor}-{time.monotonic_ns()}"
        await stub.CreateTopic(pb.CreateTopicRequest(name=topic, partitions=partitions), timeout=60)
        everything = {(topic, p) for p in range(partitions)}
        group = [Member(stub, f"g-{topic}", topic, assignor, session_ms).start() for _ in range(members)]
        results = []
        try:
            for _ in range(trials):
                await wait_for(lambda: stable(group, everything))
                results.append(await _one_trial(group, everything))
                group.append(Member(stub, group[0].group, topic, assignor, session_ms).start())
        finally:
            for member in group:
                await member.kill()
        return results


async def _one_trial(group: list[Member], everything: set) -> dict:
    victim = group.pop(0)
    generation = max(m.generation for m in group)
    revoked_before = sum(m.revoked for m in group)
    killed_at = time.monotonic()
    await victim.kill()
    noticed = await wait_for(lambda: any(m.generation > generation for m in group))
    done = await wait_for(lambda: settled(group, everything))
    return {
        "detect": noticed - killed_at,
        "handoff": done - noticed,
        "total": done - killed_at,
        "revoked": sum(m.revoked for m in group) - revoked_before,
    }


# ---- commits ----------------------------------------------------------------------------------------


async def commit_rate(address: str, *, concurrency: int, seconds: float) -> dict:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = coordinator_grpc.CoordinatorStub(channel)
        topic = f"commits-{concurrency}-{time.monotonic_ns()}"
        await stub.CreateTopic(pb.CreateTopicRequest(name=topic, partitions=16), timeout=60)
        member = Member(stub, f"g-{topic}", topic, pb.ASSIGNOR_COOPERATIVE_STICKY, 10_000).start()
        await wait_for(lambda: len(member.owned) == 16)
        latencies: list[float] = []
        failures = 0
        stop_at = time.monotonic() + seconds

        async def committer(index: int) -> None:
            nonlocal failures
            n = 0
            while time.monotonic() < stop_at:
                request = pb.CommitOffsetsRequest(
                    group_id=member.group,
                    member_id=member.member_id,
                    generation_id=member.generation,
                    offsets=[pb.OffsetCommit(topic=topic, partition=index % 16, offset=n)],
                )
                started = time.monotonic()
                response = await stub.CommitOffsets(request, timeout=10)
                latencies.append(time.monotonic() - started)
                failures += sum(1 for r in response.results if r.HasField("error"))
                n += 1

        started = time.monotonic()
        await asyncio.gather(*(committer(i) for i in range(concurrency)))
        elapsed = time.monotonic() - started
        await member.kill()
        latencies.sort()
        return {
            "rate": len(latencies) / elapsed,
            "p50": latencies[len(latencies) // 2] * 1000,
            "p99": latencies[int(len(latencies) * 0.99)] * 1000,
            "failures": failures,
        }


# ---- report -----------------------------------------------------------------------------------------


def _summary(values: list[float]) -> str:
    return f"median {statistics.median(values) * 1000:7.0f} ms   max {max(values) * 1000:7.0f} ms"


def report_rebalance(name: str, results: list[dict], session_ms: int) -> None:
    print(f"\n{name} ({len(results)} trials, session timeout {session_ms} ms):")
    for key in ("detect", "handoff", "total"):
        print(f"  {key:8} {_summary([r[key] for r in results])}")
    print(
        "  partitions revoked from survivors per trial: median "
        f"{statistics.median(r['revoked'] for r in results):.0f}"
    )


async def main_async(args: argparse.Namespace, address: str) -> None:
    if "rebalance" in args.only:
        print(f"rebalance: {args.members} members, {args.partitions} partitions, one member killed per trial")
        for name, assignor in (
            ("eager (range)", pb.ASSIGNOR_RANGE),
            ("cooperative-sticky", pb.ASSIGNOR_COOPERATIVE_STICKY),
        ):
            results = await rebalance_trials(
                address,
                assignor=assignor,
                members=args.members,
                partitions=args.partitions,
                session_ms=args.session_ms,
                trials=args.trials,
            )
            report_rebalance(name, results, args.session_ms)
    if "commits" in args.only:
        print(f"\ncommits: one partition per request, {args.commit_seconds:.0f} s per run")
        for concurrency in args.concurrency:
            result = await commit_rate(address, concurrency=concurrency, seconds=args.commit_seconds)
            print(
                f"  {concurrency:3} in flight: {result['rate']:7.0f} commits/s   p50 {result['p50']:5.1f} ms "
                f"  p99 {result['p99']:5.1f} ms   failed partitions {result['failures']}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=4)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--session-ms", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--commit-seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument(
        "--only", nargs="+", default=["rebalance", "commits"], choices=["rebalance", "commits"]
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tributary-bench-groups-") as tmp:
        run_dir = Path(tmp)
        with EmbeddedEtcd(run_dir / "etcd") as etcd:
            cluster = BenchCluster(run_dir, etcd)
            try:
                address = cluster.start(min_session_ms=min(1000, args.session_ms))
                asyncio.run(main_async(args, address))
            finally:
                cluster.stop()


if __name__ == "__main__":
    main()
