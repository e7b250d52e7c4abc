"""deploy/docker: the Dockerfile and its ignore file, checked without a Docker engine.

The Dockerfile is parsed into instructions (continuations joined, ``ARG`` defaults substituted in
``FROM``); the ignore file is matched with Docker's rules (patterns relative to the context root,
``**`` for any depth, later ``!`` lines re-include, a pattern matching a directory covers what is
below it). The checks: the base image, a stage that ``pip install``\\ s the project from the
context, a non-root runtime user, the data volume, the exposed ports against the ports each
service binds with the image's environment, the default command, and that the build context keeps
everything ``pip install .`` needs and nothing generated or private.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.unit.deploy.wiring_checks import (
    DEPLOY,
    PYPROJECT,
    REPO,
    Entry,
    config_problems,
    env_name_problems,
    flag_problems,
    port_fields,
)

DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
DOCKERIGNORE = DEPLOY / "docker" / "Dockerfile.dockerignore"
BASE_IMAGE = "python:3.11-slim"
DATA_VOLUME = "/var/lib/tributary"
_SECRET = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|CREDENTIAL|API_KEY|PRIVATE_KEY", re.IGNORECASE)


@dataclass
class Instruction:
    line: int
    keyword: str
    value: str


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> list[Instruction]:
    """Logical instructions: comments dropped, backslash continuations joined."""
    instructions, pending, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # comment lines inside a continuation are dropped
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        logical = (pending + line).strip()
        pending = ""
        keyword, _, value = logical.partition(" ")
        instructions.append(Instruction(start, keyword.upper(), value.strip()))
    return instructions


def _substitute(text: str, args: Mapping[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)


def stages(instructions: list[Instruction]) -> list[Stage]:
    args: dict[str, str] = {}
    result: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "ARG" and not result:
            name, _, default = instruction.value.partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif instruction.keyword == "FROM":
            words = [w for w in instruction.value.split() if not w.startswith("--")]
            stage_name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            result.append(Stage(_substitute(words[0], args), stage_name))
        elif result:
            result[-1].instructions.append(instruction)
    return result


def exec_form(value: str) -> list[str] | None:
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) and all(isinstance(p, str) for p in parsed) else None


def env_pairs(value: str) -> dict[str, str]:
    """``ENV a=1 b="x y"`` (or the legacy ``ENV a 1``)."""
    words = shlex.split(value)
    if words and "=" not in words[0]:
        return {words[0]: " ".join(words[1:])}
    return dict(w.split("=", 1) for w in words)


def image_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.of("ENV"):
        env.update(env_pairs(instruction.value))
    return env


def exposed_ports(stage: Stage) -> set[int]:
    ports: set[int] = set()
    for instruction in stage.of("EXPOSE"):
        ports.update(int(p.split("/")[0]) for p in instruction.value.split())
    return ports


def volumes(stage: Stage) -> set[str]:
    found = set()
    for instruction in stage.of("VOLUME"):
        found.update(exec_form(instruction.value) or instruction.value.split())
    return found


# ---- the ignore file ------------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern:
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**", i):
            i += 2
            if pattern.startswith("/", i):
                i += 1
                out += "(?:.*/)?"
            else:
                out += ".*"
            continue
        out += {"*": "[^/]*", "?": "[^/]"}.get(char, re.escape(char))
        i += 1
    return re.compile(f"^{out}$")


def ignore_patterns(text: str) -> list[tuple[bool, re.Pattern]]:
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:].strip() if negate else line
        pattern = "/".join(p for p in pattern.strip("/").split("/") if p not in ("", "."))
        patterns.append((negate, _pattern_regex(pattern)))
    return patterns


def excluded(path: str, patterns: list[tuple[bool, re.Pattern]]) -> bool:
    """Whether the build context leaves ``path`` (relative to the repository root) out."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    result = False
    for negate, regex in patterns:
        if any(regex.match(candidate) for candidate in candidates):
            result = not negate
    return result


