"""Idempotence and transactions in the producer, as pure logic: which settings make a producer
idempotent, how batches are numbered (and renumbered after an epoch bump), the transaction
state machine. The wire behaviour is tested against a real cluster in
tests/integration/transactions/."""

import asyncio
import random

import pytest

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.errors import IllegalStateError
from gateway.client.metadata import MetadataCache
from gateway.client.producer import ProducerConfig
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.structs import TopicPartition
from gateway.client.transaction_manager import TransactionManager, TxnState
from services import errors
from services.clock import SYSTEM_CLOCK
from services.proto import pb
from services.records import iter_batches
from services.serde import error_to_proto

TP = TopicPartition("t", 0)


class FakeCoordinatorClient:
    """Answers InitProducerId like the transaction coordinator: the same id, the next epoch."""

    def __init__(self, producer_id=7):
        self.clock = SYSTEM_CLOCK
        self.metadata = MetadataCache()
        self.request_timeout_ms = 1000
        self.producer_id = producer_id
        self.epoch = -1
        self.calls = []
        self.fail_with = {}

    async def call_with_retry(self, method, request, *, max_wait_ms=None):
        self.calls.append((method, request))
        if method in self.fail_with:
            raise self.fail_with[method]
        if method == "InitProducerId":
            self.epoch += 1
            return pb.InitProducerIdResponse(producer_id=self.producer_id, producer_epoch=self.epoch)
        if method == "AddPartitionsToTxn":
            return pb.AddPartitionsToTxnResponse()
        if method == "EndTxn":
            return pb.EndTxnResponse()
        raise AssertionError(f"unexpected call {method}")


def _batch(accumulator, tp, values):
    for value in values:
        size = estimate_record_size(None, value, 0)
        accumulator.append(tp.topic, tp.partition, 1000, None, value, (), size, SYSTEM_CLOCK.time_ms())
    return accumulator


# ---- which settings -----------------------------------------------------------------------------


def test_idempotence_is_on_by_default_with_acks_all_and_off_with_weaker_acks():
    assert ProducerConfig().idempotent
    assert not ProducerConfig(acks=1).idempotent
    assert not ProducerConfig(acks=0).idempotent
    # Kafka's rule: settings idempotence cannot honour turn the *default* off...
    assert not ProducerConfig(max_in_flight=6).idempotent
    assert not ProducerConfig(retries=0).idempotent
    assert not ProducerConfig(enable_idempotence=False).idempotent
    assert ProducerConfig(transactional_id="app-1").idempotent


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"enable_idempotence": True, "acks": 1}, "needs acks='all'"),
        ({"enable_idempotence": True, "max_in_flight": 6}, "at most 5"),
        ({"enable_idempotence": True, "retries": 0}, "retries > 0"),
        ({"transactional_id": "app", "acks": 1}, "transactional producer needs acks='all'"),
        ({"transactional_id": "app", "enable_idempotence": False}, "idempotence"),
        ({"transactional_id": ""}, "non-empty transactional_id"),
        ({"transactional_id": "app", "transaction_timeout_ms": 0}, "must be positive"),
    ],
)
def test_settings_idempotence_cannot_honour_are_refused_when_asked_for(settings, message):
    # ...but an explicit request for idempotence with such settings is an error, not ignored.
    with pytest.raises(ValueError, match=message):
        ProducerConfig.from_kwargs(settings)


# ---- numbering ------------------------------------------------------------------------------------


def _header(batch):
    (view,) = list(iter_batches(bytes(batch.close())))
    return view.producer_id, view.producer_epoch, view.base_sequence, view.is_transactional


def test_batches_are_numbered_per_partition_by_record_count_and_a_retry_keeps_its_number():
    manager = TransactionManager(FakeCoordinatorClient())
    asyncio.run(manager.ensure_producer_id())
    accumulator = RecordAccumulator(batch_size=40, linger_ms=0)
    _batch(accumulator, TP, [b"a" * 10] * 6)
    _batch(accumulator, TopicPartition("t", 1), [b"b" * 10] * 2)
    batches = [b for tp in (TP, TopicPartition("t", 1)) for b in accumulator._queues[tp]]
    for batch in batches:
        manager.number(batch)
    on_p0 = [b for b in batches if b.topic_partition == TP]
    assert len(on_p0) >= 2
    sequence = 0
    for batch in on_p0:
        assert _header(batch) == (7, 0, sequence, False)
        sequence += batch.record_count
    assert _header(next(b for b in batches if b.topic_partition.partition == 1))[2] == 0

    first = on_p0[0]
    manager.number(first)  # a retry in the same epoch
    assert _header(first) == (7, 0, 0, False)


def test_an_epoch_bump_renumbers_the_lost_partition_s_unacknowledged_batches_from_zero():
    client = FakeCoordinatorClient()
    manager = TransactionManager(client)
    asyncio.run(manager.ensure_producer_id())
    accumulator = _batch(RecordAccumulator(batch_size=1000, linger_ms=0), TP, [b"x"] * 5)
    (batch,) = accumulator._queues[TP]
    manager.number(batch)
    assert _header(batch)[1:3] == (0, 0)
    assert manager.lost_state(TP)  # what the sender says first: the partition's next batch was refused
    asyncio.run(manager.reset_after_lost_state(errors.UnknownProducerIdError("gone")))
    assert client.calls[-1][1].producer_epoch == 0  # KIP-360: the bump names the epoch it replaces
    manager.number(batch)
    assert _header(batch) == (7, 1, 0, False)


