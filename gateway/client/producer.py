"""The producer: ``Producer`` (threads) and ``AsyncProducer`` (asyncio) over one shared core.

Usage, kafka-python style::

    with Producer(servers="127.0.0.1:9092", linger_ms=5, compression="zstd") as producer:
        future = producer.send("activity", b'{"page": "/"}', key=b"user-1")
        metadata = future.get(timeout=10)      # RecordMetadata(topic, partition, offset, timestamp)

and aiokafka style::

    async with AsyncProducer(servers=...) as producer:
        metadata = await producer.send_and_wait("activity", b"...", key=b"user-1")

What happens to a record: it is serialized and partitioned in the caller's thread (explicit
``partition``; else Kafka's murmur2 of the key modulo the partition count, so keys land where a
Kafka client would put them; else a sticky partition per batch for null keys), and it is
appended to its partition's RecordBatch v2 builder in the accumulator; a batch reserves buffer
memory for the bytes it holds, in steps (1 KiB, doubling up to ``batch_size``), and a record
that opens a batch waits up to ``max_block_ms`` for its first step when ``buffer_memory`` is
full (Kafka reserves ``batch_size`` per batch at once; see ``accumulator.py`` for why not
here). The sender routine on the I/O loop ships batches once full or after ``linger_ms``,
compressed client-side, and retries retriable failures with backoff for up to
``delivery_timeout_ms``, keeping per-partition order.

Settings (Kafka's producer configs, Python-cased; defaults are Kafka's):

=====================  =========  =========================================================
``acks``               ``"all"``  0 (handed over; no retries), 1 (leader wrote it), "all"/-1
``compression``        "none"     none, gzip, snappy, lz4, zstd (``compression_type`` alias)
``batch_size``         16384      bytes per partition batch before it is sent
``linger_ms``          5          wait this long for a batch to fill
``buffer_memory``      32 MiB     bytes the batches waiting to be sent hold (at most ``batch_size`` each)
``max_block_ms``       60000      how long ``send`` may block (metadata, full buffer)
``max_request_size``   1 MiB      largest record, and the most bytes in one request
``retries``            2**31-1    retries of a retriable failure (bounded by the timeout)
``retry_backoff_ms``   100        first retry wait; doubles up to ``retry_backoff_max_ms``
``delivery_timeout_ms`` 120000    upper bound from send() to success or failure
``request_timeout_ms`` 30000      how long one request may take
``max_in_flight``      5          requests outstanding at once; per partition too when
                                  idempotent over an ordered transport, else one per
                                  partition (acks=0: pipelined, no retries)
``data_path``          "auto"     "auto": produce over the gateway's raw data listener when
                                  it offers one (frames on TCP, ``services/dataport``), else
                                  gRPC; "grpc": always gRPC (``transport`` says how)
``enable_idempotence`` True       number batches so a retry never writes twice (needs
                                  ``acks="all"``; unset with acks 0/1 it is off, set True
                                  with them it is an error, as in Kafka)
=====================  =========  =========================================================

Idempotence (Kafka's default since 3.0): the producer gets a producer id from the cluster and
numbers its batches per partition; a leader answers a retried batch it already wrote with the
offsets it got the first time, so retries after a lost answer, a gateway restart or a leader
failover write nothing twice (see ``transaction_manager.py``). It also lets several requests of
one partition be in flight at once (up to ``max_in_flight``, on the raw data path or the
ProduceStream, not unary calls), ordered by sequence even when some fail (see ``sender.py``):
complete batches go behind a request in flight, a batch still filling waits for its answer;
a producer without idempotence at acks 1/all sends one request per partition at a time.
"""

from __future__ import annotations

import asyncio
import atexit
import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.client.accumulator import RECORD_OVERHEAD, BufferExhausted, BufferPool, RecordAccumulator
from gateway.client.client import GatewayClient, client_tls
from gateway.client.credentials import TokenSource, client_token_source
from gateway.client.dataport import RawTransport, parse_data_path
from gateway.client.errors import (
    IllegalStateError,
    RecordTooLargeError,
    RequestTimedOutError,
    TransactionAbortedError,
    UnknownTopicOrPartitionError,
)
from gateway.client.futures import FutureRecordMetadata, wait_for_result
from gateway.client.io_thread import IOThread
from gateway.client.retry import RetryPolicy
from gateway.client.sealed import RecordRequestSealer
from gateway.client.sender import Sender
from gateway.client.serialization import Serializer, headers_size, normalize_headers, serialize
from gateway.client.structs import RecordMetadata, TopicPartition
from gateway.client.telemetry import ProducerTelemetry
from gateway.client.transaction_manager import TransactionManager, TxnState
from gateway.client.transport import StreamTransport, UnaryTransport
from services.acks import Acks
from services.clock import SYSTEM_CLOCK, Clock
from services.partitioner import StickyPartitioner, partition_for_key
from services.records import Compression
from services.records.record import speedups as _speedups
from services.tls import ClientTls

