"""Kafka-named topic configs, shared by the coordinator (validation at create/alter time) and the
storage node (``storage_node.log.config.LogConfig``).

One table, :data:`TOPIC_CONFIGS`, defines every config: name, type, default, allowed values or
range, and a doc line. Everything else is derived from it: :func:`validate_topic_configs` for
user input, :func:`resolve_topic_configs` for "defaults overlaid with overrides", and the
:func:`parse_int` / :func:`parse_bool` / ... helpers.

Values arrive as strings (gRPC maps, CLI flags, etcd) or already typed (Python callers); both are
accepted and the typed form is returned. Defaults are Kafka's, except where noted in the doc.

Valid here but not honoured yet, so the controller refuses them at create and alter
(``coordinator.topic_rules.ensure_supported_configs``) rather than storing and ignoring them:

* ``compression.type`` other than ``producer`` -- batches keep the producer's compression; the
  storage node never recompresses.

(The log layer still parses them, so values stored by earlier versions load.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from services.errors import InvalidConfigError

#: Java's Long.MAX_VALUE and Integer.MAX_VALUE, Kafka's "never"/"unbounded" values.
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1
#: The other ends of Kafka's LONG and INT config types: every integer config is one of the two,
#: so a value is never wider than the int64 / int32 fields it ends up in.
LONG_MIN = -(2**63)
INT_MIN = -(2**31)

CLEANUP_POLICY_DELETE = "delete"
CLEANUP_POLICY_COMPACT = "compact"
TIMESTAMP_TYPE_CREATE_TIME = "CreateTime"
TIMESTAMP_TYPE_LOG_APPEND_TIME = "LogAppendTime"
COMPRESSION_TYPES = ("producer", "none", "gzip", "snappy", "lz4", "zstd")

_TRUE = {"true"}
_FALSE = {"false"}


def parse_int(value: Any) -> int:
    """An integer from an int or its decimal string (``"1048588"``); bools are rejected."""
    if isinstance(value, bool):
        raise ValueError("expected an integer, got a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text and (text.isdigit() or (text[0] in "+-" and text[1:].isdigit())):
            return int(text)
    raise ValueError(f"expected an integer, got {value!r}")


def parse_long(value: Any) -> int:
    """A Kafka LONG config: an integer that :class:`ConfigDef` bounds to the signed 64-bit range."""
    return parse_int(value)


def parse_int32(value: Any) -> int:
    """A Kafka INT config: an integer that :class:`ConfigDef` bounds to the signed 32-bit range."""
    return parse_int(value)


#: The range each integer type allows; a config's own ``min``/``max`` narrow it.
_TYPE_RANGES: dict[Callable[[Any], Any], tuple[int, int]] = {
    parse_long: (LONG_MIN, LONG_MAX),
    parse_int32: (INT_MIN, INT_MAX),
}


def parse_bool(value: Any) -> bool:
    """``true``/``false`` (any case) or a Python bool, as Kafka's ConfigDef accepts."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError(f"expected true or false, got {value!r}")


def parse_double(value: Any) -> float:
    """A Kafka DOUBLE config: a finite number, or its decimal string (``"0.5"``); bools rejected."""
    if isinstance(value, bool):
        raise ValueError("expected a number, got a boolean")
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise ValueError(f"expected a number, got {value!r}") from None
    else:
        raise ValueError(f"expected a number, got {value!r}")
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"expected a finite number, got {value!r}")
    return number


