"""An idempotent producer against simulated partition leaders and a faulty ordered stream.

The real ``Sender``, ``RecordAccumulator`` and ``TransactionManager`` (``max_in_flight=5``,
``linger_ms=0``, ``acks='all'``, idempotence on) send to :class:`ChaosStream`, a fake of the
ordered ProduceStream: requests reach the partition leaders in the order they were written, and
their answers come back in that order. Each :class:`SimLeader` checks and records producer
batches with the storage node's own ``ProducerStateManager`` (``check_payload`` / ``update``, as
``PartitionLog.append`` does), so duplicates, sequence gaps and epochs are judged as a node judges
them. Faults, drawn from a seeded RNG per seed:

* the stream breaks before a request reaches the leaders (it and every unanswered request fail
  with a retriable NetworkError; the unanswered ones may have been written: ambiguous);
* an answer is lost after its request was written (the stream breaks right after);
* a partition's entry gets a retriable error and is not written (NOT_LEADER, REQUEST_TIMED_OUT);
* a partition's entry is written and answered REQUEST_TIMED_OUT (the gateway gave up waiting);
* a leader forgets the producer (UNKNOWN_PRODUCER_ID next) -- only while every record the
  producer got written anywhere is settled, as the state expires only for an idle producer (a
  leader that forgot an unsettled write cannot recognise its retry, and no client can help that);
* slow processing and slow answers (so several requests are outstanding at once).

What is checked per seed (``_check``):

* every record acknowledged to the application is in its partition's log exactly once, at the
  offset it was acknowledged with;
* no record is in any log twice, and each log holds only records sent to it;
* per partition, the log holds records in the order the application sent them;
* a record reported failed is in the log only if one of its sends was written by a leader without
  a success answer reaching the producer (a lost or timed-out answer): Kafka's "a failed record
  may have been written" is allowed for exactly those; any other failed record is absent;
* with unlimited retries and a long delivery timeout every record is acknowledged (every fault
  here is retriable: an epoch, sequence or duplicate error reaching the application is a bug);
* never more than ``max_in_flight`` requests of a partition outstanding at once.

Lost producer state and expiry are tried on one partition and on three: with several, an
epoch bump (after either) once renumbered a batch another partition's leader may have written,
which was then written twice (found by this test on 2026-11-25; the step-by-step case is
:func:`test_an_epoch_bump_does_not_renumber_a_batch_another_partition_may_have_written`).

The most requests outstanding at once for one partition is measured at the stream
(:data:`MAX_OUTSTANDING_SEEN`, printed by ``test_the_faults_reach_the_paths_they_are_meant_to``
with ``-s``); with one request in flight per partition it is 1.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter, deque
from dataclasses import dataclass

import pytest

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.futures import FutureRecordMetadata
from gateway.client.metadata import MetadataCache
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.transaction_manager import TransactionManager
from services import errors
from services.clock import SYSTEM_CLOCK
from services.proto import pb
from services.records import iter_batches
from services.serde import error_to_proto
from storage_node.log.producer_replay import batch_facts
from storage_node.log.producer_state import ProducerStateManager

TOPIC = "chaos"
RECORDS = 180
PRODUCER_ID = 4242
MAX_IN_FLIGHT = 5

#: The most requests for one partition outstanding at the stream at once, over every run of this
#: module (reported by the last test; the lead asserts > 1 once pipelining has landed).
MAX_OUTSTANDING_SEEN: Counter[str] = Counter()


@dataclass(frozen=True)
class Faults:
    """Probabilities of the faults (per request, or per partition entry of a request)."""

    break_before: float = 0.04
    lose_answer: float = 0.04
    retriable_error: float = 0.06
    timed_out_after_write: float = 0.05
    lose_state: float = 0.03
    slow: float = 0.3


class Coordinator:
    """InitProducerId as the transaction coordinator answers it: one id, the next epoch (after a
    short, random wait, so that bumps overlap with requests in flight)."""

    def __init__(self, rng: random.Random) -> None:
        self.clock = SYSTEM_CLOCK
        self.metadata = MetadataCache()
        self.request_timeout_ms = 1000
        self.epoch = -1
        self.bumps = 0
        self._rng = rng

    async def call_with_retry(self, method, request, *, max_wait_ms=None):
        assert method == "InitProducerId", method
        await asyncio.sleep(self._rng.random() * 0.002)
        if request.producer_epoch >= 0:
            assert request.producer_epoch == self.epoch, "a bump names the epoch it replaces"
            self.bumps += 1
        self.epoch += 1
        return pb.InitProducerIdResponse(producer_id=PRODUCER_ID, producer_epoch=self.epoch)


class SimLeader:
    """A partition leader's append: the node's producer-state checks, then an in-memory log."""

    def __init__(self, partition: int) -> None:
        self.state = ProducerStateManager(None, f"{TOPIC}-{partition}")
        self.log: list[bytes] = []

    def append(self, data: bytes) -> tuple[int, list[bytes]]:
        """Append one partition entry of a request (one payload, a unit); its first offset and
        the values it wrote (none for a recognised retry). Raises the node's errors."""
        views = list(iter_batches(data))
        facts = [batch_facts(view.header) for view in views]
        duplicate = self.state.check_payload(facts)
        if duplicate is not None:
            return duplicate.first_offset, []
        first = offset = len(self.log)
        written: list[bytes] = []
        for view, fact in zip(views, facts, strict=True):
            values = [bytes(record.value or b"") for record in view.records()]
            written += values
            self.state.update(fact, offset, offset + len(values) - 1)
            offset += len(values)
        self.log += written
        return first, written


