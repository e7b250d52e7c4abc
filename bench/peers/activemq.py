"""ActiveMQ "Classic" (Debian ``activemq``, on the machine's Java 17) through STOMP with stomp.py.

* Broker: the Debian ActiveMQ jar started directly with ``java -jar .../activemq.jar start
  xbean:file:<our activemq.xml>`` (no init script, no system instance): one STOMP connector
  (NIO) on 127.0.0.1, no OpenWire/JMX/web console, no advisory messages; persistence on KahaDB
  (the paper's setting) with ``journalDiskSyncStrategy="periodic"`` and a 1 s interval: the
  journal is fsynced once a second in the background instead of on every message (async flush).
* A partition is a queue ``<name>.<p>``; messages are sent ``persistent:true``.
* unbatched: one ``SEND`` per message, no receipt asked; the clock stops when the receipt of a
  last ``SEND`` (asked for one) arrives, which ActiveMQ sends after every earlier frame of the
  connection was processed.
* batched: a STOMP transaction per 50 messages (``BEGIN``, 50 ``SEND``, ``COMMIT`` with a
  receipt), JMS's way to group messages (a transacted session); the next batch goes after the
  commit's receipt.
* consume: one ``SUBSCRIBE`` per queue with ``activemq.prefetchSize:1000`` and ``ack:client``,
  acknowledged cumulatively every 100 messages. (The paper used auto-acknowledgement; a consumer
  that stops after ``n`` messages must leave the rest queued, and with ``ack:auto`` whatever
  was already dispatched is gone, so the benchmark acknowledges what it counted. Acknowledging
  every 250 with a prefetch of 1,000 stalled ActiveMQ 5.17 at ~170 msg/s here; every 100 runs
  at the speed of ``ack:auto`` or better.)

Client: stomp.py, the maintained Python STOMP client (ActiveMQ's documentation lists it). The
other choice, OpenWire/AMQP 1.0 from Python, has no maintained pure-Python client of note.
"""

from __future__ import annotations

import shutil
import socket
import threading
import time
import uuid
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
    paced,
    port_open,
    spawn,
    terminate,
    wait_until,
)

HOME = Path("/usr/share/activemq")
JAR = HOME / "bin" / "activemq.jar"
#: Consumers acknowledge cumulatively (``ack:client``) every this many messages per subscription.
ACK_EVERY = 100

CONFIG = """<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="tributary-bench" useJmx="false"
          persistent="true" advisorySupport="false" schedulerSupport="false" dataDirectory="{data}">
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb" journalDiskSyncStrategy="periodic" journalDiskSyncInterval="1000"/>
    </persistenceAdapter>
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="64 gb"/></storeUsage>
        <tempUsage><tempUsage limit="16 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp+nio://127.0.0.1:{port}?transport.closeAsync=false&amp;transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
</beans>
"""


class _Listener:
    """stomp.py listener: routes MESSAGE frames to a callback and signals receipts."""

    def __init__(self) -> None:
        self.on_frame = None
        self.receipts: dict[str, threading.Event] = {}
        self.error: str | None = None

    def expect(self, receipt: str) -> threading.Event:
        event = self.receipts[receipt] = threading.Event()
        return event

    def on_message(self, frame) -> None:
        if self.on_frame is not None:
            self.on_frame(frame)

    def on_receipt(self, frame) -> None:
        event = self.receipts.pop(frame.headers.get("receipt-id"), None)
        if event is not None:
            event.set()

    def on_error(self, frame) -> None:
        self.error = f"{frame.headers.get('message')}: {frame.body[:300]!r}"
        for event in self.receipts.values():
            event.set()


