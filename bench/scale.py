"""How per-partition cost grows with the number of partitions, on one local cluster (issue 21).

One run on a local cluster started through the launcher (3 storage nodes, 2 coordinators, one
gateway, all on this machine's cores, loopback), replication factor 1:

* **creates** -- 1,000-partition topics created one after another up to ``--partitions``
  (default 30,000), each create timed from the call to its answer (partitions online); target:
  the last within 1.5x of the first. Stops early, and says how far it got, when one create
  takes longer than ``--create-limit-s``;
* **produce** -- ``--records`` keyed 200-byte records with ``acks=1`` through the Python SDK to
  topics of 1, 1,000 and 10,000 partitions (the 10,000-partition topic is created after the
  series and counts towards the total; its create is timed to its answer and to every partition
  led, and the produce starts only then: it measures producing, not the create);
* **reads** -- `tributary topics list` and `tributary cluster status` (the CLI, as a user runs
  it) and one GetMetadata of everything, at that scale;
* **controller failover** -- kill -9 of the active controller, then the time to the first
  successful create (target: lease TTL + 1 s);
* **storage-node restart** -- kill -9 of node 0 (its logs then need recovery), then the time
  for the restarted process to be ready and for every partition to have a live leader again;
* **memory and fds** -- resident memory and open file descriptors of every process.

    python bench/scale.py                       # writes bench/reports/scale-<date>.md
    python bench/scale.py --partitions 10000    # a smaller run
    python bench/scale.py --measures produce    # only the produce rates (three topics created)
    python bench/scale.py --measures produce --profile /tmp/prof   # and py-spy profiles of it

``--measures`` runs only some of the measures (comma-separated: creates, produce, reads,
failover, restart); without ``creates`` the produce phase creates its own 1,000-partition topic.
``--profile DIR`` records py-spy (``pip install py-spy``; needs root or ptrace rights) on this
process (the SDK), the gateway and every storage node during each produce phase, and writes
collapsed stacks and the top functions per process (``bench/profile_top.py``) to ``DIR``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc

from bench.profile_top import Profiler
from bench.reporting import load_line, write_report
from gateway.client import Admin, NewTopic, Producer
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.proto import coordinator_grpc, pb

RECORD_BYTES = 200
TTL_S = 6
TOPIC_PARTITIONS = 1_000
BIG_TOPIC_PARTITIONS = 10_000


def create_series(admin: Admin, total: int, limit_s: float) -> list[float]:
    """Create 1,000-partition topics until ``total`` partitions exist; each create's seconds."""
    times: list[float] = []
    for index in range(total // TOPIC_PARTITIONS):
        started = time.perf_counter()
        admin.create_topics([NewTopic(f"series-{index:03d}", TOPIC_PARTITIONS, 1, {})])
        elapsed = time.perf_counter() - started
        times.append(elapsed)
        print(
            f"  create {index + 1}: {elapsed:.2f} s ({(index + 1) * TOPIC_PARTITIONS:,} partitions)",
            flush=True,
        )
        if elapsed > limit_s:
            print(f"  stopping: a create took more than {limit_s:.0f} s", flush=True)
            break
    return times


def produce_rate(servers: str, topic: str, records: int) -> tuple[float, dict[str, float]]:
    """Keyed records per second with acks=1 (keys spread records over every partition), and the
    producer's counters (requests, batches)."""
    value = b"x" * RECORD_BYTES
    keys = [f"key-{i}".encode() for i in range(records)]
    with Producer(servers=servers, acks=1, linger_ms=5, delivery_timeout_ms=300_000) as producer:
        producer.send(topic, value, key=b"warm-up").get(60)
        started = time.perf_counter()
        futures = [producer.send(topic, value, key=key) for key in keys]
        producer.flush()
        elapsed = time.perf_counter() - started
        counters = producer.metrics()
    assert all(f.get(60).offset >= 0 for f in futures[-100:])
    return records / elapsed, counters


def cpu_seconds(cluster: LocalCluster) -> dict[str, float]:
    """CPU seconds (user + system) each process used so far: this one (the SDK), the gateways
    and the storage nodes."""
    ticks = os.sysconf("SC_CLK_TCK")
    pids = {"sdk": os.getpid()}
    pids |= {f"gateway-{i}": p.pid for i, p in enumerate(cluster.gateways)}
    pids |= {f"storage-{i}": p.pid for i, p in cluster.storage_nodes.items()}
    used = {}
    for name, pid in pids.items():
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        used[name] = (int(fields[11]) + int(fields[12])) / ticks  # utime, stime
    return used


def timed_cli(*args: str) -> tuple[float, int]:
    """Seconds one CLI command takes (its output discarded) and how many lines it printed."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", *args], capture_output=True, text=True, timeout=600
    )
    elapsed = time.perf_counter() - started
    if result.returncode not in (0, 1):
        raise RuntimeError(f"tributary {' '.join(args)} failed: {result.stderr[-2000:]}")
    return elapsed, result.stdout.count("\n")


def active_controller(cluster: LocalCluster) -> int:
    """Index of the coordinator that is the active controller."""
    for index, process in enumerate(cluster.coordinators):
        if not process.is_running():
            continue
        with grpc.insecure_channel(f"127.0.0.1:{process.info['grpc_port']}") as channel:
            info = coordinator_grpc.CoordinatorStub(channel).GetControllerInfo(
                pb.GetControllerInfoRequest(), timeout=5
            )
        if info.is_active:
            return index
    raise RuntimeError("no active controller")


def controller_failover(cluster: LocalCluster, admin: Admin) -> float:
    """kill -9 the active controller; seconds until a create succeeds again."""
    index = active_controller(cluster)
    cluster.coordinators[index].kill()
    started = time.perf_counter()
    attempt = 0
    while True:
        attempt += 1
        try:
            admin.create_topics([NewTopic(f"after-failover-{attempt}", 1, 1, {})])
            break
        except Exception:  # NOT_CONTROLLER / unavailable while the seat is vacant
            if time.perf_counter() - started > 120:
                raise
            time.sleep(0.05)
    elapsed = time.perf_counter() - started
    cluster.start_coordinator(index)
    return elapsed


def leaderless(admin: Admin, topics: list[str] | tuple[str, ...] = ()) -> int:
    _, described = admin.metadata(topics)
    return sum(1 for t in described for p in t.partitions if p.leader < 0)


def wait_led(admin: Admin, topics: list[str], started: float, limit_s: float = 300) -> float:
    """Seconds from ``started`` until every partition of ``topics`` has a live leader."""
    while leaderless(admin, topics):
        if time.perf_counter() - started > limit_s:
            raise RuntimeError(f"partitions of {topics} still leaderless after {limit_s:.0f} s")
        time.sleep(0.2)
    return time.perf_counter() - started


def storage_restart(cluster: LocalCluster, admin: Admin) -> tuple[float, float]:
    """kill -9 storage node 0 and start it again: (seconds to ready, seconds to every partition
    led again), both from the start of the new process."""
    cluster.storage_nodes[0].kill()
    deadline = time.monotonic() + TTL_S + 30
    while leaderless(admin) == 0 and time.monotonic() < deadline:  # its lease expires first
        time.sleep(0.2)
    started = time.perf_counter()
    cluster.start_storage_node(0, timeout=300)
    ready = time.perf_counter() - started
    while leaderless(admin):
        if time.perf_counter() - started > 300:
            raise RuntimeError("partitions still leaderless 300 s after the restart")
        time.sleep(0.1)
    return ready, time.perf_counter() - started


def process_table(cluster: LocalCluster) -> list[tuple[str, float, int]]:
    """(name, resident MiB, open fds) of every process of the cluster."""
    processes = [("etcd", cluster.etcd.pid if cluster.etcd else None)]
    processes += [(f"coordinator-{i}", p.pid) for i, p in enumerate(cluster.coordinators)]
    processes += [(f"storage-{i}", p.pid) for i, p in cluster.storage_nodes.items()]
    processes += [(f"gateway-{i}", p.pid) for i, p in enumerate(cluster.gateways)]
    rows = []
    for name, pid in processes:
        if not pid:
            continue
        status = Path(f"/proc/{pid}/status").read_text()
        rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS")))
        rows.append((name, rss_kb / 1024, len(os.listdir(f"/proc/{pid}/fd"))))
    return rows


MEASURES = ("creates", "produce", "reads", "failover", "restart")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--partitions", type=int, default=30_000, help="partitions of the create series")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--create-limit-s", type=float, default=60.0, help="stop the series past this")
    parser.add_argument(
        "--measures", default=",".join(MEASURES), help=f"comma-separated subset of {', '.join(MEASURES)}"
    )
    parser.add_argument("--profile", type=Path, default=None, help="py-spy profiles of each produce here")
    parser.add_argument("--report", type=Path, default=None, help="markdown report (default bench/reports/)")
    parser.add_argument("--note", default="", help="a line added to the report (e.g. which code ran)")
    args = parser.parse_args(argv)
    measures = {m.strip() for m in args.measures.split(",") if m.strip()}
    unknown = measures - set(MEASURES)
    if unknown:
        parser.error(f"unknown measures {sorted(unknown)}; choose from {', '.join(MEASURES)}")

    load_at_start = os.getloadavg()[0]
    rows: list[str] = []
    tail: list[str] = []
    spec = LocalClusterSpec(storage_nodes=3, coordinators=2, gateways=1, session_timeout_s=TTL_S)
    with tempfile.TemporaryDirectory() as directory, LocalCluster(Path(directory), spec) as cluster:
        admin = Admin(servers=cluster.gateway, request_timeout_ms=300_000)
        creates: list[float] = []
        if "creates" in measures:
            print("creates ...", flush=True)
            creates = create_series(admin, args.partitions, args.create_limit_s)
            first, last = creates[0], creates[-1]
            rows += [
                f"| creates of {TOPIC_PARTITIONS:,} partitions | {len(creates)} "
                f"({len(creates) * TOPIC_PARTITIONS:,} partitions) | up to {args.partitions:,} |",
                f"| first / last create | {first:.2f} s / {last:.2f} s (x{last / first:.2f}) "
                "| last <= 1.5x first |",
                f"| all creates of the series | {sum(creates):.1f} s | |",
            ]
            tail += ["", "Every create (s): " + ", ".join(f"{t:.2f}" for t in creates) + "."]
        total = len(creates) * TOPIC_PARTITIONS
        if "produce" in measures or not creates:
            if not creates:
                admin.create_topics([NewTopic("series-000", TOPIC_PARTITIONS, 1, {})])
                wait_led(admin, ["series-000"], time.perf_counter())
                total += TOPIC_PARTITIONS
            started = time.perf_counter()
            admin.create_topics([NewTopic("produce-10000", BIG_TOPIC_PARTITIONS, 1, {})])
            big_create = time.perf_counter() - started
            big_led = wait_led(admin, ["produce-10000"], started)
            admin.create_topics([NewTopic("produce-1", 1, 1, {})])
            wait_led(admin, ["produce-1"], time.perf_counter())
            total += BIG_TOPIC_PARTITIONS + 1
            print(
                f"  create of {BIG_TOPIC_PARTITIONS:,}: {big_create:.2f} s, "
                f"every partition led {big_led:.2f} s"
            )
            rows += [
                f"| create of a {BIG_TOPIC_PARTITIONS:,}-partition topic after the series: answered / every "
                f"partition led | {big_create:.2f} s / {big_led:.2f} s | |",
                f"| partitions in the cluster | {total:,} | |",
            ]
        if "produce" in measures:
            print("produce ...", flush=True)
            rates = {}
            cpu: dict[int, dict[str, float]] = {}
            batches: dict[int, tuple[float, float]] = {}
            for partitions, topic in ((1, "produce-1"), (1_000, "series-000"), (10_000, "produce-10000")):
                profiler = Profiler.start(args.profile, f"{partitions}", cluster) if args.profile else None
                cpu_before = cpu_seconds(cluster)
                try:
                    rates[partitions], counters = produce_rate(cluster.gateway, topic, args.records)
                finally:
                    if profiler is not None:
                        profiler.stop()
                cpu[partitions] = {k: v - cpu_before[k] for k, v in cpu_seconds(cluster).items()}
                batches[partitions] = (counters["requests"], counters["batches-acknowledged"])
                print(
                    f"  {partitions:,} partitions: {rates[partitions]:,.0f} rec/s, "
                    f"{batches[partitions][1]:,.0f} batches, {batches[partitions][0]:,.0f} req.; CPU s: "
                    + ", ".join(f"{k} {v:.2f}" for k, v in cpu[partitions].items()),
                    flush=True,
                )
            rows += [
                f"| produce {args.records:,} keyed records, acks=1, {n:,} partitions | {rate:,.0f} rec/s | "
                + (">= half the 1-partition rate |" if n == 10_000 else "|")
                for n, rate in rates.items()
            ]
            rows.append(f"| ratio 10,000 / 1 partitions | {rates[10_000] / rates[1]:.2f} | >= 0.50 |")
            names = list(cpu[1])
            tail += [
                "",
                f"CPU seconds per process while producing the {args.records:,} records (the SDK is "
                "this process: the appending thread and the I/O thread):",
                "",
                "| partitions | requests | batches | " + " | ".join(names) + " | sum |",
                "|--:|--:|--:|" + "--:|" * (len(names) + 1),
            ]
            tail += [
                f"| {n:,} | {batches[n][0]:,.0f} | {batches[n][1]:,.0f} | "
                + " | ".join(f"{used[k]:.2f}" for k in names)
                + f" | {sum(used.values()):.2f} |"
                for n, used in cpu.items()
            ]
        if "reads" in measures:
            print("reads ...", flush=True)
            list_s, list_lines = timed_cli("topics", "list", "--gateway", cluster.gateway)
            status_s, status_lines = timed_cli("cluster", "status", "--data-dir", str(cluster.data_dir))
            started = time.perf_counter()
            admin.metadata()
            metadata_s = time.perf_counter() - started
            rows += [
                f"| `tributary topics list` ({list_lines:,} lines) | {list_s:.2f} s | |",
                f"| `tributary cluster status` ({status_lines:,} lines) | {status_s:.2f} s | |",
                f"| GetMetadata of every topic (SDK) | {metadata_s:.2f} s | |",
            ]
        processes = process_table(cluster)
        if "failover" in measures:
            print("controller failover ...", flush=True)
            failover_s = controller_failover(cluster, admin)
            print(f"  {failover_s:.2f} s", flush=True)
            rows.append(
                f"| controller failover (kill -9 -> first create answered) | {failover_s:.2f} s "
                f"| <= TTL + 1 s = {TTL_S + 1} s |"
            )
        if "restart" in measures:
            print("storage-node restart ...", flush=True)
            restart_ready_s, restart_online_s = storage_restart(cluster, admin)
            print(
                f"  ready {restart_ready_s:.2f} s, every partition led {restart_online_s:.2f} s", flush=True
            )
            rows.append(
                f"| storage-node restart after kill -9: ready / every partition led "
                f"| {restart_ready_s:.2f} s / {restart_online_s:.2f} s | < 30 s |"
            )
        admin.close()

    lines = [
        f"# Scale benchmark, {datetime.date.today().isoformat()}",
        "",
        f"3 storage nodes, 2 coordinators, 1 gateway and the client on {os.cpu_count()} cores (loopback), "
        f"replication factor 1, lease TTL {TTL_S} s. {load_line(load_at_start)}",
    ]
    lines += ["", args.note] if args.note else []
    lines += (
        ["", f"Measures: {', '.join(m for m in MEASURES if m in measures)}."]
        if measures != set(MEASURES)
        else []
    )
    lines += ["", "| measure | value | target |", "|---|--:|---|", *rows]
    lines += [
        "",
        f"Memory and open file descriptors per process with {total:,} partitions (before the failover):",
        "",
        "| process | resident MiB | fds |",
        "|---|--:|--:|",
    ]
    lines += [f"| {name} | {rss:,.0f} | {fds:,} |" for name, rss, fds in processes]
    lines += tail
    write_report(lines, "scale", args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
