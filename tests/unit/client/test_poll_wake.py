"""A waiting poll's wake-up (``gateway/client/consumer.py``): one future, no task per wait."""

from __future__ import annotations

import asyncio

from gateway.client.consumer import _PollWake, _Signal


def test_a_signal_set_while_waiting_wakes_the_wait_at_once():
    async def main() -> float:
        wake = _PollWake()
        data, attention = _Signal(wake), _Signal(wake)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, data.set)
        started = loop.time()
        await wake.wait(30.0, (data, attention))
        return loop.time() - started

    assert asyncio.run(main()) < 5.0  # woken by the signal, not by the 30 s timeout


def test_a_signal_already_set_returns_without_waiting_and_the_timeout_ends_a_quiet_wait():
    async def main() -> tuple[bool, float]:
        wake = _PollWake()
        data, attention = _Signal(wake), _Signal(wake)
        attention.set()
        loop = asyncio.get_running_loop()
        await asyncio.wait_for(wake.wait(30.0, (data, attention)), 5.0)
        attention.clear()
        started = loop.time()
        await wake.wait(0.05, (data, attention))
        return data.is_set(), loop.time() - started

    was_set, waited = asyncio.run(main())
    assert not was_set and waited >= 0.04


def test_a_cancelled_wait_leaves_nothing_behind():
    async def main() -> None:
        wake = _PollWake()
        signal = _Signal(wake)
        task = asyncio.ensure_future(wake.wait(30.0, (signal,)))
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert wake._future is None
        signal.set()  # no waiter: nothing to wake, no error
        assert signal.is_set()

    asyncio.run(main())
