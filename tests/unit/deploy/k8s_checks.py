"""Kubernetes manifests under deploy/k8s: parse them, assemble a kustomization, check the wiring.

:func:`bundle_problems` takes the objects of one deployment (the base assembled here, or an
overlay rendered by ``kubectl kustomize``) and checks them against each other and against the
code. Besides reference checks (volume mounts, Service selectors and target ports, PDB and
StatefulSet selectors, ConfigMaps, RBAC subjects) it *simulates* every pod: it materializes the
pod's volumes in a temporary directory, runs the storage pods' init step (the real script, with a
fake API server), expands the environment (ConfigMaps, downward API) and the command line, and
builds each service's settings exactly as the service would (``services.config.load_config``).
The wiring checks then look at those settings: the ports the service binds against the container
ports, probes and Services; the addresses it dials (coordinators, etcd) against the Services and
StatefulSets that should answer; its data directories against the persistent volumes; its node id
and rack against the pod ordinal and zone.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from tests.unit.deploy.k8s_objects import (
    K8S,
    KUSTOMIZE_KINDS,
    WORKLOAD_KINDS,
    Bundle,
    assemble,
    claim_volumes,
    container_ports,
    containers,
    describe,
    has_port,
    image_name,
    is_tributary_image,
    kustomization,
    load_docs,
    name_of,
    pod_labels,
    pod_spec,
    replicas_of,
    selects,
    yaml_files,
)
from tests.unit.deploy.k8s_pods import (
    HOSTNAME_KEY,
    SIM_ORDINALS,
    SIM_ZONE,
    ZONE_KEY,
    Run,
    expand,
    mount_of,
    pod_name,
    simulate,
)
from tests.unit.deploy.wiring_checks import (
    Entry,
    env_name_problems,
    host_problems,
    port_fields,
    split_address,
    topic_config_problems,
)

#: Settings holding addresses a service dials, and the command that must answer there.
ADDRESS_FIELDS = {"coordinators": "tributary-coordinator", "etcd_endpoints": "etcd"}
#: The least a tributary pod may give its process between SIGTERM and SIGKILL (graceful flush).
MIN_GRACE_S = 30


def parse_problems(root: Path = K8S) -> list[str]:
    """Every YAML file parses; every document is a Kubernetes object (or a kustomization)."""
    problems = []
    for path in yaml_files(root):
        where = str(path.relative_to(root))
        try:
            docs = load_docs(path)
        except yaml.YAMLError as exc:
            problems.append(f"{where}: not YAML: {exc}")
            continue
        if not docs:
            problems.append(f"{where}: no documents")
        for index, doc in enumerate(docs):
            if not isinstance(doc, dict) or not doc.get("apiVersion") or not doc.get("kind"):
                problems.append(f"{where}#{index}: not a Kubernetes object (apiVersion and kind)")
            elif doc["kind"] not in KUSTOMIZE_KINDS and not (doc.get("metadata") or {}).get("name"):
                problems.append(f"{where}#{index}: {doc['kind']} without metadata.name")
    return problems


def _patch_docs(directory: Path, patch: Mapping) -> list[dict]:
    if "path" in patch:
        return load_docs(directory / patch["path"])
    return [doc for doc in yaml.safe_load_all(patch.get("patch", "")) if isinstance(doc, dict)]


def kustomization_problems(directory: Path) -> list[str]:
    """References of a kustomization: files exist, patch/replica/image targets exist below it."""
    where = str(directory.relative_to(K8S)) if directory.is_relative_to(K8S) else str(directory)
    path = directory / "kustomization.yaml"
    if not path.exists():
        return [f"{where}: no kustomization.yaml"]
    k = kustomization(directory)
    problems, below = _reference_problems(directory, where, k)
    for generator in k.get("configMapGenerator", []):
        for spec in generator.get("files", []):
            if not (directory / spec.rpartition("=")[2]).is_file():
                problems.append(f"{where}: configMapGenerator {generator.get('name')}: no file {spec}")
    if k.get("kind") == "Component" or problems:
        return problems  # a component's targets live in whatever includes it
    return _target_problems(directory, where, k, below)


def _reference_problems(directory: Path, where: str, k: Mapping) -> tuple[list[str], list[dict]]:
    """Resources and components that are missing; the objects of those that exist."""
    problems = []
    below: list[dict] = []
    for key in ("resources", "components"):
        for ref in k.get(key, []):
            target = directory / ref
            if target.is_dir():
                if not (target / "kustomization.yaml").exists():
                    problems.append(f"{where}: {key} {ref} has no kustomization.yaml")
                else:
                    below += assemble(target) if key == "resources" else []
            elif target.is_file():
                below += load_docs(target)
            else:
                problems.append(f"{where}: {key} {ref} does not exist")
    return problems, below


def _target_problems(directory: Path, where: str, k: Mapping, below: list[dict]) -> list[str]:
    """Patches, replicas and images that name nothing among the resources."""
    problems = []
    ids = {(o["kind"], o["metadata"]["name"]) for o in below if "metadata" in o}
    for patch in k.get("patches", []):
        if "path" in patch and not (directory / patch["path"]).is_file():
            problems.append(f"{where}: patch {patch['path']} does not exist")
            continue
        for doc in _patch_docs(directory, patch):
            target = (doc.get("kind"), (doc.get("metadata") or {}).get("name"))
            if target not in ids:
                problems.append(
                    f"{where}: patch {patch.get('path', '(inline)')} targets {target[0]} "
                    f"{target[1]}, which is not among the resources"
                )
    workloads = {name for kind, name in ids if kind in WORKLOAD_KINDS}
    for replica in k.get("replicas", []):
        if replica.get("name") not in workloads:
            problems.append(f"{where}: replicas for {replica.get('name')}: no such Deployment/StatefulSet")
    images = {image_name(c.get("image", "")) for o in below for c, _ in containers(o)}
    for image in k.get("images", []):
        if image.get("name") not in images:
            problems.append(f"{where}: images entry {image.get('name')} matches no container image")
    return problems


def bundle_problems(objects: Iterable[dict], entries: Mapping[str, Entry], root: Path) -> list[str]:
    """Everything wrong with one deployment's objects (``root``: scratch directory)."""
    bundle = Bundle(copy.deepcopy(list(objects)))
    runs = simulate(bundle, entries, root)
    # Problems of the simulation itself are reported once (for the last ordinal simulated).
    last = {}
    for run in runs:
        last[(describe(run.workload), run.container.get("name"))] = run
    services = [run for run in last.values() if run.config is not None]
    problems = [p for run in last.values() for p in run.problems]
    problems += uniqueness_problems(bundle)
    problems += config_map_env_problems(bundle, entries)
    for workload in bundle.workloads:
        problems += workload_problems(bundle, workload)
    for service in bundle.of_kind("Service"):
        problems += service_problems(bundle, service)
    problems += pdb_problems(bundle)
    problems += rbac_problems(bundle)
    problems += image_problems(bundle, entries)
    for run in services:
        problems += service_wiring_problems(bundle, run)
    problems += identity_problems(runs)
    problems += spread_problems(bundle, services)
    problems += consistency_problems(services)
    for run in last.values():
        if run.command == "etcd":
            problems += etcd_problems(bundle, run)
    return list(dict.fromkeys(problems))


