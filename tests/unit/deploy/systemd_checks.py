"""deploy/systemd: the unit templates, read with configparser, checked against the services.

A unit ``tributary-<x>@.service`` runs the console script ``tributary-<x>``. The check expands the
unit's specifiers for a sample instance, parses its ExecStart with the service's own parser, and
builds the settings the service would run with: the example config file beside the unit
(``<x>.toml.example``, standing in for ``/etc/tributary/<x>-<instance>.toml``), the unit's
``Environment=`` and the flags. Then: restart and stop behaviour (graceful SIGTERM with time to
flush), file descriptor limit, the data directory under ``StateDirectory=``, the instance name as
the node or coordinator id, and no setting in the example file that the unit silently overrides.
"""

from __future__ import annotations

import configparser
import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from tests.unit.deploy.wiring_checks import (
    DEPLOY,
    Entry,
    config_problems,
    env_name_problems,
    flag_problems,
    host_problems,
    port_fields,
    shadow_problems,
    topic_config_problems,
)

SYSTEMD = DEPLOY / "systemd"
SYSUSERS = SYSTEMD / "tributary.sysusers"
SAMPLE_INSTANCE = "1"
STATE_ROOT = "/var/lib"
MIN_NOFILE = 65536
MIN_STOP_S = 30
#: Services with data on disk need longer to stop: every partition is flushed and closed.
MIN_STOP_WITH_DATA_S = 60
_UNIT = re.compile(r"^(?P<script>tributary-[a-z-]+)@\.service$")


class _Repeated(dict):
    """configparser section storage that keeps every value of a repeated key (Environment=...)."""

    def __setitem__(self, key, value):
        if isinstance(value, list) and isinstance(self.get(key), list):
            self[key].extend(value)
        else:
            super().__setitem__(key, value)


