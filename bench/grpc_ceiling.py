"""The gRPC ceiling for one-record produce requests: an empty ProduceStream servicer, in Python.

The paper's unbatched producer sends one message per request. Through the gateway's gRPC API that
is one ProduceStream message per record, so no gateway can go faster than gRPC Python carries
messages on one stream. This measures exactly that, with no Tributary code on the path: a server
process whose ``ProduceStream`` only answers each request with its correlation id, and a client
that pipelines ``--messages`` requests (the same ~270-byte ProduceRequest a one-record batch
makes) and reads every answer. Both the asyncio stack (``grpc.aio``, what our services use) and
the threaded one (``grpc.server`` with a pool) are measured; the best of ``--repeat`` runs is kept.

    python bench/grpc_ceiling.py                      # 30,000 messages, best of 3
    python bench/grpc_ceiling.py --messages 100000

Compare with ``bench/paper.py``'s unbatched rows (the real gateway and storage node behind the
same stream) and the paper's 50,000 msg/s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import grpc

from services.proto import gateway_grpc, pb

RECORD_BATCH_BYTES = 270  # a RecordBatch v2 holding one 200-byte record with a small key


class _AsyncEcho(gateway_grpc.GatewayServicer):
    async def ProduceStream(self, request_iterator, context):
        async for request in request_iterator:
            yield pb.ProduceResponse(correlation_id=request.correlation_id)


class _SyncEcho(gateway_grpc.GatewayServicer):
    def ProduceStream(self, request_iterator, context):
        for request in request_iterator:
            yield pb.ProduceResponse(correlation_id=request.correlation_id)


async def _serve_async() -> None:
    server = grpc.aio.server()
    gateway_grpc.add_GatewayServicer_to_server(_AsyncEcho(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def _serve_sync() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(4))
    gateway_grpc.add_GatewayServicer_to_server(_SyncEcho(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    server.wait_for_termination()


def _requests(count: int) -> list:
    payload = b"\0" * RECORD_BATCH_BYTES
    return [
        pb.ProduceRequest(
            topic="ceiling",
            acks=pb.ACKS_NONE,
            correlation_id=i + 1,
            batches=[pb.PartitionBatches(partition=0, record_batches=payload)],
        )
        for i in range(count)
    ]


async def _client_async(port: int, requests: list) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_grpc.GatewayStub(channel)
        started = time.perf_counter()
        answered = 0
        async for _ in stub.ProduceStream(iter(requests)):
            answered += 1
        elapsed = time.perf_counter() - started
    if answered != len(requests):
        raise SystemExit(f"only {answered} of {len(requests)} answered")
    return len(requests) / elapsed


def _client_sync(port: int, requests: list) -> float:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = gateway_grpc.GatewayStub(channel)
        started = time.perf_counter()
        answered = sum(1 for _ in stub.ProduceStream(iter(requests)))
        elapsed = time.perf_counter() - started
    if answered != len(requests):
        raise SystemExit(f"only {answered} of {len(requests)} answered")
    return len(requests) / elapsed


def measure(stack: str, count: int, repeat: int) -> float:
    """Best messages/s of ``repeat`` runs against a fresh server process of ``stack``."""
    server = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", stack], stdout=subprocess.PIPE, text=True
    )
    assert server.stdout is not None  # stdout=PIPE
    try:
        port = int(server.stdout.readline())
        requests = _requests(count)
        runs = []
        for _ in range(repeat):
            if stack == "aio":
                runs.append(asyncio.run(_client_async(port, requests)))
            else:
                runs.append(_client_sync(port, requests))
        return max(runs)
    finally:
        server.kill()
        server.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve", choices=["aio", "sync"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve == "aio":
        asyncio.run(_serve_async())
        return 0
    if args.serve == "sync":
        _serve_sync()
        return 0
    print(
        f"grpcio {grpc.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs; "
        f"{args.messages:,} one-record ProduceStream messages, best of {args.repeat}"
    )
    for stack, label in (("aio", "grpc.aio server and client"), ("sync", "threaded grpc server and client")):
        rate = measure(stack, args.messages, args.repeat)
        print(f"  empty echo servicer, {label:<32} {rate:>10,.0f} msg/s   (paper's unbatched Kafka: 50,000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