def uniqueness_problems(bundle: Bundle) -> list[str]:
    seen, problems = set(), []
    for obj in bundle.objects:
        key = (obj["kind"], name_of(obj))
        if key in seen:
            problems.append(f"{describe(obj)} is defined twice")
        seen.add(key)
    return problems


def config_map_env_problems(bundle: Bundle, entries: Mapping[str, Entry]) -> list[str]:
    """ConfigMaps loaded as environment, and container env names, must be real settings."""
    problems = []
    loaded = {
        ref["configMapRef"]["name"]
        for w in bundle.workloads
        for c, _ in containers(w)
        for ref in c.get("envFrom", [])
        if "configMapRef" in ref
    }
    for name in sorted(loaded):
        config_map = bundle.get("ConfigMap", name)
        if config_map is not None:
            problems += env_name_problems((config_map.get("data") or {}), entries, f"ConfigMap/{name}")
    for workload in bundle.workloads:
        for container, _ in containers(workload):
            names = [item["name"] for item in container.get("env", [])]
            problems += env_name_problems(
                names, entries, f"{describe(workload)} container {container['name']}"
            )
    return problems


def workload_problems(bundle: Bundle, workload: dict) -> list[str]:
    where = describe(workload)
    problems = []
    spec, labels = pod_spec(workload), pod_labels(workload)
    selector = workload["spec"].get("selector") or {}
    if not selects(selector, labels):
        problems.append(f"{where}: spec.selector does not match the pod template's labels")
    for other in bundle.workloads:
        if other is not workload and selects(selector, pod_labels(other)):
            problems.append(f"{where}: spec.selector also matches the pods of {describe(other)}")
    if workload["kind"] == "StatefulSet":
        problems += statefulset_problems(bundle, workload)
    security = spec.get("securityContext") or {}
    if not security.get("runAsNonRoot"):
        problems.append(f"{where}: pod securityContext.runAsNonRoot is not true")
    account = spec.get("serviceAccountName")
    if account and account != "default" and bundle.get("ServiceAccount", account) is None:
        problems.append(f"{where}: serviceAccountName {account} does not exist")
    runs_tributary = any(is_tributary_image(c) for c, _ in containers(workload))
    if runs_tributary and int(spec.get("terminationGracePeriodSeconds", 30)) < MIN_GRACE_S:
        problems.append(
            f"{where}: terminationGracePeriodSeconds below {MIN_GRACE_S}: no time for a graceful flush"
        )
    for container, is_init in containers(workload):
        problems += container_problems(where, container, is_init)
    return problems


