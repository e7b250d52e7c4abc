"""Simulated pods: what each container of a workload would actually run with.

For one pod of a workload (a StatefulSet pod per simulated ordinal), the pod's volumes are
materialized in a scratch directory (ConfigMap volumes hold their files), init containers that run
``python SCRIPT`` run the real script against those volumes (with a fake API server answering for
the pod's node), each container's environment is expanded (ConfigMaps, downward API, ``$(VAR)``),
and each service container's command line is parsed by the service's own parser and its settings
built by ``services.config.load_config`` -- from the same ``--config`` file the init step wrote.
"""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.scripts import load_script
from tests.unit.deploy.k8s_objects import (
    Bundle,
    containers,
    describe,
    is_tributary_image,
    name_of,
    pod_labels,
    pod_spec,
)
from tests.unit.deploy.wiring_checks import Entry, config_problems, flag_problems, shadow_problems

CLUSTER_PROVIDED_CONFIGMAPS = {"kube-root-ca.crt"}
HOSTNAME_KEY = "kubernetes.io/hostname"
ZONE_KEY = "topology.kubernetes.io/zone"

# What the simulated pods see.
SIM_NAMESPACE = "sim"
SIM_POD_IP = "10.0.0.10"
SIM_NODE = "sim-node"
SIM_ZONE = "sim-zone-b"
SIM_ORDINALS = (0, 2)


@dataclass
class Run:
    """One container of one simulated pod, with the settings its service would run with."""

    workload: dict
    container: dict
    is_init: bool
    ordinal: int
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    entry: Entry | None = None
    config: Any = None
    config_file: Path | None = None
    mounts: list[tuple[str, str, Path]] = field(default_factory=list)  # (mountPath, volume, host dir)
    problems: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{describe(self.workload)} container {self.container.get('name')}"

    @property
    def command(self) -> str:
        command = self.container.get("command") or []
        return Path(command[0]).name if command else ""


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion (unknown references stay as written, ``$$`` is ``$``)."""

    def sub(match: re.Match) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR.sub(sub, str(text))


def pod_name(workload: Mapping, ordinal: int) -> str:
    if workload["kind"] == "StatefulSet":
        return f"{name_of(workload)}-{ordinal}"
    return f"{name_of(workload)}-5d8f7c9b4-x{ordinal}q7z"


def downward(workload: Mapping, ordinal: int) -> dict[str, str]:
    values = {
        "metadata.name": pod_name(workload, ordinal),
        "metadata.namespace": SIM_NAMESPACE,
        "status.podIP": SIM_POD_IP,
        "status.hostIP": "10.0.0.1",
        "spec.nodeName": SIM_NODE,
        "spec.serviceAccountName": pod_spec(workload).get("serviceAccountName", "default"),
    }
    labels = dict(pod_labels(workload))
    if workload["kind"] == "StatefulSet":
        labels.setdefault("apps.kubernetes.io/pod-index", str(ordinal))
        labels.setdefault("statefulset.kubernetes.io/pod-name", pod_name(workload, ordinal))
    for key, value in labels.items():
        values[f"metadata.labels['{key}']"] = value
    return values


def resolve_env(bundle: Bundle, run: Run) -> None:
    env: dict[str, str] = {"HOSTNAME": pod_name(run.workload, run.ordinal)}  # set by the runtime
    for source in run.container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref is None:
            continue
        config_map = bundle.get("ConfigMap", ref["name"])
        if config_map is None:
            if not ref.get("optional"):
                run.problems.append(f"{run.where}: envFrom ConfigMap {ref['name']} does not exist")
            continue
        prefix = source.get("prefix", "")
        env.update({prefix + k: str(v) for k, v in (config_map.get("data") or {}).items()})
    fields = downward(run.workload, run.ordinal)
    for item in run.container.get("env", []):
        name, source = item["name"], item.get("valueFrom") or {}
        if "value" in item:
            env[name] = expand(item["value"], env)
        elif "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            if path not in fields:
                run.problems.append(f"{run.where}: env {name}: downward API field {path} is not available")
            env[name] = fields.get(path, "")
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            data = (bundle.get("ConfigMap", ref["name"]) or {}).get("data") or {}
            if ref["key"] not in data and not ref.get("optional"):
                run.problems.append(
                    f"{run.where}: env {name}: ConfigMap {ref['name']} has no key {ref['key']}"
                )
            env[name] = str(data.get(ref["key"], ""))
        else:  # secretKeyRef, resourceFieldRef: a value the simulation cannot know
            env[name] = "<from " + ",".join(source) + ">"
    run.env = env


def materialize_volumes(bundle: Bundle, workload: Mapping, root: Path) -> tuple[dict[str, Path], list[str]]:
    """A directory per pod volume; ConfigMap volumes hold their files."""
    dirs, problems = {}, []
    spec = pod_spec(workload)
    for volume in spec.get("volumes", []):
        directory = root / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        dirs[volume["name"]] = directory
        sources = [volume] + [s for s in (volume.get("projected") or {}).get("sources", [])]
        for source in sources:
            ref = source.get("configMap")
            if ref is None or ref.get("name") in CLUSTER_PROVIDED_CONFIGMAPS:
                continue
            config_map = bundle.get("ConfigMap", ref["name"])
            if config_map is None:
                if not ref.get("optional"):
                    problems.append(
                        f"{describe(workload)}: volume {volume['name']}: ConfigMap {ref['name']} "
                        "does not exist"
                    )
                continue
            data = config_map.get("data") or {}
            items = ref.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                if item["key"] not in data:
                    problems.append(
                        f"{describe(workload)}: volume {volume['name']}: ConfigMap {ref['name']} "
                        f"has no key {item['key']}"
                    )
                    continue
                (directory / item["path"]).parent.mkdir(parents=True, exist_ok=True)
                (directory / item["path"]).write_text(data[item["key"]])
    for template in workload["spec"].get("volumeClaimTemplates", []):
        name = template["metadata"]["name"]
        dirs[name] = root / name
        dirs[name].mkdir(parents=True, exist_ok=True)
    return dirs, problems


def mount(run: Run, volume_dirs: Mapping[str, Path]) -> None:
    for item in run.container.get("volumeMounts", []):
        if item["name"] not in volume_dirs:
            run.problems.append(
                f"{run.where}: volumeMount {item['name']} refers to no volume or volumeClaimTemplate"
            )
            continue
        host = volume_dirs[item["name"]] / item.get("subPath", "")
        run.mounts.append((item["mountPath"].rstrip("/") or "/", item["name"], host))
    run.mounts.sort(key=lambda m: len(m[0]), reverse=True)


def mount_of(run: Run, path: str) -> tuple[str, str, Path] | None:
    for mount_path, volume, host in run.mounts:
        if path == mount_path or path.startswith(mount_path.rstrip("/") + "/"):
            return mount_path, volume, host
    return None


def to_host(run: Run, path: str) -> Path | None:
    found = mount_of(run, path)
    if found is None:
        return None
    mount_path, _, host = found
    return host / path[len(mount_path) :].lstrip("/")


def fake_get_node(name: str) -> dict:
    return {"metadata": {"name": name, "labels": {ZONE_KEY: SIM_ZONE, HOSTNAME_KEY: name}}}


def run_script(run: Run) -> None:
    """An init container running ``python SCRIPT``: run the real script against the pod's volumes."""
    argv = [expand(a, run.env) for a in (run.container.get("command") or []) + run.container.get("args", [])]
    script = to_host(run, argv[1]) if len(argv) > 1 else None
    if script is None or not script.is_file():
        run.problems.append(f"{run.where}: {' '.join(argv)}: the script is on no mounted volume")
        return
    module = load_script(script, f"k8s_script_{uuid.uuid4().hex}")
    env = {
        k: str(to_host(run, v)) if v.startswith("/") and mount_of(run, v) else v for k, v in run.env.items()
    }
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = module.main(env=env, get_node=fake_get_node)
    if status != 0:
        run.problems.append(f"{run.where}: {script.name} exited with {status}: {err.getvalue().strip()}")


