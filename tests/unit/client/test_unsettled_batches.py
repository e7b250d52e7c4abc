"""``TransactionManager``'s unsettled batches per partition as pure logic: batches settled out of
sequence order (acknowledged while an earlier one is retried) leave the first unsettled batch at
the front -- what ``is_next_sequence`` and ``follows_unsettled`` read -- however many there are."""

from gateway.client.structs import TopicPartition
from gateway.client.transaction_manager import TransactionManager

TP = TopicPartition("t", 0)


class Batch:
    prebuilt = False
    record_count = 1

    def __init__(self, order):
        self.order = order
        self.topic_partition = TP
        self.producer_id = self.producer_epoch = self.base_sequence = -1

    def set_producer_state(self, producer_id, producer_epoch, base_sequence, *, transactional):
        self.producer_id, self.producer_epoch, self.base_sequence = producer_id, producer_epoch, base_sequence


def _numbered(count):
    manager = TransactionManager(client=None)
    manager.producer_id, manager.producer_epoch = 7, 0
    batches = [Batch(order) for order in range(count)]
    for batch in batches:
        manager.number(batch)
    return manager, batches


def test_batches_settled_behind_an_unsettled_one_leave_it_first():
    manager, batches = _numbered(20_000)
    first, later = batches[:10_000], batches[10_000:]
    for batch in later:  # a later request acknowledged while the first is retried
        manager.settled(batch)
    assert manager.is_next_sequence(first[0])
    assert manager.follows_unsettled(later[0])
    for batch in first[:-1]:
        manager.settled(batch)
    assert manager.is_next_sequence(first[-1])
    assert manager.follows_unsettled(later[-1])
    manager.settled(first[-1])
    assert not manager.follows_unsettled(later[-1]), "everything settled"
    assert not manager._unsettled.get(TP) and not manager._settled_early.get(TP)


def test_settled_in_any_order_the_front_is_always_the_first_unsettled():
    manager, batches = _numbered(50)
    settled = set()
    for index in [3, 1, 0, 7, 2, 4, 6, 5, *range(8, 50)][:-1]:
        manager.settled(batches[index])
        settled.add(index)
        first = min(set(range(50)) - settled)
        assert manager.is_next_sequence(batches[first]), (index, first)
    manager.settled(batches[49])
    assert not manager._unsettled.get(TP) and not manager._settled_early.get(TP)
