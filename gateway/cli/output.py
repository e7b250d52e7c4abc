"""How the CLI prints things: tables, records, topic descriptions, progress. Pure functions
(except :class:`Progress`, which writes to stderr), so the formats are unit-tested."""

from __future__ import annotations

import base64
import json
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

from gateway.client.structs import (
    ConsumerRecord,
    GroupDescription,
    GroupListing,
    OffsetAndMetadata,
    PartitionMetadata,
    TopicDescription,
    TopicPartition,
)


def table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces, with a header line."""
    texts = [["" if cell is None else str(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for text in texts:
        widths = [max(w, len(cell)) for w, cell in zip(widths, text)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(text, widths)).rstrip() for text in texts]
    return "\n".join(lines)


def text_of(data: bytes | None) -> str | None:
    """Bytes as text for display: UTF-8, undecodable bytes as backslash escapes."""
    return None if data is None else data.decode("utf-8", errors="backslashreplace")


def json_bytes(data: bytes | None):
    """A key/value/header value for JSON: a string when it is UTF-8, else ``{"base64": ...}``."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(data).decode("ascii")}


def record_json(record: ConsumerRecord) -> str:
    """One consumed record as one JSON line (topic, partition, offset, timestamp, key, value, headers)."""
    return json.dumps(
        {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "timestamp": record.timestamp,
            "key": json_bytes(record.key),
            "value": json_bytes(record.value),
            "headers": [[k, json_bytes(v)] for k, v in record.headers],
        },
        ensure_ascii=False,
    )


def record_text(record: ConsumerRecord, *, print_key: bool = False, key_separator: str = "\t") -> str:
    """The record's value (Kafka's console consumer default), or ``key<sep>value``."""
    value = text_of(record.value)
    value = "null" if value is None else value
    if not print_key:
        return value
    key = text_of(record.key)
    return f"{'null' if key is None else key}{key_separator}{value}"


def parse_line(line: str, key_separator: str | None) -> tuple[bytes | None, bytes]:
    """A stdin line as (key, value): split at the first ``key_separator`` when one is given.

    Raises ValueError when a separator is expected but missing (as Kafka's console producer does).
    """
    line = line.rstrip("\r\n")
    if key_separator is None:
        return None, line.encode("utf-8")
    key, sep, value = line.partition(key_separator)
    if not sep:
        raise ValueError(f"no key separator {key_separator!r} in line {line!r}")
    return key.encode("utf-8"), value.encode("utf-8")


def parse_pairs(items: Iterable[str], what: str) -> list[tuple[str, str]]:
    """``["k=v", ...]`` -> ``[("k", "v"), ...]``; ValueError naming ``what`` for a bad item."""
    pairs = []
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"{what} must be key=value, not {item!r}")
        pairs.append((key, value))
    return pairs


def partition_rows(partitions: Iterable[PartitionMetadata], min_isr: int = 1) -> list[list[object]]:
    return [
        [
            p.topic,
            p.partition,
            p.leader if p.leader >= 0 else "none",
            p.leader_epoch,
            ",".join(map(str, p.replicas)),
            ",".join(map(str, p.isr)),
            p.state + (f" ({p.error})" if p.error else "") + _replication_flags(p, min_isr),
        ]
        for p in partitions
    ]


def _replication_flags(p: PartitionMetadata, min_isr: int) -> str:
    """Kafka's describe flags: fewer in-sync replicas than replicas, or than min.insync.replicas."""
    flags = []
    if len(p.isr) < len(p.replicas):
        flags.append("under-replicated")
    if len(p.isr) < min_isr:
        flags.append("under-min-isr")
    return f" [{', '.join(flags)}]" if flags else ""


@dataclass
class ReplicationHealth:
    """Kafka's cluster health counts over a metadata answer, and leaders and replicas per node."""

    partitions: int = 0
    offline: int = 0
    under_replicated: int = 0
    under_min_isr: int = 0
    leaders: dict[int, int] = field(default_factory=dict)
    replicas: dict[int, int] = field(default_factory=dict)


