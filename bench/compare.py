"""The 2011 Kafka paper's section 5 on Tributary and on the brokers users would otherwise pick.

One run on one machine, every broker on loopback, one at a time, the same messages for all:
RabbitMQ and ActiveMQ (the paper's comparisons), NATS JetStream and Redis Streams, and
Tributary (its Python SDK against a real local cluster). Writes
``bench/reports/<date>.md`` with every table and PNG plots like the paper's Figures 4 and 5.

Experiments (see ``bench/peers/__init__.py`` for what each mode means for every broker):

* **produce, unbatched**: ``--messages`` 200-byte messages, one per publish, no per-message
  acknowledgement awaited (the paper's producer), the clock stopped by a barrier that proves the
  broker holds all of them;
* **produce, batched**: 50 per batch, one batch in flight, each acknowledged by the broker;
* **consume**: one consumer reads ``--consume-messages`` (200,000) messages back from a
  destination filled beforehand (200 KB / 1,000-message prefetch). Every destination of every
  experiment is read back and the count and checksum checked, so no number is reported for data
  that did not arrive;
* **Tributary variants**: acks=0 with 16 batches in flight (the paper's Kafka setting), acks=all,
  fsync before every acknowledgement (storage node ``--flush-before-ack true``), and a Java
  client through the generated gRPC stubs (``bench/peers/java``);
* **latency**: produce -> consumed, p50/p99 at fixed rates (``--rates``), one message at a time
  (Tributary: ``linger_ms=0`` with Kafka's default producer, ``acks=all`` and idempotent; it used
  ``acks=1`` before 2026-11-25);
* **retained data**: produce and consume rate of 40,000 messages with 0 / 64 MB / 256 MB already
  retained (``--full``: 200,000 messages, 0 / 1 / 5 GB);
* **partitions**: produce and consume rate of 40,000 messages over 1, 16, 256 partitions (queues,
  streams, keys).

Targets (issue #9): Tributary ahead of every peer in each experiment (ratio in the same run), and
ahead of the paper's Kafka (50,000 msg/s unbatched, 400,000 msg/s batched, 22,000 msg/s consumed).
A profile of the Tributary processes (py-spy) is taken after the measured runs and summarized in
the report next to each missed target.

    python bench/compare.py                           # small default size, all peers (~7 min)
    python bench/compare.py --full                    # 200,000 / 1,000,000 messages, 0/1/5 GB retained
    python bench/compare.py --messages 20000 --peers redis,tributary
    python bench/compare.py --no-install              # do not apt-get/pip install missing peers

Peers that are missing are installed first (as root: ``apt-get install -y
--no-install-recommends rabbitmq-server activemq nats-server redis-server`` and ``.venv/bin/pip
install pika stomp.py nats-py redis hiredis``); a peer that cannot be installed or started is
reported with its error and the others still run. Every broker is stopped by its pid afterwards.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # keep gRPC's C-core notices out of the progress
# The SDK's I/O thread can get a gRPC poller callback after its loop closed ("Event loop is
# closed", logged by asyncio, harmless here); keep it out of the progress lines too.
logging.getLogger("asyncio").setLevel(logging.CRITICAL)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.peers import (  # noqa: E402
    ALL,
    BATCH,
    MESSAGE_BYTES,
    Filler,
    Meter,
    Peer,
    checksum,
    load,
    messages,
)

PAPER = {"unbatched": 50_000, "batched": 400_000, "consume": 22_000}
MB = 1_000_000
FILLER_BYTES = 64 * 1024
REPORTS = Path(__file__).resolve().parent / "reports"

DEFAULT = dict(
    messages=20_000,
    consume_messages=200_000,
    retained_messages=40_000,
    retained_mb=[0, 64, 256],
    partition_messages=40_000,
    partitions=[1, 16, 256],
    rates=[500, 2000],
    latency_seconds=4.0,
    variant_messages=2_000,
)
FULL = dict(
    messages=200_000,
    consume_messages=1_000_000,
    retained_messages=200_000,
    retained_mb=[0, 1024, 5120],
    partition_messages=200_000,
    partitions=[1, 16, 256],
    rates=[1000, 5000, 20000],
    latency_seconds=20.0,
    variant_messages=20_000,
)


# ---- results ----------------------------------------------------------------------------------


@dataclass
class Result:
    peer: str
    experiment: str  # "unbatched", "batched", "consume", "latency@500", "retained-produce@64", ...
    label: str
    messages: int = 0
    seconds: float = 0.0
    checked: str = ""
    error: str = ""
    samples: list = field(default_factory=list)  # (seconds, messages) for the plots
    extra: dict = field(default_factory=dict)
    bytes_per_message: int = MESSAGE_BYTES

    @property
    def ok(self) -> bool:
        return not self.error and self.seconds > 0

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.ok else 0.0


class Progress:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, message: str) -> None:
        elapsed = int(time.monotonic() - self.t0)
        print(f"[{elapsed // 60:2d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)


class Runner:
    def __init__(self, args, sizes: dict, progress: Progress) -> None:
        self.args = args
        self.sizes = sizes
        self.progress = progress
        self.results: list[Result] = []
        self.peer_info: dict[str, dict] = {}
        self.own_data_dir = args.data_dir is None
        self.payloads = messages(sizes["messages"])
        self.payload_checksum = checksum(self.payloads)
        count = max(sizes["consume_messages"], sizes["messages"])
        self.consume_payloads = self.payloads + messages(count - len(self.payloads), start=len(self.payloads))
        self.consume_checksum = checksum(self.consume_payloads)

    # -- helpers ---------------------------------------------------------------------------

    def record(self, result: Result) -> Result:
        self.results.append(result)
        if result.error:
            self.progress(f"  {result.peer} {result.label}: FAILED: {result.error.splitlines()[0][:200]}")
        elif result.experiment.startswith("latency"):
            self.progress(
                f"  {result.peer} {result.label}: p50 {result.extra['p50_ms']:.2f} ms, "
                f"p99 {result.extra['p99_ms']:.2f} ms ({result.messages:,} probes)"
            )
        else:
            self.progress(
                f"  {result.peer} {result.label}: {result.rate:,.0f} msg/s "
                f"({result.messages:,} in {result.seconds:.2f}s; {result.checked})"
            )
        return result

    def unique(self, label: str) -> str:
        return f"b-{label}-{uuid.uuid4().hex[:6]}"

    def check(self, peer: Peer, dest, count: int, expected_checksum: int, result: Result) -> None:
        """Read ``count`` messages of ``dest`` back (untimed); fail the result on a mismatch."""
        got, got_checksum = peer.consume_all(
            dest, count, Meter(f"{peer.name} read-back", count, progress=False)
        )
        if got != count or got_checksum != expected_checksum:
            result.error = (
                f"read back {got}/{count} messages, checksum "
                f"{'ok' if got_checksum == expected_checksum else 'MISMATCH'}"
            )
        else:
            result.checked = f"read back {got:,}/{count:,}, checksum ok"

    def timed(self, peer: Peer, experiment: str, label: str, fn, *args, total: int, **kwargs) -> Result:
        meter = Meter(f"{peer.name} {label}", total)
        result = Result(peer.name, experiment, label)
        try:
            outcome = fn(*args, meter, **kwargs)
            result.seconds = meter.elapsed
            result.messages = total
            result.samples = [(round(t, 5), c) for t, c in meter.samples]
            result.extra["outcome"] = outcome
        except Exception as exc:  # noqa: BLE001 -- report it, carry on
            result.error = f"{type(exc).__name__}: {exc}"
            result.extra["traceback"] = traceback.format_exc()
        return result

    # -- one peer --------------------------------------------------------------------------

    def run_peer(self, peer: Peer, data_dir: Path) -> None:
        info = self.peer_info.setdefault(peer.name, {})
        info.update(
            title=peer.title,
            install=peer.install_hint,
            client=peer.client_note,
            persistence=peer.persistence_note,
            unbatched=peer.unbatched_note,
            batched=peer.batch_note,
            consume=peer.consume_note,
        )
        missing = peer.missing()
        if missing and not self.args.no_install:
            self.install(peer)
            missing = peer.missing()
        if missing:
            info["error"] = missing
            self.progress(f"{peer.title}: not available: {missing}")
            return
        info["versions"] = peer.versions()
        info["loadavg_before"] = os.getloadavg()
        self.progress(f"{peer.title}: starting ...")
        started = time.monotonic()
        try:
            handle = peer.start(data_dir / peer.name)
        except Exception as exc:  # noqa: BLE001
            info["error"] = f"did not start: {type(exc).__name__}: {exc}"
            self.progress(f"{peer.title}: {info['error']}")
            return
        info["start_seconds"] = time.monotonic() - started
        info["pids"] = handle.pids
        info["ports"] = handle.ports
        self.progress(
            f"{peer.title}: up in {info['start_seconds']:.1f}s (pids {handle.pids}, ports {handle.ports})"
        )
        try:
            self.experiments(peer)
        finally:
            self.progress(f"{peer.title}: stopping pids {list(handle.pids.values())}")
            peer.stop()
            info["loadavg_after"] = os.getloadavg()
            if self.own_data_dir:  # free the disk before the next broker (GBs with --full)
                shutil.rmtree(data_dir / peer.name, ignore_errors=True)
        wanted = self.args.experiments
        if peer.name == "tributary" and not self.args.skip_fsync and (not wanted or "variants" in wanted):
            self.tributary_fsync(data_dir)

    def install(self, peer: Peer) -> None:
        if peer.debian_packages and os.geteuid() == 0 and shutil.which("apt-get"):
            cmd = ["apt-get", "install", "-y", "--no-install-recommends", *peer.debian_packages]
            self.progress(f"{peer.title}: installing: {' '.join(cmd)}")
            subprocess.run(
                cmd,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                check=False,
                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            )
        if peer.pypi_packages:
            cmd = [sys.executable, "-m", "pip", "install", "-q", *peer.pypi_packages]
            self.progress(f"{peer.title}: installing: {' '.join(cmd)}")
            subprocess.run(cmd, check=False)

    def experiments(self, peer: Peer) -> None:
        n = self.sizes["messages"]
        only = set(self.args.experiments.split(",")) if self.args.experiments else None

        def wanted(name: str) -> bool:
            return only is None or name in only

        if wanted("produce") or wanted("consume"):
            self.produce_consume(peer, n)
        if peer.name == "tributary" and wanted("variants"):
            self.tributary_variants(peer)
        if wanted("latency"):
            for rate in self.sizes["rates"]:
                self.latency(peer, rate)
        if wanted("retained"):
            for level in self.sizes["retained_mb"]:
                self.retained(peer, level, self.sizes["retained_messages"])
        if wanted("partitions"):
            for partitions in self.sizes["partitions"]:
                self.partitions(peer, partitions, max(self.sizes["partition_messages"], 100 * partitions))

    def produce_consume(self, peer: Peer, n: int) -> None:
        self.progress(f"{peer.title}: produce, unbatched ({n:,} messages)")
        dest = peer.create(self.unique("unbatched"))
        result = self.timed(
            peer, "unbatched", "produce, unbatched", peer.produce_unbatched, dest, self.payloads, total=n
        )
        if result.ok:
            self.check(peer, dest, n, self.payload_checksum, result)
        self.record(result)
        self.safe_delete(peer, dest)

        self.progress(f"{peer.title}: produce, batched ({BATCH}/batch)")
        dest = peer.create(self.unique("batched"))
        result = self.timed(
            peer,
            "batched",
            f"produce, batched ({BATCH}/batch)",
            peer.produce_batched,
            dest,
            self.payloads,
            total=n,
        )
        if result.ok:
            self.check(peer, dest, n, self.payload_checksum, result)
        self.record(result)
        self.safe_delete(peer, dest)

        c = self.sizes["consume_messages"]
        self.progress(f"{peer.title}: consume: filling {c:,} messages ...")
        dest = peer.create(self.unique("consume"))
        consumed = Result(peer.name, "consume", "consume")
        try:
            fill = Meter(f"{peer.name} fill", c)
            peer.fill(dest, self.consume_payloads, fill)
            self.progress(f"{peer.title}: consume ({c:,} messages; filled at {c / fill.elapsed:,.0f} msg/s)")
            consumed = self.timed(peer, "consume", "consume", peer.consume_all, dest, c, total=c)
            self.verify_consumed(consumed, c, self.consume_checksum)
        except Exception as exc:  # noqa: BLE001
            consumed.error = f"{type(exc).__name__}: {exc}"
        self.record(consumed)
        self.safe_delete(peer, dest)

    def verify_consumed(self, result: Result, n: int, expected: int) -> None:
        if not result.ok:
            return
        got, got_checksum = result.extra.get("outcome") or (0, 0)
        if got != n or got_checksum != expected:
            result.error = (
                f"consumed {got}/{n} messages, checksum {'ok' if got_checksum == expected else 'MISMATCH'}"
            )
        else:
            result.checked = f"{got:,}/{n:,} messages, checksum ok"

    def safe_delete(self, peer: Peer, dest) -> None:
        try:
            peer.delete(dest)
        except Exception as exc:  # noqa: BLE001
            self.progress(f"  ({peer.name}: could not delete {dest.name}: {exc})")

    def tributary_variants(self, peer) -> None:
        n = self.sizes["messages"]
        small = min(n, self.sizes["variant_messages"])
        runs = [
            (
                "variant-batched-acks0",
                f"produce, batched ({BATCH}/batch), acks=0, 16 in flight (paper's Kafka)",
                peer.produce_batched,
                n,
                dict(acks=0, in_flight=16),
            ),
            (
                "variant-batched-acksall",
                f"produce, batched ({BATCH}/batch), acks=all",
                peer.produce_batched,
                n,
                dict(acks="all"),
            ),
            (
                "variant-unbatched-acks1",
                "produce, unbatched, acks=1 (1 in flight)",
                peer.produce_unbatched,
                small,
                dict(acks=1),
            ),
            (
                "variant-unbatched-acksall",
                "produce, unbatched, acks=all (1 in flight)",
                peer.produce_unbatched,
                small,
                dict(acks="all"),
            ),
        ]
        self.run_variants(peer, runs)
        if not self.args.skip_java:
            self.java_variants(peer)

    def tributary_fsync(self, data_dir: Path) -> None:
        """The fsync-before-ack variants on their own cluster (storage node --flush-before-ack true)."""
        from bench.peers.tributary import Tributary

        n = self.sizes["messages"]
        small = min(n, self.sizes["variant_messages"])
        fsync = Tributary(flush_before_ack=True)
        self.progress("Tributary: a cluster with --flush-before-ack true ...")
        try:
            fsync.start(data_dir / "tributary-fsync")
            runs = [
                (
                    "variant-fsync-batched-acksall",
                    f"produce, batched ({BATCH}/batch), acks=all, fsync before ack",
                    fsync.produce_batched,
                    n,
                    dict(acks="all"),
                ),
                (
                    "variant-fsync-unbatched-acksall",
                    "produce, unbatched, acks=all, fsync before ack",
                    fsync.produce_unbatched,
                    small,
                    dict(acks="all"),
                ),
            ]
            self.run_variants(fsync, runs, as_peer="tributary")
        except Exception as exc:  # noqa: BLE001
            self.record(
                Result("tributary", "variant-fsync", "fsync before ack", error=f"{type(exc).__name__}: {exc}")
            )
        finally:
            self.progress("Tributary: stopping the fsync cluster")
            fsync.stop()
            if self.own_data_dir:
                shutil.rmtree(data_dir / "tributary-fsync", ignore_errors=True)

    def run_variants(self, peer, runs, as_peer: str | None = None) -> None:
        for experiment, label, fn, count, kwargs in runs:
            self.progress(f"Tributary: {label} ({count:,} messages)")
            payloads = self.payloads[:count]
            dest = peer.create(self.unique(experiment))
            result = self.timed(peer, experiment, label, fn, dest, payloads, total=count, **kwargs)
            result.peer = as_peer or peer.name
            if result.ok:
                self.check(peer, dest, count, checksum(payloads), result)
            self.record(result)
            self.safe_delete(peer, dest)

    def java_variants(self, peer) -> None:
        from bench.peers import tributary_java

        n = self.sizes["messages"]
        problem = tributary_java.missing()
        if problem:
            self.record(Result("tributary", "variant-java", "Java gRPC stub client", error=problem))
            return
        try:
            self.progress("Tributary: building the Java gRPC client (generated stubs) ...")
            tributary_java.build(self.progress)
        except Exception as exc:  # noqa: BLE001
            self.record(
                Result(
                    "tributary",
                    "variant-java",
                    "Java gRPC stub client",
                    error=f"build failed: {type(exc).__name__}: {exc}",
                )
            )
            return
        self.peer_info["tributary"]["java"] = tributary_java.versions()
        runs = [
            (
                "variant-java-unbatched",
                "produce, unbatched, acks=0, 16 in flight (Java stub, typed records)",
                "unbatched",
                dict(acks=0, in_flight=16),
            ),
            (
                "variant-java-batched",
                f"produce, batched ({BATCH}/request), acks=1 (Java stub, typed records)",
                "batched",
                dict(acks=1, in_flight=1),
            ),
        ]
        for experiment, label, mode, kwargs in runs:
            self.progress(f"Tributary: {label} ({n:,} messages)")
            dest = peer.create(self.unique(experiment))
            result = self.timed(
                peer,
                experiment,
                label,
                tributary_java.produce,
                peer.servers,
                dest,
                mode,
                n,
                total=n,
                **kwargs,
            )
            if result.ok:
                self.check(peer, dest, n, self.payload_checksum, result)
            self.record(result)
            self.safe_delete(peer, dest)

    def latency(self, peer: Peer, rate: int) -> None:
        n = max(50, int(rate * self.sizes["latency_seconds"]))
        self.progress(f"{peer.title}: latency at {rate:,} msg/s ({n:,} probes)")
        dest = peer.create(self.unique(f"latency{rate}"))
        result = Result(peer.name, f"latency@{rate}", f"latency at {rate:,} msg/s")
        try:
            samples, sent_rate = peer.latency(dest, rate, n)
            if len(samples) < n:
                result.error = f"only {len(samples)}/{n} probes arrived"
            samples.sort()
            if samples:
                result.messages = len(samples)
                result.seconds = n / sent_rate if sent_rate else 0.0
                result.extra.update(
                    p50_ms=1e3 * samples[len(samples) // 2],
                    p99_ms=1e3 * samples[min(len(samples) - 1, int(len(samples) * 0.99))],
                    p999_ms=1e3 * samples[min(len(samples) - 1, int(len(samples) * 0.999))],
                    max_ms=1e3 * samples[-1],
                    mean_ms=1e3 * statistics.fmean(samples),
                    sent_rate=sent_rate,
                    target_rate=rate,
                )
                result.checked = f"{len(samples):,}/{n:,} probes, sent at {sent_rate:,.0f}/s"
        except Exception as exc:  # noqa: BLE001
            result.error = f"{type(exc).__name__}: {exc}"
        self.record(result)
        self.safe_delete(peer, dest)

    def retained(self, peer: Peer, level_mb: int, m: int) -> None:
        """Produce and consume rate with ``level_mb`` MB already retained in the destination.

        The destination gets: ``m`` messages (consumed later), then ``level_mb`` MB of 64 KiB filler
        messages, then the timed ``m`` produced messages; then the first ``m`` are consumed (timed,
        with the filler and the new ones still retained behind them), and finally everything else
        is read back (untimed) to check it.
        """
        self.progress(f"{peer.title}: retained {level_mb:,} MB: filling ...")
        dest = peer.create(self.unique(f"retained{level_mb}"))
        first = self.consume_payloads[:m]
        second = messages(m, start=10_000_000)
        filler = Filler(level_mb * MB // FILLER_BYTES, FILLER_BYTES, tag=level_mb)
        produce = Result(
            peer.name, f"retained-produce@{level_mb}", f"produce (batched) with {level_mb:,} MB retained"
        )
        consume = Result(peer.name, f"retained-consume@{level_mb}", f"consume with {level_mb:,} MB retained")
        try:
            peer.produce_batched(dest, first, Meter("first", m, progress=False))
            if len(filler):
                fill = Meter(f"{peer.name} fill {level_mb} MB", len(filler))
                peer.fill(dest, filler, fill)
                self.progress(
                    f"  filled {level_mb:,} MB in {fill.elapsed:.1f}s "
                    f"({level_mb / max(fill.elapsed, 1e-9):,.0f} MB/s)"
                )
            produce = self.timed(
                peer, produce.experiment, produce.label, peer.produce_batched, dest, second, total=m
            )
            consume = self.timed(peer, consume.experiment, consume.label, peer.consume_all, dest, m, total=m)
            self.verify_consumed(consume, m, checksum(first))
            rest = len(filler) + m
            expected = filler.checksum() + checksum(second)
            if produce.ok:
                self.check(peer, dest, rest, expected, produce)
            produce.extra["retained_mb"] = consume.extra["retained_mb"] = level_mb
        except Exception as exc:  # noqa: BLE001
            produce.error = produce.error or f"{type(exc).__name__}: {exc}"
            consume.error = consume.error or produce.error
        self.record(produce)
        self.record(consume)
        self.safe_delete(peer, dest)

    def partitions(self, peer: Peer, partitions: int, n: int) -> None:
        self.progress(f"{peer.title}: {partitions} partitions ({n:,} messages)")
        payloads = self.consume_payloads[:n] if n <= len(self.consume_payloads) else messages(n)
        expected = checksum(payloads)
        produce = Result(
            peer.name, f"partitions-produce@{partitions}", f"produce (batched), {partitions} partitions"
        )
        consume = Result(peer.name, f"partitions-consume@{partitions}", f"consume, {partitions} partitions")
        dest = None
        try:
            dest = peer.create(self.unique(f"p{partitions}"), partitions)
            produce = self.timed(
                peer, produce.experiment, produce.label, peer.produce_batched, dest, payloads, total=n
            )
            if produce.ok:
                consume = self.timed(
                    peer, consume.experiment, consume.label, peer.consume_all, dest, n, total=n
                )
                self.verify_consumed(consume, n, expected)
                produce.checked = "read back by the consume row" if consume.ok else ""
                if consume.error:
                    produce.error = "not read back: " + consume.error
        except Exception as exc:  # noqa: BLE001
            produce.error = produce.error or f"{type(exc).__name__}: {exc}"
        if not consume.ok and not consume.error:
            consume.error = produce.error or "not run"
        self.record(produce)
        self.record(consume)
        if dest is not None:
            self.safe_delete(peer, dest)
        if peer.name == "tributary" and partitions == max(self.sizes["partitions"]) and partitions > 1:
            # The same produce on a topic without flush.ms (Kafka's default: no timed fsync), to
            # show what the timed fsync in the append path costs with many partitions.
            label = f"produce (batched), {partitions} partitions, topic without flush.ms"
            self.progress(f"Tributary: {label}")
            from bench.peers.tributary import Tributary

            assert isinstance(peer, Tributary)  # the only peer with topic configs
            dest = peer.create(self.unique(f"p{partitions}-noflush"), partitions, configs={})
            result = self.timed(
                peer,
                f"variant-partitions-noflush@{partitions}",
                label,
                peer.produce_batched,
                dest,
                payloads,
                total=n,
            )
            if result.ok:
                self.check(peer, dest, n, expected, result)
            self.record(result)
            self.safe_delete(peer, dest)

    # -- the profile -----------------------------------------------------------------------

    def profile_tributary(self, data_dir: Path) -> dict | None:
        """py-spy on the client, gateway and storage node during an unbatched produce and a
        consume (not the measured runs: sampling costs a little)."""
        from bench import compare_profile as profile

        if not profile.available():
            return {"error": "py-spy is not installed (.venv/bin/pip install py-spy)"}
        from bench.peers.tributary import Tributary

        peer = Tributary()
        self.progress("Profile: Tributary under py-spy (unbatched produce, batched produce, consume) ...")
        try:
            peer.start(data_dir / "tributary-profile")
            return profile.profile_tributary(peer, self.payloads, self.consume_payloads, self.progress)
        except Exception as exc:  # noqa: BLE001
            return {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        finally:
            peer.stop()


# ---- the machine ------------------------------------------------------------------------------


def machine_info(data_dir: Path) -> dict:
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cores": os.cpu_count(),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
        meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        info["memory_gib"] = int(meminfo["MemTotal"].split()[0]) / 1024 / 1024
        info["memory_available_gib"] = int(meminfo["MemAvailable"].split()[0]) / 1024 / 1024
    except (OSError, KeyError, ValueError):
        pass
    usage = shutil.disk_usage(data_dir)
    info["disk"] = f"{usage.total / 2**30:.0f} GiB, {usage.free / 2**30:.0f} GiB free"
    source = subprocess.run(
        ["df", "--output=source,fstype", str(data_dir)], capture_output=True, text=True
    ).stdout
    parts = source.splitlines()[-1].split() if source else []
    if parts:
        device = Path(parts[0]).name
        rotational = Path(f"/sys/block/{device}/queue/rotational")
        kind = ""
        if rotational.exists():
            kind = (
                ", reported rotational"
                if rotational.read_text().strip() == "1"
                else ", reported non-rotational"
            )
        info["disk"] += f" ({parts[0]}, {parts[1] if len(parts) > 1 else '?'}{kind})"
    info["data_dir"] = str(data_dir)
    info["loadavg_start"] = os.getloadavg()
    return info


# ---- main -------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="See the module docstring for the experiments.",
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="full size: 200,000 produced / 1,000,000 consumed, 0/1/5 GB retained, rates 1k/5k/20k "
        "(~30-60 min, ~15 GB of disk, Redis holds 5 GB in memory)",
    )
    parser.add_argument(
        "--messages", type=int, metavar="N", help="messages per produce experiment (default 20,000)"
    )
    parser.add_argument(
        "--consume-messages",
        type=int,
        metavar="N",
        help="messages the consume experiment reads (default 200,000)",
    )
    parser.add_argument("--peers", default=",".join(ALL), help=f"comma-separated, from {','.join(ALL)}")
    parser.add_argument(
        "--experiments",
        default="",
        help="only these (comma-separated): produce,consume,variants,latency,retained,partitions",
    )
    parser.add_argument("--retained-mb", help="retained-data levels in MB, e.g. 0,64,256")
    parser.add_argument("--partitions", help="partition counts, e.g. 1,16,256")
    parser.add_argument("--rates", help="latency rates in msg/s, e.g. 500,2000")
    parser.add_argument(
        "--data-dir", help="where brokers keep data (default: a temporary directory, removed)"
    )
    parser.add_argument("--report-dir", default=str(REPORTS), help="where the report and plots go")
    parser.add_argument("--no-install", action="store_true", help="do not install missing brokers/clients")
    parser.add_argument("--skip-java", action="store_true", help="skip the Java gRPC stub client")
    parser.add_argument(
        "--skip-fsync", action="store_true", help="skip the fsync-before-ack Tributary cluster"
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the py-spy profile of Tributary")
    parser.add_argument(
        "--tributary-data-path",
        choices=("auto", "grpc"),
        default="auto",
        help="the SDK's data_path: auto (the gateway's raw data listener) or grpc (default: auto)",
    )
    parser.add_argument(
        "--render", metavar="JSON", help="only rewrite the report (and plots) from a raw results file"
    )
    return parser


def _sizes_and_peers(args: argparse.Namespace, parser: argparse.ArgumentParser) -> tuple[dict, list[str]]:
    """The experiment sizes (the default or --full, with the options' overrides) and the peers."""
    sizes = dict(FULL if args.full else DEFAULT)
    if args.messages:
        sizes["messages"] = args.messages
    if args.consume_messages:
        sizes["consume_messages"] = args.consume_messages
    for name in ("retained_mb", "partitions", "rates"):
        value = getattr(args, name)
        if value:
            sizes[name] = [int(v) for v in value.split(",") if v]
    peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    for name in peers:
        if name not in ALL:
            parser.error(f"unknown peer {name!r}; choose from {', '.join(ALL)}")
    return sizes, peers


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    from bench.peers.tributary import Tributary

    Tributary.data_path = args.tributary_data_path
    if args.render:
        return render(Path(args.render))
    sizes, peers = _sizes_and_peers(args, parser)

    def stop_on_sigterm(_signum, _frame):
        raise KeyboardInterrupt  # so that every broker is stopped (finally blocks) and the report written

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    progress = Progress()
    started_at = dt.datetime.now()
    own_dir = args.data_dir is None
    data_dir = Path(args.data_dir or tempfile.mkdtemp(prefix="tributary-compare-"))
    data_dir.mkdir(parents=True, exist_ok=True)
    machine = machine_info(data_dir)
    progress(
        f"{sizes['messages']:,} messages of {MESSAGE_BYTES} B per experiment; peers {', '.join(peers)}; "
        f"{machine.get('cores')} cores, load {machine['loadavg_start'][0]:.2f}; data in {data_dir}"
    )
    runner = Runner(args, sizes, progress)
    profile = None
    try:
        for name in peers:
            runner.run_peer(load(name), data_dir)
        if "tributary" in peers and not args.no_profile:
            profile = runner.profile_tributary(data_dir)
    except KeyboardInterrupt:
        progress("interrupted: writing what was measured")
    finally:
        if own_dir:
            shutil.rmtree(data_dir, ignore_errors=True)
    machine["loadavg_end"] = os.getloadavg()
    finished_at = dt.datetime.now()

    from bench import compare_report as report

    command = " ".join(["python", "bench/compare.py", *(argv if argv is not None else sys.argv[1:])])
    path = report.write(
        Path(args.report_dir), runner, machine, sizes, peers, profile, started_at, finished_at, command
    )
    raw = path.with_suffix(".json")
    raw.write_text(
        json.dumps(
            {
                "machine": machine,
                "sizes": sizes,
                "peers": runner.peer_info,
                "peer_order": peers,
                "started": started_at.isoformat(),
                "finished": finished_at.isoformat(),
                "command": command,
                "results": [asdict(r) for r in runner.results],
                "profile": profile,
            },
            separators=(",", ":"),
            default=str,
        )
    )
    progress(f"report: {path} (raw results: {raw.name})")
    print(path.read_text().split("\n## ", 2)[1] if "\n## " in path.read_text() else "")
    return 0


def render(raw: Path) -> int:
    """Rewrite ``<date>.md`` and its plots next to ``raw`` from the results it holds."""
    from types import SimpleNamespace

    from bench import compare_report as report

    data = json.loads(raw.read_text())
    fields = set(Result.__dataclass_fields__)
    results = [Result(**{k: v for k, v in r.items() if k in fields}) for r in data["results"]]
    runner = SimpleNamespace(results=results, peer_info=data["peers"])
    started, finished = (
        dt.datetime.fromisoformat(data["started"]),
        dt.datetime.fromisoformat(data["finished"]),
    )
    path = report.write(
        raw.parent,
        runner,
        data["machine"],
        data["sizes"],
        data["peer_order"],
        data["profile"],
        started,
        finished,
        data["command"],
        path=raw.with_suffix(".md"),
    )
    print(f"report: {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
