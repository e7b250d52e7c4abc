"""Message brokers side by side: one module per broker, all with the same small interface.

``bench/compare.py`` runs the 2011 paper's experiments (section 5) against every peer in this
package, one broker at a time, on loopback. A peer:

* says how to install what it needs (:attr:`Peer.install_hint`, a Debian package plus a PyPI
  client) and :meth:`Peer.missing` tells whether that is there;
* :meth:`Peer.start` starts its broker from the Debian binary in a private data directory, bound to
  127.0.0.1 only, with persistence comparable to Tributary's (durable storage on disk, flushed
  asynchronously about once a second), waits until it serves, and returns a :class:`Handle` with
  the pids and ports; :meth:`Peer.stop` stops exactly those pids;
* creates destinations (:meth:`Peer.create`): a topic / queue / stream with ``partitions``
  parts (RabbitMQ and ActiveMQ: that many queues; NATS: that many streams; Redis: that many
  stream keys; Tributary: a topic with that many partitions);
* runs the experiments on a destination: :meth:`Peer.produce_unbatched`,
  :meth:`Peer.produce_batched`, :meth:`Peer.fill` (fast, acknowledged batches of ~256 KB: filling
  before a consume), :meth:`Peer.consume_all` (returns the count and the checksum of what
  arrived, so the runner can refuse to report data that did not), :meth:`Peer.latency`.

Semantics every peer keeps (so the numbers compare):

* **unbatched**: one message per publish/request; the producer does not wait for a per-message
  acknowledgement (the paper's producer did not either) and the clock stops only when the broker
  confirms it holds all ``n`` (a barrier: a receipt, a queue depth, a stream length, an end
  offset);
* **batched**: ``batch`` (50) messages per batch, the producer waits for the broker's
  acknowledgement of each batch before sending the next (one batch in flight); batch ``k`` goes
  to partition ``k % partitions``;
* **consume**: one consumer reads the next ``n`` messages across all partitions, prefetching about
  1,000 messages / 200 KB per pull (or the broker's closest setting); NATS consumers are
  ``AckNone`` (the paper's auto-acknowledgement), RabbitMQ and ActiveMQ consumers acknowledge
  cumulatively every 100 messages (see their modules for why not auto-ack); consuming continues
  where the previous ``consume_all`` on the destination stopped;
* **latency**: the producer sends one message at a time at a fixed rate, each carrying its send
  time (CLOCK_MONOTONIC, shared by all processes of the machine); a consumer subscribed before
  the first send records when each arrives.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MESSAGE_BYTES = 200
BATCH = 50
FETCH_BYTES = 200 * 1024
PREFETCH_MESSAGES = 1000


class PeerUnavailable(RuntimeError):
    """The peer cannot run here (not installed, failed to start); the message says why."""


# ---- payloads ---------------------------------------------------------------------------------


def message(i: int) -> bytes:
    """Message ``i``: 200 bytes, distinct, printable ASCII (safe for STOMP), not trivially
    compressible. The same generator as ``bench/paper.py``."""
    head = b"%012d|" % i
    body = bytes((33 + (i * 31 + j * 7) % 90) for j in range(MESSAGE_BYTES - len(head)))
    return head + body


def messages(count: int, start: int = 0) -> list[bytes]:
    return [message(i) for i in range(start, start + count)]


def checksum(payloads: Iterable[bytes]) -> int:
    """Order-independent checksum: the sum of the payloads' CRC-32s."""
    return sum(zlib.crc32(p) for p in payloads)


class Filler(Sequence[bytes]):
    """``count`` large filler messages (``size`` bytes each, printable, distinct), made on demand
    so that gigabytes of them never sit in memory at once."""

    def __init__(self, count: int, size: int, tag: int = 0) -> None:
        self.messages, self.size, self.tag = count, size, tag
        rng = random.Random(7)
        self._body = bytes(rng.randrange(33, 123) for _ in range(size))

    def __len__(self) -> int:
        return self.messages

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self.messages))]
        if not -self.messages <= index < self.messages:
            raise IndexError(index)
        index %= self.messages
        head = b"F%d-%011d|" % (self.tag, index)
        return head + self._body[len(head) :]

    def checksum(self) -> int:
        return checksum(self[i] for i in range(self.messages))


def latency_message(sent_ns: int) -> bytes:
    """A 200-byte latency probe carrying its send time (``time.monotonic_ns()``)."""
    head = b"%020d|" % sent_ns
    return head + b"L" * (MESSAGE_BYTES - len(head))


def latency_of(payload: bytes, now_ns: int) -> float:
    """Seconds from the probe's send time to ``now_ns``."""
    return (now_ns - int(payload[:20])) / 1e9


