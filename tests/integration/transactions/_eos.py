"""Parts of the exactly-once tests: the application process (``_eos_app.py``) and what it says,
the cluster faults (storage node and coordinator kills and pauses), and readers of a whole topic
at either isolation level.

Everything waits on observable state with a deadline: a line from the application, a leader
moved by the controller, an offset reached.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import grpc

from gateway.client import Admin, Consumer, PartitionMetadata, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster
from services.proto import pb, storage_grpc
from services.records import iter_batches
from services.records.control import parse_marker

APP = Path(__file__).with_name("_eos_app.py")
REPO_ROOT = Path(__file__).resolve().parents[3]

#: Violations quoted in an assertion message (the count is always given).
QUOTED = 20


def quote(violations: Sequence[str]) -> str:
    shown = "\n  ".join(violations[:QUOTED])
    more = f"\n  ... and {len(violations) - QUOTED} more" if len(violations) > QUOTED else ""
    return f"{len(violations)} violation(s):\n  {shown}{more}"


def wait_until(condition: Callable[[], object], timeout_s: float, what: str, interval_s: float = 0.1):
    """Poll ``condition`` until it returns something truthy (which is returned); AssertionError
    naming ``what`` after ``timeout_s``. A client error while the cluster is changing counts as
    not yet."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while True:
        try:
            last = condition()
        except TributaryError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what} (last: {last!r})")
        time.sleep(interval_s)


# ---- the application ---------------------------------------------------------------------------


class Line(NamedTuple):
    at: float  # time.monotonic() when the test read it
    words: tuple[str, ...]

    @property
    def event(self) -> str:
        return self.words[0] if self.words else ""


