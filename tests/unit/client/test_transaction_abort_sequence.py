"""A transaction aborted while a numbered batch waits in the queue for its retry: the batch is
failed unsent (TransactionAbortedError), so its partition's next sequence is unknown; the abort
bumps the epoch, else the next transaction's first batch there is refused (UNKNOWN_PRODUCER_ID /
OUT_OF_ORDER_SEQUENCE_NUMBER) and that transaction fails."""

import asyncio
import random

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.errors import TransactionAbortedError
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.transaction_manager import TransactionManager, TxnState
from services.clock import SYSTEM_CLOCK
from services.proto import pb
from tests.unit.client.test_pipelined_requests import FakeCoordinatorClient, SequencedLeader


class Coordinator(FakeCoordinatorClient):
    async def call_with_retry(self, method, request, *, max_wait_ms=None):
        if method == "EndTxn":
            return pb.EndTxnResponse()
        return await super().call_with_retry(method, request, max_wait_ms=max_wait_ms)


async def _abort_then_next_transaction():
    client = Coordinator()
    manager = TransactionManager(client, transactional_id="app")
    await manager.init_transactions()
    manager.begin()
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0, retried_alone=True)
    leader = SequencedLeader(faults={0: "drop"})  # the first request is lost before the leader
    sender = Sender(
        client=client,
        accumulator=accumulator,
        transport=leader,
        policy=RetryPolicy(retry_backoff_ms=500, retry_backoff_max_ms=500, rng=random.Random(1)),
        acks=-1,
        max_in_flight=5,
        transaction_manager=manager,
    )
    task = asyncio.create_task(sender.run())

    def send(value):
        size = estimate_record_size(None, value, 0)
        future, *_ = accumulator.append("t", 0, 1000, None, value, (), size, SYSTEM_CLOCK.time_ms())
        sender.wakeup()
        return future

    first = send(b"a")
    while sender.metrics["batches-retried"] < 1:  # numbered, sent, lost: queued for its retry
        await asyncio.sleep(0.001)
    # ProducerCore.abort_transaction, step by step
    manager.state = TxnState.ABORTING
    for batch in accumulator.abort_queued():
        sender.fail(batch, TransactionAbortedError("aborted before this record was sent"))
    await manager.end(commit=False)
    assert isinstance(first.exception, TransactionAbortedError)
    manager.begin()
    second = send(b"b")
    for _ in range(2000):
        if second.done():
            break
        await asyncio.sleep(0.001)
    accumulator.close()
    sender.stop()
    await asyncio.wait_for(task, 5)
    return second, manager, leader


def test_a_transaction_after_an_abort_of_a_queued_retry_can_commit():
    second, manager, leader = asyncio.run(_abort_then_next_transaction())
    assert second.succeeded(), (
        f"the next transaction's record failed: {second.exception!r}; "
        f"state {manager.state}, leader errors {dict(leader.errors)}, arrivals {leader.arrivals}"
    )
