#!/usr/bin/env bash
# HGRN2 on the GPU machine in one call: the HGRN2 kernel and module tests on CUDA (split over
# processes, first config of each autotune space) while fla's kernels warm up, then bench_hgrn2.py.
#   OUT=/some/dir bash bench/gpu_hgrn2_run.sh [bench_hgrn2.py options]
# Needs fla's wheels in .whl/ (bench/README.md); .whl/fla_autotune.tgz and .whl/hgrn2_autotune.tgz
# (Triton autotune caches from earlier calls) are used when present, and the HGRN2 one comes back as
# $OUT/hgrn2_autotune.tgz. By default the whole HGRN2 test files run (about a minute with 14 processes,
# each torch single-threaded); HGRN2_TESTS=core runs a subset of 45 (every launch scheme and intra-chunk
# path, the LM's head size, other head sizes, the register-capped autotune configs and the "pre" state
# passes).
# Time limits: TESTS_S (250), LIMIT (580, the whole script).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/split_pytest.sh  # (also: OUT checked and created, el = seconds since the start)
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/fla_core*.whl \
  .whl/flash_linear*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 TRITON_CACHE_DIR=/tmp/tc \
  TRITON_CACHE_AUTOTUNING=1
mkdir -p /tmp/tc
for f in .whl/fla_autotune.tgz .whl/hgrn2_autotune.tgz; do [ -f "$f" ] && tar xzf "$f" -C /tmp/tc; done
CORE="lm_head_size or other_head_sizes or split_and_single or steep_decay or intra_chunk_paths \
or matches_reference or (every_autotune_config and shape2 and (split-1 or fused-2)) \
or (precomputed_state_pass and dtype1)"
SEL=()
[ "${HGRN2_TESTS:-all}" = core ] && SEL=(-k "$CORE")
L=$OUT/log
: > "$L"
(python3 -m bench.bench_hgrn2 --warm-peers-only > "$OUT/warm.log" 2>&1; echo "warm rc=$? at $(el)s" >> "$OUT/warm.log") &
C=$(HGRN2_AUTOTUNE=0 split_pytest h2ids "${TEST_PROCS:-14}" "${TESTS_S:-250}" "$OUT/gpu_tests.log" \
  tests/kernels/test_hgrn2_triton.py tests/modules/test_hgru2.py "${SEL[@]}")
echo "tests done at $(el)s: $C" >> "$L"
grep -h "passed\|failed\|FAILED\|== " "$OUT/gpu_tests.log" | tail -40 >> "$L"
wait
tail -1 "$OUT/warm.log" >> "$L"
timeout $(( ${LIMIT:-580} - $(el) )) python3 -m bench.bench_hgrn2 --out "$OUT" "$@" > "$OUT/bench.log" 2>&1
echo "bench_hgrn2 rc=$? at $(el)s" >> "$L"
(cd /tmp/tc && find . -name '*.autotune.json' | tar czf "$OUT/hgrn2_autotune.tgz" -T -) 2>/dev/null
echo "all done at $(el)s" >> "$L"
cat "$L"
