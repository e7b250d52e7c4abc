"""Options of the ``tributary`` data source, named like Spark's Kafka source; parsed and checked here.

Spark hands a Python data source its options lower-cased and as strings. :meth:`ReadOptions.parse`
and :meth:`WriteOptions.parse` turn them into frozen values and raise :class:`OptionError` -- which
names the option in Kafka's spelling -- for anything unknown, malformed or contradictory. Pure:
no I/O, no Spark.

Reading (``spark.read`` / ``spark.readStream``):

==================================== =====================================================
``subscribe``                        comma-separated topics            } exactly
``subscribePattern``                 a regex (RE2 syntax, full match,  } one of
                                     <= 1,000 chars) over topic names  } these
``assign``                           JSON ``{"topic": [0, 1]}``        } three
``startingOffsets``                  earliest | latest | JSON ``{"t": {"0": 23, "1": -2}}``
                                     (-2 earliest, -1 latest; unlisted partitions: the
                                     default). Batch default earliest, streaming latest
``startingOffsetsByTimestamp``       JSON ``{"t": {"0": 1700000000000}}`` (ms)
``startingTimestamp``                one timestamp (ms) for every partition
``startingOffsetsByTimestampStrategy`` error (default) | latest: when no record is at or
                                     after the starting timestamp
``endingOffsets``                    batch only: latest (default) | JSON (-1 latest)
``endingOffsetsByTimestamp``         batch only: JSON of timestamps (ms)
``endingTimestamp``                  batch only: one timestamp (ms)
``maxOffsetsPerTrigger``             streaming only: records per micro-batch, split across
                                     partitions in proportion to their lag
``minPartitions``                    split large ranges so there are at least this many tasks
``failOnDataLoss``                   true (default): fail when records were deleted before
                                     they were read; false: skip them, logging a warning
``includeHeaders``                   false (default): add the ``headers`` column
``servers``                          gateway addresses, comma-separated; default: the SDK's
                                     (``$TRIBUTARY_GATEWAY``, then the local cluster)
``pollTimeoutMs``                    how long a task waits for records it expects (120000)
``isolation.level``                  read_uncommitted (default) | read_committed: only
                                     committed transactions, "latest" is the last stable
                                     offset (also spelled ``kafka.isolation.level``)
==================================== =====================================================

At most one starting option and one ending option may be given.

Writing (``df.write`` / ``df.writeStream``): ``topic`` (overrides the ``topic`` column),
``servers``, ``compression`` (none, gzip, snappy, lz4, zstd; default none), ``acks`` (all, 1, 0;
default all).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.client.client import client_tls
from gateway.client.credentials import client_token_source
from gateway.client.structs import TopicPartition
from services.acks import Acks
from services.errors import InvalidRequestError
from services.offset_spec import EARLIEST, LATEST
from services.topic_pattern import compile_topic_pattern
from spark_jobs.offsets import (
    Earliest,
    GlobalTimestamp,
    Latest,
    OffsetBound,
    SpecificOffsets,
    SpecificTimestamps,
)

#: TLS to the gateways, as the SDK's settings (``security_protocol`` ...): Spark option names.
SECURITY_OPTIONS = (
    "security.protocol",
    "ssl.cafile",
    "ssl.certfile",
    "ssl.keyfile",
    "sasl.mechanism",
    "sasl.oauthbearer.token.file",
)
_SUBSCRIPTIONS = ("subscribe", "subscribePattern", "assign")
_STARTING = ("startingOffsets", "startingOffsetsByTimestamp", "startingTimestamp")
_ENDING = ("endingOffsets", "endingOffsetsByTimestamp", "endingTimestamp")
READ_OPTIONS = (
    *_SUBSCRIPTIONS,
    *_STARTING,
    *_ENDING,
    "startingOffsetsByTimestampStrategy",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "includeHeaders",
    "servers",
    "pollTimeoutMs",
    "isolation.level",
    "kafka.isolation.level",
    *SECURITY_OPTIONS,
)
WRITE_OPTIONS = ("topic", "servers", "compression", "acks", *SECURITY_OPTIONS)
#: Options Spark itself passes along (``load(path)``, a stream writer's ``checkpointLocation``).
_SPARK_OPTIONS = ("path", "checkpointlocation")
_COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
DEFAULT_POLL_TIMEOUT_MS = 120_000


class OptionError(ValueError):
    """An invalid option of the tributary data source; ``option`` is its name in Kafka's spelling."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"tributary option '{option}': {message}")
        self.option = option


# ---- the raw option map -------------------------------------------------------------------------


