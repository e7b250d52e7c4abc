"""The consumer: ``AsyncConsumer`` (asyncio) and ``Consumer`` (threads) over one core.

Usage, kafka-python style -- in a consumer group::

    consumer = Consumer(servers="127.0.0.1:9092", group_id="loader", auto_offset_reset="earliest")
    consumer.subscribe(["activity"], listener=MyRebalanceListener())
    try:
        while True:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                for record in records:
                    print(record.offset, record.key, record.value)
    except WakeupError:        # consumer.wakeup() from another thread
        pass
    finally:
        consumer.close()       # commits, and leaves the group at once

or with partitions chosen by hand (``consumer.assign([TopicPartition("activity", 0)])``), and
aiokafka style (``async for record in consumer``, ``await consumer.getmany(...)``).

Records are fetched as raw RecordBatch v2 bytes and decoded here, in the client: compression is
end to end. ``poll_arrow()`` decodes them into one ``pyarrow.Table`` per poll instead of a
``ConsumerRecord`` per record (see :mod:`gateway.client.arrow`), for pandas, polars and Spark.
A background fetch routine keeps the next chunk of every partition on its way while the
application processes the current one (see :mod:`gateway.client.fetcher`).

**Consumer groups** (``group_id`` + ``subscribe``): the coordinator assigns partitions
(server-side assignors); the consumer joins, heartbeats from its I/O routine -- so a slow
application keeps its membership as long as it calls ``poll`` within ``max_poll_interval_ms`` --
and commits (see :mod:`gateway.client.group_coordinator`). Partition changes are applied inside
``poll``, where the :class:`~gateway.client.listener.ConsumerRebalanceListener` runs (on the
application's thread for ``Consumer``; awaited for ``AsyncConsumer``). A new partition starts at
the group's committed offset, else at ``auto_offset_reset``. With ``enable_auto_commit`` (the
default), ``poll`` commits what earlier polls returned every ``auto_commit_interval_ms``, and the
consumer commits before giving partitions up and on ``close``: at-least-once delivery as long as
records are processed before the next ``poll``. Otherwise commit with ``commit()`` (everything
returned so far), ``commit(offsets)`` (next offset to consume, per partition) or
``commit_async(callback=...)``. A consumer with a ``group_id`` and hand-assigned partitions
(``assign``) starts them at the group's committed offsets and commits as a standalone consumer
(accepted while the group has no members).

``close()`` leaves the group at once (LeaveGroup), so its partitions move without waiting for the
session timeout -- except for a static member (``group_instance_id``), which keeps its partitions
through a restart within ``session_timeout_ms``, as in Kafka.

Settings (Kafka's consumer configs, Python-cased; defaults are Kafka's):

============================= ============ ===============================================
``auto_offset_reset``         "latest"     where to start without a position: earliest,
                                           latest, or none (raise OffsetOutOfRangeError)
``fetch_min_bytes``           1            the gateway answers once this much is ready...
``fetch_max_wait_ms``         500          ...or after this long
``fetch_max_bytes``           50 MiB       bytes per fetch across partitions
``max_partition_fetch_bytes`` 1 MiB        bytes per partition per fetch
``max_poll_records``          500          default ``max_records`` of ``poll``
``check_crcs``                True         verify every batch's CRC-32C
``data_path``                 "auto"       "auto": fetch over the gateway's raw data
                                           listener when it offers one, else gRPC;
                                           "grpc": always gRPC
``consumer_timeout_ms``       forever      iteration stops after this long without records
``group_id``                  None         the consumer group (needed by subscribe/commit)
``group_instance_id``         None         static membership: a restart within the session
                                           keeps the partitions, without a rebalance
``session_timeout_ms``        45000        no heartbeat for this long ends the membership
                                           (the coordinator accepts 6000 .. 1800000)
``heartbeat_interval_ms``     3000         heartbeat period (the coordinator may ask for
                                           a shorter one: session timeout / 3)
``max_poll_interval_ms``      300000       no poll() for this long ends the membership
``partition_assignment_strategy``          cooperative-sticky, range, roundrobin or sticky
                              "cooperative-sticky"
``enable_auto_commit``        True         commit in poll, before revocation, on close
``auto_commit_interval_ms``   5000         how often poll commits
============================= ============ ===============================================
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.client.client import GatewayClient, client_tls, list_offsets
from gateway.client.credentials import TokenSource, client_token_source
from gateway.client.dataport import parse_data_path
from gateway.client.errors import IllegalStateError, InvalidGroupIdError, TributaryError, WakeupError
from gateway.client.fetcher import Fetcher
from gateway.client.group_coordinator import CommitCallback, GroupCoordinator, GroupSettings
from gateway.client.group_serde import as_offset_and_metadata, assignor_to_proto
from gateway.client.io_thread import IOThread, call_directly
from gateway.client.serialization import Deserializer
from gateway.client.structs import (
    ConsumerGroupMetadata,
    ConsumerRecord,
    OffsetAndMetadata,
    OffsetAndTimestamp,
    TopicPartition,
)
from gateway.client.subscription import SubscriptionState, SubscriptionType, validate_reset_strategy
from gateway.client.telemetry import ConsumerTelemetry
from services.clock import SYSTEM_CLOCK, Clock
from services.tls import ClientTls
from services.topic_pattern import compile_topic_pattern


@dataclass
class ConsumerConfig:
    """Every consumer setting; see the module docstring for what each means."""

    servers: str | Sequence[str] | None = None
    client_id: str = "tributary-consumer"
    group_id: str | None = None
    key_deserializer: Deserializer | None = None
    value_deserializer: Deserializer | None = None
    auto_offset_reset: str = "latest"
    fetch_min_bytes: int = 1
    fetch_max_wait_ms: int = 500
    fetch_max_bytes: int = 52_428_800
    max_partition_fetch_bytes: int = 1_048_576
    max_poll_records: int = 500
    check_crcs: bool = True
    isolation_level: str = "read_uncommitted"
    #: "auto": the gateway's raw data listener when offered (``gateway/client/dataport.py``);
    #: "grpc": the gRPC Fetch always.
    data_path: str = "auto"
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300_000
    consumer_timeout_ms: float = math.inf
    group_instance_id: str | None = None
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 3_000
    max_poll_interval_ms: int = 300_000
    partition_assignment_strategy: str | Sequence[str] | None = "cooperative-sticky"
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
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
    def from_kwargs(cls, kwargs: dict[str, Any]) -> ConsumerConfig:
        aliases = {"bootstrap_servers": "servers"}
        names = {f.name for f in dataclasses.fields(cls)}
        values = {}
        for key, value in kwargs.items():
            name = aliases.get(key, key)
            if name not in names:
                raise TypeError(f"unknown consumer setting {key!r}")
            values[name] = value
        config = cls(**values)
        validate_reset_strategy(config.auto_offset_reset)
        parse_data_path(config.data_path)
        config.tls()
        config.token_source()
        if config.max_poll_records <= 0:
            raise ValueError("max_poll_records must be positive")
        config.validate_group_settings()
        return config

    def tls(self) -> ClientTls | None:
        """The TLS the security settings ask for (ValueError when they do not add up)."""
        return client_tls(self.security_protocol, self.ssl_cafile, self.ssl_certfile, self.ssl_keyfile)

    def token_source(self) -> TokenSource | None:
        """The bearer token the SASL settings ask for (ValueError when they do not add up)."""
        return client_token_source(
            self.security_protocol, self.sasl_mechanism, self.sasl_oauth_token_provider
        )

    @property
    def assignor(self) -> str | None:
        """The one assignor asked for (Kafka takes a preference list; the first is used)."""
        strategy = self.partition_assignment_strategy
        if strategy is None or isinstance(strategy, str):
            return strategy
        return next(iter(strategy), None)

    def validate_group_settings(self) -> None:
        if self.group_id is not None and (not isinstance(self.group_id, str) or not self.group_id):
            raise ValueError(f"group_id must be a non-empty string, not {self.group_id!r}")
        for name in (
            "session_timeout_ms",
            "heartbeat_interval_ms",
            "max_poll_interval_ms",
            "auto_commit_interval_ms",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("heartbeat_interval_ms must be lower than session_timeout_ms")
        assignor_to_proto(self.assignor)  # ValueError for an unknown name

    def group_settings(self) -> GroupSettings:
        assert self.group_id is not None
        return GroupSettings(
            group_id=self.group_id,
            group_instance_id=self.group_instance_id or None,
            client_id=self.client_id,
            session_timeout_ms=self.session_timeout_ms,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            max_poll_interval_ms=self.max_poll_interval_ms,
            assignor=self.assignor,
            enable_auto_commit=self.enable_auto_commit,
            auto_commit_interval_ms=self.auto_commit_interval_ms,
            request_timeout_ms=self.request_timeout_ms,
            retry_backoff_ms=self.retry_backoff_ms,
        )


def _as_partitions(partitions: Iterable) -> list[TopicPartition]:
    result = []
    for tp in partitions:
        if (
            not isinstance(tp, tuple)
            or len(tp) != 2
            or not isinstance(tp[0], str)
            or not isinstance(tp[1], int)
        ):
            raise TypeError(f"expected TopicPartition(topic, partition), not {tp!r}")
        result.append(TopicPartition(*tp))
    return result


def _first_offsets(records: Iterable[ConsumerRecord]) -> dict[TopicPartition, int]:
    """The first offset of each partition among ``records`` (in order)."""
    first: dict[TopicPartition, int] = {}
    for record in records:
        first.setdefault(TopicPartition(record.topic, record.partition), record.offset)
    return first


def _as_topics(topics) -> list[str]:
    """``subscribe``'s topics: a list of names (a single name is taken as one topic)."""
    return [topics] if isinstance(topics, str) else list(topics or ())