def container_problems(where: str, container: Mapping, is_init: bool) -> list[str]:
    where = f"{where} container {container.get('name')}"
    problems = []
    resources = container.get("resources") or {}
    for kind in ("requests", "limits"):
        missing = {"cpu", "memory"} - set(resources.get(kind) or {})
        if missing:
            problems.append(f"{where}: no resources.{kind} for {', '.join(sorted(missing))}")
    image = container.get("image", "")
    tag = image.rsplit("/", 1)[-1]
    if "@" not in image and (":" not in tag or tag.endswith(":latest")):
        problems.append(f"{where}: image {image!r} is not pinned to a tag")
    if (container.get("securityContext") or {}).get("allowPrivilegeEscalation") is not False:
        problems.append(f"{where}: securityContext.allowPrivilegeEscalation is not false")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        if probe is None:
            continue
        if is_init:
            problems.append(f"{where}: init containers cannot have a {probe_name}")
        for handler in ("grpc", "httpGet", "tcpSocket"):
            if handler in probe and not has_port(container, probe[handler].get("port")):
                problems.append(
                    f"{where}: {probe_name} {handler} port {probe[handler].get('port')} is not a "
                    "container port"
                )
    return problems


def statefulset_problems(bundle: Bundle, workload: dict) -> list[str]:
    where = describe(workload)
    name = workload["spec"].get("serviceName")
    service = bundle.get("Service", name) if name else None
    if service is None:
        return [f"{where}: serviceName {name!r} is not a Service"]
    problems = []
    if service["spec"].get("clusterIP") != "None":
        problems.append(f"{where}: serviceName {name} is not a headless Service (clusterIP: None)")
    if not selects(service["spec"].get("selector"), pod_labels(workload)):
        problems.append(f"{where}: its headless Service {name} does not select its pods")
    return problems


