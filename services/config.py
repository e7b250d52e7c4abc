"""Service configuration from a file, environment variables and command-line flags.

Each service describes its settings as a dataclass; this module fills one in, later sources
overriding earlier ones: field defaults < config file (TOML or JSON) < environment < flags.
Names may be written Kafka-style with dots (``log.dirs``), with dashes (``--log-dirs``) or with
underscores (``log_dirs``); they all mean the dataclass field ``log_dirs``. Environment variables
are ``<PREFIX>_<FIELD>`` in upper case, e.g. ``TRIBUTARY_STORAGE_LOG_DIRS``.

Values are coerced by the field's annotation: int, float, bool, str, Path, ``list[str]``
(comma-separated) and ``dict[str, str]`` (``k=v,k=v``). Unknown names and bad values raise
:class:`ConfigError` naming the source, the key and the value.

Topic configs (``retention.ms`` ...) are not service settings; they live in
``services.topic_config``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A configuration source named an unknown setting or gave a value of the wrong type."""


def normalize_key(key: str) -> str:
    """``log.dirs`` / ``log-dirs`` / ``LOG_DIRS`` -> ``log_dirs``."""
    return key.strip().replace(".", "_").replace("-", "_").lower()


def _coerce(value: Any, annotation: Any, key: str, source: str) -> Any:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None or (isinstance(value, str) and value.lower() in ("", "none", "null")):
            if type(None) in args:
                return None
        inner = [a for a in args if a is not type(None)]
        return _coerce(value, inner[0], key, source)
    try:
        if origin is list:
            items = value.split(",") if isinstance(value, str) else list(value)
            return [
                _coerce(item.strip() if isinstance(item, str) else item, args[0], key, source)
                for item in items
                if not (isinstance(item, str) and not item.strip())
            ]
        if origin is dict:
            if isinstance(value, str):
                pairs = [p.split("=", 1) for p in value.split(",") if p.strip()]
                if any(len(p) != 2 for p in pairs):
                    raise ValueError("expected k=v pairs separated by commas")
                return {k.strip(): v.strip() for k, v in pairs}
            return {str(k): str(v) for k, v in dict(value).items()}
        if annotation is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
            raise ValueError("expected true or false")
        if annotation is int:
            if isinstance(value, bool):
                raise ValueError("expected an integer")
            return int(value)
        if annotation is float:
            return float(value)
        if annotation is Path:
            return Path(value).expanduser()
        if annotation is str:
            return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{source}: bad value {value!r} for {key!r}: {exc}") from exc
    return value


def _fields(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
        else:
            data = tomllib.loads(path.read_text())
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
    """Add one ``--field-name`` flag per dataclass field (all default to None = not given)."""
    for f in dataclasses.fields(cls):
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        text = help_text.get(f.name) or f.metadata.get("help", "")
        parser.add_argument(
            f"--{f.name.replace('_', '-')}",
            dest=f.name,
            default=None,
            metavar=f.name.upper(),
            help=f"{text} (default: {default})".strip(),
        )


def config_from_args(cls: type[T], args: argparse.Namespace, *, env_prefix: str) -> T:
    """Build ``cls`` from ``--config FILE`` (if the parser has it), the environment and the flags."""
    overrides = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
    return load_config(cls, file=getattr(args, "config", None), env_prefix=env_prefix, overrides=overrides)
