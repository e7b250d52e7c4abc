"""A record sendable now is written by the appending thread while the producer's I/O loop waits
for I/O (``IOThread.call_if_idle``, ``Sender.send_here``): no wakeup of the loop thread to write
it -- one of the two thread handoffs of each round trip of a record sent at a time. Busy, the
loop is handed the work as before; the routine is woken only when it has something to do."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from typing import Any

import pytest

from gateway.client.accumulator import RecordAccumulator, estimate_record_size
from gateway.client.dataport import RawTransport
from gateway.client.io_thread import IOThread
from gateway.client.retry import RetryPolicy
from gateway.client.sender import Sender
from services.clock import SYSTEM_CLOCK

from .test_dataport import LogGateway, ScriptedGateway, _Fallback, _SenderClient


def test_an_idle_loop_lets_the_caller_run_as_the_loop_on_its_own_thread(idle_io):
    seen = []

    def observe() -> None:
        seen.append((threading.current_thread().name, asyncio.get_running_loop()))

    assert idle_io.call_if_idle(observe) is True
    assert seen == [(threading.current_thread().name, idle_io.loop)]
    with pytest.raises(RuntimeError):
        asyncio.get_running_loop()  # only while the call ran


def test_callbacks_it_schedules_run_at_once(idle_io):
    done = threading.Event()
    assert idle_io.call_if_idle(lambda: idle_io.loop.call_soon(done.set))
    assert done.wait(10)


def test_a_busy_loop_is_never_waited_for(idle_io):
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:
        busy.set()
        release.wait(10)

    idle_io.call_soon(hold)
    assert busy.wait(10)
    ran = []
    try:
        assert idle_io.call_if_idle(ran.append, 1) is False
    finally:
        release.set()
    assert ran == []


def test_not_from_the_loop_thread_nor_without_the_setting(idle_io):
    plain = IOThread("test-send-plain")
    try:
        assert plain.call_if_idle(lambda: None) is False
    finally:
        plain.stop()

    async def from_the_loop() -> bool:
        return idle_io.call_if_idle(lambda: None)

    assert idle_io.run(from_the_loop()) is False


def test_a_stopped_loop_runs_nothing():
    thread = IOThread("test-send-stopped", idle_calls=True)
    thread.stop()
    ran = []
    assert thread.call_if_idle(ran.append, 1) is False and ran == []


@pytest.mark.parametrize("acks", [1, 0])
def test_send_here_writes_and_leaves_the_routine_asleep_unless_it_has_work(acks):
    asyncio.run(asyncio.wait_for(_send_here_turns(acks), 30))


def test_a_pass_that_fails_here_is_left_to_the_routine():
    asyncio.run(asyncio.wait_for(_send_here_turns(1, fail_once=True), 30))


async def _send_here_turns(acks: int, fail_once: bool = False) -> None:
    gateway_log = LogGateway()
    async with ScriptedGateway(on_request=gateway_log) as gateway:
        client: Any = _SenderClient(f"127.0.0.1:{gateway.port}")  # the parts of a GatewayClient used
        transport = RawTransport(client, _Fallback())
        accumulator = RecordAccumulator(batch_size=1, linger_ms=0)
        sender = Sender(
            client=client, accumulator=accumulator, transport=transport, policy=RetryPolicy(), acks=acks
        )
        task = asyncio.create_task(sender.run())

        def append(value: bytes):
            now_ms = SYSTEM_CLOCK.time_ms()
            size = estimate_record_size(None, value, 0)
            return accumulator.append("t", 0, now_ms, None, value, (), size, now_ms)[0]

        first = append(b"first")  # opens the connection through send() (a task)
        sender.wakeup()
        await first
        values = [b"first"]
        for i in range(5):
            await asyncio.sleep(0.01)  # the routine is asleep, waiting for a wakeup
            waiter = sender._waiter
            assert waiter is not None and not waiter.done()
            value = b"v%d" % i
            values.append(value)
            future = append(value)
            if fail_once:
                _break_the_next_pass(sender)
                sender.send_here()  # neither raises nor loses the record
                assert accumulator.has_queued() and waiter.done(), "the routine is woken to send it"
            elif acks:
                sender.send_here()
                assert not accumulator.has_queued(), "drained and written here"
                assert not waiter.done(), "its answer wakes the routine; nothing else had to"
                assert not accumulator.sender_looks_by(SYSTEM_CLOCK.time_ms() + 10_000), (
                    "appenders are told to wake the routine"
                )
            else:
                sender.send_here()
                # At acks=0 a request settles once written: left to the routine (its thread).
                assert accumulator.has_queued() and waiter.done()
            metadata = await future
            assert metadata.offset == (i + 1 if acks else -1)
        accumulator.close()
        sender.stop()
        await asyncio.wait_for(task, 5)
        await transport.close(1.0)
    while gateway_log.logs.get(0, []) != values:  # acks=0: written before close returned
        await asyncio.sleep(0.001)


def _break_the_next_pass(sender: Sender) -> None:
    """The sender's next pass raises (a bug); the one after runs as ever."""
    passes = sender._send_ready

    def broken(now_ms: int) -> int | None:
        sender._send_ready = passes  # type: ignore[method-assign]
        raise RuntimeError("a bug in the pass")

    sender._send_ready = broken  # type: ignore[method-assign]


