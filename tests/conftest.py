"""Suite-wide test configuration: markers by directory.

A test under ``tests/integration/`` is marked ``integration`` (real etcd and service processes),
one under ``tests/e2e/`` ``e2e`` (a local Spark), so ``-m "not integration and not e2e"`` selects
the unit tests alone. Marking by path here replaces per-module ``pytestmark`` lines, which were
easy to forget (and have no effect in a conftest.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent
_MARK_BY_DIRECTORY = {"integration": pytest.mark.integration, "e2e": pytest.mark.e2e}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        try:
            top = item.path.resolve().relative_to(_TESTS).parts[0]
        except ValueError:  # collected from outside tests/
            continue
        mark = _MARK_BY_DIRECTORY.get(top)
        if mark is not None:
            item.add_marker(mark)
