"""``tributary quotas set | describe | remove``: client quotas per user and client id (Kafka's
``kafka-client-quotas`` / ``kafka-configs --entity-type users|clients``), through the SDK's Admin.
Every gateway enforces them at once (``throttle_time_ms``), no restart.

An entity is ``--user NAME``, ``--client-id ID`` or both; ``--default user`` / ``--default
client-id`` stand for Kafka's ``<default>`` of that part (every user or client id without an
entity of its own)::

    tributary quotas set --client-id reports --producer-byte-rate 1MB
    tributary quotas set --user alice --default client-id --consumer-byte-rate 5MB
    tributary quotas set --default user --request-percentage 50
    tributary quotas describe [--user alice] [--strict]
    tributary quotas remove --client-id reports [--key producer_byte_rate]
"""

from __future__ import annotations

from gateway.cli.connect import CliError, client_settings
from gateway.cli.output import table
from gateway.cli.reassign import parse_rate
from gateway.client import Admin
from services.quotas import (
    CLIENT_ID,
    CONSUMER_BYTE_RATE,
    DEFAULT,
    PRODUCER_BYTE_RATE,
    QUOTA_KEYS,
    REQUEST_PERCENTAGE,
    USER,
    ComponentFilter,
    MatchType,
    QuotaEntity,
    QuotaFilter,
    validate_entity,
    validate_quota_value,
)

CLI_REQUEST_TIMEOUT_MS = 15_000


def _admin(args) -> Admin:
    return Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS)


def _parts(args) -> dict[str, str]:
    """{entity type: name or <default>} from --user, --client-id and --default."""
    parts: dict[str, str] = {}
    if args.user is not None:
        parts[USER] = args.user
    if args.client_id is not None:
        parts[CLIENT_ID] = args.client_id
    for kind in args.default or []:
        if kind in parts and parts[kind] != DEFAULT:
            raise CliError(f"--default {kind} and a {kind} name: give one of them", 2)
        parts[kind] = DEFAULT
    return parts


def _entity(args) -> QuotaEntity:
    parts = _parts(args)
    entity = QuotaEntity(parts.get(USER), parts.get(CLIENT_ID))
    try:
        validate_entity(entity)
    except ValueError as exc:
        raise CliError(f"{exc} (--user, --client-id, --default user|client-id)", 2) from None
    return entity


def set_quotas(args) -> int:
    entity = _entity(args)
    values: dict[str, float | None] = {}
    try:
        if args.producer_byte_rate is not None:
            values[PRODUCER_BYTE_RATE] = validate_quota_value(
                PRODUCER_BYTE_RATE, parse_rate(args.producer_byte_rate)
            )
        if args.consumer_byte_rate is not None:
            values[CONSUMER_BYTE_RATE] = validate_quota_value(
                CONSUMER_BYTE_RATE, parse_rate(args.consumer_byte_rate)
            )
        if args.request_percentage is not None:
            values[REQUEST_PERCENTAGE] = validate_quota_value(REQUEST_PERCENTAGE, args.request_percentage)
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    if not values:
        raise CliError("give --producer-byte-rate, --consumer-byte-rate and/or --request-percentage", 2)
    with _admin(args) as admin:
        admin.alter_client_quotas({entity: values}, validate_only=args.validate_only)
    done = "valid (nothing stored)" if args.validate_only else "set"
    print(f"{entity}: {', '.join(f'{k}={_number(v)}' for k, v in values.items())} {done}")
    return 0


def remove(args) -> int:
    entity = _entity(args)
    keys = args.key or list(QUOTA_KEYS)
    with _admin(args) as admin:
        admin.alter_client_quotas({entity: dict.fromkeys(keys)})
    print(f"{entity}: removed {', '.join(keys)}")
    return 0


def describe(args) -> int:
    parts = _parts(args)
    components = tuple(
        ComponentFilter(kind, MatchType.DEFAULT)
        if name == DEFAULT
        else ComponentFilter(kind, MatchType.EXACT, name)
        for kind, name in parts.items()
    )
    with _admin(args) as admin:
        found = admin.describe_client_quotas(QuotaFilter(components, strict=args.strict))
    rows = [
        [
            entity.user if entity.user is not None else "-",
            entity.client_id if entity.client_id is not None else "-",
            *(_number(values[key]) if key in values else "-" for key in QUOTA_KEYS),
        ]
        for entity, values in found.items()
    ]
    print(
        table(("USER", "CLIENT-ID", *(k.upper() for k in QUOTA_KEYS)), rows) if rows else "no client quotas"
    )
    return 0


def _number(value: float | None) -> str:
    if value is None:
        return "-"
    return str(int(value)) if value == int(value) else f"{value:g}"


def add_parser(commands, common) -> None:
    """Register ``quotas`` on the CLI's subcommands (``common`` adds --gateway/--data-dir/--ssl-*)."""
    parser = commands.add_parser(
        "quotas", help="set, describe and remove client quotas (per user and client id)"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")

    def entity_options(sub) -> None:
        sub.add_argument("--user", metavar="NAME", help="a user: the principal's name (alice for User:alice)")
        sub.add_argument("--client-id", metavar="ID", help="a client id (the clients' client_id)")
        sub.add_argument(
            "--default",
            action="append",
            choices=(USER, CLIENT_ID),
            help="the <default> user or client id (every one without an entity of its own); repeatable",
        )

    setting = actions.add_parser("set", help="set quotas of a user, a client id, or both")
    common(setting)
    entity_options(setting)
    setting.add_argument("--producer-byte-rate", metavar="RATE", help="produce bytes/s (e.g. 1MB, 500k)")
    setting.add_argument("--consumer-byte-rate", metavar="RATE", help="fetch bytes/s (e.g. 5MB)")
    setting.add_argument(
        "--request-percentage",
        type=float,
        metavar="PCT",
        help="percent of a gateway's event loop its produce and fetch requests may take",
    )
    setting.add_argument("--validate-only", action="store_true", help="check, store nothing")
    setting.set_defaults(func=set_quotas)
    describing = actions.add_parser("describe", help="the quotas set (of a user and/or client id)")
    common(describing)
    entity_options(describing)
    describing.add_argument("--strict", action="store_true", help="only entities with exactly these parts")
    describing.set_defaults(func=describe)
    removing = actions.add_parser("remove", help="remove quota keys of an entity (all by default)")
    common(removing)
    entity_options(removing)
    removing.add_argument("--key", action="append", choices=QUOTA_KEYS, help="a key to remove; repeatable")
    removing.set_defaults(func=remove)
