#!/usr/bin/env bash
# The quick start's Spark pipeline, on a cluster that is already running (tributary cluster up):
# produce activity events with audit events, load them to Parquet by date/hour with the offline
# loader (exactly once), audit the load on local Spark, print the report. Exit status 1 if the
# audit finds records missing or duplicated.
#   bash deploy/pipeline.sh                   # 20000 events
#   bash deploy/pipeline.sh --records 5000    # any option of: python -m spark_jobs.pipeline --help
# Needs Java 17 for Spark. The output goes to $TRIBUTARY_DATA_DIR/warehouse/activity.
set -euo pipefail
cd "$(dirname "$0")/.."

python=${PYTHON:-.venv/bin/python}
export TRIBUTARY_DATA_DIR=${TRIBUTARY_DATA_DIR:-$PWD/.tributary}
if [ -z "${JAVA_HOME:-}" ] && ! command -v java >/dev/null 2>&1; then
  echo "deploy/pipeline.sh: Spark needs Java 17 (java on PATH, or JAVA_HOME); install it, e.g. apt-get install openjdk-17-jre-headless" >&2
  exit 2
fi
[ $# -gt 0 ] || set -- --records 20000
exec "$python" -m spark_jobs.pipeline "$@"
