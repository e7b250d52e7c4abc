from __future__ import annotations

import pytest

from tests.unit.deploy.wiring_checks import Entry, load_entries


@pytest.fixture(scope="session")
def entries() -> dict[str, Entry]:
    """Every console script of pyproject.toml with its parser and settings."""
    return load_entries()
