"""The gateway's client quotas (gateway/server/quotas.py) on a fake clock: who is metered, what a
throttle says, what a configuration change keeps, and the loop-time meter of request quotas."""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.server.loop_time import LoopTime, timed
from gateway.server.quotas import ChannelThrottle, ClientQuotas, QuotaWindows
from services.quotas import (
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    QuotaEntity,
    SensorKey,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


DEFAULT_WINDOWS = QuotaWindows(11, 1.0)


def quotas_with(*entries, windows=DEFAULT_WINDOWS):
    clock = FakeClock()
    throttles: list[tuple[str, float]] = []
    quotas = ClientQuotas(windows, clock=clock, on_throttle=lambda s, t: throttles.append((s.quota_key, t)))
    quotas.update(entries)
    return quotas, clock, throttles


def test_no_quota_no_meter():
    quotas, _, _ = quotas_with()
    assert not quotas.configured
    assert quotas.client("User:alice", "app") is None
    quotas.update([(QuotaEntity(None, "other"), {PRODUCER_BYTE_RATE: 10.0})])
    assert quotas.client("User:alice", "app") is None


def test_a_client_over_its_produce_quota_is_told_how_long_to_wait():
    quotas, clock, throttles = quotas_with((QuotaEntity(None, "app"), {PRODUCER_BYTE_RATE: 1000.0}))
    quota = quotas.client("User:ANONYMOUS", "app")
    assert quota is not None and quota.produce is not None and quota.fetch is None and quota.request is None
    assert quota.record_produce_bytes(600) == 0
    throttle_ms = quota.record_produce_bytes(900)  # 1500 bytes in a 1 s span at 1000/s
    assert throttle_ms == 500
    assert throttles == [(PRODUCER_BYTE_RATE, pytest.approx(0.5))]
    # Unary calls of the same allowance are held until then; fetches are not.
    assert quota.muted_until(quota.produce) == pytest.approx(clock.now + 0.5)
    assert quota.muted_until(quota.fetch) == 0.0
    clock.now += 0.2
    assert quota.held_ms(quota.produce) == 300  # what the answer says: how long from now


def test_a_shared_allowance_meters_every_client_of_the_user_together():
    quotas, _, _ = quotas_with((QuotaEntity("alice", None), {PRODUCER_BYTE_RATE: 1000.0}))
    first, second = quotas.client("User:alice", "a"), quotas.client("User:alice", "b")
    assert first is not None and second is not None
    assert first.produce is second.produce
    assert first.produce.key == SensorKey("alice", "")
    first.record_produce_bytes(800)
    assert second.record_produce_bytes(800) > 0


def test_default_client_ids_each_get_their_own_allowance():
    quotas, _, _ = quotas_with((QuotaEntity(None, DEFAULT), {CONSUMER_BYTE_RATE: 1000.0}))
    first, second = quotas.client("User:x", "a"), quotas.client("User:x", "b")
    assert first is not None and second is not None
    assert first.fetch is not second.fetch
    assert first.record_fetch_bytes(900) == 0 and second.record_fetch_bytes(900) == 0


def test_a_configuration_change_keeps_the_rate_and_takes_the_new_bound():
    entity = QuotaEntity(None, "app")
    quotas, _, _ = quotas_with((entity, {PRODUCER_BYTE_RATE: 1000.0}))
    before = quotas.client("User:x", "app")
    assert before is not None
    before.record_produce_bytes(900)
    quotas.update([(entity, {PRODUCER_BYTE_RATE: 500.0})])
    after = quotas.client("User:x", "app")
    assert after is not None and after.produce is before.produce  # the same meter, history kept
    assert after.produce.limit == 500.0
    assert after.record_produce_bytes(100) == 1000  # 1000 bytes in 1 s against 500/s: 1 s
    quotas.update([])
    assert quotas.client("User:x", "app") is None


def test_fetches_carry_at_most_one_window_of_the_consumer_quota():
    quotas, _, _ = quotas_with(
        (QuotaEntity(None, "app"), {CONSUMER_BYTE_RATE: 300_000.0}), windows=QuotaWindows(11, 0.5)
    )
    quota = quotas.client("User:x", "app")
    assert quota is not None
    assert quota.fetch_max_bytes(50 << 20) == 150_000
    assert quota.fetch_max_bytes(1000) == 1000


def test_request_time_throttles_are_bounded_by_one_window():
    quotas, _, throttles = quotas_with((QuotaEntity(DEFAULT, None), {REQUEST_PERCENTAGE: 10.0}))
    quota = quotas.client("User:bob", "any")
    assert quota is not None and quota.times_requests and quota.produce is None
    assert quota.record_produce_bytes(10_000) == 0  # no byte quota: bytes are not metered
    assert quota.record_loop_time(0.05) == 0  # 5% of the loop
    # 5 s of loop time in one window would be 500%: held, but for one window at most.
    assert quota.record_loop_time(5.0) == 1000
    assert throttles == [(REQUEST_PERCENTAGE, pytest.approx(1.0))]


def test_idle_meters_are_dropped():
    quotas, clock, _ = quotas_with((QuotaEntity(None, DEFAULT), {PRODUCER_BYTE_RATE: 1000.0}))
    for n in range(5):
        quota = quotas.client("User:x", f"client-{n}")
        assert quota is not None
        quota.record_produce_bytes(10)
    assert len(quotas.sensors) == 5
    clock.now += 12.0  # every window of every meter has passed
    quotas.client("User:x", "late")
    assert len(quotas.sensors) == 1


def test_bad_windows_are_refused():
    with pytest.raises(ValueError, match="quota_window_num"):
        QuotaWindows(1, 1.0)
    with pytest.raises(ValueError, match="quota_window_size_seconds"):
        QuotaWindows(11, 0)


def test_a_held_channel_waits_and_others_do_not():
    async def run() -> None:
        held, free = ChannelThrottle(), ChannelThrottle()
        held.hold(200)
        held.hold(100)  # a shorter hold does not shorten it
        assert 150 < held.remaining_ms() <= 200 and free.remaining_ms() == 0
        started = time.monotonic()
        await asyncio.wait_for(free.wait(), 0.05)  # not held: at once
        await held.wait()
        assert time.monotonic() - started >= 0.19

    asyncio.run(run())


def test_loop_time_counts_the_steps_not_the_waits():
    wait_s = 0.2
    steps: list[float] = []  # how long each step held the loop, measured inside it

    def hold_the_loop() -> None:
        started = time.perf_counter()
        time.sleep(0.02)
        steps.append(time.perf_counter() - started)

    async def request() -> int:
        hold_the_loop()
        await asyncio.sleep(wait_s)  # waits: not counted
        hold_the_loop()
        return 1

    # Bounds from the steps' own measured length, not from the sleeps asked for: on a loaded
    # machine a 20 ms sleep overshoots by tens of ms (a fixed 90 ms bound failed ~1 run in 100).
    async def run() -> None:
        spent = LoopTime()
        assert await timed(request(), spent) == 1
        assert len(steps) == 2 and sum(steps) <= spent.seconds < sum(steps) + wait_s
        steps.clear()
        cancelled = LoopTime()
        task = asyncio.ensure_future(timed(request(), cancelled))
        await asyncio.sleep(0.03)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(steps) == 1 and steps[0] <= cancelled.seconds < steps[0] + wait_s

    asyncio.run(run())