# ---- measurement ------------------------------------------------------------------------------


class Meter:
    """Counts messages of one timed phase and samples (seconds, messages) for the plots.

    ``start()`` when the first message goes, ``add(k)`` as messages are confirmed/consumed,
    ``stop()`` when the phase's barrier is passed. Prints a progress line to stderr every few
    seconds.
    """

    def __init__(self, label: str = "", total: int = 0, progress: bool = True) -> None:
        self.label = label
        self.total = total
        self.count = 0
        self.samples: list[tuple[float, int]] = []
        self.t0 = 0.0
        self.elapsed = 0.0
        self._step = max(1, total // 400) if total else 100
        self._mark = self._step
        self._progress = progress
        self._next_print = 0.0

    def start(self) -> Meter:
        self.count = 0
        self.t0 = time.perf_counter()
        self.samples = [(0.0, 0)]
        self._mark = self._step
        self._next_print = self.t0 + 5.0
        return self

    def add(self, k: int = 1) -> None:
        self.count += k
        if self.count >= self._mark:
            self._mark = self.count + self._step
            now = time.perf_counter()
            self.samples.append((now - self.t0, self.count))
            if self._progress and now >= self._next_print:
                self._next_print = now + 5.0
                pct = f" ({100 * self.count / self.total:.0f}%)" if self.total else ""
                print(
                    f"      ... {self.label}: {self.count:,}{pct}, {self.count / (now - self.t0):,.0f} msg/s",
                    file=sys.stderr,
                    flush=True,
                )

    def stop(self) -> float:
        """End the phase; the last sample is (elapsed, count), so that the time a barrier took
        after the last message (a fire-and-forget producer waiting for the broker) shows."""
        self.elapsed = time.perf_counter() - self.t0
        if not self.samples or self.samples[-1][0] != self.elapsed:
            self.samples.append((self.elapsed, self.count))
        return self.elapsed


# ---- destinations -----------------------------------------------------------------------------


@dataclass
class Dest:
    """A topic / queue / stream set of ``partitions`` parts, and the consumer's position in it."""

    name: str
    partitions: int = 1
    #: The peer's bookkeeping: consumer positions, messages received beyond a count (carry).
    state: dict = field(default_factory=dict)

    def partition_of_batch(self, k: int) -> int:
        return k % self.partitions


def batches(payloads: Sequence[bytes], size: int) -> Iterable[tuple[int, Sequence[bytes]]]:
    """``(k, payloads[k*size:(k+1)*size])`` for every batch ``k``."""
    for k, start in enumerate(range(0, len(payloads), size)):
        yield k, payloads[start : start + size]


# ---- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def spawn(
    cmd: list[str], log_path: Path, *, env: dict | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """Start a broker process in its own session (a Ctrl-C of the runner does not reach it; the
    runner stops it by pid), output to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )


def children(pid: int) -> list[int]:
    """Every descendant pid of ``pid`` (from /proc), deepest last."""
    found: list[int] = []
    try:
        direct = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return found
    for child in map(int, direct):
        found.append(child)
        found.extend(children(child))
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat[stat.rindex(")") + 2 :].startswith("Z")


def terminate(process: subprocess.Popen | int, timeout: float = 30.0) -> None:
    """SIGTERM ``process`` and every descendant it started (by pid), wait, then SIGKILL."""
    pid = process.pid if isinstance(process, subprocess.Popen) else process
    pids = [pid, *children(pid)]
    for p in pids:
        try:
            os.kill(p, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if isinstance(process, subprocess.Popen):
            process.poll()
        if not any(alive(p) for p in pids):
            break
        time.sleep(0.1)
    for p in pids:
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if isinstance(process, subprocess.Popen):
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            pass


def wait_until(ready, process: subprocess.Popen | None, timeout: float, what: str, log_path: Path) -> None:
    """Poll ``ready()`` until true; fail with the log's tail if ``process`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise PeerUnavailable(
                f"{what} exited with status {process.returncode}; log {log_path}:\n{log_tail(log_path)}"
            )
        try:
            if ready():
                return
        except Exception as exc:  # noqa: BLE001 -- not ready yet
            last_error = exc
        time.sleep(0.25)
    raise PeerUnavailable(
        f"{what} not ready after {timeout:.0f}s (last error: {last_error}); log {log_path}:\n"
        f"{log_tail(log_path)}"
    )


def command_output(cmd: list[str]) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"({exc})"
    return (out.stdout or out.stderr).strip()


def deb_version(package: str) -> str:
    out = command_output(["dpkg-query", "-W", "-f=${Version}", package])
    return out if out and "no packages" not in out else "not installed"