class _Raw:
    """Case-insensitive view of Spark's options that reports problems by their proper names."""

    def __init__(self, options: Mapping[str, str], known: tuple[str, ...]) -> None:
        self._values = {str(k).lower(): v for k, v in options.items()}
        self._names = {name.lower(): name for name in known}
        unknown = sorted(k for k in self._values if k not in self._names and k not in _SPARK_OPTIONS)
        if unknown:
            raise OptionError(unknown[0], f"unknown option; supported: {', '.join(known)}")

    def get(self, name: str) -> str | None:
        value = self._values.get(name.lower())
        return None if value is None else str(value).strip()

    def value(self, name: str) -> str:
        """The value of an option known to be given (see :meth:`given`)."""
        value = self.get(name)
        if value is None:
            raise OptionError(name, "is required")
        return value

    def given(self, names: tuple[str, ...]) -> list[str]:
        return [name for name in names if self.get(name) not in (None, "")]

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name)
        if value is None or value == "":
            return default
        if value.lower() not in ("true", "false"):
            raise OptionError(name, f"must be true or false, not {value!r}")
        return value.lower() == "true"

    def positive_int(self, name: str) -> int | None:
        value = self.get(name)
        if value is None or value == "":
            return None
        try:
            number = int(value)
        except ValueError:
            raise OptionError(name, f"must be a positive integer, not {value!r}") from None
        if number <= 0:
            raise OptionError(name, f"must be a positive integer, not {value!r}")
        return number

    def json(self, name: str, example: str):
        try:
            return json.loads(self.value(name))
        except ValueError as exc:
            raise OptionError(name, f"is not valid JSON ({exc}); expected e.g. {example}") from None


