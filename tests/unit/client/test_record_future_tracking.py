"""A queued record's future is left out of the garbage collector's walks until a listener may
lead back to it (``gateway/client/futures.py``'s ``untrack_new_future``): a producer whose caller
keeps every future (the batched bench) made the collector walk them all in every full
collection, ~20% of the producer's time. A cycle through a future with a callback must still
be collected."""

from __future__ import annotations

import gc
import weakref

import pytest

from gateway.client import futures as futures_module
from gateway.client.accumulator import RecordAccumulator
from gateway.client.futures import FutureRecordMetadata

from ..services.records.records_backends import require_speedups


@pytest.fixture(autouse=True)
def _with_speedups():
    require_speedups()
    assert futures_module.untrack_new_future is not None, "the C module has track and untrack"


def _append(accumulator: RecordAccumulator, value: bytes = b"v") -> FutureRecordMetadata:
    future, _full, _new = accumulator.append("t", 0, 1_000, None, value, (), 16 + len(value), 1_000)
    assert future is not None
    return future


def test_the_futures_of_queued_records_are_not_tracked_opening_or_joining_a_batch():
    accumulator = RecordAccumulator(batch_size=1 << 20, linger_ms=100)
    opening = _append(accumulator)
    joining = _append(accumulator)
    assert not gc.is_tracked(opening) and not gc.is_tracked(joining)
    assert opening._result is joining._result  # one batch
    assert gc.is_tracked(opening._result)  # pending: it may gain listeners


@pytest.mark.parametrize("hook", ["add_callback", "add_errback", "add_both", "add_delivery_callback"])
def test_a_listener_has_the_future_tracked_again(hook):
    accumulator = RecordAccumulator(batch_size=1 << 20, linger_ms=100)
    future = _append(accumulator)
    if hook == "add_delivery_callback":
        future.add_delivery_callback(lambda error, metadata: None)
    else:
        getattr(future, hook)(lambda *args: None)
    assert gc.is_tracked(future)


class _Holder:
    """A callback that holds its future: result -> listener -> holder -> future -> result."""

    def __init__(self) -> None:
        self.future: FutureRecordMetadata | None = None

    def __call__(self, *args) -> None:
        pass


def test_a_cycle_through_a_future_and_its_callback_is_collected():
    accumulator = RecordAccumulator(batch_size=1 << 20, linger_ms=100)
    future = _append(accumulator)
    holder = _Holder()
    holder.future = future
    future.add_callback(holder)
    gone = weakref.ref(holder)
    # Everything is garbage now (the accumulator too, with the pending batch): a cycle the
    # collector can only see if the future is tracked.
    del accumulator, future, holder
    gc.collect()
    assert gone() is None


def test_settled_futures_give_their_metadata():
    accumulator = RecordAccumulator(batch_size=1 << 20, linger_ms=100)
    first, second = _append(accumulator), _append(accumulator)
    first._result.complete(40, -1, 0)
    assert (first.get(0).offset, second.get(0).offset) == (40, 41)
