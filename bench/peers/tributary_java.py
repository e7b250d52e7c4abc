"""Tributary's producer experiments through Java stubs generated from ``protos/`` (grpc-java).

The issue asks for a generated gRPC stub in another language "if the toolchain and registry allow".
Maven Central and the Go module proxy are not reachable from this machine, but Debian packages
everything needed, so the build is offline:

* ``protoc`` 3.21 (``protobuf-compiler``) with ``protoc-gen-grpc-java`` 1.41
  (``protobuf-compiler-grpc-java-plugin``, installed as ``/usr/bin/grpc_java_plugin``) generate
  ``dev.tributary.v1`` from ``protos/tributary/v1/{common,admin,groups,gateway}.proto``;
* ``javac`` (the machine's JDK 17) compiles them with ``bench/peers/java/TributaryJavaBench.java``
  against the Debian jars in ``/usr/share/java``: grpc-java 1.41 (``libgrpc-java``), protobuf-java
  3.21 (``libprotobuf-java``), Netty 4.1 (``libnetty-java``), perfmark (``libperfmark-java``),
  Guava, OpenCensus.

The build goes to ``~/.cache/tributary-bench/java/<hash of the sources>`` and is reused.

    apt-get install -y --no-install-recommends protobuf-compiler protobuf-compiler-grpc-java-plugin \\
        libgrpc-java libprotobuf-java libnetty-java libperfmark-java libgeronimo-annotation-1.3-spec-java
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

from bench.peers import Dest, Meter, command_output, deb_version

ROOT = Path(__file__).resolve().parents[2]
SOURCE = Path(__file__).resolve().parent / "java" / "TributaryJavaBench.java"
PROTOS = [
    "tributary/v1/common.proto",
    "tributary/v1/admin.proto",
    "tributary/v1/groups.proto",
    "tributary/v1/gateway.proto",
]
JARS = [
    "grpc-api",
    "grpc-core",
    "grpc-context",
    "grpc-stub",
    "grpc-protobuf",
    "grpc-protobuf-lite",
    "grpc-netty",
    "protobuf",
    "guava",
    "failureaccess",
    "perfmark-api",
    "opencensus-api",
    "netty-buffer",
    "netty-codec",
    "netty-codec-http",
    "netty-codec-http2",
    "netty-common",
    "netty-handler",
    "netty-resolver",
    "netty-transport",
    "error_prone_annotations",
    "jsr305",
    "animal-sniffer-annotations",
    "geronimo-annotation-1.3-spec",
]  # javax.annotation.Generated, gone from the JDK since 11
DEBIAN = (
    "protobuf-compiler",
    "protobuf-compiler-grpc-java-plugin",
    "libgrpc-java",
    "libprotobuf-java",
    "libnetty-java",
    "libperfmark-java",
    "libgeronimo-annotation-1.3-spec-java",
)
PLUGIN = "/usr/bin/grpc_java_plugin"


def classpath_jars() -> list[Path]:
    found = []
    for name in JARS:
        jar = Path("/usr/share/java") / f"{name}.jar"
        if jar.exists():
            found.append(jar)
    return found


def missing() -> str | None:
    needed = {
        "protoc": shutil.which("protoc"),
        "javac": shutil.which("javac"),
        "java": shutil.which("java"),
        PLUGIN: PLUGIN if Path(PLUGIN).exists() else None,
    }
    absent = [name for name, where in needed.items() if not where]
    jars = {j.stem for j in classpath_jars()}
    absent += [
        f"/usr/share/java/{j}.jar"
        for j in ("grpc-core", "grpc-netty", "protobuf", "netty-codec-http2", "perfmark-api")
        if j not in jars
    ]
    if absent:
        return (
            "missing "
            + ", ".join(absent)
            + "; install with: apt-get install -y --no-install-recommends "
            + " ".join(DEBIAN)
        )
    return None


def versions() -> dict[str, str]:
    return {
        "protoc": command_output(["protoc", "--version"]),
        "grpc-java (deb)": deb_version("libgrpc-java"),
        "protobuf-java (deb)": deb_version("libprotobuf-java"),
        "netty (deb)": deb_version("libnetty-java"),
        "javac": command_output(["javac", "-version"]),
    }


def build_dir() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes())
    for proto in PROTOS:
        digest.update((ROOT / "protos" / proto).read_bytes())
    return Path.home() / ".cache" / "tributary-bench" / "java" / digest.hexdigest()[:16]


def build(progress=lambda message: None) -> Path:
    out = build_dir()
    if (out / "classes" / "TributaryJavaBench.class").exists():
        return out
    generated, classes = out / "generated", out / "classes"
    shutil.rmtree(out, ignore_errors=True)
    generated.mkdir(parents=True)
    classes.mkdir()
    run(
        [
            "protoc",
            f"--plugin=protoc-gen-grpc-java={PLUGIN}",
            f"-I{ROOT / 'protos'}",
            f"--java_out={generated}",
            f"--grpc-java_out={generated}",
            *PROTOS,
        ]
    )
    sources = [str(p) for p in generated.rglob("*.java")] + [str(SOURCE)]
    progress(f"  javac: {len(sources)} files")
    run(
        [
            "javac",
            "-nowarn",
            "-encoding",
            "UTF-8",
            "-d",
            str(classes),
            "-cp",
            ":".join(map(str, classpath_jars())),
            *sources,
        ]
    )
    return out


def run(cmd: list[str]) -> None:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(
            f"{cmd[0]} failed ({result.returncode}): {(result.stderr or result.stdout)[-1500:]}"
        )


def produce(
    servers: str, dest: Dest, mode: str, count: int, meter: Meter, *, acks=1, in_flight: int = 1
) -> None:
    """Run the Java producer against ``dest`` (partition 0); fills ``meter`` from its output."""
    from gateway.client import Admin, NewTopic

    warmup = f"{dest.name}-jit-warmup"
    with Admin(servers=servers) as admin:
        admin.create_topics([NewTopic(warmup, 1)])
    out = build()
    cmd = [
        "java",
        "-Xms256m",
        "-Xmx512m",
        "-cp",
        ":".join([str(out / "classes"), *map(str, classpath_jars())]),
        "TributaryJavaBench",
        servers.split(",")[0],
        dest.name,
        warmup,
        mode,
        str(count),
        str(acks),
        str(in_flight),
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples = [(0.0, 0)]
    done = None
    assert proc.stdout is not None and proc.stderr is not None  # both PIPE
    try:
        for line in proc.stdout:
            parts = line.split()
            if parts and parts[0] == "START":
                meter.start()
            elif parts and parts[0] == "S":
                samples.append((float(parts[1]), int(parts[2])))
            elif parts and parts[0] == "DONE":
                done = (float(parts[1]), int(parts[2]))
        proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        with Admin(servers=servers) as admin:
            admin.delete_topics([warmup])
    if proc.returncode != 0 or done is None:
        raise RuntimeError(f"java client failed ({proc.returncode}): {proc.stderr.read()[-1500:]}")
    meter.count = done[1]
    meter.samples = samples + [(done[0], done[1])]
    meter.elapsed = done[0]
