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
