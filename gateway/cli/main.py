"""``tributary``: the command line, in the spirit of Kafka's shell tools.

::

    tributary cluster up [--data-dir DIR] [--storage-nodes N] [--coordinators N] [--gateways N]
    tributary cluster status | down
    tributary cluster reassign TOPIC PARTITION --replicas N,N,.. [--throttle RATE] | --cancel
    tributary cluster reassignments | rebalance [--dry-run] | decommission NODE [--dry-run]
    tributary topics create NAME --partitions N [--replication-factor R] [--config k=v ...]
    tributary topics list | describe [NAME] | delete NAME | alter NAME --config k=v
    tributary topics elect-leaders [TOPIC [--partition P]]
    tributary produce TOPIC [--key-separator SEP] [--header k=v ...]
    tributary consume TOPIC [--from-beginning | --offset N --partition P | --from-timestamp MS]
                            [--group GROUP] [--max-messages N] [--format text|json]
                            [--isolation-level read_committed]
    tributary offsets TOPIC [--time MS]
    tributary delete-records (--topic T --partition P --offset N | --offset-json-file FILE)
    tributary groups list | describe GROUP [--format text|json] | delete GROUP
    tributary groups reset-offsets GROUP --topic T (--to-earliest | --to-latest | --to-timestamp MS
                                                    | --to-offset N) [--dry-run]
    tributary groups list | describe G | reset-offsets G --topic T --to-... | delete G
    tributary transactions list [--state Ongoing] | describe ID [--format text|json]
    tributary top [--interval S] [--iterations N]
    tributary acls add | list | remove  (--topic T | --group G | --cluster ...) [--principal User:N]
    tributary quotas set | describe | remove  [--user NAME] [--client-id ID] [--default user|client-id]
                     [--producer-byte-rate RATE] [--consumer-byte-rate RATE] [--request-percentage P]
    tributary demo [--records N]

Every command but ``cluster`` finds the gateways through ``--gateway HOST:PORT[,HOST:PORT]``,
then ``$TRIBUTARY_GATEWAY``, then ``DIR/cluster.json`` (``--data-dir``, ``$TRIBUTARY_DATA_DIR``,
``./.tributary``). Failures print one line to stderr and exit non-zero; results go to stdout,
progress to stderr.
"""

from __future__ import annotations

import argparse
import os
import sys

from gateway.cli import (
    acls,
    cluster,
    console,
    demo,
    groups,
    quotas,
    reassign,
    tokens,
    top,
    topics,
    transactions,
)
from gateway.cli.connect import CliError, add_internal_tls_arguments
from gateway.client.errors import NoServersError, TributaryError
from gateway.client.servers import DATA_DIR_ENV, GATEWAY_ENV

PROG = "tributary"


def _common(parser: argparse.ArgumentParser, *, gateway: bool = True) -> None:
    if gateway:
        parser.add_argument(
            "--gateway",
            metavar="HOST:PORT[,HOST:PORT]",
            help=f"gateway address(es); default ${GATEWAY_ENV}, then the local cluster's cluster.json",
        )
        tls = parser.add_argument_group("TLS (any of these turns it on; or $TRIBUTARY_SSL_CAFILE ...)")
        tls.add_argument("--ssl-cafile", metavar="PEM", help="CA bundle the gateway's certificate chains to")
        tls.add_argument("--ssl-certfile", metavar="PEM", help="client certificate, for mutual TLS")
        tls.add_argument("--ssl-keyfile", metavar="PEM", help="key of --ssl-certfile")
        tls.add_argument(
            "--token-file",
            metavar="FILE",
            help="bearer token to present (SASL_SSL/OAUTHBEARER; or $TRIBUTARY_TOKEN_FILE): for "
            "gateways that authenticate by token; see `tributary tokens issue`",
        )
    parser.add_argument(
        "--data-dir", metavar="DIR", help=f"local cluster directory (default ${DATA_DIR_ENV} or ./.tributary)"
    )


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is negative")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return value