class ActiveMQ(Peer):
    name = "activemq"
    title = "ActiveMQ"
    debian_packages = ("activemq",)
    pypi_packages = ("stomp.py",)
    binaries = (str(JAR), "java")
    modules = ("stomp",)
    client_note = (
        "stomp.py: the maintained Python STOMP client (listed by ActiveMQ); STOMP is the "
        "protocol ActiveMQ offers Python"
    )
    persistence_note = (
        "KahaDB (the paper's store), journalDiskSyncStrategy=periodic, 1 s: journal fsynced in the "
        "background each second; persistent:true messages"
    )
    unbatched_note = "SEND persistent, no receipt; barrier: receipt of a last SEND"
    batch_note = "STOMP transaction of 50 SEND, COMMIT with receipt"
    consume_note = "SUBSCRIBE per queue, activemq.prefetchSize:1000, ack:client every 100"

    def versions(self) -> dict[str, str]:
        result = super().versions()
        java = command_output(["java", "-version"]).splitlines()
        result["java"] = java[0] if java else "?"
        return result

    def start(self, data_dir: Path) -> Handle:
        data_dir.mkdir(parents=True, exist_ok=True)
        conf = data_dir / "conf"
        conf.mkdir(exist_ok=True)
        port = free_port()
        (conf / "activemq.xml").write_text(
            CONFIG.replace("{data}", str(data_dir / "data")).replace("{port}", str(port))
        )
        log4j = Path("/etc/activemq/instances-available/main/log4j2.properties")
        if log4j.exists():
            shutil.copy(log4j, conf / "log4j2.properties")
        log = data_dir / "activemq.log"
        cmd = [
            "java",
            "-Xms512m",
            "-Xmx1g",
            "-Djava.awt.headless=true",
            "--add-opens",
            "java.base/java.lang=ALL-UNNAMED",
            f"-Dactivemq.classpath={conf}",
            f"-Dactivemq.home={HOME}",
            f"-Dactivemq.base={data_dir}",
            f"-Dactivemq.conf={conf}",
            f"-Dactivemq.data={data_dir / 'data'}",
            "-jar",
            str(JAR),
            "start",
            f"xbean:file:{conf / 'activemq.xml'}",
        ]
        process = spawn(cmd, log, cwd=data_dir)
        self.handle = Handle({"activemq (java)": process}, {"stomp": port}, data_dir, log)
        self.port = port

        def ready() -> bool:
            if not port_open(port):
                return False
            connection, _ = self._connect()
            connection.disconnect()
            return True

        try:
            wait_until(ready, process, 120, "activemq", log)
        except PeerUnavailable:
            self.stop()
            raise
        return self.handle

    def stop(self) -> None:
        if self.handle is not None:
            terminate(self.handle.processes["activemq (java)"], timeout=60)
            self.handle = None

    # -- helpers ---------------------------------------------------------------------------

    def _connect(self):
        import stomp

        connection = stomp.Connection(
            [("127.0.0.1", self.port)], auto_decode=False, heartbeats=(0, 0), timeout=10
        )
        listener = _Listener()
        connection.set_listener("bench", listener)
        connection.connect(wait=True)
        # stomp.py leaves Nagle's algorithm on: small frames (COMMIT, a receipt's SEND) would wait
        # for the peer's delayed ACK (~40 ms). Every other client here sets TCP_NODELAY.
        connection.transport.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, listener

    @staticmethod
    def _queues(dest: Dest) -> list[str]:
        return [f"/queue/{dest.name}.{p}" for p in range(dest.partitions)]

    @staticmethod
    def _wait(listener: _Listener, event: threading.Event, what: str, timeout: float = 300) -> None:
        if not event.wait(timeout):
            raise RuntimeError(f"ActiveMQ: no receipt for {what} within {timeout:.0f}s")
        if listener.error:
            raise RuntimeError(f"ActiveMQ error: {listener.error}")

    # -- destinations ----------------------------------------------------------------------

    def create(self, name: str, partitions: int = 1) -> Dest:
        return Dest(name.replace(":", "-"), partitions)  # queues appear with their first message

    def delete(self, dest: Dest) -> None:
        """Queues cannot be deleted over STOMP; they are drained by the experiments."""

    # -- experiments -----------------------------------------------------------------------

    def produce_unbatched(self, dest: Dest, payloads: Sequence[bytes], meter: Meter) -> None:
        connection, listener = self._connect()
        queues = self._queues(dest)
        headers = {"persistent": "true"}
        receipt = f"end-{uuid.uuid4().hex}"
        done = listener.expect(receipt)
        last = len(payloads) - 1
        meter.start()
        for i, value in enumerate(payloads):
            if i == last:
                connection.send(queues[i % len(queues)], value, headers={**headers, "receipt": receipt})
            else:
                connection.send(queues[i % len(queues)], value, headers=headers)
            meter.add(1)
        self._wait(listener, done, "the last message")
        meter.stop()
        connection.disconnect()

    def produce_batched(
        self, dest: Dest, payloads: Sequence[bytes], meter: Meter, batch: int = BATCH
    ) -> None:
        connection, listener = self._connect()
        queues = self._queues(dest)
        meter.start()
        for k, chunk in batches(payloads, batch):
            queue = queues[dest.partition_of_batch(k)]
            transaction = connection.begin()
            for value in chunk:
                connection.send(queue, value, headers={"persistent": "true", "transaction": transaction})
            receipt = f"commit-{k}"
            done = listener.expect(receipt)
            connection.commit(transaction, headers={"receipt": receipt})
            self._wait(listener, done, f"commit {k}")
            meter.add(len(chunk))
        meter.stop()
        connection.disconnect()

    def consume_all(self, dest: Dest, n: int, meter: Meter, timeout: float = 600.0) -> tuple[int, int]:
        state = {"count": 0, "total": 0}
        unacked: dict[str, str] = {}  # subscription -> message-id of its last counted, unacknowledged message
        since_ack: dict[str, int] = {}
        finished = threading.Event()
        connection, listener = self._connect()

        def on_frame(frame) -> None:
            # Runs on stomp.py's receiver thread, one frame at a time, in delivery order.
            if state["count"] >= n:
                return  # never acknowledged: redelivered to the next consumer
            subscription, message_id = frame.headers["subscription"], frame.headers["message-id"]
            state["total"] += zlib.crc32(frame.body)
            state["count"] += 1
            meter.add(1)
            since_ack[subscription] = since_ack.get(subscription, 0) + 1
            if since_ack[subscription] >= ACK_EVERY:
                connection.ack(message_id, subscription)  # ack:client is cumulative per subscription
                since_ack[subscription] = 0
                unacked.pop(subscription, None)
            else:
                unacked[subscription] = message_id
            if state["count"] >= n:
                finished.set()

        listener.on_frame = on_frame
        meter.start()
        subscriptions = []
        for p, queue in enumerate(self._queues(dest)):
            subscriptions.append(f"bench-{p}")
            connection.subscribe(
                queue,
                id=subscriptions[-1],
                ack="client",
                headers={"activemq.prefetchSize": str(PREFETCH_MESSAGES)},
            )
        finished.wait(timeout)
        meter.stop()
        for subscription, message_id in list(unacked.items()):
            connection.ack(message_id, subscription)
        for subscription in subscriptions:
            connection.unsubscribe(subscription)
        receipt = f"done-{uuid.uuid4().hex}"
        done = listener.expect(receipt)
        connection.disconnect(receipt=receipt)
        done.wait(60)
        return state["count"], state["total"]

    def latency(self, dest: Dest, rate: float, n: int) -> tuple[list[float], float]:
        samples: list[float] = []
        finished = threading.Event()

        def on_frame(frame) -> None:
            samples.append(latency_of(frame.body, time.monotonic_ns()))
            if len(samples) >= n:
                finished.set()

        queue = self._queues(dest)[0]
        consumer, listener = self._connect()
        listener.on_frame = on_frame
        receipt = "subscribed"
        subscribed = listener.expect(receipt)
        consumer.subscribe(
            queue,
            id="latency",
            ack="auto",
            headers={"activemq.prefetchSize": str(PREFETCH_MESSAGES), "receipt": receipt},
        )
        subscribed.wait(30)
        producer, _ = self._connect()
        started = time.perf_counter()
        for _ in paced(n, rate):
            producer.send(queue, latency_message(time.monotonic_ns()), headers={"persistent": "true"})
        sent_rate = n / (time.perf_counter() - started)
        finished.wait(30)
        producer.disconnect()
        consumer.disconnect()
        return samples, sent_rate