def service_problems(bundle: Bundle, service: dict) -> list[str]:
    where = describe(service)
    selector = service["spec"].get("selector")
    matched = bundle.selected(selector)
    if not matched:
        return [f"{where}: selector {selector} matches no pods"]
    problems = []
    for port in service["spec"].get("ports", []):
        target = port.get("targetPort", port["port"])
        for workload in matched:
            serving = [c for c, is_init in containers(workload) if not is_init]
            if not any(has_port(c, target) for c in serving):
                problems.append(
                    f"{where}: port {port.get('name', port['port'])} targets {target!r}, which no "
                    f"container of {describe(workload)} declares"
                )
    return problems


def pdb_problems(bundle: Bundle) -> list[str]:
    problems: list[str] = []
    covered: set[str] = set()
    for pdb in bundle.of_kind("PodDisruptionBudget"):
        matched = bundle.selected(pdb["spec"].get("selector"))
        if len(matched) != 1:
            problems.append(f"{describe(pdb)}: selector matches {len(matched)} workloads (want exactly one)")
        covered.update(describe(w) for w in matched)
        if "minAvailable" not in pdb["spec"] and "maxUnavailable" not in pdb["spec"]:
            problems.append(f"{describe(pdb)}: neither minAvailable nor maxUnavailable")
    for workload in bundle.workloads:
        if describe(workload) not in covered:
            problems.append(f"{describe(workload)}: no PodDisruptionBudget selects its pods")
    return problems


def rbac_problems(bundle: Bundle) -> list[str]:
    problems = []
    for binding in bundle.of_kind("RoleBinding", "ClusterRoleBinding"):
        ref = binding["roleRef"]
        if not ref["name"].startswith("system:") and bundle.get(ref["kind"], ref["name"]) is None:
            problems.append(f"{describe(binding)}: roleRef {ref['kind']}/{ref['name']} does not exist")
        for subject in binding.get("subjects", []):
            if subject.get("kind") != "ServiceAccount":
                continue
            account = bundle.get("ServiceAccount", subject["name"])
            if account is None:
                problems.append(
                    f"{describe(binding)}: subject ServiceAccount {subject['name']} does not exist"
                )
                continue
            namespace = account["metadata"].get("namespace")
            if namespace is not None and subject.get("namespace") != namespace:
                problems.append(
                    f"{describe(binding)}: subject {subject['name']} is in namespace "
                    f"{subject.get('namespace')}, the ServiceAccount in {namespace}"
                )
    return problems


def image_problems(bundle: Bundle, entries: Mapping[str, Entry]) -> list[str]:
    images = {
        str(c.get("image")) for w in bundle.workloads for c, _ in containers(w) if is_tributary_image(c)
    }
    if len(images) > 1:
        return [f"tributary containers use different images: {', '.join(sorted(images))}"]
    return []


def service_wiring_problems(bundle: Bundle, run: Run) -> list[str]:
    """A service container's settings against its container, probes, volumes and peers."""
    where, config = run.where, run.config
    problems = host_problems(config, where) + topic_config_problems(config, where)
    problems += _port_problems(run) + _probe_problems(run)
    problems += data_dir_problems(run) + tls_file_problems(bundle, run)
    for name, answers in ADDRESS_FIELDS.items():
        for address in getattr(config, name, None) or []:
            problems += address_problems(bundle, address, answers, f"{where}: {name} {address}")
    return problems


def _port_problems(run: Run) -> list[str]:
    """The ports the settings bind against the container's declared ports, both ways."""
    where, config, container = run.where, run.config, run.container
    problems = []
    ports = port_fields(config)
    declared = container_ports(container)
    for name, value in ports.items():
        if value == 0:
            problems.append(f"{where}: {name} is 0 (any free port): Services and probes need a fixed port")
        elif value not in declared:
            problems.append(
                f"{where}: {run.command} binds {name}={value}, the container declares {sorted(declared)}"
            )
    for number in declared:
        if number not in ports.values():
            problems.append(f"{where}: container port {number} is bound by no setting of {run.command}")
    return problems


