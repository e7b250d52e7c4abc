"""The sliding-window rate and its throttle time (services/sampled_rate.py), on a fake clock,
and the model of a greedy client behind the module's numbers."""

from __future__ import annotations

import bisect

import pytest

from services.sampled_rate import SampledRate


def test_rate_over_the_windows_kept():
    rate = SampledRate(samples=3, window_s=1.0)
    rate.record(100, 0.0)
    assert rate.measure(0.5) == pytest.approx(100 / 1.0)  # at least one window is counted
    rate.record(100, 1.2)  # a second window
    assert rate.measure(2.0) == pytest.approx(200 / 2.0)
    rate.record(100, 2.5)
    assert rate.measure(2.9) == pytest.approx(300 / 2.9)
    # The first window (started at 0) is forgotten 3 windows after it began.
    assert rate.measure(3.1) == pytest.approx(200 / (3.1 - 1.2))
    assert not rate.idle(3.1)
    assert rate.measure(10.0) == 0.0
    assert rate.idle(10.0)


def test_windows_start_at_the_first_value_after_the_last_ended():
    rate = SampledRate(samples=2, window_s=1.0)
    rate.record(10, 0.0)
    rate.record(10, 0.9)  # same window
    rate.record(10, 5.0)  # a new one, starting at 5.0 (not aligned to the clock)
    assert rate.window_span(5.5) == pytest.approx(1.0)
    assert rate.measure(5.5) == pytest.approx(10.0)


def test_throttle_brings_the_rate_back_to_the_bound():
    rate = SampledRate(samples=11, window_s=1.0)
    rate.record(3000, 0.0)
    assert rate.throttle_s(5000, 0.0) == 0.0
    rate.record(17000, 2.0)  # 20000 bytes over a 2 s span, bound 5000/s
    throttle = rate.throttle_s(5000, 2.0)
    assert throttle == pytest.approx((10000 - 5000) / 5000 * 2.0)
    # After the throttle, with nothing more recorded, the rate is the bound.
    assert rate.measure(2.0 + throttle) == pytest.approx(5000, rel=1e-9)


def test_peek_measures_without_changing_anything():
    rate = SampledRate(samples=2, window_s=1.0)
    rate.record(50, 0.0)
    rate.record(50, 1.5)
    assert rate.peek(1.6) == pytest.approx(rate.measure(1.6))
    assert rate.peek(2.5) == pytest.approx(50 / 1.0)  # the first window is obsolete by then


def test_bad_settings():
    with pytest.raises(ValueError):
        SampledRate(samples=1)
    with pytest.raises(ValueError):
        SampledRate(window_s=0)


class KafkaRate(SampledRate):
    """Kafka's ``Rate.windowSize``: the span counts at least ``samples - 1`` whole windows."""

    __slots__ = ()

    def window_span(self, now: float) -> float:
        elapsed = super().window_span(now)
        if elapsed == self.window_s:  # the floor above; Kafka's elapsed time from the oldest
            self._purge(now)
            elapsed = now - min((s.start for s in self._samples), default=now)
        full = int(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        return elapsed


def greedy_client(
    bound: float, request_bytes: int, seconds: float, *, kafka_floor: bool = False
) -> list[float]:
    """Send times of a client that sends ``request_bytes`` the moment its throttle allows (2 ms
    per round trip), against a gateway metering with 11 windows of 1 s."""
    rate = (KafkaRate if kafka_floor else SampledRate)(samples=11, window_s=1.0)
    sent: list[float] = []
    now = held_until = 0.0
    while now < seconds:
        now = max(now, held_until)
        rate.record(request_bytes, now)
        sent.append(now)
        held_until = now + 0.002 + rate.throttle_s(bound, now)
        now += 0.002
    return sent


def rates_over(sent: list[float], request_bytes: int, bound: float, span: float, starts) -> list[float]:
    return [
        (bisect.bisect_left(sent, start + span) - bisect.bisect_left(sent, start))
        * request_bytes
        / span
        / bound
        for start in starts
    ]


def test_a_greedy_client_is_held_within_one_percent_over_any_20_s():
    sent = greedy_client(1e6, 65536, 100)
    first = rates_over(sent, 65536, 1e6, 20, [0.0])[0]
    later = rates_over(sent, 65536, 1e6, 20, [x * 0.5 for x in range(20, 160)])
    assert first == pytest.approx(1.0, abs=0.01)
    assert min(later) > 0.99 and max(later) < 1.01


def test_kafkas_floor_would_alternate_bursts_and_silence():
    """Why the floor is one window (the module docstring): with Kafka's, a greedy client gets
    13% over its quota in the first 20 s and swings between 58% and 110% later."""
    sent = greedy_client(1e6, 65536, 100, kafka_floor=True)
    first = rates_over(sent, 65536, 1e6, 20, [0.0])[0]
    later = rates_over(sent, 65536, 1e6, 20, [x * 0.5 for x in range(20, 160)])
    assert first > 1.1
    assert min(later) < 0.7
