#!/usr/bin/env bash
# Install the package and what the tests need into the current Python environment, then run the
# test suite. CPU only: Triton kernels run through TRITON_INTERPRET=1 (tests/conftest.py sets it
# when there is no GPU). Extra arguments go to pytest, e.g. `bash scripts/test.sh -k hgru -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Tiny models on a small CPU run faster on one thread per process (and tests start subprocesses).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
echo "== installing hgrn_fairseq[test] into $($PYTHON -c 'import sys; print(sys.prefix)')"
$PYTHON -m pip install --quiet --progress-bar off -e ".[test]"
echo "== running the tests"
exec $PYTHON -m pytest -q --durations=15 "$@"
