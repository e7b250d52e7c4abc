"""PrefixCache against a real etcd: initial load, following changes, rebuilding after compaction."""

from __future__ import annotations

import asyncio

from services.etcd import EtcdClient, Op, PrefixCache, WatchResync

from ._support import TcpLink, run


def _contents(cache: PrefixCache) -> dict[str, bytes]:
    return {key: kv.value for key, kv in cache.snapshot().items()}


def test_cache_loads_then_follows_the_prefix(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            await client.put("brokers/1", "a")
            await client.put("brokers/2", "b")
            loaded_at = await client.put("topics/t", "not in the cache, but the revision counts")
            batches: list[object] = []
            async with PrefixCache(client, "brokers/", on_change=batches.append) as cache:
                assert _contents(cache) == {"brokers/1": b"a", "brokers/2": b"b"}
                assert cache.revision == loaded_at
                revision = await client.put("brokers/3", "c")
                await cache.wait_for_revision(revision, timeout=5)
                assert cache.get("brokers/3") is not None and "brokers/3" in cache
                result = await client.txn([], [Op.delete("brokers/1"), Op.put("brokers/2", "b2")])
                await cache.wait_for_revision(result.revision, timeout=5)
                assert _contents(cache) == {"brokers/2": b"b2", "brokers/3": b"c"}
                assert len(cache) == 2 and sorted(cache) == ["brokers/2", "brokers/3"]
                # The txn arrived as one batch: readers never saw half of it.
                assert [len(b) for b in batches if isinstance(b, list)] == [1, 2]
                waiter = asyncio.create_task(cache.wait_for_change(timeout=5))
                await asyncio.sleep(0.05)
                assert not waiter.done()
                changed_at = await client.put("brokers/9", "z")
                assert await waiter == changed_at

    run(scenario())


def test_cache_rebuilds_after_compaction_while_cut_off(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with (
            etcd_client as writer,
            TcpLink(writer.endpoints[0]) as link,
            EtcdClient(link.endpoint, prefix=writer.prefix, timeout=2.0) as reader,
        ):
            await writer.put("topics/a", "1")
            await writer.put("topics/b", "1")
            resyncs: list[WatchResync] = []
            on_change = lambda b: resyncs.append(b) if isinstance(b, WatchResync) else None  # noqa: E731
            async with PrefixCache(reader, "topics/", on_change=on_change) as cache:
                await link.cut()
                await writer.delete("topics/a")  # a deletion the cache never sees as an event
                await writer.put("topics/c", "2")
                now = await writer.put("topics/b", "2")
                await writer.compact(now)
                await link.restore()
                await cache.wait_for_revision(now, timeout=10)
                assert _contents(cache) == {"topics/b": b"2", "topics/c": b"2"}
                # The initial load, then the rebuild after compaction.
                assert [r.compact_revision for r in resyncs] == [0, now]

    run(scenario())