def test_a_ctrl_c_on_the_main_thread_during_its_pass_loses_no_record(idle_io):
    """The pass now runs on the application's thread, often the main one, where Python raises
    KeyboardInterrupt (SIGINT) at any bytecode: raised between the drain and the write, the
    drained record was in nobody's hands -- never sent nor failed, its future never settled, a
    close waiting for it in vain. The interrupt is held until the pass is over, then raised."""
    assert threading.current_thread() is threading.main_thread(), "signals reach the main thread"
    gateway_log = LogGateway()
    gateway = ScriptedGateway(on_request=gateway_log)
    accumulator = RecordAccumulator(batch_size=1, linger_ms=0)

    async def start() -> tuple[Sender, RawTransport, asyncio.Task]:
        await gateway.__aenter__()
        client: Any = _SenderClient(f"127.0.0.1:{gateway.port}")
        transport = RawTransport(client, _Fallback())
        sender = Sender(
            client=client, accumulator=accumulator, transport=transport, policy=RetryPolicy(), acks=1
        )
        return sender, transport, asyncio.get_running_loop().create_task(sender.run())

    sender, transport, task = idle_io.run(start(), 10)

    def append(value: bytes):
        now_ms = SYSTEM_CLOCK.time_ms()
        return accumulator.append(
            "t", 0, now_ms, None, value, (), estimate_record_size(None, value, 0), now_ms
        )[0]

    try:
        first = append(b"first")  # opens the connection (a task, on the loop)
        idle_io.call_soon(sender.wakeup)
        assert first.get(10).offset == 0
        deadline = time.monotonic() + 10
        while sender._waiter is None or sender._waiter.done():  # until the routine sleeps
            assert time.monotonic() < deadline
            time.sleep(0.001)
        second = append(b"second")
        write = sender._write_direct

        def interrupted(*args: Any) -> bool:
            sender._write_direct = write
            signal.raise_signal(signal.SIGINT)  # Ctrl-C, drained but not yet written
            return write(*args)

        sender._write_direct = interrupted
        with pytest.raises(KeyboardInterrupt):
            idle_io.call_if_idle(sender.send_here)
        assert second.get(10).offset == 1, "the drained record is still sent"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:

        async def stop() -> None:
            accumulator.close()
            sender.stop()
            await asyncio.wait_for(task, 5)
            await transport.close(1.0)
            await gateway.__aexit__(None, None, None)

        idle_io.run(stop(), 10)
