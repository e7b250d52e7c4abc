"""The transaction state machine (pure): Kafka's transitions and the error of every wrong request."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.groups.model import OffsetRecord
from coordinator.transactions import state
from coordinator.transactions.model import (
    MAX_PRODUCER_EPOCH,
    ProducerIdAndEpoch,
    ProducerRef,
    TxnMetadata,
    TxnState,
)
from services import errors
from services.topic_partition import TopicPartition as TP

TID = "tx"
NOW = 1_000_000


def fresh(producer_id: int = 7, timeout_ms: int = 60_000) -> TxnMetadata:
    """A transactional id after its first InitProducerId: producer 7, epoch 0, EMPTY."""
    meta = state.new_transactional_id(TID, producer_id, timeout_ms, NOW)
    return state.init_producer(meta, None, timeout_ms, NOW)


def ref(meta: TxnMetadata, *, epoch: int | None = None, producer_id: int | None = None) -> ProducerRef:
    return ProducerRef(
        TID,
        meta.producer_id if producer_id is None else producer_id,
        meta.producer_epoch if epoch is None else epoch,
    )


def ongoing(meta: TxnMetadata | None = None, now: int = NOW) -> TxnMetadata:
    meta = meta or fresh()
    return state.add_partitions(meta, ref(meta), [TP("t", 0), TP("t", 1)], now)


# ---- InitProducerId ---------------------------------------------------------------------------------


def test_first_init_is_epoch_zero_and_each_init_bumps_the_epoch_of_the_same_id():
    meta = fresh()
    assert (meta.producer_id, meta.producer_epoch, meta.state) == (7, 0, TxnState.EMPTY)
    again = state.init_producer(meta, None, 30_000, NOW + 1)
    assert (again.producer_id, again.producer_epoch, again.timeout_ms) == (7, 1, 30_000)
    assert again.last_update_ms == NOW + 1


def test_init_after_a_completed_transaction_clears_it():
    done = state.complete(state.end_transaction(ongoing(), ref(ongoing()), True, NOW), NOW)
    again = state.init_producer(done, None, 60_000, NOW)
    assert again.state is TxnState.EMPTY and again.partitions == frozenset() and again.start_ms == -1


def test_an_exhausted_epoch_moves_to_a_new_producer_id():
    meta = dataclasses.replace(fresh(), producer_epoch=MAX_PRODUCER_EPOCH - 1)
    assert state.needs_new_producer_id(meta, None)
    rotated = state.init_producer(meta, None, 60_000, NOW, new_producer_id=99)
    assert (rotated.producer_id, rotated.producer_epoch) == (99, 0)
    assert (rotated.last_producer_id, rotated.last_producer_epoch) == (7, -1)
    assert not state.needs_new_producer_id(
        dataclasses.replace(meta, producer_epoch=MAX_PRODUCER_EPOCH - 2), None
    )


def test_kip360_bump_with_the_current_epoch_and_its_retry_get_the_same_answer():
    meta = fresh()  # epoch 0
    bumped = state.init_producer(meta, ProducerIdAndEpoch(7, 0), 60_000, NOW)
    assert (bumped.producer_epoch, bumped.last_producer_epoch) == (1, 0)
    # The answer was lost: the producer asks again with epoch 0, and gets epoch 1 again.
    state.ensure_init_allowed(bumped, ProducerIdAndEpoch(7, 0))
    retried = state.init_producer(bumped, ProducerIdAndEpoch(7, 0), 60_000, NOW)
    assert retried.producer_epoch == 1


def test_kip360_with_an_older_epoch_or_another_id_is_fenced():
    meta = state.init_producer(fresh(), None, 60_000, NOW)  # epoch 1
    with pytest.raises(errors.ProducerFencedError):
        state.init_producer(meta, ProducerIdAndEpoch(7, 0), 60_000, NOW)
    with pytest.raises(errors.ProducerFencedError):
        state.ensure_init_allowed(meta, ProducerIdAndEpoch(8, 1))


def test_kip360_retry_after_a_rotation_is_accepted():
    meta = dataclasses.replace(fresh(), producer_epoch=MAX_PRODUCER_EPOCH - 1)
    expected = ProducerIdAndEpoch(7, MAX_PRODUCER_EPOCH - 1)
    rotated = state.init_producer(meta, expected, 60_000, NOW, new_producer_id=99)
    state.ensure_init_allowed(rotated, expected)  # the old id, exhausted: a retry
    assert not state.needs_new_producer_id(rotated, expected)
    again = state.init_producer(rotated, expected, 60_000, NOW)
    assert (again.producer_id, again.producer_epoch) == (99, 0)


def test_init_while_completing_is_concurrent_transactions():
    preparing = state.end_transaction(ongoing(), ref(ongoing()), True, NOW)
    with pytest.raises(errors.ConcurrentTransactionsError) as info:
        state.ensure_init_allowed(preparing, None)
    assert info.value.retriable


def test_fencing_an_open_transaction_aborts_it_under_the_next_epoch():
    meta = ongoing()
    fenced = state.fence_ongoing(meta, NOW + 5)
    assert fenced.state is TxnState.PREPARE_ABORT
    assert fenced.producer_epoch == meta.producer_epoch + 1
    assert fenced.partitions == meta.partitions  # the markers go to every partition
    with pytest.raises(errors.ProducerFencedError):
        state.end_transaction(fenced, ref(meta), True, NOW)


def test_a_kip360_init_of_the_open_transactions_own_producer_gets_the_fencing_epoch():
    meta = ongoing()
    expected = ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch)
    done = state.complete(state.fence_ongoing(meta, NOW, expected=expected), NOW)
    assert state.init_producer(done, expected, 60_000, NOW).producer_epoch == meta.producer_epoch + 1
    # Another instance's KIP-360 init with a wrong epoch must not abort the open transaction.
    with pytest.raises(errors.ProducerFencedError):
        state.ensure_init_allowed(meta, ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch + 3))


# ---- request rules ----------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [0, -1, 900_001])
def test_timeouts_outside_the_range_are_invalid(timeout):
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        state.ensure_valid_timeout(timeout, 900_000)
    state.ensure_valid_timeout(900_000, 900_000)


@pytest.mark.parametrize("tid", ["", "a/b", "x" * 250])
def test_bad_transactional_ids_are_invalid_requests(tid):
    with pytest.raises(errors.InvalidRequestError):
        state.ensure_valid_transactional_id(tid)


@pytest.mark.parametrize("pid,epoch", [(-1, 0), (5, -1), (5, MAX_PRODUCER_EPOCH + 1), (-2, -2)])
def test_expected_producer_needs_both_or_neither(pid, epoch):
    with pytest.raises(errors.InvalidRequestError):
        state.expected_producer(pid, epoch)
    assert state.expected_producer(-1, -1) is None
    assert state.expected_producer(5, 3) == ProducerIdAndEpoch(5, 3)


def test_requests_from_the_wrong_producer():
    meta = state.init_producer(fresh(), None, 60_000, NOW)  # epoch 1
    with pytest.raises(errors.InvalidProducerIdMappingError):
        state.add_partitions(meta, ref(meta, producer_id=8), [TP("t", 0)], NOW)
    with pytest.raises(errors.InvalidProducerIdMappingError):
        state.end_transaction(None, ref(meta), True, NOW)
    with pytest.raises(errors.ProducerFencedError):
        state.add_group(meta, ref(meta, epoch=0), "g", NOW)
    with pytest.raises(errors.InvalidProducerEpochError):
        state.end_transaction(meta, ref(meta, epoch=2), False, NOW)


# ---- a transaction --------------------------------------------------------------------------------


def test_adding_partitions_begins_a_transaction_once_and_repeats_change_nothing():
    meta = fresh()
    first = state.add_partitions(meta, ref(meta), [TP("t", 0)], NOW + 10)
    assert first.state is TxnState.ONGOING and first.start_ms == NOW + 10
    more = state.add_partitions(first, ref(first), [TP("t", 1)], NOW + 20)
    assert more.start_ms == NOW + 10 and more.partitions == {TP("t", 0), TP("t", 1)}
    assert state.add_partitions(more, ref(more), [TP("t", 1)], NOW + 30) is more
    assert state.add_group(more, ref(more), "g", NOW).groups == {"g"}


def test_nothing_may_be_added_while_completing():
    preparing = state.end_transaction(ongoing(), ref(ongoing()), False, NOW)
    with pytest.raises(errors.ConcurrentTransactionsError):
        state.add_partitions(preparing, ref(preparing), [TP("t", 2)], NOW)
    with pytest.raises(errors.ConcurrentTransactionsError):
        state.add_group(preparing, ref(preparing), "g", NOW)


def test_offsets_are_staged_only_for_an_added_group_and_later_ones_win():
    meta = ongoing()
    with pytest.raises(errors.InvalidTxnStateError):
        state.stage_offsets(meta, ref(meta), "g", {TP("t", 0): OffsetRecord(5)}, NOW)
    with pytest.raises(errors.InvalidTxnStateError):
        state.ensure_can_stage_offsets(fresh(), ref(fresh()), "g")  # nothing begun
    meta = state.add_group(meta, ref(meta), "g", NOW)
    meta = state.stage_offsets(
        meta, ref(meta), "g", {TP("t", 0): OffsetRecord(5), TP("t", 1): OffsetRecord(1)}, NOW
    )
    meta = state.stage_offsets(meta, ref(meta), "g", {TP("t", 0): OffsetRecord(9)}, NOW)
    assert {tp: r.offset for tp, r in meta.pending_offsets["g"].items()} == {TP("t", 0): 9, TP("t", 1): 1}


def test_end_txn_with_nothing_begun_is_invalid_txn_state():
    meta = fresh()
    for commit in (True, False):
        with pytest.raises(errors.InvalidTxnStateError):
            state.end_transaction(meta, ref(meta), commit, NOW)


@pytest.mark.parametrize("commit", [True, False])
def test_end_txn_prepares_completes_and_accepts_a_retry_of_the_same_outcome(commit):
    meta = ongoing()
    prepared = state.end_transaction(meta, ref(meta), commit, NOW + 1)
    assert prepared.state is (TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT)
    assert state.end_transaction(prepared, ref(meta), commit, NOW + 2) is prepared
    with pytest.raises(errors.InvalidTxnStateError):
        state.end_transaction(prepared, ref(meta), not commit, NOW + 2)
    done = state.complete(prepared, NOW + 3)
    assert done.state is (TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT)
    assert (done.partitions, done.groups, dict(done.pending_offsets)) == (frozenset(), frozenset(), {})
    assert state.end_transaction(done, ref(meta), commit, NOW + 4) is done  # Kafka's retry rule
    with pytest.raises(errors.InvalidTxnStateError):
        state.end_transaction(done, ref(meta), not commit, NOW + 4)


def test_timeout_and_expiration():
    meta = ongoing(now=NOW)
    assert not state.timed_out(meta, NOW + meta.timeout_ms)
    assert state.timed_out(meta, NOW + meta.timeout_ms + 1)
    assert not state.timed_out(fresh(), NOW + 10**9)
    assert not state.expired(meta, NOW + 10**9, 1000)  # open transactions never expire
    idle = fresh()
    assert state.expired(idle, idle.last_update_ms + 1000, 1000)
    assert not state.expired(idle, idle.last_update_ms + 999, 1000)


# ---- every sequence of requests ----------------------------------------------------------------------

_OPERATIONS = st.lists(
    st.sampled_from(["init", "init_kip360", "add", "group", "stage", "commit", "abort", "complete", "fence"]),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(_OPERATIONS, st.integers(min_value=0, max_value=MAX_PRODUCER_EPOCH))
def test_any_sequence_of_requests_keeps_the_invariants(operations, start_epoch):
    """Whatever the producer sends, a transition is always one Kafka allows (no AssertionError),
    errors are the taxonomy's, the epoch of one producer id never goes back, a new producer id
    starts at epoch 0, and staged offsets only exist in an open or deciding transaction."""
    meta = dataclasses.replace(fresh(), producer_epoch=min(start_epoch, MAX_PRODUCER_EPOCH - 1))
    next_id = 100
    for now, operation in enumerate(operations, start=NOW):
        before = meta
        try:
            meta = _apply(meta, operation, now, next_id)
        except errors.TributaryError:
            continue
        if meta.producer_id != before.producer_id:
            assert meta.producer_epoch == 0 and meta.producer_id == next_id
            next_id += 1
        else:
            assert meta.producer_epoch >= before.producer_epoch
        assert 0 <= meta.producer_epoch <= MAX_PRODUCER_EPOCH
        if meta.pending_offsets:
            assert meta.state in (TxnState.ONGOING, TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)
        if meta.state is TxnState.ONGOING:
            assert meta.start_ms >= 0


def _apply(meta: TxnMetadata, operation: str, now: int, next_id: int) -> TxnMetadata:
    producer = ref(meta)
    if operation in ("init", "init_kip360"):
        expected = (
            ProducerIdAndEpoch(meta.producer_id, meta.producer_epoch) if operation == "init_kip360" else None
        )
        state.ensure_init_allowed(meta, expected)
        if meta.state is TxnState.ONGOING:
            return state.fence_ongoing(meta, now, expected=expected)
        new_id = next_id if state.needs_new_producer_id(meta, expected) else None
        return state.init_producer(meta, expected, 60_000, now, new_id)
    if operation == "add":
        return state.add_partitions(meta, producer, [TP("t", now % 3)], now)
    if operation == "group":
        return state.add_group(meta, producer, "g", now)
    if operation == "stage":
        return state.stage_offsets(meta, producer, "g", {TP("t", 0): OffsetRecord(now)}, now)
    if operation in ("commit", "abort"):
        return state.end_transaction(meta, producer, operation == "commit", now)
    if operation == "complete":
        if not meta.state.preparing:
            raise errors.InvalidTxnStateError("nothing to complete")
        return state.complete(meta, now)
    if meta.state is not TxnState.ONGOING:  # "fence": the timeout check only fences open ones
        raise errors.InvalidTxnStateError("nothing open")
    return state.fence_ongoing(meta, now)


# ---- partition leaders' verification (KIP-890) -------------------------------------------------------


def test_a_leader_may_append_a_transactional_batch_only_to_a_partition_of_the_open_transaction():
    meta = ongoing()
    assert state.verification_error(meta, 7, 0, TP("t", 0)) is None
    assert isinstance(state.verification_error(meta, 7, 0, TP("t", 2)), errors.InvalidTxnStateError)
    assert isinstance(state.verification_error(fresh(), 7, 0, TP("t", 0)), errors.InvalidTxnStateError)
    assert isinstance(state.verification_error(None, 7, 0, TP("t", 0)), errors.InvalidProducerIdMappingError)
    assert isinstance(state.verification_error(meta, 8, 0, TP("t", 0)), errors.InvalidProducerIdMappingError)
    bumped = state.init_producer(
        state.complete(state.end_transaction(meta, ref(meta), False, NOW), NOW), None, 60_000, NOW
    )
    fenced = state.verification_error(ongoing(bumped), 7, 0, TP("t", 0))
    assert isinstance(fenced, errors.InvalidProducerEpochError) and "fenced" in fenced.message
    assert isinstance(state.verification_error(meta, 7, 3, TP("t", 0)), errors.InvalidProducerEpochError)
    decided = state.end_transaction(meta, ref(meta), True, NOW)
    assert isinstance(state.verification_error(decided, 7, 0, TP("t", 0)), errors.InvalidTxnStateError)
