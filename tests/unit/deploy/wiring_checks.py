"""What the deployment files must agree with: console scripts, their flags, their settings.

Everything is read from the code, never restated: the console scripts from pyproject.toml's
``[project.scripts]``, each script's argparse parser from its module's ``build_parser()``, and its
settings (dataclass and ``ENV_PREFIX``) from the same module. The manifest, Dockerfile and systemd
checks (``k8s_checks``, ``docker_checks``, ``systemd_checks``) build on these helpers.

Every check returns a list of problems -- strings naming the file or object and what is wrong --
so a test asserts ``== []`` and a deliberately broken copy shows what the checker catches.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import ipaddress
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from services.config import ConfigError, add_config_arguments, load_config, normalize_key

REPO = Path(__file__).resolve().parents[3]
PYPROJECT = REPO / "pyproject.toml"
DEPLOY = REPO / "deploy"


@dataclass(frozen=True)
class Entry:
    """One console script: its parser and, for a service, its settings dataclass and env prefix."""

    script: str
    target: str
    parser: argparse.ArgumentParser
    config_cls: type | None = None
    env_prefix: str | None = None

    @property
    def flags(self) -> set[str]:
        return set(self.parser._option_string_actions)  # argparse has no public listing

    @property
    def fields(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.config_cls)} if self.config_cls else set()

    def parse(self, argv: list[str]) -> tuple[argparse.Namespace | None, str]:
        """``(namespace, "")``, ``(None, "")`` for --help, or ``(None, error)``."""
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                return self.parser.parse_args(argv), ""
        except SystemExit as exc:
            if exc.code in (0, None):
                return None, ""
            lines = err.getvalue().strip().splitlines()
            return None, lines[-1] if lines else f"exit status {exc.code}"

    def config(
        self, *, env: Mapping[str, str], args: argparse.Namespace | None = None, file: Path | None = None
    ) -> Any:
        """The settings the service would run with (raises ConfigError like the service would)."""
        assert self.config_cls is not None and self.env_prefix is not None
        overrides = {name: getattr(args, name, None) for name in self.fields} if args is not None else {}
        return load_config(
            self.config_cls, file=file, env=env, env_prefix=self.env_prefix, overrides=overrides
        )


def console_scripts(pyproject: Path = PYPROJECT) -> dict[str, str]:
    return dict(tomllib.loads(pyproject.read_text())["project"]["scripts"])


def project_version(pyproject: Path = PYPROJECT) -> str:
    return tomllib.loads(pyproject.read_text())["project"]["version"]


def load_entries(pyproject: Path = PYPROJECT) -> dict[str, Entry]:
    """Every console script of the project, imported from its module."""
    entries = {}
    for script, target in console_scripts(pyproject).items():
        module = importlib.import_module(target.partition(":")[0])
        config_cls = _config_class(module)
        if hasattr(module, "build_parser"):
            parser = module.build_parser()
        else:  # what services.config gives a main without an importable parser
            parser = argparse.ArgumentParser(prog=script)
            parser.add_argument("--config", type=Path)
            if config_cls is not None:
                add_config_arguments(parser, config_cls)
        entries[script] = Entry(script, target, parser, config_cls, getattr(module, "ENV_PREFIX", None))
    return entries


def _config_class(module) -> type | None:
    found = [
        value
        for value in vars(module).values()
        if isinstance(value, type) and dataclasses.is_dataclass(value) and value.__name__.endswith("Config")
    ]
    return found[0] if len(found) == 1 else None


def non_service_env() -> set[str]:
    """``TRIBUTARY_*`` variables that are not service settings (client and launcher ones)."""
    from gateway.client.servers import DATA_DIR_ENV, GATEWAY_ENV
    from services.etcd.embedded import BINARY_ENV

    return {GATEWAY_ENV, DATA_DIR_ENV, BINARY_ENV}


def env_owner(name: str, entries: Mapping[str, Entry]) -> Entry | None:
    """The service whose prefix ``name`` carries (the longest matching prefix)."""
    owners = [e for e in entries.values() if e.env_prefix and name.startswith(e.env_prefix + "_")]
    return max(owners, key=lambda e: len(e.env_prefix or ""), default=None)


def env_field(name: str, entry: Entry) -> str:
    return normalize_key(name[len(entry.env_prefix or "") + 1 :])


def env_name_problems(names: Iterable[str], entries: Mapping[str, Entry], where: str) -> list[str]:
    """Every ``TRIBUTARY_*`` name must be ``<a service's prefix>_<one of its fields>``.

    The services ignore unknown names under their prefix (environment is not strict), so a typo
    here would silently do nothing.
    """
    problems = []
    prefixes = sorted(e.env_prefix for e in entries.values() if e.env_prefix)
    for name in names:
        if not name.startswith("TRIBUTARY_") or name in non_service_env():
            continue
        owner = env_owner(name, entries)
        if owner is None:
            problems.append(f"{where}: {name} is read by no service (prefixes: {', '.join(prefixes)})")
        elif env_field(name, owner) not in owner.fields:
            problems.append(
                f"{where}: {name}: {getattr(owner.config_cls, '__name__', None)} has no field "
                f"{env_field(name, owner)!r} ({owner.script} ignores it)"
            )
    return problems


def flag_problems(entry: Entry, argv: list[str], where: str) -> list[str]:
    """Flags must be spelled exactly (argparse would accept an abbreviation) and parse."""
    problems = []
    for arg in argv:
        flag = arg.split("=", 1)[0]
        if flag.startswith("--") and flag not in entry.flags:
            problems.append(
                f"{where}: {entry.script} has no flag {flag} (known: {', '.join(sorted(entry.flags))})"
            )
    if not problems:
        _, error = entry.parse(argv)
        if error:
            problems.append(f"{where}: {entry.script} {' '.join(argv)}: {error}")
    return problems


def config_problems(
    entry: Entry, *, env: Mapping[str, str], args: argparse.Namespace | None, file: Path | None, where: str
) -> tuple[Any, list[str]]:
    """Build the settings as the service would; ``(config or None, problems)``."""
    try:
        return entry.config(env=env, args=args, file=file), []
    except ConfigError as exc:
        return None, [f"{where}: {entry.script} would refuse its settings: {exc}"]


def shadow_problems(
    entry: Entry, *, env: Mapping[str, str], args: argparse.Namespace | None, file: Path | None, where: str
) -> list[str]:
    """Settings a config file sets that the environment or a flag silently overrides."""
    if file is None or not file.exists():
        return []
    try:
        in_file = {normalize_key(k) for k in tomllib.loads(file.read_text())}
    except tomllib.TOMLDecodeError:
        return []  # config_problems reports it
    overridden = {}
    for name in env:
        owner = env_owner(name, {entry.script: entry})
        if owner is not None and env_field(name, owner) in in_file:
            overridden[env_field(name, owner)] = f"environment variable {name}"
    for name in entry.fields & in_file:
        if args is not None and getattr(args, name, None) is not None:
            overridden[name] = f"flag --{name.replace('_', '-')}"
    return [
        f"{where}: {field!r} from {file.name} is overridden by the {source}"
        for field, source in sorted(overridden.items())
    ]


def topic_config_problems(config: Any, where: str) -> list[str]:
    """Kafka-style topic config defaults must be names and values the storage node accepts."""
    configs = getattr(config, "default_topic_configs", None)
    if not configs:
        return []
    from services.errors import TributaryError
    from services.topic_config import validate_topic_configs

    try:
        validate_topic_configs(configs)
    except (TributaryError, ValueError) as exc:
        return [f"{where}: default_topic_configs: {exc}"]
    return []


def port_fields(config: Any) -> dict[str, int]:
    """``{"port": 9094, "fetch_port": 9095}``: the ports a service binds (an optional port left
    unset, e.g. ``health_port``, binds nothing)."""
    return {
        f.name: getattr(config, f.name)
        for f in dataclasses.fields(config)
        if (f.name == "port" or f.name.endswith("_port")) and getattr(config, f.name) is not None
    }


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def is_wildcard(host: str) -> bool:
    return host in ("0.0.0.0", "::", "")


def host_problems(config: Any, where: str) -> list[str]:
    """A service must be reachable; one that registers itself in etcd advertises its host."""
    host = getattr(config, "host", None)
    if host is None:
        return []
    if is_loopback(host):
        return [f"{where}: host {host!r} is loopback: nothing outside the process's machine can reach it"]
    if hasattr(config, "etcd_endpoints") and is_wildcard(host):
        return [
            f"{where}: host {host!r} is a wildcard, but this service registers its host in etcd "
            "for others to connect to"
        ]
    return []


def split_address(address: str) -> tuple[str, int | None]:
    address = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return address, None
    return host.strip("[]"), int(port)
