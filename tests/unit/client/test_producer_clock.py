"""The producer reads the clock once a record: the system clock through the C module's
``time_ms`` (``time.time_ns() // 1_000_000`` without the big-integer division), any other
clock through its ``time_ms``."""

from __future__ import annotations

import time

from gateway.client.producer import ProducerConfig, ProducerCore
from services.clock import ManualClock

from ..services.records.records_backends import require_speedups


def test_the_c_clock_reads_the_system_clock_in_milliseconds():
    time_ms = require_speedups().time_ms
    for _ in range(1000):
        before = time.time_ns() // 1_000_000
        now = time_ms()
        after = time.time_ns() // 1_000_000
        assert type(now) is int and before <= now <= after


def test_records_are_stamped_with_the_producers_clock():
    system = ProducerCore(ProducerConfig(servers="127.0.0.1:1"))
    before = time.time_ns() // 1_000_000
    stamped = system.prepare(b"v", None, None, None)
    after = time.time_ns() // 1_000_000
    assert before <= stamped[3] == stamped[5] <= after
    manual = ProducerCore(ProducerConfig(servers="127.0.0.1:1"), clock=ManualClock(start_ms=1234))
    assert manual.prepare(b"v", None, None, None)[3:] == (1234, 16 + 1, 1234)
    assert manual.prepare(b"v", None, None, 99)[3:] == (99, 17, 1234)
