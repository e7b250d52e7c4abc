"""``tributary groups ...``: Kafka's ``kafka-consumer-groups`` through the SDK's Admin.

``list`` (groups with state and member count), ``describe GROUP`` (members, assignment, and per
partition the committed offset, log end offset and lag), ``reset-offsets GROUP --topic T ...``
(earliest, latest, a timestamp or an offset; ``--dry-run`` shows without committing) and
``delete GROUP``. Resets and deletes need a group without active members, as in Kafka.
"""

from __future__ import annotations

import sys

from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, CliError, client_settings
from gateway.cli.output import (
    clamp_offsets,
    describe_group,
    group_json,
    groups_json,
    groups_table,
    reset_table,
)
from gateway.client import Admin, TopicPartition


def _admin(args) -> Admin:
    return Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS)


def list_groups(args) -> int:
    with _admin(args) as admin:
        listings = admin.list_consumer_groups()
    print(groups_json(listings) if args.format == "json" else groups_table(listings))
    return 0


def describe(args) -> int:
    with _admin(args) as admin:
        description = admin.describe_consumer_group(args.group)
    print(group_json(description) if args.format == "json" else describe_group(description))
    return 0


def _target(admin: Admin, args):
    """What ``reset_consumer_group_offsets`` takes for the chosen ``--to-*`` option."""
    if args.to_earliest:
        return "earliest"
    if args.to_latest:
        return "latest"
    if args.to_timestamp is not None:
        return args.to_timestamp
    tps = [
        TopicPartition(d.name, p.partition) for d in admin.describe_topics(args.topic) for p in d.partitions
    ]
    earliest = {tp: r.offset for tp, r in admin.list_offsets({tp: "earliest" for tp in tps}).items()}
    latest = {tp: r.offset for tp, r in admin.list_offsets({tp: "latest" for tp in tps}).items()}
    return clamp_offsets(args.to_offset, earliest, latest)


def reset_offsets(args) -> int:
    if not args.topic:
        raise CliError("name the topics to reset with --topic (repeatable)", 2)
    with _admin(args) as admin:
        offsets = admin.reset_consumer_group_offsets(
            args.group, args.topic, _target(admin, args), dry_run=args.dry_run
        )
    print(reset_table(args.group, offsets))
    if args.dry_run:
        print("Dry run: nothing was committed.", file=sys.stderr)
    return 0


def delete(args) -> int:
    with _admin(args) as admin:
        admin.delete_consumer_group(args.group)
    print(f"Deleted consumer group {args.group}.")
    return 0