log = logging.getLogger(__name__)

#: The system clock in ms (C; None without the C module or with a stale build).
_system_time_ms: Callable[[], int] | None = getattr(_speedups, "time_ms", None)


@dataclass
class ProducerConfig:
    """Every producer setting; see the module docstring for what each means."""

    servers: str | Sequence[str] | None = None
    client_id: str = "tributary-producer"
    acks: int | str = "all"
    compression: str = "none"
    batch_size: int = 16384
    linger_ms: int = 5
    buffer_memory: int = 32 * 1024 * 1024
    max_block_ms: int = 60_000
    max_request_size: int = 1024 * 1024
    retries: int = 2**31 - 1
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    delivery_timeout_ms: int = 120_000
    request_timeout_ms: int = 30_000
    max_in_flight: int = 5
    metadata_max_age_ms: int = 300_000
    key_serializer: Serializer | None = None
    value_serializer: Serializer | None = None
    #: "stream" pipelines requests on ProduceStream; "unary" makes one Produce call per request.
    transport: str = "stream"
    #: "auto": the gateway's raw data listener when it offers one (``gateway/client/dataport.py``),
    #: else gRPC as ``transport`` says; "grpc": gRPC always.
    data_path: str = "auto"
    #: A ProduceStream (or raw data connection) idle this long is ended before the next request
    #: opens a new one (Kafka's producer default, a minute under the gateway's 10 min); 0 = never.
    connections_max_idle_ms: int = 540_000
    #: Idempotent produce; None = on unless acks is 0 or 1 (Kafka's rule).
    enable_idempotence: bool | None = None
    #: Makes the producer transactional (implies idempotence); stable across restarts of the
    #: same application instance, so a restarted instance fences its predecessor.
    transactional_id: str | None = None
    #: A transaction open longer than this is aborted by the coordinator (Kafka's default).
    transaction_timeout_ms: int = 60_000
    #: "PLAINTEXT", "SSL" or "SASL_SSL" (Kafka's security.protocol): TLS to the gateways, gRPC
    #: and data; SASL_SSL also presents a bearer token (``sasl_oauth_token_provider``).
    security_protocol: str = "PLAINTEXT"
    #: CA bundle (PEM) the gateways' certificates must chain to; None: the system's roots.
    ssl_cafile: str | None = None
    #: This client's certificate chain and key (PEM), for gateways that require mutual TLS.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: "OAUTHBEARER" with SASL_SSL (the only mechanism so far).
    sasl_mechanism: str | None = None
    #: The bearer token: a string, a callable returning one, or an object with ``token()``
    #: (``gateway/client/credentials.py``).
    sasl_oauth_token_provider: Any = None

    @classmethod
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ProducerConfig:
        """Build from keyword arguments, accepting Kafka's longer names as aliases."""
        aliases = {
            "bootstrap_servers": "servers",
            "compression_type": "compression",
            "max_in_flight_requests_per_connection": "max_in_flight",
        }
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key, value in kwargs.items():
            name = aliases.get(key, key)
            if name not in names:
                raise TypeError(f"unknown producer setting {key!r}")
            values[name] = value
        config = cls(**values)
        config.validate()
        return config

    @property
    def idempotent(self) -> bool:
        """Whether batches are numbered: explicitly, by a transactional id, or by default when
        the other settings allow it (acks=all, retries, at most 5 in flight: Kafka's rule, which
        turns the default off rather than refusing settings the user chose)."""
        if self.transactional_id is not None:
            return True
        if self.enable_idempotence is None:
            return Acks.parse(self.acks) is Acks.ALL and self.retries > 0 and self.max_in_flight <= 5
        return self.enable_idempotence

    def validate(self) -> None:
        """Refuse settings that contradict each other or that could not be honoured."""
        self._validate_idempotence()
        self.tls()
        self.token_source()
        Compression.from_name(self.compression)
        if self.transport not in ("stream", "unary"):
            raise ValueError("transport must be 'stream' or 'unary'")
        parse_data_path(self.data_path)
        for name in (
            "batch_size",
            "buffer_memory",
            "max_request_size",
            "max_in_flight",
            "delivery_timeout_ms",
            "request_timeout_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        for name in ("linger_ms", "max_block_ms", "retries", "retry_backoff_ms", "connections_max_idle_ms"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.delivery_timeout_ms < self.linger_ms + self.request_timeout_ms:
            # Kafka's rule: one request may take request_timeout_ms after lingering, so a shorter
            # delivery timeout could not be kept (a record would fail later than it says).
            raise ValueError(
                f"delivery_timeout_ms ({self.delivery_timeout_ms}) must be at least linger_ms + "
                f"request_timeout_ms ({self.linger_ms} + {self.request_timeout_ms})"
            )

    def tls(self) -> ClientTls | None:
        """The TLS the security settings ask for (ValueError when they do not add up)."""
        return client_tls(self.security_protocol, self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)

    def token_source(self) -> TokenSource | None:
        """The bearer token the SASL settings ask for (ValueError when they do not add up)."""
        return client_token_source(
            self.security_protocol, self.sasl_mechanism, self.sasl_oauth_token_provider
        )

    def _validate_idempotence(self) -> None:
        acks = Acks.parse(self.acks)
        if self.enable_idempotence and acks is not Acks.ALL:
            raise ValueError(
                f"enable_idempotence=True needs acks='all' (got acks={self.acks!r}): an idempotent "
                "producer must know its batches are committed"
            )
        if (self.enable_idempotence or self.transactional_id is not None) and self.max_in_flight > 5:
            raise ValueError(f"max_in_flight must be at most 5 with idempotence (got {self.max_in_flight})")
        if self.enable_idempotence and self.retries == 0:
            raise ValueError("enable_idempotence=True needs retries > 0")
        if self.transactional_id is None:
            return
        if not self.transactional_id or self.enable_idempotence is False:
            raise ValueError("a transactional producer needs a non-empty transactional_id and idempotence")
        if acks is not Acks.ALL:
            raise ValueError(f"a transactional producer needs acks='all' (got acks={self.acks!r})")
        if self.transaction_timeout_ms <= 0:
            raise ValueError("transaction_timeout_ms must be positive")


class ProducerCore:
    """Everything both producers share. Runs on one event loop; ``prepare``/``append`` are safe
    from any thread."""

    def __init__(self, config: ProducerConfig, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.config = config
        self.clock = clock
        self.client = GatewayClient(
            config.servers,
            request_timeout_ms=config.request_timeout_ms,
            metadata_max_age_ms=config.metadata_max_age_ms,
            retry_backoff_ms=config.retry_backoff_ms,
            clock=clock,
            client_id=config.client_id,
            tls=config.tls(),
            token_source=config.token_source(),
        )
        self.pool = BufferPool(config.buffer_memory)
        self.accumulator = RecordAccumulator(
            batch_size=config.batch_size,
            linger_ms=config.linger_ms,
            compression=Compression.from_name(config.compression),
            pool=self.pool,
            retried_alone=config.idempotent,
            # A batch one record fills is sealed in its raw request frame as it is appended
            # (sealed.py): not when batches are numbered (idempotence) as they are sent.
            sealer=(
                RecordRequestSealer(int(Acks.parse(config.acks)), config.request_timeout_ms)
                if config.data_path == "auto" and not config.idempotent
                else None
            ),
        )
        self.transaction_manager = (
            TransactionManager(
                self.client,
                transactional_id=config.transactional_id,
                transaction_timeout_ms=config.transaction_timeout_ms,
            )
            if config.idempotent
            else None
        )
        #: ``send`` checks the transaction state first (a closed producer is refused either way).
        self.checks_state = config.transactional_id is not None
        self.sticky = StickyPartitioner()
        #: The clock in ms, read once a record: the system clock straight from the C module
        #: (``time_ns() // 1_000_000`` in Python was ~5% of ``send``: a big integer divided).
        self._time_ms = (
            _system_time_ms if clock is SYSTEM_CLOCK and _system_time_ms is not None else clock.time_ms
        )
        #: The metadata cache's partition counts (read-only here; one dict lookup a record).
        self.partition_counts = self.client.metadata.partition_counts
        #: Spans and metrics of the sends, on the application's OpenTelemetry SDK (None: off).
        self.telemetry = ProducerTelemetry.create(config.client_id, self.client.addresses)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sender: Sender | None = None
        self._sender_task: asyncio.Task | None = None
        self._wakeup_pending = False
        self._sendable_pending = False
        #: Runs a function on the appending thread while the I/O loop waits for I/O (the thread
        #: producer's ``IOThread.call_if_idle``): sendable records are then written there, not
        #: handed to the loop thread. None: always hand over.
        self.run_if_idle: Callable[..., bool] | None = None
        self._refreshing: set[str] = set()
        self._background: set[asyncio.Task] = set()

    # -- lifecycle (on the loop) -----------------------------------------------------------

    async def start(self) -> None:
        if self.loop is not None:
            return
        self.loop = asyncio.get_running_loop()
        # acks=0: the client learns of no failure worth retrying (Kafka ignores retries there too).
        retries = 0 if Acks.parse(self.config.acks) is Acks.NONE else self.config.retries
        policy = RetryPolicy(
            retries=retries,
            retry_backoff_ms=self.config.retry_backoff_ms,
            retry_backoff_max_ms=self.config.retry_backoff_max_ms,
            delivery_timeout_ms=self.config.delivery_timeout_ms,
        )
        transport: StreamTransport | UnaryTransport | RawTransport = (
            StreamTransport(self.client, max_idle_s=self.config.connections_max_idle_ms / 1000.0 or None)
            if self.config.transport == "stream"
            else UnaryTransport(self.client)
        )
        if self.config.data_path == "auto":
            transport = RawTransport(
                self.client,
                fallback=transport,
                max_idle_s=self.config.connections_max_idle_ms / 1000.0 or None,
            )
        self.sender = Sender(
            client=self.client,
            accumulator=self.accumulator,
            policy=policy,
            transport=transport,
            acks=self.config.acks,
            max_in_flight=self.config.max_in_flight,
            max_request_size=self.config.max_request_size,
            request_timeout_ms=self.config.request_timeout_ms,
            transaction_manager=self.transaction_manager,
        )
        self._sender_task = self.loop.create_task(self.sender.run(), name="tributary-sender")

    async def close(self, timeout_s: float | None) -> None:
        """Send what is queued (up to ``timeout_s``), then fail the rest and release everything."""
        self.accumulator.close()
        if self.sender is None or self._sender_task is None or self.loop is None:  # never started
            await self.client.close()
            return
        self.sender.stop()
        deadline = None if timeout_s is None else self.loop.time() + timeout_s
        done, _ = await asyncio.wait({self._sender_task}, timeout=timeout_s)
        if not done:
            log.warning("producer closing with unsent records after %.1fs; failing them", timeout_s)
            await self.sender.abort(IllegalStateError("the producer was closed before the record was sent"))
            await self._sender_task
        # What is left of the caller's timeout bounds the wait for the gateway to read the rest.
        close_s = self.config.request_timeout_ms / 1000.0
        if deadline is not None:
            close_s = max(0.0, min(close_s, deadline - self.loop.time()))
        await self.sender.transport.close(close_s)
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self.client.close()

    # -- sending (any thread) --------------------------------------------------------------
    #
    # NOTE: the per-record path (``Producer.send`` / ``AsyncProducer.send``: ``prepare``, then
    # ``append``) is the SDK's hot loop: at 400k records/s it has ~2.5 us a record, the sender's
    # share included. So it makes no per-record TopicPartition, takes one lock (the
    # accumulator's; buffer memory is reserved per batch), reads the clock once, and checks the
    # metadata's age only when a record opens a batch. bench/sdk_send.py measures it.

    def prepare(self, value, key, headers, timestamp: int | None) -> tuple:
        """Serialize and size one record: ``(key, value, headers, timestamp, size, now_ms)``.

        Raises RecordTooLargeError / TypeError up front (nothing is queued or reserved yet).
        """
        value_serializer = self.config.value_serializer
        if value is not None and (value_serializer is not None or type(value) is not bytes):
            value = serialize(value, value_serializer, "value")
        size = RECORD_OVERHEAD if value is None else RECORD_OVERHEAD + len(value)
        if key is not None:
            key = serialize(key, self.config.key_serializer, "key")
            if key is not None:
                size += len(key)
        if headers:
            headers = normalize_headers(headers)
            size += headers_size(headers)
        else:
            headers = ()
        if size > self.config.max_request_size:
            raise RecordTooLargeError(
                f"the record is {size} bytes when serialized, larger than max_request_size "
                f"({self.config.max_request_size})"
            )
        now_ms = self._time_ms()
        return key, value, headers, now_ms if timestamp is None else timestamp, size, now_ms

    def cached_partition_count(self, topic: str, partition: int | None) -> int | None:
        """The cached partition count when it can place the record, else None (fetch it first:
        the topic is unknown, or ``partition`` is past the count)."""
        count = self.partition_counts.get(topic)
        if count is not None and partition is not None and isinstance(partition, int) and partition >= count:
            return None
        return count

    async def fetch_partition_count(self, topic: str) -> int:
        """Fetch the topic's metadata now (waiting up to ``max_block_ms`` for an unknown topic)."""
        self.client.metadata.mark_stale(topic)
        description = await self.client.ensure_topic(topic, max_wait_ms=self.config.max_block_ms)
        return len(description.partitions)

    def append(
        self,
        topic: str,
        partition: int | None,
        count: int,
        prepared: tuple,
        reserved: int = 0,
    ) -> FutureRecordMetadata:
        """Place a ``prepare``d record on a partition and queue it; wakes the sender when it matters.

        The partition: ``partition`` when given, else murmur2(key) % ``count``, else the sticky
        partition -- and when the sticky partition's batch is full the record moves to the next
        sticky partition instead of opening a new batch there (KIP-480). Raises
        ``BufferExhausted`` when a new batch needs buffer memory the pool has not got: the
        caller waits for it and calls again with it as ``reserved`` (see
        ``RecordAccumulator.append``), as often as it is asked to.
        """
        key, value, headers, timestamp, size, now_ms = prepared
        append = self.accumulator.append
        if partition is None and key is None:  # the common case first: the sticky partition
            sticky = self.sticky
            chosen = sticky.partition(topic, count)
            future, full, new_batch = append(
                topic, chosen, timestamp, None, value, headers, size, now_ms, True, reserved
            )
            if future is None:  # the sticky partition's batch is full: move on, then open one
                sticky.on_new_batch(topic, count, chosen)
                chosen = sticky.partition(topic, count)
                # (``reserved`` went back to the pool with the abort: this may ask for it again.)
                future, full, new_batch = append(
                    topic, chosen, timestamp, None, value, headers, size, now_ms, False, 0
                )
        else:
            if partition is None:
                partition = partition_for_key(bytes(key), count)
            elif not isinstance(partition, int) or partition < 0:
                raise ValueError(f"partition must be a non-negative int, not {partition!r}")
            elif partition >= count:
                raise UnknownTopicOrPartitionError(
                    f"partition {partition} of topic {topic!r} does not exist ({count} partitions)"
                )
            future, full, new_batch = append(
                topic, partition, timestamp, key, value, headers, size, now_ms, False, reserved
            )
        if full:
            if not self.accumulator.sender_looks_by(now_ms):
                self.wakeup_sender(sendable=True)
        elif new_batch and not self.accumulator.sender_looks_by(now_ms + self.accumulator.linger_ms):
            self.wakeup_sender(sendable=self.accumulator.linger_ms == 0)
        if new_batch:
            self._refresh_if_stale(topic, now_ms)
        return future  # type: ignore[return-value]

    def _refresh_if_stale(self, topic: str, now_ms: int) -> None:
        """Refresh the topic's metadata in the background when the cached entry is old (checked
        as records open batches: often enough, and off the per-record path)."""
        if self.client.metadata.is_stale(topic, now_ms):
            self._schedule(self._refresh_in_background, topic)

    def append_batch(self, topic: str, partition: int, data: bytes) -> FutureRecordMetadata:
        """Queue pre-encoded batch bytes (already reserved) as one sealed batch."""
        result = self.accumulator.append_batch(TopicPartition(topic, partition), data, self.clock.time_ms())
        self.wakeup_sender()
        return FutureRecordMetadata(result, 0, -1)

    def metrics(self) -> dict[str, float]:
        """The sender's counters and the gateways' throttling (on the loop thread)."""
        counters: dict[str, float] = dict(self.sender.metrics) if self.sender is not None else {}
        counters.update(self.client.produce_throttles.metrics())
        return counters

    def wakeup_sender(self, *, sendable: bool = False) -> None:
        """Wake the sender routine from any thread; at most one wakeup is in the loop's queue.

        ``sendable``: a record is sendable now; woken from another thread, the sender writes
        it in the wakeup's own loop turn (``Sender.wakeup_to_send``). A flag lost to a race
        with the loop thread only makes that wakeup a plain one."""
        if self.loop is None:
            return
        if sendable and asyncio._get_running_loop() is not self.loop:
            run_if_idle = self.run_if_idle
            if (
                run_if_idle is not None
                and not self._wakeup_pending
                and self.sender is not None
                and run_if_idle(self.sender.send_here)
            ):
                return  # written here, on this thread, while the loop waited for I/O
            self._sendable_pending = True
        if self._wakeup_pending:
            return
        self._wakeup_pending = True
        self._schedule(self._do_wakeup)

    def _do_wakeup(self) -> None:
        self._wakeup_pending = False
        sendable, self._sendable_pending = self._sendable_pending, False
        if self.sender is not None:
            if sendable:
                self.sender.wakeup_to_send()
            else:
                self.sender.wakeup()

    def _schedule(self, fn: Callable, *args) -> None:
        if self.loop is None or self.loop.is_closed():
            return
        if asyncio._get_running_loop() is self.loop:
            fn(*args)
        else:
            self.loop.call_soon_threadsafe(fn, *args)

    def _refresh_in_background(self, topic: str) -> None:
        if topic in self._refreshing:
            return
        self._refreshing.add(topic)

        async def refresh() -> None:
            try:
                await self.client.refresh_metadata([topic])
            except Exception as exc:  # noqa: BLE001 -- the cached entry stays usable
                log.debug("background metadata refresh of %s failed: %s", topic, exc)
            finally:
                self._refreshing.discard(topic)

        assert self.loop is not None, "scheduled once started"
        task = self.loop.create_task(refresh())
        self._background.add(task)  # a task nobody references may be collected before it ends
        task.add_done_callback(self._background.discard)

    def ensure_open(self) -> None:
        if self.accumulator.closed:
            raise IllegalStateError("cannot send after the producer is closed")
        manager = self.transaction_manager
        if manager is not None and manager.transactional:
            manager.ensure_state(TxnState.IN_TRANSACTION)

    # -- transactions (on the loop) --------------------------------------------------------

    def _manager(self) -> TransactionManager:
        manager = self.transaction_manager
        if manager is None or not manager.transactional:
            raise IllegalStateError("transactions need a producer created with a transactional_id")
        return manager

    async def init_transactions(self) -> None:
        await self._manager().init_transactions()

    async def begin_transaction(self) -> None:
        self._manager().begin()

    async def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        manager = self._manager()
        staged = {tp: _offset_and_metadata(value) for tp, value in offsets.items()}
        if isinstance(group_metadata, str):
            group_id, generation, member_id = group_metadata, -1, ""
        else:
            group_id = group_metadata.group_id
            generation, member_id = group_metadata.generation_id, group_metadata.member_id
        await manager.send_offsets(staged, group_id, generation, member_id)

    async def commit_transaction(self, timeout_s: float | None) -> None:
        manager = self._manager()
        manager.ensure_state(TxnState.IN_TRANSACTION)
        manager.state = TxnState.COMMITTING
        await self._settle_everything(timeout_s)
        if manager.failure is not None:
            manager.fail_transaction(manager.failure)
            raise IllegalStateError(
                f"the transaction cannot commit: a record of it failed ({manager.failure}); abort it"
            ) from manager.failure
        await manager.end(commit=True)

    async def abort_transaction(self, timeout_s: float | None) -> None:
        manager = self._manager()
        manager.ensure_state(TxnState.IN_TRANSACTION, TxnState.ABORTABLE_ERROR, TxnState.COMMITTING)
        manager.state = TxnState.ABORTING
        if self.sender is not None:
            for batch in self.accumulator.abort_queued():
                self.sender.fail(
                    batch, TransactionAbortedError("the transaction was aborted before this record was sent")
                )
        await self._settle_everything(timeout_s)
        await manager.end(commit=False)

    async def _settle_everything(self, timeout_s: float | None) -> None:
        """Send what is queued and wait until every record so far has settled."""
        results = self.accumulator.begin_flush()
        self.wakeup_sender()
        try:
            if results:
                await asyncio.wait_for(asyncio.gather(*(wait_for_result(r) for r in results)), timeout_s)
        except TimeoutError:
            raise RequestTimedOutError(
                f"the transaction's records did not settle within {timeout_s}s"
            ) from None
        finally:
            self.accumulator.end_flush()


def _offset_and_metadata(value) -> tuple[int, str]:
    """An offset to stage: an int, or an ``OffsetAndMetadata``-like (offset, metadata)."""
    if isinstance(value, int):
        return value, ""
    offset, metadata = value[0], value[1] if len(value) > 1 else ""
    return int(offset), metadata or ""


class AsyncProducer:
    """The asyncio producer (aiokafka's shape). Create it inside a running loop; ``start()`` (or
    ``async with``, or the first ``send``) connects, ``stop()``/``close()`` flushes and closes."""

    def __init__(
        self, *, servers: str | Sequence[str] | None = None, clock: Clock = SYSTEM_CLOCK, **settings: Any
    ) -> None:
        self.config = ProducerConfig.from_kwargs({"servers": servers, **settings})
        self._core = ProducerCore(self.config, clock=clock)

    async def start(self) -> None:
        """Start the sender routine on the running loop (connections open on first use)."""
        await self._core.start()

    async def __aenter__(self) -> AsyncProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    async def send(
        self,
        topic: str,
        value=None,
        key=None,
        headers=None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery=None,
    ) -> FutureRecordMetadata:
        """Queue a record; returns an awaitable :class:`FutureRecordMetadata` once it is queued.

        Waits (asynchronously) for metadata of a new topic and for buffer space, up to
        ``max_block_ms``. ``on_delivery(error, metadata)`` is called when the record settles.
        """
        core = self._core
        core.ensure_open()
        started = core.telemetry.now() if core.telemetry is not None else 0
        await core.start()
        prepared = core.prepare(value, key, headers, timestamp)
        count = core.cached_partition_count(topic, partition)
        if count is None:
            count = await core.fetch_partition_count(topic)
        reserved = 0
        while True:
            try:
                future = core.append(topic, partition, count, prepared, reserved)
                break
            except BufferExhausted as exhausted:
                await core.pool.allocate_async(exhausted.needed, self.config.max_block_ms / 1000.0)
                reserved = exhausted.needed
        if core.telemetry is not None:
            core.telemetry.sent(topic, key, future, started)
        if on_delivery is not None:
            future.add_delivery_callback(on_delivery)
        return future

    async def send_and_wait(
        self,
        topic: str,
        value=None,
        key=None,
        headers=None,
        partition: int | None = None,
        timestamp: int | None = None,
    ) -> RecordMetadata:
        """``send`` and wait for the acknowledgement."""
        future = await self.send(topic, value, key, headers, partition, timestamp)
        return await future

    async def send_batch(self, topic: str, partition: int, record_batches: bytes) -> FutureRecordMetadata:
        """Queue pre-encoded RecordBatch v2 bytes for one partition, as they are (mirroring tools).

        The future resolves to the metadata of the batch's first record. Malformed bytes fail
        the future with ``CorruptRecordError`` (reason ``CORRUPT_MESSAGE``), as the broker judges them.
        """
        core = self._core
        core.ensure_open()
        await core.start()
        await core.pool.allocate_async(len(record_batches), self.config.max_block_ms / 1000.0)
        return core.append_batch(topic, partition, record_batches)

    async def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and wait until every record so far has settled."""
        core = self._core
        results = core.accumulator.begin_flush()
        core.wakeup_sender()
        try:
            if results:
                await asyncio.wait_for(asyncio.gather(*(wait_for_result(r) for r in results)), timeout)
        except TimeoutError:
            raise RequestTimedOutError(f"flush did not complete within {timeout}s") from None
        finally:
            core.accumulator.end_flush()

    def metrics(self) -> dict[str, float]:
        """Counters of the sender: requests, batches retried / failed / acknowledged, records
        acknowledged; and the gateways' throttling (``produce-throttle-time-avg`` / ``-max`` in
        ms, as Kafka's producer names them; ``gateway/client/throttle.py``)."""
        return self._core.metrics()

    async def partitions_for(self, topic: str) -> set[int]:
        """The topic's partition numbers (fetching metadata if needed)."""
        await self._core.start()
        return set(range(await self._core.fetch_partition_count(topic)))

    # -- transactions (Kafka's producer API; need a ``transactional_id``) ------------------

    async def init_transactions(self) -> None:
        """Register the transactional id: fences older instances with the same id and ends a
        transaction they left open. Call once, before the first transaction."""
        await self._core.start()
        await self._core.init_transactions()

    async def begin_transaction(self) -> None:
        """Open a transaction: records sent until commit/abort belong to it."""
        await self._core.begin_transaction()

    async def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        """Stage a consumer group's offsets in the transaction (``{TopicPartition: offset}``;
        ``group_metadata`` from ``consumer.group_metadata()`` or a group id): they are committed
        if and only if the transaction commits."""
        await self._core.send_offsets_to_transaction(offsets, group_metadata)

    async def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, wait for every record of the transaction, and commit it
        (``timeout`` defaults to ``max_block_ms``)."""
        await self._core.commit_transaction(self._block_timeout(timeout))

    async def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction: unsent records fail with ``TransactionAbortedError``; what
        was written is never seen by ``read_committed`` consumers."""
        await self._core.abort_transaction(self._block_timeout(timeout))

    def _block_timeout(self, timeout: float | None) -> float:
        return self.config.max_block_ms / 1000.0 if timeout is None else timeout

    async def stop(self, timeout: float | None = None) -> None:
        """Flush, then close (records still unsent after ``timeout`` seconds fail)."""
        await self._core.close(timeout)

    close = stop


class Producer:
    """The thread-based producer (kafka-python's shape); its I/O runs on a background thread.

    Thread-safe: any number of threads may ``send`` concurrently.
    """

    def __init__(
        self, *, servers: str | Sequence[str] | None = None, clock: Clock = SYSTEM_CLOCK, **settings: Any
    ) -> None:
        self.config = ProducerConfig.from_kwargs({"servers": servers, **settings})
        self._core = ProducerCore(self.config, clock=clock)
        self._io = IOThread("tributary-producer", idle_calls=True)
        self._closed = False
        try:
            self._io.run(self._core.start())
        except BaseException:
            self._io.stop()
            raise
        if Acks.parse(self.config.acks) is not Acks.NONE:
            # (At acks=0 a request is settled once written: its callbacks would run on the
            # appending thread, and the records of a busy producer seldom find the loop idle.)
            self._core.run_if_idle = self._io.call_if_idle
        # Like kafka-python: a producer still open when the interpreter exits sends what it holds
        # (its I/O thread is a daemon and would otherwise die with records unsent).
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))
        atexit.register(self._at_exit)

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def send(
        self,
        topic: str,
        value=None,
        key=None,
        headers=None,
        partition: int | None = None,
        timestamp: int | None = None,
        on_delivery=None,
    ) -> FutureRecordMetadata:
        """Queue a record and return its future (``get(timeout)``, ``add_callback``, ...).

        Blocks only to fetch metadata of a topic not seen before, or while ``buffer_memory`` is
        full, each up to ``max_block_ms``. ``on_delivery(error, metadata)`` is called (on the
        I/O thread) when the record settles.
        """
        core = self._core
        if core.checks_state:
            core.ensure_open()
        telemetry = core.telemetry
        started = telemetry.now() if telemetry is not None else 0
        prepared = core.prepare(value, key, headers, timestamp)
        count = core.partition_counts.get(topic)
        # (``cached_partition_count``'s test, inlined: a partition past the cached count fetches
        # the metadata again; anything else is checked by ``append``.)
        if count is None or (partition is not None and isinstance(partition, int) and partition >= count):
            core.ensure_open()  # a closed producer has no I/O thread to fetch with
            count = self._io.run(core.fetch_partition_count(topic))
        try:
            future = core.append(topic, partition, count, prepared)
        except BufferExhausted as exhausted:  # a new batch waits for buffer memory
            future = self._append_when_memory_frees(topic, partition, count, prepared, exhausted.needed)
        if telemetry is not None:
            telemetry.sent(topic, key, future, started)
        if on_delivery is not None:
            future.add_delivery_callback(on_delivery)
        return future

    def _append_when_memory_frees(
        self, topic: str, partition: int | None, count: int, prepared: tuple, needed: int
    ) -> FutureRecordMetadata:
        """``send``'s slow path: wait for a new batch's buffer memory (up to ``max_block_ms`` each
        time), append with it; again if the append asks again (a race with other threads)."""
        core = self._core
        while True:
            core.pool.allocate(needed, self.config.max_block_ms / 1000.0)
            try:
                return core.append(topic, partition, count, prepared, needed)
            except BufferExhausted as exhausted:
                needed = exhausted.needed

    def send_batch(self, topic: str, partition: int, record_batches: bytes) -> FutureRecordMetadata:
        """Queue pre-encoded RecordBatch v2 bytes for one partition (see ``AsyncProducer.send_batch``)."""
        core = self._core
        core.ensure_open()
        core.pool.allocate(len(record_batches), self.config.max_block_ms / 1000.0)
        return core.append_batch(topic, partition, record_batches)

    def flush(self, timeout: float | None = None) -> None:
        """Send everything queued now and block until every record so far has settled.

        Raises RequestTimedOutError if that takes longer than ``timeout`` seconds.
        """
        core = self._core
        results = core.accumulator.begin_flush()
        core.wakeup_sender()
        try:
            deadline = None if timeout is None else core.clock.monotonic() + timeout
            for result in results:
                remaining = None if deadline is None else max(0.0, deadline - core.clock.monotonic())
                if not result.wait(remaining):
                    raise RequestTimedOutError(f"flush did not complete within {timeout}s")
        finally:
            core.accumulator.end_flush()

    def partitions_for(self, topic: str) -> set[int]:
        """The topic's partition numbers (fetching metadata if needed)."""
        return set(range(self._io.run(self._core.fetch_partition_count(topic))))

    def metrics(self) -> dict[str, float]:
        """The sender's counters and the gateways' throttling (see ``AsyncProducer.metrics``)."""
        return self._io.call(self._core.metrics)

    # -- transactions (see AsyncProducer for what each does) -------------------------------

    def init_transactions(self) -> None:
        """Register the transactional id, fencing older instances (see ``AsyncProducer``)."""
        self._io.run(self._core.init_transactions())

    def begin_transaction(self) -> None:
        """Open a transaction: records sent until commit/abort belong to it."""
        self._io.run(self._core.begin_transaction())

    def send_offsets_to_transaction(self, offsets, group_metadata) -> None:
        """Stage a consumer group's offsets in the transaction (committed only with it)."""
        self._io.run(self._core.send_offsets_to_transaction(offsets, group_metadata))

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Send what is queued, wait for every record of the transaction, and commit it."""
        self._io.run(self._core.commit_transaction(self._block_timeout(timeout)))

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the open transaction (unsent records fail with ``TransactionAbortedError``)."""
        self._io.run(self._core.abort_transaction(self._block_timeout(timeout)))

    def _block_timeout(self, timeout: float | None) -> float:
        return self.config.max_block_ms / 1000.0 if timeout is None else timeout

    def close(self, timeout: float | None = None) -> None:
        """Send what is queued (waiting up to ``timeout`` seconds), then release everything."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._at_exit)
        try:
            self._io.run(self._core.close(timeout))
        finally:
            self._io.stop()


def _close_at_exit(ref: weakref.ref, timeout: float = 30.0) -> None:
    producer = ref()
    if producer is not None:
        producer.close(timeout)
