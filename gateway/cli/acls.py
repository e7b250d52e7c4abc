"""``tributary acls add | list | remove``: the cluster's ACLs (Kafka's ``kafka-acls``), through the
SDK's Admin. A gateway with ``--authorizer-enabled`` decides every call by them."""

from __future__ import annotations

from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, CliError, client_settings
from gateway.cli.output import table
from gateway.client import Admin
from services.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    Operation,
    PatternType,
    Permission,
    ResourceType,
    validate_binding,
)


def _admin(args) -> Admin:
    return Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS)


def _resource(args, *, required: bool) -> tuple[ResourceType, str] | None:
    given = [
        (kind, name)
        for kind, name in (
            (ResourceType.TOPIC, args.topic),
            (ResourceType.GROUP, args.group),
            (ResourceType.TRANSACTIONAL_ID, args.transactional_id),
            (ResourceType.CLUSTER, CLUSTER_NAME if args.cluster else None),
        )
        if name
    ]
    if len(given) > 1:
        raise CliError("name one resource: --topic, --group, --transactional-id or --cluster", 2)
    if not given and required:
        raise CliError("name the resource: --topic, --group, --transactional-id or --cluster", 2)
    return given[0] if given else None


def add(args) -> int:
    """One binding per principal and operation given, each ALLOW or DENY."""
    resource = _resource(args, required=True)
    assert resource is not None
    pattern = PatternType(args.resource_pattern_type.upper())
    bindings = []
    for permission, principals in (
        (Permission.ALLOW, args.allow_principal),
        (Permission.DENY, args.deny_principal),
    ):
        for principal in principals or []:
            for operation in args.operation:
                binding = AclBinding(
                    principal,
                    args.host,
                    resource[0],
                    pattern,
                    resource[1],
                    Operation(operation.upper()),
                    permission,
                )
                try:
                    validate_binding(binding)
                except ValueError as exc:
                    raise CliError(str(exc), 2) from None
                bindings.append(binding)
    if not bindings:
        raise CliError("give --allow-principal or --deny-principal", 2)
    with _admin(args) as admin:
        admin.create_acls(bindings)
    print(f"added {len(bindings)} ACLs")
    return 0


def _filter(args) -> AclFilter:
    resource = _resource(args, required=False)
    return AclFilter(
        principal=args.principal or None,
        resource_type=resource[0] if resource else None,
        resource_name=resource[1] if resource else None,
    )


def list_acls(args) -> int:
    with _admin(args) as admin:
        bindings = admin.describe_acls(_filter(args))
    rows = [
        [
            b.principal,
            b.host,
            b.permission.value,
            b.operation.value,
            b.resource_type.value,
            b.pattern_type.value,
            b.resource_name,
        ]
        for b in bindings
    ]
    print(
        table(("PRINCIPAL", "HOST", "PERMISSION", "OPERATION", "TYPE", "PATTERN", "NAME"), rows)
        if rows
        else "no ACLs"
    )
    return 0


def remove(args) -> int:
    acl_filter = _filter(args)
    if acl_filter == AclFilter() and not args.all:
        raise CliError("narrow it down: --principal and/or a resource (every ACL: --all)", 2)
    with _admin(args) as admin:
        deleted = admin.delete_acls([acl_filter])
    print(f"removed {len(deleted)} ACLs")
    return 0


def add_parser(commands, common) -> None:
    """Register ``acls`` on the CLI's subcommands (``common`` adds --gateway/--data-dir/--ssl-*)."""
    parser = commands.add_parser("acls", help="add, list and remove ACLs (authorization at the gateway)")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def resource_options(sub) -> None:
        sub.add_argument("--topic")
        sub.add_argument("--group")
        sub.add_argument("--transactional-id")
        sub.add_argument("--cluster", action="store_true", help="the cluster resource")

    adding = actions.add_parser("add", help="allow or deny principals operations on a resource")
    common(adding)
    resource_options(adding)
    adding.add_argument("--allow-principal", action="append", metavar="User:NAME")
    adding.add_argument("--deny-principal", action="append", metavar="User:NAME")
    adding.add_argument(
        "--operation",
        action="append",
        required=True,
        choices=[o.value.lower() for o in Operation] + [o.value for o in Operation],
    )
    adding.add_argument("--host", default="*", help="the client IP it applies to (default: any)")
    adding.add_argument(
        "--resource-pattern-type", default="literal", choices=["literal", "prefixed", "LITERAL", "PREFIXED"]
    )
    adding.set_defaults(func=add)
    listing = actions.add_parser("list", help="the ACLs (of a principal and/or resource)")
    common(listing)
    resource_options(listing)
    listing.add_argument("--principal", metavar="User:NAME")
    listing.set_defaults(func=list_acls)
    removing = actions.add_parser("remove", help="remove the ACLs of a principal and/or resource")
    common(removing)
    resource_options(removing)
    removing.add_argument("--principal", metavar="User:NAME")
    removing.add_argument("--all", action="store_true", help="with no principal or resource: every ACL")
    removing.set_defaults(func=remove)
