"""Endpoint failover and behaviour while etcd is unreachable, against a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from services.etcd import EmbeddedEtcd, EtcdClient, EtcdUnavailableError, WatchEvent
from services.etcd.embedded import pick_free_port
from tests.support.wait import async_wait_until

from ._support import run, take


def test_calls_fail_over_from_a_dead_first_endpoint(etcd: EmbeddedEtcd, etcd_client: EtcdClient) -> None:
    dead = f"127.0.0.1:{pick_free_port()}"

    async def scenario() -> None:
        async with EtcdClient([dead, etcd.endpoint], prefix=etcd_client.prefix, timeout=2.0) as client:
            assert client.current_endpoint == dead
            await client.put("brokers/1", "a")
            assert client.current_endpoint == etcd.endpoint
            assert (await client.get("brokers/1")).value == b"a"  # type: ignore[union-attr]
            assert (await client.status()).has_leader

        # A write txn is retried on the next endpoint only because the dead one never got it.
        async with EtcdClient([dead, etcd.endpoint], prefix=etcd_client.prefix, timeout=2.0) as client:
            assert await client.create_if_absent("controller", "c1")

        # Streams start on the current endpoint, so they fail over as well.
        async with EtcdClient(f"{dead},{etcd.endpoint}", prefix=etcd_client.prefix, timeout=2.0) as client:
            watch = await client.watch_prefix("brokers/")
            lease = await client.grant_lease(1)
            async with client.keep_alive(lease) as keep_alive:
                await client.put("brokers/2", "b", lease)
                event = (await take(watch, 1))[0]
                assert isinstance(event, WatchEvent) and event.kv.key == "brokers/2"
                await asyncio.sleep(1.5)
                assert not keep_alive.lost.is_set()
                assert await client.get("brokers/2") is not None
            await watch.cancel()

    run(scenario())


def test_calls_while_etcd_is_stopped_fail_fast_and_work_again_after_restart(
    etcd_factory: Callable[..., EmbeddedEtcd],
) -> None:
    server = etcd_factory()
    timeout = 1.0

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, timeout=timeout) as client:
            await client.put("k", "before")
            await asyncio.to_thread(server.stop)
            calls: list[Callable[[], Awaitable[object]]] = [
                lambda: client.get("k"),
                lambda: client.put("k", "during"),
                lambda: client.create_if_absent("other", "x"),
                lambda: client.grant_lease(5),
                lambda: client.status(),
            ]
            loop = asyncio.get_running_loop()
            for call in calls:
                started = loop.time()
                with pytest.raises(EtcdUnavailableError) as failure:
                    await call()
                assert loop.time() - started <= timeout + 0.5
                assert server.endpoint in str(failure.value)
            await asyncio.to_thread(server.start)
            await async_wait_until(lambda: _works(client), timeout=3.0)
            assert (await client.get("k")).value == b"before"  # type: ignore[union-attr]

    run(scenario())


def test_a_hung_endpoint_costs_no_more_than_the_timeout() -> None:
    async def scenario() -> None:
        # Accepts TCP connections and then says nothing, like a wedged or blackholed server.
        hung = await asyncio.start_server(lambda r, w: asyncio.sleep(30), "127.0.0.1", 0)
        port = hung.sockets[0].getsockname()[1]
        try:
            async with EtcdClient(f"127.0.0.1:{port}", timeout=0.5) as client:
                loop = asyncio.get_running_loop()
                started = loop.time()
                with pytest.raises(EtcdUnavailableError):
                    await client.get("k")
                assert 0.4 <= loop.time() - started <= 1.2
        finally:
            hung.close()

    run(scenario())


async def _works(client: EtcdClient) -> bool:
    try:
        await client.get("k")
    except EtcdUnavailableError:
        return False
    return True
