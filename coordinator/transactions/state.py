"""The transaction state machine: Kafka's TransactionMetadata and TransactionCoordinator rules. Pure.

Every function takes the stored :class:`~coordinator.transactions.model.TxnMetadata` and a
request, and returns the metadata to store next (the same object when nothing changes) or raises
the error Kafka answers with. Nothing here does I/O or reads a clock.

Transitions::

    (none) ------------ InitProducerId ----------> EMPTY  (a new producer id, epoch 0)
    EMPTY, COMPLETE_* - InitProducerId ----------> EMPTY  (epoch + 1; a new id once exhausted)
    EMPTY, COMPLETE_*, ONGOING
                   --- AddPartitionsToTxn / AddOffsetsToTxn --> ONGOING  (start time set)
    ONGOING ----------- TxnOffsetCommit ---------> ONGOING  (offsets staged)
    ONGOING ----------- EndTxn(commit) ----------> PREPARE_COMMIT --markers--> COMPLETE_COMMIT
    ONGOING ----------- EndTxn(abort) -----------> PREPARE_ABORT  --markers--> COMPLETE_ABORT
    ONGOING ----------- InitProducerId, timeout -> PREPARE_ABORT (epoch + 1: the producer is fenced)

Errors, as Kafka: a producer id other than the stored one is INVALID_PRODUCER_ID_MAPPING; an
older epoch PRODUCER_FENCED (a newer instance took over, or the transaction timed out); an epoch
newer than any handed out INVALID_PRODUCER_EPOCH; anything while a transaction is being completed
CONCURRENT_TRANSACTIONS (retriable); an EndTxn with no transaction INVALID_TXN_STATE -- except
that an EndTxn repeating the outcome just completed succeeds (a retry whose answer was lost).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from coordinator.groups.model import OffsetRecord
from coordinator.transactions.model import (
    MAX_PRODUCER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    ProducerIdAndEpoch,
    ProducerRef,
    TxnMetadata,
    TxnState,
    epoch_exhausted,
)
from services import errors
from services.topic_partition import TopicPartition

#: Longest transactional id accepted: it is a path segment of an etcd key (as group ids are).
MAX_TRANSACTIONAL_ID_LENGTH = 249

#: The states each state may be entered from (Kafka's TransactionState.validPreviousStates).
VALID_PREVIOUS: Mapping[TxnState, frozenset[TxnState]] = {
    TxnState.EMPTY: frozenset({TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}),
    TxnState.ONGOING: frozenset(
        {TxnState.ONGOING, TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT}
    ),
    TxnState.PREPARE_COMMIT: frozenset({TxnState.ONGOING}),
    TxnState.PREPARE_ABORT: frozenset({TxnState.ONGOING}),
    TxnState.COMPLETE_COMMIT: frozenset({TxnState.PREPARE_COMMIT}),
    TxnState.COMPLETE_ABORT: frozenset({TxnState.PREPARE_ABORT}),
}


def _transition(meta: TxnMetadata, state: TxnState, now_ms: int, **changes) -> TxnMetadata:
    if meta.state not in VALID_PREVIOUS[state]:
        raise AssertionError(f"transactional id {meta.transactional_id}: {meta.state.name} -> {state.name}")
    return dataclasses.replace(meta, state=state, last_update_ms=now_ms, **changes)


# ---- request validation ---------------------------------------------------------------------------


def ensure_valid_transactional_id(transactional_id: str) -> None:
    """INVALID_REQUEST for an empty id, one with '/' or one longer than the limit."""
    if not transactional_id:
        raise errors.InvalidRequestError("the transactional id must not be empty")
    if "/" in transactional_id:
        raise errors.InvalidRequestError(f"transactional id {transactional_id!r} contains '/'")
    if len(transactional_id) > MAX_TRANSACTIONAL_ID_LENGTH:
        raise errors.InvalidRequestError(
            f"the transactional id is longer than {MAX_TRANSACTIONAL_ID_LENGTH} characters"
        )


def ensure_valid_timeout(timeout_ms: int, max_timeout_ms: int) -> None:
    """INVALID_TRANSACTION_TIMEOUT unless 0 < timeout <= the coordinator's maximum."""
    if not 0 < timeout_ms <= max_timeout_ms:
        raise errors.InvalidTransactionTimeoutError(
            f"transaction timeout {timeout_ms} ms is not within (0, {max_timeout_ms}] ms "
            "(the coordinator's transaction_max_timeout_ms)"
        )