def _as_pattern(pattern) -> str | None:
    """A regular expression (string or compiled ``re.Pattern``) in RE2 syntax, matched in full
    against topic names by the group coordinator (:mod:`services.topic_pattern`)."""
    if pattern is None:
        return None
    if isinstance(pattern, re.Pattern):
        if pattern.flags & ~re.UNICODE:
            raise ValueError(
                f"the flags of {pattern!r} would be lost: only the pattern text is sent; write them "
                "inline instead, e.g. (?i) for re.IGNORECASE"
            )
        pattern = pattern.pattern
    if not isinstance(pattern, str) or not pattern:
        raise TypeError(f"pattern must be a non-empty regular expression, not {pattern!r}")
    compile_topic_pattern(pattern)  # INVALID_REQUEST now rather than from the coordinator later
    return pattern


class _PollWake:
    """What a waiting ``poll`` sleeps on: one future, resolved by the first of its signals to be
    set (records buffered, a rebalance to run, a wakeup) or by its timeout. Waiting on the
    events themselves took a task per event and per wait, and two more turns of the loop
    between a fetch answer and ``poll`` returning its records."""

    __slots__ = ("_future", "thread_signal")

    def __init__(self) -> None:
        self._future: asyncio.Future | None = None
        #: Set too, for a thread-based consumer's poll waiting on its own thread
        #: (``AsyncConsumer.poll_buffered``); None: nobody waits there.
        self.thread_signal: threading.Event | None = None

    def wake(self) -> None:
        future = self._future
        if future is not None and not future.done():
            future.set_result(None)
        if self.thread_signal is not None:
            self.thread_signal.set()

    async def wait(self, timeout: float, signals: Iterable[asyncio.Event]) -> None:
        """Until ``wake`` (or one of ``signals`` is already set), at most ``timeout`` seconds."""
        if any(signal.is_set() for signal in signals):
            return
        loop = asyncio.get_running_loop()
        future = self._future = loop.create_future()
        timer = loop.call_later(timeout, self.wake)
        try:
            await future
        finally:
            timer.cancel()
            self._future = None