# ---- subscriptions -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Subscription:
    """Which partitions to read: topics, a pattern over topic names, or explicit partitions."""

    kind: str  # "subscribe" | "subscribePattern" | "assign"
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assignment: tuple[TopicPartition, ...] = ()

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is part of the subscription (assign: one of its topics)."""
        if self.kind == "subscribePattern":
            assert self.pattern is not None
            return compile_topic_pattern(self.pattern).matches(topic)
        if self.kind == "assign":
            return any(tp.topic == topic for tp in self.assignment)
        return topic in self.topics


def _parse_subscription(raw: _Raw) -> Subscription:
    given = raw.given(_SUBSCRIPTIONS)
    if len(given) != 1:
        found = ", ".join(given) if given else "none"
        raise OptionError(
            given[1] if given else "subscribe",
            f"exactly one of subscribe, subscribePattern, assign must be set (found: {found})",
        )
    kind = given[0]
    if kind == "subscribe":
        topics = tuple(dict.fromkeys(t.strip() for t in raw.value(kind).split(",") if t.strip()))
        if not topics:
            raise OptionError(kind, "names no topic")
        return Subscription(kind, topics=topics)
    if kind == "subscribePattern":
        pattern = raw.get(kind) or ""
        try:
            compile_topic_pattern(pattern)
        except InvalidRequestError as exc:
            raise OptionError(kind, f"is not a valid regular expression: {exc.message}") from None
        return Subscription(kind, pattern=pattern)
    return Subscription(kind, assignment=_parse_assign(raw))


def _parse_assign(raw: _Raw) -> tuple[TopicPartition, ...]:
    example = '{"topicA": [0, 1], "topicB": [2]}'
    data = raw.json("assign", example)
    if not isinstance(data, dict) or not data:
        raise OptionError("assign", f"must be a JSON object of topic -> partition list, e.g. {example}")
    tps: list[TopicPartition] = []
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not all(_is_index(p) for p in partitions):
            raise OptionError("assign", f"partitions of {topic!r} must be a list of non-negative integers")
        tps.extend(TopicPartition(topic, p) for p in partitions)
    return tuple(sorted(set(tps)))


def _parse_isolation_level(raw: _Raw) -> str:
    given = raw.given(("isolation.level", "kafka.isolation.level"))
    if len(given) > 1 and raw.get(given[0]) != raw.get(given[1]):
        raise OptionError(given[1], f"contradicts {given[0]}; give one of them")
    if not given:
        return "read_uncommitted"
    value = (raw.get(given[0]) or "").lower()
    if value not in ("read_uncommitted", "read_committed"):
        raise OptionError(given[0], f"must be read_uncommitted or read_committed, not {value!r}")
    return value


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# ---- offset bounds ----------------------------------------------------------------------------


def _parse_per_partition(
    raw: _Raw, name: str, *, allowed_negative: tuple[int, ...]
) -> dict[TopicPartition, int]:
    example = '{"topicA": {"0": 23, "1": -2}}'
    data = raw.json(name, example)
    if not isinstance(data, dict):
        raise OptionError(name, f"must be a JSON object of topic -> {{partition: value}}, e.g. {example}")
    result = {}
    for topic, parts in data.items():
        if not isinstance(parts, dict):
            raise OptionError(
                name, f"the value of {topic!r} must be an object of partition -> value, e.g. {example}"
            )
        for partition, value in parts.items():
            if not str(partition).isdigit():
                raise OptionError(name, f"partition {partition!r} of {topic!r} is not a non-negative integer")
            if not _is_index(value) and value not in allowed_negative:
                allowed = " or ".join(str(v) for v in allowed_negative)
                hint = f" (or {allowed})" if allowed else ""
                raise OptionError(name, f"{topic}-{partition}: {value!r} is not a non-negative integer{hint}")
            result[TopicPartition(topic, int(partition))] = value
    return result


def _parse_timestamp(raw: _Raw, name: str) -> int:
    value = raw.value(name)
    try:
        timestamp = int(value)
    except ValueError:
        raise OptionError(
            name, f"must be a timestamp in milliseconds since the epoch, not {value!r}"
        ) from None
    if timestamp < 0:
        raise OptionError(name, f"must be a timestamp in milliseconds since the epoch, not {value!r}")
    return timestamp


def _parse_bound(raw: _Raw, names: tuple[str, str, str]) -> OffsetBound | None:
    """One of (offsets, offsets-by-timestamp, timestamp) options; at most one may be given."""
    _offsets_name, by_ts_name, ts_name = names
    given = raw.given(names)
    if len(given) > 1:
        raise OptionError(given[1], f"conflicts with {given[0]}: give only one of {', '.join(names)}")
    if not given:
        return None
    name = given[0]
    if name == ts_name:
        return GlobalTimestamp(_parse_timestamp(raw, name))
    if name == by_ts_name:
        return SpecificTimestamps(_parse_per_partition(raw, name, allowed_negative=()))
    value = raw.value(name)
    if value.lower() == "earliest":
        return Earliest()
    if value.lower() == "latest":
        return Latest()
    if not value.startswith("{"):
        raise OptionError(
            name, f'must be earliest, latest or JSON like {{"topicA": {{"0": 23}}}}, not {value!r}'
        )
    return SpecificOffsets(_parse_per_partition(raw, name, allowed_negative=(EARLIEST, LATEST)))


def _ensure_batch_bounds(
    starting: OffsetBound | None,
    starting_name: str | None,
    ending: OffsetBound | None,
    ending_name: str | None,
) -> None:
    """Spark's Kafka source rules: a batch cannot start at latest nor end at earliest."""
    if isinstance(starting, Latest) or _names(starting, LATEST):
        raise OptionError(
            starting_name or "startingOffsets",
            "latest (-1) is not allowed as a starting offset of a batch query",
        )
    if isinstance(ending, Earliest) or _names(ending, EARLIEST):
        raise OptionError(
            ending_name or "endingOffsets",
            "earliest (-2) is not allowed as an ending offset of a batch query",
        )


def _names(bound: OffsetBound | None, sentinel: int) -> bool:
    return isinstance(bound, SpecificOffsets) and sentinel in bound.offsets.values()


# ---- read options ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadOptions:
    """Every reading option, validated. ``starting``/``ending`` are ``None`` when not given."""

    subscription: Subscription
    starting: OffsetBound | None = None
    starting_option: str | None = None
    ending: OffsetBound | None = None
    ending_option: str | None = None
    timestamp_strategy: str = "error"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    servers: str | None = None
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    #: read_committed: transactions' records only once committed, aborted ones never.
    isolation_level: str = "read_uncommitted"
    #: The SDK's TLS settings (``security_protocol``, ``ssl_cafile`` ...); empty: plaintext.
    security: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
        """Validate Spark's option map for a batch (``streaming=False``) or streaming read."""
        raw = _Raw(options, READ_OPTIONS)
        starting_given, ending_given = raw.given(_STARTING), raw.given(_ENDING)
        if streaming and ending_given:
            raise OptionError(ending_given[0], "is not valid for streaming queries (they have no end)")
        starting, ending = _parse_bound(raw, _STARTING), _parse_bound(raw, _ENDING)
        starting_name = starting_given[0] if starting_given else None
        ending_name = ending_given[0] if ending_given else None
        if not streaming:
            _ensure_batch_bounds(starting, starting_name, ending, ending_name)
        return cls(
            subscription=_parse_subscription(raw),
            starting=starting,
            starting_option=starting_name,
            ending=ending,
            ending_option=ending_name,
            timestamp_strategy=_parse_strategy(raw),
            max_offsets_per_trigger=raw.positive_int("maxOffsetsPerTrigger"),
            min_partitions=raw.positive_int("minPartitions"),
            fail_on_data_loss=raw.boolean("failOnDataLoss", True),
            include_headers=raw.boolean("includeHeaders", False),
            servers=_parse_servers(raw),
            poll_timeout_ms=raw.positive_int("pollTimeoutMs") or DEFAULT_POLL_TIMEOUT_MS,
            isolation_level=_parse_isolation_level(raw),
            security=_parse_security(raw),
        )

    def starting_bound(self, *, streaming: bool) -> OffsetBound:
        """The starting bound, defaulting like Kafka's: earliest for batch, latest for streaming."""
        if self.starting is not None:
            return self.starting
        return Latest() if streaming else Earliest()

    def ending_bound(self) -> OffsetBound:
        return self.ending if self.ending is not None else Latest()


