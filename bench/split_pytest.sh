# Sourced by the GPU-machine scripts (bench/gpu_checks.sh, bench/gpu_scan_run.sh, bench/gpu_hgrn2_run.sh),
# from the repository root.
#
# Sourcing also checks that OUT names a results folder (and creates it), and starts the clock that
# ``el`` reads (seconds since the script started).
#
# split_pytest NAME PROCS LIMIT_S LOG [pytest selection ...]
#   Collects the selected tests and runs them in PROCS pytest processes at once (so that Triton
#   compiles in parallel), each under a LIMIT_S time limit; the processes' logs, each ending in
#   "== FILE rc=N", are concatenated into LOG; prints how many tests were collected. Environment
#   assignments before the call (e.g. HGRN2_AUTOTUNE=0 split_pytest ...) reach the test processes.
#   Each process runs torch single-threaded (OMP_NUM_THREADS=1: PROCS processes of one thread each
#   instead of PROCS x cores spinning threads competing with Triton's compiler) and logs each test's
#   time as it finishes to LOG.times (tests/conftest.py), which survives a process killed at the limit.
split_pytest() {
  local name=$1 procs=$2 limit=$3 log=$4 f
  shift 4
  : > "$log.times"
  PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 python3 -m pytest -q --collect-only -p no:cacheprovider -m "" "$@" 2>/dev/null \
    | grep '::' > "/tmp/$name"
  rm -f "/tmp/$name".?? "/tmp/$name".??.log
  split -n r/"$procs" "/tmp/$name" "/tmp/$name."
  local pids=()
  for f in "/tmp/$name".??; do
    # fewer tests than processes: an empty share would make xargs run pytest with no selection (every test)
    [ -s "$f" ] || { rm -f "$f"; continue; }
    (OMP_NUM_THREADS=1 HGRN_TEST_TIMES="$log.times" PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 timeout "$limit" xargs -a "$f" python3 -m pytest -q -p no:cacheprovider -m "" -rfEs \
       > "$f.log" 2>&1; echo "== $f rc=$?" >> "$f.log") &
    pids+=($!)
  done
  wait "${pids[@]}"
  cat "/tmp/$name".??.log > "$log"
  echo "$(grep -c '' "/tmp/$name") collected"
}

: "${OUT:?set OUT to a results folder}"
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
