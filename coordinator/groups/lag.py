"""Log offsets of partitions, asked of their leaders: log end for lag, any spec for resets.

Partitions are grouped by leader so each storage node gets one ``ListPartitionOffsets`` call; the
calls run in parallel. A partition without a live leader, of an unknown topic, or whose node does
not answer gets its error instead of an offset -- one bad partition never fails the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from coordinator.metadata import MetadataState
from coordinator.model import PartitionStatus, RegisteredBroker
from coordinator.storage_client import StorageNodes
from services import errors
from services.topic_partition import TopicPartition

OffsetOrError = int | errors.TributaryError


async def log_offsets(
    state: MetadataState, storage: StorageNodes, partitions: Iterable[TopicPartition], timestamp: int
) -> dict[TopicPartition, OffsetOrError]:
    """Each partition's offset for ``timestamp`` (EARLIEST, LATEST or ms; -1 when no record is
    that recent), or the error that prevented reading it."""
    results: dict[TopicPartition, OffsetOrError] = {}
    by_leader: dict[int, list[TopicPartition]] = {}
    for tp in partitions:
        leader = _leader(state, tp)
        if isinstance(leader, errors.TributaryError):
            results[tp] = leader
        else:
            by_leader.setdefault(leader.node_id, []).append(tp)
    answers = await asyncio.gather(
        *(_ask(storage, state.brokers[node], tps, timestamp) for node, tps in by_leader.items())
    )
    for answer in answers:
        results.update(answer)
    return results


def _leader(state: MetadataState, tp: TopicPartition) -> RegisteredBroker | errors.TributaryError:
    topic = state.live_topic(tp.topic)
    if topic is None or not 0 <= tp.partition < topic.partition_count:
        return errors.UnknownTopicOrPartitionError(f"{tp.topic}-{tp.partition} does not exist")
    view = state.partition_view(topic, tp.partition)
    broker = state.brokers.get(view.leader)
    if view.status is not PartitionStatus.ONLINE or broker is None:
        return errors.LeaderNotAvailableError(f"{tp.topic}-{tp.partition} has no live leader")
    return broker


async def _ask(
    storage: StorageNodes, broker: RegisteredBroker, tps: list[TopicPartition], timestamp: int
) -> dict[TopicPartition, OffsetOrError]:
    try:
        answers = await storage.list_offsets(broker, [(tp.topic, tp.partition, timestamp) for tp in tps])
    except errors.TributaryError as exc:
        return {tp: exc for tp in tps}
    found: dict[TopicPartition, OffsetOrError] = {
        TopicPartition(topic, partition): error if error is not None else offset
        for topic, partition, offset, error in answers
    }
    missing = errors.BrokerNotAvailableError(f"node {broker.node_id} did not answer for this partition")
    return {tp: found.get(tp, missing) for tp in tps}
