"""The retry policy: exponential backoff with jitter, and when a batch may be retried."""

import random

import pytest

from gateway.client.retry import JITTER, RetryPolicy
from services import errors


def policy(**kwargs):
    return RetryPolicy(rng=random.Random(7), **kwargs)


@pytest.mark.parametrize("attempt, base", [(1, 100), (2, 200), (3, 400), (4, 800), (5, 1000), (40, 1000)])
def test_backoff_doubles_up_to_the_cap_within_jitter(attempt, base):
    p = policy(retry_backoff_ms=100, retry_backoff_max_ms=1000)
    waits = [p.backoff_ms(attempt) for _ in range(200)]
    assert all(base * (1 - JITTER) - 1 <= w <= min(1000, base * (1 + JITTER)) for w in waits)
    assert len(set(waits)) > 1, "jittered, so clients that failed together do not retry together"


def test_zero_backoff_means_no_wait():
    assert policy(retry_backoff_ms=0).backoff_ms(3) == 0


def test_max_below_base_is_raised_to_base():
    assert policy(retry_backoff_ms=500, retry_backoff_max_ms=100).retry_backoff_max_ms == 500


def test_only_retriable_errors_are_retried():
    p = policy(retries=3)
    assert p.can_retry(errors.NotLeaderOrFollowerError(), attempts=1, created_ms=0, now_ms=10)
    assert p.can_retry(errors.NetworkError(), attempts=1, created_ms=0, now_ms=10)
    assert not p.can_retry(errors.RecordTooLargeError(), attempts=1, created_ms=0, now_ms=10)
    assert not p.can_retry(errors.CorruptRecordError(), attempts=1, created_ms=0, now_ms=10)


def test_retries_are_counted():
    p = policy(retries=2)
    error = errors.NetworkError()
    assert p.can_retry(error, attempts=2, created_ms=0, now_ms=0)
    assert not p.can_retry(error, attempts=3, created_ms=0, now_ms=0)
    assert not policy(retries=0).can_retry(error, attempts=1, created_ms=0, now_ms=0)


def test_delivery_timeout_bounds_every_retry():
    p = policy(delivery_timeout_ms=1000)
    error = errors.NetworkError()
    assert p.can_retry(error, attempts=1, created_ms=0, now_ms=999)
    assert not p.can_retry(error, attempts=1, created_ms=0, now_ms=1000)
    assert p.is_expired(0, 1000) and not p.is_expired(0, 999)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError):
        RetryPolicy(delivery_timeout_ms=0)