@dataclass
class _Request:
    request: pb.ProduceRequest
    future: asyncio.Future
    #: Values the leaders wrote for it (while its answer is on its way: ambiguous if lost).
    written: list[bytes]


class ChaosStream:
    """A fake ordered ProduceStream with seeded faults; see the module docstring."""

    preserves_order = True

    def __init__(self, rng: random.Random, faults: Faults, leaders: list[SimLeader], futures: dict) -> None:
        self._rng = rng
        self._faults = faults
        self._leaders = leaders
        #: Each value's record future (to tell whether a write is settled).
        self._futures = futures
        #: Requests not yet at the leaders, and those processed whose answers are on their way.
        self._to_leaders: deque[_Request] = deque()
        self._unanswered: deque[_Request] = deque()
        self._wake: asyncio.Event | None = None
        self._node: asyncio.Task | None = None
        self._last_answer_at = 0.0
        #: Values some leader wrote without a success answer reaching the producer for that send.
        self.ambiguous: set[bytes] = set()
        #: Values written whose record futures were not yet seen done.
        self._unsettled: set[bytes] = set()
        self.outstanding: Counter[int] = Counter()
        self.max_outstanding = 0
        self.requests = 0
        self.state_losses = 0

    async def send(self, request, timeout_s: float):
        loop = asyncio.get_running_loop()
        if self._node is None:
            self._wake = asyncio.Event()
            self._node = loop.create_task(self._leaders_routine())
        partitions = [entry.partition for entry in request.batches]
        for p in partitions:
            self.outstanding[p] += 1
            self.max_outstanding = max(self.max_outstanding, self.outstanding[p])
        self.requests += 1
        entry = _Request(request, loop.create_future(), [])
        self._to_leaders.append(entry)
        assert self._wake is not None
        self._wake.set()
        try:
            return await entry.future
        finally:
            for p in partitions:
                self.outstanding[p] -= 1

    async def close(self) -> None:
        if self._node is not None:
            self._node.cancel()
            await asyncio.gather(self._node, return_exceptions=True)

    # -- the leaders' side --------------------------------------------------------------------

    async def _leaders_routine(self) -> None:
        assert self._wake is not None
        while True:
            if not self._to_leaders:
                self._wake.clear()
                await self._wake.wait()
                continue
            if self._rng.random() < self._faults.slow:
                await asyncio.sleep(self._rng.random() * 0.003)
                if not self._to_leaders:
                    continue  # the stream broke meanwhile
            entry = self._to_leaders.popleft()
            if self._rng.random() < self._faults.break_before:
                self._break(entry, "the stream broke before the request reached the leaders")
                continue
            response = self._process(entry)
            self._unanswered.append(entry)
            if self._rng.random() < self._faults.lose_answer:
                self._break(None, "the stream broke after the request was written")
                continue
            self._answer_later(entry, response)

    def _process(self, entry: _Request) -> pb.ProduceResponse:
        request = entry.request
        results = []
        for item in request.batches:
            leader = self._leaders[item.partition]
            result = pb.PartitionProduceResult(
                partition=item.partition, log_append_time=-1, log_start_offset=0
            )
            fault = self._fault_of(item.partition)
            error: errors.TributaryError | None = None
            if fault == "error":
                error = self._rng.choice(
                    [errors.NotLeaderOrFollowerError("leader moved"), errors.RequestTimedOutError("slow")]
                )
            else:
                if (
                    self._loses_state(item.partition)
                    and self._producer_settled()
                    and leader.state.producers.pop(PRODUCER_ID, None) is not None
                ):
                    self.state_losses += 1
                try:
                    base_offset, written = leader.append(bytes(item.record_batches))
                except errors.TributaryError as exc:
                    error = exc
                else:
                    entry.written += written
                    self._unsettled.update(written)
                    if fault == "timed out after write":
                        # Written, but the gateway gave up waiting: the producer cannot tell.
                        # (A recognised retry wrote nothing now: its first write's answer
                        # was lost or timed out too, or its record would be settled.)
                        error = errors.RequestTimedOutError("the gateway timed out waiting for the leader")
                        self.ambiguous.update(written)
                    else:
                        result.base_offset = base_offset
                        result.record_count = sum(f.record_count for f in iter_batches(item.record_batches))
            if error is not None:
                result.base_offset = -1
                result.error.CopyFrom(error_to_proto(error))
            results.append(result)
        return pb.ProduceResponse(topic=request.topic, partitions=results)

    def _fault_of(self, partition: int) -> str | None:
        """The fault of a partition entry: "error" (not written, a retriable error answered),
        "timed out after write", or None."""
        roll = self._rng.random()
        if roll < self._faults.retriable_error:
            return "error"
        if roll < self._faults.retriable_error + self._faults.timed_out_after_write:
            return "timed out after write"
        return None

    def _loses_state(self, partition: int) -> bool:
        """Whether the partition's leader forgets the producer before this entry (if settled)."""
        return self._rng.random() < self._faults.lose_state

    def _producer_settled(self) -> bool:
        """Whether every record the leaders wrote for the producer has its outcome reported."""
        self._unsettled = {v for v in self._unsettled if not self._futures[v].done()}
        return not self._unsettled and not self._unanswered

    def _answer_later(self, entry: _Request, response: pb.ProduceResponse) -> None:
        """Answer in order: each answer after the one before it, some of them late."""
        loop = asyncio.get_running_loop()
        delay = self._rng.random() * 0.004 if self._rng.random() < self._faults.slow else 0.0
        # Strictly later than the previous answer: timers due at the same time may run in any order.
        at = max(loop.time() + delay, self._last_answer_at + 1e-6)
        self._last_answer_at = at
        loop.call_at(at, self._deliver, entry, response)

    def _deliver(self, entry: _Request, response: pb.ProduceResponse) -> None:
        if entry.future.done():
            return  # the stream broke first: the answer is lost
        assert self._unanswered and self._unanswered[0] is entry, "answers come in request order"
        self._unanswered.popleft()
        entry.future.set_result(response)

    def _break(self, first: _Request | None, why: str) -> None:
        """Fail every request not yet answered (and ``first``, lost before the leaders)."""
        failed = ([first] if first is not None else []) + list(self._unanswered) + list(self._to_leaders)
        for entry in self._unanswered:
            self.ambiguous.update(entry.written)
        self._unanswered.clear()
        self._to_leaders.clear()
        for entry in failed:
            if not entry.future.done():
                entry.future.set_exception(errors.NetworkError(why))


