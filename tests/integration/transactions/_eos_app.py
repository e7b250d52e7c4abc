"""A consume-transform-produce application, run as its own process by the exactly-once tests.

It reads ``--input`` in the consumer group ``--group`` (read_committed, no auto-commit, static
membership so a restart takes its partitions back at once), writes ``value + b":out"`` of each
record to the same partition number of ``--output`` (headers: ``writer`` = ``--tag``, ``txn`` =
the transaction's number in this process), and commits the consumed offsets in the same
transaction (``send_offsets_to_transaction``) -- Kafka's exactly-once pattern. A transaction takes
``--polls-per-txn`` polls of at most ``--max-records`` records, ``--pause-ms`` apart, so it stays
open long enough for a kill to land inside it.

It tells the test where it is, one line per step on stdout, flushed before the step's next action:

    ready                        init_transactions done, subscribed
    begin <n>                    begin_transaction() of its n-th transaction returned
    sent <n> <records>           the records of one poll were handed to send()
    committing <n> <offsets>     commit_transaction() is being called (offsets as JSON)
    committed <n>                commit_transaction() returned
    aborted <n> <error>          the transaction failed and was aborted; positions rewound
    fenced <error>               a newer instance took over (exit status 4)
    crashed <error>              anything else it could not handle (exit status 3)

so that, once the process is dead, the last line says what it was doing when it died. A failed
transaction is aborted and its records consumed again from the positions the transaction started
at; an error it cannot abort ends the process (status 3) and the test starts it again, as a
crash would.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from gateway.client import Consumer, Producer, TopicPartition
from gateway.client.errors import IllegalStateError, TributaryError
from services import errors

#: Appended to each input value to make its output value.
SUFFIX = b":out"


def say(*words: object) -> None:
    print(*words, flush=True)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--instance-id", required=True, help="group_instance_id (static membership)")
    parser.add_argument("--transaction-timeout-ms", type=int, default=60_000)
    parser.add_argument("--polls-per-txn", type=int, default=3)
    parser.add_argument("--max-records", type=int, default=40)
    parser.add_argument("--pause-ms", type=int, default=30)
    parser.add_argument("--tag", default="app", help="header 'writer' of every output record")
    return parser.parse_args(argv)


def connect(args: argparse.Namespace) -> tuple[Producer, Consumer]:
    producer = Producer(
        servers=args.servers,
        transactional_id=args.transactional_id,
        transaction_timeout_ms=args.transaction_timeout_ms,
        linger_ms=5,
        request_timeout_ms=10_000,
        delivery_timeout_ms=60_000,
        max_block_ms=60_000,
    )
    # init_transactions first: it fences the previous instance and waits until the transaction it
    # left is complete (aborted if open, its offsets applied if it was committing), so the offsets
    # the consumer starts from below are the ones that transaction left.
    producer.init_transactions()
    consumer = Consumer(
        servers=args.servers,
        group_id=args.group,
        group_instance_id=args.instance_id,
        isolation_level="read_committed",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=30_000,
        fetch_max_wait_ms=100,
    )
    consumer.subscribe([args.input])
    return producer, consumer


def run(args: argparse.Namespace) -> int:
    producer, consumer = connect(args)
    say("ready")
    txn = 0
    while True:
        try:
            records = consumer.poll(timeout_ms=200, max_records=args.max_records)
        except TributaryError as exc:
            if _fenced(exc):
                say("fenced", repr(exc)[:300])
                return 4
            raise
        if not any(records.values()):
            continue
        txn += 1
        starts: dict[TopicPartition, int] = {}  # where an abort rewinds each partition to
        try:
            transact(args, producer, consumer, txn, records, starts)
        except (TributaryError, IllegalStateError) as exc:
            # IllegalStateError: commit_transaction refuses to commit after a record failed.
            if _fenced(exc):
                say("fenced", repr(exc)[:300])
                return 4
            try:
                producer.abort_transaction(timeout=60)
            except (TributaryError, IllegalStateError) as failed:
                if _fenced(failed):
                    say("fenced", repr(failed)[:300])
                    return 4
                raise
            for tp, offset in starts.items():
                consumer.seek(tp, offset)
            say("aborted", txn, repr(exc)[:300])


def transact(args, producer: Producer, consumer: Consumer, txn: int, records, starts: dict) -> None:
    """One transaction: the records polled (and ``polls_per_txn - 1`` more polls), transformed,
    with the offsets after them. Fills ``starts`` with each partition's first offset in it."""
    producer.begin_transaction()
    say("begin", txn)
    headers = [("writer", args.tag.encode()), ("txn", b"%d" % txn)]
    offsets: dict[TopicPartition, int] = {}
    for poll in range(args.polls_per_txn):
        if poll:
            time.sleep(args.pause_ms / 1000)  # pacing: keeps the transaction open a while
            records = consumer.poll(timeout_ms=0, max_records=args.max_records)
        count = 0
        for tp, batch in records.items():
            if not batch:
                continue
            starts.setdefault(tp, batch[0].offset)
            for record in batch:
                producer.send(args.output, record.value + SUFFIX, partition=tp.partition, headers=headers)
                count += 1
            offsets[tp] = batch[-1].offset + 1
        if count:
            say("sent", txn, count)
    producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
    say("committing", txn, json.dumps({f"{tp.partition}": o for tp, o in sorted(offsets.items())}))
    producer.commit_transaction(timeout=60)
    say("committed", txn)


#: A newer instance took over: the producer's transactional id, or the consumer's static membership.
FENCED = (errors.ProducerFencedError, errors.InvalidProducerEpochError, errors.FencedInstanceIdError)


def _fenced(exc: BaseException | None) -> bool:
    """Whether the error (or what caused it) says a newer instance took over."""
    while exc is not None:
        if isinstance(exc, FENCED):
            return True
        exc = exc.__cause__
    return False


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except Exception as exc:  # the test reads the last line and restarts us
        say("crashed", repr(exc)[:300])
        logging.exception("the application failed")
        return 3


if __name__ == "__main__":
    sys.exit(main())
