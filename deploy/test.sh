#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment and run the whole test suite.
#   bash deploy/test.sh            # the README's test command
#   bash deploy/test.sh --fresh    # start from a brand-new .venv (what CI does)
#   bash deploy/test.sh -- -k fetch  # extra pytest arguments after --
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) fresh=1 ;;
    --) shift; pytest_args=("$@"); break ;;
    *) pytest_args+=("$1") ;;
  esac
  shift
done

source deploy/setup-venv.sh "$fresh"
exec .venv/bin/python -m pytest -q "${pytest_args[@]}"
