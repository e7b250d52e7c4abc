"""Service configuration from a file, environment variables and command-line flags.

Each service describes its settings as a dataclass; this module fills one in, later sources
overriding earlier ones: field defaults < config file (TOML or JSON) < environment < flags.
Names may be written Kafka-style with dots (``log.dirs``), with dashes (``--log-dirs``) or with
underscores (``log_dirs``); they all mean the dataclass field ``log_dirs``. Environment variables
are ``<PREFIX>_<FIELD>`` in upper case, e.g. ``TRIBUTARY_STORAGE_LOG_DIRS``.

Values are coerced by the field's annotation: int, float, bool, str, Path, ``list[str]``
(comma-separated) and ``dict[str, str]`` (``k=v,k=v``). Unknown names and bad values raise
:class:`ConfigError` naming the source, the key and the value.

Each setting is documented by a ``#:`` comment right above its field (the Sphinx convention);
:func:`field_docs` reads those comments from the class source, so they are also each flag's
``--help`` text. Settings every service has are in :class:`ServiceConfig`, the base class of the
three services' config dataclasses.

Topic configs (``retention.ms`` ...) are not service settings; they live in
``services.topic_config``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import os
import textwrap
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A configuration source named an unknown setting or gave a value of the wrong type."""


@dataclass
class ServiceConfig:
    """Settings every service process has (subclasses add the service's own before these)."""

    #: When set, a JSON file with the pid and the bound ports is written here once the service
    #: serves (what launchers wait for).
    ready_file: Path | None = None
    #: Telemetry exporters, comma-separated: none, console, otlp (traces and metrics), prometheus
    #: (metrics). Empty = the OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER variables (default none).
    telemetry_exporter: str = ""
    #: Serve Prometheus metrics (/metrics) at this address: ``host:port`` or ``port`` (host = ``host``;
    #: port 0 = any free port). Empty = no endpoint (unless OTEL_METRICS_EXPORTER names prometheus).
    metrics_address: str = ""
    #: Log level: DEBUG, INFO, WARNING, ERROR or CRITICAL.
    log_level: str = "INFO"
    #: Also log to this file (logs always go to stderr).
    log_file: Path | None = None
    #: A second port, on ``host``, serving only grpc.health.v1 in plaintext (0 = any free port),
    #: for health checkers that cannot speak TLS -- Kubernetes' gRPC probes -- when the service's
    #: own gRPC port is TLS only. It tells whether the service is serving, nothing more. Unset:
    #: no such port (probe the gRPC port).
    health_port: int | None = None


@dataclass
class MemberTlsConfig:
    """Mutual TLS between cluster members (``services/tls.py``), for every service: all three
    files, or none (internal connections in plaintext, the local default)."""

    #: Mutual TLS between the cluster's processes: this process's member certificate (PEM),
    #: presented to the storage nodes and coordinators it connects to and served on its own
    #: internal ports. With ``internal_tls_key_file`` and ``internal_tls_ca_file`` (all three or
    #: none), every internal connection is TLS; files are re-read when they change.
    internal_tls_cert_file: Path | None = None
    #: The private key of ``internal_tls_cert_file`` (PEM).
    internal_tls_key_file: Path | None = None
    #: The cluster CA (PEM): the members this process connects to, and the clients of its
    #: internal ports, must hold a certificate that chains to it. Use a CA of the cluster's own,
    #: not the one signing application clients' certificates: internal ports authorize nothing.
    internal_tls_ca_file: Path | None = None
    #: With internal TLS: the name every member's certificate is checked for when this process
    #: connects to it, instead of the host it dials. For members reached at addresses no
    #: certificate can name in advance (Kubernetes pod IPs): give every member certificate this
    #: DNS name (e.g. ``member.tributary.internal``). Empty: the dialled host (an IP address or
    #: DNS name in the certificate's subjectAltName), as HTTPS does.
    internal_tls_server_name: str = ""


@dataclass
class InternalPortTlsConfig(MemberTlsConfig):
    """:class:`MemberTlsConfig` for a service with internal ports (storage node, coordinator)."""

    #: With internal TLS on, internal ports accept only clients presenting a certificate from
    #: ``internal_tls_ca_file`` (mutual TLS). False: any TLS client (server authentication only),
    #: e.g. while the cluster's members are being given their certificates one by one.
    internal_tls_require_client_cert: bool = True


