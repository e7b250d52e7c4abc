"""``tributary transactions ...``: Kafka's ``kafka-transactions`` through the SDK's Admin.

``list`` (every transactional id with its state, producer id and epoch, partition count and the
age of its open transaction; ``--state Ongoing`` for the open ones) and ``describe ID`` (the same
with the partitions and groups of its transaction). An open transaction that is old holds every
read_committed reader of its partitions back: ``list --state Ongoing`` shows which one.
"""

from __future__ import annotations

import json
import time

from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, client_settings
from gateway.cli.output import table
from gateway.client import Admin, TransactionDescription

HEADERS = ("TRANSACTIONAL-ID", "STATE", "PRODUCER-ID", "EPOCH", "TIMEOUT-MS", "PARTITIONS", "OPEN-FOR")


def _age(description: TransactionDescription, now_ms: int) -> str:
    if description.start_ms < 0:
        return "-"
    return f"{max(0, now_ms - description.start_ms) / 1000:.1f}s"


def _rows(described: list[TransactionDescription]) -> list[list]:
    now_ms = int(time.time() * 1000)
    return [
        [
            d.transactional_id,
            d.state,
            d.producer_id,
            d.producer_epoch,
            d.transaction_timeout_ms,
            d.partition_count,
            _age(d, now_ms),
        ]
        for d in described
    ]


def _as_json(described: list[TransactionDescription]) -> str:
    return json.dumps(
        [
            {**d._asdict(), "partitions": [list(tp) for tp in d.partitions], "groups": list(d.groups)}
            for d in described
        ]
    )


def list_transactions(args) -> int:
    with Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS) as admin:
        described = admin.describe_transactions(states=args.state)
    print(_as_json(described) if args.format == "json" else table(HEADERS, _rows(described)))
    return 0


def describe(args) -> int:
    with Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS) as admin:
        described = admin.describe_transactions([args.transactional_id])
    if args.format == "json":
        print(_as_json(described))
        return 0
    (d,) = described
    print(table(HEADERS, _rows(described)))
    if d.partitions:
        print()
        print(table(("TOPIC", "PARTITION"), [[tp.topic, tp.partition] for tp in d.partitions]))
    if d.groups:
        print()
        print("Offsets staged for groups: " + ", ".join(d.groups))
    return 0


def add_parser(commands, common) -> None:
    parser = commands.add_parser(
        "transactions", help="list and describe transactional ids and open transactions"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser(
        "list", help="transactional ids with state, producer, open transaction's age"
    )
    listing.add_argument(
        "--state",
        action="append",
        default=[],
        metavar="STATE",
        help="only ids in this state (Kafka's names: Empty, Ongoing, PrepareCommit, PrepareAbort, "
        "CompleteCommit, CompleteAbort; repeatable)",
    )
    listing.add_argument("--format", choices=["text", "json"], default="text")
    listing.set_defaults(func=list_transactions)
    describing = actions.add_parser("describe", help="one transactional id with its transaction's partitions")
    describing.add_argument("transactional_id")
    describing.add_argument("--format", choices=["text", "json"], default="text")
    describing.set_defaults(func=describe)
    for sub in (listing, describing):
        common(sub)