def pypi_version(distribution: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "not installed"


# ---- the interface ----------------------------------------------------------------------------


@dataclass
class Handle:
    """A running broker: its processes (by pid), ports, data directory, log."""

    #: Popens for the brokers started here; the launcher's process objects for Tributary.
    processes: dict[str, Any]
    ports: dict[str, int]
    data_dir: Path
    log: Path | None = None

    @property
    def pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.processes.items()}


class Peer:
    """One broker. Subclasses fill in every method; see the module docstring for the semantics."""

    name = "peer"
    title = "Peer"
    #: Debian packages of the broker, installed by ``apt-get install -y --no-install-recommends``.
    debian_packages: tuple[str, ...] = ()
    #: PyPI distributions of the client.
    pypi_packages: tuple[str, ...] = ()
    #: Executables that must be on the machine.
    binaries: tuple[str, ...] = ()
    #: Import names of the client.
    modules: tuple[str, ...] = ()
    #: One line on the client and why; one line on the persistence settings.
    client_note = ""
    persistence_note = ""
    #: What "batched" means for this broker (its closest mechanism to a 50-message batch).
    batch_note = ""
    unbatched_note = ""
    consume_note = ""

    def __init__(self) -> None:
        self.handle: Handle | None = None

    @property
    def install_hint(self) -> str:
        parts = []
        if self.debian_packages:
            parts.append("apt-get install -y --no-install-recommends " + " ".join(self.debian_packages))
        if self.pypi_packages:
            parts.append(".venv/bin/pip install " + " ".join(self.pypi_packages))
        return " && ".join(parts)

    def missing(self) -> str | None:
        """What is missing to run this peer here (None when nothing is)."""
        import importlib.util
        import shutil

        absent = [b for b in self.binaries if not shutil.which(b) and not Path(b).exists()]
        absent += [f"python module {m}" for m in self.modules if importlib.util.find_spec(m) is None]
        return f"missing {', '.join(absent)}; install with: {self.install_hint}" if absent else None

    def versions(self) -> dict[str, str]:
        """Broker and client versions, for the report."""
        result = {f"{p} (deb)": deb_version(p) for p in self.debian_packages}
        result.update({f"{p} (PyPI)": pypi_version(p) for p in self.pypi_packages})
        return result

    # lifecycle
    def start(self, data_dir: Path) -> Handle:
        raise NotImplementedError

    def stop(self) -> None:
        if self.handle is None:
            return
        for process in reversed(list(self.handle.processes.values())):
            terminate(process)
        self.handle = None

    # destinations
    def create(self, name: str, partitions: int = 1) -> Dest:
        raise NotImplementedError

    def delete(self, dest: Dest) -> None:
        """Drop the destination and its data (best effort)."""

    # experiments
    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        raise NotImplementedError

    def produce_batched(
        self, dest: Dest, payloads: Sequence[bytes], meter: Meter, batch: int = BATCH
    ) -> None:
        raise NotImplementedError

    def fill(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        """Write messages as fast as the broker takes them, in batches of about 256 KB, each
        acknowledged (filling a destination before a timed consume, or the retained data)."""
        self.produce_batched(dest, payloads, meter, batch=max(1, (256 << 10) // max(1, len(payloads[0]))))

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        """Read the next ``n`` messages of ``dest``; returns (count, checksum)."""
        raise NotImplementedError

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        """Send ``n`` probes at ``rate``/s; returns (latencies in seconds, achieved send rate)."""
        raise NotImplementedError


def paced(n: int, rate: float):
    """Yield ``i`` for ``i < n``, each no earlier than ``i / rate`` seconds after the first."""
    start = time.perf_counter()
    for i in range(n):
        due = start + i / rate
        delay = due - time.perf_counter()
        if delay > 0.0002:
            time.sleep(delay)
        yield i


def achieved_rate(n: int, started: float) -> float:
    elapsed = time.perf_counter() - started
    return n / elapsed if elapsed > 0 else 0.0


ALL = ("rabbitmq", "activemq", "nats", "redis", "tributary")


def load(name: str) -> Peer:
    """The peer called ``name`` (one of :data:`ALL`, or a Tributary variant)."""
    if name == "redis":
        from bench.peers.redis_streams import RedisStreams

        return RedisStreams()
    if name == "nats":
        from bench.peers.nats_jetstream import NatsJetStream

        return NatsJetStream()
    if name == "rabbitmq":
        from bench.peers.rabbitmq import RabbitMQ

        return RabbitMQ()
    if name == "activemq":
        from bench.peers.activemq import ActiveMQ

        return ActiveMQ()
    if name == "tributary":
        from bench.peers.tributary import Tributary

        return Tributary()
    raise KeyError(f"unknown peer {name!r}; choose from {', '.join(ALL)}")
