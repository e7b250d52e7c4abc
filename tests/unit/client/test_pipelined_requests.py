"""Several requests of a partition in flight (an idempotent producer's pipelining), as pure logic:
the sender against a fake partition leader that checks sequences as a storage node does
(``storage_node/log/producer_state.py``) and answers after a delay, so requests overlap.

What is checked: an idempotent producer pipelines a partition over an ordered transport; a failed
request with later ones in flight leads to every batch retried in sequence order, none written
twice, all acknowledged in order, without an epoch bump; OUT_OF_ORDER_SEQUENCE_NUMBER on the
partition's *next* batch bumps the epoch, and nothing of the new epoch is sent while the old
epoch's requests are in flight; a non-idempotent acks=1 producer, and an idempotent one over a
transport that may reorder requests, keep one request per partition."""

import asyncio
import random
from collections import Counter, defaultdict

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.errors import NetworkError
from gateway.client.metadata import MetadataCache
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.structs import TopicPartition
from gateway.client.transaction_manager import TransactionManager
from services import errors
from services.clock import SYSTEM_CLOCK
from services.proto import pb
from services.records import iter_batches
from services.serde import error_to_proto


class FakeCoordinatorClient:
    """Answers InitProducerId like the transaction coordinator: the same id, the next epoch."""

    def __init__(self):
        self.clock = SYSTEM_CLOCK
        self.metadata = MetadataCache()
        self.request_timeout_ms = 1000
        self.epoch = -1
        self.init_calls = 0
        self.added = 0

    async def call_with_retry(self, method, request, *, max_wait_ms=None):
        if method == "AddPartitionsToTxn":
            self.added += len(request.partitions)
            await asyncio.sleep(0.003)  # a coordinator round trip: requests drained meanwhile wait
            return pb.AddPartitionsToTxnResponse()
        assert method == "InitProducerId", method
        self.init_calls += 1
        self.epoch += 1
        return pb.InitProducerIdResponse(producer_id=7, producer_epoch=self.epoch)


class _ProducerState:
    """One producer's state on a partition: its epoch and the runs it appended (sequence ->
    offset), as the storage node keeps them."""

    def __init__(self, epoch):
        self.epoch = epoch
        self.runs = []  # (first sequence, last sequence, first offset)

    @property
    def last_sequence(self):
        return self.runs[-1][1] if self.runs else -1