def test_prebuilt_batches_are_sent_as_they_are():
    manager = TransactionManager(FakeCoordinatorClient())
    asyncio.run(manager.ensure_producer_id())
    accumulator = RecordAccumulator(batch_size=1000, linger_ms=0)
    source = _batch(RecordAccumulator(batch_size=1000, linger_ms=0), TP, [b"x"] * 3)
    data = bytes(source._queues[TP][0].close())
    accumulator.pool.try_allocate(len(data))
    accumulator.append_batch(TP, data, SYSTEM_CLOCK.time_ms())
    (batch,) = accumulator._queues[TP]
    manager.number(batch)
    assert bytes(batch.close()) == data


# ---- the sender with a lost producer state -----------------------------------------------------


class LosingStateTransport:
    """Answers the first produce with UNKNOWN_PRODUCER_ID, then accepts; records the headers."""

    def __init__(self):
        self.headers = []

    async def send(self, request, timeout_s):
        results = []
        for entry in request.batches:
            (view,) = list(iter_batches(entry.record_batches))
            self.headers.append((view.producer_epoch, view.base_sequence))
            result = pb.PartitionProduceResult(partition=entry.partition, log_start_offset=0)
            if len(self.headers) == 1:
                result.base_offset = -1
                result.error.CopyFrom(error_to_proto(errors.UnknownProducerIdError("expired")))
            else:
                result.base_offset = 0
                result.record_count = view.record_count
            results.append(result)
        return pb.ProduceResponse(topic=request.topic, partitions=results)


def test_a_partition_that_lost_the_producer_gets_the_batch_again_in_a_new_epoch():
    async def run():
        client = FakeCoordinatorClient()
        manager = TransactionManager(client)
        accumulator = _batch(RecordAccumulator(batch_size=1000, linger_ms=0), TP, [b"x"] * 4)
        transport = LosingStateTransport()
        sender = Sender(
            client=client,
            accumulator=accumulator,
            transport=transport,
            policy=RetryPolicy(retry_backoff_ms=1, retry_backoff_max_ms=5, rng=random.Random(1)),
            acks=-1,
            transaction_manager=manager,
        )
        future = accumulator._queues[TP][0].result
        task = asyncio.create_task(sender.run())
        sender.wakeup()
        accumulator.close()
        sender.stop()
        await asyncio.wait_for(task, 10)
        return transport.headers, future, manager

    headers, result, manager = asyncio.run(run())
    assert headers == [(0, 0), (1, 0)]
    assert result.done and result.error is None
    assert manager.producer_epoch == 1


# ---- the transaction state machine ---------------------------------------------------------------


def test_transactions_follow_kafkas_state_machine():
    async def run():
        client = FakeCoordinatorClient()
        manager = TransactionManager(client, transactional_id="app-1")
        with pytest.raises(IllegalStateError, match="uninitialized"):
            manager.begin()
        await manager.init_transactions()
        assert manager.state is TxnState.READY
        with pytest.raises(IllegalStateError):
            await manager.init_transactions()
        manager.begin()
        await manager.add_partitions([TP])
        await manager.add_partitions([TP])  # already in: no second call
        assert [m for m, _ in client.calls].count("AddPartitionsToTxn") == 1
        manager.fail_transaction(errors.NotEnoughReplicasError("2 of 3 in sync"))
        assert manager.state is TxnState.ABORTABLE_ERROR
        with pytest.raises(IllegalStateError, match="abort_transaction") as refused:
            manager.ensure_state(TxnState.IN_TRANSACTION)
        assert isinstance(refused.value.__cause__, errors.NotEnoughReplicasError)
        await manager.end(commit=False)
        assert manager.state is TxnState.READY
        # The failed batch's sequence is unknown: the abort is followed by an epoch bump.
        assert (manager.producer_epoch, client.calls[-1][0]) == (1, "InitProducerId")
        # A transaction the coordinator never heard of (nothing sent) ends without EndTxn.
        manager.begin()
        calls = len(client.calls)
        await manager.end(commit=True)
        assert len(client.calls) == calls and manager.state is TxnState.READY
        manager.begin()
        await manager.add_partitions([TP])
        client.fail_with["EndTxn"] = errors.ProducerFencedError("a newer instance has epoch 5")
        with pytest.raises(errors.ProducerFencedError):
            await manager.end(commit=True)
        assert manager.state is TxnState.FATAL
        # Fenced: every later call raises ProducerFencedError (Kafka's), caused by the fencing.
        with pytest.raises(errors.ProducerFencedError, match="close this producer") as refused:
            manager.begin()
        assert isinstance(refused.value.__cause__, errors.ProducerFencedError)

    asyncio.run(run())