def _tls_only(config) -> bool:
    """Whether the service's gRPC port speaks TLS only (internal or public TLS)."""
    if getattr(config, "internal_tls_require_client_cert", None) is not None:  # internal ports
        return config.internal_tls_cert_file is not None
    return getattr(config, "tls_cert_file", None) is not None


def _probe_problems(run: Run) -> list[str]:
    """Readiness and liveness probes exist, and every probe is a grpc probe of the gRPC port --
    or of the plaintext health-only port when there is one (the kubelet's gRPC probes speak
    plaintext only, so a TLS-only gRPC port needs it)."""
    where, config, container = run.where, run.config, run.container
    probed = config.health_port if getattr(config, "health_port", None) is not None else config.port
    problems = []
    if _tls_only(config) and probed == config.port:
        problems.append(
            f"{where}: the gRPC port {config.port} is TLS only and the kubelet's gRPC probes speak "
            "plaintext: set health_port and probe it"
        )
    for probe_name in ("readinessProbe", "livenessProbe"):
        if probe_name not in container:
            problems.append(f"{where}: no {probe_name}")
    for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
        probe = container.get(probe_name)
        if probe is None:
            continue
        if "grpc" not in probe:
            problems.append(
                f"{where}: {probe_name} is not a grpc probe (every service serves grpc.health.v1)"
            )
        elif probe["grpc"].get("port") != probed:
            problems.append(
                f"{where}: {probe_name} probes port {probe['grpc'].get('port')}, the "
                f"{'health' if probed != config.port else 'gRPC'} port is {probed}"
            )
    return problems


#: Settings naming certificate and key files.
TLS_FILE_FIELDS = (
    "internal_tls_cert_file",
    "internal_tls_key_file",
    "internal_tls_ca_file",
    "tls_cert_file",
    "tls_key_file",
    "tls_client_ca_file",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
)


def tls_file_problems(bundle: Bundle, run: Run) -> list[str]:
    """Certificate and key files come from a Secret volume (mounted whole: a subPath mount
    never sees the Secret's updates, so a rotation would not reach the service)."""
    problems = []
    volumes = {v["name"]: v for v in pod_spec(run.workload).get("volumes", [])}
    for name in TLS_FILE_FIELDS:
        path = getattr(run.config, name, None)
        if path is None:
            continue
        found = mount_of(run, str(path))
        volume = volumes.get(found[1]) if found is not None else None
        if found is None or volume is None or "secret" not in volume:
            problems.append(f"{run.where}: {name} {path} is on no Secret volume")
            continue
        mounts = [m for m in run.container.get("volumeMounts", []) if m["name"] == found[1]]
        if any(m.get("subPath") for m in mounts):
            problems.append(f"{run.where}: {name} {path}: its Secret is mounted with subPath (no rotation)")
    return problems


def data_dir_problems(run: Run) -> list[str]:
    problems = []
    persistent = claim_volumes(run.workload)
    for directory in getattr(run.config, "log_dirs", None) or []:
        found = mount_of(run, str(directory))
        if found is None or found[1] not in persistent:
            problems.append(
                f"{run.where}: log dir {directory} is not on a persistent volume: its data would "
                "go with the pod"
            )
    return problems


