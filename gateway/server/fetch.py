"""Fetch: read partitions from their leaders' fetch ports, as one Kafka-style long poll.

One request is served in two phases:

1. every partition is read once, concurrently, without waiting (``max_wait_ms=0`` on the node);
   the answers are applied in request order, so which partition may exceed the response's
   ``max_bytes`` with its first batch does not depend on timing. When that read is a single
   request (every partition led by one node), it is the long poll itself: the node answers at
   once with what it has (the same answer), else at the first append (no second round trip),
   and an answer with nothing ends the fetch (the node's wait ended), as in phase 2;
2. unless that already satisfies the request -- at least ``min_bytes`` gathered, an error to
   report, or nothing left to read -- each partition with room left long-polls its node
   (``min_bytes=1``, ``max_wait_ms`` = time left) and is re-polled from its new offset each
   time it brings data, until the gathered total reaches ``min_bytes`` or the time is up. Polls
   still open then are cancelled (their connections are closed, not reused).

A partition whose read fails with a retriable error (its node is gone, NOT_LEADER_OR_FOLLOWER)
is retried at once only when a metadata refresh names a different leader address (or once on a
fresh connection when a pooled one turned out dead); otherwise the error is reported for that
partition, as a Kafka broker does, and the client retries. An error
on any partition ends the long poll early (Kafka answers errors at once).

A fetch session's incremental fetch (raw data protocol version 3, :meth:`FetchHandler.fetch_news`)
carries what the client knows of each partition (``PartitionFetch.known_*``); the reads then use
the fetch port's sparse frames (version 3, :mod:`services.fetchport.multi`), in which the node
leaves out every partition with nothing new, and such a partition gets no result at all. A node
that does not speak version 3 is asked in version 1.

The bytes come from the node's fetch port (``os.sendfile`` on the node) and are trimmed and,
unless ``raw_batches`` is set, decoded here (see :mod:`gateway.server.fetch_assembly`): on the decode
pool's threads, never on the event loop, within the answer's decode budget (see
:mod:`gateway.server.decode_pool`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import NamedTuple

from gateway.server.cluster_snapshot import PartitionRoute
from gateway.server.decode_pool import DecodePool
from gateway.server.fetch_assembly import DecodeBudget, PartitionData, TypedBatch, decode_typed, take_batches
from gateway.server.routing import Router
from services import errors
from services.broker_address import BrokerAddress
from services.fetchport import multi
from services.fetchport.protocol import FetchResponseHeader
from services.records.aborted import AbortedTransactionFilter

log = logging.getLogger(__name__)

#: Kafka's consumer default max.partition.fetch.bytes.
DEFAULT_PARTITION_MAX_BYTES = 1 << 20
#: A request's max_bytes when it sets none: gRPC clients in every language refuse answers over
#: 4 MiB unless told otherwise, so a default request gets a default-sized answer (Kafka's own
#: fetch.max.bytes, 50 MiB, would not fit). The MiB left is room for the per-partition entries
#: and the estimate's slack. Clients that raise their receive limit ask for more (the SDK does).
DEFAULT_TOTAL_MAX_BYTES = 3 << 20
#: Cap on a long poll, so a typo cannot park a connection for days.
MAX_WAIT_CAP_MS = 300_000
#: How long past the deadline to wait for polls the nodes are about to answer (their own
#: max_wait ends at the same moment), so that idle long polls finish instead of being cancelled.
_DEADLINE_GRACE_S = 0.1
_MAX_LEADER_CHASES = 3
#: Partitions per fetch-port request: ~40 bytes each plus the topic, well under the node's 1 MiB
#: request frame bound.
_MAX_GROUP = 2000
_UNANSWERED = errors.UnknownServerError("the fetch was not answered for this partition")
#: Time kept back from the call's deadline to build and send the answer.
_ANSWER_MARGIN_S = 0.2
#: Typed answers decode at most this many records and decompressed bytes (the rest comes in the
#: next fetch): at ~300 bytes of Python objects and protobuf per record, ~30 MiB and ~100 ms of
#: decoding and encoding per answer.
DEFAULT_MAX_DECODED_RECORDS = 100_000
DEFAULT_MAX_DECODED_BYTES = 32 << 20


class PartitionFetch(NamedTuple):
    """One partition of a fetch (a tuple: a wide fetch session builds hundreds per request)."""

    topic: str
    partition: int
    offset: int
    max_bytes: int = DEFAULT_PARTITION_MAX_BYTES
    #: What the client was last told of the partition (a fetch session's): its high watermark
    #: (read_committed: last stable offset) and log start offset; -1 = nothing. With them the
    #: storage node leaves the partition out of its answer while nothing changed (fetch port
    #: version 3), and the result carries them back.
    known_high_watermark: int = -1
    known_log_start_offset: int = -1


@dataclass(frozen=True, slots=True)
class FetchCommand:
    partitions: tuple[PartitionFetch, ...]
    min_bytes: int = 0
    max_wait_ms: int = 0
    max_bytes: int = DEFAULT_TOTAL_MAX_BYTES
    raw_batches: bool = False
    #: Only records below the last stable offset, none of an aborted transaction.
    read_committed: bool = False


class FetchedPartition(NamedTuple):
    """One partition's result. (A tuple: a wide fetch session makes one for every partition
    with news, and a frozen dataclass's construction cost more than the partition's share of
    the fetch.)"""

    topic: str
    partition: int
    error: errors.TributaryError | None
    high_watermark: int
    log_start_offset: int
    next_offset: int
    #: Typed results (``raw_batches`` false): records per batch, with the batch's timestamp type.
    batches: list[TypedBatch]
    #: Raw results (``raw_batches`` true): the batches as the node sent them.
    raw: bytes = b""
    #: read_committed: the last stable offset, and (raw results) the aborted transactions
    #: overlapping the batches, as (producer id, first offset).
    last_stable_offset: int = -1
    aborted: tuple[tuple[int, int], ...] = ()


class NewsRead(NamedTuple):
    """What :meth:`FetchHandler.read_news` read: ``fetch_news``'s results, and whether the read
    met its request -- ``min_bytes`` gathered, an error to report, or nothing left it could
    read -- rather than ending because its wait ran out."""

    results: list[FetchedPartition | None]
    satisfied: bool


def ensure_valid_fetch(command: FetchCommand) -> None:
    """Raise INVALID_REQUEST for requests that cannot be served at all."""
    if command.min_bytes < 0 or command.max_wait_ms < 0 or command.max_bytes < 0:
        raise errors.InvalidRequestError("min_bytes, max_wait_ms and max_bytes must not be negative")
    seen: set[tuple[str, int]] = set()
    for p in command.partitions:
        if p.partition < 0 or p.max_bytes < 0:
            raise errors.InvalidRequestError(
                f"{p.topic}-{p.partition}: partition and max_bytes must not be negative"
            )
        if (p.topic, p.partition) in seen:
            raise errors.InvalidRequestError(f"{p.topic}-{p.partition} appears twice in the fetch request")
        seen.add((p.topic, p.partition))


@dataclass(frozen=True, slots=True)
class _Poll:
    header: FetchResponseHeader | None = None
    records: bytes = b""
    error: errors.TributaryError | None = None
    aborted: tuple[tuple[int, int], ...] = ()


#: A partition the node left out of a sparse answer: nothing new (no header, no error).
_QUIET = _Poll()


class FetchHandler:
    """Serves fetch requests through the router's fetch-port clients."""

    def __init__(
        self,
        router: Router,
        decode_pool: DecodePool,
        *,
        max_decoded_records: int = DEFAULT_MAX_DECODED_RECORDS,
        max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES,
        telemetry=None,
    ) -> None:
        self._router = router
        self._decode_pool = decode_pool
        self._max_decoded_records = max_decoded_records
        self._max_decoded_bytes = max_decoded_bytes
        #: GatewayInstruments when telemetry is on (bytes and records out, fetch-port spans).
        self._telemetry = telemetry

    async def fetch(
        self, command: FetchCommand, *, rpc_remaining_s: float | None = None
    ) -> list[FetchedPartition]:
        """One result per requested partition, in request order.

        The long poll ends a little before the call's own deadline, if it has a shorter one, so
        the client gets what was gathered instead of DEADLINE_EXCEEDED.
        """
        ensure_valid_fetch(command)
        wait_s = min(command.max_wait_ms, MAX_WAIT_CAP_MS) / 1000.0
        if rpc_remaining_s is not None:
            # the session may wait _DEADLINE_GRACE_S past its end for the nodes' answers
            wait_s = max(0.0, min(wait_s, rpc_remaining_s - _ANSWER_MARGIN_S - _DEADLINE_GRACE_S))
        session = _FetchSession(
            self._router, command, asyncio.get_running_loop().time() + wait_s, telemetry=self._telemetry
        )
        await session.run()
        if command.raw_batches:
            results = [session.finish_raw(p) for p in session.parts]
        else:
            results = await self._finish_typed(session, command)
        if self._telemetry is not None:
            for part, result in zip(session.parts, results, strict=True):
                self._telemetry.fetched(part.topic, max(0, result.next_offset - part.fetch_offset), part.size)
        return results

    async def fetch_news(self, command: FetchCommand) -> list[FetchedPartition | None]:
        """``fetch`` of raw batches for a fetch session's incremental fetch: None for each
        partition that brought nothing the client does not know (every read of it found it
        quiet: no records, no error, the ``known_*`` offsets its ``PartitionFetch`` carries).
        Most partitions of a wide session are such, and cost no result at all."""
        return (await self.read_news(command)).results

    async def read_news(self, command: FetchCommand) -> NewsRead:
        """``fetch_news``, saying also whether the read met the request (see :class:`NewsRead`)."""
        # (no ensure_valid_fetch: a session's partitions are checked as they join it)
        if not command.raw_batches:
            raise ValueError("fetch_news serves raw batches only")
        wait_s = min(command.max_wait_ms, MAX_WAIT_CAP_MS) / 1000.0
        session = _FetchSession(
            self._router, command, asyncio.get_running_loop().time() + wait_s, telemetry=self._telemetry
        )
        await session.run()
        results: list[FetchedPartition | None] = [None] * len(command.partitions)
        for i in session.news:
            results[i] = session.finish_raw(session.part(i))
        if self._telemetry is not None:
            for i in session.news:
                part, result = session.part(i), results[i]
                assert result is not None
                self._telemetry.fetched(part.topic, max(0, result.next_offset - part.fetch_offset), part.size)
        return NewsRead(results, session.satisfied())

    async def _finish_typed(self, session: _FetchSession, command: FetchCommand) -> list[FetchedPartition]:
        # max_bytes bounds the answer, typed records included (decoded they can be far
        # larger than the batches read).
        budget = DecodeBudget(
            max_records=self._max_decoded_records,
            max_bytes=min(self._max_decoded_bytes, command.max_bytes),
        )
        results = await self._decode_pool.run(session.finish_typed, budget)
        self._decode_pool.account(budget.records, budget.payload_bytes)
        return results