def replication_health(topics: Iterable[Any]) -> ReplicationHealth:
    """Counts over topics as metadata describes them (SDK descriptions or protobuf messages:
    anything with ``configs`` and ``partitions`` holding ``leader``, ``replicas`` and ``isr``)."""
    health = ReplicationHealth()
    for topic in topics:
        min_isr = int(topic.configs.get("min.insync.replicas", "1"))
        for p in topic.partitions:
            health.partitions += 1
            if p.leader < 0:
                health.offline += 1
            else:
                health.leaders[p.leader] = health.leaders.get(p.leader, 0) + 1
            if len(p.isr) < len(p.replicas):
                health.under_replicated += 1
            if len(p.isr) < min_isr:
                health.under_min_isr += 1
            for r in p.replicas:
                health.replicas[r] = health.replicas.get(r, 0) + 1
    return health


def is_under_replicated(p: PartitionMetadata) -> bool:
    return len(p.isr) < len(p.replicas)


PARTITION_HEADERS = ("TOPIC", "PARTITION", "LEADER", "EPOCH", "REPLICAS", "ISR", "STATE")
TOPIC_SUMMARY_HEADERS = ("TOPIC", "PARTITIONS", "ONLINE", "NO LEADER", "UNDER-REPLICATED")


def topic_summary_rows(topics: Iterable[TopicDescription]) -> list[list[object]]:
    """Per topic: its partitions, how many have a leader, how many none, how many lack replicas
    in sync (what `tributary cluster status` shows by default)."""
    rows: list[list[object]] = []
    for topic in topics:
        led = sum(1 for p in topic.partitions if p.leader >= 0)
        under = sum(1 for p in topic.partitions if is_under_replicated(p))
        rows.append([topic.name, len(topic.partitions), led, len(topic.partitions) - led, under])
    return rows


class Described(Protocol):
    """A per-partition detail a describe column shows."""

    def text(self) -> str: ...


def describe_topic(
    description: TopicDescription, cleaner: Mapping[tuple[str, int], Described] | None = None
) -> str:
    """``kafka-topics --describe`` style: a summary line, configs, then one row per partition.

    ``cleaner`` ((topic, partition) -> progress with a ``text()``), given for a compacted topic,
    adds a CLEANER column: the log cleaner's progress as the partition's leader reports it.
    """
    configs = ",".join(f"{k}={v}" for k, v in sorted(description.configs.items()))
    header = (
        f"Topic: {description.name}\tPartitionCount: {len(description.partitions)}\t"
        f"ReplicationFactor: {description.replication_factor}\tConfigs: {configs}"
    )
    min_isr = int(description.configs.get("min.insync.replicas", "1"))
    rows = partition_rows(description.partitions, min_isr)
    if cleaner is None:
        return header + "\n" + table(PARTITION_HEADERS, rows)
    for row, p in zip(rows, description.partitions, strict=True):
        progress = cleaner.get((p.topic, p.partition))
        row.append(progress.text() if progress is not None else "-")
    return header + "\n" + table((*PARTITION_HEADERS, "CLEANER"), rows)


def is_compacted(description: TopicDescription) -> bool:
    """Whether the topic's ``cleanup.policy`` includes ``compact``."""
    return "compact" in description.configs.get("cleanup.policy", "").split(",")


def offsets_table(topic: str, earliest: dict[int, int], latest: dict[int, int]) -> str:
    rows = [
        [topic, p, earliest.get(p, -1), latest.get(p, -1), max(0, latest.get(p, 0) - earliest.get(p, 0))]
        for p in sorted(set(earliest) | set(latest))
    ]
    return table(("TOPIC", "PARTITION", "EARLIEST", "LATEST", "RECORDS"), rows)


# ---- consumer groups ------------------------------------------------------------------------------


def _dash(value) -> object:
    return "-" if value is None or value == "" else value


def _partitions_text(partitions) -> str:
    return ",".join(str(tp) for tp in partitions) or "-"


def groups_table(listings: Iterable[GroupListing]) -> str:
    return table(("GROUP", "STATE", "MEMBERS"), [[g.group_id, g.state, g.member_count] for g in listings])


