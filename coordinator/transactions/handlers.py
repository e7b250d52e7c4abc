"""What the transaction RPCs do, as plain methods over domain values (no gRPC in here).

Transactions live in the active controller. ``locate`` returns this term's
:class:`~coordinator.transactions.manager.TransactionManager`, or raises NOT_CONTROLLER naming the
active controller (on a standby: the servicer then forwards the call there), or
COORDINATOR_NOT_AVAILABLE while etcd is unreachable. Requests whose shape is wrong are refused
here, before they are forwarded anywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from coordinator.groups import rules as group_rules
from coordinator.groups.model import PartitionResult
from coordinator.transactions import state
from coordinator.transactions.manager import TransactionManager
from coordinator.transactions.model import (
    InitProducerIdParams,
    ProducerIdAndEpoch,
    ProducerRef,
    TxnOffsetCommitParams,
)
from services import errors
from services.topic_partition import TopicPartition

#: Transactional ids one DescribeTransactions may name (listing every id has no such bound).
MAX_DESCRIBED_IDS = 10_000


class TransactionHandlers:
    """The Coordinator service's transaction operations, on the active controller's manager."""

    def __init__(self, locate: Callable[[], TransactionManager]) -> None:
        self._locate = locate

    async def init_producer_id(self, params: InitProducerIdParams) -> ProducerIdAndEpoch:
        state.expected_producer(params.producer_id, params.producer_epoch)
        if params.transactional_id:
            state.ensure_valid_transactional_id(params.transactional_id)
        return await self._locate().init_producer_id(params)

    async def add_partitions(
        self, producer: ProducerRef, partitions: Sequence[TopicPartition]
    ) -> list[PartitionResult]:
        state.ensure_valid_transactional_id(producer.transactional_id)
        return await self._locate().add_partitions(producer, partitions)

    async def verify_partitions(
        self, producer_id: int, producer_epoch: int, partitions: Sequence[TopicPartition]
    ) -> list[PartitionResult]:
        if producer_id < 0 or producer_epoch < 0:
            raise errors.InvalidRequestError("verification needs a producer id and epoch >= 0")
        return await self._locate().verify_partitions(producer_id, producer_epoch, partitions)

    async def describe(self, transactional_ids: Sequence[str], states: Sequence[str]) -> list:
        """Metadata per named id (or ``(id, error)``), or every id's in ``states``."""
        if len(transactional_ids) > MAX_DESCRIBED_IDS:
            raise errors.InvalidRequestError(
                f"{len(transactional_ids)} transactional ids named; at most {MAX_DESCRIBED_IDS} per request"
            )
        described = await self._locate().describe(transactional_ids, states)
        return [
            (tid, item) if isinstance(item, errors.TributaryError) else item
            for tid, item in zip(_ids_or_none(transactional_ids, len(described)), described, strict=True)
        ]

    async def add_offsets(self, producer: ProducerRef, group_id: str) -> None:
        state.ensure_valid_transactional_id(producer.transactional_id)
        group_rules.ensure_valid_group_id(group_id)
        await self._locate().add_offsets(producer, group_id)

    async def txn_offset_commit(self, params: TxnOffsetCommitParams) -> list[PartitionResult]:
        state.ensure_valid_transactional_id(params.producer.transactional_id)
        group_rules.ensure_valid_group_id(params.group_id)
        return await self._locate().txn_offset_commit(params)

    async def end_txn(self, producer: ProducerRef, commit: bool) -> None:
        state.ensure_valid_transactional_id(producer.transactional_id)
        await self._locate().end_txn(producer, commit)


def _ids_or_none(transactional_ids: Sequence[str], count: int) -> Sequence[str | None]:
    """The named ids, or None for each of ``count`` described ones when none was named."""
    return transactional_ids or [None] * count
