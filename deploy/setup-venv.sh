# Sourced by deploy/*.sh: create .venv (fresh when $1 is 1) and install the project with its
# dev, spark and telemetry extras. Installing also generates the gRPC code from protos/.
set -euo pipefail
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "Tributary needs Python >= 3.11 (found $("$PYTHON" --version 2>&1))" >&2
  exit 1
fi
if [ "${1:-0}" = "1" ]; then rm -rf .venv; fi
stamp=.venv/.installed
if [ ! -x .venv/bin/python ] || [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ -n "$(find protos -newer "$stamp" -name '*.proto' 2>/dev/null)" ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip setuptools wheel
  .venv/bin/python -m pip install --quiet -e '.[dev,spark,telemetry]'
  touch "$stamp"
fi
# The example client in JavaScript (examples/node), which tests/integration/examples runs against
# a real cluster: its npm packages are pinned by its package-lock.json. A machine without node
# and npm cannot run it; the note below says which case this machine is, and the test holds the
# machine to it (the example must run wherever node is installed).
node_note=.venv/node-example.txt
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  if [ ! -d examples/node/node_modules ] || [ examples/node/package-lock.json -nt examples/node/node_modules ]; then
    (cd examples/node && npm ci --no-audit --no-fund --loglevel=error)
  fi
  echo "installed: node $(node --version), npm $(npm --version)" > "$node_note"
else
  echo "absent: node or npm is not installed; examples/node cannot run here" > "$node_note"
  echo "note: node/npm not found, so examples/node (the JavaScript client) is not installed" >&2
fi
