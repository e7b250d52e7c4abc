"""``tributary produce`` and ``tributary consume``: Kafka's console producer and consumer.

``consume --group G`` subscribes as a member of group G (the group assigns the partitions; a new
group starts at the latest offsets, or the earliest with ``--from-beginning``) and commits what it
printed as it goes (auto-commit) and when it exits.
"""

from __future__ import annotations

import signal
import sys
import threading
import time

from gateway.cli.connect import CLI_REQUEST_TIMEOUT_MS, CliError, client_settings
from gateway.cli.output import Progress, parse_line, parse_pairs, record_json, record_text
from gateway.client import Consumer, Producer, TopicPartition
from gateway.client.errors import WakeupError

#: How long produce waits for a topic it does not know (Kafka's console producer: 60 s).
CLI_MAX_BLOCK_MS = 3_000
CLOSE_TIMEOUT_S = 5.0


def produce(args) -> int:
    """One record per stdin line; ``--key-separator`` splits key from value."""
    try:
        headers = [(k, v.encode()) for k, v in parse_pairs(args.header, "--header")]
    except ValueError as exc:
        raise CliError(str(exc), 2) from None
    progress = Progress()
    failures: list[BaseException] = []
    sent = 0
    producer = Producer(
        **client_settings(args),
        acks=args.acks,
        compression=args.compression,
        linger_ms=args.linger_ms,
        request_timeout_ms=CLI_REQUEST_TIMEOUT_MS,
        max_block_ms=CLI_MAX_BLOCK_MS,
    )
    flushed = False
    try:
        for number, line in enumerate(sys.stdin, 1):
            if not line.strip() and args.skip_empty:
                continue
            try:
                key, value = parse_line(line, args.key_separator)
            except ValueError as exc:
                raise CliError(f"line {number}: {exc}") from None
            future = producer.send(args.topic, value, key=key, headers=headers, partition=args.partition)
            future.add_errback(failures.append)
            sent += 1
            progress.update(f"sent {sent} records")
        producer.flush()
        flushed = True
    finally:
        # Interrupted or failed: give what is queued a few seconds, not the full delivery timeout.
        producer.close(None if flushed else CLOSE_TIMEOUT_S)
    if failures:
        raise CliError(f"{len(failures)} of {sent} records failed; first error: {failures[0]}")
    progress.done(f"Produced {sent} records to {args.topic}.")
    return 0


def _start_positions(consumer: Consumer, args, tps: list[TopicPartition]) -> None:
    if args.offset is not None:
        if args.offset == "earliest":
            consumer.seek_to_beginning(*tps)
        elif args.offset == "latest":
            consumer.seek_to_end(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, int(args.offset))
    elif args.from_timestamp is not None:
        found = consumer.offsets_for_times({tp: args.from_timestamp for tp in tps})
        for tp, at in found.items():
            if at is None:
                consumer.seek_to_end(tp)
            else:
                consumer.seek(tp, at.offset)
    elif args.from_beginning:
        consumer.seek_to_beginning(*tps)
    else:
        consumer.seek_to_end(*tps)


def _validate_consume_args(args) -> None:
    if args.group is not None and (
        args.partition is not None or args.offset is not None or args.from_timestamp is not None
    ):
        raise CliError(
            "--group decides the partitions and starts at the group's committed offsets: "
            "it does not go with --partition, --offset or --from-timestamp",
            2,
        )
    if args.offset is not None and args.partition is None:
        raise CliError("--offset needs --partition (as in Kafka's console consumer)", 2)
    if args.offset not in (None, "earliest", "latest") and not str(args.offset).isdigit():
        raise CliError("--offset must be a non-negative number, earliest or latest", 2)
    chosen = [args.from_beginning, args.offset is not None, args.from_timestamp is not None]
    if sum(chosen) > 1:
        raise CliError("choose one of --from-beginning, --offset, --from-timestamp", 2)


def consume(args) -> int:
    """Print records as they arrive until ``--max-messages``, ``--timeout-ms`` idle, or Ctrl-C."""
    _validate_consume_args(args)
    group = {"group_id": args.group, "client_id": "tributary-console-consumer"} if args.group else {}
    consumer = Consumer(
        **client_settings(args),
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        request_timeout_ms=CLI_REQUEST_TIMEOUT_MS,
        isolation_level=args.isolation_level,
        **group,
    )
    count = 0
    finished = False
    try:
        partitions = sorted(consumer.partitions_for_topic(args.topic))
        if args.group:
            consumer.subscribe([args.topic])
        else:
            if args.partition is not None and args.partition not in partitions:
                raise CliError(
                    f"topic {args.topic} has no partition {args.partition} (partitions: {len(partitions)})"
                )
            chosen = [args.partition] if args.partition is not None else partitions
            tps = [TopicPartition(args.topic, p) for p in chosen]
            consumer.assign(tps)
            _start_positions(consumer, args, tps)
        count = _print_records(consumer, args)
        finished = True
    except KeyboardInterrupt:
        finished = True
    finally:
        consumer.close()
    if finished:
        print(f"Processed a total of {count} messages", file=sys.stderr)
    return 0


def _print_records(consumer: Consumer, args) -> int:
    """Print until the limit, the idle timeout or Ctrl-C; returns how many records were printed.

    Ctrl-C wakes the consumer up (Kafka's console consumer calls ``wakeup()`` from its shutdown
    hook) instead of raising KeyboardInterrupt wherever the main thread happens to be: an
    interrupt landing inside a call the consumer's I/O thread is answering could leave that call
    half done, and ``close()`` after it waiting for good.
    """
    printed = [0]
    previous = _on_interrupt(consumer.wakeup)
    try:
        _print_loop(consumer, args, printed)
    except (KeyboardInterrupt, WakeupError):
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return printed[0]


def _on_interrupt(action):
    """Run ``action`` on SIGINT (main thread only); returns the handler it replaced, or None."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, lambda _signum, _frame: action())


def _print_loop(consumer: Consumer, args, printed: list[int]) -> None:
    count = 0
    limit = args.max_messages
    idle_deadline = None if args.timeout_ms is None else time.monotonic() + args.timeout_ms / 1000.0
    out = sys.stdout
    while limit is None or count < limit:
        if idle_deadline is not None and time.monotonic() >= idle_deadline:
            break
        polled = consumer.poll(timeout_ms=500, max_records=None if limit is None else min(500, limit - count))
        lines = []
        for records in polled.values():
            for record in records:
                lines.append(
                    record_json(record)
                    if args.format == "json"
                    else record_text(record, print_key=args.print_key)
                )
        if lines:
            lines = lines[: None if limit is None else limit - count]
            out.write("\n".join(lines) + "\n")
            out.flush()
            count += len(lines)
            printed[0] = count
            if args.timeout_ms is not None:
                idle_deadline = time.monotonic() + args.timeout_ms / 1000.0