def run_service(run: Run, entries: Mapping[str, Entry]) -> None:
    command = run.container.get("command") or []
    run.argv = [expand(a, run.env) for a in command[1:] + run.container.get("args", [])]
    run.entry = entries[run.command]
    run.problems += flag_problems(run.entry, run.argv, run.where)
    args, _ = run.entry.parse(run.argv)
    if args is None or run.entry.config_cls is None:
        return
    config_path = getattr(args, "config", None)
    if config_path is not None:
        run.config_file = to_host(run, str(config_path))
        if run.config_file is None or not run.config_file.is_file():
            run.problems.append(
                f"{run.where}: --config {config_path}: no volume provides it and no init container writes it"
            )
            return
    run.config, problems = config_problems(
        run.entry, env=run.env, args=args, file=run.config_file, where=run.where
    )
    run.problems += problems
    run.problems += shadow_problems(run.entry, env=run.env, args=args, file=run.config_file, where=run.where)


def simulate_pod(
    bundle: Bundle, workload: dict, entries: Mapping[str, Entry], root: Path, ordinal: int
) -> list[Run]:
    """Every container of one pod, init containers first (they may write what the others read)."""
    root = root / f"{workload['kind']}-{name_of(workload)}-{ordinal}"
    volume_dirs, volume_problems = materialize_volumes(bundle, workload, root)
    runs = []
    for container, is_init in containers(workload):
        run = Run(workload, container, is_init, ordinal)
        runs.append(run)
        resolve_env(bundle, run)
        mount(run, volume_dirs)
        command = container.get("command") or []
        if run.command in entries:
            run_service(run, entries)
        elif run.command.startswith("python") and is_init:
            run_script(run)
        elif not command and is_tributary_image(container):
            run.problems.append(f"{run.where}: no command: the image's default command only prints help")
        elif run.command.startswith("tributary") or is_tributary_image(container):
            run.problems.append(
                f"{run.where}: {run.command or '(none)'} is not a console script of the project "
                f"(known: {', '.join(sorted(entries))})"
            )
    if runs:
        runs[0].problems += volume_problems
    return runs


def simulate(bundle: Bundle, entries: Mapping[str, Entry], root: Path) -> list[Run]:
    runs = []
    for workload in bundle.workloads:
        ordinals = SIM_ORDINALS if workload["kind"] == "StatefulSet" else SIM_ORDINALS[:1]
        for ordinal in ordinals:
            runs += simulate_pod(bundle, workload, entries, root, ordinal)
    return runs