@dataclass
class Outcome:
    sent: dict[int, list[bytes]]
    #: Per partition, the records in the order the application was told they were acknowledged.
    acknowledged: dict[int, list[bytes]]
    futures: dict[bytes, FutureRecordMetadata]
    leaders: list[SimLeader]
    stream: ChaosStream
    coordinator: Coordinator


def _producer(stream: ChaosStream, coordinator: Coordinator, seed: int, delivery_timeout_ms: int):
    """The producer's parts as ``ProducerCore`` wires them for an idempotent producer."""
    accumulator = RecordAccumulator(batch_size=140, linger_ms=0, retried_alone=True)
    sender = Sender(
        client=coordinator,  # type: ignore[arg-type]  # the clock and metadata are all it reads
        accumulator=accumulator,
        transport=stream,
        policy=RetryPolicy(
            retry_backoff_ms=1,
            retry_backoff_max_ms=4,
            delivery_timeout_ms=delivery_timeout_ms,
            rng=random.Random(seed),
        ),
        acks="all",
        max_in_flight=MAX_IN_FLIGHT,
        request_timeout_ms=1000,
        transaction_manager=TransactionManager(coordinator),
    )
    return accumulator, sender


def _append(accumulator, sender, futures, partition: int, value: bytes, acknowledged=None) -> None:
    size = estimate_record_size(None, value, 0)
    future, full, new = accumulator.append(
        TOPIC, partition, 1000, None, value, (), size, SYSTEM_CLOCK.time_ms()
    )
    assert future is not None
    futures[value] = future
    if acknowledged is not None:
        future.add_callback(lambda _metadata: acknowledged[partition].append(value))
    if full or new:
        sender.wakeup()