class _Signal(asyncio.Event):
    """An ``asyncio.Event`` whose ``set`` also wakes the ``poll`` waiting (:class:`_PollWake`)."""

    def __init__(self, wake: _PollWake) -> None:
        super().__init__()
        self._wake = wake

    def set(self) -> None:
        super().set()
        self._wake.wake()


class AsyncConsumer:
    """The asyncio consumer (aiokafka's shape) -- and the core the thread-based one runs.

    Create it inside a running loop; ``start()`` (or ``async with``) connects; ``stop()`` closes.
    Not safe to share between tasks that change its assignment concurrently, like Kafka's.
    Topics given to the constructor are subscribed to (a ``group_id`` is needed then).
    """

    def __init__(
        self,
        *topics: str,
        servers: str | Sequence[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        _call_back: Callable | None = None,
        **settings: Any,
    ) -> None:
        self.config = ConsumerConfig.from_kwargs({"servers": servers, **settings})
        self._client = GatewayClient(
            self.config.servers,
            request_timeout_ms=self.config.request_timeout_ms,
            metadata_max_age_ms=self.config.metadata_max_age_ms,
            retry_backoff_ms=self.config.retry_backoff_ms,
            clock=clock,
            client_id=self.config.client_id,
            tls=self.config.tls(),
            token_source=self.config.token_source(),
        )
        self._subscription = SubscriptionState(self.config.auto_offset_reset)
        #: A waiting poll's wake-up: set by the fetcher's data signal and by ``_attention``.
        self._poll_wake = _PollWake()
        #: Spans and metrics of the polls, on the application's OpenTelemetry SDK (None: off).
        self._telemetry = ConsumerTelemetry.create(
            self.config.client_id, self.config.group_id, self._client.addresses
        )
        c = self.config
        self._fetcher = Fetcher(
            self._client,
            self._subscription,
            fetch_min_bytes=c.fetch_min_bytes,
            fetch_max_wait_ms=c.fetch_max_wait_ms,
            fetch_max_bytes=c.fetch_max_bytes,
            max_partition_fetch_bytes=c.max_partition_fetch_bytes,
            check_crcs=c.check_crcs,
            isolation_level=c.isolation_level,
            data_path=c.data_path,
            retry_backoff_ms=c.retry_backoff_ms,
            key_deserializer=c.key_deserializer,
            value_deserializer=c.value_deserializer,
            data_ready=_Signal(self._poll_wake),
            fetch_before_poll=False,  # opened by the first poll, as Kafka's consumer fetches
        )
        self._fetch_task: asyncio.Task | None = None
        self._closed = False
        self._iter_buffer: deque[ConsumerRecord] = deque()
        #: Set when poll has more to do than return records (a rebalance, a wakeup).
        self._attention: asyncio.Event = _Signal(self._poll_wake)
        self._wakeup_requested = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Records handed to the application's iterator buffers but not yet to the application
        #: itself: ``{tp: first such offset}``, so a commit never covers them.
        self._unconsumed_sources: list[Callable[[], dict[TopicPartition, int]]] = [self._iter_unconsumed]
        self._coordinator: GroupCoordinator | None = None
        if c.group_id is not None:
            self._coordinator = GroupCoordinator(
                self._client,
                self._subscription,
                self._fetcher,
                c.group_settings(),
                attention=self._attention,
                call_back=_call_back or call_directly,
                consumed_offsets=self._consumed_offsets,
            )
        if topics:
            self.subscribe(list(topics))

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the fetch routine on the running loop (it opens the data connection once
        partitions are assigned, and fetches from the first ``poll`` on), and the group's
        heartbeat routine if subscribed."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._fetch_task is None:
            self._loop = asyncio.get_running_loop()
            self._fetch_task = self._loop.create_task(self._fetcher.run(), name="tributary-fetcher")
        if self._coordinator is not None:
            self._coordinator.ensure_routine()

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Commit (with ``enable_auto_commit``), give the partitions up (the listener's
        ``on_partitions_revoked``), leave the group (unless static), stop fetching and close the
        connections. A listener's error is raised once all of that is done."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._coordinator is not None:
                await self._coordinator.leave_group("close")
        finally:
            await self._fetcher.close()
            if self._fetch_task is not None:
                await asyncio.wait({self._fetch_task})
            await self._client.close()

    close = stop

    def wakeup(self) -> None:
        """Make the ``poll`` in progress -- or, if none is, the next one -- raise
        :class:`~gateway.client.errors.WakeupError`. Safe to call from any thread."""
        loop = self._loop
        if loop is None or asyncio._get_running_loop() is loop:
            self._do_wakeup()
        else:
            loop.call_soon_threadsafe(self._do_wakeup)

    def _do_wakeup(self) -> None:
        self._wakeup_requested = True
        self._attention.set()

    def _maybe_raise_wakeup(self) -> None:
        if self._wakeup_requested:
            self._wakeup_requested = False
            raise WakeupError("poll() was interrupted by wakeup()")

    # -- assignment ------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any previous assignment). With a
        ``group_id``, new partitions start at the group's committed offsets."""
        wanted = _as_partitions(partitions)
        for tp in self._subscription.assigned_partitions() - set(wanted):
            self._fetcher.discard(tp)
        self._subscription.assign_from_user(wanted, await_committed=self._coordinator is not None)
        self._fetcher.wakeup(restart_fetch=True)

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned to this consumer (by ``assign``, or by its group)."""
        return self._subscription.assigned_partitions()

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation and member id of this consumer, for
        ``producer.send_offsets_to_transaction`` (needs a ``group_id``)."""
        coordinator = self._coordinator
        if coordinator is None:
            raise IllegalStateError("group_metadata() needs a consumer created with a group_id")
        membership = coordinator.membership
        return ConsumerGroupMetadata(
            coordinator.settings.group_id,
            membership.generation,
            membership.member_id,
            coordinator.settings.group_instance_id,
        )

    def subscribe(
        self, topics: Iterable[str] | str = (), pattern: str | re.Pattern | None = None, listener=None
    ) -> None:
        """Consume ``topics`` -- or every topic whose whole name matches ``pattern`` -- as a member
        of the consumer group ``group_id``; the group decides which partitions this consumer
        reads. ``listener`` (a :class:`~gateway.client.listener.ConsumerRebalanceListener`) hears
        about partitions given and taken. Joining happens in the background; partitions arrive
        in a later ``poll``. Subscribing again replaces the subscription (and the listener).

        ``pattern`` is RE2 syntax (what Java's and Python's regular expressions share, without
        backreferences or lookaround), at most 1,000 characters, and matches the whole topic name
        as in Kafka's Java client; a pattern that is not one raises ``InvalidRequestError``."""
        coordinator = self._ensure_group("subscribe()")
        self._subscription.subscribe(_as_topics(topics), _as_pattern(pattern))
        coordinator.subscribe(listener)
        self._attention.set()

    def subscription(self) -> set[str] | None:
        """The subscribed topic names (or the pattern, as a one-element set); None if not subscribed."""
        if not self._subscription.is_group_managed:
            return None
        if self._subscription.topics:
            return set(self._subscription.topics)
        pattern = self._subscription.pattern
        return {pattern} if pattern is not None else set()

    async def unsubscribe(self) -> None:
        """Stop consuming: a group member commits (with ``enable_auto_commit``), gives its
        partitions up (listener) and leaves the group (unless static); hand-assigned partitions
        are simply dropped."""
        try:
            if self._coordinator is not None and self._subscription.is_group_managed:
                await self._coordinator.leave_group("unsubscribe")
        finally:
            for tp in self._subscription.assigned_partitions():
                self._fetcher.discard(tp)
            self._subscription.unsubscribe()
            self._iter_buffer.clear()
            self._fetcher.wakeup(restart_fetch=True)

    def _ensure_group(self, what: str) -> GroupCoordinator:
        if self._coordinator is None:
            raise InvalidGroupIdError(f"{what} needs a consumer group: create the consumer with group_id=...")
        return self._coordinator

    # -- commits ---------------------------------------------------------------------------

    def _iter_unconsumed(self) -> dict[TopicPartition, int]:
        return _first_offsets(self._iter_buffer)

    def _consumed_offsets(self) -> dict[TopicPartition, int]:
        """The next offset to consume per partition: positions, held back to the first record
        still waiting in an iterator buffer."""
        consumed = self._subscription.consumed_offsets()
        for source in self._unconsumed_sources:
            for tp, offset in source().items():
                if tp in consumed and offset < consumed[tp]:
                    consumed[tp] = offset
        return consumed

    def _offsets_to_commit(self, offsets) -> dict[TopicPartition, OffsetAndMetadata] | None:
        if offsets is None:
            return None
        if not isinstance(offsets, Mapping):
            raise TypeError("offsets must be a dict {TopicPartition: OffsetAndMetadata or offset}")
        return {TopicPartition(*tp): as_offset_and_metadata(value) for tp, value in offsets.items()}

    async def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commit and wait (Kafka's ``commitSync``): by default the position of every partition
        this consumer holds (everything ``poll`` returned so far), else ``offsets`` -- each the
        *next* offset to consume. Retries while the coordinator is unavailable; raises the
        typed error otherwise (``IllegalGenerationError`` when a partition moved to another
        member, ``UnknownMemberIdError`` when the membership ended)."""
        coordinator = self._ensure_group("commit()")
        await coordinator.deliver_commit_callbacks()
        await coordinator.commit(coordinator.offsets_to_commit(self._offsets_to_commit(offsets)))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: CommitCallback | None = None,
    ) -> None:
        """Send a commit without waiting and without retries (Kafka's ``commitAsync``);
        ``callback(offsets, exception_or_None)`` is called from a later ``poll``, ``commit`` or
        ``close`` (awaited if it returns an awaitable)."""
        coordinator = self._ensure_group("commit_async()")
        coordinator.commit_async(coordinator.offsets_to_commit(self._offsets_to_commit(offsets)), callback)

    async def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        """The group's committed offset of ``partition`` (None when nothing is committed)."""
        tp = TopicPartition(*partition)
        return (await self._ensure_group("committed()").fetch_committed([tp]))[tp]

    # -- positions -------------------------------------------------------------------------

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Consume ``partition`` from ``offset`` on the next poll."""
        self._subscription.seek(TopicPartition(*partition), offset)
        self._after_seek([TopicPartition(*partition)])

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Start from the earliest offset (all assigned partitions when none are given)."""
        self._reset(partitions, "earliest")

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Start after the last record (all assigned partitions when none are given)."""
        self._reset(partitions, "latest")

    def _reset(self, partitions: tuple, strategy: str) -> None:
        tps = _as_partitions(partitions) if partitions else list(self._subscription.assigned_partitions())
        for tp in tps:
            self._subscription.request_reset(tp, strategy)
        self._after_seek(tps)

    def _after_seek(self, tps: list[TopicPartition]) -> None:
        moved = set(tps)
        for tp in moved:
            self._fetcher.discard(tp)
        self._iter_buffer = deque(r for r in self._iter_buffer if (r.topic, r.partition) not in moved)
        self._fetcher.wakeup(restart_fetch=True)

    async def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return (looked up now if needed)."""
        tp = TopicPartition(*partition)
        position = self._subscription.position(tp)
        if (
            position is None
            and self._subscription.state(tp).awaiting_committed
            and self._coordinator is not None
        ):
            await self._coordinator.refresh_committed_offsets()
            position = self._subscription.position(tp)
        if position is None:
            if tp not in self._subscription.partitions_awaiting_reset():
                raise IllegalStateError(
                    f"no position for {tp} yet (its committed offset is not known); try again"
                )
            strategy, epoch = self._subscription.partitions_awaiting_reset()[tp]
            await self._fetcher.reset_offsets({tp: (strategy, epoch)})
            self._fetcher.raise_error(tp)
            position = self._subscription.position(tp)
            if position is None:
                raise IllegalStateError(f"no position for {tp} yet; try again")
        return position

    def highwater(self, partition: TopicPartition) -> int | None:
        """The last high watermark seen for ``partition`` in a fetch (None before the first)."""
        return self._subscription.high_watermark(TopicPartition(*partition))

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning and fetching records of these partitions until ``resume``."""
        for tp in _as_partitions(partitions):
            self._subscription.pause(tp)

    def resume(self, *partitions: TopicPartition) -> None:
        """Return and fetch records of these partitions again."""
        for tp in _as_partitions(partitions):
            self._subscription.resume(tp)
        self._fetcher.partitions_resumed()
        self._fetcher.wakeup(restart_fetch=True)

    def paused(self) -> set[TopicPartition]:
        """The partitions paused with ``pause``."""
        return self._subscription.paused_partitions()

    def metrics(self) -> dict[str, float]:
        """The gateways' throttling of this consumer's fetches (client quotas):
        ``fetch-throttle-time-avg`` / ``-max`` in ms over every fetch answer, as Kafka's consumer
        names them, the throttled answers and their total (``gateway/client/throttle.py``)."""
        return self._client.fetch_throttles.metrics()

    # -- offsets lookups -------------------------------------------------------------------

    async def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given ms (None if none is)."""
        results = await self._list_offsets({TopicPartition(*tp): ts for tp, ts in timestamps.items()})
        return {tp: (None if r.offset < 0 else r) for tp, r in results.items()}

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        results = await self._list_offsets({tp: "earliest" for tp in _as_partitions(partitions)})
        return {tp: r.offset for tp, r in results.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after the last record of each partition: the high watermark, or with
        ``isolation_level="read_committed"`` the last stable offset (Kafka's rule)."""
        results = await self._list_offsets({tp: "latest" for tp in _as_partitions(partitions)})
        return {tp: r.offset for tp, r in results.items()}

    async def _list_offsets(self, specs: dict) -> dict[TopicPartition, OffsetAndTimestamp]:
        results = await list_offsets(
            self._client, specs, read_committed=self.config.isolation_level == "read_committed"
        )
        for result in results.values():
            if isinstance(result, TributaryError):
                raise result
        return results

    async def topics(self) -> set[str]:
        """Every topic in the cluster."""
        response = await self._client.refresh_metadata()
        return {t.name for t in response.topics}

    async def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition numbers; UnknownTopicOrPartitionError if the cluster has no such topic."""
        description = await self._client.ensure_topic(topic, max_wait_ms=0)
        return {p.partition for p in description.partitions}

    # -- reading ---------------------------------------------------------------------------

    async def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition: whatever is buffered, else waiting up to ``timeout_ms`` for some.

        Raises a partition's pending error (``OffsetOutOfRangeError`` with
        ``auto_offset_reset='none'``, ``UnknownTopicOrPartitionError``, ``CorruptRecordError``)
        when there are no records to return.
        """
        return await self._poll(timeout_ms, max_records, None)

    async def getmany(
        self, *partitions: TopicPartition, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """aiokafka's name for ``poll``, optionally limited to some assigned ``partitions``."""
        return await self._poll(
            timeout_ms, max_records, set(_as_partitions(partitions)) if partitions else None
        )

    async def poll_arrow(
        self, timeout_ms: int = 0, max_records: int | None = None, *, include_headers: bool = True
    ):
        """``poll``'s records as one ``pyarrow.Table``, without a Python object per record.

        Fetched batches are decoded straight into Arrow buffers (in C with the accelerator);
        the table has one record batch per partition, with the columns of Spark's Kafka source
        (see :mod:`gateway.client.arrow`; ``headers`` only with ``include_headers``), and no
        rows when nothing arrived within ``timeout_ms``. Keys and values are the raw bytes, so
        a consumer configured with a key or value deserializer refuses this call. Positions,
        commits, errors and the group protocol are as for ``poll``. Needs ``pyarrow``.
        """
        from gateway.client import arrow
        from services.records.columns import Columns

        fetcher = self._fetcher
        if fetcher.key_deserializer is not None or fetcher.value_deserializer is not None:
            raise IllegalStateError(
                "poll_arrow() returns keys and values as bytes; this consumer has a key or value "
                "deserializer: use poll(), or a consumer without deserializers"
            )

        def drain(max_records: int, only: set[TopicPartition] | None) -> dict:
            drained = fetcher.drain_columns(
                max_records, only, lambda: Columns(include_headers=include_headers)
            )
            return {
                tp: arrow.to_record_batch(
                    columns.take(), tp.topic, tp.partition, include_headers=include_headers
                )
                for tp, columns in drained.items()
            }

        batches = await self._poll(timeout_ms, max_records, None, drain)
        return arrow.to_table(list(batches.values()), include_headers=include_headers)

    async def _poll(
        self,
        timeout_ms: int,
        max_records: int | None,
        only: set[TopicPartition] | None,
        drain: Callable | None = None,
    ) -> dict:
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._subscription.subscription_type is SubscriptionType.NONE:
            raise IllegalStateError(
                "the consumer is not subscribed to any topic nor assigned any partition; "
                "call subscribe() or assign() first"
            )
        telemetry = self._telemetry
        started = telemetry.now() if telemetry is not None else 0
        await self.start()
        self._fetcher.allow_fetching()
        coordinator = self._coordinator
        drain = drain or self._fetcher.drain
        if coordinator is None:
            records = await self._poll_records(timeout_ms, max_records, only, drain)
        else:
            coordinator.poll_started()
            try:
                records = await self._poll_records(timeout_ms, max_records, only, drain)
            finally:
                coordinator.poll_finished()
        if telemetry is not None:
            telemetry.polled(records, started)
        return records

    def poll_buffered(
        self, max_records: int | None, started_ns: int, signal: threading.Event
    ) -> dict[TopicPartition, list[ConsumerRecord]] | None:
        """A poll of what is buffered now, for a thread-based consumer whose ``poll`` waits on
        its own thread: the records (``{}``: none yet; ``signal`` is cleared and set again
        when records arrive, an error is found or a wakeup comes), or None when the full
        ``poll`` must run (a group to serve, a wakeup to raise, not started, closed). Raises a
        partition's error as ``poll`` does. ``started_ns``: when the application's poll began
        (its span's start).

        Called through ``IOThread.call_while_idle``: on the application's thread, while the I/O
        thread waits for I/O, so a poll costs no handoff to the I/O thread and back."""
        if (
            self._closed
            or self._coordinator is not None
            or self._wakeup_requested
            or self._fetch_task is None
        ):
            return None
        if self._subscription.subscription_type is SubscriptionType.NONE:
            return None
        self._fetcher.allow_fetching()
        self._poll_wake.thread_signal = signal
        signal.clear()  # before looking: whatever is buffered after this sets it again
        records = self._fetcher.drain(max_records or self.config.max_poll_records)
        telemetry = self._telemetry
        if records and telemetry is not None:
            telemetry.polled(records, started_ns)
        return records

    async def _poll_records(
        self, timeout_ms: int, max_records: int | None, only: set[TopicPartition] | None, drain: Callable
    ) -> dict:
        max_records = max_records or self.config.max_poll_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000.0
        while True:
            self._attention.clear()
            self._maybe_raise_wakeup()
            if self._coordinator is not None:
                await self._coordinator.poll()
            records = drain(max_records, only)
            remaining = deadline - loop.time()
            if records or remaining <= 0:
                return records
            if only is None:
                await self._poll_wake.wait(remaining, (self._fetcher.data_ready, self._attention))
            else:  # data of other partitions may be buffered already: look again shortly
                await self._poll_wake.wait(min(remaining, 0.01), (self._attention,))

    async def getone(self) -> ConsumerRecord:
        """The next record, waiting as long as it takes."""
        while not self._iter_buffer:
            for records in (await self.poll(timeout_ms=1000)).values():
                self._iter_buffer.extend(records)
        return self._iter_buffer.popleft()

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        """Next record; ends after ``consumer_timeout_ms`` without one (never, by default)."""
        timeout = self.config.consumer_timeout_ms
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout / 1000.0
        while not self._iter_buffer:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise StopAsyncIteration
            for records in (await self.poll(timeout_ms=int(min(remaining * 1000, 1000)))).values():
                self._iter_buffer.extend(records)
        return self._iter_buffer.popleft()


class Consumer:
    """The thread-based consumer (kafka-python's shape); fetching and heartbeats run on a
    background thread, rebalance listeners and commit callbacks on the thread calling ``poll``.

    Like Kafka's, one consumer is meant for one application thread; ``wakeup()`` is the one
    method other threads may call.
    """

    def __init__(
        self,
        *topics: str,
        servers: str | Sequence[str] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        **settings: Any,
    ) -> None:
        self._io = IOThread("tributary-consumer", idle_calls=True)
        #: Set by the I/O thread when a waiting ``poll`` has something to look at.
        self._ready = threading.Event()

        async def create() -> AsyncConsumer:
            consumer = AsyncConsumer(
                *topics, servers=servers, clock=clock, _call_back=self._io.call_back, **settings
            )
            consumer._unconsumed_sources.append(self._unconsumed)
            await consumer.start()
            return consumer

        self._iter_buffer: deque[ConsumerRecord] = deque()
        try:
            self._core = self._io.run(create())
        except BaseException:
            self._io.stop()
            raise
        self.config = self._core.config
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _run(self, coro):
        return self._io.run(coro)

    def _run_here(self, coro):
        """Run ``coro`` on the I/O thread; listener methods and commit callbacks it calls run here."""
        return self._io.run_calling_back(coro)

    def _unconsumed(self) -> dict[TopicPartition, int]:
        # Read on the I/O thread while this thread waits in a call (never concurrently with it).
        return _first_offsets(self._iter_buffer)

    # -- assignment and subscription -------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any previous assignment)."""
        partitions = list(partitions)
        self._io.call(self._core.assign, partitions)
        self._iter_buffer.clear()

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned to this consumer (by ``assign``, or by its group)."""
        return self._io.call(self._core.assignment)

    def group_metadata(self) -> ConsumerGroupMetadata:
        """The group, generation and member id of this consumer (see ``AsyncConsumer``)."""
        return self._io.call(self._core.group_metadata)

    def subscribe(
        self, topics: Iterable[str] | str = (), pattern: str | re.Pattern | None = None, listener=None
    ) -> None:
        """Join the group for ``topics`` or ``pattern`` (see ``AsyncConsumer.subscribe``); the
        listener's methods run on this thread, inside ``poll``."""
        self._io.call(self._core.subscribe, topics, pattern, listener)

    def subscription(self) -> set[str] | None:
        """The subscribed topic names (or the pattern); None if not subscribed."""
        return self._io.call(self._core.subscription)

    def unsubscribe(self) -> None:
        """Stop consuming (see ``AsyncConsumer.unsubscribe``); drops everything buffered."""
        try:
            self._run_here(self._core.unsubscribe())
        finally:
            self._iter_buffer.clear()

    # -- commits ---------------------------------------------------------------------------

    def commit(self, offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None) -> None:
        """Commit and wait: everything returned so far, or ``offsets`` (next offset to consume)."""
        self._run_here(self._core.commit(offsets))

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, OffsetAndMetadata | int] | None = None,
        callback: CommitCallback | None = None,
    ) -> None:
        """Send a commit without waiting; ``callback(offsets, exception_or_None)`` runs on this
        thread in a later ``poll``, ``commit`` or ``close``."""
        self._io.call(self._core.commit_async, offsets, callback)

    def committed(self, partition: TopicPartition) -> OffsetAndMetadata | None:
        """The group's committed offset of ``partition`` (None when nothing is committed)."""
        return self._run(self._core.committed(partition))

    # -- reading ---------------------------------------------------------------------------

    def poll(
        self, timeout_ms: int = 0, max_records: int | None = None
    ) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition (see ``AsyncConsumer.poll``); blocks up to ``timeout_ms``.

        Group changes are applied here, and the rebalance listener runs here, on this thread.
        Raises :class:`~gateway.client.errors.WakeupError` after ``wakeup()``.
        """
        # Without a group, records are taken here, on this thread, while the I/O thread waits
        # for I/O, and a poll with nothing buffered waits here for the I/O thread's signal: a
        # handoff of each poll to the I/O thread and back (a task, futures, two thread wakeups)
        # was a fifth of the consume benchmark's client CPU.
        if not self._io.idle_calls:
            return self._run_here(self._core.poll(timeout_ms, max_records))
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000.0
        started = time.time_ns()
        while True:
            records = self._io.call_while_idle(self._core.poll_buffered, max_records, started, self._ready)
            if records is None:
                remaining_ms = int(max(deadline - time.monotonic(), 0.0) * 1000)
                return self._run_here(self._core.poll(remaining_ms, max_records))
            remaining = deadline - time.monotonic()
            if records or remaining <= 0:
                return records
            self._ready.wait(remaining)

    def poll_arrow(
        self, timeout_ms: int = 0, max_records: int | None = None, *, include_headers: bool = True
    ):
        """``poll``'s records as one ``pyarrow.Table`` (see ``AsyncConsumer.poll_arrow``)::

        table = consumer.poll_arrow(timeout_ms=1000)
        frame = table.to_pandas()            # or polars.from_arrow(table)
        """
        return self._run_here(self._core.poll_arrow(timeout_ms, max_records, include_headers=include_headers))

    def wakeup(self) -> None:
        """Interrupt the ``poll`` in progress (or the next one) with ``WakeupError``; thread-safe."""
        self._core.wakeup()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """Consume ``partition`` from ``offset`` on the next poll."""
        self._io.call(self._core.seek, partition, offset)
        self._drop_buffered([TopicPartition(*partition)])

    def seek_to_beginning(self, *partitions: TopicPartition) -> None:
        """Start from the earliest offset (all assigned partitions when none are given)."""
        self._io.call(self._core.seek_to_beginning, *partitions)
        self._drop_buffered(list(partitions) or None)

    def seek_to_end(self, *partitions: TopicPartition) -> None:
        """Start after the last record (all assigned partitions when none are given)."""
        self._io.call(self._core.seek_to_end, *partitions)
        self._drop_buffered(list(partitions) or None)

    def _drop_buffered(self, partitions: list | None) -> None:
        if partitions is None:
            self._iter_buffer.clear()
            return
        dropped = {TopicPartition(*tp) for tp in partitions}
        self._iter_buffer = deque(r for r in self._iter_buffer if (r.topic, r.partition) not in dropped)

    def position(self, partition: TopicPartition) -> int:
        """The offset of the next record ``poll`` will return (looked up now if needed)."""
        return self._run(self._core.position(partition))

    def highwater(self, partition: TopicPartition) -> int | None:
        """The last high watermark seen for ``partition`` in a fetch (None before the first)."""
        return self._io.call(self._core.highwater, partition)

    def pause(self, *partitions: TopicPartition) -> None:
        """Stop returning and fetching records of these partitions until ``resume``."""
        self._io.call(self._core.pause, *partitions)

    def resume(self, *partitions: TopicPartition) -> None:
        """Return and fetch records of these partitions again."""
        self._io.call(self._core.resume, *partitions)

    def paused(self) -> set[TopicPartition]:
        """The partitions paused with ``pause``."""
        return self._io.call(self._core.paused)

    def metrics(self) -> dict[str, float]:
        """The gateways' throttling of this consumer's fetches (see ``AsyncConsumer.metrics``)."""
        return self._io.call(self._core.metrics)

    def offsets_for_times(
        self, timestamps: dict[TopicPartition, int]
    ) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given ms (None if none is)."""
        return self._run(self._core.offsets_for_times(timestamps))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return self._run(self._core.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after the last record of each partition: the high watermark, or with
        ``isolation_level="read_committed"`` the last stable offset (Kafka's rule)."""
        return self._run(self._core.end_offsets(list(partitions)))

    def topics(self) -> set[str]:
        """Every topic in the cluster."""
        return self._run(self._core.topics())

    def partitions_for_topic(self, topic: str) -> set[int]:
        """The topic's partition numbers; UnknownTopicOrPartitionError if it does not exist."""
        return self._run(self._core.partitions_for_topic(topic))

    def __iter__(self) -> Consumer:
        return self

    def __next__(self) -> ConsumerRecord:
        """Next record; stops after ``consumer_timeout_ms`` without one (never, by default)."""
        timeout = self.config.consumer_timeout_ms
        deadline = self._core._client.clock.monotonic() + timeout / 1000.0
        while not self._iter_buffer:
            remaining = deadline - self._core._client.clock.monotonic()
            if remaining <= 0:
                raise StopIteration
            for records in self.poll(timeout_ms=int(min(remaining * 1000, 1000))).values():
                self._iter_buffer.extend(records)
        return self._iter_buffer.popleft()

    def close(self) -> None:
        """Commit (with ``enable_auto_commit``), give the partitions up, leave the group (unless
        static), stop fetching and release the connections and the I/O thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run_here(self._core.stop())
        finally:
            self._io.stop()
