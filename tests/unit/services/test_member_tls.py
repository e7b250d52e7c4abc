"""Member TLS (``services/tls.py``) with a real gRPC server and a real raw listener on loopback:
the internal ports take only certificates of the cluster CA; a member certificate that names no
address is accepted when the clients check the configured ``server_name`` instead; client
contexts and gRPC server credentials follow rotated files; the health-only port answers in
plaintext while the service's port speaks TLS only."""

from __future__ import annotations

import asyncio
import functools
import socket
import ssl

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.grpc_server import ServiceRegistration, create_server
from services.proto import STORAGE_SERVICE, pb, storage_grpc
from services.tls import (
    ChannelRotation,
    ClientTls,
    MemberTls,
    ReloadingClientContext,
    ReloadingSslContext,
    ServerTls,
    aio_channel,
    grpc_server_credentials,
)
from storage_node.fetch.links import TlsLink
from tests.support.certificates import der, new_ca, new_certificate

SERVER_NAME = "member.tributary.internal"


def run_async(test):
    @functools.wraps(test)
    def wrapper(*args, **kwargs):
        asyncio.run(test(*args, **kwargs))

    return wrapper


@pytest.fixture
def files(tmp_path):
    ca = new_ca(tmp_path, "cluster-ca")
    new_ca(tmp_path, "client-ca")
    named = new_certificate(tmp_path, "cluster-ca", "named", loopback=False, dns_names=(SERVER_NAME,))
    member = new_certificate(tmp_path, "cluster-ca", "member")
    outsider = new_certificate(tmp_path, "client-ca", "outsider")
    return tmp_path, ca, named, member, outsider


class _Echo(storage_grpc.StorageNodeServicer):
    async def DescribeLogDirs(self, request, context):
        return pb.DescribeLogDirsResponse(node_id=7)


async def _serve(tls: MemberTls, *, health_port: bool = False):
    return await create_server(
        "127.0.0.1:0",
        [ServiceRegistration(storage_grpc.add_StorageNodeServicer_to_server, _Echo(), STORAGE_SERVICE)],
        credentials=grpc_server_credentials(tls.server),
        health_address="127.0.0.1:0" if health_port else None,
    )


async def _call(port: int, tls: ClientTls | None) -> int:
    async with aio_channel(f"127.0.0.1:{port}", tls) as channel:
        stub = storage_grpc.StorageNodeStub(channel)
        return (await stub.DescribeLogDirs(pb.DescribeLogDirsRequest(), timeout=3)).node_id


@run_async
async def test_grpc_takes_members_only_and_checks_the_configured_name(files):
    _, ca, named, member, outsider = files
    server = await _serve(MemberTls(*named, ca, server_name=SERVER_NAME), health_port=True)
    try:
        # The certificate names no address: checked against the address it fails, against the
        # configured name it passes.
        with pytest.raises(grpc.aio.AioRpcError):
            await _call(server.port, ClientTls(ca, *member))
        assert await _call(server.port, ClientTls(ca, *member, server_name=SERVER_NAME)) == 7
        for refused in (None, ClientTls(ca, server_name=SERVER_NAME), ClientTls(ca, *outsider, SERVER_NAME)):
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await _call(server.port, refused)
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        # The health-only port: plaintext, health and nothing else.
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            answer = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3
            )
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await storage_grpc.StorageNodeStub(channel).DescribeLogDirs(
                    pb.DescribeLogDirsRequest(), timeout=3
                )
            assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED
        await server.stop(0)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.health_port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError):
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
    finally:
        await server.server.stop(0)


