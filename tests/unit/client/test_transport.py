"""The ProduceStream transport's bookkeeping, with a scripted stream in place of gRPC."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from gateway.client.errors import NetworkError, UnsupportedVersionError
from gateway.client.throttle import Throttles
from gateway.client.transport import StreamTransport
from services.proto import pb


class ScriptedCall:
    """A ProduceStream call: records writes; answers only what the test feeds it."""

    def __init__(self, fail_writes: bool = False, eof_on_done_writing: bool = True) -> None:
        self.written: list = []
        self.answers: asyncio.Queue = asyncio.Queue()
        self.fail_writes = fail_writes
        self.eof_on_done_writing = eof_on_done_writing
        self.cancelled = False

    async def write(self, request) -> None:
        if self.fail_writes:
            raise grpc.aio.UsageError("stream closed")
        self.written.append(request)

    async def read(self):
        answer = await self.answers.get()
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def done_writing(self) -> None:
        if self.eof_on_done_writing:
            await self.answers.put(grpc.aio.EOF)

    def done(self) -> bool:
        return self.cancelled

    def cancel(self) -> bool:
        self.cancelled = True
        return True


class Unimplemented(grpc.RpcError):
    """What a gateway without ProduceStream answers the stream with."""


def transport_with(call, unary_calls: list | None = None, **settings) -> StreamTransport:
    """A transport on ``call`` (a ScriptedCall, or a list of them: one per stream opened)."""
    calls = call if isinstance(call, list) else None

    def open_stream():
        return calls.pop(0) if calls is not None else call

    endpoint = SimpleNamespace(address="gw:1", stub=SimpleNamespace(ProduceStream=open_stream))

    def translate(endpoint, exc):
        return UnsupportedVersionError("no ProduceStream") if isinstance(exc, Unimplemented) else exc

    async def unary(method, request, **kwargs):
        unary_calls.append((method, request.correlation_id))
        return pb.ProduceResponse(
            correlation_id=request.correlation_id,
            partitions=[pb.PartitionProduceResult(partition=0, base_offset=7)],
        )

    pool = SimpleNamespace(current=lambda: endpoint, mark_ok=lambda e: None, translate=translate)
    # the part of GatewayClient the transport uses
    client: Any = SimpleNamespace(pool=pool, call=unary, produce_throttles=Throttles("produce"))
    return StreamTransport(client, **settings)


def request(acks: pb.Acks, partitions=(0,)) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        topic="t",
        acks=acks,
        batches=[pb.PartitionBatches(partition=p, record_batches=b"x") for p in partitions],
    )


def test_acks_zero_is_sent_once_written_without_waiting_for_an_answer():
    async def run():
        call = ScriptedCall()
        transport = transport_with(call)
        # The first request on a new stream waits for its answer: it proves the gateway
        # implements ProduceStream.
        first = asyncio.ensure_future(transport.send(request(pb.ACKS_NONE, (0, 3)), 5.0))
        await asyncio.sleep(0.05)
        assert not first.done()
        await call.answers.put(
            pb.ProduceResponse(
                correlation_id=1,
                partitions=[
                    pb.PartitionProduceResult(partition=0, base_offset=-1),
                    pb.PartitionProduceResult(partition=3, base_offset=-1),
                ],
            )
        )
        responses = [await asyncio.wait_for(first, 1.0)]
        # From then on the stream never answers, and acks=0 sends do not wait for it.
        responses += [
            await asyncio.wait_for(transport.send(request(pb.ACKS_NONE, (0, 3)), 5.0), 1.0) for _ in range(3)
        ]
        await transport.close(0.1)
        return call, responses

    call, responses = asyncio.run(run())
    assert [r.correlation_id for r in call.written] == [1, 2, 3, 4]
    assert [r.correlation_id for r in responses] == [1, 2, 3, 4]
    for response in responses:
        assert [(p.partition, p.base_offset, p.HasField("error")) for p in response.partitions] == [
            (0, -1, False),
            (3, -1, False),
        ]


def test_acks_zero_falls_back_to_unary_calls_when_the_gateway_has_no_produce_stream():
    async def run():
        call = ScriptedCall()
        unary_calls: list = []
        transport = transport_with(call, unary_calls)
        await call.answers.put(Unimplemented())  # the gateway's answer to the stream
        first = await asyncio.wait_for(transport.send(request(pb.ACKS_NONE), 5.0), 1.0)
        second = await asyncio.wait_for(transport.send(request(pb.ACKS_NONE), 5.0), 1.0)
        await transport.close(0.1)
        return unary_calls, first, second

    unary_calls, first, second = asyncio.run(run())
    # Neither request was reported sent on the stream that refused it: both went as unary calls.
    assert [method for method, _ in unary_calls] == ["Produce", "Produce"]
    assert first.partitions[0].base_offset == 7 and second.partitions[0].base_offset == 7


def test_acks_zero_on_a_broken_stream_fails_the_request():
    async def run():
        transport = transport_with(ScriptedCall(fail_writes=True))
        try:
            return await transport.send(request(pb.ACKS_NONE), 5.0)
        finally:
            await transport.close()

    with pytest.raises(NetworkError):
        asyncio.run(run())


def test_acks_one_waits_for_the_answer_with_its_correlation_id():
    async def run():
        call = ScriptedCall()
        transport = transport_with(call)
        pending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await asyncio.sleep(0.05)
        assert not pending.done(), "acks=1 waits for the gateway's answer"
        await call.answers.put(
            pb.ProduceResponse(
                correlation_id=1, partitions=[pb.PartitionProduceResult(partition=0, base_offset=42)]
            )
        )
        response = await asyncio.wait_for(pending, 1.0)
        await transport.close()
        return response

    assert asyncio.run(run()).partitions[0].base_offset == 42


def test_close_lets_the_gateway_finish_the_stream_before_cancelling_it():
    async def run():
        call = ScriptedCall(eof_on_done_writing=False)
        transport = transport_with(call)
        transport._open_stream().confirmed = True  # the gateway answered on it before
        await transport.send(request(pb.ACKS_NONE), 5.0)
        closing = asyncio.ensure_future(transport.close(5.0))
        await asyncio.sleep(0.1)
        # Still reading: cancelling now would drop acks=0 requests the gateway has not read yet.
        early = (call.cancelled, closing.done())
        await call.answers.put(pb.ProduceResponse(correlation_id=1))
        await call.answers.put(grpc.aio.EOF)
        await asyncio.wait_for(closing, 1.0)
        return early

    assert asyncio.run(run()) == (False, False)


def _answer(correlation_id: int, offset: int = 0) -> pb.ProduceResponse:
    return pb.ProduceResponse(
        correlation_id=correlation_id, partitions=[pb.PartitionProduceResult(partition=0, base_offset=offset)]
    )


class IdleEnded(grpc.RpcError):
    """The gateway ending a stream idle past its produce_stream_max_idle_ms."""


def test_a_stream_the_gateway_ended_for_idleness_is_replaced_on_the_next_send():
    async def run():
        first, second = ScriptedCall(), ScriptedCall()
        transport = transport_with([first, second], max_idle_s=None)
        transport._client.pool.translate = lambda endpoint, exc: NetworkError("idle for 600000 ms")
        sending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await first.answers.put(_answer(1, 10))
        assert (await sending).partitions[0].base_offset == 10
        await first.answers.put(IdleEnded())  # the gateway gives up on the idle stream
        for _ in range(100):
            if transport._stream.broken:
                break
            await asyncio.sleep(0.01)
        sending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await second.answers.put(_answer(2, 11))
        answer = await asyncio.wait_for(sending, 1.0)
        assert [r.correlation_id for r in second.written] == [2]  # on a new stream
        await transport.close()
        return answer, first.written

    answer, first_written = asyncio.run(run())
    assert answer.partitions[0].base_offset == 11 and len(first_written) == 1


def test_a_stream_idle_past_max_idle_is_ended_by_the_client_before_the_next_request():
    async def run():
        first, second = ScriptedCall(), ScriptedCall()
        transport = transport_with([first, second], max_idle_s=0.2)
        sending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await first.answers.put(_answer(1))
        await sending
        await asyncio.sleep(0.1)  # not idle long enough yet: the same stream
        sending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await first.answers.put(_answer(2))
        await sending
        await asyncio.sleep(0.3)  # now idle past max_idle_s
        sending = asyncio.ensure_future(transport.send(request(pb.ACKS_LEADER), 5.0))
        await second.answers.put(_answer(3))
        await asyncio.wait_for(sending, 1.0)
        await transport.close()
        return first, second

    first, second = asyncio.run(run())
    assert [r.correlation_id for r in first.written] == [1, 2]
    assert [r.correlation_id for r in second.written] == [3]
    assert first.cancelled  # ended: written to the end (done_writing), then closed
