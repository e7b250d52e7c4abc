"""Every service's ``--help`` shows each setting's ``#:`` doc comment (services/config.py)."""

from __future__ import annotations

import dataclasses

import pytest

import coordinator.main
import gateway.server.main
import storage_node.main
from coordinator.config import CoordinatorConfig
from gateway.server.config import GatewayConfig
from services.config import ServiceConfig, field_docs
from storage_node.config import StorageNodeConfig

SERVICES = [
    pytest.param(
        storage_node.main, StorageNodeConfig, "--node-id", "Stable id of this node", id="storage-node"
    ),
    pytest.param(
        coordinator.main,
        CoordinatorConfig,
        "--max-partitions-per-topic",
        "Partition limits, enforced by the active controller",
        id="coordinator",
    ),
    pytest.param(
        gateway.server.main,
        GatewayConfig,
        "--fetch-decode-threads",
        "Threads that decode typed Fetch answers",
        id="gateway",
    ),
]


def _help(module, capsys) -> str:
    with pytest.raises(SystemExit) as exited:
        module.main(["--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse wraps lines


@pytest.mark.parametrize(("module", "config_cls", "flag", "doc"), SERVICES)
def test_help_shows_field_docs(module, config_cls, flag, doc, capsys):
    text = _help(module, capsys)
    metavar = flag.removeprefix("--").replace("-", "_").upper()
    assert f"{flag} {metavar} {doc}" in text  # the option's entry starts with its doc
    assert "Telemetry exporters, comma-separated" in text  # a field of the shared base class
    assert "Log level: DEBUG, INFO" in text


@pytest.mark.parametrize(("module", "config_cls", "flag", "doc"), SERVICES)
def test_every_setting_is_documented(module, config_cls, flag, doc):
    assert issubclass(config_cls, ServiceConfig)
    docs = field_docs(config_cls)
    assert [f.name for f in dataclasses.fields(config_cls) if not docs.get(f.name)] == []