@run_async
async def test_raw_clients_check_the_configured_name_and_present_rotated_certificates(files):
    directory, ca, named, member, _ = files
    loop = asyncio.get_running_loop()
    server_context = ReloadingSslContext(MemberTls(*named, ca).server)
    seen: list[bytes] = []

    async def accept(listener: socket.socket) -> None:
        sock, _ = await loop.sock_accept(listener)
        sock.setblocking(False)
        link = TlsLink(loop, sock, server_context.context)
        try:
            await link.handshake()
            certificate = link._tls.getpeercert(binary_form=True)
            assert certificate is not None
            seen.append(certificate)
            await link.sendall(b"ok")
        finally:
            link.close()

    async def connect(client: ReloadingClientContext) -> bytes:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            listener.setblocking(False)
            serving = asyncio.create_task(accept(listener))
            host, port = listener.getsockname()
            reader, writer = await asyncio.open_connection(
                host, port, ssl=client.context, server_hostname=client.server_hostname(host)
            )
            answer = await reader.read()
            writer.close()
            await serving
            return answer

    client = ReloadingClientContext(ClientTls(ca, *member, server_name=SERVER_NAME))
    assert await connect(client) == b"ok"
    assert seen[-1] == der(member[0])
    new_certificate(directory, "cluster-ca", "member")  # rotated: new serial, same files
    assert der(member[0]) != seen[-1]
    assert await connect(client) == b"ok"
    assert seen[-1] == der(member[0]), "the next connection presents the new certificate"

    unnamed = ReloadingClientContext(ClientTls(ca, *member))  # checks 127.0.0.1: not in the cert
    with pytest.raises(OSError):
        await connect(unnamed)


def test_channel_caches_learn_of_a_rotation_once_the_new_pair_checks_out(files):
    directory, ca, _, member, _ = files
    assert not ChannelRotation(None, check_interval_s=0).rotated()  # plaintext: never
    rotation = ChannelRotation(ClientTls(ca, *member), check_interval_s=0)
    assert not rotation.rotated()
    _, key = member
    old_key = key.read_bytes()
    new_certificate(directory, "cluster-ca", "member")
    new_key = key.read_bytes()
    key.write_bytes(old_key)  # half-way through a rotation: new certificate, old key
    assert not rotation.rotated(), "a pair that does not match is not taken"
    key.write_bytes(new_key)
    assert rotation.rotated()
    assert not rotation.rotated(), "once per change"
    slow = ChannelRotation(ClientTls(ca, *member), check_interval_s=3600)
    new_certificate(directory, "cluster-ca", "member")
    assert not slow.rotated(), "looked at most every check_interval_s"


@run_async
async def test_a_ca_removed_from_the_client_ca_file_is_refused_on_the_next_connection(tmp_path):
    """The raw listener's client CAs follow the file both ways: a CA added is trusted on the next
    handshake and a CA removed is refused on it, with or without SNI from the client."""
    server_ca, other_ca = new_ca(tmp_path, "server-ca"), new_ca(tmp_path, "other-ca")
    server = new_certificate(tmp_path, "server-ca", "server", dns_names=("gateway.test",))
    insider = new_certificate(tmp_path, "server-ca", "insider")
    outsider = new_certificate(tmp_path, "other-ca", "outsider")
    client_cas = tmp_path / "client-cas.pem"
    client_cas.write_text(server_ca.read_text())
    listener_tls = ReloadingSslContext(ServerTls(*server, client_ca_file=client_cas))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0, ssl=listener_tls.context)
    port = listener.sockets[0].getsockname()[1]

    async def answer(client_cert: tuple, server_hostname: str) -> bytes | None:
        context = ssl.create_default_context(cafile=server_ca)
        context.load_cert_chain(*client_cert)
        try:
            reader, writer = await asyncio.open_connection(
                "127.0.0.1", port, ssl=context, server_hostname=server_hostname
            )
            data = await reader.read()
            writer.close()
            return data
        except (ssl.SSLError, ConnectionError):
            return None

    try:
        for name in ("gateway.test", "127.0.0.1"):  # with SNI, and without (no SNI for an address)
            assert await answer(insider, name) == b"ok"
            assert await answer(outsider, name) in (None, b"")
        client_cas.write_text(server_ca.read_text() + other_ca.read_text())
        assert listener_tls.maybe_reload()
        for name in ("gateway.test", "127.0.0.1"):
            assert await answer(outsider, name) == b"ok", "an added CA is trusted"
        client_cas.write_text(other_ca.read_text())
        assert listener_tls.maybe_reload()
        for name in ("gateway.test", "127.0.0.1"):
            assert await answer(insider, name) in (None, b""), "a removed CA is refused"
            assert await answer(outsider, name) == b"ok"
    finally:
        listener.close()
        await listener.wait_closed()
