"""Bearer-token authentication at the gateway (issue 16, item 2), with real processes: a gateway
with TLS and ``--token-public-key-file``, the authorizer on, ``User:admin`` a super user.

* a client with a valid token (SDK: SASL_SSL / OAUTHBEARER) works on both data paths, as the
  principal its token names (``User:alice``), within her ACLs;
* no token, an expired one, one signed with another key, one from another issuer: every call
  is UNAUTHENTICATED with SASL_AUTHENTICATION_FAILED, on gRPC and in the raw handshake; the
  health service stays open;
* a data connection whose token expires is closed at its next request and the SDK reconnects
  with a fresh token, losing nothing;
* ``tributary`` commands take ``--token-file``; ``tributary tokens issue`` mints a token.
"""

from __future__ import annotations

import socket
import ssl
import subprocess
import sys
import time

import grpc
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519
from grpc_health.v1 import health_pb2, health_pb2_grpc

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services import tokens
from services.acls import AclBinding, Operation, PatternType, Permission, ResourceType
from services.dataport import protocol as dp
from services.proto import pb
from tests.integration.gateway.test_tls import make_ca, make_cert
from tests.support.wait import wait_until

ISSUER = "tributary-test"


def _write_key(path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    path.with_suffix(".pub").write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    directory = tmp_path_factory.mktemp("token-keys")
    make_ca(directory, "ca")
    make_cert(directory, "ca", "gateway", server=True, serial=1)
    _write_key(directory / "signing.key", ed25519.Ed25519PrivateKey.generate())
    _write_key(directory / "other.key", ed25519.Ed25519PrivateKey.generate())
    return directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, keys):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        gateway_args=[
            "--tls-cert-file", str(keys / "gateway.pem"),
            "--tls-key-file", str(keys / "gateway.key"),
            "--token-public-key-file", str(keys / "signing.pub"),
            "--token-issuer", ISSUER,
            "--authorizer-enabled", "true",
            "--super-users", "User:admin",
        ],
    )  # fmt: skip
    with LocalCluster(tmp_path_factory.mktemp("token-cluster"), spec) as local:
        with Admin(servers=local.gateway, **as_user(keys, mint(keys, "admin"))) as admin:
            admin.create_topics([NewTopic("orders", 1), NewTopic("secret", 1), NewTopic("renewed", 1)])
            admin.create_acls(
                [allow("orders", op) for op in (Operation.DESCRIBE, Operation.WRITE, Operation.READ)]
            )
        yield local


def mint(
    keys, subject: str, *, lifetime_s: float = 600, key: str = "signing", issuer: str = ISSUER, now=None
) -> str:
    private = tokens.load_private_key((keys / f"{key}.key").read_bytes())
    return tokens.issue(private, subject, lifetime_s=lifetime_s, issuer=issuer, now=now)


def as_user(keys, provider) -> dict:
    return {
        "security_protocol": "SASL_SSL",
        "ssl_cafile": str(keys / "ca.pem"),
        "sasl_mechanism": "OAUTHBEARER",
        "sasl_oauth_token_provider": provider,
    }


def reason_of(action) -> str:
    try:
        action()
    except TributaryError as exc:
        return exc.reason
    return ""


def allow(name: str, operation: Operation) -> AclBinding:
    return AclBinding(
        "User:alice", "*", ResourceType.TOPIC, PatternType.LITERAL, name, operation, Permission.ALLOW
    )


def test_a_token_names_the_principal_on_both_data_paths(cluster, keys):
    alice = as_user(keys, lambda: mint(keys, "alice"))
    with Admin(servers=cluster.gateway, **alice) as alice_admin:
        wait_until(lambda: alice_admin.list_topics() == ["orders"], timeout=20, what="alice sees orders only")
    for path in ("auto", "grpc"):
        with Producer(servers=cluster.gateway, acks=1, data_path=path, **alice) as producer:
            wait_until(
                lambda p=producer, v=path: (
                    reason_of(lambda: p.send("orders", v.encode(), partition=0).get(20)) == ""
                ),
                timeout=20,
                what=f"alice writes orders on the {path} path",
            )
            refused = reason_of(lambda p=producer: p.send("secret", b"x", partition=0).get(20))
            assert refused == "TOPIC_AUTHORIZATION_FAILED"
        with Consumer(
            servers=cluster.gateway, data_path=path, auto_offset_reset="earliest", **alice
        ) as reader:
            reader.assign([TopicPartition("orders", 0)])
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while path.encode() not in got and time.monotonic() < deadline:
                for records in reader.poll(timeout_ms=500).values():
                    got.extend(r.value for r in records)
            assert path.encode() in got


@pytest.mark.parametrize(
    "token",
    [
        None,
        "expired",
        "other-key",
        "other-issuer",
        "garbage",
    ],
)
def test_calls_without_a_valid_token_are_unauthenticated(cluster, keys, token):
    gateway = cluster.gateway
    if token is None:
        settings = {"security_protocol": "SSL", "ssl_cafile": str(keys / "ca.pem")}
    else:
        value = {
            "expired": lambda: mint(keys, "alice", lifetime_s=10, now=time.time() - 3600),
            "other-key": lambda: mint(keys, "admin", key="other"),
            "other-issuer": lambda: mint(keys, "admin", issuer="someone-else"),
            "garbage": lambda: "not.a.token",
        }[token]()
        settings = as_user(keys, value)
    with Admin(servers=gateway, **settings) as admin:
        assert reason_of(admin.list_topics) == "SASL_AUTHENTICATION_FAILED"
    with Producer(servers=gateway, acks=1, retries=0, **settings) as producer:
        assert (
            reason_of(lambda: producer.send("orders", b"x", partition=0).get(20))
            == "SASL_AUTHENTICATION_FAILED"
        )


