"""The sender's held acknowledgements (``Sender._hold_acknowledgement`` / ``_release_acknowledgements``)
as pure logic: whatever order answers hold them in, a partition's acknowledgements reach the
application in the order its batches were made, once nothing made before them is unsettled."""

import random
from types import SimpleNamespace

from gateway.client.accumulator import RecordAccumulator
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from gateway.client.structs import TopicPartition
from tests.unit.client.test_pipelined_requests import FakeCoordinatorClient

TP = TopicPartition("t", 0)


class Manager:
    """``follows_unsettled`` of a partition whose first unsettled batch was made at ``first``."""

    transactional = False

    def __init__(self, first):
        self.first = first

    def follows_unsettled(self, batch):
        return self.first is not None and self.first < batch.order


def _sender(manager):
    return Sender(
        client=FakeCoordinatorClient(),
        accumulator=RecordAccumulator(batch_size=1, linger_ms=0),
        policy=RetryPolicy(),
        transport=SimpleNamespace(preserves_order=True),
        transaction_manager=manager,
    )


def _batch(order, told):
    result = SimpleNamespace(complete=lambda offset, *_: told.append(offset))
    return SimpleNamespace(order=order, topic_partition=TP, result=result)


def test_held_acknowledgements_are_told_in_the_order_the_batches_were_made():
    manager = Manager(first=0)
    sender = _sender(manager)
    told = []
    first_answers = list(range(1, 41))
    random.Random(5).shuffle(first_answers)  # answers of several requests, in any order
    orders = first_answers + list(range(41, 3001))
    for order in orders:
        sender._hold_acknowledgement(_batch(order, told), (order, -1, 0))
    sender._release_acknowledgements(TP)
    assert told == [], "the batch made first is unsettled: nothing is told"
    manager.first = 1500  # the batches before 1500 settled: those are told, in order
    sender._release_acknowledgements(TP)
    assert told == list(range(1, 1501))
    manager.first = None
    sender._release_acknowledgements(TP)
    assert told == list(range(1, 3001))
    assert TP not in sender._held
