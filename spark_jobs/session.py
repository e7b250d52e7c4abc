"""A SparkSession ready for the tributary data source, for the jobs and the tests.

What Python workers need, found while planning: the project importable (workers unpickle the
data source classes and the SDK by module name), ``PYSPARK_PYTHON`` naming this interpreter (the
venv's, which has grpcio and pyarrow), and -- locally -- Spark bound to loopback. These are set
in the environment before the JVM starts, which is the only moment they take effect; under
``spark-submit`` the JVM already runs and the submitter's settings stand.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Mapping, MutableMapping
from pathlib import Path

#: The directory holding ``spark_jobs/``, ``gateway/``, ``services/`` and the generated code.
PROJECT_ROOT = str(Path(__file__).resolve().parents[1])

LOG4J2_CONFIG = Path(__file__).resolve().with_name("log4j2.properties")

#: Settings for a small local run: no UI, few shuffle partitions, UTC everywhere, quiet JVM logs
#: (when the log4j2 file is there: a wheel built without package data leaves it out).
LOCAL_CONF = {
    **(
        {"spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}"}
        if LOG4J2_CONFIG.is_file()
        else {}
    ),
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
    "spark.sql.pyspark.worker.logging.enabled": "true",
}


class JavaMissingError(RuntimeError):
    """Spark cannot start: no Java runtime."""


def ensure_java(environ: Mapping[str, str] | None = None) -> None:
    """Fail with a clear message, not py4j's "Java gateway process exited", when Java is absent."""
    environ = os.environ if environ is None else environ
    if not environ.get("JAVA_HOME") and shutil.which("java") is None:
        raise JavaMissingError(
            "Spark needs Java 17: put java on PATH or set JAVA_HOME "
            "(Debian: apt-get install openjdk-17-jre-headless)"
        )


def prepare_environment(environ: MutableMapping[str, str] | None = None, *, local: bool = True) -> None:
    """Make Python workers find this interpreter and this project (before the JVM starts)."""
    environ = os.environ if environ is None else environ
    environ.setdefault("PYSPARK_PYTHON", sys.executable)
    environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if local:
        environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    paths = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if PROJECT_ROOT not in paths:
        environ["PYTHONPATH"] = os.pathsep.join([PROJECT_ROOT, *paths])


def spark_session(app_name: str, *, master: str | None = None, conf: Mapping[str, str] | None = None):
    """``getOrCreate()`` a session with the tributary source registered.

    ``master`` defaults to ``$SPARK_MASTER`` or ``local[2]`` -- unless running under
    ``spark-submit``, which has already chosen one (and started the JVM: there, put the project
    on the workers' path yourself, e.g. ``PYTHONPATH=$PWD spark-submit ...``).
    """
    from pyspark.sql import SparkSession

    from spark_jobs import register

    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    master = master or os.environ.get("SPARK_MASTER") or (None if submitted else "local[2]")
    logging.getLogger("py4j").setLevel(logging.WARNING)  # one INFO line per JVM call otherwise
    if not submitted:
        ensure_java()
    prepare_environment(local=master is None or master.startswith("local"))
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for key, value in {**LOCAL_CONF, **(conf or {})}.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("TRIBUTARY_SPARK_LOG_LEVEL", "ERROR"))
    register(spark)
    return spark
