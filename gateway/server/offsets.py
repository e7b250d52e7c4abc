"""ListOffsets: earliest, latest or by-timestamp offsets, asked of each partition's leader.

Topics the cluster does not know (after one metadata refresh) and partitions beyond a topic's
count fail at once with UNKNOWN_TOPIC_OR_PARTITION; the rest go to their leaders through
``StorageNode.ListPartitionOffsets``, retried after metadata refreshes within the deadline.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from gateway.server import storage_calls
from gateway.server.partition_retry import retry_partitions
from gateway.server.routing import Router
from gateway.server.storage_calls import OffsetOutcome
from services import errors


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    topic: str
    partition: int
    #: Kafka's convention (:mod:`services.offset_spec`): EARLIEST, LATEST or a timestamp in ms.
    #: None when the request's spec was invalid; ``error`` says why.
    timestamp: int | None
    error: errors.TributaryError | None = None


def ensure_valid_queries(queries: list[OffsetQuery]) -> None:
    seen: set[tuple[str, int]] = set()
    for q in queries:
        if (q.topic, q.partition) in seen:
            raise errors.InvalidRequestError(f"{q.topic}-{q.partition} appears twice in the request")
        seen.add((q.topic, q.partition))


class OffsetsHandler:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def list_offsets(
        self, queries: list[OffsetQuery], *, deadline: float, read_committed: bool = False
    ) -> list[OffsetOutcome]:
        """One outcome per query, in request order. ``read_committed``: LATEST is the last
        stable offset, and timestamps find only offsets below it."""
        ensure_valid_queries(queries)
        final = await self._check_queries(queries)
        routable = [i for i in range(len(queries)) if i not in final]

        async def attempt(indexes: list[int], deadline: float) -> dict[int, OffsetOutcome]:
            return await self._do_list_round([queries[i] for i in indexes], indexes, deadline, read_committed)

        results = await retry_partitions(routable, attempt, refresh=self._router.refresh, deadline=deadline)
        results.update(final)
        return [results[i] for i in range(len(queries))]

    async def _check_queries(self, queries: list[OffsetQuery]) -> dict[int, OffsetOutcome]:
        """Outcomes known without asking a node: bad specs, unknown topics and partitions."""
        final: dict[int, OffsetOutcome] = {}
        for index, q in enumerate(queries):
            try:
                if q.error is not None:
                    raise q.error
                (await self._router.topic(q.topic)).ensure_partition(q.partition)
            except errors.TributaryError as exc:
                final[index] = OffsetOutcome(q.topic, q.partition, error=exc)
        return final

    async def _do_list_round(
        self, queries: list[OffsetQuery], indexes: list[int], deadline: float, read_committed: bool
    ) -> dict[int, OffsetOutcome]:
        snapshot = self._router.snapshot
        results: dict[int, OffsetOutcome] = {}
        by_node: dict = {}
        for index, q in zip(indexes, queries, strict=True):
            try:
                node = snapshot.ensure_leader(q.topic, q.partition)
            except errors.TributaryError as exc:
                results[index] = OffsetOutcome(q.topic, q.partition, error=exc)
                continue
            by_node.setdefault(node, []).append((index, q))
        timeout_s = deadline - asyncio.get_running_loop().time()
        nodes = list(by_node)
        answers = await asyncio.gather(
            *(
                storage_calls.list_offsets(
                    self._router.clients.storage(node),
                    [(q.topic, q.partition, q.timestamp) for _, q in by_node[node]],
                    timeout_s=timeout_s,
                    read_committed=read_committed,
                )
                for node in nodes
            )
        )
        for node, answer in zip(nodes, answers, strict=True):
            for index, q in by_node[node]:
                results[index] = answer[(q.topic, q.partition)]
        return results
