"""Leases and keep-alive against a real etcd: expiry, keep-alive, and loss reported as an event.

TTLs are 1 s (the embedded etcd's minimum with its 500 ms election timeout) to keep this fast.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from services.etcd import EmbeddedEtcd, EtcdClient, Lease
from tests.support.wait import async_wait_until

from ._support import run


def test_keep_alive_keeps_the_key_past_three_ttls(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            lease = await client.grant_lease(1)
            assert lease.ttl == 1
            await client.put("brokers/1", "host:9092", lease)
            async with client.keep_alive(lease) as keep_alive:
                await asyncio.sleep(3.5)
                assert await client.get("brokers/1") is not None
                assert not keep_alive.lost.is_set()
                assert await lease.remaining_ttl() >= 0
            # Stopped without revoking: the key outlives the keep-alive by at most the TTL.
            await async_wait_until(lambda: _absent(client, "brokers/1"), timeout=3.0)
            assert not keep_alive.lost.is_set(), "stop() must not report loss"

    run(scenario())


def test_a_lease_not_kept_alive_expires_with_its_key(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            lease = await client.grant_lease(1)
            await client.put("brokers/2", "host:9092", lease)
            assert await client.get("brokers/2") is not None
            await async_wait_until(lambda: _absent(client, "brokers/2"), timeout=3.0)
            assert await lease.remaining_ttl() == -1
            assert await lease.refresh() == 0
            assert await lease.revoke() is False

    run(scenario())


def test_revoke_deletes_the_keys_at_once(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            lease = await client.grant_lease(60)
            await client.put("groups/g/members/m1", "a", lease)
            await client.put("groups/g/members/m2", "b", lease)
            assert await lease.revoke() is True
            kvs, _ = await client.get_prefix("groups/g/members/")
            assert kvs == []

    run(scenario())


def test_keep_alive_reports_loss_when_the_lease_is_revoked_elsewhere(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client, client.with_prefix(client.prefix) as other:
            losses: list[tuple[Lease, str]] = []
            lease = await client.grant_lease(1)
            async with client.keep_alive(
                lease, on_lost=lambda lost, reason: losses.append((lost, reason))
            ) as keep_alive:
                await asyncio.sleep(0.5)
                assert not keep_alive.lost.is_set()
                await other.revoke_lease(lease.id)
                async with asyncio.timeout(1.5):
                    reason = await keep_alive.wait_lost()
            assert "expired or was revoked" in reason
            assert losses == [(lease, reason)]
            assert not keep_alive.running

    run(scenario())


def test_keep_alive_reports_loss_when_etcd_is_down_longer_than_the_ttl(
    etcd_factory: Callable[..., EmbeddedEtcd],
) -> None:
    server = etcd_factory()

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, timeout=1.0) as client:
            lease = await client.grant_lease(1)
            async with client.keep_alive(lease) as keep_alive:
                await asyncio.sleep(0.5)
                loop = asyncio.get_running_loop()
                stopped_at = loop.time()
                await asyncio.to_thread(server.stop)
                async with asyncio.timeout(2.5):
                    reason = await keep_alive.wait_lost()
                # Reported once the TTL ran out with no successful refresh -- not much later.
                assert loop.time() - stopped_at <= 2.0
                assert "TTL ran out" in reason
            await asyncio.to_thread(server.start)

    run(scenario())


def test_keep_alive_rides_out_a_short_etcd_restart(etcd_factory: Callable[..., EmbeddedEtcd]) -> None:
    server = etcd_factory()

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, timeout=1.0) as client:
            lease = await client.grant_lease(3)
            await client.put("brokers/3", "host:9092", lease)
            async with client.keep_alive(lease) as keep_alive:
                await asyncio.to_thread(server.restart)
                await asyncio.sleep(3.3)  # longer than the TTL: refreshes resumed after the restart
                assert not keep_alive.lost.is_set(), keep_alive.loss_reason
                assert await client.get("brokers/3") is not None

    run(scenario())


async def _absent(client: EtcdClient, key: str) -> bool:
    return await client.get(key) is None
