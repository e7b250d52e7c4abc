"""The authorizer's decisions: deny beats allow, prefixes, wildcards, implied DESCRIBE, super users."""

import pytest

from services.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Authorizer,
    Operation,
    PatternType,
    Permission,
    Request,
    ResourceType,
    validate_binding,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LIT, PRE = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(principal, name, op, permission=ALLOW, *, pattern=LIT, kind=TOPIC, host="*"):
    return AclBinding(principal, host, kind, pattern, name, op, permission)


def test_nothing_matches_nothing_allowed():
    assert not Authorizer([]).authorize("User:alice", "1.2.3.4", Request(Operation.READ, TOPIC, "t"))


def test_literal_prefixed_and_wildcard_names():
    authorizer = Authorizer(
        [
            acl("User:alice", "orders", Operation.READ),
            acl("User:alice", "pay-", Operation.WRITE, pattern=PRE),
            acl("User:*", "*", Operation.DESCRIBE),
        ]
    )
    assert authorizer.authorize("User:alice", "h", Request(Operation.READ, TOPIC, "orders"))
    assert not authorizer.authorize("User:alice", "h", Request(Operation.READ, TOPIC, "orders-2"))
    assert authorizer.authorize("User:alice", "h", Request(Operation.WRITE, TOPIC, "pay-eu"))
    assert not authorizer.authorize("User:alice", "h", Request(Operation.WRITE, TOPIC, "pa"))
    assert authorizer.authorize("User:bob", "h", Request(Operation.DESCRIBE, TOPIC, "anything"))
    assert not authorizer.authorize("User:bob", "h", Request(Operation.READ, TOPIC, "orders"))


def test_deny_beats_allow_and_all_covers_everything():
    authorizer = Authorizer(
        [
            acl("User:alice", "*", Operation.ALL),
            acl("User:alice", "secret", Operation.READ, DENY),
            acl("User:*", "audit", Operation.ALL, DENY, host="10.0.0.9"),
        ]
    )
    assert authorizer.authorize("User:alice", "h", Request(Operation.DELETE, TOPIC, "x"))
    assert not authorizer.authorize("User:alice", "h", Request(Operation.READ, TOPIC, "secret"))
    assert authorizer.authorize("User:alice", "h", Request(Operation.WRITE, TOPIC, "secret"))
    assert not authorizer.authorize("User:alice", "10.0.0.9", Request(Operation.WRITE, TOPIC, "audit"))
    assert authorizer.authorize("User:alice", "10.0.0.8", Request(Operation.WRITE, TOPIC, "audit"))


@pytest.mark.parametrize("granted", [Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER])
def test_describe_is_implied(granted):
    authorizer = Authorizer([acl("User:a", "t", granted)])
    assert authorizer.authorize("User:a", "h", Request(Operation.DESCRIBE, TOPIC, "t"))
    assert not authorizer.authorize("User:a", "h", Request(Operation.CREATE, TOPIC, "t"))


def test_a_deny_of_read_does_not_imply_a_deny_of_describe():
    authorizer = Authorizer(
        [acl("User:a", "t", Operation.DESCRIBE), acl("User:a", "t", Operation.READ, DENY)]
    )
    assert authorizer.authorize("User:a", "h", Request(Operation.DESCRIBE, TOPIC, "t"))


def test_super_users_and_resource_types_apart():
    authorizer = Authorizer([acl("User:a", "g", Operation.READ, kind=GROUP)], super_users=["User:root"])
    assert authorizer.authorize("User:root", "h", Request(Operation.ALTER, CLUSTER, CLUSTER_NAME))
    assert authorizer.authorize("User:a", "h", Request(Operation.READ, GROUP, "g"))
    assert not authorizer.authorize("User:a", "h", Request(Operation.READ, TOPIC, "g"))


def test_filters_and_validation():
    bindings = [acl("User:a", "t", Operation.READ), acl("User:b", "t", Operation.WRITE, DENY)]
    assert [b.principal for b in bindings if AclFilter(resource_name="t", permission=DENY).matches(b)] == [
        "User:b"
    ]
    assert all(AclFilter().matches(b) for b in bindings)
    with pytest.raises(ValueError):
        validate_binding(acl("alice", "t", Operation.READ))
    with pytest.raises(ValueError):
        validate_binding(acl("User:a", "other-cluster", Operation.ALTER, kind=CLUSTER))
    validate_binding(acl("User:a", CLUSTER_NAME, Operation.ALTER, kind=CLUSTER))


def _naive(bindings, super_users, principal, host, request):
    """The rule written out over every binding (what the index must agree with)."""
    if principal in super_users:
        return True
    matching = [
        b
        for b in bindings
        if b.matches_resource(request.resource_type, request.name) and b.matches_caller(principal, host)
    ]
    wanted = (request.operation, Operation.ALL)
    if any(b.permission is Permission.DENY and b.operation in wanted for b in matching):
        return False
    implied = {Operation.DESCRIBE: (Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER)}
    allowing = (*wanted, *implied.get(request.operation, ()))
    if request.operation is Operation.DESCRIBE_CONFIGS:
        allowing = (*allowing, Operation.ALTER_CONFIGS)
    return any(b.permission is Permission.ALLOW and b.operation in allowing for b in matching)


def test_the_indexed_authorizer_decides_as_a_scan_of_every_binding_would():
    import random

    rng = random.Random(16)
    names = ["orders", "orders-eu", "ord", "pay", "pay-eu-1", "*", "o", "x"]
    types = [ResourceType.TOPIC, ResourceType.GROUP]
    operations = [Operation.READ, Operation.WRITE, Operation.DESCRIBE, Operation.ALL, Operation.ALTER]
    for _ in range(300):
        bindings = [
            AclBinding(
                rng.choice(["User:alice", "User:bob", "User:*"]),
                rng.choice(["*", "10.0.0.1"]),
                rng.choice(types),
                rng.choice([PatternType.LITERAL, PatternType.PREFIXED]),
                rng.choice(names),
                rng.choice(operations),
                rng.choice([Permission.ALLOW, Permission.ALLOW, Permission.DENY]),
            )
            for _ in range(rng.randrange(0, 12))
        ]
        authorizer = Authorizer(bindings, ["User:root"])
        for _ in range(20):
            principal = rng.choice(["User:alice", "User:bob", "User:root", "User:carol"])
            host = rng.choice(["10.0.0.1", "10.0.0.2"])
            request = Request(
                rng.choice(operations[:3]), rng.choice(types), rng.choice(names[:5] + ["orders-us"])
            )
            assert authorizer.authorize(principal, host, request) == _naive(
                bindings, {"User:root"}, principal, host, request
            ), (bindings, principal, host, request)