def expected_producer(producer_id: int, producer_epoch: int) -> ProducerIdAndEpoch | None:
    """The id and epoch an InitProducerId asks to bump (None: both -1, a fresh start);
    INVALID_REQUEST when only one is given or the epoch is out of range."""
    if producer_id == NO_PRODUCER_ID and producer_epoch == NO_PRODUCER_EPOCH:
        return None
    if producer_id < 0 or not 0 <= producer_epoch <= MAX_PRODUCER_EPOCH:
        raise errors.InvalidRequestError(
            f"producer id {producer_id} with epoch {producer_epoch}: give both "
            f"(epoch 0..{MAX_PRODUCER_EPOCH}) or neither (-1 and -1)"
        )
    return ProducerIdAndEpoch(producer_id, producer_epoch)


def ensure_producer(meta: TxnMetadata | None, producer: ProducerRef) -> TxnMetadata:
    """The stored metadata, if ``producer`` is its current producer (else the error, as Kafka)."""
    if meta is None or meta.producer_id != producer.producer_id:
        raise errors.InvalidProducerIdMappingError(
            f"producer id {producer.producer_id} is not the one of transactional id "
            f"{producer.transactional_id!r}; call InitProducerId"
        )
    if producer.producer_epoch < meta.producer_epoch:
        raise errors.ProducerFencedError(
            f"epoch {producer.producer_epoch} of transactional id {producer.transactional_id!r} is fenced: "
            f"epoch {meta.producer_epoch} took over (a newer instance, or the transaction timed out)"
        )
    if producer.producer_epoch > meta.producer_epoch:
        raise errors.InvalidProducerEpochError(
            f"epoch {producer.producer_epoch} of transactional id {producer.transactional_id!r} "
            f"was never handed out (current epoch {meta.producer_epoch})"
        )
    return meta


def _ensure_not_completing(meta: TxnMetadata) -> None:
    if meta.state.preparing:
        raise errors.ConcurrentTransactionsError(
            f"transactional id {meta.transactional_id!r}: the previous transaction is being completed "
            f"({meta.state.name}); retry"
        )


# ---- InitProducerId --------------------------------------------------------------------------------


def new_transactional_id(
    transactional_id: str, producer_id: int, timeout_ms: int, now_ms: int
) -> TxnMetadata:
    """The metadata of a transactional id seen for the first time: no epoch yet (the
    InitProducerId that creates it bumps it to 0)."""
    return TxnMetadata(transactional_id, producer_id, NO_PRODUCER_EPOCH, timeout_ms, last_update_ms=now_ms)


def ensure_init_allowed(meta: TxnMetadata, expected: ProducerIdAndEpoch | None) -> None:
    """CONCURRENT_TRANSACTIONS while a transaction is completing; PRODUCER_FENCED when the
    expected producer id is neither the current one nor (after a rotation) the previous one."""
    _ensure_not_completing(meta)
    if expected is None or meta.producer_epoch == NO_PRODUCER_EPOCH:
        return
    if expected.producer_id == meta.producer_id:
        if meta.state is TxnState.ONGOING and expected.epoch != meta.producer_epoch:
            # Not the producer of the open transaction: it must not abort it.
            raise errors.ProducerFencedError(
                f"epoch {expected.epoch} of transactional id {meta.transactional_id!r} is fenced "
                f"(current epoch {meta.producer_epoch})"
            )
        return
    if expected.producer_id == meta.last_producer_id and epoch_exhausted(expected.epoch):
        return  # a retry of the InitProducerId that rotated to the current id
    raise errors.ProducerFencedError(
        f"producer id {expected.producer_id} no longer owns transactional id {meta.transactional_id!r}"
    )


def needs_new_producer_id(meta: TxnMetadata, expected: ProducerIdAndEpoch | None) -> bool:
    """Whether an InitProducerId on an idle transactional id moves it to a new producer id."""
    return epoch_exhausted(meta.producer_epoch) and (
        expected is None or expected.epoch == meta.producer_epoch
    )


