"""``tributary demo``: the quick start's round trip, checked.

Creates the topic ``activity`` (if missing), produces N activity events -- JSON with ``user``,
``page`` and ``ts``, keyed by user so each user's events stay in order on one partition --
consumes them back from where they were written, and prints the count per partition and a
check: every event came back, once, on the partition Kafka's murmur2 assigns to its key.
"""

from __future__ import annotations

import json
import random
import time
import zlib
from collections import Counter

from gateway.cli.connect import CliError, client_settings
from gateway.cli.output import Progress, table
from gateway.client import Admin, Consumer, NewTopic, Producer, TopicPartition
from gateway.client.errors import TopicAlreadyExistsError
from services.partitioner import partition_for_key

PAGES = ("/", "/pricing", "/docs", "/docs/quickstart", "/blog", "/signup", "/login", "/account")
USERS = 500
CONSUME_TIMEOUT_S = 60.0


def _events(count: int, seed: int):
    rng = random.Random(seed)
    now = int(time.time() * 1000)
    for i in range(count):
        user = f"user-{rng.randrange(USERS)}"
        value = json.dumps({"user": user, "page": rng.choice(PAGES), "ts": now + i}, separators=(",", ":"))
        yield user.encode(), value.encode()


def _ensure_topic(admin: Admin, args, progress: Progress) -> int:
    try:
        admin.create_topics([NewTopic(args.topic, args.partitions)])
        progress.step(f"created topic {args.topic} with {args.partitions} partitions")
    except TopicAlreadyExistsError:
        progress.step(f"using the existing topic {args.topic}")
    return len(admin.describe_topics([args.topic])[0].partitions)


def _produce(settings: dict, args, progress: Progress) -> Counter:
    """Send the events; returns the multiset of (key, crc32 of value) expected back."""
    expected: Counter = Counter()
    with Producer(**settings, linger_ms=10, compression="lz4") as producer:
        for i, (key, value) in enumerate(_events(args.records, args.seed), 1):
            producer.send(args.topic, value, key=key)
            expected[(key, zlib.crc32(value))] += 1
            progress.update(f"produced {i}/{args.records}")
        producer.flush(timeout=120)
    progress.done(f"produced {args.records} events")
    return expected


def _consume(
    settings: dict,
    args,
    tps: list[TopicPartition],
    start: dict[TopicPartition, int],
    end: dict[TopicPartition, int],
    progress: Progress,
) -> tuple[Counter, Counter, int]:
    """Read [start, end) of every partition; returns the multiset, counts per partition, misplaced keys."""
    got: Counter = Counter()
    per_partition: Counter = Counter()
    misplaced = 0
    total = sum(end[tp] - start[tp] for tp in tps)
    with Consumer(**settings) as consumer:
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, start[tp])
        deadline = time.monotonic() + CONSUME_TIMEOUT_S
        read = 0
        while read < total and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=500).items():
                for record in records:
                    if record.offset >= end[tp]:
                        continue
                    read += 1
                    per_partition[tp.partition] += 1
                    got[(record.key, zlib.crc32(record.value))] += 1
                    misplaced += partition_for_key(record.key, len(tps)) != tp.partition
            progress.update(f"consumed {read}/{total}")
    progress.done(f"consumed {read} events")
    return got, per_partition, misplaced


def demo(args) -> int:
    if args.records < 1:
        raise CliError("--records must be at least 1", 2)
    settings = client_settings(args)
    progress = Progress()
    with Admin(**settings) as admin:
        count = _ensure_topic(admin, args, progress)
        tps = [TopicPartition(args.topic, p) for p in range(count)]
        start = {tp: r.offset for tp, r in admin.list_offsets({tp: "latest" for tp in tps}).items()}
    expected = _produce(settings, args, progress)
    with Admin(**settings) as admin:
        end = {tp: r.offset for tp, r in admin.list_offsets({tp: "latest" for tp in tps}).items()}
    got, per_partition, misplaced = _consume(settings, args, tps, start, end, progress)
    print(table(("PARTITION", "EVENTS"), [[p, per_partition.get(p, 0)] for p in range(count)]))
    ok = got == expected and misplaced == 0
    produced, consumed = sum(expected.values()), sum(got.values())
    print(
        f"\nproduced {produced}, consumed {consumed}, "
        f"keys on their murmur2 partition: {'yes' if not misplaced else f'no ({misplaced} misplaced)'}"
    )
    print(
        "check: OK -- every event came back exactly once"
        if ok
        else f"check: FAILED -- {len(expected - got)} missing, {len(got - expected)} unexpected"
    )
    return 0 if ok else 1
