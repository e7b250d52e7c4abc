"""Producer id blocks: no id is ever handed out twice, across controller terms and failed writes."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.transactions import keys
from coordinator.transactions.producer_ids import (
    FIRST_PRODUCER_ID,
    MAX_PRODUCER_ID,
    ProducerIdManager,
    claim_block,
)
from services import errors

from ._fake_etcd import FakeController, FakeEtcd


def test_claim_block_starts_at_the_counter_and_moves_it_past_the_block():
    block, after = claim_block(0, 10)
    assert (block.start, block.end, after) == (
        FIRST_PRODUCER_ID,
        FIRST_PRODUCER_ID + 10,
        FIRST_PRODUCER_ID + 10,
    )
    assert [block.take() for _ in range(10)] == list(range(FIRST_PRODUCER_ID, FIRST_PRODUCER_ID + 10))
    assert block.exhausted
    block, after = claim_block(5_000, 1_000)
    assert (block.start, after) == (5_000, 6_000)
    with pytest.raises(errors.TributaryError):
        claim_block(MAX_PRODUCER_ID - 5, 10)


# Steps: "id" (an InitProducerId), "term" (a new controller term: a new manager, as after a
# failover), "fail-before" / "fail-after" (the next counter write fails, not applied / applied).
_STEPS = st.lists(
    st.sampled_from(["id"] * 6 + ["term", "fail-before", "fail-after"]), min_size=1, max_size=80
)


@settings(max_examples=200, deadline=None)
@given(_STEPS, st.integers(min_value=1, max_value=7))
def test_ids_are_never_reused_across_terms_and_failed_claims(steps, block_size):
    asyncio.run(_run_steps(steps, block_size))


async def _run_steps(steps: list[str], block_size: int) -> None:
    etcd = FakeEtcd()
    epoch = 1
    controller = FakeController(etcd, epoch)
    manager = ProducerIdManager(client=etcd, controller=controller, block_size=block_size)
    pending_failure: list[str] = []
    controller.fail = lambda ops: pending_failure.pop() if pending_failure else None
    handed_out: list[int] = []
    for step in steps:
        if step == "term":
            epoch += 1
            controller = FakeController(etcd, epoch)
            controller.fail = lambda ops: pending_failure.pop() if pending_failure else None
            manager = ProducerIdManager(client=etcd, controller=controller, block_size=block_size)
        elif step.startswith("fail"):
            pending_failure[:] = [step.removeprefix("fail-")]
        else:
            try:
                handed_out.append(await manager.next_id())
            except errors.CoordinatorNotAvailableError:
                pass  # the claim failed; the caller retries later
    assert len(handed_out) == len(set(handed_out)), f"an id was handed out twice: {handed_out}"
    assert all(i >= FIRST_PRODUCER_ID for i in handed_out)
    stored = etcd.kvs.get(keys.PRODUCER_IDS)
    if handed_out:
        assert stored is not None and keys.decode_next_producer_id(stored.value) > max(handed_out)


def test_one_counter_write_per_block():
    async def scenario():
        etcd = FakeEtcd()
        manager = ProducerIdManager(client=etcd, controller=FakeController(etcd), block_size=1_000)
        ids = [await manager.next_id() for _ in range(2_500)]
        assert ids == list(range(FIRST_PRODUCER_ID, FIRST_PRODUCER_ID + 2_500))
        assert etcd.writes == 3

    asyncio.run(scenario())


def test_concurrent_calls_share_one_claim_and_get_distinct_ids():
    async def scenario():
        etcd = FakeEtcd()
        manager = ProducerIdManager(client=etcd, controller=FakeController(etcd), block_size=50)
        ids = await asyncio.gather(*(manager.next_id() for _ in range(120)))
        assert len(set(ids)) == 120 and etcd.writes == 3

    asyncio.run(scenario())


def test_only_ids_handed_out_are_known():
    async def scenario():
        etcd = FakeEtcd()
        etcd.put_now(keys.PRODUCER_IDS, b"500")  # an earlier term took ids up to 499
        manager = ProducerIdManager(client=etcd, controller=FakeController(etcd), block_size=10)
        await manager.ensure_handed_out(499)
        for never in (0, -1, 500, 10**12):
            with pytest.raises(errors.InvalidProducerIdMappingError):
                await manager.ensure_handed_out(never)
        first = await manager.next_id()  # 500; 501.. are in this term's block but not handed out
        await manager.ensure_handed_out(first)
        with pytest.raises(errors.InvalidProducerIdMappingError):
            await manager.ensure_handed_out(first + 1)

    asyncio.run(scenario())


def test_an_unreadable_counter_is_an_error_not_a_reset():
    async def scenario():
        etcd = FakeEtcd()
        etcd.put_now(keys.PRODUCER_IDS, b"garbage")
        manager = ProducerIdManager(client=etcd, controller=FakeController(etcd), block_size=10)
        with pytest.raises(errors.TributaryError, match="unreadable"):
            await manager.next_id()
        assert etcd.kvs[keys.PRODUCER_IDS].value == b"garbage"

    asyncio.run(scenario())