class SequencedLeader:
    """A transport whose far end is a partition leader: each request is checked and appended
    when it arrives (in write order), and answered ``delay`` seconds later.

    ``faults`` maps a request's arrival index to what goes wrong with it: "drop" (not appended,
    answered with a NetworkError), "lose_answer" (appended, answered with a NetworkError) or
    "forget" (the leader forgets the producer's sequences first: it answers
    OUT_OF_ORDER_SEQUENCE_NUMBER to anything but sequence 0 in a new epoch)."""

    def __init__(self, *, delay=0.004, faults=None, preserves_order=True):
        self.delay = delay
        self.faults = dict(faults or {})
        self.preserves_order = preserves_order
        self.log = defaultdict(list)  # partition -> values, as stored
        self.state = {}  # partition -> _ProducerState
        self.arrivals = []  # (partition, epoch, base sequence, first value, in flight before it)
        self.errors = Counter()
        self._in_flight = defaultdict(list)  # partition -> epochs of requests in flight
        self.max_in_flight = Counter()
        #: Requests that arrived while a request of another epoch was in flight for the partition.
        self.mixed_epochs = 0
        #: Retries (a batch whose first record was sent before) that arrived with other requests
        #: of their partition in flight.
        self.retries_not_alone = 0
        self._seen_values = set()

    async def send(self, request, timeout_s):
        index = len(self.arrivals)
        fault = self.faults.get(index)
        results = []
        entries = []
        for entry in request.batches:
            p = entry.partition
            views = list(iter_batches(entry.record_batches))
            epoch = views[0].producer_epoch
            first_value = next(iter(views[0].records())).value
            in_flight = self._in_flight[p]
            if any(e != epoch for e in in_flight):
                self.mixed_epochs += 1
            if first_value in self._seen_values and in_flight:
                self.retries_not_alone += 1
            self.arrivals.append((p, epoch, views[0].base_sequence, first_value, len(in_flight)))
            for view in views:
                self._seen_values.update(r.value for r in view.records())
            in_flight.append(epoch)
            self.max_in_flight[p] = max(self.max_in_flight[p], len(in_flight))
            entries.append((p, epoch))
            if fault == "forget" and p in self.state:
                self.state[p] = _ProducerState(self.state[p].epoch)
            if fault == "drop":
                results.append(None)
                continue
            try:
                base_offset = self._append(p, views)
            except errors.TributaryError as exc:
                self.errors[exc.reason] += 1
                result = pb.PartitionProduceResult(partition=p, base_offset=-1, log_start_offset=0)
                result.error.CopyFrom(error_to_proto(exc))
            else:
                count = sum(v.record_count for v in views)
                result = pb.PartitionProduceResult(
                    partition=p, base_offset=base_offset, log_start_offset=0, record_count=count
                )
            results.append(result)
        try:
            await asyncio.sleep(self.delay)
        finally:
            for p, epoch in entries:
                self._in_flight[p].remove(epoch)
        if fault in ("drop", "lose_answer"):
            raise NetworkError(f"request {index}: connection lost")
        return pb.ProduceResponse(topic=request.topic, partitions=results)

    def _append(self, p, views):
        """Check and append one request's batches of ``p`` as a unit; the first offset."""
        first = views[0]
        if first.producer_id < 0:  # not idempotent: appended as it comes
            base_offset = len(self.log[p])
            self.log[p].extend(r.value for view in views for r in view.records())
            return base_offset
        state = self.state.get(p)
        duplicate = self._duplicate(state, first)
        if duplicate is not None:
            return duplicate
        if state is None:
            if first.base_sequence != 0:
                raise errors.UnknownProducerIdError(f"no state, sequence {first.base_sequence}")
        elif first.producer_epoch < state.epoch:
            raise errors.InvalidProducerEpochError("old epoch")
        elif first.producer_epoch > state.epoch:
            if first.base_sequence != 0:
                raise errors.OutOfOrderSequenceNumberError("a new epoch starts at 0")
        elif first.base_sequence != state.last_sequence + 1:
            raise errors.OutOfOrderSequenceNumberError(
                f"sequence {first.base_sequence} after {state.last_sequence}"
            )
        if state is None or first.producer_epoch > state.epoch:
            state = self.state[p] = _ProducerState(first.producer_epoch)
        base_offset = len(self.log[p])
        for view in views:
            values = [r.value for r in view.records()]
            last_seq = view.base_sequence + len(values) - 1
            state.runs = [*state.runs, (view.base_sequence, last_seq, len(self.log[p]))][-5:]
            self.log[p].extend(values)
        return base_offset

    @staticmethod
    def _duplicate(state, first):
        """The first offset of ``first`` when it is a retry of a remembered run, else None."""
        if state is not None and first.producer_epoch == state.epoch:
            for first_seq, last_seq, first_offset in state.runs:
                if first_seq <= first.base_sequence <= last_seq:
                    return first_offset + first.base_sequence - first_seq
        return None


async def produce(
    transport, values, *, idempotent=True, acks=-1, partitions=1, pace=0.0005, transactional=False
):
    """Send ``values`` one record per batch, round robin over ``partitions``, paced so several
    requests overlap; returns the futures, the sender and the coordinator client."""
    client = FakeCoordinatorClient()
    manager = None
    if idempotent:
        manager = TransactionManager(client, transactional_id="app" if transactional else None)
    if transactional:
        await manager.init_transactions()
        manager.begin()
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, retried_alone=idempotent)
    sender = Sender(
        client=client,
        accumulator=accumulator,
        transport=transport,
        policy=RetryPolicy(retry_backoff_ms=1, retry_backoff_max_ms=2, rng=random.Random(1)),
        acks=acks,
        max_in_flight=5,
        transaction_manager=manager,
    )
    task = asyncio.create_task(sender.run())
    futures = []
    for i, value in enumerate(values):
        size = estimate_record_size(None, value, 0)
        future, _full, _new = accumulator.append(
            "t", i % partitions, 1000 + i, None, value, (), size, SYSTEM_CLOCK.time_ms()
        )
        futures.append(future)
        sender.wakeup()
        await asyncio.sleep(pace)
    accumulator.close()
    sender.stop()
    await asyncio.wait_for(task, 20)
    return futures, sender, client


VALUES = [b"v%03d" % i for i in range(60)]


def _offsets(futures):
    return [f.get(0).offset for f in futures]


def test_an_idempotent_producer_keeps_several_requests_of_a_partition_in_flight():
    leader = SequencedLeader()
    futures, _sender, client = asyncio.run(produce(leader, VALUES))
    assert _offsets(futures) == list(range(len(VALUES)))
    assert leader.log[0] == VALUES
    assert 1 < leader.max_in_flight[0] <= 5, "several requests of the partition were in flight"
    assert client.init_calls == 1
    assert not leader.errors