async def _finish(accumulator, sender, task, stream) -> None:
    accumulator.close()
    sender.stop()
    await asyncio.wait_for(task, 20)
    await stream.close()


async def _run(seed: int, faults: Faults, delivery_timeout_ms: int, partitions: int = 3) -> Outcome:
    rng = random.Random(seed)
    futures: dict[bytes, FutureRecordMetadata] = {}
    leaders = [SimLeader(p) for p in range(partitions)]
    stream = ChaosStream(random.Random(seed * 7919 + 1), faults, leaders, futures)
    coordinator = Coordinator(random.Random(seed * 104729 + 2))
    accumulator, sender = _producer(stream, coordinator, seed, delivery_timeout_ms)
    task = asyncio.create_task(sender.run())
    sent: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    acknowledged: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
    for _ in range(RECORDS):
        partition = rng.randrange(partitions)
        value = b"p%d-%05d-" % (partition, len(sent[partition])) + b"x" * rng.randrange(20)
        sent[partition].append(value)
        _append(accumulator, sender, futures, partition, value, acknowledged)
        if rng.random() < 0.3:
            await asyncio.sleep(rng.random() * 0.001 if rng.random() < 0.5 else 0)
    await _finish(accumulator, sender, task, stream)
    return Outcome(sent, acknowledged, futures, leaders, stream, coordinator)


def _check(outcome: Outcome, *, all_acknowledged: bool) -> None:
    stream = outcome.stream
    for partition, leader in enumerate(outcome.leaders):
        log = leader.log
        sent = outcome.sent[partition]
        where = {value: index for index, value in enumerate(sent)}
        duplicated = [v for v, n in Counter(log).items() if n > 1]
        assert not duplicated, f"p{partition}: written more than once: {duplicated[:5]}"
        strangers = [v for v in log if v not in where]
        assert not strangers, f"p{partition}: records never sent here: {strangers[:5]}"
        order = [where[v] for v in log]
        assert order == sorted(order), f"p{partition}: log out of send order: {order}"
        told = [where[v] for v in outcome.acknowledged[partition]]
        assert told == sorted(told), f"p{partition}: acknowledged out of send order: {told}"
        at = {value: offset for offset, value in enumerate(log)}
        for value in sent:
            future = outcome.futures[value]
            assert future.done(), f"{value!r} never settled"
            if future.succeeded():
                assert value in at, f"{value!r} acknowledged but not in the log"
                metadata = future.get(0)
                assert (metadata.partition, metadata.offset) == (partition, at[value]), (
                    f"{value!r} acknowledged at offset {metadata.offset}, is at {at[value]}"
                )
            else:
                assert not all_acknowledged, f"{value!r} failed: {future.exception!r}"
                assert value not in at or value in stream.ambiguous, (
                    f"{value!r} failed ({future.exception!r}) yet is in the log though every send "
                    "of it that was written was answered"
                )
    assert stream.max_outstanding <= MAX_IN_FLIGHT, (
        f"{stream.max_outstanding} requests of a partition at once"
    )
    MAX_OUTSTANDING_SEEN["per partition"] = max(MAX_OUTSTANDING_SEEN["per partition"], stream.max_outstanding)


#: Faults under which records expire: a 40 ms delivery timeout, more and longer faults.
EXPIRING = Faults(break_before=0.08, lose_answer=0.06, retriable_error=0.15, slow=0.5)


@pytest.mark.parametrize("seed", range(30))
def test_every_acknowledged_record_is_written_once_in_order_across_partitions(seed):
    """Three partitions, every fault but lost producer state; nothing expires."""
    outcome = asyncio.run(_run(seed, Faults(lose_state=0.0), delivery_timeout_ms=120_000))
    _check(outcome, all_acknowledged=True)
    assert outcome.stream.requests > 3


@pytest.mark.parametrize(
    ("seed", "partitions"), [(seed, 1) for seed in range(20)] + [(seed, 3) for seed in range(20)]
)
def test_a_lost_producer_state_costs_no_duplicate_and_no_reordering(seed, partitions):
    """Leaders that also forget the producer (UNKNOWN_PRODUCER_ID, then an epoch bump and the
    partition's batches renumbered from 0) besides every other fault. With three partitions a
    bump for one must not renumber another's batch its leader may have written (see
    :func:`test_an_epoch_bump_does_not_renumber_a_batch_another_partition_may_have_written`)."""
    outcome = asyncio.run(
        _run(seed, Faults(lose_state=0.08), delivery_timeout_ms=120_000, partitions=partitions)
    )
    _check(outcome, all_acknowledged=True)


