from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest

from services.errors import KafkaStorageError
from storage_node.log.group_commit import GroupCommit
from tests.unit.storage_node.log_testkit import make_batch, open_log


def _slow_flush(partition_log, threads: list[str], delay: float = 0.01):
    """Wrap flush so it takes a realistic fsync time and records which thread ran it."""
    original = partition_log.flush

    def flush():
        threads.append(threading.current_thread().name)
        time.sleep(delay)
        original()

    partition_log.flush = flush


def test_concurrent_waiters_share_few_fsyncs(tmp_path, clock):
    partition_log = open_log(tmp_path / "t-0", clock)
    threads: list[str] = []
    _slow_flush(partition_log, threads)
    group_commit = GroupCommit()
    rng = random.Random(0)

    async def producer():
        await asyncio.sleep(rng.random() * 0.03)  # arrivals spread over ~3 fsync times
        info = partition_log.append(make_batch(1))
        await group_commit.wait_durable(partition_log, info.last_offset)
        assert partition_log.recovery_point > info.last_offset
        return info.last_offset

    async def main():
        return await asyncio.gather(*(producer() for _ in range(50)))

    offsets = asyncio.run(main())
    assert sorted(offsets) == list(range(50))
    assert 1 <= group_commit.flush_count <= 10  # far fewer than one fsync per waiter
    assert group_commit.flush_count == len(threads)
    assert threading.main_thread().name not in threads  # fsync never ran on the event loop


def test_an_already_durable_offset_returns_without_flushing(tmp_path, clock):
    partition_log = open_log(tmp_path / "t-0", clock)
    partition_log.append(make_batch(3))
    partition_log.flush()
    group_commit = GroupCommit()
    asyncio.run(group_commit.wait_durable(partition_log, 2))
    assert group_commit.flush_count == 0
    with pytest.raises(ValueError):
        asyncio.run(group_commit.wait_durable(partition_log, 3))  # never appended


def test_a_failed_flush_fails_every_waiter(tmp_path, clock):
    partition_log = open_log(tmp_path / "t-0", clock)
    calls = []

    def broken_flush():
        calls.append(1)
        time.sleep(0.01)
        raise KafkaStorageError("disk on fire")

    partition_log.flush = broken_flush
    group_commit = GroupCommit()

    async def main():
        partition_log.append(make_batch(5))
        return await asyncio.gather(
            *(group_commit.wait_durable(partition_log, i) for i in range(5)), return_exceptions=True
        )

    results = asyncio.run(main())
    assert all(isinstance(r, KafkaStorageError) for r in results)
    assert len(calls) == 1
