"""RabbitMQ (Debian ``rabbitmq-server``) through pika.

* Broker: the Debian RabbitMQ on Erlang/OTP, started from ``/usr/lib/rabbitmq/bin/rabbitmq-server``
  with its own node name, config, data ("mnesia") and log directories, AMQP and Erlang
  distribution on 127.0.0.1 only, no plugins, and a private ``epmd`` on 127.0.0.1 started (and
  stopped) by us, so nothing outlives the run.
* A partition is a durable classic queue ``<name>.<p>``; messages are persistent
  (``delivery_mode=2``): written to the queue's message store on disk, which RabbitMQ fsyncs in
  the background (and before it confirms a message).
* unbatched: ``basic.publish`` without publisher confirms (the paper's setting for RabbitMQ);
  the clock stops when the queue depth (``queue.declare`` passive) reaches the number sent.
* batched: publisher confirms in batches: 50 ``basic.publish`` then wait until all 50 are
  confirmed (pika's SelectConnection, the asynchronous adapter). AMQP has no multi-message
  publish; a confirmed batch is its closest mechanism (RabbitMQ confirms a persistent message
  once it is on disk).
* consume: ``basic.consume`` with ``basic.qos(prefetch_count=1000)`` and cumulative manual
  acknowledgements (``multiple``) every 100 messages. The paper set RabbitMQ to auto-ack, but
  RabbitMQ ignores the prefetch for auto-ack consumers (it pushes whatever its flow control
  allows), so the 1,000-message prefetch the experiment asks for needs manual acks; and a
  consumer that stops after ``n`` messages must leave the rest in the queue, which auto-ack
  cannot (what is on the wire at the cancel is gone).

Client: pika, the Python client RabbitMQ's own tutorials use; pure Python, synchronous
(BlockingConnection) and asynchronous (SelectConnection) adapters.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.peers import (
    BATCH,
    PREFETCH_MESSAGES,
    Dest,
    Handle,
    Meter,
    Peer,
    PeerUnavailable,
    batches,
    deb_version,
    free_port,
    latency_message,
    latency_of,
    paced,
    spawn,
    terminate,
    wait_until,
)

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"
EPMD = "/usr/bin/epmd"
#: Consumers acknowledge cumulatively (``multiple``) every this many messages.
ACK_EVERY = 100


class RabbitMQ(Peer):
    name = "rabbitmq"
    title = "RabbitMQ"
    debian_packages = ("rabbitmq-server",)
    pypi_packages = ("pika",)
    binaries = (SERVER, EPMD)
    modules = ("pika",)
    client_note = (
        "pika: the client of RabbitMQ's own Python tutorials; BlockingConnection for publish/consume, "
        "SelectConnection (async) for batched publisher confirms"
    )
    persistence_note = (
        "durable classic queues, persistent messages (delivery_mode 2) in the on-disk message store, "
        "fsynced in the background (and before a publisher confirm)"
    )
    unbatched_note = "basic.publish, no confirms; barrier on queue depth"
    batch_note = "50 basic.publish, then wait for their publisher confirms"
    consume_note = "basic.consume, qos prefetch 1000, ack (multiple) every 100"

    def versions(self) -> dict[str, str]:
        result = super().versions()
        result["erlang-base (deb)"] = deb_version("erlang-base")
        return result

    def start(self, data_dir: Path) -> Handle:
        data_dir.mkdir(parents=True, exist_ok=True)
        amqp, dist, epmd_port = free_port(), free_port(), free_port()
        (data_dir / "enabled_plugins").write_text("[].\n")
        (data_dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = 127.0.0.1:{amqp}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = warning\n"
            # The machine is shared: keep RabbitMQ's memory alarm where a 24 GB box is not at risk.
            "vm_memory_high_watermark.relative = 0.4\n"
            "disk_free_limit.absolute = 1GB\n"
        )
        log = data_dir / "rabbitmq.log"
        epmd = spawn([EPMD, "-address", "127.0.0.1", "-port", str(epmd_port)], data_dir / "epmd.log")
        env = {
            "HOME": str(data_dir),  # the Erlang cookie
            "ERL_EPMD_PORT": str(epmd_port),
            "RABBITMQ_NODENAME": f"tributary-bench-{amqp}@localhost",
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(amqp),
            "RABBITMQ_DIST_PORT": str(dist),
            "RABBITMQ_MNESIA_BASE": str(data_dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(data_dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(data_dir / "rabbitmq.conf"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(data_dir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": "/dev/null",
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        }
        time.sleep(0.2)
        server = spawn([SERVER], log, env=env)
        self.handle = Handle(
            {"epmd": epmd, "rabbitmq-server": server},
            {"amqp": amqp, "dist": dist, "epmd": epmd_port},
            data_dir,
            log,
        )
        self.port = amqp

        def ready() -> bool:
            self._connection().close()
            return True

        try:
            wait_until(ready, server, 120, "rabbitmq-server", log)
        except PeerUnavailable:
            self.stop()
            raise
        return self.handle

    def stop(self) -> None:
        if self.handle is None:
            return
        # The server script forwards SIGTERM to the Erlang VM, which shuts RabbitMQ down cleanly;
        # epmd goes last (the VM unregisters from it on the way out).
        terminate(self.handle.processes["rabbitmq-server"], timeout=60)
        terminate(self.handle.processes["epmd"])
        self.handle = None

    # -- helpers ---------------------------------------------------------------------------

    def _params(self):
        import pika

        return pika.ConnectionParameters(
            "127.0.0.1", self.port, connection_attempts=1, heartbeat=0, blocked_connection_timeout=300
        )

    def _connection(self):
        import pika

        return pika.BlockingConnection(self._params())

    @staticmethod
    def _queues(dest: Dest) -> list[str]:
        return [f"{dest.name}.{p}" for p in range(dest.partitions)]

    @staticmethod
    def _persistent():
        import pika

        return pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)

    def _depth(self, channel, dest: Dest) -> int:
        return sum(channel.queue_declare(q, passive=True).method.message_count for q in self._queues(dest))

    # -- destinations ----------------------------------------------------------------------

    def create(self, name: str, partitions: int = 1) -> Dest:
        dest = Dest(name, partitions)
        connection = self._connection()
        channel = connection.channel()
        for queue in self._queues(dest):
            channel.queue_declare(queue, durable=True)
        connection.close()
        return dest

    def delete(self, dest: Dest) -> None:
        connection = self._connection()
        channel = connection.channel()
        for queue in self._queues(dest):
            channel.queue_delete(queue)
        connection.close()

    # -- experiments -----------------------------------------------------------------------

    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        connection = self._connection()
        channel = connection.channel()
        queues = self._queues(dest)
        expected = self._depth(channel, dest) + len(payloads)
        props = self._persistent()
        meter.start()
        for i, value in enumerate(payloads):
            channel.basic_publish("", queues[i % len(queues)], value, props)
            meter.add(1)
        deadline = time.monotonic() + 120
        depth = self._depth(channel, dest)
        while depth < expected and time.monotonic() < deadline:
            connection.sleep(0.002)
            depth = self._depth(channel, dest)
        meter.stop()
        connection.close()
        if depth != expected:
            raise RuntimeError(f"RabbitMQ queued {depth} of {expected} messages")

    def produce_batched(
        self, dest: Dest, payloads: Sequence[bytes], meter: Meter, batch: int = BATCH
    ) -> None:
        publisher = _BatchPublisher(
            self._queues(dest), self._persistent(), dest, iter(batches(payloads, batch)), meter
        )
        publisher.run(self._params())

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        connection = self._connection()
        channel = connection.channel()
        channel.basic_qos(prefetch_count=PREFETCH_MESSAGES)
        state = {"count": 0, "total": 0, "last_tag": 0}

        def on_message(ch, method, _props, body: bytes) -> None:
            if state["count"] >= n:
                return  # not acknowledged: back to the queue when the channel closes
            state["total"] += zlib.crc32(body)
            state["count"] += 1
            state["last_tag"] = method.delivery_tag
            meter.add(1)
            if state["count"] % ACK_EVERY == 0 or state["count"] == n:
                ch.basic_ack(method.delivery_tag, multiple=True)

        meter.start()
        for queue in self._queues(dest):
            channel.basic_consume(queue, on_message, auto_ack=False)
        deadline = time.monotonic() + timeout
        while state["count"] < n and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.2)
        meter.stop()
        if state["last_tag"] and state["count"] % ACK_EVERY:
            channel.basic_ack(state["last_tag"], multiple=True)
        connection.close()
        return state["count"], state["total"]

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        queue = self._queues(dest)[0]
        samples: list[float] = []
        ready = threading.Event()

        def consume() -> None:
            connection = self._connection()
            channel = connection.channel()

            def on_message(_channel, _method, _props, body: bytes) -> None:
                samples.append(latency_of(body, time.monotonic_ns()))

            channel.basic_consume(queue, on_message, auto_ack=True)
            ready.set()
            deadline = time.monotonic() + n / rate + 30
            while len(samples) < n and time.monotonic() < deadline:
                connection.process_data_events(time_limit=0.1)
            connection.close()

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        ready.wait(30)
        connection = self._connection()
        channel = connection.channel()
        props = self._persistent()
        started = time.perf_counter()
        for _ in paced(n, rate):
            channel.basic_publish("", queue, latency_message(time.monotonic_ns()), props)
        sent_rate = n / (time.perf_counter() - started)
        consumer.join(n / rate + 40)
        connection.close()
        return samples, sent_rate


class _BatchPublisher:
    """Publisher confirms on pika's asynchronous connection: one batch in flight, the next one
    published once every message of the last is confirmed (RabbitMQ's batched mode)."""

    def __init__(self, queues: list[str], props, dest: Dest, chunks, meter: Meter) -> None:
        self.queues = queues
        self.props = props
        self.dest = dest
        self.chunks = chunks
        self.meter = meter
        self.outstanding: set[int] = set()
        self.tag = 0
        self.chunk = 0
        self.error: str | None = None
        self.channel: Any = None  # pika's channel and connection (pika has no type information)
        self.connection: Any = None

    def run(self, params) -> None:
        import pika

        self.connection = pika.SelectConnection(
            params,
            on_open_callback=self.on_open,
            on_open_error_callback=self.on_open_error,
            on_close_callback=self.on_close,
        )
        self.connection.ioloop.start()
        if self.error:
            raise RuntimeError(self.error)

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()

    def publish_next(self) -> None:
        try:
            k, chunk = next(self.chunks)
        except StopIteration:
            self.meter.stop()
            self.close()
            return
        queue = self.queues[self.dest.partition_of_batch(k)]
        for value in chunk:
            self.channel.basic_publish("", queue, value, self.props)
            self.tag += 1
            self.outstanding.add(self.tag)
        self.chunk = len(chunk)

    def on_confirm(self, frame) -> None:
        from pika.spec import Basic

        method = frame.method
        if isinstance(method, Basic.Nack):
            self.error = f"RabbitMQ nacked delivery tag {method.delivery_tag}"
            self.close()
            return
        if method.multiple:
            self.outstanding = {t for t in self.outstanding if t > method.delivery_tag}
        else:
            self.outstanding.discard(method.delivery_tag)
        if not self.outstanding:
            self.meter.add(self.chunk)
            self.publish_next()

    def on_confirm_mode(self, _frame) -> None:
        self.meter.start()
        self.publish_next()

    def on_channel(self, channel) -> None:
        self.channel = channel
        channel.confirm_delivery(ack_nack_callback=self.on_confirm, callback=self.on_confirm_mode)

    def on_open(self, connection) -> None:
        connection.channel(on_open_callback=self.on_channel)

    def on_open_error(self, connection, error) -> None:
        self.error = f"cannot connect: {error}"
        connection.ioloop.stop()

    def on_close(self, connection, reason) -> None:
        import pika

        if not isinstance(reason, pika.exceptions.ConnectionClosedByClient):
            self.error = self.error or f"connection closed: {reason}"
        connection.ioloop.stop()
