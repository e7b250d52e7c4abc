"""The audit: producer-side counting per window, audit events, and the reconciliation."""

import threading

import pytest

from spark_jobs.audit import Loaded, reconcile
from spark_jobs.audit_events import AuditCounter, AuditEvent, AuditingProducer, window_start

W = 60_000


class FakeProducer:
    """Records sends; deliveries settle when the test says so (as the I/O thread would, later)."""

    def __init__(self, fail_topics=()):
        self.sent = []
        self.pending = []
        self.fail_topics = set(fail_topics)
        self.closed = False

    def send(self, topic, value, key=None, headers=None, partition=None, timestamp=None, on_delivery=None):
        self.sent.append((topic, value, key, timestamp))
        if on_delivery is not None:
            error = RuntimeError("refused") if topic in self.fail_topics else None
            self.pending.append(lambda: on_delivery(error, None))

    def settle(self):
        pending, self.pending = self.pending, []
        for deliver in pending:
            deliver()

    def flush(self, timeout=None):
        # Like the SDK: flush may return before the delivery callbacks have run.
        threading.Timer(0.05, self.settle).start()

    def close(self, timeout=None):
        self.closed = True


def test_windows_are_aligned_to_the_window_size():
    assert window_start(125_000, W) == 120_000 and window_start(120_000, W) == 120_000


def test_counter_counts_settled_records_per_topic_and_window():
    counter = AuditCounter(W)
    for ts, ok in [(1_000, True), (59_999, True), (60_000, True), (61_000, False)]:
        counter.sent()
        counter.record("t", ts, ok=ok)
    events = counter.events("p", now_ms=7)
    assert [(e.window_start, e.count, e.failed) for e in events] == [(0, 2, 0), (60_000, 1, 1)]
    assert counter.wait_settled(0)


def test_counter_waits_for_records_in_flight():
    counter = AuditCounter(W)
    counter.sent()
    assert not counter.wait_settled(0.01)
    threading.Timer(0.02, lambda: counter.record("t", 0, ok=True)).start()
    assert counter.wait_settled(2)


def test_auditing_producer_publishes_cumulative_counts_after_delivery():
    fake = FakeProducer()
    audited = AuditingProducer(fake, producer_id="p1", window_ms=W, clock=lambda: 100.0)
    for ts in (1_000, 2_000, 61_000):
        audited.send("t", b"v", timestamp=ts)
    audited.close(timeout=5)
    events = [AuditEvent.from_json(value) for topic, value, key, _ in fake.sent if topic == "tributary-audit"]
    counted = [(e.producer, e.topic, e.window_start, e.count) for e in events]
    assert counted == [("p1", "t", 0, 2), ("p1", "t", 60_000, 1)]
    assert all(key == b"p1" for topic, _, key, _ in fake.sent if topic == "tributary-audit")
    assert fake.closed


def test_failed_sends_are_not_counted_as_published():
    fake = FakeProducer(fail_topics={"t"})
    audited = AuditingProducer(fake, producer_id="p", window_ms=W, clock=lambda: 1.0)
    audited.send("t", b"v", timestamp=5)
    audited.flush(timeout=5)
    event = AuditEvent.from_json(next(v for topic, v, *_ in fake.sent if topic == "tributary-audit"))
    assert (event.count, event.failed) == (0, 1)


def test_audit_events_round_trip():
    event = AuditEvent("p", "t", 60_000, W, 5, 1, 99)
    assert AuditEvent.from_json(event.to_json()) == event


# ---- reconciliation -----------------------------------------------------------------------------


def test_a_complete_load_is_ok():
    report = reconcile({("t", 0): 5, ("t", W): 3}, {("t", 0): Loaded(5, 5), ("t", W): Loaded(3, 3)}, W)
    assert report.ok and report.expected == 8 and len(report.windows) == 2


def test_missing_records_are_counted_per_window():
    report = reconcile({("t", 0): 5, ("t", W): 3}, {("t", 0): Loaded(2, 2)}, W)
    assert [(w.window_start, w.missing) for w in report.windows] == [(0, 3), (W, 3)]
    assert report.missing == 6 and not report.ok


@pytest.mark.parametrize(
    "loaded, duplicated, missing",
    [
        pytest.param(Loaded(7, 5), 2, 0, id="same-offset-twice"),
        pytest.param(Loaded(6, 6), 1, 0, id="an-extra-record"),
        pytest.param(Loaded(6, 4), 2, 1, id="duplicates-hide-a-loss"),
    ],
)
def test_duplicates(loaded, duplicated, missing):
    window = reconcile({("t", 0): 5}, {("t", 0): loaded}, W).windows[0]
    assert (window.duplicated, window.missing) == (duplicated, missing)


def test_windows_without_audit_events_are_listed_apart():
    report = reconcile({("t", 0): 1}, {("t", 0): Loaded(1, 1), ("t", W): Loaded(4, 4)}, W)
    assert report.ok and [(w.window_start, w.loaded) for w in report.unaudited] == [(W, 4)]