def _channel(cluster, keys) -> grpc.Channel:
    credentials = grpc.ssl_channel_credentials((keys / "ca.pem").read_bytes())
    return grpc.secure_channel(cluster.gateway, credentials)


def test_a_bare_grpc_call_is_unauthenticated_and_the_health_service_stays_open(cluster, keys):
    with _channel(cluster, keys) as channel:
        list_topics = channel.unary_unary(
            "/tributary.v1.Gateway/ListTopics",
            request_serializer=pb.ListTopicsRequest.SerializeToString,
            response_deserializer=pb.ListTopicsResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            list_topics(pb.ListTopicsRequest(), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "SASL_AUTHENTICATION_FAILED" in refused.value.details()
        with pytest.raises(grpc.RpcError) as malformed:
            list_topics(pb.ListTopicsRequest(), timeout=10, metadata=(("authorization", "Basic abc"),))
        assert malformed.value.code() == grpc.StatusCode.UNAUTHENTICATED
        # Standard call credentials, as any language's gRPC library sends them.
        answer = list_topics(
            pb.ListTopicsRequest(), timeout=10, metadata=(("authorization", f"Bearer {mint(keys, 'admin')}"),)
        )
        assert "orders" in answer.names
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING


def _raw_handshake(cluster, keys, token: str) -> dp.HandshakeAnswer:
    info = cluster.gateways[0].info
    context = ssl.create_default_context(cafile=str(keys / "ca.pem"))
    with (
        socket.create_connection(("127.0.0.1", info["data_port"]), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as sock,
    ):
        sock.sendall(dp.encode_handshake(dp.Handshake(dp.MIN_VERSION, dp.MAX_VERSION, "raw-test", token)))
        (size,) = dp.SIZE.unpack(_read(sock, dp.SIZE.size))
        return dp.decode_handshake_answer(_read(sock, size))


def _read(sock, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        assert chunk, "the gateway closed the connection"
        data += chunk
    return data


def test_the_raw_handshake_needs_a_valid_token(cluster, keys):
    for token in ("", "x.y.z", mint(keys, "admin", key="other")):
        answer = _raw_handshake(cluster, keys, token)
        assert (answer.error_code, answer.version) == (58, -1), answer
        assert "token" in answer.message
    answer = _raw_handshake(cluster, keys, mint(keys, "admin"))
    assert answer.error_code == 0 and answer.version >= dp.MIN_VERSION


def test_a_data_connection_is_closed_when_its_token_expires_and_the_sdk_reconnects(cluster, keys):
    # Tokens handed out in the first 1.5 s (the data connection opens then) expire, past the
    # gateway's leeway, 3 s after they were minted; later ones are fresh.
    handed: list[float] = []
    started = time.monotonic()

    def provider() -> str:
        handed.append(time.monotonic() - started)
        if handed[-1] < 1.5:
            return mint(keys, "admin", lifetime_s=10, now=time.time() - tokens.LEEWAY_S - 10 + 3)
        return mint(keys, "admin")

    sent = 0
    with Producer(
        servers=cluster.gateway, acks=1, data_path="auto", linger_ms=0, **as_user(keys, provider)
    ) as producer:
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            producer.send("renewed", str(sent).encode(), partition=0).get(20)
            sent += 1
            time.sleep(0.05)
    assert max(handed) >= 1.5, "the SDK asked for a fresh token after the first one expired"
    log = cluster.gateways[0].log_file.read_text()
    assert "bearer token expired; closing it" in log
    with Consumer(
        servers=cluster.gateway, auto_offset_reset="earliest", **as_user(keys, mint(keys, "admin"))
    ) as reader:
        reader.assign([TopicPartition("renewed", 0)])
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < sent and time.monotonic() < deadline:
            for records in reader.poll(timeout_ms=500).values():
                got.extend(r.value for r in records)
    assert sorted(int(v) for v in got) == list(range(sent)), "every acknowledged record, once"


def test_the_cli_takes_a_token_file_and_issues_tokens(cluster, keys, tmp_path):
    token_file = tmp_path / "admin.token"
    issued = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "tokens", "issue",
         "--private-key", str(keys / "signing.key"), "--subject", "admin",
         "--lifetime", "10m", "--issuer", ISSUER],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    token_file.write_text(issued.stdout.strip())
    command = [sys.executable, "-m", "gateway.cli.main", "topics", "list", "--gateway", cluster.gateway,
               "--ssl-cafile", str(keys / "ca.pem")]  # fmt: skip
    listed = subprocess.run(
        [*command, "--token-file", str(token_file)], capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 0, listed.stderr
    assert "orders" in listed.stdout.split()
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "SASL_AUTHENTICATION_FAILED" in refused.stderr
