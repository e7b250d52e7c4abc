"""DeleteRecords: move partitions' log start offsets forward, on each partition's leader.

Kafka's DeleteRecords, as the Admin API and ``kafka-delete-records.sh`` use it: for each
partition, the records below the given offset are deleted (-1 = the high watermark) and the new
log start offset (Kafka's low watermark) is answered. Topics the cluster does not know and
partitions beyond a topic's count fail at once with UNKNOWN_TOPIC_OR_PARTITION, offsets below -1
with OFFSET_OUT_OF_RANGE (as Kafka's broker answers them); the rest go to their leaders through
``StorageNode.DeleteRecords``, retried after metadata refreshes within the deadline
(:mod:`gateway.server.partition_retry`). Errors are per partition: one bad partition does not
fail the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.server import storage_calls
from gateway.server.partition_retry import retry_partitions
from gateway.server.routing import Router
from gateway.server.storage_calls import DeletionOutcome
from services import errors

#: Kafka's DeleteRecords sentinel: delete up to the high watermark.
HIGH_WATERMARK = -1


@dataclass(frozen=True, slots=True)
class RecordDeletion:
    """Delete the records of ``topic``-``partition`` below ``offset`` (-1 = the high watermark)."""

    topic: str
    partition: int
    offset: int


def ensure_valid_deletions(deletions: list[RecordDeletion]) -> None:
    seen: set[tuple[str, int]] = set()
    for d in deletions:
        if (d.topic, d.partition) in seen:
            raise errors.InvalidRequestError(f"{d.topic}-{d.partition} appears twice in the request")
        seen.add((d.topic, d.partition))


class DeleteRecordsHandler:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def delete_records(
        self, deletions: list[RecordDeletion], *, deadline: float
    ) -> list[DeletionOutcome]:
        """One outcome per deletion, in request order."""
        ensure_valid_deletions(deletions)
        final = await self._check(deletions)
        routable = [i for i in range(len(deletions)) if i not in final]

        async def attempt(indexes: list[int], deadline: float) -> dict[int, DeletionOutcome]:
            return await self._round([deletions[i] for i in indexes], indexes, deadline)

        results = await retry_partitions(routable, attempt, refresh=self._router.refresh, deadline=deadline)
        results.update(final)
        return [results[i] for i in range(len(deletions))]

    async def _check(self, deletions: list[RecordDeletion]) -> dict[int, DeletionOutcome]:
        """Outcomes known without asking a node: bad offsets, unknown topics and partitions."""
        final: dict[int, DeletionOutcome] = {}
        for index, d in enumerate(deletions):
            try:
                (await self._router.topic(d.topic)).ensure_partition(d.partition)
                if d.offset < HIGH_WATERMARK:
                    raise errors.OffsetOutOfRangeError(
                        f"cannot delete records of {d.topic}-{d.partition} before offset {d.offset}: "
                        "an offset is >= 0, or -1 for the high watermark"
                    )
            except errors.TributaryError as exc:
                final[index] = DeletionOutcome(d.topic, d.partition, error=exc)
        return final

    async def _round(
        self, deletions: list[RecordDeletion], indexes: list[int], deadline: float
    ) -> dict[int, DeletionOutcome]:
        snapshot = self._router.snapshot
        results: dict[int, DeletionOutcome] = {}
        calls = []
        for index, d in zip(indexes, deletions, strict=True):
            try:
                node = snapshot.ensure_leader(d.topic, d.partition)
            except errors.TributaryError as exc:
                results[index] = DeletionOutcome(d.topic, d.partition, error=exc)
                continue
            calls.append((index, node, d))
        timeout_s = deadline - asyncio.get_running_loop().time()
        answers = await asyncio.gather(
            *(
                storage_calls.delete_records(
                    self._router.clients.storage(node), d.topic, d.partition, d.offset, timeout_s=timeout_s
                )
                for _, node, d in calls
            )
        )
        for (index, _, _), answer in zip(calls, answers, strict=True):
            results[index] = answer
        return results