def groups_json(listings: Iterable[GroupListing]) -> str:
    return json.dumps([g._asdict() for g in listings])


MEMBER_HEADERS = ("MEMBER-ID", "INSTANCE-ID", "CLIENT-ID", "HOST", "ASSIGNMENT", "OWNED")
LAG_HEADERS = ("TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID")


def describe_group(description: GroupDescription) -> str:
    """``kafka-consumer-groups --describe`` style: a summary line, the members, then per partition
    the committed offset, log end offset, lag and the member consuming it (``-`` for none)."""
    d = description
    lines = [
        f"Group: {d.group_id}\tState: {d.state}\tGeneration: {d.generation}\t"
        f"Assignor: {d.assignor or '-'}\tMembers: {len(d.members)}",
        "",
    ]
    if d.members:
        lines.append(
            table(
                MEMBER_HEADERS,
                [
                    [
                        m.member_id,
                        _dash(m.group_instance_id),
                        m.client_id,
                        m.host,
                        _partitions_text(m.assignment),
                        _partitions_text(m.owned),
                    ]
                    for m in d.members
                ],
            )
        )
    else:
        lines.append(f"Consumer group '{d.group_id}' has no active members.")
    lines.append("")
    lines.append(
        table(
            LAG_HEADERS,
            [
                [
                    p.topic,
                    p.partition,
                    _dash(p.committed_offset),
                    _dash(p.log_end_offset) if p.error is None else p.error,
                    _dash(p.lag),
                    _dash(p.owner),
                ]
                for p in d.partitions
            ],
        )
    )
    return "\n".join(lines)


def _tp_json(tp: TopicPartition) -> dict:
    return {"topic": tp.topic, "partition": tp.partition}


def group_json(description: GroupDescription) -> str:
    d = description
    return json.dumps(
        {
            "group_id": d.group_id,
            "state": d.state,
            "generation": d.generation,
            "assignor": d.assignor,
            "members": [
                {
                    **m._asdict(),
                    "topics": list(m.topics),
                    "assignment": [_tp_json(tp) for tp in m.assignment],
                    "owned": [_tp_json(tp) for tp in m.owned],
                }
                for m in d.members
            ],
            "partitions": [p._asdict() for p in d.partitions],
        }
    )


def reset_table(group: str, offsets: dict[TopicPartition, OffsetAndMetadata]) -> str:
    return table(
        ("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"),
        [[group, tp.topic, tp.partition, om.offset] for tp, om in sorted(offsets.items())],
    )


def clamp_offsets(
    offset: int, earliest: dict[TopicPartition, int], latest: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """``--to-offset N`` for every partition, moved into [earliest, latest] where it is outside
    (as Kafka's reset tool does: an offset out of range would only be reset again by consumers)."""
    return {tp: min(max(offset, earliest[tp]), latest[tp]) for tp in sorted(latest)}


class Progress:
    """Progress on stderr: rewritten in place on a terminal, one line at a time otherwise (at most
    every ``interval`` seconds), so logs and pipes are not flooded."""

    def __init__(self, stream: TextIO | None = None, *, interval: float = 2.0) -> None:
        self.stream = stream or sys.stderr
        self.interval = interval
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last = time.monotonic()
        self._pending_newline = False

    def step(self, message: str) -> None:
        """A milestone: always printed on its own line."""
        self._end_line()
        print(message, file=self.stream, flush=True)

    def update(self, message: str, *, force: bool = False) -> None:
        """A running count: printed when ``interval`` has passed (or always with ``force``)."""
        now = time.monotonic()
        if not force and now - self._last < (0.1 if self._tty else self.interval):
            return
        self._last = now
        if self._tty:
            self.stream.write("\r\033[K" + message)
            self.stream.flush()
            self._pending_newline = True
        else:
            print(message, file=self.stream, flush=True)

    def done(self, message: str) -> None:
        self._end_line()
        print(message, file=self.stream, flush=True)

    def _end_line(self) -> None:
        if self._pending_newline:
            self.stream.write("\n")
            self._pending_newline = False
