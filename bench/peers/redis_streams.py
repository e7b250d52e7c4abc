"""Redis Streams (Debian ``redis-server``) through redis-py with the hiredis parser.

* Broker: ``redis-server`` on 127.0.0.1, append-only file on, ``appendfsync everysec`` (fsync once
  a second, in the background: Redis's "durable, async flush"), RDB snapshots off.
* A partition is a stream key ``<name>:<p>``; a message is ``XADD key * v <payload>``.
* unbatched: one ``XADD`` per request, sent without waiting for its reply, up to 16 replies
  outstanding (Redis has no fire-and-forget publish; a request whose reply is read later is its
  closest, and the same window as Tributary's 16 requests in flight); done when every reply is in.
* batched: a pipeline of 50 ``XADD`` (one write, 50 replies) per round trip: Redis's batching.
* consume: ``XREAD COUNT 1000 STREAMS <keys...> <last ids...>`` in a loop.

Client: redis-py (the reference Python client, maintained by Redis) with hiredis (its C reply
parser), the fastest way Python users talk to Redis.
"""

from __future__ import annotations

import threading
import time
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
    paced,
    spawn,
    wait_until,
)

WINDOW = 16


class RedisStreams(Peer):
    name = "redis"
    title = "Redis Streams"
    debian_packages = ("redis-server",)
    pypi_packages = ("redis", "hiredis")
    binaries = ("redis-server",)
    modules = ("redis", "hiredis")
    client_note = (
        "redis-py + hiredis: the reference Python client with its C reply parser; "
        "low-level Connection.send_command/read_response for the pipelined unbatched producer"
    )
    persistence_note = (
        "appendonly yes, appendfsync everysec (background fsync each second), RDB off; data in memory"
    )
    unbatched_note = "one XADD per request, 16 replies outstanding"
    batch_note = "pipeline of 50 XADD per round trip"
    consume_note = "XREAD COUNT 1000"

    def versions(self) -> dict[str, str]:
        result = super().versions()
        result["redis-server"] = command_output(["redis-server", "--version"])
        return result

    def start(self, data_dir: Path) -> Handle:
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        log = data_dir / "redis.log"
        process = spawn(
            [
                "redis-server",
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--protected-mode",
                "yes",
                "--dir",
                str(data_dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--daemonize",
                "no",
                "--logfile",
                str(log),
            ],
            log,
        )
        self.handle = Handle({"redis-server": process}, {"redis": port}, data_dir, log)
        self.port = port
        try:
            wait_until(lambda: self._client().ping(), process, 30, "redis-server", log)
        except PeerUnavailable:
            self.stop()
            raise
        return self.handle

    def _client(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=60)

    def _keys(self, dest: Dest) -> list[str]:
        return [f"{dest.name}:{p}" for p in range(dest.partitions)]

    def create(self, name: str, partitions: int = 1) -> Dest:
        return Dest(name, partitions)  # stream keys appear with their first XADD

    def delete(self, dest: Dest) -> None:
        client = self._client()
        for key in self._keys(dest):
            client.delete(key)
        client.close()

    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        import redis

        keys = self._keys(dest)
        conn = redis.Connection(host="127.0.0.1", port=self.port, socket_timeout=60)
        conn.connect()
        pending = 0
        meter.start()
        for i, value in enumerate(payloads):
            conn.send_command("XADD", keys[i % len(keys)], "*", "v", value)
            pending += 1
            if pending >= WINDOW:
                conn.read_response()
                pending -= 1
                meter.add(1)
        while pending:
            conn.read_response()
            pending -= 1
            meter.add(1)
        meter.stop()
        conn.disconnect()

    def produce_batched(
        self, dest: Dest, payloads: Sequence[bytes], meter: Meter, batch: int = BATCH
    ) -> None:
        keys = self._keys(dest)
        client = self._client()
        meter.start()
        for k, chunk in batches(payloads, batch):
            pipe = client.pipeline(transaction=False)
            key = keys[dest.partition_of_batch(k)]
            for value in chunk:
                pipe.xadd(key, {"v": value})
            pipe.execute()
            meter.add(len(chunk))
        meter.stop()
        client.close()

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        import zlib

        keys = self._keys(dest)
        last = dest.state.setdefault("last_ids", {key: "0-0" for key in keys})
        client = self._client()
        count = total = 0
        deadline = time.monotonic() + timeout
        meter.start()
        while count < n and time.monotonic() < deadline:
            response = client.xread(dict(last), count=min(PREFETCH_MESSAGES, n - count), block=1000)
            for key, entries in response or ():
                key = key.decode()
                for entry_id, fields in entries:
                    if count >= n:
                        break
                    total += zlib.crc32(fields[b"v"])
                    count += 1
                    last[key] = entry_id.decode()
                meter.add(len(entries))
        meter.stop()
        client.close()
        return count, total

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        key = self._keys(dest)[0]
        samples: list[float] = []
        ready = threading.Event()

        def consume() -> None:
            client = self._client()
            last = "$"
            ready.set()
            deadline = time.monotonic() + n / rate + 30
            while len(samples) < n and time.monotonic() < deadline:
                for _, entries in client.xread({key: last}, count=PREFETCH_MESSAGES, block=500) or ():
                    now = time.monotonic_ns()
                    for entry_id, fields in entries:
                        samples.append(latency_of(fields[b"v"], now))
                        last = entry_id
            client.close()

        client = self._client()
        client.xadd(key, {"v": b"created"})  # the key exists before the consumer's "$"
        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        ready.wait(10)
        time.sleep(0.3)  # the XREAD BLOCK is in place
        started = time.perf_counter()
        for _ in paced(n, rate):
            client.xadd(key, {"v": latency_message(time.monotonic_ns())})
        sent_rate = n / (time.perf_counter() - started)
        consumer.join(n / rate + 40)
        client.close()
        return samples, sent_rate