def generated_dirs(repo: Path = REPO) -> set[str]:
    """Top-level folders .gitignore names as generated (``/tributary/``, ``/etcdrpc/``)."""
    lines = (repo / ".gitignore").read_text().splitlines()
    return {line.strip("/") for line in lines if re.fullmatch(r"/[\w.-]+/", line.strip())}


def package_dirs(repo: Path = REPO, pyproject: Path = PYPROJECT) -> list[str]:
    """Top-level folders whose packages ``pip install .`` installs (pyproject's packages.find)."""
    project = tomllib.loads(pyproject.read_text())
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    return sorted(
        p.name for p in repo.iterdir() if p.is_dir() and any(fnmatch.fnmatch(p.name, i) for i in include)
    )


def build_inputs(repo: Path = REPO, pyproject: Path = PYPROJECT) -> list[str]:
    """Every file ``pip install .`` reads: metadata, the protos, the (non-generated) packages."""
    project = tomllib.loads(pyproject.read_text())["project"]
    files = ["pyproject.toml", "setup.py", project["readme"]]
    files += [str(p.relative_to(repo)) for p in (repo / "protos").rglob("*.proto")]
    for root in package_dirs(repo, pyproject):
        if root in generated_dirs(repo):
            continue
        files += [str(p.relative_to(repo)) for p in (repo / root).rglob("*.py") if _in_package(p, repo)]
    return files


def _in_package(path: Path, repo: Path) -> bool:
    """A module setuptools' find_packages installs: every folder up to the top one is a package."""
    folder = path.parent
    while folder != repo:
        if not (folder / "__init__.py").exists():
            return False
        folder = folder.parent
    return True


def ignore_problems(text: str, repo: Path = REPO) -> list[str]:
    patterns = ignore_patterns(text)
    problems = [
        f"{DOCKERIGNORE.name}: leaves out {path}, which `pip install .` needs"
        for path in build_inputs(repo)
        if excluded(path, patterns)
    ]
    private = [".git/config", ".venv/bin/python", ".tributary/cluster.json", "data/storage-0/x"]
    private += [f"{d}/__init__.py" for d in generated_dirs(repo)]
    problems += [
        f"{DOCKERIGNORE.name}: sends {path} to the build (private, local or generated)"
        for path in private
        if not excluded(path, patterns)
    ]
    return problems


# ---- the Dockerfile ---------------------------------------------------------------------------------


def dockerfile_problems(
    text: str, ignore_text: str, entries: Mapping[str, Entry], repo: Path = REPO
) -> list[str]:
    where = "Dockerfile"
    all_stages = stages(parse_dockerfile(text))
    if not all_stages:
        return [f"{where}: no FROM"]
    problems = [
        f"{where}: stage {s.name or index} is FROM {s.base}, not {BASE_IMAGE}"
        for index, s in enumerate(all_stages)
        if s.base != BASE_IMAGE
    ]
    problems += install_problems(all_stages, ignore_text, repo)
    runtime = all_stages[-1]
    users = runtime.of("USER")
    if not users:
        problems.append(f"{where}: the runtime stage sets no USER (runs as root)")
    elif users[-1].value.split(":")[0] in ("root", "0"):
        problems.append(f"{where}: the runtime stage runs as {users[-1].value}")
    if DATA_VOLUME not in volumes(runtime):
        problems.append(f"{where}: no VOLUME {DATA_VOLUME}")
    env = image_env(runtime)
    problems += env_name_problems(env, entries, f"{where} ENV")
    problems += [
        f"{where}: {kind} {name} looks like a secret baked into the image"
        for kind, names in (
            ("ENV", env),
            ("ARG", [i.value.split("=")[0] for s in all_stages for i in s.of("ARG")]),
        )
        for name in names
        if _SECRET.search(name)
    ]
    problems += service_default_problems(runtime, env, entries)
    problems += command_problems(runtime, entries)
    return problems


