"""Replica fetchers: followers copying their leaders' logs over the leaders' fetch ports.

One :class:`ReplicaFetcher` per leader node carries every partition this node follows from it
(Kafka's ``ReplicaFetcherThread``), over one connection, with multi-partition fetches
(``services/fetchport/multi.py``) that long-poll at the leader while the follower is caught up --
an idle follower costs one parked request. For each partition the fetch says where the follower's
log ends and the epoch of its last batch; the leader answers with:

* records: appended byte for byte (``PartitionLog.append_replicated``), then the follower's high
  watermark becomes the leader's (bounded by its own log end);
* a diverging epoch: the follower's history parts from the leader's; it truncates where the
  rules say (``rules.truncation_for_divergence``) and fetches again from there;
* OFFSET_OUT_OF_RANGE: below the leader's log start the follower restarts its log there; past the
  leader's log end (an unclean election) it truncates to it;
* NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH and the like: the partition
  pauses for ``replica.fetch.backoff.ms``; the controller's next state moves it.

A connection failure pauses the whole fetcher for the backoff and reconnects. Responses for a
partition whose leader epoch changed while the fetch was out are dropped. With internal TLS the
connection is TLS, the node presenting its member certificate (a leader requiring mutual TLS
refuses a follower without one: its fetches fail and are retried like any connection failure).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from services import errors
from services.broker_address import BrokerAddress
from services.clock import Clock
from services.correlation_ids import correlation_ids
from services.fetchport import multi
from services.fetchport.protocol import MAX_RESPONSE_FRAME, SIZE
from services.tls import ReloadingClientContext
from storage_node.log.leader_epochs import EpochEndOffset
from storage_node.replication import rules
from storage_node.replication.manager import ReplicationSettings
from storage_node.replication.partition import Partition
from storage_node.replication.throttle import CopyThrottle

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Target:
    """A partition this fetcher copies, and when it may be fetched again after an error."""

    replica: Partition
    leader_epoch: int
    paused_until_ms: int = 0


class ReplicaFetcher:
    """Copies the partitions this node follows from one leader. See the module docstring."""

    def __init__(
        self,
        node_id: int,
        leader: BrokerAddress,
        settings: ReplicationSettings,
        clock: Clock,
        throttle: CopyThrottle | None = None,
        ssl: ReloadingClientContext | None = None,
    ) -> None:
        self.node_id = node_id
        #: TLS to the leader's fetch port (the node's member certificate); None: plaintext.
        self._ssl = ssl
        self.throttle = throttle or CopyThrottle(clock.time_ms())
        #: How long to sleep when no partition may be fetched now.
        self._idle_s = settings.replica_fetch_backoff_ms / 1000
        self.leader = leader
        self.settings = settings
        self.clock = clock
        self._targets: dict[tuple[str, int], _Target] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._connection: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation = correlation_ids()
        self.bytes_fetched = 0

    # ---- membership ------------------------------------------------------------------------------

    def add(self, replica: Partition) -> None:
        self._targets[replica.key] = _Target(replica, replica.leader_epoch)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"replica-fetcher-{self.leader.node_id}")

    def remove(self, key: tuple[str, int]) -> None:
        self._targets.pop(key, None)

    def __len__(self) -> int:
        return len(self._targets)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._disconnect()

    # ---- the loop --------------------------------------------------------------------------------

    async def _run(self) -> None:
        backoff = self.settings.replica_fetch_backoff_ms / 1000
        while True:
            request = self._next_request()
            if request is None:
                await self._sleep_until_woken(self._idle_s)
                continue
            try:
                response = await self._round_trip(request)
            except (OSError, asyncio.IncompleteReadError, errors.TributaryError, TimeoutError) as exc:
                log.warning(
                    "fetch from node %d at %s:%d failed (retrying in %.1f s): %r",
                    self.leader.node_id,
                    self.leader.host,
                    self.leader.fetch_port,
                    backoff,
                    exc,
                )
                self._disconnect()
                await asyncio.sleep(backoff)
                continue
            self._process(request, response)

    async def _sleep_until_woken(self, timeout: float) -> None:
        self._wake.clear()
        try:
            async with asyncio.timeout(timeout):
                await self._wake.wait()
        except TimeoutError:
            pass

    def _next_request(self) -> multi.MultiFetchRequest | None:
        now = self.clock.time_ms()
        settings = self.settings
        self._idle_s = settings.replica_fetch_backoff_ms / 1000
        fetches = []
        budget: int | None = None
        for target in self._targets.values():
            if target.paused_until_ms > now:
                continue
            max_bytes = settings.replica_fetch_max_bytes
            rate = self._throttle_rate(target)
            if rate:
                if budget is None:
                    budget = self.throttle.allowance(rate, now)
                if budget <= 0:
                    self._idle_s = min(self._idle_s, max(0.01, self.throttle.wait_s()))
                    continue
                max_bytes = min(max_bytes, budget)
                budget -= max_bytes
            partition_log = target.replica.log
            fetches.append(
                multi.PartitionFetch(
                    partition_log.topic,
                    partition_log.partition,
                    partition_log.log_end_offset,
                    max_bytes,
                    target.leader_epoch,
                    partition_log.latest_epoch,
                )
            )
        if not fetches:
            return None
        max_wait_ms = settings.replica_fetch_wait_max_ms
        if budget is not None and budget <= 0:
            # Throttled partitions were held back: come back when the bucket has refilled.
            max_wait_ms = min(max_wait_ms, int(self.throttle.wait_s() * 1000) + 10)
        return multi.MultiFetchRequest(
            next(self._correlation),
            self.node_id,
            tuple(fetches),
            settings.replica_fetch_response_max_bytes,
            min_bytes=1,
            max_wait_ms=max_wait_ms,
        )

    def _throttle_rate(self, target: _Target) -> int:
        """The copy rate this replica holds to: set while a reassignment is adding it."""
        state = target.replica.state
        if state is None or not state.throttle_bytes_per_s or self.node_id not in state.adding:
            return 0
        if self.node_id in state.isr:
            return 0  # caught up: in-sync replicas are never held back (acks=all waits on them)
        return state.throttle_bytes_per_s

    async def _round_trip(self, request: multi.MultiFetchRequest) -> multi.MultiFetchResponse:
        reader, writer = await self._connect()
        writer.write(multi.encode_request(request))
        await writer.drain()
        # The leader answers within max_wait; a few seconds more for a slow disk or a loaded
        # machine, then it counts as gone (paused, cut off) and the connection is reopened.
        # asyncio.timeout, not wait_for: Python 3.11's wait_for returns the result of a read
        # that completed as the task was cancelled, swallowing the cancellation, and the fetch
        # loop then ran on and held up the node's shutdown for good.
        timeout = request.max_wait_ms / 1000 + 5
        async with asyncio.timeout(timeout):
            (size,) = SIZE.unpack(await reader.readexactly(SIZE.size))
        if size < 0 or size > MAX_RESPONSE_FRAME:
            raise errors.CorruptRecordError(f"fetch response of {size} bytes (at most {MAX_RESPONSE_FRAME})")
        async with asyncio.timeout(timeout):
            body = await reader.readexactly(size)
        response = multi.decode_response_body(body)
        if response.correlation_id != request.correlation_id:
            raise errors.CorruptRecordError(
                f"response for correlation id {response.correlation_id}, expected {request.correlation_id}"
            )
        error = response.error()
        if error is not None:
            raise error
        return response

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._connection is None:
            async with asyncio.timeout(5.0):
                self._connection = await asyncio.open_connection(
                    self.leader.host,
                    self.leader.fetch_port,
                    limit=1 << 20,
                    ssl=self._ssl.context if self._ssl is not None else None,
                    server_hostname=self._ssl.server_hostname(self.leader.host)
                    if self._ssl is not None
                    else None,
                )
        return self._connection

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection[1].close()

    # ---- responses -------------------------------------------------------------------------------

    def _process(self, request: multi.MultiFetchRequest, response: multi.MultiFetchResponse) -> None:
        sent = {(p.topic, p.partition): p for p in request.partitions}
        for data in response.partitions:
            header = data.header
            key = (header.topic, header.partition)
            target = self._targets.get(key)
            fetch = sent.get(key)
            if target is None or fetch is None or target.leader_epoch != fetch.current_leader_epoch:
                continue  # moved or re-epoched while the fetch was out
            try:
                self._process_partition(target, fetch, data)
            except errors.TributaryError as exc:
                self._pause(target, exc)

    def _process_partition(
        self, target: _Target, fetch: multi.PartitionFetch, data: multi.PartitionData
    ) -> None:
        header = data.header
        partition_log = target.replica.log
        if partition_log.log_end_offset != fetch.fetch_offset:
            return  # the log changed meanwhile (truncated by a newer state): ask again
        error = header.error()
        if error is not None:
            self._on_error(target, header, error)
            return
        if header.diverging_epoch >= 0:
            self._truncate_diverged(
                target, EpochEndOffset(header.diverging_epoch, header.diverging_end_offset)
            )
            return
        if data.records:
            partition_log.append_replicated(data.records)
            self.bytes_fetched += len(data.records)
            if self._throttle_rate(target):
                self.throttle.consume(len(data.records))
        partition_log.update_high_watermark(min(header.high_watermark, partition_log.log_end_offset))
        if header.log_start_offset > partition_log.log_start_offset:
            bound = min(header.log_start_offset, partition_log.high_watermark)
            if bound > partition_log.log_start_offset:
                partition_log.delete_records_before(bound)

    def _truncate_diverged(self, target: _Target, answer: EpochEndOffset) -> None:
        partition_log = target.replica.log
        cut = rules.truncation_for_divergence(
            partition_log.leader_epochs, partition_log.log_end_offset, answer
        )
        if cut.offset < partition_log.log_start_offset:
            partition_log.truncate_fully_and_start_at(cut.offset)
        else:
            partition_log.truncate_to(cut.offset)
        log.info(
            "%s diverged from leader %d (epoch %d ends at %d there): truncated to %d",
            partition_log.name,
            self.leader.node_id,
            answer.epoch,
            answer.end_offset,
            partition_log.log_end_offset,
        )

    def _on_error(self, target: _Target, header: multi.PartitionHeader, error: errors.TributaryError) -> None:
        partition_log = target.replica.log
        if isinstance(error, errors.OffsetOutOfRangeError) and header.log_end_offset >= 0:
            fetch_offset = partition_log.log_end_offset
            if fetch_offset < header.log_start_offset:
                log.warning(
                    "%s: offset %d is below leader %d's log start %d: restarting the log there",
                    partition_log.name,
                    fetch_offset,
                    self.leader.node_id,
                    header.log_start_offset,
                )
                partition_log.truncate_fully_and_start_at(header.log_start_offset)
                return
            if fetch_offset > header.log_end_offset:
                log.warning(
                    "%s: offset %d is past leader %d's log end %d (an unclean election): truncating",
                    partition_log.name,
                    fetch_offset,
                    self.leader.node_id,
                    header.log_end_offset,
                )
                if header.log_end_offset < partition_log.log_start_offset:
                    partition_log.truncate_fully_and_start_at(header.log_end_offset)
                else:
                    partition_log.truncate_to(header.log_end_offset)
                return
        self._pause(target, error)

    def _pause(self, target: _Target, error: errors.TributaryError) -> None:
        target.paused_until_ms = self.clock.time_ms() + self.settings.replica_fetch_backoff_ms
        log.info(
            "%s: fetch from leader %d paused for %d ms: %s",
            target.replica.name,
            self.leader.node_id,
            self.settings.replica_fetch_backoff_ms,
            error,
        )


class ReplicaFetchers:
    """Every replica fetcher of this node, one per leader; what follows whom."""

    def __init__(
        self,
        node_id: int,
        settings: ReplicationSettings,
        clock: Clock,
        *,
        ssl: ReloadingClientContext | None = None,
    ) -> None:
        self.node_id = node_id
        self._ssl = ssl
        self.settings = settings
        self.clock = clock
        self._fetchers: dict[BrokerAddress, ReplicaFetcher] = {}
        self._following: dict[tuple[str, int], BrokerAddress] = {}
        #: One reassignment throttle for the node, all leaders together (Kafka's is per broker).
        self.throttle = CopyThrottle(clock.time_ms())

    def follow(self, partition: Partition, leader: BrokerAddress) -> None:
        current = self._following.get(partition.key)
        if current is not None and current != leader:
            self._fetchers[current].remove(partition.key)
        fetcher = self._fetchers.get(leader)
        if fetcher is None:
            fetcher = self._fetchers[leader] = ReplicaFetcher(
                self.node_id, leader, self.settings, self.clock, self.throttle, ssl=self._ssl
            )
        fetcher.add(partition)
        self._following[partition.key] = leader

    def unfollow(self, key: tuple[str, int]) -> None:
        leader = self._following.pop(key, None)
        if leader is not None:
            self._fetchers[leader].remove(key)

    def following(self) -> dict[tuple[str, int], int]:
        """Partition -> the node id of the leader it copies."""
        return {key: endpoint.node_id for key, endpoint in self._following.items()}

    @property
    def bytes_fetched(self) -> int:
        return sum(f.bytes_fetched for f in self._fetchers.values())

    async def stop_idle(self) -> None:
        """Stop fetchers left with nothing to copy."""
        for endpoint, fetcher in list(self._fetchers.items()):
            if not len(fetcher):
                del self._fetchers[endpoint]
                await fetcher.stop()

    async def stop(self) -> None:
        fetchers, self._fetchers = list(self._fetchers.values()), {}
        await asyncio.gather(*(f.stop() for f in fetchers), return_exceptions=True)