def parse_str(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value.strip()


def parse_list(value: Any) -> tuple[str, ...]:
    """A comma-separated list (``"compact,delete"``) or a sequence of strings, as a sorted tuple."""
    if isinstance(value, str):
        items = [item.strip() for item in value.split(",") if item.strip()]
    elif isinstance(value, (list, tuple, set, frozenset)) and all(isinstance(i, str) for i in value):
        items = [item.strip() for item in value]
    else:
        raise ValueError(f"expected a comma-separated list, got {value!r}")
    if not items:
        raise ValueError("expected at least one value")
    return tuple(sorted(set(items)))


def _shown(raw: Any, limit: int = 64) -> str:
    """``raw`` as an error message quotes it: cut short, so a megabyte value is not echoed back."""
    text = repr(raw)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


@dataclass(frozen=True)
class ConfigDef:
    """One topic config: how to parse it, its default, and what values are legal."""

    name: str
    parse: Callable[[Any], Any]
    default: Any
    doc: str
    min: int | None = None
    max: int | None = None
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.parse is parse_int:
            raise TypeError(f"{self.name}: integer configs are parse_long or parse_int32 (bounded)")
        type_range = _TYPE_RANGES.get(self.parse)
        if type_range is not None:  # every integer config is bounded at both ends
            low, high = type_range
            object.__setattr__(self, "min", low if self.min is None else max(self.min, low))
            object.__setattr__(self, "max", high if self.max is None else min(self.max, high))

    def range_text(self) -> str:
        """The legal range in words, as error messages give it."""
        if self.min is not None and self.max is not None:
            return f"value must be between {self.min} and {self.max}"
        if self.min is not None:
            return f"value must be at least {self.min}"
        return f"value must be at most {self.max}"

    def validate(self, raw: Any) -> Any:
        """The typed value for ``raw``, or InvalidConfigError naming this config and the value."""
        try:
            value = self.parse(raw)
        except ValueError as exc:
            raise InvalidConfigError(
                f"Invalid value {_shown(raw)} for configuration {self.name}: {exc}"
            ) from None
        self._ensure_in_range(value, raw)
        return value

    def _ensure_in_range(self, value: Any, raw: Any) -> None:
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise InvalidConfigError(
                f"Invalid value {_shown(raw)} for configuration {self.name}: {self.range_text()}"
            )
        if self.choices is not None:
            values = value if isinstance(value, tuple) else (value,)
            bad = [v for v in values if v not in self.choices]
            if bad:
                raise InvalidConfigError(
                    f"Invalid value {_shown(raw)} for configuration {self.name}: "
                    f"must be one of {', '.join(self.choices)}"
                )


_DAY_MS = 24 * 60 * 60 * 1000

#: Every topic config Tributary knows, keyed by Kafka name.
TOPIC_CONFIGS: dict[str, ConfigDef] = {
    d.name: d
    for d in (
        ConfigDef(
            "segment.bytes",
            parse_int32,
            1024 * 1024 * 1024,
            min=14,
            max=INT_MAX,
            doc="Roll a new segment once the active one would exceed this many bytes. "
            "At most 2 GiB - 1 because index positions are int32.",
        ),
        ConfigDef(
            "segment.ms",
            parse_long,
            7 * _DAY_MS,
            min=1,
            doc="Roll the active segment once it is this old, so time retention can delete it.",
        ),
        ConfigDef(
            "segment.index.bytes",
            parse_int32,
            10 * 1024 * 1024,
            min=12,
            max=INT_MAX,
            doc="Maximum size of each index file; a full index rolls the segment. At least 12 "
            "bytes so both indexes hold one entry (Kafka allows 4, which holds none).",
        ),
        ConfigDef(
            "index.interval.bytes",
            parse_int32,
            4096,
            min=0,
            max=INT_MAX,
            doc="Bytes of log between two offset-index entries (the index is sparse).",
        ),
        ConfigDef(
            "retention.ms",
            parse_long,
            7 * _DAY_MS,
            min=-1,
            doc="Delete segments whose newest record is older than this; -1 keeps them forever.",
        ),
        ConfigDef(
            "retention.bytes",
            parse_long,
            -1,
            min=-1,
            doc="Delete the oldest segments while the partition is larger than this; -1 = no limit.",
        ),
        ConfigDef(
            "flush.messages",
            parse_long,
            LONG_MAX,
            min=1,
            doc="fsync after this many unflushed records (the paper's M). Kafka's default: "
            "never, relying on replication and the OS; produce with acks can instead wait "
            "for a group-committed fsync.",
        ),
        ConfigDef(
            "flush.ms",
            parse_long,
            LONG_MAX,
            min=0,
            doc="fsync once the oldest unflushed data is this old (the paper's T). Default: never.",
        ),
        ConfigDef(
            "max.message.bytes",
            parse_int32,
            1048588,
            min=0,
            max=INT_MAX,
            doc="Largest record batch (after compression, with its 12-byte log overhead) accepted.",
        ),
        ConfigDef(
            "message.timestamp.type",
            parse_str,
            TIMESTAMP_TYPE_CREATE_TIME,
            choices=(TIMESTAMP_TYPE_CREATE_TIME, TIMESTAMP_TYPE_LOG_APPEND_TIME),
            doc="CreateTime keeps the producer's timestamps; LogAppendTime stamps batches "
            "with the broker's clock at append.",
        ),
        ConfigDef(
            "cleanup.policy",
            parse_list,
            (CLEANUP_POLICY_DELETE,),
            choices=(CLEANUP_POLICY_COMPACT, CLEANUP_POLICY_DELETE),
            doc="delete: time/size retention. compact: the log cleaner keeps the last record "
            "per key (storage_node.log.cleaner); compact,delete: both. A compact-only topic is "
            "never trimmed by time or size.",
        ),
        ConfigDef(
            "min.cleanable.dirty.ratio",
            parse_double,
            0.5,
            min=0,
            max=1,
            doc="Compacted topics: clean a partition once its uncleaned bytes are at least this "
            "share of its cleanable bytes (unless max.compaction.lag.ms forces it sooner).",
        ),
        ConfigDef(
            "min.compaction.lag.ms",
            parse_long,
            0,
            min=0,
            doc="Compacted topics: a record stays uncompacted at least this long (by the "
            "largest timestamp of its segment).",
        ),
        ConfigDef(
            "max.compaction.lag.ms",
            parse_long,
            LONG_MAX,
            min=1,
            doc="Compacted topics: a record becomes eligible for compaction at most this long "
            "after it was written, whatever the dirty ratio (the active segment rolls by then).",
        ),
        ConfigDef(
            "delete.retention.ms",
            parse_long,
            _DAY_MS,
            min=0,
            doc="Compacted topics: how long a tombstone (null value) is kept, so consumers "
            "reading from behind see the delete, before the cleaner removes it.",
        ),
        ConfigDef(
            "min.insync.replicas",
            parse_int32,
            1,
            min=1,
            doc="Replicas that must have a write for acks=all to succeed.",
        ),
        ConfigDef(
            "compression.type",
            parse_str,
            "producer",
            choices=COMPRESSION_TYPES,
            doc="Stored only: batches keep the producer's compression.",
        ),
        ConfigDef(
            "file.delete.delay.ms",
            parse_long,
            60_000,
            min=0,
            doc="Grace period before a deleted segment's files are removed. Stored only: "
            "segments are unlinked at once; open readers keep their file handles.",
        ),
        ConfigDef(
            "unclean.leader.election.enable",
            parse_bool,
            False,
            doc="Allow an out-of-sync replica to become leader (losing data) when no in-sync "
            "replica is alive.",
        ),
    )
}


def validate_topic_configs(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Typed values for ``configs`` (overrides only; defaults are not added).

    Raises InvalidConfigError naming the first unknown config name or bad value. Used by the
    coordinator at topic create/alter time and by the storage node before opening a log.
    """
    typed: dict[str, Any] = {}
    for name, raw in configs.items():
        definition = TOPIC_CONFIGS.get(name)
        if definition is None:
            raise InvalidConfigError(f"Unknown topic config name: {name}")
        typed[name] = definition.validate(raw)
    _ensure_consistent(typed)
    return typed


def _ensure_consistent(typed: Mapping[str, Any]) -> None:
    """Rules across configs (Kafka's LogConfig.validateValues): the compaction lags in order."""
    low, high = typed.get("min.compaction.lag.ms"), typed.get("max.compaction.lag.ms")
    if low is not None and high is not None and low > high:
        raise InvalidConfigError(
            f"conflict topic config setting min.compaction.lag.ms ({low}) > max.compaction.lag.ms ({high})"
        )


def resolve_topic_configs(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """Every topic config, typed: defaults, overlaid by each layer in turn (later wins).

    Typical use: ``resolve_topic_configs(broker_defaults, topic_overrides)``.
    """
    resolved = {name: definition.default for name, definition in TOPIC_CONFIGS.items()}
    for layer in layers:
        resolved.update(validate_topic_configs(layer))
    _ensure_consistent(resolved)
    return resolved


def format_topic_config(name: str, value: Any) -> str:
    """The string form of a typed value, as it would be stored in etcd or shown by the CLI."""
    if name not in TOPIC_CONFIGS:
        raise InvalidConfigError(f"Unknown topic config name: {name}")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)