def _add_cluster(commands) -> None:
    parser = commands.add_parser(
        "cluster", help="run a local cluster (etcd, coordinators, storage nodes, gateway)"
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    up = actions.add_parser("up", help="start the cluster detached, or restart what is not running")
    _common(up, gateway=False)
    up.add_argument(
        "--storage-nodes", type=int, help="storage nodes (default 1, or the data dir's previous count)"
    )
    up.add_argument("--coordinators", type=int, help="coordinators (default 1)")
    up.add_argument("--gateways", type=int, help="gateways (default 1)")
    up.add_argument(
        "--secure",
        action="store_true",
        help="mutual TLS on the gateways and between all processes (internal ports), with CAs and "
        "certificates made in DIR/tls (kept on later ups)",
    )
    up.set_defaults(func=cluster.up)
    down = actions.add_parser("down", help="stop every process of the cluster (data is kept)")
    _common(down, gateway=False)
    down.set_defaults(func=cluster.down)
    status = actions.add_parser(
        "status", help="each process alive or dead, and partitions with their leaders"
    )
    _common(status, gateway=False)
    status.add_argument(
        "--partitions", action="store_true", help="one row per partition (default: one per topic)"
    )
    status.set_defaults(func=cluster.status)
    _add_reassignment_actions(actions)


def _add_move_options(parser: argparse.ArgumentParser, *, plan: bool = True) -> None:
    parser.add_argument(
        "--throttle", metavar="RATE", help="copy rate of each node's new replicas, bytes/s (e.g. 10MB)"
    )
    parser.add_argument("--no-wait", action="store_true", help="start the moves and return")
    parser.add_argument("--timeout", type=float, metavar="S", help="stop waiting after S seconds")
    if plan:
        parser.add_argument("--dry-run", action="store_true", help="print the plan, move nothing")


def _add_reassignment_actions(actions) -> None:
    moving = actions.add_parser(
        "reassign", help="move one partition to new replicas (kafka-reassign-partitions), or --cancel"
    )
    _common(moving)
    moving.add_argument("topic")
    moving.add_argument("partition", type=_non_negative)
    moving.add_argument("--replicas", metavar="N,N,...", help="new replica list, preferred leader first")
    moving.add_argument("--cancel", action="store_true", help="cancel the partition's running move")
    _add_move_options(moving, plan=False)
    moving.set_defaults(func=reassign.reassign)
    listing = actions.add_parser("reassignments", help="partition moves in progress")
    _common(listing)
    listing.set_defaults(func=reassign.reassignments)
    balance = actions.add_parser(
        "rebalance", help="spread replicas and leaders evenly over the live storage nodes (racks kept)"
    )
    _common(balance)
    _add_move_options(balance)
    balance.set_defaults(func=reassign.rebalance)
    retire = actions.add_parser(
        "decommission", help="move every replica off a storage node so it can be stopped"
    )
    _common(retire)
    retire.add_argument("node", type=_non_negative, help="node id")
    _add_move_options(retire)
    retire.set_defaults(func=reassign.decommission)


def _add_topics(commands) -> None:
    parser = commands.add_parser("topics", help="create, list, describe, alter and delete topics")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    create = actions.add_parser("create", help="create a topic")
    create.add_argument("name")
    create.add_argument("--partitions", type=_positive, required=True)
    create.add_argument("--replication-factor", type=_positive, default=1)
    create.add_argument(
        "--config",
        action="append",
        default=[],
        metavar="K=V",
        help="topic config by Kafka name, e.g. retention.ms=3600000 (repeatable)",
    )
    create.set_defaults(func=topics.create)
    listing = actions.add_parser("list", help="topic names")
    listing.set_defaults(func=topics.list_topics)
    describe = actions.add_parser("describe", help="partitions, leaders, replicas and configs")
    describe.add_argument("name", nargs="?", help="one topic (default: all)")
    describe.add_argument(
        "--under-replicated-partitions",
        action="store_true",
        help="only partitions with fewer in-sync replicas than replicas",
    )
    describe.set_defaults(func=topics.describe)
    add_internal_tls_arguments(describe)
    delete = actions.add_parser("delete", help="delete a topic and its data")
    delete.add_argument("name")
    delete.set_defaults(func=topics.delete)
    alter = actions.add_parser("alter", help="set or reset topic configs")
    alter.add_argument("name")
    alter.add_argument(
        "--config", action="append", default=[], metavar="K=V", help="config to set (repeatable)"
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="K",
        help="config to reset to its default (repeatable)",
    )
    alter.set_defaults(func=topics.alter)
    elect = actions.add_parser(
        "elect-leaders", help="move leadership back to each partition's first (preferred) replica"
    )
    elect.add_argument("topic", nargs="?", help="one topic (default: every partition of the cluster)")
    elect.add_argument("--partition", type=int, help="one partition of TOPIC")
    elect.set_defaults(func=topics.elect_leaders)
    for sub in (create, listing, describe, delete, alter, elect):
        _common(sub)


def _add_produce(commands) -> None:
    produce = commands.add_parser("produce", help="send one record per stdin line")
    produce.add_argument("topic")
    produce.add_argument(
        "--key-separator",
        metavar="SEP",
        help="split each line at the first SEP into key and value (default: no key)",
    )
    produce.add_argument(
        "--header", action="append", default=[], metavar="K=V", help="header on every record (repeatable)"
    )
    produce.add_argument("--partition", type=_non_negative, help="send everything to this partition")
    produce.add_argument("--acks", default="all", choices=["0", "1", "all", "-1"])
    produce.add_argument("--compression", default="none", choices=["none", "gzip", "snappy", "lz4", "zstd"])
    produce.add_argument("--linger-ms", type=_non_negative, default=5)
    produce.add_argument("--skip-empty", action="store_true", help="ignore empty lines")
    _common(produce)
    produce.set_defaults(func=console.produce)


def _add_consume(commands) -> None:
    consume = commands.add_parser("consume", help="print records as they arrive")
    consume.add_argument("topic")
    consume.add_argument("--from-beginning", action="store_true", help="start at the earliest offset")
    consume.add_argument(
        "--offset", metavar="N|earliest|latest", help="start at this offset (needs --partition)"
    )
    consume.add_argument("--partition", type=_non_negative, help="only this partition")
    consume.add_argument(
        "--from-timestamp",
        type=_non_negative,
        metavar="MS",
        help="start at the first record at or after this time (ms since the epoch)",
    )
    consume.add_argument("--max-messages", type=_positive, metavar="N", help="exit after N records")
    consume.add_argument(
        "--timeout-ms", type=_non_negative, metavar="MS", help="exit after MS without a record"
    )
    consume.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help="text: the value (and key with --print-key); json: one object per line",
    )
    consume.add_argument("--print-key", action="store_true", help="text format: print key<TAB>value")
    consume.add_argument(
        "--isolation-level",
        choices=["read_uncommitted", "read_committed"],
        default="read_uncommitted",
        help="read_committed: only records of committed transactions (Kafka's console consumer option)",
    )
    consume.add_argument(
        "--group",
        metavar="GROUP",
        help="consume as a member of this consumer group: the group assigns partitions and the "
        "consumer commits as it goes (starting at the group's committed offsets)",
    )
    _common(consume)
    consume.set_defaults(func=console.consume)