class AppProcess:
    """One run of ``_eos_app.py``: its stdout lines, read by a thread as they come."""

    def __init__(self, args: Sequence[str], log_file: Path) -> None:
        self.lines: list[Line] = []
        self._changed = threading.Condition()
        with open(log_file, "ab") as log:
            self.popen = subprocess.Popen(
                [sys.executable, str(APP), *args],
                stdout=subprocess.PIPE,
                stderr=log,
                cwd=REPO_ROOT,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._reader = threading.Thread(target=self._read, name="eos-app-stdout", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        for raw in self.popen.stdout:
            line = Line(time.monotonic(), tuple(raw.decode(errors="replace").split(maxsplit=2)))
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def wait_for(self, predicate: Callable[[Line], bool], start: int, timeout_s: float) -> int | None:
        """The index of the first line from ``start`` on that satisfies ``predicate``; None when
        the process ended without one, AssertionError after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            while True:
                for index in range(start, len(self.lines)):
                    if predicate(self.lines[index]):
                        return index
                start = len(self.lines)
                if not self._reader.is_alive():
                    return None
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"the application said nothing wanted within {timeout_s:.0f} s")
                self._changed.wait(remaining)

    def nth(self, event: str, k: int, start: int, timeout_s: float) -> int | None:
        """The index of the ``k``-th line of ``event`` from ``start`` on (see :meth:`wait_for`)."""
        index = start - 1
        for _ in range(k):
            found = self.wait_for(lambda line: line.event == event, index + 1, timeout_s)
            if found is None:
                return None
            index = found
        return index

    def kill(self) -> Line | None:
        """kill -9, then read what it wrote before dying; its last line."""
        self.popen.kill()
        self.popen.wait(10)
        self._reader.join(10)
        return self.lines[-1] if self.lines else None

    def wait_exit(self, timeout_s: float) -> int:
        """Its exit status once it ends on its own; AssertionError after ``timeout_s``."""
        try:
            status = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the application did not exit within {timeout_s:.0f} s") from None
        self._reader.join(10)
        return status

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(10)
        self._reader.join(10)

    @property
    def exited(self) -> int | None:
        return self.popen.poll()


def in_open_transaction(last: Line | None) -> bool:
    """Whether a process whose last line was ``last`` died inside a transaction with records
    sent and commit_transaction not yet called."""
    return last is not None and last.event in ("begin", "sent")


# ---- cluster state --------------------------------------------------------------------------------


def describe(admin: Admin, topics: Iterable[str]) -> dict[TopicPartition, PartitionMetadata]:
    return {
        TopicPartition(t.name, p.partition): p
        for t in admin.describe_topics(list(topics))
        for p in t.partitions
    }


def full_isr(admin: Admin, topics: Iterable[str], replicas: int) -> bool:
    """Every partition of every topic led, with ``replicas`` in its ISR (a topic described without
    partitions, as a just-started controller may answer, is not: a fault must have a pick)."""
    topics = list(topics)
    states = describe(admin, topics)
    return {tp.topic for tp in states} == set(topics) and all(
        p.leader >= 0 and len(p.isr) == replicas for p in states.values()
    )


def active_coordinator(cluster: LocalCluster, admin: Admin) -> int:
    """The index (in ``cluster.coordinators``) of the active controller."""
    name = admin.describe_cluster().controller_id
    return int(name.rsplit("-", 1)[1])


def end_offsets(admin: Admin, topic: str, partitions: int, *, committed: bool = False) -> dict[int, int]:
    """High watermark (or, with ``committed``, last stable offset) of every partition."""
    specs = {TopicPartition(topic, p): "latest" for p in range(partitions)}
    answer = admin.list_offsets(specs, isolation_level="read_committed" if committed else "read_uncommitted")
    return {tp.partition: result.offset for tp, result in answer.items()}


def port_free(port: int) -> bool:
    """Whether a server could listen on ``port`` again (as the launcher checks it)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ReplicaView:
    """Replicas as their storage nodes hold them (log end, high watermark), asked directly: it
    works while the gateway is down."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self._channels: dict[str, grpc.Channel] = {}

    def offsets(self, node: int, tp: TopicPartition) -> tuple[int, int]:
        """``(log end offset, high watermark)`` of ``tp`` on ``node``."""
        info = self.cluster.storage_nodes[node].info
        address = f"{info['host']}:{info['grpc_port']}"
        if address not in self._channels:
            self._channels[address] = grpc.insecure_channel(address)
        request = pb.DescribePartitionsRequest(
            partitions=[pb.TopicPartition(topic=tp.topic, partition=tp.partition)]
        )
        found = storage_grpc.StorageNodeStub(self._channels[address]).DescribePartitions(request, timeout=5)
        return found.partitions[0].log_end_offset, found.partitions[0].high_watermark

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()


# ---- faults to the cluster -------------------------------------------------------------------------


@dataclass
class ClusterFault:
    """One fault done to a storage node or a coordinator."""

    kind: str  # "leader-kill", "leader-pause", "coordinator-kill"
    target: str
    moved_s: float  # down -> the controller (or a new controller) took over
    at: float  # time.monotonic() when it went down
    down_ms: int  # wall clock (ms) once it was down: what it appended carries an earlier time
    partitions: tuple[TopicPartition, ...] = ()  # those the node led


class ClusterFaults:
    """Kills (-9) or pauses (SIGSTOP until replaced, then SIGCONT) the leader of a partition, or
    kills the active coordinator; each time waits until the cluster has replaced it, then brings
    it back."""

    def __init__(self, cluster: LocalCluster, admin: Admin, topics: Sequence[str], replicas: int) -> None:
        self.cluster = cluster
        self.admin = admin
        self.topics = list(topics)
        self.replicas = replicas
        self.done: list[ClusterFault] = []
        self.paused: set[int] = set()

    def leader(self, kind: str, pick: Callable[[list[TopicPartition]], TopicPartition]) -> ClusterFault:
        """``leader-kill`` or ``leader-pause`` the leader of ``pick(partitions)``, once every
        ISR is full again (two nodes out of three down would stall the topics)."""
        wait_until(lambda: full_isr(self.admin, self.topics, self.replicas), 60, "every ISR full")
        states = describe(self.admin, self.topics)
        tp = pick(sorted(states))
        node = states[tp].leader
        led = [p for p, s in states.items() if s.leader == node]
        process = self.cluster.storage_nodes[node]
        start = time.monotonic()
        if kind == "leader-pause":
            os.kill(process.pid, signal.SIGSTOP)
            self.paused.add(node)
        else:
            process.kill()
        down_ms = int(time.time() * 1000)
        try:
            wait_until(
                lambda: all(describe(self.admin, self.topics)[p].leader != node for p in led),
                30,
                f"the controller moves {len(led)} partitions off node {node} ({kind})",
            )
        finally:
            if kind == "leader-pause":
                os.kill(process.pid, signal.SIGCONT)
                self.paused.discard(node)
            else:
                self.cluster.start_storage_node(node)
        target = f"storage-{node} (led {len(led)}, picked {tp.topic}-{tp.partition})"
        fault = ClusterFault(kind, target, time.monotonic() - start, start, down_ms, tuple(led))
        self.done.append(fault)
        return fault

    def gateway_kill(self, while_down: Callable[[], None] = lambda: None) -> ClusterFault:
        """kill -9 the gateway, call ``while_down``, and start it again on its port (clients
        keep their address)."""
        process = self.cluster.gateways[0]
        port = process.info["grpc_port"]
        start = time.monotonic()
        process.kill()
        down_ms = int(time.time() * 1000)
        while_down()
        wait_until(lambda: port_free(port), 10, f"port {port} free")
        self.cluster.start_gateway(0, port=port)
        self.cluster.write_cluster_file()
        fault = ClusterFault("gateway-kill", "gateway-0", time.monotonic() - start, start, down_ms)
        self.done.append(fault)
        return fault

    def coordinator_kill(self) -> ClusterFault:
        """kill -9 the active controller; once another coordinator is active, restart it."""
        return self._coordinator("coordinator-kill")

    def coordinator_pause(self) -> ClusterFault:
        """SIGSTOP the active controller until another coordinator is active, then SIGCONT it: a
        deposed controller that wakes up believing it still leads (its writes must be fenced)."""
        return self._coordinator("coordinator-pause")

    def _coordinator(self, kind: str) -> ClusterFault:
        index = active_coordinator(self.cluster, self.admin)
        process = self.cluster.coordinators[index]
        start = time.monotonic()
        if kind == "coordinator-pause":
            os.kill(process.pid, signal.SIGSTOP)
        else:
            process.kill()
        down_ms = int(time.time() * 1000)
        try:
            wait_until(
                lambda: active_coordinator(self.cluster, self.admin) != index,
                30,
                f"another coordinator takes over from coordinator-{index} ({kind})",
            )
        finally:
            if kind == "coordinator-pause":
                os.kill(process.pid, signal.SIGCONT)
            else:
                self.cluster.start_coordinator(index)
        fault = ClusterFault(kind, f"coordinator-{index}", time.monotonic() - start, start, down_ms)
        self.done.append(fault)
        return fault

    def resume_all(self) -> None:
        for node in self.paused:
            os.kill(self.cluster.storage_nodes[node].pid, signal.SIGCONT)
        self.paused.clear()


# ---- reading topics ---------------------------------------------------------------------------------


class Read(NamedTuple):
    partition: int
    offset: int
    value: bytes
    timestamp: int
    headers: tuple = ()

    @classmethod
    def of(cls, record) -> Read:
        return cls(record.partition, record.offset, record.value, record.timestamp, tuple(record.headers))

    def header(self, key: str) -> bytes | None:
        return next((v for k, v in self.headers if k == key), None)


def read_topic(
    servers: str, topic: str, partitions: int, *, isolation_level: str, timeout_s: float
) -> dict[int, list[Read]]:
    """Every record of every partition up to its end for that isolation level (the high watermark,
    or the last stable offset), in offset order."""
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    records: dict[int, list[Read]] = {p: [] for p in range(partitions)}
    with Consumer(
        servers=servers,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level=isolation_level,
        fetch_max_wait_ms=100,
    ) as consumer:
        consumer.assign(tps)
        end = {tp.partition: offset for tp, offset in consumer.end_offsets(tps).items()}
        deadline = time.monotonic() + timeout_s
        while any(consumer.position(tp) < end[tp.partition] for tp in tps):
            if time.monotonic() > deadline:
                at = {tp.partition: consumer.position(tp) for tp in tps}
                raise AssertionError(f"reading {topic} not done in {timeout_s:.0f} s: at {at}, ends {end}")
            for tp, batch in consumer.poll(timeout_ms=200).items():
                records[tp.partition].extend(map(Read.of, batch))
    return {p: [r for r in found if r.offset < end[p]] for p, found in records.items()}


class Marker(NamedTuple):
    partition: int
    offset: int
    producer_id: int
    producer_epoch: int
    commit: bool


def markers_on_disk(partition_dirs: Mapping[int, Path]) -> list[Marker]:
    """The transaction markers (control batches) of each partition, read from one replica's
    segment files."""
    found = []
    for partition, directory in partition_dirs.items():
        for segment in sorted(directory.glob("*.log")):
            for batch in iter_batches(segment.read_bytes(), allow_partial_tail=True):
                if not batch.is_control:
                    continue
                for record in batch.records():
                    marker = parse_marker(record.key, record.value)
                    found.append(
                        Marker(
                            partition,
                            batch.base_offset,
                            batch.producer_id,
                            batch.producer_epoch,
                            marker.commit,
                        )
                    )
    return found
