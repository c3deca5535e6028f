#!/usr/bin/env bash
# Install the package and what the tests need into the current Python environment, then run the
# test suite in two sets: the fast set (plain `pytest`: units, modules, kernels under the Triton
# interpreter) and the integration set (`pytest -m integration`: command-line tools end to end, several
# processes, slow tests; pytest.ini and tests/conftest.py say which). Both run even if the first fails;
# the last lines give each set's counts, and the exit status is non-zero if either failed.
# CPU only: Triton kernels run through TRITON_INTERPRET=1 (tests/conftest.py sets it when there is no GPU).
# Extra arguments go to both runs, e.g. `bash scripts/test.sh -k hgru -x`.
# Each set runs in TEST_WORKERS processes (pytest-xdist; default 2, one per core of the CI machine), a test
# file per process (module fixtures are built once); TEST_WORKERS=0 runs them in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
# Tiny models on a small CPU run faster on one thread per process (and tests start subprocesses).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# TORCH_CPU=1: on a machine without a GPU, install torch's CPU build first (pip's default torch wheel
# brings ~5 GB of CUDA libraries), then check that the package's install kept it. An installed torch is
# kept. TORCH_INDEX_URL: where the CPU build comes from (its torchvision must match it).
CPU_TORCH=0
if [ "${TORCH_CPU:-0}" = 1 ] && ! $PYTHON -c "import torch" >/dev/null 2>&1; then
    CPU_TORCH=1
    TORCH_INDEX_URL=${TORCH_INDEX_URL:-https://download.pytorch.org/whl/cpu}
    echo "== installing torch's CPU build (and torchvision) from $TORCH_INDEX_URL"
    $PYTHON -m pip install --quiet --progress-bar off --index-url "$TORCH_INDEX_URL" torch torchvision
fi
echo "== installing hgrn_fairseq[test,eval] into $($PYTHON -c 'import sys; print(sys.prefix)')"
$PYTHON -m pip install --quiet --progress-bar off -e ".[test,eval]"
if [ "$CPU_TORCH" = 1 ]; then
    # the package's own install must not have replaced the CPU build by a CUDA one
    $PYTHON - <<'PY' || exit 1
import importlib.metadata as md, sys, torch
cuda = sorted({d.metadata["Name"] for d in md.distributions() if d.metadata["Name"].lower().startswith("nvidia-")})
if torch.version.cuda is not None or cuda:
    sys.exit(f"test.sh: the CPU install pulled CUDA: torch {torch.__version__} (CUDA {torch.version.cuda}), {cuda}")
try:
    import torchvision.ops  # a torchvision built for another torch fails here (timm needs it)
except Exception as e:
    sys.exit(f"test.sh: torchvision does not match torch {torch.__version__} ({type(e).__name__}: {e}); "
             "install both from the same index (TORCH_INDEX_URL)")
print(f"== torch {torch.__version__}: CPU build, no CUDA libraries installed")
PY
fi
WORKERS=${TEST_WORKERS:-2}
case "$WORKERS" in '' | *[!0-9]*) echo "test.sh: TEST_WORKERS='$WORKERS' is not a number (0: no worker processes)" >&2; exit 2 ;; esac
PARALLEL=()
if [ "$WORKERS" -gt 0 ]; then PARALLEL=(-n "$WORKERS" --dist loadfile); fi
LOGS=$(mktemp -d)
trap 'rm -rf "$LOGS"' EXIT
status=0
run_set() {  # NAME MARK: run one set, keep its summary line in $LOGS/NAME
    echo "== running the $1 tests (-m \"$2\")"
    local rc=0
    $PYTHON -m pytest -q --durations=15 -m "$2" ${PARALLEL[@]+"${PARALLEL[@]}"} "${@:3}" | tee "$LOGS/$1.out" || rc=$?
    grep -E '^=*[ ]*[0-9]+ (passed|failed|skipped|deselected|error)|no tests ran' "$LOGS/$1.out" | tail -n 1 \
        | sed 's/^=* *//; s/ *=*$//' > "$LOGS/$1" || true
    # (exit status 5: every test of this set deselected, e.g. by -k)
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then status=1; fi
}
run_set fast "not integration" "$@"
run_set integration "integration" "$@"
echo "== fast: $(cat "$LOGS/fast") / integration: $(cat "$LOGS/integration")"
exit $status