def fence_ongoing(
    meta: TxnMetadata, now_ms: int, *, expected: ProducerIdAndEpoch | None = None
) -> TxnMetadata:
    """Abort the open transaction under a bumped epoch: its markers carry the new epoch, so the
    old producer's writes are refused from then on (a timeout; an InitProducerId).

    When the InitProducerId came from the open transaction's own producer (``expected`` is its
    current id and epoch, KIP-360), that epoch is remembered so its InitProducerId -- and a retry
    of it -- gets the bumped epoch instead of PRODUCER_FENCED."""
    own = (
        expected is not None
        and expected.producer_id == meta.producer_id
        and expected.epoch == meta.producer_epoch
        and not epoch_exhausted(meta.producer_epoch + 1)  # never hand out the last epoch
    )
    return _transition(
        meta,
        TxnState.PREPARE_ABORT,
        now_ms,
        producer_epoch=min(meta.producer_epoch + 1, MAX_PRODUCER_EPOCH),
        last_producer_epoch=meta.producer_epoch if own else NO_PRODUCER_EPOCH,
    )


def init_producer(
    meta: TxnMetadata,
    expected: ProducerIdAndEpoch | None,
    timeout_ms: int,
    now_ms: int,
    new_producer_id: int | None = None,
) -> TxnMetadata:
    """The metadata after an InitProducerId on an idle transactional id (``new_producer_id``
    when :func:`needs_new_producer_id` said so): epoch bumped, nothing open."""
    cleared = {
        "timeout_ms": timeout_ms,
        "partitions": frozenset(),
        "groups": frozenset(),
        "pending_offsets": {},
        "start_ms": -1,
    }
    if new_producer_id is not None:
        return _transition(
            meta,
            TxnState.EMPTY,
            now_ms,
            producer_id=new_producer_id,
            producer_epoch=0,
            last_producer_id=meta.producer_id,
            last_producer_epoch=meta.producer_epoch if expected is not None else NO_PRODUCER_EPOCH,
            **cleared,
        )
    if expected is None:
        epoch, last_epoch = meta.producer_epoch + 1, NO_PRODUCER_EPOCH
    elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected.epoch == meta.producer_epoch:
        epoch, last_epoch = meta.producer_epoch + 1, meta.producer_epoch
    elif expected.epoch == meta.last_producer_epoch:
        epoch, last_epoch = meta.producer_epoch, meta.last_producer_epoch  # a retry: same answer
    else:
        raise errors.ProducerFencedError(
            f"epoch {expected.epoch} of transactional id {meta.transactional_id!r} is fenced "
            f"(current epoch {meta.producer_epoch})"
        )
    return _transition(
        meta, TxnState.EMPTY, now_ms, producer_epoch=epoch, last_producer_epoch=last_epoch, **cleared
    )


# ---- a transaction's contents --------------------------------------------------------------------


def _begin_or_continue(meta: TxnMetadata, now_ms: int, **changes) -> TxnMetadata:
    start = meta.start_ms if meta.state is TxnState.ONGOING else now_ms
    return _transition(meta, TxnState.ONGOING, now_ms, start_ms=start, **changes)


def add_partitions(
    meta: TxnMetadata | None, producer: ProducerRef, partitions: Iterable[TopicPartition], now_ms: int
) -> TxnMetadata:
    """AddPartitionsToTxn: the partitions join the transaction (beginning it if none is open)."""
    meta = ensure_producer(meta, producer)
    _ensure_not_completing(meta)
    added = frozenset(partitions)
    if meta.state is TxnState.ONGOING and added <= meta.partitions:
        return meta
    return _begin_or_continue(meta, now_ms, partitions=meta.partitions | added)


def verification_error(
    meta: TxnMetadata | None, producer_id: int, producer_epoch: int, tp: TopicPartition
) -> errors.TributaryError | None:
    """Why a partition leader must refuse ``producer_id``'s first transactional batch to ``tp``
    (None: its transaction is open with ``tp`` added, at this epoch)."""
    if meta is None or meta.producer_id != producer_id:
        return errors.InvalidProducerIdMappingError(
            f"producer id {producer_id} belongs to no transactional id; call InitProducerId"
        )
    if producer_epoch < meta.producer_epoch:
        return errors.InvalidProducerEpochError(
            f"producer {producer_id} epoch {producer_epoch} is fenced: epoch {meta.producer_epoch} "
            f"of transactional id {meta.transactional_id!r} took over"
        )
    if producer_epoch > meta.producer_epoch:
        return errors.InvalidProducerEpochError(
            f"producer {producer_id} epoch {producer_epoch} was never handed out "
            f"(current epoch {meta.producer_epoch})"
        )
    if meta.state is not TxnState.ONGOING or tp not in meta.partitions:
        return errors.InvalidTxnStateError(
            f"{tp.topic}-{tp.partition} is not in an open transaction of transactional id "
            f"{meta.transactional_id!r} ({meta.state.name}): call AddPartitionsToTxn before "
            "producing to it"
        )
    return None


