#!/usr/bin/env bash
# Install the package and what the tests need into the current Python environment, then run the
# test suite. CPU only: Triton kernels run through TRITON_INTERPRET=1 (tests/conftest.py sets it
# when there is no GPU). Extra arguments go to pytest, e.g. `bash scripts/test.sh -k hgru -x`.
# The tests run in TEST_WORKERS processes (pytest-xdist; default 2, one per core of the CI machine),
# a test file per process (module fixtures are built once), the slowest files first; TEST_WORKERS=0 runs
# them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Tiny models on a small CPU run faster on one thread per process (and tests start subprocesses).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "== installing hgrn_fairseq[test,eval] into $($PYTHON -c 'import sys; print(sys.prefix)')"
$PYTHON -m pip install --quiet --progress-bar off -e ".[test,eval]"
echo "== running the tests"
WORKERS=${TEST_WORKERS:-2}
case "$WORKERS" in '' | *[!0-9]*) echo "test.sh: TEST_WORKERS='$WORKERS' is not a number (0: no worker processes)" >&2; exit 2 ;; esac
PARALLEL=()
# (files in collection order, which tests/conftest.py starts with the slowest: see SLOW_FILES_FIRST)
if [ "$WORKERS" -gt 0 ]; then PARALLEL=(-n "$WORKERS" --dist loadfile --no-loadscope-reorder); fi
exec $PYTHON -m pytest -q --durations=15 ${PARALLEL[@]+"${PARALLEL[@]}"} "$@"
