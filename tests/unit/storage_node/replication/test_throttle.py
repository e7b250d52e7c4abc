"""The reassignment copy throttle: a token bucket, no burst past a quarter second."""

from storage_node.replication.throttle import CopyThrottle


def test_the_bucket_refills_at_the_rate_and_caps_the_burst():
    throttle = CopyThrottle(now_ms=0)
    assert throttle.allowance(1_000, now_ms=0) == 0
    assert throttle.allowance(1_000, now_ms=100) == 100
    assert throttle.allowance(1_000, now_ms=10_000) == 250  # a quarter second at most


def test_debt_is_paid_by_waiting():
    throttle = CopyThrottle(now_ms=0)
    throttle.allowance(1_000, now_ms=250)
    throttle.consume(750)  # a batch larger than the allowance
    assert throttle.allowance(1_000, now_ms=250) == 0
    assert 0.49 < throttle.wait_s() < 0.52
    assert throttle.allowance(1_000, now_ms=760) > 0
    assert throttle.bytes_copied == 750


def test_over_time_the_rate_holds():
    throttle = CopyThrottle(now_ms=0)
    now, copied = 0, 0
    while now < 20_000:
        allowed = throttle.allowance(50_000, now)
        if allowed:
            chunk = max(allowed, 16_384)  # whole batches: sometimes more than allowed
            throttle.consume(chunk)
            copied += chunk
        now += 7
    assert 0.95 * 50_000 * 20 <= copied <= 1.05 * 50_000 * 20
