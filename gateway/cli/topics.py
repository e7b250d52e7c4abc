"""``tributary topics ...``, ``tributary offsets`` and ``tributary delete-records``: administration
through the SDK's Admin."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from gateway.cli import cleaner_progress
from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, CliError, client_settings, cluster_tls, internal_tls
from gateway.cli.output import describe_topic, is_compacted, is_under_replicated, offsets_table, parse_pairs
from gateway.client import Admin, NewTopic, TopicPartition
from services.tls import grpc_channel_credentials


def _admin(args) -> Admin:
    return Admin(**client_settings(args), request_timeout_ms=CLI_REQUEST_TIMEOUT_MS)


def _configs(args) -> dict[str, str]:
    try:
        return dict(parse_pairs(args.config, "--config"))
    except ValueError as exc:
        raise CliError(str(exc), 2) from None


def create(args) -> int:
    configs = _configs(args)
    with _admin(args) as admin:
        admin.create_topics([NewTopic(args.name, args.partitions, args.replication_factor, configs)])
    print(f"Created topic {args.name}.")
    return 0


def list_topics(args) -> int:
    with _admin(args) as admin:
        for name in admin.list_topics():
            print(name)
    return 0


def describe(args) -> int:
    with _admin(args) as admin:
        descriptions = admin.describe_topics([args.name] if args.name else [])
    compacted = [d.name for d in descriptions if is_compacted(d)]
    progress = {}
    if compacted:
        settings = client_settings(args)
        tls = cluster_tls(settings)
        credentials = grpc_channel_credentials(tls) if tls is not None else None
        progress = cleaner_progress.collect(
            settings["servers"].split(",")[0],
            compacted,
            credentials,
            internal_tls(args),
        )
    if getattr(args, "under_replicated_partitions", False):
        descriptions = [
            dataclasses.replace(d, partitions=tuple(p for p in d.partitions if is_under_replicated(p)))
            for d in descriptions
        ]
        descriptions = [d for d in descriptions if d.partitions]
        if not descriptions:
            print("No under-replicated partitions.")
            return 0
    print("\n\n".join(describe_topic(d, progress if is_compacted(d) else None) for d in descriptions))
    return 0


def delete(args) -> int:
    with _admin(args) as admin:
        admin.delete_topics([args.name])
    print(f"Deleted topic {args.name}.")
    return 0


def alter(args) -> int:
    configs = _configs(args)
    if not configs and not args.delete_config:
        raise CliError("nothing to alter: give --config k=v and/or --delete-config k", 2)
    with _admin(args) as admin:
        description = admin.alter_topic_configs(args.name, configs, args.delete_config or ())
    print(f"Updated configs of topic {args.name}.")
    print(describe_topic(description))
    return 0


def offsets(args) -> int:
    """Earliest and latest offset of every partition (``kafka-get-offsets``), and with ``--time``
    the first offset at or after that timestamp."""
    with _admin(args) as admin:
        count = len(admin.describe_topics([args.topic])[0].partitions)
        tps = [TopicPartition(args.topic, p) for p in range(count)]
        earliest = admin.list_offsets({tp: "earliest" for tp in tps})
        latest = admin.list_offsets({tp: "latest" for tp in tps})
        at_time = admin.list_offsets({tp: args.time for tp in tps}) if args.time is not None else None
    print(
        offsets_table(
            args.topic,
            {tp.partition: r.offset for tp, r in earliest.items()},
            {tp.partition: r.offset for tp, r in latest.items()},
        )
    )
    if at_time is not None:
        print()
        for tp in tps:
            offset = at_time[tp].offset
            print(f"{args.topic}:{tp.partition}:{offset if offset >= 0 else 'none'}")
    return 0


def _offsets_file(path: str) -> dict[TopicPartition, int]:
    """Kafka's ``--offset-json-file``: ``{"partitions": [{"topic": T, "partition": P, "offset":
    N}, ...], "version": 1}``."""
    try:
        document = json.loads(Path(path).read_text())
        entries = document["partitions"]
        offsets = {TopicPartition(str(e["topic"]), int(e["partition"])): int(e["offset"]) for e in entries}
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", 2) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CliError(
            f"{path} is not an offsets file like "
            '{"partitions": [{"topic": "t", "partition": 0, "offset": 10}], "version": 1} '
            f"({type(exc).__name__}: {exc})",
            2,
        ) from None
    if len(offsets) != len(entries):
        raise CliError(f"{path} names a partition twice", 2)
    return offsets


def delete_records(args) -> int:
    """Delete the records below an offset (``kafka-delete-records``): the partition's log start
    moves there; -1 means the high watermark."""
    if args.offset_json_file:
        if args.topic or args.partition is not None or args.offset is not None:
            raise CliError("give either --offset-json-file or --topic/--partition/--offset", 2)
        offsets = _offsets_file(args.offset_json_file)
    else:
        if not args.topic or args.partition is None or args.offset is None:
            raise CliError("give --topic, --partition and --offset (or --offset-json-file)", 2)
        offsets = {TopicPartition(args.topic, args.partition): args.offset}
    with _admin(args) as admin:
        log_starts = admin.delete_records(offsets)
    for tp in sorted(log_starts):
        print(f"partition: {tp.topic}-{tp.partition}\tlow_watermark: {log_starts[tp]}")
    return 0


def elect_leaders(args) -> int:
    """Move leadership back to each partition's first replica (``kafka-leader-election
    --election-type preferred``): one line per partition; exit 1 if any could not move."""
    if args.partition is not None and not args.topic:
        raise CliError("--partition needs a TOPIC", 2)
    topics = [args.topic] if args.topic and args.partition is None else []
    partitions = [TopicPartition(args.topic, args.partition)] if args.partition is not None else []
    with _admin(args) as admin:
        outcomes = admin.elect_leaders(topics, partitions)
    failed = 0
    for tp in sorted(outcomes):
        error = outcomes[tp]
        if error is None:
            state = "elected its preferred leader"
        elif error.reason == "ELECTION_NOT_NEEDED":
            state = "preferred leader leads already"
        else:
            state = f"{error.reason}: {error.message}"
            failed += 1
        print(f"{tp.topic}-{tp.partition}\t{state}")
    if failed:
        raise CliError(f"{failed} of {len(outcomes)} partitions kept their leader", 1)
    return 0
