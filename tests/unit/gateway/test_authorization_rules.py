"""Every Gateway RPC is authorized: a rule says what it needs, or its answer is filtered."""

import pytest

from gateway.server.authorization import FILTERED, Gatekeeper, certificate_principal, required
from services import errors
from services.acls import AclBinding, Operation, PatternType, Permission, Request, ResourceType
from services.proto import gateway_pb2, pb

#: Checked by the servicer under another method's rule, or specially.
SPECIAL = {"ProduceStream": "Produce", "CreateTopic": "CreateTopic"}


def test_every_gateway_rpc_has_a_rule():
    methods = gateway_pb2.DESCRIPTOR.services_by_name["Gateway"].methods_by_name
    missing = []
    for name, method in methods.items():
        if name in FILTERED or name in SPECIAL:
            continue
        request = getattr(pb, method.input_type.name)()
        try:
            required(name, request)
        except KeyError:
            missing.append(name)
    assert not missing, f"Gateway RPCs without an authorization rule: {missing}"


def test_what_calls_need():
    produce = pb.ProduceRequest(topic="orders")
    assert required("Produce", produce) == [Request(Operation.WRITE, ResourceType.TOPIC, "orders")]
    fetch = pb.FetchRequest(partitions=[pb.FetchPartition(topic="a"), pb.FetchPartition(topic="a")])
    assert required("Fetch", fetch) == [Request(Operation.READ, ResourceType.TOPIC, "a")]
    assert required("InitProducerId", pb.InitProducerIdRequest()) == [
        Request(Operation.IDEMPOTENT_WRITE, ResourceType.CLUSTER)
    ]


def test_refusals_carry_kafkas_reasons():
    gate = Gatekeeper(super_users=["User:root"])
    with pytest.raises(errors.CoordinatorNotAvailableError):
        gate.check("User:a", "h", "Produce", pb.ProduceRequest(topic="t"))  # no ACLs yet
    gate.update(
        [
            AclBinding(
                "User:a", "*", ResourceType.TOPIC, PatternType.LITERAL, "t", Operation.READ, Permission.ALLOW
            )
        ]
    )
    with pytest.raises(errors.TopicAuthorizationFailedError):
        gate.check("User:a", "h", "Produce", pb.ProduceRequest(topic="t"))
    with pytest.raises(errors.GroupAuthorizationFailedError):
        gate.check("User:a", "h", "JoinGroup", pb.JoinGroupRequest(group_id="g"))
    with pytest.raises(errors.ClusterAuthorizationFailedError):
        gate.check("User:a", "h", "ElectLeaders", pb.ElectLeadersRequest())
    with pytest.raises(errors.TransactionalIdAuthorizationFailedError):
        gate.check("User:a", "h", "EndTxn", pb.EndTxnRequest(transactional_id="x"))
    with pytest.raises(errors.TopicAuthorizationFailedError):
        gate.check("User:a", "h", "CreateTopic", pb.CreateTopicRequest(name="new"))
    gate.check("User:root", "h", "CreateTopic", pb.CreateTopicRequest(name="new"))
    gate.check("User:a", "h", "Fetch", pb.FetchRequest(partitions=[pb.FetchPartition(topic="t")]))


def test_principal_from_a_certificate():
    assert certificate_principal(None) == "User:ANONYMOUS"
    subject = {"subject": ((("organizationName", "x"),), (("commonName", "alice"),))}
    assert certificate_principal(subject) == "User:alice"
