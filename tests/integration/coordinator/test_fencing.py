"""Epoch fencing, in-process against real etcd: a deposed controller that has not noticed yet
cannot write anything, steps down on its first attempt, and names its successor.

The process-level version (SIGSTOP / SIGCONT) is in ``test_faults.py``; this one controls the
order of events exactly, so it proves the guard itself rather than the lease-loss detection.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from coordinator import keys
from coordinator.controller import Controller, ControllerSettings
from coordinator.metadata import MetadataCache
from coordinator.model import ControllerInfo, TopicSpec
from coordinator.redirect import ControllerMovedError
from coordinator.storage_client import StorageNodes
from services.etcd import EtcdClient
from services.etcd.election import Election
from services.etcd.txn import Compare


def run(coro, timeout: float = 30.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


async def _elect(client: EtcdClient, name: str, address: str) -> tuple[Election, int]:
    election = Election(client, keys.CONTROLLER, name, ttl=1)
    await election.campaign()
    epoch = await election.increment_epoch(keys.CONTROLLER_EPOCH)
    await election.proclaim(keys.encode_controller(ControllerInfo(name, address, epoch)))
    return election, epoch


@pytest.mark.parametrize("guards", ["epoch+election", "epoch-only"])
def test_deposed_controller_write_is_rejected_and_it_steps_down(etcd, etcd_client, guards, caplog):
    run(_deposed_controller_scenario(etcd, etcd_client, guards))
    assert "write rejected, controller epoch 1 is stale" in caplog.text


async def _deposed_controller_scenario(etcd, client: EtcdClient, guards: str) -> None:
    other = EtcdClient(etcd.endpoint, prefix=client.prefix)
    cache = MetadataCache()
    storage = StorageNodes(timeout=0.2)
    async with client, other:
        follow = asyncio.create_task(cache.watch_routine(client))
        # A registered node (no process behind it: partitions just stay PENDING).
        await client.put(
            keys.broker_key(1),
            json.dumps({"node_id": 1, "host": "127.0.0.1", "grpc_port": 1, "fetch_port": 1, "rack": ""}),
        )
        assert await cache.wait_for(lambda s: 1 in s.brokers, 5)
        election_a, epoch_a = await _elect(client, "a", "127.0.0.1:1001")
        # A's view of its guard, frozen: A is about to be paused and will not notice anything.
        frozen = election_a.guard() if guards == "epoch+election" else Compare.present(keys.CONTROLLER)
        controller_a = Controller(
            client=client,
            cache=cache,
            storage=storage,
            epoch=epoch_a,
            election_guard=lambda: frozen,
            settings=ControllerSettings(admin_wait_s=0.3),
        )

        # Positive control: while current, A's writes land.
        await controller_a.create_topic(TopicSpec("before", 2))
        assert await client.get(keys.topic_key("before")) is not None

        # A is "paused": its lease runs out (etcd revokes it) and B is elected with a new epoch.
        assert election_a.lease is not None
        await other.revoke_lease(election_a.lease.id)
        election_b, epoch_b = await _elect(other, "b", "127.0.0.1:1002")
        assert epoch_b == epoch_a + 1
        assert await cache.wait_for(lambda s: s.controller is not None and s.controller.epoch == epoch_b, 5)

        # A wakes up and tries to write: rejected, nothing written, A steps down naming B.
        with pytest.raises(ControllerMovedError) as info:
            await controller_a.create_topic(TopicSpec("after", 2))
        assert info.value.reason == "NOT_CONTROLLER"
        assert info.value.active_id == "b" and info.value.active_address == "127.0.0.1:1002"
        assert controller_a.deposed.is_set()
        assert await client.get(keys.topic_key("after")) is None
        stored_epoch = await client.get(keys.CONTROLLER_EPOCH)
        assert stored_epoch is not None and stored_epoch.value == str(epoch_b).encode()
        # And every later call fails fast, without touching etcd.
        with pytest.raises(ControllerMovedError):
            await controller_a.delete_topic("before")
        assert await client.get(keys.topic_key("before")) is not None

        await election_b.resign()
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        await storage.close()
