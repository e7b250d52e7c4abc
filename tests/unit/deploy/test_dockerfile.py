"""deploy/docker/Dockerfile and its ignore file, checked by parsing (no Docker engine here)."""

from __future__ import annotations

import pytest

from tests.unit.deploy.docker_checks import (
    BASE_IMAGE,
    DATA_VOLUME,
    DOCKERFILE,
    DOCKERIGNORE,
    dockerfile_problems,
    excluded,
    exposed_ports,
    ignore_patterns,
    ignore_problems,
    parse_dockerfile,
    stages,
    volumes,
)

DOCKERFILE_TEXT = DOCKERFILE.read_text()
IGNORE_TEXT = DOCKERIGNORE.read_text()


def test_dockerfile_is_wired(entries):
    assert dockerfile_problems(DOCKERFILE_TEXT, IGNORE_TEXT, entries) == []


def test_build_context_keeps_what_pip_install_needs_and_nothing_private():
    assert ignore_problems(IGNORE_TEXT) == []


def test_runtime_stage_shape():
    runtime = stages(parse_dockerfile(DOCKERFILE_TEXT))[-1]
    assert runtime.base == BASE_IMAGE
    assert DATA_VOLUME in volumes(runtime)
    assert exposed_ports(runtime) == {9092, 9093, 9094, 9095, 9096}


def test_parser_joins_continuations_and_drops_comments():
    instructions = parse_dockerfile("# c\nARG X=1\nRUN a \\\n  # inner comment\n  && b\nFROM python:${X}\n")
    assert [(i.keyword, i.value) for i in instructions] == [
        ("ARG", "X=1"),
        ("RUN", "a && b"),
        ("FROM", "python:${X}"),
    ]
    assert stages(instructions)[0].base == "python:1"


@pytest.mark.parametrize(
    ("path", "patterns", "want"),
    [
        ("services/config.py", "**\n!services\n", False),
        ("services/__pycache__/config.cpython-311.pyc", "**\n!services\n**/__pycache__\n", True),
        ("README.md", "*.md\n!README*.md\n", False),
        ("docs/x.md", "*.md\n", False),  # patterns are anchored at the context root
        ("a/b/c.txt", "a/**/c.txt\n", True),
        ("a/c.txt", "a/**/c.txt\n", True),
        ("deploy/k8s/base/x.yaml", "**\n!deploy\ndeploy/k8s\n", True),
    ],
)
def test_ignore_matching_follows_docker(path, patterns, want):
    assert excluded(path, ignore_patterns(patterns)) is want


def _swap(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new)


BREAKAGES = {
    "no data volume": (
        lambda t: _swap(t, 'VOLUME ["/var/lib/tributary"]\n', ""),
        "no VOLUME /var/lib/tributary",
    ),
    "root user": (lambda t: _swap(t, "USER 10001:10001", "USER root"), "runs as root"),
    "no user": (lambda t: _swap(t, "USER 10001:10001\n", ""), "sets no USER"),
    "not installing the project": (
        lambda t: _swap(t, "pip install . ", "pip install tributary "),
        "no RUN ... pip install .",
    ),
    "other base": (
        lambda t: _swap(t, "ARG PYTHON_IMAGE=python:3.11-slim", "ARG PYTHON_IMAGE=python:3.12"),
        "not python:3.11-slim",
    ),
    "port not exposed": (
        lambda t: _swap(t, "EXPOSE 9092 9093 9094 9095", "EXPOSE 9092 9093 9094"),
        "binds fetch_port=9095, not EXPOSEd",
    ),
    "stray port": (
        lambda t: _swap(t, "EXPOSE 9092 9093 9094 9095", "EXPOSE 9092 9093 9094 9095 8080"),
        "EXPOSE 8080, which no service binds",
    ),
    "env typo": (
        lambda t: _swap(t, "TRIBUTARY_STORAGE_FETCH_PORT=9095", "TRIBUTARY_STORAGE_FETCHPORT=9095"),
        "no field 'fetchport'",
    ),
    "secret": (
        lambda t: _swap(t, "PYTHONUNBUFFERED=1 \\", "PYTHONUNBUFFERED=1 ETCD_PASSWORD=x \\"),
        "ETCD_PASSWORD looks like a secret",
    ),
    "unknown command": (
        lambda t: _swap(t, 'CMD ["tributary", "--help"]', 'CMD ["tributary-broker"]'),
        "not a console script",
    ),
    "shell-form command": (
        lambda t: _swap(t, 'CMD ["tributary", "--help"]', "CMD tributary --help"),
        "not in exec form",
    ),
    "venv not copied": (
        lambda t: _swap(t, "COPY --from=build /opt/tributary /opt/tributary", ""),
        "does not COPY --from=build /opt/tributary",
    ),
    "scripts not on PATH": (
        lambda t: _swap(t, "PATH=/opt/tributary/bin:$PATH", "PATH=$PATH"),
        "PATH does not include /opt/tributary/bin",
    ),
    "data off the volume": (
        lambda t: _swap(
            t, "TRIBUTARY_STORAGE_LOG_DIRS=/var/lib/tributary/data", "TRIBUTARY_STORAGE_LOG_DIRS=/data"
        ),
        "log dir /data is not under VOLUME",
    ),
}


@pytest.mark.parametrize("breakage", sorted(BREAKAGES))
def test_checker_catches_a_broken_dockerfile(breakage, entries):
    mutate, expected = BREAKAGES[breakage]
    problems = dockerfile_problems(mutate(DOCKERFILE_TEXT), IGNORE_TEXT, entries)
    assert any(expected in p for p in problems), problems


def test_checker_catches_a_context_without_a_package():
    problems = ignore_problems(_swap(IGNORE_TEXT, "!services\n", ""))
    assert any("leaves out services/config.py" in p for p in problems), problems


def test_checker_catches_a_context_with_the_virtualenv():
    problems = ignore_problems("*.pyc\n")
    assert any("sends .venv/bin/python" in p for p in problems), problems
    assert any("sends tributary/__init__.py" in p for p in problems), problems
