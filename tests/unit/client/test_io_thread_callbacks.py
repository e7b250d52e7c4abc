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


def test_an_idle_call_runs_on_the_calling_thread_while_the_loop_runs_nothing(idle_io):
    turns = [0]

    def busy() -> None:  # a loop that never idles: the call still gets its turn, between two
        turns[0] += 1
        idle_io.loop.call_soon(busy)

    idle_io.call_soon(busy)

    def observe():
        before = turns[0]
        for _ in range(200_000):  # long enough for the loop to run many turns, were it free to
            pass
        return threading.current_thread().name, before, turns[0]

    name, before, after = idle_io.call_while_idle(observe)
    assert name == threading.current_thread().name
    assert before == after, "the loop ran while the caller held its state"
    # and the loop goes on afterwards
    seen = turns[0]
    deadline = time.monotonic() + 10
    while turns[0] == seen and time.monotonic() < deadline:
        time.sleep(0.001)
    assert turns[0] > seen


def test_callbacks_an_idle_call_schedules_run_at_once(idle_io):
    done = threading.Event()
    started = time.monotonic()
    # The loop sleeps in select with nothing to do: the call must wake it.
    idle_io.call_while_idle(lambda: idle_io.loop.call_soon(done.set))
    assert done.wait(10) and time.monotonic() - started < 5
    later = threading.Event()
    idle_io.call_while_idle(lambda: idle_io.loop.call_later(0.01, later.set))
    assert later.wait(10)


def test_an_idle_call_raises_what_its_function_raises(idle_io):
    def broken():
        raise ValueError("drain failed")

    with pytest.raises(ValueError, match="drain failed"):
        idle_io.call_while_idle(broken)
    assert idle_io.call_while_idle(lambda: 42) == 42


def test_idle_calls_need_the_setting_and_another_thread(io, idle_io):
    with pytest.raises(IllegalStateError, match="idle_calls"):
        io.call_while_idle(lambda: None)

    async def from_the_loop():
        idle_io.call_while_idle(lambda: None)

    with pytest.raises(IllegalStateError, match="own I/O thread"):
        idle_io.run(from_the_loop())
    idle_io.stop()
    with pytest.raises(IllegalStateError, match="closed"):
        idle_io.call_while_idle(lambda: None)


def test_a_blocking_call_inside_an_idle_call_is_refused_not_a_deadlock(idle_io):
    """A deserializer run by a poll on the idle path holds the loop: a blocking client call
    from it (a handoff to the loop, or another idle call) would wait forever; it is refused."""

    async def answer() -> int:
        return 7

    def handoff() -> int:
        return idle_io.run(answer(), timeout=5)

    def nested() -> int:
        return idle_io.call_while_idle(lambda: 1)

    for inside in (handoff, nested, lambda: idle_io.call(lambda: 1)):
        with pytest.raises(IllegalStateError, match="holds its I/O loop"):
            idle_io.call_while_idle(inside)
    assert handoff() == 7 and nested() == 1  # outside an idle call both work


def test_a_poll_without_a_group_waits_on_its_own_thread_and_times_out():
    consumer = Consumer(servers=NOWHERE, request_timeout_ms=500)
    handed_over = []
    run_calling_back = consumer._io.run_calling_back

    def counting(coro):
        handed_over.append(coro)
        return run_calling_back(coro)

    consumer._io.run_calling_back = counting
    try:
        consumer.assign([TopicPartition("t", 0)])
        consumer.seek(TopicPartition("t", 0), 0)
        started = time.monotonic()
        assert consumer.poll(timeout_ms=300) == {}
        assert 0.25 < time.monotonic() - started < 5
        assert not handed_over, "a poll without a group is not handed to the I/O thread"
    finally:
        consumer._io.run_calling_back = run_calling_back
        consumer.close()


def test_a_loop_in_asyncio_debug_mode_takes_no_idle_calls(io, idle_io):
    # asyncio's debug mode refuses callbacks scheduled from another thread: the consumer polls
    # through the loop thread then.
    assert idle_io.idle_calls and not io.idle_calls
    idle_io.loop.set_debug(True)
    assert not idle_io.idle_calls