def test_a_failure_with_later_requests_in_flight_retries_them_all_in_sequence_order():
    for fault in ("drop", "lose_answer"):
        leader = SequencedLeader(faults={10: fault, 30: fault})
        futures, sender, client = asyncio.run(produce(leader, VALUES))
        assert leader.log[0] == VALUES, f"{fault}: every record once, in order"
        assert _offsets(futures) == list(range(len(VALUES))), f"{fault}: acknowledged in order"
        failed = [a for a in leader.arrivals if a[0] == 0]
        assert any(in_flight for *_, in_flight in failed[11:16]), "requests were in flight behind it"
        if fault == "drop":
            # The ones behind the dropped request found their predecessor missing.
            assert leader.errors["OUT_OF_ORDER_SEQUENCE_NUMBER"] > 0
        assert client.init_calls == 1, f"{fault}: no epoch bump for a missing predecessor"
        assert leader.retries_not_alone == 0, f"{fault}: a retry goes alone"
        # Dropped: the requests behind it are retried too. Answer lost: only it (a duplicate,
        # recognised by the leader, which remembers 5 runs: the retried one and 4 behind it).
        assert (
            sender.metrics["batches-retried"] > 2
            if fault == "drop"
            else sender.metrics["batches-retried"] == 2
        )


def test_out_of_order_on_the_next_batch_bumps_the_epoch_once_the_old_epoch_has_settled():
    leader = SequencedLeader(faults={20: "forget"})
    futures, _sender, client = asyncio.run(produce(leader, VALUES))
    assert client.init_calls == 2, "one epoch bump"
    assert leader.log[0] == VALUES, "every record once, in order"
    assert _offsets(futures) == list(range(len(VALUES)))
    assert leader.mixed_epochs == 0, "no request of the new epoch while the old one was in flight"
    epochs = [(epoch, seq) for p, epoch, seq, *_ in leader.arrivals if p == 0]
    first_new = next(i for i, (epoch, _seq) in enumerate(epochs) if epoch == 1)
    assert epochs[first_new] == (1, 0), "renumbered from 0 in the new epoch"
    assert all(epoch == 1 for epoch, _seq in epochs[first_new:])
    assert leader.errors["OUT_OF_ORDER_SEQUENCE_NUMBER"] >= 1


def test_requests_in_flight_of_several_partitions_keep_each_partition_in_order():
    leader = SequencedLeader(faults={7: "drop", 25: "lose_answer", 40: "forget"})
    futures, _sender, _client = asyncio.run(produce(leader, VALUES, partitions=3, pace=0.0002))
    for p in range(3):
        assert leader.log[p] == VALUES[p::3]
    assert all(f.succeeded() for f in futures)
    assert leader.mixed_epochs == 0


def test_a_producer_without_idempotence_keeps_one_request_per_partition():
    leader = SequencedLeader()
    futures, _sender, _client = asyncio.run(produce(leader, VALUES, idempotent=False, acks=1))
    assert all(f.succeeded() for f in futures)
    assert leader.max_in_flight[0] == 1


def test_an_idempotent_producer_over_a_transport_that_may_reorder_keeps_one_request_per_partition():
    leader = SequencedLeader(preserves_order=False)  # unary calls
    futures, _sender, _client = asyncio.run(produce(leader, VALUES))
    assert _offsets(futures) == list(range(len(VALUES)))
    assert leader.max_in_flight[0] == 1


def test_the_transaction_manager_knows_the_next_sequence_of_a_partition():
    async def run():
        manager = TransactionManager(FakeCoordinatorClient())
        await manager.ensure_producer_id()
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        for value in (b"a", b"b", b"c"):
            accumulator.append("t", 0, 1000, None, value, (), 20, SYSTEM_CLOCK.time_ms())
        batches = list(accumulator._queues[TopicPartition("t", 0)])
        for batch in batches:
            manager.number(batch)
        assert [manager.is_next_sequence(b) for b in batches] == [True, False, False]
        manager.settled(batches[1])  # failed for good, say: the first is still next
        assert manager.is_next_sequence(batches[0])
        manager.settled(batches[0])
        assert manager.is_next_sequence(batches[2])
        assert manager.lost_state(TopicPartition("t", 0)), "numbered in the current epoch: a bump"
        await manager.reset_after_lost_state(errors.UnknownProducerIdError("gone"))
        manager.number(batches[2])
        assert manager.is_next_sequence(batches[2])
        assert (batches[2].producer_epoch, batches[2].base_sequence) == (1, 0), "afresh in the new epoch"

    asyncio.run(run())


