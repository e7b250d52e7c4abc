"""Which topics a controller pass plans: only what changed, everything when anything shared did.

A pass used to plan every partition of the cluster after every metadata change, so creating a
topic of 1,000 partitions (ten state writes, ten passes) cost in proportion to the cluster.
"""

from __future__ import annotations

import asyncio
import json

from coordinator import controller as controller_module
from coordinator import keys
from coordinator.controller import Controller
from coordinator.metadata import MetadataCache
from coordinator.model import PartitionRecord, PartitionStatus, TopicRecord
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync


def _kv(key: str, value: bytes, revision: int) -> KeyValue:
    return KeyValue(key, value, revision, revision, 1, 0)


def _broker(node_id: int, revision: int) -> KeyValue:
    value = {"node_id": node_id, "host": "h", "grpc_port": 1, "fetch_port": 2, "rack": ""}
    return _kv(keys.broker_key(node_id), json.dumps(value).encode(), revision)


def _topic(name: str, revision: int) -> KeyValue:
    record = TopicRecord(name, "id-" + name, 1, {}, ((1,),))
    return _kv(keys.topic_key(name), keys.encode_topic(record), revision)


def _partition(name: str, revision: int) -> KeyValue:
    record = PartitionRecord((1,), 1, 0, (1,), PartitionStatus.ONLINE)
    return _kv(keys.partition_key(name, 0), keys.encode_partition(record), revision)


def _controller(cache: MetadataCache) -> Controller:
    return Controller(
        client=None,
        cache=cache,
        storage=None,  # type: ignore[arg-type]  # a pass's planning calls no storage node
        epoch=1,
        election_guard=lambda: None,  # type: ignore[arg-type,return-value]  # nor etcd
    )


def test_a_pass_plans_what_changed_and_everything_after_shared_changes():
    async def scenario() -> None:
        cache = MetadataCache()
        cache.apply(WatchResync((_broker(1, 10), _topic("a", 11), _topic("b", 12)), 20))
        controller = _controller(cache)
        state = cache.state
        assert controller._topics_to_plan(state) is None  # the term's first pass sees everything
        controller._planned_revision = state.metadata_revision
        assert controller._topics_to_plan(state) == set()  # nothing changed: nothing to plan
        cache.apply([WatchEvent(EventType.PUT, _partition("a", 21))])
        assert controller._topics_to_plan(state) == {"a"}
        controller._unfinished_topics = {"b"}  # work left in b by the last pass is retried
        assert controller._topics_to_plan(state) == {"a", "b"}
        controller._dirty_topics.add("c")
        assert controller._topics_to_plan(state) == {"a", "b", "c"}
        assert controller._topics_to_plan(state) == {"a", "b"}  # marks are used once
        controller._planned_revision = state.metadata_revision
        controller._unfinished_topics = set()
        cache.apply([WatchEvent(EventType.PUT, _broker(2, 22))])  # every partition's view may change
        assert controller._topics_to_plan(state) is None
        controller._planned_revision = state.metadata_revision
        assert controller._topics_to_plan(state) == set()
        controller._full_pass_due = True  # e.g. a controlled shutdown began
        assert controller._topics_to_plan(state) is None
        controller._last_full_pass -= controller_module.FULL_PASS_INTERVAL_S  # the periodic safety net
        assert controller._topics_to_plan(state) is None

    asyncio.run(scenario())
