#!/usr/bin/env bash
# The HGRU block forward on the GPU machine in one call: its GPU tests (split over
# processes), launches of the block kernel that _plan refuses (layout check), then forward timings of real_scan and
# hgru_fused under several tuning dicts (bench/explore/explore_scan_block.py --library).
#   OUT=/some/dir bash bench/explore/gpu_block_explore.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
. bench/split_pytest.sh
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
split_pytest block_ids "${TEST_PROCS:-8}" "${TESTS_S:-200}" "$OUT/gpu_tests.log" \
  tests/kernels/test_hgru_triton.py -k "block or one_million or 64bit"
grep -h "passed\|failed\|FAILED\|== " "$OUT/gpu_tests.log" | tail -20
echo "tests done at $(el)s"
# (launches _plan refuses: a segment's steps spread over lanes or warps, which gave wrong outputs)
timeout 120 python3 -m bench.explore.explore_scan_block --out "$OUT/diag" --shapes 8x2048x1024 --configs \
  '[{"R":8,"NW":8,"BD":64,"warps":4,"vec":8},{"R":4,"NW":4,"BD":32,"warps":4,"vec":8},
    {"R":8,"NW":16,"BD":64,"warps":4,"vec":8}]' 2>&1 | grep "^|"
echo "diag done at $(el)s"
timeout "${LIB_S:-300}" python3 -m bench.explore.explore_scan_block --out "$OUT/lib" \
  --shapes "${SHAPES:-8x2048x1024,8x4096x1024,32x512x1536,1x8192x2048,2x16384x1024,4x2048x1024,16x2048x1024}" \
  --library '[{}, {"mode":"block"}, {"mode":"block","stages":4},
              {"mode":"block","block_d":32,"segments":16,"segment_steps":8,"num_warps":2},
              {"mode":"block","block_d":32,"segments":32,"segment_steps":4,"num_warps":4},
              {"mode":"block","block_d":16,"segments":64,"segment_steps":4,"num_warps":4},
              {"mode":"block","block_d":128,"segments":8,"segment_steps":8,"num_warps":4}]' 2>&1 | grep "^|"
echo "all done at $(el)s"