def _add_offsets(commands) -> None:
    offsets = commands.add_parser("offsets", help="earliest and latest offset of each partition")
    offsets.add_argument("topic")
    offsets.add_argument(
        "--time",
        type=_non_negative,
        metavar="MS",
        help="also the first offset at or after this timestamp (ms)",
    )
    _common(offsets)
    offsets.set_defaults(func=topics.offsets)


def _offset_or_high_watermark(text: str) -> int:
    value = int(text)
    if value < -1:
        raise argparse.ArgumentTypeError(f"{text}: an offset is >= 0, or -1 for the high watermark")
    return value


def _add_delete_records(commands) -> None:
    parser = commands.add_parser(
        "delete-records", help="delete the records below an offset (the partition's log start moves there)"
    )
    parser.add_argument("--topic", metavar="T")
    parser.add_argument("--partition", type=_non_negative, metavar="P")
    parser.add_argument(
        "--offset",
        type=_offset_or_high_watermark,
        metavar="N",
        help="records below N are deleted; -1 = the high watermark (everything consumers can read)",
    )
    parser.add_argument(
        "--offset-json-file",
        metavar="FILE",
        help='Kafka\'s format: {"partitions": [{"topic": "t", "partition": 0, "offset": 10}], "version": 1}',
    )
    _common(parser)
    parser.set_defaults(func=topics.delete_records)


