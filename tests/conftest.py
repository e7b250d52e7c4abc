"""Suite-wide test configuration: markers by directory.

A test under ``tests/integration/`` is marked ``integration`` (real etcd and service processes),
one under ``tests/e2e/`` ``e2e`` (a local Spark), so ``-m "not integration and not e2e"`` selects
the unit tests alone. Marking by path here replaces per-module ``pytestmark`` lines, which were
easy to forget (and have no effect in a conftest.py).
"""

from __future__ import annotations

from pathlib import Path

# Imported at the start: otherwise Hypothesis's pytest plugin first imports this at the end of a
# session that ran no Hypothesis test (the integration stage), and on CPython 3.11 compiling a
# module that late failed once with "SystemError: AST constructor recursion depth mismatch",
# failing a session whose tests had all passed.
import hypothesis.internal.observability  # noqa: F401
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


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadfile``, the e2e tests are one unit of work: a worker that runs one of them
    starts the e2e fixtures (a local cluster and a Spark JVM, shared by the session), so one
    worker runs them all while the other takes integration modules."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling  # type: ignore[import-untyped]

    class E2EAsOneFile(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if nodeid.startswith("tests/e2e/"):
                return "tests/e2e/"
            return super()._split_scope(nodeid)

    return E2EAsOneFile(config, log)
