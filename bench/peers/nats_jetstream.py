"""NATS with JetStream file storage (Debian ``nats-server``) through nats-py.

* Broker: ``nats-server`` on 127.0.0.1 with JetStream on, file storage in the data directory.
  nats-server 2.9 writes each message to its stream's block file as it arrives and leaves the
  fsync to the OS and to block rollover (``sync_interval`` only exists from 2.10): durable on
  disk, flushed asynchronously.
* A partition is a stream ``<name>-<p>`` on subject ``<name>.<p>`` (limits retention, file storage).
* unbatched: one core ``PUBLISH`` per message to the stream's subject -- JetStream stores it,
  no acknowledgement asked (NATS's fire-and-forget publish, like the paper's producer); the clock
  stops when the stream's message count (``STREAM.INFO``) reaches the number sent.
* batched: 50 ``js.publish_async`` (each asks for a PubAck), then wait for the 50 PubAcks: NATS's
  "publisher confirms in batches" (2.9 has no multi-message publish).
* consume: a pull consumer (``AckNone``, i.e. auto-acknowledged) per stream, ``fetch(1000)``.

Client: nats-py, the official asyncio Python client from the NATS maintainers (Synadia).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
import zlib
from collections.abc import Sequence
from pathlib import Path

from bench.peers import (
    BATCH,
    PREFETCH_MESSAGES,
    Dest,
    Handle,
    Meter,
    Peer,
    PeerUnavailable,
    batches,
    command_output,
    free_port,
    latency_message,
    latency_of,
    spawn,
    wait_until,
)


class NatsJetStream(Peer):
    name = "nats"
    title = "NATS JetStream"
    debian_packages = ("nats-server",)
    pypi_packages = ("nats-py",)
    binaries = ("nats-server",)
    modules = ("nats",)
    client_note = (
        "nats-py: the official asyncio client from the NATS maintainers, with JetStream "
        "(publish_async, pull consumers)"
    )
    persistence_note = (
        "JetStream file storage; 2.9 writes each message to the block file on arrival and leaves "
        "fsync to the OS / block rollover (sync_interval arrives in 2.10)"
    )
    unbatched_note = "core PUB to the stream subject, no ack; barrier on STREAM.INFO"
    batch_note = "50 js.publish_async, then wait for their 50 PubAcks"
    consume_note = "pull consumer, AckNone, fetch(1000)"

    def versions(self) -> dict[str, str]:
        result = super().versions()
        result["nats-server"] = command_output(["nats-server", "--version"])
        return result

    def start(self, data_dir: Path) -> Handle:
        data_dir.mkdir(parents=True, exist_ok=True)
        port, monitor = free_port(), free_port()
        config = data_dir / "nats.conf"
        config.write_text(
            f"listen: 127.0.0.1:{port}\n"
            f"http: 127.0.0.1:{monitor}\n"
            "max_payload: 8MB\n"
            "jetstream {\n"
            f"  store_dir: {json.dumps(str(data_dir / 'jetstream'))}\n"
            "  max_memory_store: 256MB\n"
            "  max_file_store: 64GB\n"
            "}\n"
        )
        log = data_dir / "nats.log"
        process = spawn(["nats-server", "-c", str(config)], log)
        self.handle = Handle({"nats-server": process}, {"nats": port, "monitor": monitor}, data_dir, log)
        self.port = port

        def healthy() -> bool:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{monitor}/healthz?js-enabled-only=true", timeout=2
            ) as r:
                return r.status == 200

        try:
            wait_until(healthy, process, 30, "nats-server", log)
        except PeerUnavailable:
            self.stop()
            raise
        return self.handle

    # -- helpers ---------------------------------------------------------------------------

    async def _connect(self):
        import nats

        nc = await nats.connect(
            f"nats://127.0.0.1:{self.port}",
            max_reconnect_attempts=0,
            connect_timeout=10,
            pending_size=8 * 1024 * 1024,
        )
        return nc, nc.jetstream(timeout=30, publish_async_max_pending=4000)

    @staticmethod
    def _stream(dest: Dest, p: int) -> str:
        return f"{dest.name}-{p}"

    @staticmethod
    def _subject(dest: Dest, p: int) -> str:
        return f"{dest.name}.{p}"

    def _run(self, coro):
        return asyncio.run(coro)

    async def _stored(self, js, dest: Dest) -> int:
        total = 0
        for p in range(dest.partitions):
            info = await js.stream_info(self._stream(dest, p))
            total += info.state.messages
        return total

    # -- destinations ----------------------------------------------------------------------

    def create(self, name: str, partitions: int = 1) -> Dest:
        from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

        dest = Dest(name.replace(".", "-"), partitions)

        async def create() -> None:
            nc, js = await self._connect()
            for p in range(partitions):
                await js.add_stream(
                    StreamConfig(
                        name=self._stream(dest, p),
                        subjects=[self._subject(dest, p)],
                        storage=StorageType.FILE,
                        retention=RetentionPolicy.LIMITS,
                        discard=DiscardPolicy.OLD,
                        max_msgs=-1,
                        max_bytes=-1,
                        max_msg_size=8 * 1024 * 1024,
                        num_replicas=1,
                    )
                )
            await nc.close()

        self._run(create())
        return dest

    def delete(self, dest: Dest) -> None:
        async def delete() -> None:
            nc, js = await self._connect()
            for p in range(dest.partitions):
                try:
                    await js.delete_stream(self._stream(dest, p))
                except Exception:  # noqa: BLE001 -- best effort
                    pass
            await nc.close()

        self._run(delete())

    # -- experiments -----------------------------------------------------------------------

    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        async def produce() -> None:
            nc, js = await self._connect()
            expected = await self._stored(js, dest) + len(payloads)
            subjects = [self._subject(dest, p) for p in range(dest.partitions)]
            meter.start()
            for i, value in enumerate(payloads):
                await nc.publish(subjects[i % len(subjects)], value)
                meter.add(1)
            await nc.flush(timeout=60)
            deadline = time.monotonic() + 120
            stored = await self._stored(js, dest)
            while stored < expected and time.monotonic() < deadline:
                await asyncio.sleep(0.005)
                stored = await self._stored(js, dest)
            meter.stop()
            await nc.close()
            if stored != expected:
                raise RuntimeError(f"NATS stored {stored} of {expected} messages after the core publishes")

        self._run(produce())

    def produce_batched(
        self, dest: Dest, payloads: Sequence[bytes], meter: Meter, batch: int = BATCH
    ) -> None:
        async def produce() -> None:
            nc, js = await self._connect()
            meter.start()
            for k, chunk in batches(payloads, batch):
                subject = self._subject(dest, dest.partition_of_batch(k))
                futures = [await js.publish_async(subject, value) for value in chunk]
                for ack in await asyncio.gather(*futures):
                    if ack.stream is None:
                        raise RuntimeError(f"NATS publish not acknowledged: {ack}")
                meter.add(len(chunk))
            meter.stop()
            await nc.close()

        self._run(produce())

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        from nats.errors import TimeoutError as NatsTimeout
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        positions = dest.state.setdefault("consumed", [0] * dest.partitions)

        async def consume() -> tuple[int, int]:
            nc, js = await self._connect()
            subs = []
            for p in range(dest.partitions):
                config = ConsumerConfig(
                    ack_policy=AckPolicy.NONE,
                    deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                    opt_start_seq=positions[p] + 1,
                    max_ack_pending=-1,
                )
                subs.append(
                    await js.pull_subscribe(
                        self._subject(dest, p), stream=self._stream(dest, p), config=config
                    )
                )
            count = total = 0
            deadline = time.monotonic() + timeout
            meter.start()
            while count < n and time.monotonic() < deadline:
                for p, sub in enumerate(subs):
                    if count >= n:
                        break
                    try:
                        msgs = await sub.fetch(batch=min(PREFETCH_MESSAGES, n - count), timeout=0.5)
                    except (TimeoutError, NatsTimeout):
                        continue
                    for msg in msgs:
                        total += zlib.crc32(msg.data)
                    count += len(msgs)
                    positions[p] += len(msgs)
                    meter.add(len(msgs))
            meter.stop()
            for sub in subs:
                try:
                    await sub.unsubscribe()
                except Exception:  # noqa: BLE001
                    pass
            await nc.close()
            return count, total

        return self._run(consume())

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

        subject = self._subject(dest, 0)

        async def run() -> tuple[list[float], float]:
            nc, js = await self._connect()
            samples: list[float] = []
            done = asyncio.Event()

            async def on_message(msg) -> None:
                samples.append(latency_of(msg.data, time.monotonic_ns()))
                if len(samples) >= n:
                    done.set()

            sub = await js.subscribe(
                subject,
                cb=on_message,
                stream=self._stream(dest, 0),
                config=ConsumerConfig(
                    ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.NEW, max_ack_pending=-1
                ),
            )
            producer_nc, _ = await self._connect()
            await asyncio.sleep(0.3)
            loop = asyncio.get_running_loop()
            started = loop.time()
            for i in range(n):
                delay = started + i / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                await producer_nc.publish(subject, latency_message(time.monotonic_ns()))
            sent_rate = n / max(1e-9, loop.time() - started)
            await producer_nc.flush()
            try:
                await asyncio.wait_for(done.wait(), timeout=30)
            except TimeoutError:
                pass
            await sub.unsubscribe()
            await producer_nc.close()
            await nc.close()
            return samples, sent_rate

        return self._run(run())