class _FetchSession:
    """The state of one fetch request while it is being served."""

    def __init__(self, router: Router, command: FetchCommand, deadline: float, *, telemetry=None) -> None:
        self._router = router
        self._telemetry = telemetry
        self._command = command
        self._asked = command.partitions
        self._deadline = deadline
        #: What was gathered per partition, made when a read first brings it something (a wide
        #: fetch session's incremental fetch finds most partitions quiet: they never get one).
        self._parts: list[PartitionData | None] = [None] * len(command.partitions)
        self._exhausted: set[int] = set()
        self._total = 0
        #: Partitions whose error is set.
        self._errors = 0
        #: Partitions some read found other than quiet (see ``FetchHandler.fetch_news``).
        self.news: set[int] = set()

    def part(self, index: int) -> PartitionData:
        """What was gathered for the partition ``index`` (made on first use)."""
        part = self._parts[index]
        if part is None:
            p = self._asked[index]
            part = self._parts[index] = PartitionData(p.topic, p.partition, p.offset, p.max_bytes)
        return part

    @property
    def parts(self) -> list[PartitionData]:
        """What was gathered for every partition, in request order."""
        return [self.part(i) for i in range(len(self._parts))]

    @property
    def _total_room(self) -> int:
        return self._command.max_bytes - self._total

    async def run(self) -> None:
        polls, waited = await self._poll_now(range(len(self._parts)))
        kept = 0
        for index, poll in enumerate(polls):
            # (a quiet partition's first poll leaves nothing to apply: most of a wide session's)
            if poll is not _QUIET:
                kept += self._apply(index, poll)
        # A first read that was the long poll and brought nothing ended with the node's wait (or
        # an error): polling again would only wait out the crumbs of the deadline.
        if not self.satisfied() and (kept or not waited):
            await self._long_poll()

    async def _poll_now(self, indexes: range) -> tuple[list[_Poll], bool]:
        """Read the partitions once, one request per leader node (see ``_groups``), without
        waiting unless that is a single request; the polls, and whether they waited."""
        asked = self._asked
        for topic in dict.fromkeys(asked[i].topic for i in indexes):
            try:
                await self._router.topic(topic)  # refreshes once for a topic the cache does not know
            except errors.TributaryError:
                pass  # every partition of it gets the error from its own poll below
        polls: list[_Poll | None] = [None] * len(self._parts)
        groups, alone = self._groups(indexes)
        # A fetch that takes one request (every partition on one node, the usual case) sends it
        # as the long poll: the node answers at once with what it has, as the read without
        # waiting would, and otherwise when the first records arrive -- one round trip to the
        # node instead of two whenever the fetch finds nothing yet, and an append reaches a
        # waiting consumer without the gateway in between.
        wait = len(groups) + len(alone) == 1 and self._command.min_bytes > 0
        tasks = [self._poll_group(node, group, long_poll=wait) for node, group in groups]
        tasks += [self._poll_one(index, long_poll=wait) for index in alone]
        # (one request is awaited as it is: a task for it would cost a loop turn on the way out)
        answers = [await tasks[0]] if len(tasks) == 1 else await asyncio.gather(*tasks)
        for answer in answers:
            for index, poll in answer.items():
                polls[index] = poll
        return [poll if poll is not None else _Poll(error=_UNANSWERED) for poll in polls], wait

    def _can_poll(self, index: int) -> bool:
        part = self._parts[index]
        if part is None:  # nothing read yet
            return self._asked[index].max_bytes > 0 and self._total_room > 0
        return part.error is None and index not in self._exhausted and part.room > 0 and self._total_room > 0

    def satisfied(self) -> bool:
        """The request is met: ``min_bytes`` gathered, an error to report, or nothing left to read."""
        if self._errors:
            return True
        if self._total >= self._command.min_bytes:
            return True
        return not any(self._can_poll(i) for i in range(len(self._parts)))

    def _fail(self, part: PartitionData, error: errors.TributaryError) -> None:
        if part.error is None:
            self._errors += 1
        part.error = error

    def _apply(self, index: int, poll: _Poll) -> int:
        """Add a poll's bytes to the partition; returns the bytes kept."""
        if poll is _QUIET:
            quiet = self._parts[index]
            if quiet is not None:  # (one never read stays unmade: it has nothing to say)
                known = self._asked[index]
                quiet.high_watermark = known.known_high_watermark
                quiet.log_start_offset = known.known_log_start_offset
            return 0
        part = self.part(index)
        self.news.add(index)
        if poll.error is not None:
            if part.size:
                # Deliver what was read; the error shows on the next fetch from the new offset.
                self._exhausted.add(index)
            else:
                self._fail(part, poll.error)
            return 0
        header = poll.header
        assert header is not None, "a poll without an error has a header"
        part.high_watermark = header.high_watermark
        part.log_start_offset = header.log_start_offset
        part.add_aborted(poll.aborted)
        taken = take_batches(
            poll.records,
            fetch_offset=part.next_offset,
            high_watermark=header.high_watermark,
            partition_room=part.room,
            total_room=self._total_room,
            partition_empty=part.size == 0,
            response_empty=self._total == 0,
        )
        if taken.error is not None and part.size == 0:
            self._fail(part, taken.error)
        part.add(poll.records, taken)
        self._total += taken.length
        if taken.length < len(poll.records):
            # Trimmed (budget full, high watermark, corrupt tail): polling again within this
            # request would only bring the same bytes back.
            self._exhausted.add(index)
        return taken.length

    async def _long_poll(self) -> None:
        tasks: dict[asyncio.Future, list[int]] = {}
        self._launch(tasks, range(len(self._parts)))
        try:
            while tasks:
                timeout = self._deadline + _DEADLINE_GRACE_S - asyncio.get_running_loop().time()
                done, _ = await asyncio.wait(
                    tasks, timeout=max(timeout, 0), return_when=asyncio.FIRST_COMPLETED
                )
                if not done:
                    break
                # Only a poll that brought data is renewed: an empty early answer (the node's own
                # wait ended) would otherwise turn into a busy loop.
                renew = self._apply_done(tasks, done)
                if self.satisfied():
                    break
                self._launch(tasks, renew)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _launch(self, tasks: dict[asyncio.Future, list[int]], indexes) -> None:
        """Start long polls for the partitions that can still bring data before the deadline:
        one request per leader node for its partitions, so a fetch of hundreds of partitions
        costs a request per node, not per partition."""
        if self._deadline - asyncio.get_running_loop().time() <= 0.001:
            return
        groups, alone = self._groups([i for i in indexes if self._can_poll(i)])
        for node, group in groups:
            tasks[asyncio.ensure_future(self._poll_group(node, group, long_poll=True))] = group
        for index in alone:
            tasks[asyncio.ensure_future(self._poll_one(index, long_poll=True))] = [index]

    def _apply_done(self, tasks: dict[asyncio.Future, list[int]], done) -> list[int]:
        """Apply finished polls; the partitions to poll again. A poll that brought data is
        renewed for all of its partitions: a node answers a group as soon as one of them has
        data, and the others must go on being watched. One that brought none is not (the node's
        own wait ended, or an error): renewing it would turn into a busy loop."""
        renew: list[int] = []
        for task in done:
            group = tasks.pop(task)
            kept = [self._apply(index, poll) for index, poll in task.result().items()]
            if any(kept):
                renew.extend(group)
        return renew

    def _groups(self, indexes) -> tuple[list[tuple[BrokerAddress, list[int]]], list[int]]:
        """The partitions by the leader the metadata names now, in chunks of at most
        ``_MAX_GROUP`` (a node's request frame is bounded); a partition whose leader is unknown
        here goes alone (its poll refreshes the metadata and reports the error), and so does one
        led by a node that refused version-1 frames."""
        by_node: dict[BrokerAddress, list[int]] = {}
        alone = []
        snapshot = self._router.snapshot
        speaks_multi: dict[BrokerAddress, bool] = {}
        asked = self._asked
        # Consecutive partitions mostly share a leader: its group is looked up once per run (an
        # address's hash is a dataclass's, computed on every lookup).
        last: BrokerAddress | None = None
        members: list[int] | None = None
        # A run of one topic's partitions looks its routes up once; a partition without a usable
        # route takes ``ensure_leader``'s way, which names the error.
        nodes, topics = snapshot.nodes, snapshot.topics
        routes_of: str | None = None
        routes: tuple[PartitionRoute, ...] = ()
        for index in indexes:
            part = asked[index]
            topic, number = part.topic, part.partition
            if topic != routes_of:
                known = topics.get(topic)
                routes_of, routes = topic, known.partitions if known is not None else ()
            route = routes[number] if 0 <= number < len(routes) else None
            node = nodes.get(route.leader) if route is not None and route.error is None else None
            if node is None:
                try:
                    node = snapshot.ensure_leader(topic, number)
                except errors.TributaryError:
                    alone.append(index)
                    continue
            if node is not last:
                multi_ok = speaks_multi.get(node)
                if multi_ok is None:
                    multi_ok = speaks_multi[node] = self._router.clients.fetcher(node).speaks_multi
                last, members = node, by_node.setdefault(node, []) if multi_ok else None
            if members is None:
                alone.append(index)
            else:
                members.append(index)
        groups = [
            (node, members[i : i + _MAX_GROUP])
            for node, members in by_node.items()
            for i in range(0, len(members), _MAX_GROUP)
        ]
        return groups, alone

    async def _poll_group(
        self, node: BrokerAddress, group: list[int], *, long_poll: bool
    ) -> dict[int, _Poll]:
        """Read ``group`` (partitions led by ``node``) in one request. A partition that fails
        with a retriable error, or all of them when the request fails, is polled again on its
        own, which chases a moved leader (and retries once on a fresh connection)."""
        if len(group) == 1:
            return await self._poll_one(group[0], long_poll=long_poll)
        try:
            results = await self._read_many_retried(node, group, long_poll)
        except errors.UnsupportedVersionError:
            # An older node: one request per partition, as before version 1 existed.
            answers = await asyncio.gather(*(self._poll_one(i, long_poll=long_poll) for i in group))
            return {index: poll for answer in answers for index, poll in answer.items()}
        except errors.TributaryError as exc:
            # The node is unreachable: only the partitions the refreshed metadata gives to
            # another leader are polled on their own; the others get the error at once (the
            # client retries), instead of a connection attempt each.
            moved = await self._moved_elsewhere(group, node)
            polls = {index: _Poll(error=exc) for index in group if index not in moved}
            for answer in await asyncio.gather(*(self._poll_one(i, long_poll=False) for i in moved)):
                polls.update(answer)
            return polls
        polls = {}
        again = []
        for index, result in zip(group, results, strict=True):
            if result is None:
                polls[index] = _QUIET
                continue
            error = result.header.error()
            if error is None:
                polls[index] = _Poll(result.header, result.records, aborted=result.aborted)
            elif not error.retriable:
                polls[index] = _Poll(error=error)
            else:
                again.append(index)
        if again:
            # Not long-polled again: the first of them to answer ends this poll.
            for answer in await asyncio.gather(*(self._poll_one(i, long_poll=False) for i in again)):
                polls.update(answer)
        return polls

    async def _read_many_retried(self, node: BrokerAddress, group: list[int], long_poll: bool):
        """``_read_many``, once more on a fresh connection when a pooled one turned out dead
        (the node restarted on the same address)."""
        try:
            return await self._read_many(node, group, self._wait_ms(long_poll))
        except errors.NetworkError:
            return await self._read_many(node, group, self._wait_ms(long_poll))

    async def _moved_elsewhere(self, group: list[int], node: BrokerAddress) -> list[int]:
        """The partitions of ``group`` that a metadata refresh gives to a leader other than
        ``node``."""
        snapshot = await self._router.refresh()
        moved = []
        for index in group:
            part = self._asked[index]
            try:
                if snapshot.ensure_leader(part.topic, part.partition) != node:
                    moved.append(index)
            except errors.TributaryError:
                pass
        return moved

    async def _poll_one(self, index: int, *, long_poll: bool) -> dict[int, _Poll]:
        return {index: await self._poll(index, long_poll=long_poll)}

    def _wait_ms(self, long_poll: bool) -> int:
        if not long_poll:
            return 0
        return max(0, int((self._deadline - asyncio.get_running_loop().time()) * 1000))

    async def _poll(self, index: int, *, long_poll: bool) -> _Poll:
        part = self.part(index)
        node: BrokerAddress | None = None
        reconnected = False
        for _ in range(_MAX_LEADER_CHASES):
            try:
                node = await self._leader(part.topic, part.partition)
                result = await self._read(node, part, self._wait_ms(long_poll))
                error = result.header.error()
                if error is None:
                    return _Poll(result.header, result.records, aborted=result.aborted)
            except errors.NetworkError as exc:
                # A pooled connection the node dropped (it restarted on the same address): the
                # client has closed it, so one more try goes out on a fresh connection.
                error = exc
                if not reconnected:
                    reconnected = True
                    continue
            except errors.TributaryError as exc:
                error = exc
            if not error.retriable or not await self._leader_changed(part.topic, part.partition, node):
                return _Poll(error=error)
        return _Poll(error=error)

    async def _read_many(self, node: BrokerAddress, group: list[int], wait_ms: int):
        """One fetch-port request for the partitions ``group`` on ``node``: a sparse one (None
        for each partition left out) when the client knows some of them (a fetch session)."""
        room = self._total_room
        parts, asked = self._parts, self._asked
        sparse = False
        fetches: list[multi.PartitionFetch] = []
        append, new, entry, no_epoch = fetches.append, tuple.__new__, multi.PartitionFetch, multi.NO_EPOCH
        for i in group:  # (a wide session's every fetch runs this for each partition: kept lean)
            # (unpacked as the tuple it is: faster than its named fields)
            topic, number, next_offset, part_room, known_hw, known_start = asked[i]
            part = parts[i]
            if part is not None:  # read before in this request: from where that read ended
                if part.next_offset != part.fetch_offset:
                    # What the client knows holds only until this request brings it something new.
                    known_hw = known_start = -1
                next_offset, part_room = part.next_offset, part.max_bytes - part.size
            if known_hw >= 0:
                sparse = True
            append(
                new(
                    entry,
                    (
                        topic,
                        number,
                        next_offset,
                        part_room if 0 < part_room <= room else max(1, min(part_room, room)),
                        no_epoch,
                        no_epoch,
                        known_hw,
                        known_start,
                    ),
                )
            )
        fetcher = self._router.clients.fetcher(node)
        read = (fetcher.fetch_many_sparse if sparse else fetcher.fetch_many)(
            fetches,
            max_bytes=max(1, room),
            min_bytes=1,
            max_wait_ms=wait_ms,
            read_committed=self._command.read_committed,
        )
        if self._telemetry is None:
            return await read
        span = self._telemetry.start_fetch_port_read_many(
            [(f.topic, f.partition) for f in fetches], node.host, node.fetch_port
        )
        try:
            results = await read
        except BaseException as exc:
            self._telemetry.end_fetch_port_read(span, 0, exc)
            raise
        self._telemetry.end_fetch_port_read(span, sum(len(r.records) for r in results if r is not None), None)
        return results

    async def _read(self, node: BrokerAddress, part: PartitionData, wait_ms: int):
        """One fetch-port request for ``part`` (inside a CLIENT span when tracing)."""
        read = self._router.clients.fetcher(node).fetch(
            part.topic,
            part.partition,
            part.next_offset,
            max_bytes=max(1, min(part.room, self._total_room)),
            min_bytes=1,
            max_wait_ms=wait_ms,
            read_committed=self._command.read_committed,
        )
        if self._telemetry is None:
            return await read
        span = self._telemetry.start_fetch_port_read(part.topic, part.partition, node.host, node.fetch_port)
        try:
            result = await read
        except BaseException as exc:
            self._telemetry.end_fetch_port_read(span, 0, exc)
            raise
        self._telemetry.end_fetch_port_read(span, len(result.records), result.header.error())
        return result

    async def _leader(self, topic: str, partition: int) -> BrokerAddress:
        await self._router.topic(topic)  # refreshes once for a topic the cache does not know
        return self._router.snapshot.ensure_leader(topic, partition)

    async def _leader_changed(self, topic: str, partition: int, node: BrokerAddress | None) -> bool:
        """Refresh the metadata; True when it now names another (reachable) leader address."""
        snapshot = await self._router.refresh()
        try:
            return snapshot.ensure_leader(topic, partition) != node
        except errors.TributaryError:
            return False

    def finish_raw(self, part: PartitionData) -> FetchedPartition:
        """The partition's result as the batches the node sent."""
        raw = part.raw()
        next_offset = part.fetch_offset if part.error is not None and not raw else part.next_offset
        return self._result(part, part.error, next_offset, [], raw)

    def finish_typed(self, budget: DecodeBudget) -> list[FetchedPartition]:
        """Every partition's decoded records, in request order, within ``budget``. Runs on a
        decode pool thread: it reads the parts, which the loop no longer touches."""
        results = []
        for part in self.parts:
            if part.error is not None or not part.chunks:
                results.append(self._result(part, part.error, part.fetch_offset))
                continue
            decoded = decode_typed(
                part.chunks,
                topic=part.topic,
                partition=part.partition,
                fetch_offset=part.fetch_offset,
                budget=budget,
                aborted=AbortedTransactionFilter(part.aborted) if self._command.read_committed else None,
            )
            if decoded.error is not None:
                log.warning("corrupt batch fetched from %s-%d: %s", part.topic, part.partition, decoded.error)
            results.append(self._result(part, decoded.error, decoded.next_offset, decoded.batches))
        return results

    def _result(
        self,
        part: PartitionData,
        error: errors.TributaryError | None,
        next_offset: int,
        batches: list[TypedBatch] | None = None,
        raw: bytes = b"",
    ) -> FetchedPartition:
        committed = self._command.read_committed
        return FetchedPartition(
            part.topic,
            part.partition,
            error,
            part.high_watermark,
            part.log_start_offset,
            next_offset,
            batches or [],
            raw,
            # the node bounds a read_committed read by the last stable offset, carried as the
            # answer's high watermark (FetchResult)
            part.high_watermark if committed else -1,
            tuple(sorted(part.aborted, key=lambda a: a[1])) if committed and raw else (),
        )
