"""Callbacks handed from the I/O thread back to the application's thread (rebalance listeners,
commit callbacks), and ``wakeup()`` interrupting a blocking poll."""

import asyncio
import re
import threading
import time

import pytest

from gateway.client import AsyncConsumer, Consumer, TopicPartition, WakeupError
from gateway.client.errors import IllegalStateError, InvalidGroupIdError
from gateway.client.io_thread import IOThread
from services.errors import InvalidRequestError

#: Nothing listens here: the consumers below never get an answer, which is the point.
NOWHERE = "127.0.0.1:1"


@pytest.fixture
def io():
    thread = IOThread("test-io")
    yield thread
    thread.stop()


def test_callbacks_run_on_the_calling_thread_and_return_their_result(io):
    seen = []

    def callback(value):
        seen.append(threading.current_thread().name)
        return value * 2

    async def work():
        first = await io.call_back(callback, 21)
        return first, threading.current_thread().name

    result, loop_thread = io.run_calling_back(work())
    assert result == 42 and loop_thread == "test-io"
    assert seen == [threading.current_thread().name]


def test_a_callback_may_call_the_client_again(io):
    def callback():
        # A listener committing: a nested blocking call while the outer coroutine waits.
        return io.run_calling_back(inner())

    async def inner():
        return await io.call_back(lambda: threading.current_thread().name)

    async def outer():
        return await io.call_back(callback)

    assert io.run_calling_back(outer()) == threading.current_thread().name


def test_a_callback_error_reaches_the_coroutine(io):
    def broken():
        raise ValueError("listener bug")

    async def work():
        try:
            await io.call_back(broken)
        except ValueError as exc:
            return f"caught {exc}"

    assert io.run_calling_back(work()) == "caught listener bug"


def test_an_awaitable_result_is_awaited_on_the_loop(io):
    async def coroutine_callback():
        return threading.current_thread().name

    async def work():
        return await io.call_back(coroutine_callback)

    assert io.run_calling_back(work()) == "test-io"


def test_without_a_waiting_caller_a_callback_runs_on_the_loop(io):
    async def work():
        return await io.call_back(lambda: threading.current_thread().name)

    assert io.run(work()) == "test-io"


def test_wakeup_interrupts_a_blocking_poll_from_another_thread():
    consumer = Consumer(servers=NOWHERE, request_timeout_ms=500)
    try:
        consumer.assign([TopicPartition("t", 0)])
        threading.Timer(0.3, consumer.wakeup).start()
        started = time.monotonic()
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=20_000)
        assert time.monotonic() - started < 5
        assert consumer.poll(timeout_ms=0) == {}, "one wakeup, one interrupted poll"
        consumer.wakeup()  # no poll running: the next one raises
        with pytest.raises(WakeupError):
            consumer.poll(timeout_ms=20_000)
    finally:
        consumer.close()


def test_async_wakeup():
    async def scenario():
        async with AsyncConsumer(servers=NOWHERE, request_timeout_ms=500) as consumer:
            consumer.assign([TopicPartition("t", 0)])
            asyncio.get_running_loop().call_later(0.2, consumer.wakeup)
            with pytest.raises(WakeupError):
                await consumer.poll(timeout_ms=20_000)

    asyncio.run(scenario())


def test_group_calls_need_a_group_id_and_do_not_mix_with_assign():
    consumer = Consumer(servers=NOWHERE)
    try:
        with pytest.raises(InvalidGroupIdError):
            consumer.subscribe(["t"])
        with pytest.raises(InvalidGroupIdError):
            consumer.commit()
        with pytest.raises(IllegalStateError, match="subscribe"):
            consumer.poll()
    finally:
        consumer.close()
    grouped = Consumer(servers=NOWHERE, group_id="g")
    try:
        grouped.assign([TopicPartition("t", 0)])
        with pytest.raises(IllegalStateError):
            grouped.subscribe(["t"])
        grouped.unsubscribe()
        grouped.subscribe(pattern="orders-.*")
        assert grouped.subscription() == {"orders-.*"}
        with pytest.raises(IllegalStateError):
            grouped.assign([TopicPartition("t", 0)])
    finally:
        grouped.close()


def test_subscribe_checks_the_pattern_as_the_coordinator_will():
    consumer = Consumer(servers=NOWHERE, group_id="g")
    try:
        with pytest.raises(InvalidRequestError, match="invalid perl operator"):
            consumer.subscribe(pattern="(?=orders)o.*")  # lookahead: not RE2
        with pytest.raises(InvalidRequestError, match="at most 1000"):
            consumer.subscribe(pattern="o" * 1001)
        with pytest.raises(ValueError, match=r"\(\?i\)"):
            consumer.subscribe(pattern=re.compile("orders", re.IGNORECASE))  # the flag would be lost
        consumer.subscribe(pattern=re.compile(r"orders\..*"))
        assert consumer.subscription() == {r"orders\..*"}
    finally:
        consumer.close()


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"group_id": "g", "partition_assignment_strategy": "fair"}, "partition_assignment_strategy"),
        (
            {"group_id": "g", "heartbeat_interval_ms": 10_000, "session_timeout_ms": 6_000},
            "heartbeat_interval_ms",
        ),
        ({"group_id": ""}, "group_id"),
        ({"group_id": "g", "auto_commit_interval_ms": 0}, "auto_commit_interval_ms"),
    ],
)
def test_group_settings_are_validated(settings, message):
    with pytest.raises(ValueError, match=message):
        Consumer(servers=NOWHERE, **settings)
