"""The metadata cache and consumer-group keys: group writes (a committing group writes every few
milliseconds) advance the watched revision but neither the metadata revision nor the change
listeners; batch listeners see them."""

from __future__ import annotations

import asyncio
import json

from coordinator import keys
from coordinator.metadata import MetadataCache
from services.etcd.values import EventType, KeyValue, WatchEvent, WatchResync


def event(key: str, revision: int, value: bytes = b"{}") -> WatchEvent:
    return WatchEvent(EventType.PUT, KeyValue(key, value, revision, revision, 1))


def broker(node_id: int, revision: int) -> WatchEvent:
    value = json.dumps({"node_id": node_id, "host": "h", "grpc_port": 1, "fetch_port": 2}).encode()
    return event(keys.broker_key(node_id), revision, value)


def test_group_keys_move_the_revision_but_not_metadata():
    async def scenario():
        cache = MetadataCache()
        changes, batches = [], []
        cache.add_listener(lambda: changes.append(cache.state.metadata_revision))
        cache.add_batch_listener(batches.append)
        cache.apply(WatchResync((), 10))
        waiter = asyncio.create_task(cache.wait_for_revision(12, 2.0))
        metadata_waiter = asyncio.create_task(cache.wait_for_metadata_after(10, 0.2))
        cache.apply([event("groups/g/offsets/t/0", 11)])
        cache.apply([event("groups/g/offsets/t/1", 12)])
        assert await waiter, "read-your-writes waits see group revisions"
        assert not await metadata_waiter, "metadata did not change"
        assert (cache.state.revision, cache.state.metadata_revision) == (12, 10)
        assert changes == [10] and len(batches) == 3
        cache.apply([broker(1, 13)])
        assert (cache.state.revision, cache.state.metadata_revision) == (13, 13) and changes == [10, 13]

    asyncio.run(scenario())