def test_a_bump_for_one_partition_leaves_another_numbering_in_its_epoch_until_it_is_settled():
    """KIP-360 per partition: p1's leader lost the producer's state and the epoch is bumped; p0
    has a batch whose answer was lost (its leader may have written it). p0's retry keeps its
    number, p0's new batches follow it in the old epoch, and only once all of them are settled
    does p0 start again at 0 in the new epoch."""

    async def run():
        manager = TransactionManager(FakeCoordinatorClient())
        await manager.ensure_producer_id()
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        p0, p1 = TopicPartition("t", 0), TopicPartition("t", 1)
        for partition in (0, 0, 1):
            accumulator.append("t", partition, 1000, None, b"v", (), 20, SYSTEM_CLOCK.time_ms())
        sent, later = list(accumulator._queues[p0])
        (lost,) = accumulator._queues[p1]
        for batch in (sent, lost):
            manager.number(batch)
        assert manager.lost_state(p1)
        await manager.reset_after_lost_state(errors.UnknownProducerIdError("gone"))
        assert manager.producer_epoch == 1
        manager.number(sent)  # its retry
        assert (sent.producer_epoch, sent.base_sequence) == (0, 0), "a retry keeps its number"
        manager.number(later)
        assert (later.producer_epoch, later.base_sequence) == (0, 1), "behind it, in its epoch"
        manager.number(lost)
        assert (lost.producer_epoch, lost.base_sequence) == (1, 0), "the lost partition starts afresh"
        manager.settled(sent)
        manager.settled(later)
        accumulator.append("t", 0, 1000, None, b"v", (), 20, SYSTEM_CLOCK.time_ms())
        (fresh,) = [b for b in accumulator._queues[p0] if b.base_sequence < 0]
        manager.number(fresh)
        assert (fresh.producer_epoch, fresh.base_sequence) == (1, 0), "settled: the new epoch, from 0"
        assert manager.lost_state(p0), "p0 now numbers in the current epoch: its loss needs a bump"

    asyncio.run(run())


def test_retries_go_back_in_the_order_their_batches_were_made_whatever_order_they_fail_in():
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, retried_alone=True)
    tp = TopicPartition("t", 0)
    for value in (b"a", b"b", b"c", b"d", b"e"):
        accumulator.append("t", 0, 1000, None, value, (), 20, SYSTEM_CLOCK.time_ms())
    plans = accumulator.drain(
        [tp], SYSTEM_CLOCK.time_ms(), max_request_size=1, max_requests=3, pipelined=True
    )
    a, b, c = (batches[0] for _topic, partitions in plans for batches in partitions.values())
    for batch in (a, b, c):
        batch.attempts = 1
    # The second request's answer first (another connection, say), then the third's, the first's.
    accumulator.reenqueue([b], 0)
    accumulator.reenqueue([c], 0)
    accumulator.reenqueue([a], 0)
    queued = list(accumulator._queues[tp])
    assert [batch.order for batch in queued] == sorted(batch.order for batch in queued)
    assert queued[:3] == [a, b, c]


def test_a_transactional_producer_pipelines_a_partition_once_it_is_in_the_transaction():
    leader = SequencedLeader()
    futures, _sender, client = asyncio.run(produce(leader, VALUES, transactional=True))
    assert _offsets(futures) == list(range(len(VALUES)))
    assert leader.log[0] == VALUES
    assert client.added == 1, "the partition joined the transaction once"
    first = [in_flight for p, *_rest, in_flight in leader.arrivals if p == 0]
    assert first[0] == 0, "the request that adds the partition goes alone"
    assert 1 < leader.max_in_flight[0] <= 5


def test_a_partition_with_requests_in_flight_sends_behind_them_only_complete_batches():
    """A batch still filling waits for the answer (gathering what arrives meanwhile, as a muted
    partition's does); a full one, one with batches behind it, or a flush goes at once."""
    accumulator = RecordAccumulator(batch_size=200, linger_ms=0, retried_alone=True)
    tp = TopicPartition("t", 0)
    now = SYSTEM_CLOCK.time_ms()
    accumulator.append("t", 0, 1000, None, b"a", (), 20, now)
    assert accumulator.ready(now).ready == [tp], "nothing in flight: lingered, it goes"
    assert accumulator.ready(now, busy={tp}).ready == [], "in flight: a filling batch waits"
    accumulator.begin_flush()
    assert accumulator.ready(now, busy={tp}).ready == [tp], "a flush sends everything"
    accumulator.end_flush()
    while len(accumulator._queues[tp]) < 2:
        accumulator.append("t", 0, 1000, None, b"x" * 50, (), 70, now)
    assert accumulator.ready(now, busy={tp}).ready == [tp], "a complete batch follows at once"
