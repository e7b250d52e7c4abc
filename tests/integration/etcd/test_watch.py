"""Watches against a real etcd: order, restarts, disconnects and compaction."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from services.etcd import (
    EmbeddedEtcd,
    EtcdClient,
    EtcdUnavailableError,
    EventType,
    Op,
    WatchEvent,
    WatchResync,
)

from ._support import TcpLink, assert_nothing_more, run, take


def _summary(items: list) -> list[tuple[str, str, bytes]]:
    return [(e.type.value, e.kv.key, e.kv.value) for e in items]


def test_watch_delivers_puts_and_deletes_in_order(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            await client.put("topics/before", "not seen: written before the watch")
            async with await client.watch_prefix("topics/", prev_kv=True) as watch:
                await client.put("topics/a", "1")
                await client.put("elsewhere", "not under the prefix")
                await client.put("topics/a", "2")
                await client.txn([], [Op.put("topics/b", "x"), Op.delete("topics/a")])
                await client.delete_prefix("topics/")
                items = await take(watch, 6)
                assert _summary(items) == [
                    ("put", "topics/a", b"1"),
                    ("put", "topics/a", b"2"),
                    ("put", "topics/b", b"x"),
                    ("delete", "topics/a", b""),
                    ("delete", "topics/b", b""),
                    ("delete", "topics/before", b""),
                ]
                revisions = [e.revision for e in items]
                assert revisions == sorted(revisions)
                assert items[2].revision == items[3].revision  # one txn, one revision
                assert items[1].prev_kv is not None and items[1].prev_kv.value == b"1"
                assert items[3].prev_kv is not None and items[3].prev_kv.value == b"2"
                assert watch.revision == items[-1].revision
                await assert_nothing_more(watch)

    run(scenario())


def test_batches_keep_a_txn_together(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client, await client.watch_prefix("p/") as watch:
            await client.txn([], [Op.put("p/1", "a"), Op.put("p/2", "b"), Op.put("p/3", "c")])
            batch = await asyncio.wait_for(watch.next_batch(), 5)
            assert isinstance(batch, list) and [e.kv.key for e in batch] == ["p/1", "p/2", "p/3"]

    run(scenario())


def test_watch_from_a_past_revision_replays_history(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            first = await client.put("k/1", "a")
            await client.put("k/2", "b")
            await client.delete("k/1")
            async with await client.watch_prefix("k/", start_revision=first) as watch:
                assert _summary(await take(watch, 3)) == [
                    ("put", "k/1", b"a"),
                    ("put", "k/2", b"b"),
                    ("delete", "k/1", b""),
                ]

    run(scenario())


def test_several_watches_share_one_stream_without_crosstalk(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            brokers = await client.watch_prefix("brokers/")
            topics = await client.watch_prefix("topics/")
            one_key = await client.watch_key("controller")
            for key in ("brokers/1", "topics/t", "controller", "controllerX", "brokers/2"):
                await client.put(key, "v")
            assert [e.kv.key for e in await take(brokers, 2)] == ["brokers/1", "brokers/2"]
            assert [e.kv.key for e in await take(topics, 1)] == ["topics/t"]
            assert [e.kv.key for e in await take(one_key, 1)] == ["controller"]
            await topics.cancel()
            await client.put("topics/u", "v")
            await client.put("brokers/3", "v")
            assert [e.kv.key for e in await take(brokers, 1)] == ["brokers/3"]
            assert [item async for item in topics] == []  # cancelled: iteration just ends
            for watch in (brokers, one_key):
                await assert_nothing_more(watch, 0.1)
                await watch.cancel()

    run(scenario())


def test_snapshot_watch_starts_with_the_current_contents(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            await client.put("brokers/1", "a")
            revision = await client.put("brokers/2", "b")
            async with await client.watch_prefix_with_snapshot("brokers/") as watch:
                await client.put("brokers/3", "c")
                snapshot, event = await take(watch, 2)
                assert isinstance(snapshot, WatchResync)
                assert snapshot.revision == revision and snapshot.compact_revision == 0
                assert [(kv.key, kv.value) for kv in snapshot.kvs] == [
                    ("brokers/1", b"a"),
                    ("brokers/2", b"b"),
                ]
                assert isinstance(event, WatchEvent) and event.kv.key == "brokers/3"

    run(scenario())


def test_watch_survives_an_etcd_restart(etcd_factory: Callable[..., EmbeddedEtcd]) -> None:
    server = etcd_factory()

    async def scenario() -> None:
        async with (
            EtcdClient(server.endpoint, timeout=2.0) as client,
            await client.watch_prefix("topics/") as watch,
        ):
            await client.put("topics/1", "before")
            await client.put("topics/2", "before")
            assert _summary(await take(watch, 2)) == [
                ("put", "topics/1", b"before"),
                ("put", "topics/2", b"before"),
            ]
            await asyncio.to_thread(server.restart)
            await client.put("topics/3", "after")
            await client.delete("topics/1")
            await client.put("topics/2", "after")
            assert _summary(await take(watch, 3, timeout=10)) == [
                ("put", "topics/3", b"after"),
                ("delete", "topics/1", b""),
                ("put", "topics/2", b"after"),
            ]
            await assert_nothing_more(watch, 0.5)  # nothing from before the restart again

    run(scenario())


def test_watch_catches_up_on_changes_made_while_it_was_cut_off(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with (
            etcd_client as writer,
            TcpLink(writer.endpoints[0]) as link,
            EtcdClient(link.endpoint, prefix=writer.prefix, timeout=2.0) as reader,
            await reader.watch_prefix("topics/") as watch,
        ):
            await writer.put("topics/1", "a")
            assert _summary(await take(watch, 1)) == [("put", "topics/1", b"a")]
            await link.cut()
            await writer.put("topics/2", "b")
            await writer.delete("topics/1")
            await asyncio.sleep(0.3)
            await link.restore()
            await writer.put("topics/3", "c")
            assert _summary(await take(watch, 3, timeout=10)) == [
                ("put", "topics/2", b"b"),
                ("delete", "topics/1", b""),
                ("put", "topics/3", b"c"),
            ]
            await assert_nothing_more(watch)

    run(scenario())


def test_watch_resyncs_when_its_resume_revision_was_compacted(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with (
            etcd_client as writer,
            TcpLink(writer.endpoints[0]) as link,
            EtcdClient(link.endpoint, prefix=writer.prefix, timeout=2.0) as reader,
        ):
            await writer.put("brokers/1", "a")
            await writer.put("brokers/2", "b")
            async with await reader.watch_prefix("brokers/") as watch:
                await writer.put("brokers/3", "c")
                assert _summary(await take(watch, 1)) == [("put", "brokers/3", b"c")]
                await link.cut()
                # While cut off: changes, then compaction past everything the watch has seen.
                await writer.delete("brokers/1")
                await writer.put("brokers/2", "b2")
                await writer.put("brokers/4", "d")
                compact_at = await writer.put("unrelated", "x")
                await writer.compact(compact_at)
                await link.restore()
                resync = (await take(watch, 1, timeout=10))[0]
                assert isinstance(resync, WatchResync)
                assert resync.compact_revision == compact_at
                truth, _ = await writer.get_prefix("brokers/")
                assert list(resync.kvs) == truth
                assert [(kv.key, kv.value) for kv in resync.kvs] == [
                    ("brokers/2", b"b2"),
                    ("brokers/3", b"c"),
                    ("brokers/4", b"d"),
                ]
                # And the watch goes on from right after the snapshot.
                after = await writer.put("brokers/5", "e")
                event = (await take(watch, 1))[0]
                assert (event.type, event.kv.key, event.revision) == (EventType.PUT, "brokers/5", after)
                await assert_nothing_more(watch)

    run(scenario())


def test_watch_from_a_compacted_revision_starts_with_a_resync(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            old = await client.put("k/1", "a")
            await client.put("k/1", "b")
            now = await client.put("k/2", "c")
            await client.compact(now)
            async with await client.watch_prefix("k/", start_revision=old) as watch:
                resync = (await take(watch, 1))[0]
                assert isinstance(resync, WatchResync) and resync.compact_revision == now
                assert [(kv.key, kv.value) for kv in resync.kvs] == [("k/1", b"b"), ("k/2", b"c")]

    run(scenario())


def test_opening_a_watch_while_etcd_is_down_fails_within_the_timeout(
    etcd_factory: Callable[..., EmbeddedEtcd],
) -> None:
    server = etcd_factory()
    server.stop()

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, timeout=1.0) as client:
            loop = asyncio.get_running_loop()
            started = loop.time()
            with pytest.raises(EtcdUnavailableError):
                await client.watch_prefix("x/")
            assert loop.time() - started < 1.5

    run(scenario())
