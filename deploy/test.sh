#!/usr/bin/env bash
# Set up (or reuse) the project's virtual environment, then run the checks and the test suites
# in stages, fastest first, stopping at the first stage that fails:
#   format      ruff format --check      (the formatter's output is the only layout)
#   lint        ruff check               (rules and the complexity limit in pyproject.toml)
#   types       mypy                     (the files and settings in pyproject.toml)
#   boundaries  tests/unit/test_import_boundaries.py (no service imports another, ...)
#   unit        tests/unit               (pure logic, no etcd, no processes, no Spark; 2 workers)
#   integration tests/integration        (real etcd, real service processes on loopback) and
#               tests/e2e                (a local cluster and a local Spark): two workers, an
#               integration module or the whole e2e suite each (tests/conftest.py), since their
#               tests mostly wait on processes, leases and JVMs; then the integration modules
#               marked serial alone (their assertions bound rates, latencies or lag times;
#               tests/integration/conftest.py lists them)
# Each stage prints its name and how long it took; the test stages print their 25 slowest tests.
#
#   bash deploy/test.sh              # the README's test command
#   bash deploy/test.sh --fresh      # start from a brand-new .venv (what CI does)
#   bash deploy/test.sh -k fetch     # extra arguments go to every pytest stage
#   bash deploy/test.sh -- -k fetch  # the same, everything after -- goes to pytest
set -euo pipefail
cd "$(dirname "$0")/.."

fresh=0
pytest_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --fresh) fresh=1 ;;
    --) shift; pytest_args+=("$@"); break ;;
    *) pytest_args+=("$1") ;;
  esac
  shift
done

source deploy/setup-venv.sh "$fresh"

summary=()
passed=0
skipped=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# stage NAME COMMAND...: run COMMAND, print NAME and its duration; exit on failure.
stage() {
  local name=$1 started=$SECONDS status=0
  shift
  echo
  echo "=== stage: $name"
  "$@" || status=$?
  local took=$((SECONDS - started))
  if [ "$status" -ne 0 ]; then
    echo "=== stage: $name FAILED (exit $status) after ${took} s"
    exit "$status"
  fi
  echo "=== stage: $name passed in ${took} s"
  summary+=("$(printf '%-12s %5d s' "$name" "$took")")
}

# pytest_stage PATH...: pytest over PATH with the extra arguments. When extra arguments select no
# test in this stage (pytest's exit 5), that is not a failure of the stage; without extra
# arguments every stage has tests, so exit 5 then is one.
pytest_stage() {
  local status=0 counts
  .venv/bin/python -m pytest -q --durations=25 "$@" ${pytest_args[@]+"${pytest_args[@]}"} | tee "$log" || status=$?
  counts=$(tail -n 1 "$log")
  if [[ $counts =~ ([0-9]+)\ passed ]]; then passed=$((passed + BASH_REMATCH[1])); fi
  if [[ $counts =~ ([0-9]+)\ skipped ]]; then skipped=$((skipped + BASH_REMATCH[1])); fi
  if [ "$status" -eq 5 ] && [ "${#pytest_args[@]}" -gt 0 ]; then
    echo "(no test selected by ${pytest_args[*]} here)"
    return 0
  fi
  return "$status"
}

stage format .venv/bin/ruff format --check .
stage lint .venv/bin/ruff check .
stage types .venv/bin/mypy
stage boundaries pytest_stage tests/unit/test_import_boundaries.py
# Unit tests are pure and independent: two workers (pytest-xdist), one per core.
stage unit pytest_stage -n 2 tests/unit --ignore=tests/unit/test_import_boundaries.py
stage integration pytest_stage -n 2 --dist loadfile -m "not serial" tests/integration tests/e2e
stage serial pytest_stage -m serial tests/integration

echo
echo "=== all stages passed"
printf '%s\n' "${summary[@]}"
# One closing line for the whole run (every stage passed, so nothing failed).
echo "tests: $passed passed, 0 failed, $skipped skipped"
