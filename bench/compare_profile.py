"""Where Tributary's time goes: py-spy on the client, the gateway and the storage node.

Used by ``bench/compare.py`` after the measured runs (sampling costs a little, so the profiled
runs are separate from the measured ones). For each phase -- unbatched produce, batched produce,
consume -- it records:

* CPU seconds of every Tributary process (and of the client) from ``/proc/<pid>/stat``, so the
  report shows which process is busy and how close to a core it is;
* a py-spy sample of each process (``py-spy record --format raw --nonblocking``), summarized as
  the functions with the most self time and a breakdown by area (gRPC, asyncio loop, protobuf,
  record codec, SDK, gateway, storage, ...).

py-spy (PyPI ``py-spy``) reads the processes' memory from outside (ptrace permission needed:
root or ``kernel.yama.ptrace_scope=0``); nothing in the services changes.
"""

from __future__ import annotations

import collections
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.peers import BATCH, Meter

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
RATE_HZ = 200

#: Areas of a stack's innermost frame, by file path fragment (first match wins).
AREAS = [
    ("grpc/", "gRPC (grpcio aio + C-core)"),
    ("google/protobuf", "protobuf"),
    ("services/records", "record codec"),
    ("gateway/client", "SDK"),
    ("storage_node/", "storage node"),
    ("gateway/", "gateway"),
    ("services/", "services (shared)"),
    ("asyncio/", "asyncio event loop"),
    ("selectors.py", "waiting (epoll)"),
    ("threading.py", "threads (gRPC poller, waits)"),
    ("bench/", "benchmark driver"),
]


def py_spy() -> str | None:
    candidate = Path(sys.executable).parent / "py-spy"
    return str(candidate) if candidate.exists() else shutil.which("py-spy")


def available() -> bool:
    return py_spy() is not None


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def area_of(frame: str) -> str:
    for fragment, area in AREAS:
        if fragment in frame:
            return area
    return "other"


def summarize(raw: Path, top: int = 8) -> dict:
    """Top self-time functions and areas of a py-spy raw (collapsed stacks) file."""
    total = 0
    functions: collections.Counter = collections.Counter()
    areas: collections.Counter = collections.Counter()
    try:
        lines = raw.read_text().splitlines()
    except OSError:
        return {"samples": 0, "functions": [], "areas": []}
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        total += n
        leaf = stack.split(";")[-1]
        # "function (path/file.py:line)" -> "function (file.py)": lines of one function together
        name, _, where = leaf.partition(" (")
        path = where.rstrip(")").rsplit(":", 1)[0]
        short = "/".join(path.split("/")[-2:])
        functions[f"{name} ({short})"] += n
        areas[area_of(path)] += n
    return {
        "samples": total,
        "functions": [(f, n / total) for f, n in functions.most_common(top)] if total else [],
        "areas": [(a, n / total) for a, n in areas.most_common()] if total else [],
    }


class Recorder:
    """py-spy on a set of pids for the duration of a ``with`` block."""

    def __init__(self, pids: dict[str, int], out_dir: Path, phase: str) -> None:
        self.pids, self.out_dir, self.phase = pids, out_dir, phase
        self.procs: dict[str, subprocess.Popen] = {}
        self.cpu_before: dict[str, float] = {}
        self.result: dict = {}

    def __enter__(self) -> Recorder:
        binary = py_spy()
        if binary is None:
            raise RuntimeError("py-spy is not installed")
        for name, pid in self.pids.items():
            out = self.out_dir / f"{self.phase}-{name}.txt"
            self.procs[name] = subprocess.Popen(
                [
                    binary,
                    "record",
                    "--pid",
                    str(pid),
                    "--rate",
                    str(RATE_HZ),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(out),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        time.sleep(1.0)  # py-spy attached
        self.cpu_before = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc_info) -> None:
        wall = time.perf_counter() - self.t0
        cpu = {name: cpu_seconds(pid) - self.cpu_before[name] for name, pid in self.pids.items()}
        for proc in self.procs.values():
            proc.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
        for name, proc in self.procs.items():
            try:
                _, err = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                err = b"timed out"
            if proc.returncode not in (0, -signal.SIGINT, 1):
                self.result.setdefault("errors", {})[name] = (err or b"").decode(errors="replace")[-300:]
        self.result.update(
            wall=wall,
            cpu={name: (seconds, seconds / wall if wall else 0.0) for name, seconds in cpu.items()},
            processes={name: summarize(self.out_dir / f"{self.phase}-{name}.txt") for name in self.pids},
        )


def profile_tributary(peer, payloads: list[bytes], consume_payloads: list[bytes], progress) -> dict:
    """Profile three phases against ``peer`` (a started :class:`bench.peers.tributary.Tributary`):
    ``payloads`` unbatched, ``consume_payloads`` batched (longer: it is ~10x faster), then all of
    them consumed."""
    cluster = peer.cluster
    pids = {
        "client (SDK, this process)": os.getpid(),
        "gateway": cluster.gateways[0].pid,
        "storage node": cluster.storage_nodes[0].pid,
    }
    others = {"etcd": cluster.etcd.pid, "coordinator": cluster.coordinators[0].pid}
    out_dir = Path(tempfile.mkdtemp(prefix="tributary-profile-"))
    phases: dict[str, dict] = {}

    def phase(name: str, fn, count: int) -> None:
        with Recorder(pids, out_dir, name.split(",")[0].replace(" ", "-")) as rec:
            other_before = {k: cpu_seconds(v) for k, v in others.items()}
            meter = Meter(f"profiled {name}", count, progress=False)
            fn(meter)
        rec.result["rate"] = count / meter.elapsed
        rec.result["others"] = {
            k: (cpu_seconds(v) - other_before[k]) / rec.result["wall"] for k, v in others.items()
        }
        phases[name] = rec.result
        progress(f"  profiled {name}: {count / meter.elapsed:,.0f} msg/s under py-spy")

    try:
        dest = peer.create(f"profile-unbatched-{os.getpid()}")
        phase(
            "produce, unbatched (acks=0, 16 in flight)",
            lambda meter: peer.produce_unbatched(dest, payloads, meter),
            len(payloads),
        )
        dest = peer.create(f"profile-batched-{os.getpid()}")
        phase(
            f"produce, batched ({BATCH}/batch, acks=1)",
            lambda meter: peer.produce_batched(dest, consume_payloads, meter, BATCH),
            len(consume_payloads),
        )
        phase(
            "consume (200 KB fetches)",
            lambda meter: peer.consume_all(dest, len(consume_payloads), meter),
            len(consume_payloads),
        )
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    return {"phases": phases, "rate_hz": RATE_HZ}
