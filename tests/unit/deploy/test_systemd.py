"""deploy/systemd: unit templates and example settings, read as the services would read them."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.unit.deploy.systemd_checks import (
    SYSTEMD,
    example_config,
    read_unit,
    seconds,
    unit_problems,
    values,
)

UNITS = sorted(SYSTEMD.glob("*.service"))
SERVICES = ("tributary-storage-node", "tributary-coordinator", "tributary-gateway")


def test_one_template_per_service():
    assert [u.name for u in UNITS] == sorted(f"{s}@.service" for s in SERVICES)
    for service in SERVICES:
        assert example_config(service).is_file()


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_is_wired(unit, entries):
    assert unit_problems(unit, unit.read_text(), entries) == []


def test_repeated_keys_are_all_read():
    unit = read_unit("[Service]\nEnvironment=A=1\nEnvironment=B=2\nExecStart=/bin/x\n")
    assert values(unit, "Service", "Environment") == ["A=1", "B=2"]


@pytest.mark.parametrize(("text", "want"), [("90", 90), ("90s", 90), ("2min", 120), ("1min 30s", 90)])
def test_time_spans(text, want):
    assert seconds(text) == want


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_accepts_the_units(tmp_path):
    """systemd's own parser: unknown keys or bad values are warnings we treat as failures."""
    instances = []
    for unit in UNITS:
        # The binary is not installed here; verify checks it exists, so point at one that does.
        text = unit.read_text().replace("/opt/tributary/bin/", "/usr/bin/env ")
        target = tmp_path / unit.name.replace("@.service", "@1.service")
        target.write_text(text)
        (tmp_path / unit.name).write_text(text)
        instances.append(str(target))
    done = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *instances], capture_output=True, text=True, timeout=60
    )
    relevant = [line for line in (done.stdout + done.stderr).splitlines() if str(tmp_path) in line]
    assert done.returncode == 0 and relevant == [], done.stdout + done.stderr


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


STORAGE = SYSTEMD / "tributary-storage-node@.service"
BREAKAGES = {
    "unknown flag": (lambda t: _swap(t, "--node-id %i", "--node %i"), "has no flag --node"),
    "wrong script": (
        lambda t: _swap(t, "bin/tributary-storage-node", "bin/tributary-gateway"),
        "not an absolute path to tributary-storage-node",
    ),
    "restart always": (lambda t: _swap(t, "Restart=on-failure", "Restart=always"), "want on-failure"),
    "kill signal": (lambda t: _swap(t, "KillSignal=SIGTERM", "KillSignal=SIGKILL"), "want SIGTERM"),
    "short stop timeout": (
        lambda t: _swap(t, "TimeoutStopSec=120", "TimeoutStopSec=10s"),
        "TimeoutStopSec=10s",
    ),
    "no time for the controlled shutdown": (
        lambda t: _swap(t, "TimeoutStopSec=120", "TimeoutStopSec=75"),
        "TimeoutStopSec=75: set at least 90s",
    ),
    "few descriptors": (lambda t: _swap(t, "LimitNOFILE=1048576", "LimitNOFILE=1024"), "LimitNOFILE=1024"),
    "env typo": (
        lambda t: _swap(t, "TRIBUTARY_STORAGE_LOG_DIRS=", "TRIBUTARY_STORAGE_LOGDIRS="),
        "no field 'logdirs'",
    ),
    "no state directory": (
        lambda t: _swap(t, "StateDirectory=tributary/storage-node-%i\n", ""),
        "no StateDirectory",
    ),
    "data outside the state directory": (
        lambda t: _swap(
            t, "TRIBUTARY_STORAGE_LOG_DIRS=%S/tributary/storage-node-%i", "TRIBUTARY_STORAGE_LOG_DIRS=/srv"
        ),
        "log dir /srv is not under StateDirectory",
    ),
    "instance is not the node id": (lambda t: _swap(t, " --node-id %i", ""), "runs with node_id=0"),
    "config path": (
        lambda t: _swap(t, "/etc/tributary/storage-node-%i.toml", "/etc/tributary/storage.toml"),
        "want /etc/tributary/storage-node-1.toml",
    ),
    "root": (lambda t: _swap(t, "User=tributary", "User=root"), "runs as root"),
    "no environment file": (
        lambda t: t.replace("EnvironmentFile=", "#EnvironmentFile="),
        "no EnvironmentFile",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_checker_catches_a_broken_unit(breakage, entries):
    mutate, expected = BREAKAGES[breakage]
    problems = unit_problems(STORAGE, mutate(STORAGE.read_text()), entries)
    assert any(expected in p for p in problems), problems


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("retention_ms = 5", "unknown setting 'retention_ms'"),
        ("node_id = 7", "'node_id' from storage-node.toml.example is overridden by the flag --node-id"),
        ('host = "127.0.0.1"', "is loopback"),
    ],
)
def test_checker_catches_a_broken_example_config(line, expected, entries, tmp_path):
    shutil.copytree(SYSTEMD, tmp_path / "systemd")
    example = tmp_path / "systemd" / "storage-node.toml.example"
    text = example.read_text()
    key = line.split(" ")[0]
    kept = [ln for ln in text.splitlines() if not ln.startswith(key + " ")]
    table = kept.index("[default_topic_configs]")
    example.write_text("\n".join(kept[:table] + [line] + kept[table:]) + "\n")
    problems = unit_problems(STORAGE, STORAGE.read_text(), entries, systemd=tmp_path / "systemd")
    assert any(expected in p for p in problems), problems
