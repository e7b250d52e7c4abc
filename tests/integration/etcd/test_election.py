"""Leader election against a real etcd: exclusivity, hand-over, loss, waiting, epochs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from services.etcd import (
    Election,
    EmbeddedEtcd,
    EtcdClient,
    EtcdGuardFailedError,
    LeaderInfo,
    NotLeaderError,
    epoch_guard,
)
from tests.support.wait import async_wait_until

from ._support import run

TTL = 1


async def _campaign_in_background(election: Election) -> asyncio.Task[None]:
    task = asyncio.create_task(election.campaign())
    await asyncio.sleep(0.3)  # long enough to have tried the key at least once
    return task


def test_two_candidates_one_leader_then_hand_over_on_resign(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as a_client, a_client.with_prefix(a_client.prefix) as b_client:
            a = Election(a_client, "controller", "coord-a", ttl=TTL)
            b = Election(b_client, "controller", "coord-b", ttl=TTL)
            results = await asyncio.wait(
                [asyncio.create_task(a.campaign()), asyncio.create_task(b.campaign())],
                timeout=2.0,
            )
            done, pending = results
            assert len(done) == 1 and len(pending) == 1, "exactly one candidate may win"
            winner, loser = (a, b) if a.is_leader else (b, a)
            assert not loser.is_leader
            leader = await winner.leader()
            assert leader is not None and leader.value == winner.candidate_id.encode()
            assert leader.lease == winner.lease.id  # type: ignore[union-attr]
            await winner.resign()
            await asyncio.wait_for(pending.pop(), 3.0)
            assert loser.is_leader and not winner.is_leader
            assert not winner.lost.is_set(), "resigning is not losing"
            leader = await loser.leader()
            assert leader is not None and leader.value == loser.candidate_id.encode()
            await loser.resign()
            assert await loser.leader() is None

    run(scenario())


def test_revoked_leader_lease_hands_over_and_reports_loss(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as a_client, a_client.with_prefix(a_client.prefix) as b_client:
            reasons: list[str] = []
            a = Election(a_client, "controller", "coord-a", ttl=TTL, on_lost=reasons.append)
            b = Election(b_client, "controller", "coord-b", ttl=TTL)
            await a.campaign()
            b_task = await _campaign_in_background(b)
            assert not b_task.done()
            # The leader process's lease is revoked (as if an operator or a fence did it).
            await b_client.revoke_lease(a.lease.id)  # type: ignore[union-attr]
            await asyncio.wait_for(b_task, 3.0)
            assert b.is_leader
            async with asyncio.timeout(2.0):
                await a.lost.wait()
            assert not a.is_leader and reasons and a.loss_reason == reasons[0]
            with pytest.raises(NotLeaderError):
                a.guard()
            await b.resign()

    run(scenario())


def test_a_waiting_candidate_stays_in_the_race_past_three_ttls(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as a_client, a_client.with_prefix(a_client.prefix) as b_client:
            a = Election(a_client, "controller", "coord-a", ttl=TTL)
            b = Election(b_client, "controller", "coord-b", ttl=TTL)
            await a.campaign()
            b_task = await _campaign_in_background(b)
            waiting_lease = b.lease
            assert waiting_lease is not None
            await asyncio.sleep(3.5 * TTL)
            assert not b_task.done()
            assert await waiting_lease.remaining_ttl() >= 0, "the waiting candidate's lease lapsed"
            await a.resign()
            await asyncio.wait_for(b_task, 3.0)
            assert b.lease == waiting_lease
            holder = await b.leader()
            assert holder is not None and holder.lease == waiting_lease.id
            await asyncio.sleep(2.0 * TTL)  # the won key is still kept alive
            assert b.is_leader and not b.lost.is_set()
            assert (await b.leader()) == holder
            await b.resign()

    run(scenario())


def test_epochs_fence_a_deposed_leader(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as a_client, a_client.with_prefix(a_client.prefix) as b_client:
            a = Election(a_client, "controller", "coord-a", ttl=TTL)
            b = Election(b_client, "controller", "coord-b", ttl=TTL)
            await a.campaign()
            epoch_a = await a.increment_epoch("controller_epoch")
            await a.proclaim(f"coord-a@{epoch_a}")
            assert (await b.leader()).value == f"coord-a@{epoch_a}".encode()  # type: ignore[union-attr]
            await a_client.put("topics/t", "by a", guard=[epoch_guard("controller_epoch", epoch_a)])
            b_task = await _campaign_in_background(b)
            await b_client.revoke_lease(a.lease.id)  # type: ignore[union-attr]
            await asyncio.wait_for(b_task, 3.0)
            epoch_b = await b.increment_epoch("controller_epoch")
            assert epoch_b == epoch_a + 1
            # a has not necessarily noticed yet; its epoch-guarded writes fail regardless.
            with pytest.raises(EtcdGuardFailedError):
                await a_client.put("topics/t", "by stale a", guard=[epoch_guard("controller_epoch", epoch_a)])
            await async_wait_until(lambda: a.lost.is_set(), timeout=2.0)
            with pytest.raises(NotLeaderError):
                await a.increment_epoch("controller_epoch")
            assert (await b_client.get("topics/t")).value == b"by a"  # type: ignore[union-attr]
            await b.resign()

    run(scenario())


def test_leader_loses_when_its_key_is_deleted_behind_its_back(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            a = Election(client, "controller", "coord-a", ttl=TTL)
            await a.campaign()
            await client.delete("controller")
            async with asyncio.timeout(2.0):
                await a.lost.wait()
            assert "deleted" in (a.loss_reason or "")
            await a.resign()

    run(scenario())


def test_leader_loses_when_etcd_is_unreachable_longer_than_the_ttl(
    etcd_factory: Callable[..., EmbeddedEtcd],
) -> None:
    server = etcd_factory()

    async def scenario() -> None:
        async with EtcdClient(server.endpoint, timeout=1.0) as client:
            a = Election(client, "controller", "coord-a", ttl=TTL)
            await a.campaign()
            await asyncio.to_thread(server.stop)
            async with asyncio.timeout(TTL + 1.5):
                await a.lost.wait()
            assert not a.is_leader and "lease lost" in (a.loss_reason or "")
            await asyncio.to_thread(server.start)
            await a.resign()

    run(scenario())


def test_observe_reports_every_change_of_leader(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client, client.with_prefix(client.prefix) as b_client:
            a = Election(client, "controller", "coord-a", ttl=TTL)
            b = Election(b_client, "controller", "coord-b", ttl=TTL)
            seen: list[bytes | None] = []

            async def observer() -> None:
                info: LeaderInfo | None
                async for info in a.observe():
                    seen.append(info.value if info else None)

            watcher = asyncio.create_task(observer())
            await async_wait_until(lambda: seen == [None])
            await a.campaign()
            b_task = await _campaign_in_background(b)
            await a.resign()
            await asyncio.wait_for(b_task, 3.0)
            await b.proclaim("coord-b@2")
            await b.resign()
            await async_wait_until(lambda: len(seen) == 6)
            assert seen == [None, b"coord-a", None, b"coord-b", b"coord-b@2", None]
            watcher.cancel()

    run(scenario())
