"""Key-value, transactions and guarded writes against a real etcd."""

from __future__ import annotations

import asyncio

import grpc
import pytest

import services.etcd.client as client_module
from services.etcd import (
    Compare,
    EtcdClient,
    EtcdCompactedError,
    EtcdGuardFailedError,
    EtcdInvalidArgumentError,
    EtcdRequestTooLargeError,
    Op,
    epoch_guard,
    increment_counter,
)

from ._support import run


def test_put_get_delete(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            first = await client.put("brokers/1", b"host-a:9092")
            second = await client.put("brokers/1", "host-b:9092")
            assert second > first
            kv = await client.get("brokers/1")
            assert kv is not None
            assert (kv.key, kv.value) == ("brokers/1", b"host-b:9092")
            assert (kv.create_revision, kv.mod_revision, kv.version, kv.lease) == (first, second, 2, 0)
            assert await client.get("brokers/2") is None
            assert await client.delete("brokers/1") is True
            assert await client.delete("brokers/1") is False
            assert await client.get("brokers/1") is None

    run(scenario())


def test_get_prefix_is_sorted_consistent_and_paged(
    etcd_client: EtcdClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client_module, "PAGE_SIZE", 3)  # force several Range pages

    async def scenario() -> None:
        async with etcd_client as client:
            for p in (7, 0, 3, 9, 1, 5, 2, 8, 4, 6):
                await client.put(f"topics/orders/{p}", f"partition {p}")
            await client.put("topics/orders2", "a sibling with the same leading characters")
            last = await client.put("topics/other/0", "x")
            kvs, revision = await client.get_prefix("topics/orders/")
            assert [kv.key for kv in kvs] == [f"topics/orders/{p}" for p in range(10)]
            assert [kv.value for kv in kvs] == [f"partition {p}".encode() for p in range(10)]
            assert revision == last
            everything, _ = await client.get_prefix("")
            assert len(everything) == 12
            assert await client.delete_prefix("topics/orders/") == 10
            remaining, _ = await client.get_prefix("topics/")
            assert [kv.key for kv in remaining] == ["topics/orders2", "topics/other/0"]

    run(scenario())


def test_key_prefix_is_applied_and_stripped(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with (
            etcd_client as client,
            client.with_prefix("") as raw,
            client.with_prefix(client.prefix + "nested/") as nested,
        ):
            await client.put("controller", "c1")
            await nested.put("controller", "c2")
            full = await raw.get(client.prefix + "controller")
            assert full is not None and full.value == b"c1"
            assert (await client.get("nested/controller")).value == b"c2"  # type: ignore[union-attr]
            kvs, _ = await nested.get_prefix("")
            assert [kv.key for kv in kvs] == ["controller"]

    run(scenario())


def test_create_if_absent_is_exclusive_under_concurrency(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        # Ten separate clients (ten connections), so the txns really race at the server.
        clients = [etcd_client.with_prefix(etcd_client.prefix) for _ in range(10)]
        try:
            results = await asyncio.gather(
                *(c.create_if_absent("groups/g1/owners/t/0", f"member-{i}") for i, c in enumerate(clients))
            )
            assert sorted(results) == [False] * 9 + [True]
            winner = results.index(True)
            kv = await clients[0].get("groups/g1/owners/t/0")
            assert kv is not None and kv.value == f"member-{winner}".encode() and kv.version == 1
        finally:
            for c in clients:
                await c.close()

    run(scenario())


def test_compare_and_swap(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            key = "topics/orders/0"
            assert await client.compare_and_swap(key, "leader=1", expected_mod_revision=0)
            assert not await client.compare_and_swap(key, "leader=9", expected_mod_revision=0)
            kv = await client.get(key)
            assert kv is not None
            assert await client.compare_and_swap(key, "leader=2", expected_mod_revision=kv.mod_revision)
            assert not await client.compare_and_swap(key, "leader=3", expected_mod_revision=kv.mod_revision)
            assert not await client.compare_and_swap(key, "leader=3", expected_value="leader=1")
            assert await client.compare_and_swap(key, "leader=3", expected_value=b"leader=2")
            assert (await client.get(key)).value == b"leader=3"  # type: ignore[union-attr]
            assert not await client.delete_if_value(key, "leader=2")
            assert await client.delete_if_value(key, "leader=3")
            with pytest.raises(ValueError):
                await client.compare_and_swap(key, "x", expected_value="a", expected_mod_revision=1)

    run(scenario())


def test_txn_runs_one_branch_atomically(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            await client.put("a", "1")
            result = await client.txn(
                [Compare.value("a", "1"), Compare.absent("b")],
                [Op.put("b", "2"), Op.delete("a"), Op.get_prefix("")],
                [Op.get("a")],
            )
            assert result.succeeded
            assert result.results[0] is None and result.results[1] == 1
            assert [kv.key for kv in result.kvs(2)] == ["b"]
            again = await client.txn([Compare.present("a")], [Op.delete("b")], [Op.get("b")])
            assert not again.succeeded
            assert [kv.value for kv in again.kvs(0)] == [b"2"]
            assert again.revision == result.revision  # a failed read-only branch writes nothing

    run(scenario())


def test_guarded_writes_apply_only_while_the_guard_holds(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            await client.put("controller_epoch", "7")
            mine, stale = [epoch_guard("controller_epoch", 7)], [epoch_guard("controller_epoch", 6)]
            await client.put("topics/t", "v1", guard=mine)
            assert await client.create_if_absent("topics/u", "v1", guard=mine)
            # The guard holds but the caller's own compare fails: False, not an error.
            assert not await client.create_if_absent("topics/u", "v2", guard=mine)
            assert await client.compare_and_swap("topics/t", "v2", expected_value="v1", guard=mine)
            for write in (
                client.put("topics/t", "stale", guard=stale),
                client.delete("topics/t", guard=stale),
                client.delete_prefix("topics/", guard=stale),
                client.create_if_absent("topics/w", "stale", guard=stale),
                client.compare_and_swap("topics/t", "stale", expected_value="v2", guard=stale),
            ):
                with pytest.raises(EtcdGuardFailedError):
                    await write
            kvs, _ = await client.get_prefix("topics/")
            assert {kv.key: kv.value for kv in kvs} == {"topics/t": b"v2", "topics/u": b"v1"}

    run(scenario())


def test_increment_counter_never_hands_out_a_value_twice(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        clients = [etcd_client.with_prefix(etcd_client.prefix) for _ in range(5)]
        try:
            values = await asyncio.gather(
                *(increment_counter(clients[i % 5], "controller_epoch") for i in range(10))
            )
            assert sorted(values) == list(range(1, 11))
            assert (await clients[0].get("controller_epoch")).value == b"10"  # type: ignore[union-attr]
            with pytest.raises(EtcdGuardFailedError):
                await increment_counter(
                    clients[0], "controller_epoch", guard=[epoch_guard("controller_epoch", 3)]
                )
        finally:
            for c in clients:
                await c.close()

    run(scenario())


def test_errors_are_typed_and_keep_the_cause(etcd_client: EtcdClient) -> None:
    async def scenario() -> None:
        async with etcd_client as client:
            revision = await client.put("k", "v")
            await client.compact(revision)
            with pytest.raises(EtcdCompactedError) as compacted:
                await client.compact(revision - 1)
            assert "compacted" in str(compacted.value)
            assert isinstance(compacted.value.__cause__, grpc.aio.AioRpcError)
            with pytest.raises(EtcdInvalidArgumentError) as duplicate:
                await client.txn([], [Op.put("k", "1"), Op.put("k", "2")])
            assert "duplicate key" in str(duplicate.value)
            assert duplicate.value.code == grpc.StatusCode.INVALID_ARGUMENT

    run(scenario())


@pytest.mark.parametrize(
    ("size", "code"),
    [
        pytest.param(1_700_000, grpc.StatusCode.INVALID_ARGUMENT, id="over-max-request-bytes"),
        pytest.param(2_500_000, grpc.StatusCode.RESOURCE_EXHAUSTED, id="over-grpc-receive-limit"),
    ],
)
def test_a_request_larger_than_etcd_accepts_is_not_retriable(
    etcd_client: EtcdClient, size: int, code: grpc.StatusCode
) -> None:
    """etcd refuses a write over --max-request-bytes (1.5 MiB), gRPC one over its receive limit
    (2 MiB) as RESOURCE_EXHAUSTED; both are the same non-retriable error, never "unavailable"."""

    async def scenario() -> None:
        async with etcd_client as client:
            with pytest.raises(EtcdRequestTooLargeError) as refused:
                await client.txn([Compare.absent("big")], [Op.put("big", b"x" * size)])
            assert refused.value.code == code and not refused.value.retriable
            assert await client.get("big") is None

    run(scenario())
