"""Authorization at the gateway (issue 16), with real processes: mutual TLS names the callers
(``User:admin``, a super user; ``User:alice``, with no ACLs at first), ACLs live in etcd and
reach the gateway through the coordinator's WatchAcls stream.

* alice is refused produce, fetch, group join, commit, topic create and delete, each with
  Kafka's reason; her metadata shows no topic;
* an ACL added by admin lets her through without reconnecting; deny beats allow; prefixed ACLs
  match; removing an ACL takes the right away again;
* the raw data path is checked as gRPC is;
* ``tributary acls add | list | remove`` work with the admin certificate.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import TributaryError
from launcher.local_cluster import LocalCluster, LocalClusterSpec
from services.acls import AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType
from tests.integration.gateway.test_tls import client_tls_settings, gateway_tls_args, make_ca, make_cert
from tests.support.wait import wait_until

TOPIC = ResourceType.TOPIC


@pytest.fixture
def certs(tmp_path):
    directory = tmp_path / "certs"
    directory.mkdir()
    make_ca(directory, "ca")
    make_cert(directory, "ca", "gateway", server=True, serial=1)
    make_cert(directory, "ca", "admin", server=False, serial=2)
    make_cert(directory, "ca", "alice", server=False, serial=3)
    return directory


@pytest.fixture
def cluster(tmp_path, certs):
    spec = LocalClusterSpec(
        storage_nodes=1,
        coordinators=1,
        gateways=1,
        gateway_args=[
            *gateway_tls_args(certs),
            "--authorizer-enabled",
            "true",
            "--super-users",
            "User:admin",
        ],
    )
    with LocalCluster(tmp_path / "cluster", spec) as local:
        yield local


settings = client_tls_settings


def allow(name: str, operation: Operation, *, prefixed: bool = False, resource=TOPIC) -> AclBinding:
    pattern = PatternType.PREFIXED if prefixed else PatternType.LITERAL
    return AclBinding("User:alice", "*", resource, pattern, name, operation, Permission.ALLOW)


def reason_of(action) -> str:
    try:
        action()
    except TributaryError as exc:
        return exc.reason
    return ""


def test_acls_decide_what_alice_may_do(cluster, certs):
    admin = Admin(servers=cluster.gateway, **settings(certs, "admin"))
    admin.create_topics([NewTopic("orders", 1), NewTopic("pay-eu", 1), NewTopic("hidden", 1)])
    alice = settings(certs, "alice")

    # Without DESCRIBE the topic is refused at metadata; with DESCRIBE only, each data path
    # refuses the write and the read itself.
    with Producer(servers=cluster.gateway, acks=1, retries=0, **alice) as producer:
        assert (
            reason_of(lambda: producer.send("orders", b"x", partition=0).get(20))
            == "TOPIC_AUTHORIZATION_FAILED"
        )
    admin.create_acls([allow("orders", Operation.DESCRIBE)])
    for path in ("auto", "grpc"):
        with Producer(servers=cluster.gateway, acks=1, data_path=path, retries=0, **alice) as producer:
            wait_until(
                lambda p=producer: (
                    reason_of(lambda: p.send("orders", b"x", partition=0).get(20))
                    == "TOPIC_AUTHORIZATION_FAILED"
                ),
                timeout=20,
                what=f"the write refused on the {path} path",
            )
        with Consumer(
            servers=cluster.gateway, data_path=path, auto_offset_reset="earliest", **alice
        ) as reader:
            reader.assign([TopicPartition("orders", 0)])
            assert reason_of(lambda r=reader: r.poll(timeout_ms=5_000)) == "TOPIC_AUTHORIZATION_FAILED"
    with Admin(servers=cluster.gateway, **alice) as alice_admin:
        assert alice_admin.list_topics() == ["orders"]  # only what she may describe
        assert (
            reason_of(lambda: alice_admin.create_topics([NewTopic("mine", 1)]))
            == "TOPIC_AUTHORIZATION_FAILED"
        )
        assert reason_of(lambda: alice_admin.delete_topics(["orders"])) == "TOPIC_AUTHORIZATION_FAILED"
        assert reason_of(lambda: alice_admin.elect_leaders()) == "CLUSTER_AUTHORIZATION_FAILED"
    with Consumer("orders", servers=cluster.gateway, group_id="billing", **alice) as consumer:
        assert reason_of(lambda: consumer.poll(timeout_ms=5_000)) == "GROUP_AUTHORIZATION_FAILED"

    # ACLs added by admin let alice through, without reconnecting.
    producer = Producer(servers=cluster.gateway, acks=1, **alice)
    admin.create_acls([allow("orders", Operation.WRITE)])
    wait_until(
        lambda: reason_of(lambda: producer.send("orders", b"a", partition=0).get(20)) == "",
        timeout=20,
        what="alice allowed to write orders",
    )
    assert sorted(b.operation.value for b in admin.describe_acls(AclFilter(principal="User:alice"))) == [
        "DESCRIBE",
        "WRITE",
    ]

    admin.create_acls([allow("orders", Operation.READ), allow("pay-", Operation.READ, prefixed=True)])
    with Producer(servers=cluster.gateway, acks=1, **settings(certs, "admin")) as feeder:
        feeder.send("pay-eu", b"paid", partition=0).get(20)
    with Consumer(servers=cluster.gateway, auto_offset_reset="earliest", **alice) as consumer:
        consumer.assign([TopicPartition("orders", 0), TopicPartition("pay-eu", 0)])
        got: list[bytes] = []
        wait_until(
            lambda: (
                got.extend(r.value for rs in consumer.poll(timeout_ms=500).values() for r in rs)
                or set(got) >= {b"a", b"paid"}
            ),
            timeout=20,
            what="alice reading orders and the prefixed pay-eu",
            tolerate=(TributaryError,),
        )
    with Admin(servers=cluster.gateway, **alice) as alice_admin:
        wait_until(
            lambda: alice_admin.list_topics() == ["orders", "pay-eu"], timeout=20, what="alice's topics"
        )

    # Deny beats allow.
    admin.create_acls(
        [
            AclBinding(
                "User:alice", "*", TOPIC, PatternType.LITERAL, "orders", Operation.WRITE, Permission.DENY
            )
        ]
    )
    wait_until(
        lambda: (
            reason_of(lambda: producer.send("orders", b"b", partition=0).get(20))
            == "TOPIC_AUTHORIZATION_FAILED"
        ),
        timeout=20,
        what="the deny taking effect",
    )
    # Removing ACLs takes rights away again.
    deleted = admin.delete_acls([AclFilter(principal="User:alice", resource_name="orders")])
    assert len(deleted) == 4  # DESCRIBE, WRITE, READ and the DENY on orders
    producer.close()

    # The CLI, with the admin's certificate.
    cli = [sys.executable, "-m", "gateway.cli.main", "acls"]
    files = [
        "--gateway", cluster.gateway, "--ssl-cafile", str(certs / "ca.pem"),
        "--ssl-certfile", str(certs / "admin.pem"), "--ssl-keyfile", str(certs / "admin.key"),
    ]  # fmt: skip
    added = subprocess.run(
        [*cli, "add", "--allow-principal", "User:bob", "--operation", "READ", "--topic", "audit", *files],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert added.returncode == 0, added.stderr
    listed = subprocess.run([*cli, "list", *files], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and "User:bob" in listed.stdout and "audit" in listed.stdout, listed.stderr
    removed = subprocess.run(
        [*cli, "remove", "--principal", "User:bob", *files], capture_output=True, text=True, timeout=60
    )
    assert removed.returncode == 0 and "1" in removed.stdout, removed.stderr
    assert not admin.describe_acls(AclFilter(principal="User:bob"))
    admin.close()