def _add_groups(commands) -> None:
    parser = commands.add_parser("groups", help="list, describe (with lag), reset and delete consumer groups")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="consumer groups with their state and member count")
    listing.add_argument("--format", choices=["text", "json"], default="text")
    listing.set_defaults(func=groups.list_groups)
    describe = actions.add_parser("describe", help="members, assignment, committed offset, log end and lag")
    describe.add_argument("group")
    describe.add_argument("--format", choices=["text", "json"], default="text")
    describe.set_defaults(func=groups.describe)
    reset = actions.add_parser(
        "reset-offsets", help="move the group's committed offsets (group without members)"
    )
    reset.add_argument("group")
    reset.add_argument(
        "--topic", action="append", default=[], metavar="T", help="topic to reset (repeatable)"
    )
    to = reset.add_mutually_exclusive_group(required=True)
    to.add_argument("--to-earliest", action="store_true", help="the log start of each partition")
    to.add_argument("--to-latest", action="store_true", help="the log end of each partition")
    to.add_argument(
        "--to-timestamp",
        type=_non_negative,
        metavar="MS",
        help="the first offset at or after this time (ms since the epoch)",
    )
    to.add_argument(
        "--to-offset",
        type=_non_negative,
        metavar="N",
        help="this offset in every partition (kept within the log's range)",
    )
    reset.add_argument("--dry-run", action="store_true", help="show the new offsets without committing them")
    reset.set_defaults(func=groups.reset_offsets)
    delete = actions.add_parser("delete", help="delete a group without members, with its committed offsets")
    delete.add_argument("group")
    delete.set_defaults(func=groups.delete)
    for sub in (listing, describe, reset, delete):
        _common(sub)


def _add_transactions(commands) -> None:
    transactions.add_parser(commands, _common)


def _add_top(commands) -> None:
    top.add_parser(commands, _common)


def _add_acls(commands) -> None:
    acls.add_parser(commands, _common)


def _add_tokens(commands) -> None:
    tokens.add_parser(commands)


def _add_quotas(commands) -> None:
    quotas.add_parser(commands, _common)


def _add_demo(commands) -> None:
    parser = commands.add_parser(
        "demo", help="produce activity events to a topic and consume them back, checked"
    )
    parser.add_argument(
        "--records", type=int, default=10_000, metavar="N", help="events to produce (default 10000)"
    )
    parser.add_argument("--topic", default="activity")
    parser.add_argument("--partitions", type=_positive, default=8, help="partitions if the topic is created")
    parser.add_argument("--seed", type=int, default=0, help="seed of the event generator")
    _common(parser)
    parser.set_defaults(func=demo.demo)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Tributary: a distributed commit log. Run a local cluster, manage topics, "
        "produce and consume from the shell.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_cluster,
        _add_topics,
        _add_produce,
        _add_consume,
        _add_offsets,
        _add_delete_records,
        _add_groups,
        _add_transactions,
        _add_top,
        _add_acls,
        _add_tokens,
        _add_quotas,
        _add_demo,
    ):
        add(commands)
    return parser


def _fail(message: str, code: int) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return code


def run(args) -> int:
    """Run a parsed command; every expected failure becomes one line on stderr and an exit code."""
    try:
        return args.func(args) or 0
    except CliError as exc:
        return _fail(str(exc), exc.code)
    except NoServersError as exc:
        return _fail(str(exc), 1)
    except TributaryError as exc:
        return _fail(str(exc), 1)
    except NotImplementedError as exc:
        return _fail(str(exc), 2)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `tributary consume ... | head`: the reader left; do not print a traceback at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