def address_problems(bundle: Bundle, address: str, answers: str, where: str) -> list[str]:
    """A dialled address must reach a container running ``answers``, on a port it declares.

    ``svc[.ns...]:port`` goes through the Service's port and targetPort; ``pod.svc[...]:port``
    (a StatefulSet pod behind its headless Service) straight to the pod. Names of three labels or
    more that are not ours are taken as external (an etcd outside the cluster, say).
    """
    host, port = split_address(address)
    if port is None:
        return [f"{where}: not host:port"]
    labels = host.split(".")
    service = bundle.get("Service", labels[0])
    targets: list[tuple[dict, dict]] = []
    if service is not None:
        entry = next((p for p in service["spec"].get("ports", []) if p["port"] == port), None)
        if entry is None:
            return [f"{where}: Service {labels[0]} has no port {port}"]
        target = entry.get("targetPort", port)
        targets = [
            (w, c)
            for w in bundle.selected(service["spec"].get("selector"))
            for c, init in containers(w)
            if not init and has_port(c, target)
        ]
    elif len(labels) >= 2 and bundle.get("Service", labels[1]) is not None:
        stateful = [w for w in bundle.of_kind("StatefulSet") if w["spec"].get("serviceName") == labels[1]]
        pods = {pod_name(w, i): w for w in stateful for i in range(replicas_of(w))}
        if labels[0] not in pods:
            return [
                f"{where}: {labels[0]} is not a pod of a StatefulSet behind Service {labels[1]} "
                f"(pods: {', '.join(sorted(pods)) or 'none'})"
            ]
        workload = pods[labels[0]]
        targets = [(workload, c) for c, init in containers(workload) if not init and has_port(c, port)]
    elif len(labels) <= 2:
        return [f"{where}: {host} is not a Service or StatefulSet pod of this deployment"]
    else:
        return []  # outside the cluster
    if not targets:
        return [f"{where}: no container listens there"]
    if not any(Path((c.get("command") or [""])[0]).name == answers for _, c in targets):
        found = sorted({(c.get("command") or ["?"])[0] for _, c in targets})
        return [f"{where}: reaches {', '.join(found)}, not {answers}"]
    return []


def identity_problems(runs: list[Run]) -> list[str]:
    """Storage nodes: node id from the pod ordinal, rack from the zone of the pod's node."""
    problems = []
    by_container: dict[tuple[str, str], dict[int, Run]] = {}
    for run in runs:
        if (
            run.config is not None
            and hasattr(run.config, "node_id")
            and run.workload["kind"] == "StatefulSet"
        ):
            by_container.setdefault((describe(run.workload), run.container["name"]), {})[run.ordinal] = run
    for by_ordinal in by_container.values():
        if set(by_ordinal) != set(SIM_ORDINALS):
            continue  # a pod that could not start is reported already
        first, last = by_ordinal[SIM_ORDINALS[0]], by_ordinal[SIM_ORDINALS[-1]]
        step = SIM_ORDINALS[-1] - SIM_ORDINALS[0]
        if last.config.node_id - first.config.node_id != step:
            problems.append(
                f"{last.where}: node_id does not follow the pod ordinal (pods "
                f"{SIM_ORDINALS[0]} and {SIM_ORDINALS[-1]} get {first.config.node_id} and "
                f"{last.config.node_id})"
            )
        if hasattr(last.config, "rack") and last.config.rack != SIM_ZONE:
            problems.append(
                f"{last.where}: rack is {last.config.rack!r}, not the zone of the pod's node "
                f"({SIM_ZONE!r} in the simulation)"
            )
    return problems


def consistency_problems(runs: list[Run]) -> list[str]:
    """Every service of one deployment: one cluster name, one etcd."""
    problems = []
    for name in ("cluster", "etcd_endpoints"):
        values: dict = {}
        for run in runs:
            if hasattr(run.config, name):
                value = getattr(run.config, name)
                values.setdefault(tuple(sorted(value)) if isinstance(value, list) else value, []).append(
                    run.where
                )
        if len(values) > 1:
            detail = "; ".join(f"{v} ({', '.join(sorted(set(w)))})" for v, w in values.items())
            problems.append(f"services disagree on {name}: {detail}")
    return problems