def _parse_strategy(raw: _Raw) -> str:
    value = (raw.get("startingOffsetsByTimestampStrategy") or "error").lower()
    if value not in ("error", "latest"):
        raise OptionError("startingOffsetsByTimestampStrategy", f"must be error or latest, not {value!r}")
    return value


def _parse_security(raw: _Raw) -> tuple[tuple[str, str], ...]:
    """``security.protocol`` (PLAINTEXT or SSL) and the ``ssl.*`` files, checked as the SDK
    checks them (files that exist, a certificate with its key) -- on the driver, before any task."""
    given: dict[str, str] = {}
    for name in SECURITY_OPTIONS:
        value = raw.get(name)
        if value:
            given[name] = value
    if not given:
        return ()
    settings = {name.replace(".", "_"): value for name, value in given.items()}
    token_file = settings.pop("sasl_oauthbearer_token_file", None)
    settings.setdefault("security_protocol", "SASL_SSL" if token_file else "SSL")
    try:
        client_tls(
            settings["security_protocol"],
            settings.get("ssl_cafile"),
            settings.get("ssl_certfile"),
            settings.get("ssl_keyfile"),
        )
        client_token_source(
            settings["security_protocol"],
            settings.get("sasl_mechanism"),
            _TokenFile(token_file) if token_file else None,
        )
        if token_file and not os.path.isfile(token_file):
            raise ValueError(f"sasl.oauthbearer.token.file {token_file} does not exist")
    except ValueError as exc:
        raise OptionError(next(iter(given)), str(exc)) from None
    if token_file:
        settings["sasl_oauthbearer_token_file"] = token_file
    return tuple(sorted(settings.items()))


def parse_security_options(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The security options (``ssl.cafile`` ...; nothing else may be given) of a job that is not
    a Spark read or write -- the loader's own connections -- checked as a read's are."""
    return _parse_security(_Raw(options, SECURITY_OPTIONS))


class _TokenFile:
    """A token provider reading a file each time a token is needed (picklable: tasks carry it)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def token(self) -> str:
        with open(self.path) as file:
            return file.read().strip()


def sdk_settings(security: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """Parsed security options as keyword arguments of the SDK's clients (the token file
    becomes the token provider, read on the executor)."""
    settings: dict[str, Any] = dict(security)
    token_file = settings.pop("sasl_oauthbearer_token_file", None)
    if token_file:
        settings["sasl_oauth_token_provider"] = _TokenFile(token_file)
    return settings


def _parse_servers(raw: _Raw) -> str | None:
    value = raw.get("servers")
    if not value:
        return None
    for address in (a.strip() for a in value.split(",") if a.strip()):
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise OptionError("servers", f"{address!r} is not host:port")
    return value


# ---- write options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    """Every writing option, validated."""

    topic: str | None = None
    servers: str | None = None
    compression: str = "none"
    acks: Acks = Acks.ALL
    #: The SDK's TLS settings (``security_protocol``, ``ssl_cafile`` ...); empty: plaintext.
    security: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriteOptions:
        raw = _Raw(options, WRITE_OPTIONS)
        compression = (raw.get("compression") or "none").lower()
        if compression not in _COMPRESSIONS:
            raise OptionError(
                "compression", f"must be one of {', '.join(_COMPRESSIONS)}, not {compression!r}"
            )
        acks = (raw.get("acks") or "all").lower()
        try:
            parsed_acks = Acks.parse(acks)
        except ValueError:
            raise OptionError("acks", f"must be all, 1 or 0, not {acks!r}") from None
        return cls(
            topic=raw.get("topic") or None,
            servers=_parse_servers(raw),
            compression=compression,
            acks=parsed_acks,
            security=_parse_security(raw),
        )
