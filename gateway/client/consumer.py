"""The consumer: ``AsyncConsumer`` (asyncio) and ``Consumer`` (threads) over one core.

Usage, kafka-python style::

    consumer = Consumer(servers="127.0.0.1:9092", auto_offset_reset="earliest")
    consumer.assign([TopicPartition("activity", 0), TopicPartition("activity", 1)])
    for tp, records in consumer.poll(timeout_ms=1000).items():
        for record in records:
            print(record.offset, record.key, record.value)
    consumer.close()

and aiokafka style (``async for record in consumer``, ``await consumer.getmany(...)``).

Records are fetched as raw RecordBatch v2 bytes and decoded here, in the client: compression is
end to end. A background fetch routine keeps the next chunk of every partition on its way while
the application processes the current one (see :mod:`gateway.client.fetcher`).

Partitions are assigned manually for now (``assign``); consumer groups (``group_id``,
``subscribe``, ``commit``) arrive with the group coordinator, and the subscription state already
distinguishes manual from group-managed assignment for them.

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
``consumer_timeout_ms``       forever      iteration stops after this long without records
============================= ============ ===============================================
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.client.client import GatewayClient, list_offsets
from gateway.client.errors import IllegalStateError, TributaryError
from gateway.client.fetcher import Fetcher
from gateway.client.io_thread import IOThread
from gateway.client.serialization import Deserializer
from gateway.client.structs import ConsumerRecord, OffsetAndTimestamp, TopicPartition
from gateway.client.subscription import SubscriptionState, validate_reset_strategy
from services.clock import SYSTEM_CLOCK, Clock

GROUPS_NOT_YET = "consumer groups (group_id/subscribe/commit) arrive with the group coordinator; use assign()"


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
    request_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    metadata_max_age_ms: int = 300_000
    consumer_timeout_ms: float = math.inf

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
        if config.max_poll_records <= 0:
            raise ValueError("max_poll_records must be positive")
        return config


def _as_partitions(partitions: Iterable) -> list[TopicPartition]:
    result = []
    for tp in partitions:
        if not isinstance(tp, tuple) or len(tp) != 2 or not isinstance(tp[0], str) or not isinstance(tp[1], int):
            raise TypeError(f"expected TopicPartition(topic, partition), not {tp!r}")
        result.append(TopicPartition(*tp))
    return result


class AsyncConsumer:
    """The asyncio consumer (aiokafka's shape) -- and the core the thread-based one runs.

    Create it inside a running loop; ``start()`` (or ``async with``) connects; ``stop()`` closes.
    Not safe to share between tasks that change its assignment concurrently, like Kafka's.
    """

    def __init__(self, *topics: str, servers: str | Sequence[str] | None = None, clock: Clock = SYSTEM_CLOCK,
                 **settings: Any) -> None:
        if topics:
            raise NotImplementedError(GROUPS_NOT_YET)
        self.config = ConsumerConfig.from_kwargs({"servers": servers, **settings})
        self._client = GatewayClient(self.config.servers, request_timeout_ms=self.config.request_timeout_ms,
                                     metadata_max_age_ms=self.config.metadata_max_age_ms,
                                     retry_backoff_ms=self.config.retry_backoff_ms, clock=clock)
        self._subscription = SubscriptionState(self.config.auto_offset_reset)
        c = self.config
        self._fetcher = Fetcher(self._client, self._subscription, fetch_min_bytes=c.fetch_min_bytes,
                                fetch_max_wait_ms=c.fetch_max_wait_ms, fetch_max_bytes=c.fetch_max_bytes,
                                max_partition_fetch_bytes=c.max_partition_fetch_bytes, check_crcs=c.check_crcs,
                                isolation_level=c.isolation_level, retry_backoff_ms=c.retry_backoff_ms,
                                key_deserializer=c.key_deserializer, value_deserializer=c.value_deserializer)
        self._fetch_task: asyncio.Task | None = None
        self._closed = False
        self._iter_buffer: deque[ConsumerRecord] = deque()

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the fetch routine on the running loop (connections open on first use)."""
        if self._closed:
            raise IllegalStateError("the consumer is closed")
        if self._fetch_task is None:
            self._fetch_task = asyncio.get_running_loop().create_task(self._fetcher.run(), name="tributary-fetcher")

    async def __aenter__(self) -> AsyncConsumer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Stop fetching and close the connections."""
        if self._closed:
            return
        self._closed = True
        await self._fetcher.close()
        if self._fetch_task is not None:
            await asyncio.wait({self._fetch_task})
        await self._client.close()

    close = stop

    # -- assignment ------------------------------------------------------------------------

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any previous assignment)."""
        wanted = _as_partitions(partitions)
        for tp in self._subscription.assigned_partitions() - set(wanted):
            self._fetcher.discard(tp)
        self._subscription.assign_from_user(wanted)
        self._fetcher.wakeup(restart_fetch=True)

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned to this consumer."""
        return self._subscription.assigned_partitions()

    def subscribe(self, topics=(), pattern=None, listener=None) -> None:
        """Group-managed subscription: not yet available (consumer groups come next)."""
        raise NotImplementedError(GROUPS_NOT_YET)

    def unsubscribe(self) -> None:
        """Drop the assignment."""
        for tp in self._subscription.assigned_partitions():
            self._fetcher.discard(tp)
        self._subscription.unsubscribe()
        self._fetcher.wakeup(restart_fetch=True)

    async def commit(self, offsets=None) -> None:
        """Commit offsets to the group: not yet available (consumer groups come next)."""
        raise NotImplementedError(GROUPS_NOT_YET)

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
        if position is None:
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
        self._fetcher.wakeup(restart_fetch=True)

    def paused(self) -> set[TopicPartition]:
        """The partitions paused with ``pause``."""
        return self._subscription.paused_partitions()

    # -- offsets lookups -------------------------------------------------------------------

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given ms (None if none is)."""
        results = await self._list_offsets({TopicPartition(*tp): ts for tp, ts in timestamps.items()})
        return {tp: (None if r.offset < 0 else r) for tp, r in results.items()}

    async def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        results = await self._list_offsets({tp: "earliest" for tp in _as_partitions(partitions)})
        return {tp: r.offset for tp, r in results.items()}

    async def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after the last record of each partition (the high watermark)."""
        results = await self._list_offsets({tp: "latest" for tp in _as_partitions(partitions)})
        return {tp: r.offset for tp, r in results.items()}

    async def _list_offsets(self, specs: dict) -> dict[TopicPartition, OffsetAndTimestamp]:
        results = await list_offsets(self._client, specs)
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

    async def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition: whatever is buffered, else waiting up to ``timeout_ms`` for some.

        Raises a partition's pending error (``OffsetOutOfRangeError`` with
        ``auto_offset_reset='none'``, ``UnknownTopicOrPartitionError``, ``CorruptRecordError``)
        when there are no records to return.
        """
        return await self._poll(timeout_ms, max_records, None)

    async def getmany(self, *partitions: TopicPartition, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """aiokafka's name for ``poll``, optionally limited to some assigned ``partitions``."""
        return await self._poll(timeout_ms, max_records, set(_as_partitions(partitions)) if partitions else None)

    async def _poll(self, timeout_ms: int, max_records: int | None,
                    only: set[TopicPartition] | None) -> dict[TopicPartition, list[ConsumerRecord]]:
        if not self._subscription.assigned_partitions():
            raise IllegalStateError("the consumer has no assigned partitions; call assign() first")
        await self.start()
        max_records = max_records or self.config.max_poll_records
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout_ms, 0) / 1000.0
        while True:
            records = self._fetcher.drain(max_records, only)
            remaining = deadline - loop.time()
            if records or remaining <= 0:
                return records
            if only is None:
                await self._fetcher.wait_for_data(remaining)
            else:  # data of other partitions would wake the wait at once: look again shortly
                await asyncio.sleep(min(remaining, 0.01))

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
    """The thread-based consumer (kafka-python's shape); fetching runs on a background thread.

    Like Kafka's, one consumer is meant for one application thread.
    """

    def __init__(self, *topics: str, servers: str | Sequence[str] | None = None, clock: Clock = SYSTEM_CLOCK,
                 **settings: Any) -> None:
        if topics:
            raise NotImplementedError(GROUPS_NOT_YET)
        self._io = IOThread("tributary-consumer")

        async def create() -> AsyncConsumer:
            consumer = AsyncConsumer(servers=servers, clock=clock, **settings)
            await consumer.start()
            return consumer

        try:
            self._core = self._io.run(create())
        except BaseException:
            self._io.stop()
            raise
        self.config = self._core.config
        self._iter_buffer: deque[ConsumerRecord] = deque()
        self._closed = False

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _run(self, coro):
        return self._io.run(coro)

    def assign(self, partitions: Iterable[TopicPartition]) -> None:
        """Read exactly these partitions (replacing any previous assignment)."""
        partitions = list(partitions)
        self._io.call(self._core.assign, partitions)
        self._iter_buffer.clear()

    def assignment(self) -> set[TopicPartition]:
        """The partitions assigned to this consumer."""
        return self._io.call(self._core.assignment)

    def subscribe(self, topics=(), pattern=None, listener=None) -> None:
        """Group-managed subscription: not yet available (consumer groups come next)."""
        raise NotImplementedError(GROUPS_NOT_YET)

    def unsubscribe(self) -> None:
        """Drop the assignment and everything buffered for it."""
        self._io.call(self._core.unsubscribe)
        self._iter_buffer.clear()

    def commit(self, offsets=None) -> None:
        """Commit offsets to the group: not yet available (consumer groups come next)."""
        raise NotImplementedError(GROUPS_NOT_YET)

    def poll(self, timeout_ms: int = 0, max_records: int | None = None) -> dict[TopicPartition, list[ConsumerRecord]]:
        """Records by partition (see ``AsyncConsumer.poll``); blocks up to ``timeout_ms``."""
        return self._run(self._core.poll(timeout_ms, max_records))

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

    def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[TopicPartition, OffsetAndTimestamp | None]:
        """Per partition, the first offset whose timestamp is >= the given ms (None if none is)."""
        return self._run(self._core.offsets_for_times(timestamps))

    def beginning_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The log start offset of each partition."""
        return self._run(self._core.beginning_offsets(list(partitions)))

    def end_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The offset after the last record of each partition (the high watermark)."""
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
        """Stop fetching and release the connections and the I/O thread."""
        if self._closed:
            return
        self._closed = True
        try:
            self._run(self._core.stop())
        finally:
            self._io.stop()
