from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The suite runs with --import-mode=importlib, which does not put test directories on sys.path;
# the checkers (wiring_checks, k8s_checks, docker_checks, systemd_checks) are imported by name.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from wiring_checks import Entry, load_entries  # noqa: E402


@pytest.fixture(scope="session")
def entries() -> dict[str, Entry]:
    """Every console script of pyproject.toml with its parser and settings."""
    return load_entries()
