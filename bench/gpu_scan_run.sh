#!/usr/bin/env bash
# The HGRU scans on the GPU machine in one call: the HGRU kernel/module tests on CUDA (split over processes)
# while bench_scan.py compiles, then the bench table (it waits for the tests before timing).
#   OUT=/some/dir bash bench/gpu_scan_run.sh [bench_scan.py options]
# Needs the peers' wheels in .whl/ (see bench/README.md). Time limits: TESTS_S (200), BENCH_S (420).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # (also: OUT checked and created, el = seconds since the start)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fla_core*.whl \
  .whl/flash_linear*.whl .whl/accelerated_scan*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
DONE=/tmp/scan_tests_done
rm -f "$DONE"
(timeout "${BENCH_S:-420}" python3 -m bench.bench_scan --out "$OUT" --wait-for "$DONE" "$@" > "$OUT/bench_run.log" 2>&1
 echo "bench rc=$? at $(el)s" >> "$OUT/bench_run.log") &
BENCH=$!
COLLECTED=$(split_pytest scan_ids "${TEST_PROCS:-8}" "${TESTS_S:-200}" "$OUT/gpu_tests.log" \
  tests/kernels/test_hgru_triton.py tests/kernels/test_hgru_triton_lookback.py tests/modules/test_hgru.py)
touch "$DONE"
echo "tests done at $(el)s: $COLLECTED"
grep -h "passed\|failed\|FAILED\|== " "$OUT/gpu_tests.log" | tail -30
wait "$BENCH"
tail -45 "$OUT/bench_run.log"
echo "all done at $(el)s"