@pytest.mark.parametrize(
    ("seed", "partitions"), [(seed, 1) for seed in range(20)] + [(seed, 3) for seed in range(10)]
)
def test_a_record_that_expires_is_written_at_most_once_and_only_if_its_answer_was_lost(seed, partitions):
    """A short delivery timeout under heavier faults, one partition: batches expire mid-retry,
    leaving gaps in the sequence the leader answers OUT_OF_ORDER_SEQUENCE_NUMBER to (an epoch
    bump follows). The log still holds no duplicate, in order; a failed record in it is one whose
    written send was never answered with success."""
    outcome = asyncio.run(_run(seed, EXPIRING, delivery_timeout_ms=40, partitions=partitions))
    _check(outcome, all_acknowledged=False)


def test_the_faults_reach_the_paths_they_are_meant_to():
    """Over some seeds: leaders lost the producer's state, its epoch was bumped, answers were
    lost after writes, records failed; reports the most requests outstanding for a partition."""
    losses = bumps = ambiguous = failed = 0
    for seed in range(6):
        outcome = asyncio.run(_run(seed, Faults(lose_state=0.08), delivery_timeout_ms=120_000, partitions=1))
        losses += outcome.stream.state_losses
        bumps += outcome.coordinator.bumps
        ambiguous += len(outcome.stream.ambiguous)
        _check(outcome, all_acknowledged=True)
    for seed in range(6):
        outcome = asyncio.run(_run(seed, EXPIRING, delivery_timeout_ms=40, partitions=1))
        failed += sum(1 for f in outcome.futures.values() if f.failed())
        _check(outcome, all_acknowledged=False)
    assert losses > 0 and bumps > 0 and ambiguous > 0 and failed > 0, (losses, bumps, ambiguous, failed)
    assert MAX_OUTSTANDING_SEEN["per partition"] > 1, "the producer never pipelined a partition"
    print(f"most requests outstanding for one partition at once: {MAX_OUTSTANDING_SEEN['per partition']}")


class ScriptedFaults(ChaosStream):
    """Faults by script: ``script[(partition, n)]`` is the fault of the partition's n-th entry
    ("error", "timed out after write", "lose state"); no random fault."""

    def __init__(self, script: dict[tuple[int, int], str], leaders: list[SimLeader], futures: dict) -> None:
        super().__init__(random.Random(0), Faults(0, 0, 0, 0, 0, 0), leaders, futures)
        self._script = script
        self._seen: Counter[int] = Counter()

    def _fault_of(self, partition: int) -> str | None:
        fault = self._script.get((partition, self._seen[partition]))
        self._seen[partition] += 1
        return None if fault == "lose state" else fault

    def _loses_state(self, partition: int) -> bool:
        return self._script.get((partition, self._seen[partition] - 1)) == "lose state"

    def _producer_settled(self) -> bool:
        return True  # the script loses only the state of a partition whose records are settled


def test_an_epoch_bump_does_not_renumber_a_batch_another_partition_may_have_written():
    """p0's batch is written but its answer times out; in the same request p1's leader answers
    UNKNOWN_PRODUCER_ID. The epoch bump that follows must not make p0's retry a new batch (epoch
    1, sequence 0, which p0's leader accepts as new): Kafka keeps a batch's sequence once it has
    one, since "the previous attempt may actually have been accepted"."""

    async def run() -> Outcome:
        futures: dict[bytes, FutureRecordMetadata] = {}
        leaders = [SimLeader(0), SimLeader(1)]
        stream = ScriptedFaults({(0, 0): "timed out after write", (1, 1): "lose state"}, leaders, futures)
        coordinator = Coordinator(random.Random(0))
        accumulator, sender = _producer(stream, coordinator, 0, 120_000)
        task = asyncio.create_task(sender.run())
        _append(accumulator, sender, futures, 1, b"p1-first")
        while not futures[b"p1-first"].done():
            await asyncio.sleep(0.001)
        _append(accumulator, sender, futures, 0, b"p0-first")  # both in one request
        _append(accumulator, sender, futures, 1, b"p1-second")
        await _finish(accumulator, sender, task, stream)
        sent = {0: [b"p0-first"], 1: [b"p1-first", b"p1-second"]}
        acknowledged = {p: [v for v in values if futures[v].succeeded()] for p, values in sent.items()}
        return Outcome(sent, acknowledged, futures, leaders, stream, coordinator)

    outcome = asyncio.run(run())
    assert outcome.coordinator.bumps == 1 and outcome.stream.state_losses == 1
    _check(outcome, all_acknowledged=True)