def add_group(meta: TxnMetadata | None, producer: ProducerRef, group_id: str, now_ms: int) -> TxnMetadata:
    """AddOffsetsToTxn: offsets of ``group_id`` may be staged in the transaction."""
    meta = ensure_producer(meta, producer)
    _ensure_not_completing(meta)
    if meta.state is TxnState.ONGOING and group_id in meta.groups:
        return meta
    return _begin_or_continue(meta, now_ms, groups=meta.groups | {group_id})


def ensure_can_stage_offsets(meta: TxnMetadata | None, producer: ProducerRef, group_id: str) -> TxnMetadata:
    """The checks of a TxnOffsetCommit that come before any partition is looked at."""
    meta = ensure_producer(meta, producer)
    if meta.state is not TxnState.ONGOING or group_id not in meta.groups:
        raise errors.InvalidTxnStateError(
            f"transactional id {meta.transactional_id!r}: group {group_id!r} is not in an open transaction "
            "(call AddOffsetsToTxn first)"
        )
    return meta


def stage_offsets(
    meta: TxnMetadata | None,
    producer: ProducerRef,
    group_id: str,
    records: Mapping[TopicPartition, OffsetRecord],
    now_ms: int,
) -> TxnMetadata:
    """TxnOffsetCommit: ``records`` are staged for ``group_id`` (a later offset of a partition
    replaces an earlier one)."""
    meta = ensure_can_stage_offsets(meta, producer, group_id)
    if not records:
        return meta
    staged = {**meta.pending_offsets.get(group_id, {}), **records}
    return _transition(
        meta, TxnState.ONGOING, now_ms, pending_offsets={**meta.pending_offsets, group_id: staged}
    )


# ---- EndTxn and completion -----------------------------------------------------------------------


def end_transaction(
    meta: TxnMetadata | None, producer: ProducerRef, commit: bool, now_ms: int
) -> TxnMetadata:
    """EndTxn: ONGOING -> PREPARE_*. The same object back when the same outcome is already being
    completed or was just completed (the caller then waits, or answers at once)."""
    meta = ensure_producer(meta, producer)
    outcome = "commit" if commit else "abort"
    prepare, complete = (
        (TxnState.PREPARE_COMMIT, TxnState.COMPLETE_COMMIT)
        if commit
        else (TxnState.PREPARE_ABORT, TxnState.COMPLETE_ABORT)
    )
    if meta.state is TxnState.ONGOING:
        return _transition(meta, prepare, now_ms)
    if meta.state in (prepare, complete):
        return meta
    if meta.state is TxnState.EMPTY:
        raise errors.InvalidTxnStateError(
            f"transactional id {meta.transactional_id!r} has no transaction to {outcome}"
        )
    raise errors.InvalidTxnStateError(
        f"transactional id {meta.transactional_id!r} cannot {outcome}: its transaction is {meta.state.name}"
    )


def complete(meta: TxnMetadata, now_ms: int) -> TxnMetadata:
    """PREPARE_* -> COMPLETE_* once every marker is written: the transaction is over."""
    done = TxnState.COMPLETE_COMMIT if meta.state is TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
    return _transition(
        meta, done, now_ms, partitions=frozenset(), groups=frozenset(), pending_offsets={}, start_ms=-1
    )


def timed_out(meta: TxnMetadata, now_ms: int) -> bool:
    """Whether an open transaction has run past its transaction.timeout.ms."""
    return meta.state is TxnState.ONGOING and now_ms - meta.start_ms > meta.timeout_ms


def expired(meta: TxnMetadata, now_ms: int, expiration_ms: int) -> bool:
    """Whether an idle transactional id is past transactional.id.expiration.ms."""
    return meta.state.idle and now_ms - meta.last_update_ms >= expiration_ms