def install_problems(all_stages: list[Stage], ignore_text: str, repo: Path) -> list[str]:
    """A stage installs the project from the context; the runtime stage gets its environment."""
    where, problems = "Dockerfile", []
    patterns = ignore_patterns(ignore_text)
    for stage in all_stages:
        for copy in stage.of("COPY") + stage.of("ADD"):
            words = [w for w in copy.value.split() if not w.startswith("--")]
            if "--from" in copy.value:
                continue
            for source in words[:-1]:
                source = source.strip("/") or "."
                if source != "." and not (repo / source).exists():
                    problems.append(f"{where}:{copy.line}: COPY {source}: no such file in the repository")
                elif source != "." and excluded(source, patterns):
                    problems.append(
                        f"{where}:{copy.line}: COPY {source}: left out of the context by {DOCKERIGNORE.name}"
                    )
    installers = [
        (s, i)
        for s in all_stages
        for i in s.of("RUN")
        if re.search(r"pip install(\s+--?\S+)*\s+\.(\s|$|\[)", i.value)
    ]
    if not installers:
        return problems + [f"{where}: no RUN ... pip install . (the project, built from the context)"]
    stage, run = installers[0]
    venv = re.search(r"-m venv\s+(\S+)", run.value)
    runtime = all_stages[-1]
    if stage is not runtime:
        if venv is None:
            problems.append(
                f"{where}:{run.line}: the build stage installs outside a venv; the runtime stage "
                "cannot copy it"
            )
        elif not any(
            f"--from={stage.name}" in c.value and venv.group(1) in c.value for c in runtime.of("COPY")
        ):
            problems.append(f"{where}: the runtime stage does not COPY --from={stage.name} {venv.group(1)}")
    if venv is not None and f"{venv.group(1)}/bin" not in image_env(runtime).get("PATH", ""):
        problems.append(
            f"{where}: PATH does not include {venv.group(1)}/bin: the console scripts are not found"
        )
    return problems


def service_default_problems(
    runtime: Stage, env: Mapping[str, str], entries: Mapping[str, Entry]
) -> list[str]:
    """With only the image's environment, each service binds fixed ports the image EXPOSEs and keeps
    its data on the volume."""
    where, problems = "Dockerfile", []
    exposed, bound = exposed_ports(runtime), set()
    for entry in entries.values():
        if entry.config_cls is None:
            continue
        config, found = config_problems(entry, env=env, args=None, file=None, where=f"{where} ENV")
        problems += found
        if config is None:
            continue
        for name, value in port_fields(config).items():
            bound.add(value)
            if value == 0:
                problems.append(f"{where}: {entry.script} {name} is 0 with the image's ENV: set a fixed port")
            elif value not in exposed:
                problems.append(
                    f"{where}: {entry.script} binds {name}={value}, not EXPOSEd ({sorted(exposed)})"
                )
        for directory in getattr(config, "log_dirs", None) or []:
            if not str(directory).startswith(DATA_VOLUME + "/") and str(directory) != DATA_VOLUME:
                problems.append(
                    f"{where}: {entry.script} log dir {directory} is not under VOLUME {DATA_VOLUME}"
                )
    problems += [f"{where}: EXPOSE {port}, which no service binds" for port in sorted(exposed - bound)]
    return problems


def command_problems(runtime: Stage, entries: Mapping[str, Entry]) -> list[str]:
    where = "Dockerfile"
    problems = []
    entrypoint = runtime.of("ENTRYPOINT")
    commands = runtime.of("CMD")
    for instruction in entrypoint + commands:
        if exec_form(instruction.value) is None:
            problems.append(
                f"{where}:{instruction.line}: {instruction.keyword} not in exec form (JSON): the "
                "process would not get SIGTERM"
            )
    if entrypoint:
        return problems  # with an ENTRYPOINT the command is whatever the deployment passes
    argv = exec_form(commands[-1].value) if commands else None
    if not argv:
        return problems + [f"{where}: no CMD"]
    entry = entries.get(Path(argv[0]).name)
    if entry is None:
        return problems + [
            f"{where}: CMD runs {argv[0]}, not a console script ({', '.join(sorted(entries))})"
        ]
    return problems + flag_problems(entry, argv[1:], f"{where} CMD")