def field_docs(cls: type) -> dict[str, str]:
    """Field name -> its ``#:`` comment, for dataclass ``cls`` and its dataclass bases.

    A comment documents the one field right below it; several ``#:`` lines join into one text.
    Fields without one are left out, as is everything when the source cannot be read.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            docs.update(_own_field_docs(klass))
    return docs


@functools.cache
def _own_field_docs(klass: type) -> dict[str, str]:
    try:
        lines, _ = inspect.getsourcelines(klass)
    except (OSError, TypeError):  # no source shipped: the flags keep their defaults as help
        return {}
    classdef = ast.parse(textwrap.dedent("".join(lines))).body[0]
    docs = {}
    for node in getattr(classdef, "body", []):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        comment: list[str] = []
        row = node.lineno - 2  # the line above the field (lines are 0-based, linenos 1-based)
        while row >= 0 and lines[row].strip().startswith("#:"):
            comment.insert(0, lines[row].strip()[2:].strip())
            row -= 1
        if comment:
            docs[node.target.id] = " ".join(part for part in comment if part)
    return docs


def _help_order(cls: type) -> list[dataclasses.Field]:
    """The fields as ``--help`` lists them: the class's own first, then what it inherits."""
    fields = dataclasses.fields(cls)
    order: list[str] = []
    for klass in cls.__mro__:
        order += [name for name in vars(klass).get("__annotations__", {}) if name not in order]
    rank = {name: index for index, name in enumerate(order)}
    return sorted(fields, key=lambda f: rank.get(f.name, len(rank)))


def normalize_key(key: str) -> str:
    """``log.dirs`` / ``log-dirs`` / ``LOG_DIRS`` -> ``log_dirs``."""
    return key.strip().replace(".", "_").replace("-", "_").lower()


def _coerce(value: Any, annotation: Any, key: str, source: str) -> Any:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = typing.get_args(annotation)
        if type(None) in args and _is_null(value):
            return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key, source)
    try:
        return _convert(value, annotation, key, source)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: bad value {value!r} for {key!r}: {exc}") from exc


def _is_null(value: Any) -> bool:
    return value is None or (isinstance(value, str) and value.lower() in ("", "none", "null"))


def _convert(value: Any, annotation: Any, key: str, source: str) -> Any:
    """``value`` as ``annotation`` (a value of another annotation is returned as is)."""
    origin = typing.get_origin(annotation)
    if origin is list:
        item_type = typing.get_args(annotation)[0]
        items = value.split(",") if isinstance(value, str) else list(value)
        return [
            _coerce(item.strip() if isinstance(item, str) else item, item_type, key, source)
            for item in items
            if not (isinstance(item, str) and not item.strip())
        ]
    if origin is dict:
        return _to_dict(value)
    convert = _SCALARS.get(annotation)
    return value if convert is None else convert(value)


def _to_dict(value: Any) -> dict[str, str]:
    if isinstance(value, str):
        pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
        if any(len(p) != 2 for p in pairs):
            raise ValueError("expected k=v pairs separated by commas")
        return {k.strip(): v.strip() for k, v in pairs}
    return {str(k): str(v) for k, v in dict(value).items()}


def _to_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("expected true or false")


def _to_int(value: Any) -> int:
    if isinstance(value, bool):
        raise ValueError("expected an integer")
    return int(value)


_SCALARS: dict[Any, Any] = {
    bool: _to_bool,
    int: _to_int,
    float: float,
    Path: lambda value: Path(value).expanduser(),
    str: str,
}


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a table of settings")
    return data


def load_config(
    cls: type[T],
    *,
    file: Path | None = None,
    env: Mapping[str, str] | None = None,
    env_prefix: str = "",
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` (a dataclass) from defaults, ``file``, ``env`` and ``overrides`` in that order.

    ``overrides`` entries whose value is None are ignored, so an argparse namespace with unset
    flags can be passed as is.
    """
    fields = _fields(cls)
    values: dict[str, Any] = {}

    def take(key: str, value: Any, source: str, *, strict: bool) -> None:
        name = normalize_key(key)
        if name not in fields:
            if strict:
                raise ConfigError(f"{source}: unknown setting {key!r} (known: {', '.join(sorted(fields))})")
            return
        values[name] = _coerce(value, fields[name], key, source)

    if file is not None:
        for key, value in _read_file(file).items():
            take(key, value, f"config file {file}", strict=True)
    if env_prefix:
        env = os.environ if env is None else env
        prefix = env_prefix.upper().rstrip("_") + "_"
        for key, value in env.items():
            if key.startswith(prefix):
                take(key[len(prefix) :], value, f"environment variable {key}", strict=False)
    for key, value in (overrides or {}).items():
        if value is not None:
            take(key, value, f"flag --{key.replace('_', '-')}", strict=True)
    return cls(**values)


def add_config_arguments(
    parser: argparse.ArgumentParser, cls: type, *, help_text: Mapping[str, str] = {}
) -> None:
    """Add one ``--field-name`` flag per dataclass field (all default to None = not given).

    Each flag's help is ``help_text[name]``, else the field's ``metadata["help"]``, else its
    ``#:`` comment (:func:`field_docs`), followed by the default.
    """
    docs = field_docs(cls)
    for f in _help_order(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        text = help_text.get(f.name) or f.metadata.get("help", "") or docs.get(f.name, "")
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{text} (default: {default})".strip().replace("%", "%%"),  # argparse formats help
        )


def config_from_args(cls: type[T], args: argparse.Namespace, *, env_prefix: str) -> T:
    """Build ``cls`` from ``--config FILE`` (if the parser has it), the environment and the flags."""
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
    return load_config(cls, file=getattr(args, "config", None), env_prefix=env_prefix, overrides=overrides)