def spread_problems(bundle: Bundle, runs: list[Run]) -> list[str]:
    """Rack-aware services (a ``rack`` setting) spread one pod per machine, across zones."""
    problems, seen = [], set()
    for run in runs:
        if run.config is None or not hasattr(run.config, "rack") or describe(run.workload) in seen:
            continue
        seen.add(describe(run.workload))
        spec, labels, where = pod_spec(run.workload), pod_labels(run.workload), describe(run.workload)
        anti = ((spec.get("affinity") or {}).get("podAntiAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution", []
        )
        if not any(
            t.get("topologyKey") == HOSTNAME_KEY and selects(t.get("labelSelector"), labels) for t in anti
        ):
            problems.append(f"{where}: no required pod anti-affinity on {HOSTNAME_KEY} against its own pods")
        spread = spec.get("topologySpreadConstraints", [])
        if not any(
            t.get("topologyKey") == ZONE_KEY and selects(t.get("labelSelector"), labels) for t in spread
        ):
            problems.append(f"{where}: no topologySpreadConstraint on {ZONE_KEY} for its own pods")
    return problems


def etcd_problems(bundle: Bundle, run: Run) -> list[str]:
    """A statically bootstrapped etcd StatefulSet: members, names and URLs agree with the set."""
    where, workload = run.where, run.workload
    if workload["kind"] != "StatefulSet":
        return [f"{where}: etcd should run as a StatefulSet (stable member names and volumes)"]
    argv = [
        expand(a, run.env) for a in (run.container.get("command") or [])[1:] + run.container.get("args", [])
    ]
    flags = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
    service, replicas, me = (
        workload["spec"].get("serviceName"),
        replicas_of(workload),
        pod_name(workload, run.ordinal),
    )
    problems = []
    if flags.get("name") != me:
        problems.append(f"{where}: --name is {flags.get('name')!r}, not the pod name {me!r}")
    problems += _etcd_member_problems(run, flags, service, replicas)
    problems += _etcd_url_problems(run, flags, service, me)
    headless = bundle.get("Service", service) or {"spec": {}}
    if not headless["spec"].get("publishNotReadyAddresses"):
        problems.append(
            f"Service/{service}: etcd peers must resolve before they are ready "
            "(publishNotReadyAddresses: true)"
        )
    return problems


def _etcd_member_problems(run: Run, flags: Mapping[str, str], service: str, replicas: int) -> list[str]:
    """--initial-cluster names every pod of the set, each at its name behind the Service."""
    where, workload = run.where, run.workload
    problems = []
    members = dict(m.split("=", 1) for m in flags.get("initial-cluster", "").split(",") if "=" in m)
    wanted = {pod_name(workload, i) for i in range(replicas)}
    if set(members) != wanted:
        problems.append(
            f"{where}: --initial-cluster lists {sorted(members)}, the StatefulSet has {sorted(wanted)}"
        )
    for member, url in members.items():
        host, port = split_address(url)
        if host.split(".")[:2] != [member, service]:
            problems.append(f"{where}: member {member} at {url} is not {member}.{service}")
        if not has_port(run.container, port or -1):
            problems.append(f"{where}: member {member} peer port {port} is not a container port")
    return problems


def _etcd_url_problems(run: Run, flags: Mapping[str, str], service: str, me: str) -> list[str]:
    """Advertised URLs name this pod; every URL listened on or advertised is a container port."""
    where = run.where
    problems = []
    for flag in ("initial-advertise-peer-urls", "advertise-client-urls"):
        for url in flags.get(flag, "").split(","):
            host, _port = split_address(url)
            if host.split(".")[:2] != [me, service]:
                problems.append(f"{where}: --{flag} {url} is not this pod's name behind {service}")
    for flag in (
        "listen-client-urls",
        "listen-peer-urls",
        "listen-metrics-urls",
        "advertise-client-urls",
        "initial-advertise-peer-urls",
    ):
        for url in filter(None, flags.get(flag, "").split(",")):
            if not has_port(run.container, split_address(url)[1] or -1):
                problems.append(f"{where}: --{flag} {url}: port is not a container port")
    return problems