def read_unit(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(
        strict=False,
        interpolation=None,
        dict_type=_Repeated,
        empty_lines_in_values=False,
        comment_prefixes=("#", ";"),
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # configparser's documented hook: systemd keys are case-sensitive
    parser.read_string(text)
    return parser


def values(unit: configparser.ConfigParser, section: str, key: str) -> list[str]:
    if not unit.has_option(section, key):
        return []
    return [v.strip() for v in unit.get(section, key).split("\n") if v.strip()]


def specifiers(text: str, instance: str = SAMPLE_INSTANCE) -> str:
    table = {
        "i": instance,
        "I": instance,
        "S": STATE_ROOT,
        "t": "/run",
        "C": "/var/cache",
        "L": "/var/log",
        "E": "/etc",
        "%": "%",
    }
    return re.sub(r"%(.)", lambda m: table.get(m.group(1), m.group(0)), text)


def seconds(text: str) -> float:
    """systemd time spans: ``90``, ``90s``, ``2min``, ``1min 30s``, ``infinity``."""
    if text.strip() == "infinity":
        return float("inf")
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text):
        total += float(number) * units.get(unit, float("nan"))
    return total


def environment(unit: configparser.ConfigParser) -> dict[str, str]:
    env = {}
    for line in values(unit, "Service", "Environment"):
        for word in shlex.split(specifiers(line)):
            name, _, value = word.partition("=")
            env[name] = value
    return env


def sysusers_user(path: Path = SYSUSERS) -> str | None:
    for line in path.read_text().splitlines():
        words = shlex.split(line, comments=True)
        if words and words[0] == "u":
            return words[1]
    return None


def example_config(script: str, systemd: Path = SYSTEMD) -> Path:
    return systemd / f"{script.removeprefix('tributary-')}.toml.example"


def unit_problems(path: Path, text: str, entries: Mapping[str, Entry], systemd: Path = SYSTEMD) -> list[str]:
    where = path.name
    match = _UNIT.match(path.name)
    if match is None:
        return [f"{where}: not a tributary-<service>@.service template"]
    try:
        unit = read_unit(text)
    except configparser.Error as exc:
        return [f"{where}: not a unit file: {exc}"]
    problems = [
        f"{where}: no [{section}] section"
        for section in ("Unit", "Service", "Install")
        if not unit.has_section(section)
    ]
    if problems:
        return problems
    script = match.group("script")
    entry = entries.get(script)
    if entry is None:
        return [f"{where}: {script} is not a console script of the project ({', '.join(sorted(entries))})"]
    exec_start = values(unit, "Service", "ExecStart")
    if len(exec_start) != 1:
        return [f"{where}: want exactly one ExecStart, found {len(exec_start)}"]
    argv = shlex.split(specifiers(exec_start[0].lstrip("-@+!:")))
    if not argv[0].startswith("/") or Path(argv[0]).name != script:
        problems.append(f"{where}: ExecStart runs {argv[0]}, not an absolute path to {script}")
    problems += flag_problems(entry, argv[1:], where)
    problems += service_section_problems(unit, where)
    problems += settings_problems(unit, entry, argv[1:], where, systemd)
    return problems


def service_section_problems(unit: configparser.ConfigParser, where: str) -> list[str]:
    problems = []

    def one(key: str) -> str | None:
        found = values(unit, "Service", key)
        return found[-1] if found else None

    if one("Restart") != "on-failure":
        problems.append(f"{where}: Restart={one('Restart')}, want on-failure")
    if one("KillSignal") != "SIGTERM":
        problems.append(
            f"{where}: KillSignal={one('KillSignal')}, want SIGTERM (the services stop gracefully on it)"
        )
    if one("Type") not in ("exec", "simple"):
        problems.append(f"{where}: Type={one('Type')}: the services do not notify systemd or fork")
    nofile = one("LimitNOFILE") or "0"
    if nofile != "infinity" and int(nofile.split(":")[-1]) < MIN_NOFILE:
        problems.append(f"{where}: LimitNOFILE={nofile}, want at least {MIN_NOFILE}")
    if not values(unit, "Service", "EnvironmentFile"):
        problems.append(f"{where}: no EnvironmentFile=")
    user = one("User")
    if user in (None, "root", "0"):
        problems.append(f"{where}: runs as {user or 'root'}")
    elif SYSUSERS.exists() and user != sysusers_user():
        problems.append(f"{where}: User={user}, but {SYSUSERS.name} creates {sysusers_user()}")
    return problems


def settings_problems(
    unit: configparser.ConfigParser, entry: Entry, argv: list[str], where: str, systemd: Path
) -> list[str]:
    """The settings the service would start with, from the example file, Environment= and flags."""
    env = environment(unit)
    problems = env_name_problems(env, {entry.script: entry}, where)
    args, _ = entry.parse(argv)
    if args is None or entry.config_cls is None:
        return problems
    service = entry.script.removeprefix("tributary-")
    expected = specifiers(f"/etc/tributary/{service}-%i.toml")
    if str(getattr(args, "config", None)) != expected:
        problems.append(f"{where}: --config {getattr(args, 'config', None)}, want {expected}")
    example = example_config(entry.script, systemd)
    if not example.is_file():
        return problems + [f"{where}: no example config {example.name} beside the unit"]
    config, found = config_problems(
        entry, env=env, args=args, file=example, where=f"{where} with {example.name}"
    )
    problems += found + shadow_problems(
        entry, env=env, args=args, file=example, where=f"{where} with {example.name}"
    )
    if config is None:
        return problems
    problems += host_problems(config, f"{example.name}") + topic_config_problems(config, example.name)
    problems += [
        f"{example.name}: {name} is 0: a service behind a firewall or load balancer needs a fixed port"
        for name, value in port_fields(config).items()
        if value == 0
    ]
    problems += identity_problems(config, where)
    problems += stop_and_data_problems(unit, config, where)
    return problems


def identity_problems(config, where: str) -> list[str]:
    """The instance name is the node id (storage) or the coordinator id."""
    for name in ("node_id", "coordinator_id"):
        if hasattr(config, name) and str(getattr(config, name)) != SAMPLE_INSTANCE:
            return [f"{where}: instance {SAMPLE_INSTANCE!r} runs with {name}={getattr(config, name)!r}"]
    return []


def stop_and_data_problems(unit: configparser.ConfigParser, config, where: str) -> list[str]:
    problems = []
    has_data = hasattr(config, "log_dirs")
    stop = values(unit, "Service", "TimeoutStopSec")
    least = MIN_STOP_WITH_DATA_S if has_data else MIN_STOP_S
    if getattr(config, "controlled_shutdown_enable", False):
        # A storage node first waits for its controlled shutdown (leaders moved elsewhere).
        least += -(-int(config.controlled_shutdown_timeout_ms) // 1000)
    if not stop or seconds(stop[-1]) < least:
        problems.append(
            f"{where}: TimeoutStopSec={stop[-1] if stop else '(default 90s, implicit)'}: set at least "
            f"{least}s explicitly for a graceful shutdown"
        )
    if not has_data:
        return problems
    state = values(unit, "Service", "StateDirectory")
    if not state:
        return problems + [f"{where}: no StateDirectory= for the data"]
    roots = [f"{STATE_ROOT}/{specifiers(d)}" for line in state for d in line.split()]
    for directory in config.log_dirs:
        if not any(str(directory) == r or str(directory).startswith(r + "/") for r in roots):
            problems.append(f"{where}: log dir {directory} is not under StateDirectory ({', '.join(roots)})")
    return problems
