"""Producer-side auditing (the paper's section 4): count what was sent per topic and time window,
and publish the counts as monitoring events to a separate audit topic.

    with AuditingProducer(Producer(servers=...), producer_id="web-17") as producer:
        producer.send("activity", value, key=key)        # counted once acknowledged

Every record's timestamp is set here (now, unless given), so the producer and the consumer side
agree on the window a record belongs to: ``floor(timestamp / window_ms) * window_ms``. A record
is counted when the cluster acknowledges it -- a send that fails was never published, and the
application already knows about it (its future failed); ``failed`` counts them separately.

An audit event is JSON on the audit topic, keyed by the producer id::

    {"producer": "web-17", "topic": "activity", "window_start": 1700000040000,
     "window_ms": 60000, "count": 1234, "failed": 0, "sent_at": 1700000101234}

``count`` is *cumulative* for ``(producer, topic, window)``: events are re-published as counts
grow (periodically, on ``flush`` and on ``close``), and the audit job keeps the largest count of
each key -- so a duplicated or re-sent audit event never changes the result.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass

from gateway.client import Producer

AUDIT_TOPIC = "tributary-audit"
DEFAULT_WINDOW_MS = 60_000
DEFAULT_PUBLISH_INTERVAL_MS = 60_000


@dataclass(frozen=True)
class AuditEvent:
    """One monitoring event: how many records ``producer`` published to ``topic`` in a window."""

    producer: str
    topic: str
    window_start: int
    window_ms: int
    count: int
    failed: int
    sent_at: int

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> AuditEvent:
        return cls(**json.loads(data))


def window_start(timestamp_ms: int, window_ms: int) -> int:
    return timestamp_ms - timestamp_ms % window_ms


class AuditCounter:
    """Acknowledged and failed records per ``(topic, window_start)``; thread-safe.

    Delivery callbacks run on the producer's I/O thread while the application thread sends and
    snapshots, hence the lock. ``in_flight`` counts records sent and not yet settled: the SDK's
    ``flush()`` can return a moment before the delivery callbacks of the last batch have run, so
    counts are read only once :meth:`wait_settled` says every callback has.
    """

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS) -> None:
        if window_ms <= 0:
            raise ValueError("window_ms must be positive")
        self.window_ms = window_ms
        self._settled = threading.Condition()
        self._in_flight = 0
        self._acked: dict[tuple[str, int], int] = {}
        self._failed: dict[tuple[str, int], int] = {}

    def sent(self) -> None:
        with self._settled:
            self._in_flight += 1

    def record(self, topic: str, timestamp_ms: int, *, ok: bool) -> None:
        """Count one settled record (acknowledged when ``ok``)."""
        key = (topic, window_start(timestamp_ms, self.window_ms))
        with self._settled:
            counts = self._acked if ok else self._failed
            counts[key] = counts.get(key, 0) + 1
            self._in_flight -= 1
            self._settled.notify_all()

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until every record sent so far has been counted; False on timeout."""
        with self._settled:
            return self._settled.wait_for(lambda: self._in_flight <= 0, timeout)

    def events(self, producer: str, now_ms: int) -> list[AuditEvent]:
        """The cumulative counts so far, one event per ``(topic, window)``."""
        with self._settled:
            keys = sorted(set(self._acked) | set(self._failed))
            return [
                AuditEvent(
                    producer,
                    topic,
                    start,
                    self.window_ms,
                    self._acked.get((topic, start), 0),
                    self._failed.get((topic, start), 0),
                    now_ms,
                )
                for topic, start in keys
            ]


def default_producer_id() -> str:
    """The paper's "server name", made unique per process so two producers never share counts."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class AuditingProducer:
    """A ``Producer`` that counts what it publishes per topic and window and publishes audit events.

    The wrapped producer is used for the audit events too; ``close()`` closes it.
    """

    def __init__(
        self,
        producer: Producer,
        *,
        producer_id: str | None = None,
        audit_topic: str = AUDIT_TOPIC,
        window_ms: int = DEFAULT_WINDOW_MS,
        publish_interval_ms: int = DEFAULT_PUBLISH_INTERVAL_MS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.producer = producer
        self.producer_id = producer_id or default_producer_id()
        self.audit_topic = audit_topic
        self.counter = AuditCounter(window_ms)
        self.publish_interval_ms = publish_interval_ms
        self._clock = clock
        self._last_publish_ms = self._now_ms()

    def __enter__(self) -> AuditingProducer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    def send(
        self,
        topic: str,
        value=None,
        key=None,
        headers=None,
        partition: int | None = None,
        timestamp: int | None = None,
    ):
        """``Producer.send`` with the record counted in its window once it is acknowledged."""
        timestamp = self._now_ms() if timestamp is None else timestamp

        def settle(error, _metadata) -> None:
            self.counter.record(topic, timestamp, ok=error is None)

        self.counter.sent()
        try:
            future = self.producer.send(
                topic,
                value,
                key=key,
                headers=headers,
                partition=partition,
                timestamp=timestamp,
                on_delivery=settle,
            )
        except BaseException:
            self.counter.record(topic, timestamp, ok=False)  # refused up front: never published
            raise
        if self._now_ms() - self._last_publish_ms >= self.publish_interval_ms:
            self.publish_audit()
        return future

    def publish_audit(self) -> int:
        """Send the current counts as audit events (not waiting for them); returns how many."""
        now = self._now_ms()
        events = self.counter.events(self.producer_id, now)
        for event in events:
            self.producer.send(self.audit_topic, event.to_json(), key=self.producer_id.encode())
        self._last_publish_ms = now
        return len(events)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record to settle, then publish (and deliver) the final counts so far."""
        self.producer.flush(timeout)
        if not self.counter.wait_settled(timeout if timeout is not None else 30.0):
            raise TimeoutError("delivery callbacks did not all run after flush")
        self.publish_audit()
        self.producer.flush(timeout)

    def close(self, timeout: float | None = None) -> None:
        self.flush(timeout)
        self.producer.close(timeout)
